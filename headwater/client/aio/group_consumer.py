"""AsyncGroupConsumer: :class:`~headwater.client.sync.group_consumer.GroupConsumer` for asyncio.

The same membership (over the same no-I/O core, :mod:`headwater.client.core.membership`), the
same rules and guarantees (see docs/consumer-groups.md); heartbeats come from a task instead
of a thread. So processing is decoupled from liveness as long as handlers await: a handler
that blocks the event loop (CPU work, blocking I/O) stops the heartbeats too; run such work
with ``asyncio.to_thread``.

The member joins on ``start()``, ``async with``, or its first ``poll``. ``on_assign`` and
``on_revoke`` may be plain functions or coroutine functions.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from headwater.client.aio.consumer import AsyncConsumer
from headwater.client.aio.service import AsyncBrokerService
from headwater.client.common.local_offsets import LocalOffsets
from headwater.client.core.membership import (
    COMMIT_ATTEMPTS,
    HEARTBEAT_WAITING_MS,
    TP,
    GroupSettings,
    MemberView,
    by_queue,
)
from headwater.errors import (
    ClosedError,
    GroupError,
    HeadwaterError,
    InvalidArgumentError,
    StaleGenerationError,
    UnavailableError,
    UnknownMemberError,
)
from headwater.model.groups import GroupAssignment
from headwater.model.message import Record

__all__ = ["AsyncGroupConsumer"]

log = logging.getLogger("headwater.consumer")

Callback = Callable[[list[TP]], Any]


class AsyncGroupConsumer(AsyncConsumer):
    """A member of consumer group ``group``, for asyncio. Use from one task at a time.

    Get one with ``hw.consumer(group="billing", subscribe=["orders"])`` on an
    :class:`~headwater.client.aio.client.AsyncClient`::

        async with hw.consumer(group="billing", subscribe="orders") as c:
            async for record in c:
                await handle(record)
                await c.commit()
    """

    def __init__(
        self,
        service: AsyncBrokerService,
        *,
        group: str,
        subscribe: str | Iterable[str],
        mode: str = "clustering",
        strategy: str = "average",
        session_timeout_ms: int = 10_000,
        heartbeat_interval_ms: int | None = None,
        max_poll_interval_ms: int = 300_000,
        on_assign: Callback | None = None,
        on_revoke: Callback | None = None,
        commit_on_revoke: bool = True,
        offsets_path: str | os.PathLike[str] | None = None,
        client_id: str | None = None,
        **consumer_settings,
    ) -> None:
        self.settings = GroupSettings(
            group=group,
            subscribe=subscribe,
            mode=mode,
            strategy=strategy,
            session_timeout_ms=session_timeout_ms,
            heartbeat_interval_ms=heartbeat_interval_ms,
            max_poll_interval_ms=max_poll_interval_ms,
            offsets_path=offsets_path,
            client_id=client_id,
        )
        super().__init__(service, group=group, **consumer_settings)
        self.mode = mode
        self._on_assign = on_assign
        self._on_revoke = on_revoke
        self._commit_on_revoke = commit_on_revoke
        self._offsets_path = None if offsets_path is None else Path(offsets_path)
        self._local: LocalOffsets | None = None
        self._view = MemberView()
        self._started = False
        self._start_lock = asyncio.Lock()
        self._beat = asyncio.Event()  # heartbeat now
        self._stopping = False  # close() has begun
        self._heartbeats: asyncio.Task[None] | None = None
        self._last_poll = 0.0

    @property
    def member_id(self) -> str | None:
        return self._view.member_id

    @property
    def generation(self) -> int:
        return self._view.applied_generation

    async def start(self) -> None:
        """Join the group (``poll`` and ``async with`` do this on their own)."""
        self._check_open()
        async with self._start_lock:
            if self._started:
                return
            if self._offsets_path is not None:
                self._local = await asyncio.to_thread(LocalOffsets, self._offsets_path, self.group)
            self._last_poll = asyncio.get_running_loop().time()
            await self._join()
            self._heartbeats = asyncio.create_task(self._heartbeat_loop(), name=f"headwater-heartbeat-{self.group}")
            self._started = True

    async def assign(self, queue: str, partitions: int | Iterable[int] | None = None) -> None:
        raise InvalidArgumentError(
            "a group consumer's partitions come from its group; create a consumer without "
            "subscribe= to assign partitions yourself"
        )

    def unassign(self, queue: str | None = None) -> None:
        raise InvalidArgumentError("a group consumer's partitions come from its group; close() it to leave")

    async def poll(self, max_messages: int | None = None, timeout_ms: int = 1000) -> list[Record]:
        """Up to ``max_messages`` records of the partitions this member holds, waiting up to
        ``timeout_ms``; applies assignment changes first."""
        self._check_open()
        self._poll_limit(max_messages, timeout_ms)  # the arguments checked before anything waits
        await self.start()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000
        try:
            while True:
                self._last_poll = loop.time()
                self._wakeup = loop.create_future()
                await self._sync()
                remaining = deadline - loop.time()
                if not self._fetch_pos:  # nothing to read until the group gives us something
                    if remaining > 0:
                        await asyncio.wait([self._wakeup], timeout=remaining)
                    if loop.time() >= deadline:
                        return []
                    continue
                out = await super().poll(max_messages, max(0, int(remaining * 1000)))
                if out or loop.time() >= deadline:
                    return out
        finally:
            self._last_poll = loop.time()

    async def commit(self, offsets: dict[TP, int] | None = None) -> None:
        """As :meth:`GroupConsumer.commit <headwater.client.sync.group_consumer.GroupConsumer.commit>`."""
        self._check_open()
        if offsets is not None:
            by_queue(offsets)  # the shape checked, the same for both modes
        chosen = dict(self._consumed) if offsets is None else dict(offsets)
        if not chosen:
            return
        if self.mode == "broadcast":
            await self._save_local(chosen)
        else:
            await self._commit_member(chosen)

    async def committed(self, queue: str, partition: int) -> int | None:
        if self.mode == "broadcast":
            if self._local is None:
                return None
            return self._local.get(queue, (await self._service.describe_queue(queue)).queue_id).get(partition)
        return await super().committed(queue, partition)

    async def close(self, commit: bool = True) -> None:
        """Revoke everything (committing with ``commit_on_revoke`` unless ``commit`` is
        False), leave the group, stop."""
        if self._closed:
            return
        self._stopping = True  # the heartbeat loop ends even if its cancellation were lost
        if self._heartbeats is not None:
            self._beat.set()
            self._heartbeats.cancel()
            await asyncio.gather(self._heartbeats, return_exceptions=True)
        try:
            member = self._view.member()
            if member is not None:
                held = set(self._fetch_pos)
                # a broker that did not answer the closing commit would not answer the leave
                # either: skip it, so that close() costs one request_timeout_s, not two
                if held and not await self._revoke(held, commit=commit and self._commit_on_revoke):
                    log.info(
                        "group %s: not leaving, the broker is unreachable; the member expires after session_timeout_ms",
                        self.group,
                    )
                    return
                try:
                    await self._service.leave_group(self.group, member)
                except HeadwaterError as e:
                    log.info("group %s: leaving failed (%s); the member expires on its own", self.group, e)
        finally:
            self._view.left()
            await super().close()

    async def __aenter__(self) -> AsyncGroupConsumer:
        await self.start()
        return self

    async def __aexit__(self, exc_type: object, *exc: object) -> None:
        await self.close(commit=exc_type is None)

    # -- membership ---------------------------------------------------------------------

    async def _join(self) -> None:
        s = self.settings
        a = await self._service.join_group(
            s.group, None, s.client_id, s.queues, s.mode, s.strategy, s.session_timeout_ms
        )
        self._view.joined(a)
        await self._apply(a)

    async def _sync(self) -> None:
        rejoin, update = self._view.take()
        if rejoin:
            if self._fetch_pos and self.mode != "broadcast":
                held = set(self._fetch_pos)
                log.warning(
                    "group %s: member %s was removed from the group; dropping %d partition(s) and joining again",
                    self.group,
                    self._view.member_id,
                    len(held),
                )
                await self._call(self._on_revoke, held)
                self._forget(held)
            try:
                await self._join()
            except UnavailableError as e:
                log.info("group %s: cannot join now (%s)", self.group, e)
        elif update is not None:
            await self._apply(update)

    async def _apply(self, a: GroupAssignment) -> None:
        plan = self._view.plan(a, set(self._fetch_pos))
        if plan is None:
            return
        new, revoked, added = plan
        if revoked:
            await self._revoke(revoked, commit=self._commit_on_revoke)
        if self._view.applied(a, new) or revoked:
            self._beat.set()
        if added:
            for queue, offs in by_queue({tp: 0 for tp in added}).items():
                try:
                    await AsyncConsumer.assign(self, queue, sorted(offs))
                except HeadwaterError as e:
                    log.warning("group %s: cannot read %s%s: %s", self.group, queue, sorted(offs), e)
                    added = {tp for tp in added if tp[0] != queue}
            if added:
                await self._call(self._on_assign, added)

    async def _revoke(self, tps: set[TP], *, commit: bool) -> bool:
        """Commit (if ``commit``), tell ``on_revoke``, forget ``tps``; False when the broker
        could not be reached for the commit."""
        reached = True
        if commit:
            positions = {tp: self._consumed[tp] for tp in tps if tp in self._consumed}
            try:
                if self.mode == "broadcast":
                    if self._local is not None:
                        await self._save_local(positions)
                elif positions:
                    await self._commit_member(positions)
            except (GroupError, UnavailableError) as e:
                reached = not isinstance(e, UnavailableError)
                log.warning("group %s: could not commit revoked partitions %s: %s", self.group, sorted(tps), e)
        await self._call(self._on_revoke, tps)
        self._forget(tps)
        return reached

    async def _call(self, callback: Callback | None, tps: set[TP]) -> None:
        if callback is None:
            return
        try:
            result = callback(sorted(tps))
            if inspect.isawaitable(result):
                await result
        except Exception:  # noqa: BLE001 - the member's state must stay consistent
            log.exception("group %s: %s callback failed", self.group, getattr(callback, "__name__", "a"))

    # -- offsets ------------------------------------------------------------------------

    async def _committed_offsets(self, queue: str, queue_id: int) -> dict[int, int]:
        if self.mode == "broadcast":
            return self._local.get(queue, queue_id) if self._local is not None else {}
        return await super()._committed_offsets(queue, queue_id)

    async def _save_local(self, offsets: dict[TP, int]) -> None:
        if self._local is None:
            raise InvalidArgumentError(
                "a broadcast member keeps its offsets in a local file: create it with offsets_path=..."
            )
        unknown = sorted(tp for tp in offsets if tp[0] not in self._queue_ids)
        if unknown:
            raise InvalidArgumentError(f"{unknown} are not partitions of the subscribed queues")
        await asyncio.to_thread(self._local.save, dict(offsets), dict(self._queue_ids))

    async def _commit_member(self, offsets: dict[TP, int]) -> None:
        member = self._view.member()
        if member is None:
            raise UnknownMemberError(
                f"this consumer is not a member of group {self.group!r} now (it missed heartbeats or "
                f"left), so others may read its partitions; poll() joins again"
            )
        for queue, offs in by_queue(offsets).items():
            for attempt in range(COMMIT_ATTEMPTS):
                try:
                    await self._service.commit_offsets(
                        self.group, queue, offs, member_id=member, generation=self._view.known_generation
                    )
                    break
                except StaleGenerationError:
                    if attempt == COMMIT_ATTEMPTS - 1:
                        raise
                    await self._heartbeat(member)  # learn the new generation; we still hold these
                except UnknownMemberError:
                    self._view.lost(member)
                    raise

    # -- the heartbeat task -------------------------------------------------------------

    async def _heartbeat_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._closed and not self._stopping:
            interval = HEARTBEAT_WAITING_MS if self._view.waiting else self.settings.heartbeat_interval_ms
            try:
                # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow the
                # cancellation close() sends when the wait ends at the same moment, and this
                # loop would then run on forever
                async with asyncio.timeout(interval / 1000):
                    await self._beat.wait()
            except TimeoutError:
                pass
            if self._stopping:
                break
            self._beat.clear()
            member = self._view.member()
            if member is None:
                continue
            try:
                if loop.time() - self._last_poll > self.settings.max_poll_interval_ms / 1000:
                    log.warning(
                        "group %s: poll() was not called for max_poll_interval_ms (%d ms); leaving the "
                        "group; the next poll() joins again",
                        self.group,
                        self.settings.max_poll_interval_ms,
                    )
                    self._view.lost(member)
                    await self._service.leave_group(self.group, member)
                    continue
                await self._heartbeat(member)
            except UnknownMemberError:
                log.warning("group %s: member %s is no longer in the group; poll() joins again", self.group, member)
            except (UnavailableError, ClosedError) as e:
                log.info("group %s: heartbeat failed (%s); trying again", self.group, e)
            except Exception:  # noqa: BLE001 - the task must outlive surprises
                log.exception("group %s: heartbeat failed", self.group)

    async def _heartbeat(self, member: str) -> None:
        try:
            a = await self._service.heartbeat_group(self.group, member, self._view.applied_generation)
        except UnknownMemberError:
            self._view.lost(member)
            self._wake_poll()
            raise
        if self._view.heard(a):
            self._wake_poll()

    def _wake_poll(self) -> None:
        if self._wakeup is not None and not self._wakeup.done():
            self._wakeup.set_result(None)
