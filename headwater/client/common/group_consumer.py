"""GroupConsumerBase: a member of a consumer group, in clustering or broadcast mode, once for
the blocking and the asyncio kind.

It is the simple consumer (:mod:`.consumer`: same fetching, positions, long polling,
``poll``/``commit``/``position``/``close``) whose partitions come from the group instead of
from ``assign()``:

- **clustering**: the members share the partitions of the subscribed queues; the broker
  assigns them (``average`` or ``sticky``) and rebalances when a member joins, leaves or
  stops heartbeating. Offsets are committed to the broker, checked against the member's
  generation. Order holds per partition.
- **broadcast**: every member reads every partition; each keeps its own offsets in a local
  file (``offsets_path``, :mod:`.local_offsets`), written crash-safely. The broker only
  lists the members.

Liveness is decoupled from processing: a background thread
(:class:`~headwater.client.sync.group_consumer.GroupConsumer`) or task
(:class:`~headwater.client.aio.group_consumer.AsyncGroupConsumer`) heartbeats every
``heartbeat_interval_ms`` whatever the application does between polls, so a slow handler
does not get the member thrown out. (A member that does not call ``poll`` for
``max_poll_interval_ms`` leaves the group on its own, so a stuck application does not hold
partitions forever; its next ``poll`` joins again.)

The heartbeat only talks to the broker and records what it answered (in a
:class:`~headwater.client.core.membership.MemberView`, under ``_lock`` where a thread
shares it); every change of assignment is applied by the application's own thread or task
at the start of ``poll`` (where the previous batch is known to be handled): revoked
partitions are committed (with ``commit_on_revoke``), ``on_revoke`` is called, they are
dropped, the new generation is acknowledged (which frees them for their next holder), and
new partitions are added at their committed offsets and announced with ``on_assign``.

Delivery: at least once. After a member crashes, its partitions restart at the last
committed offsets, so what it polled after its last commit is delivered again (the
"uncommitted window"); a member that is removed while paused cannot commit any more (its
commits are refused), so nothing it does later moves the group's progress.

Each kind says how it begins (:meth:`_begin`: the blocking member joins when made, the
asyncio one on ``start()``), stops its heartbeats (:meth:`_stop_heartbeats`), reads and
writes the offsets file (:meth:`_blocking_io`).
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

from headwater.client.common.consumer import ConsumerBase
from headwater.client.common.local_offsets import LocalOffsets
from headwater.client.common.twins import Waits, waits
from headwater.client.common.waking import settle
from headwater.client.core.membership import (
    COMMIT_ATTEMPTS,
    HEARTBEAT_WAITING_MS,
    TP,
    GroupSettings,
    MemberView,
    by_queue,
)
from headwater.client.core.reads import check_poll
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

__all__ = ["Callback", "GroupConsumerBase"]

log = logging.getLogger("headwater.consumer")

T = TypeVar("T")

Callback = Callable[[list[TP]], Any]  # the asyncio member awaits what a callback returns


class GroupConsumerBase(ConsumerBase):
    """A member of consumer group ``group`` subscribed to ``subscribe`` (see the module's
    docstring); the settings are :class:`~headwater.client.core.membership.GroupSettings`',
    the rest go to the consumer."""

    # guards _view where the heartbeat is a thread (the blocking kind makes a lock); the
    # asyncio member has one thread, so nothing to guard
    _lock: Any = contextlib.nullcontext()

    def __init__(
        self,
        service: Any,
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
        **consumer_settings: Any,
    ) -> None:
        settings = GroupSettings(
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
        self.settings = settings
        self.mode = mode
        self._on_assign = on_assign
        self._on_revoke = on_revoke
        self._commit_on_revoke = commit_on_revoke
        self._offsets_path = None if offsets_path is None else Path(offsets_path)
        self._local: LocalOffsets | None = None  # loaded when the member begins
        self._view = MemberView()
        self._started = False  # joined (the blocking member when made, the asyncio one on start())
        self._last_poll = time.monotonic()
        self._begin()

    # -- what the application sees ----------------------------------------------------

    @property
    def member_id(self) -> str | None:
        """The broker's name for this member, while it is one."""
        return self._view.member_id

    @property
    def generation(self) -> int:
        """The generation whose assignment this consumer is reading."""
        return self._view.applied_generation

    @waits
    def assign(self, queue: str, partitions: int | Iterable[int] | None = None) -> Waits[None]:
        """Refused: a group consumer's partitions come from its group."""
        raise InvalidArgumentError(
            "a group consumer's partitions come from its group; create a consumer without "
            "subscribe= to assign partitions yourself"
        )
        yield  # unreached: it makes this a body, driven as the consumer's assign is

    def unassign(self, queue: str | None = None) -> None:
        """Refused: a group consumer's partitions come from its group."""
        raise InvalidArgumentError("a group consumer's partitions come from its group; close() it to leave")

    @waits
    def poll(self, max_messages: int | None = None, timeout_ms: int = 1000) -> Waits[list[Record]]:
        """Up to ``max_messages`` records of the partitions this member holds, waiting up
        to ``timeout_ms``; applies assignment changes first (see the class docs). The
        asyncio member joins first if it has not yet (``start``)."""
        self._check_open()
        check_poll(max_messages, timeout_ms, self.max_poll_messages)  # the arguments, before anything waits
        if not self._started:  # only an asyncio member can be unstarted: it joins in its start()
            yield self.start()
        deadline = time.monotonic() + timeout_ms / 1000
        try:
            while True:
                self._last_poll = time.monotonic()
                with self._lock:
                    self._wakeup = self._new_waiter()
                self._check_woken()
                yield from self._sync()
                remaining = deadline - time.monotonic()
                if not self._fetch_pos:  # nothing to read until the group gives us something
                    if remaining > 0:
                        yield self._wait_any([self._wakeup], remaining, lead=False)
                    if time.monotonic() >= deadline:
                        return []
                    continue
                out = yield from ConsumerBase.poll(self, max_messages, max(0, int(remaining * 1000)))
                if out or time.monotonic() >= deadline:
                    return out
        finally:
            self._last_poll = time.monotonic()

    def _arm_wakeup(self) -> None:
        """Nothing: :meth:`poll` arms a future of its own each turn, which both wake."""

    def _ready(self, max_messages: int | None = 1, timeout_ms: int = 1000) -> list[Record]:
        view = self._view
        if not self._started or view.rejoin or view.update is not None:
            return []  # poll joins, or applies what the heartbeat learned, first
        self._last_poll = time.monotonic()
        return super()._ready(max_messages, timeout_ms)

    @waits
    def commit(self, offsets: dict[TP, int] | None = None) -> Waits[None]:
        """Commit the consumed position of every partition this member holds (those its
        commits have not stored as they are), or the given ``{(queue, partition): offset}``:
        to the broker, as this member and generation (clustering), or to the offsets file
        (broadcast). With nothing new to store it sends nothing.

        Raises :class:`~headwater.errors.UnknownMemberError` if this member was removed from
        the group (it missed heartbeats or left): its partitions may be read by others now,
        and what it polled since its last commit will be delivered again. Returns after
        every :meth:`commit_async` made before it.
        """
        chosen = self._commit_choice(offsets)
        if self._commits is not None:
            yield self._wait_commits()
        yield from self._send_commit(chosen)

    def _commit_choice(self, offsets: dict[TP, int] | None) -> dict[TP, int]:
        self._check_open()
        if offsets is not None:
            by_queue(offsets)  # the shape checked, the same for both modes
        return self._moved_since_stored() if offsets is None else dict(offsets)

    def _send_commit(self, chosen: dict[TP, int]) -> Waits[None]:
        if not chosen:
            return
        if self.mode == "broadcast":
            yield self._save_local(chosen)
            for queue, offs in by_queue(chosen).items():
                self._note_stored(queue, offs)
        else:
            yield from self._commit_member(chosen)

    @waits
    def committed(self, queue: str, partition: int) -> Waits[int | None]:
        """The committed offset of a partition, or None: the group's (clustering), or the
        offsets file's (broadcast)."""
        if self.mode != "broadcast":
            return (yield from ConsumerBase.committed(self, queue, partition))
        if self._local is None:
            return None
        return self._local.get(queue, (yield self._service.describe_queue(queue)).queue_id).get(partition)

    @waits
    def close(self, commit: bool = True) -> Waits[None]:
        """Revoke everything (committing positions with ``commit_on_revoke``, unless
        ``commit`` is False), leave the group, stop."""
        if self._closed:
            return
        if self._commits is not None:  # before the heartbeats stop: a commit may need one
            yield self._wait_commits(stop=True)
        self._leaving = True  # a heartbeat answer that comes now is not applied
        yield self._stop_heartbeats()
        try:
            with self._lock:
                member = self._view.member()
            if member is not None:
                held = set(self._fetch_pos)
                # a broker that did not answer the closing commit would not answer the leave
                # either: skip it, so that close() costs one request_timeout_s, not two
                if held and not (yield from self._revoke(held, commit=commit and self._commit_on_revoke)):
                    log.info(
                        "group %s: not leaving, the broker is unreachable; the member expires after session_timeout_ms",
                        self.group,
                    )
                    return
                try:
                    yield self._service.leave_group(self.group, member)
                except HeadwaterError as e:  # it will expire after its session timeout instead
                    log.info("group %s: leaving failed (%s); the member expires on its own", self.group, e)
        finally:
            with self._lock:
                self._view.left()
            yield from ConsumerBase.close(self)

    # -- membership, in the application's thread or task ---------------------------------

    @waits
    def _join_group(self) -> Waits[None]:
        """Load the offsets file (broadcast), join: the member has started."""
        if self._offsets_path is not None:
            self._local = yield self._blocking_io(LocalOffsets, self._offsets_path, self.group)
        yield from self._join()
        self._started = True

    def _join(self) -> Waits[None]:
        s = self.settings
        a = yield self._service.join_group(
            s.group, None, s.client_id, s.queues, s.mode, s.strategy, s.session_timeout_ms
        )
        with self._lock:
            self._view.joined(a)
        yield from self._apply(a)

    def _sync(self) -> Waits[None]:
        """Apply what the heartbeat learned: a new assignment, or a lost membership."""
        with self._lock:
            rejoin, update = self._view.take()
        if rejoin:
            if self._fetch_pos:
                yield from self._lose_all()
            try:
                yield from self._join()
            except UnavailableError as e:  # the broker is away: poll again later
                log.info("group %s: cannot join now (%s)", self.group, e)
        elif update is not None:
            yield from self._apply(update)

    def _apply(self, a: GroupAssignment) -> Waits[None]:
        with self._lock:
            plan = self._view.plan(a, set(self._fetch_pos))
        if plan is None:
            return  # older than what we read already
        new, revoked, added = plan
        if revoked:
            yield from self._revoke(revoked, commit=self._commit_on_revoke)
        with self._lock:
            acked = self._view.applied(a, new)
        if revoked or acked:
            self._beat.set()  # acknowledge now: the revoked partitions go to their next holder
        if added:
            yield from self._add(added)

    def _revoke(self, tps: set[TP], *, commit: bool) -> Waits[bool]:
        """Commit (if ``commit``), tell ``on_revoke``, forget ``tps``; False when the broker
        could not be reached for the commit."""
        reached = True
        if self._commits is not None:  # an older commit_async must not land after this one
            yield self._wait_commits()
        if commit:
            positions = {tp: self._consumed[tp] for tp in tps if tp in self._consumed}
            try:
                if self.mode == "broadcast":
                    if self._local is not None:
                        yield self._save_local(positions)
                elif positions:
                    yield from self._commit_member(positions)
            except (GroupError, UnavailableError) as e:
                reached = not isinstance(e, UnavailableError)
                log.warning("group %s: could not commit revoked partitions %s: %s", self.group, sorted(tps), e)
        yield from self._call(self._on_revoke, tps)
        self._forget(tps)
        return reached

    def _add(self, tps: set[TP]) -> Waits[None]:
        for queue, offs in by_queue({tp: 0 for tp in tps}).items():
            try:
                yield from ConsumerBase.assign(self, queue, sorted(offs))
            except HeadwaterError as e:  # e.g. the queue was deleted meanwhile: the group drops it
                log.warning("group %s: cannot read %s%s: %s", self.group, queue, sorted(offs), e)
                tps = {tp for tp in tps if tp[0] != queue}
        if tps:
            yield from self._call(self._on_assign, tps)

    def _lose_all(self) -> Waits[None]:
        """We are no longer a member: others may hold our partitions now. Broadcast members
        keep reading (their positions are their own); clustering members drop everything."""
        if self.mode == "broadcast":
            return
        held = set(self._fetch_pos)
        log.warning(
            "group %s: member %s was removed from the group (missed heartbeats or left); "
            "dropping %d partition(s) and joining again",
            self.group,
            self._view.member_id,
            len(held),
        )
        yield from self._call(self._on_revoke, held)
        self._forget(held)

    def _call(self, callback: Callback | None, tps: set[TP]) -> Waits[None]:
        """Call ``callback`` with the sorted ``tps``, logging its error: the member's state
        must stay consistent. What it returns is awaited if it can be (by the asyncio
        member: its callbacks may be coroutine functions)."""
        if callback is None:
            return
        try:
            result = callback(sorted(tps))
            if inspect.isawaitable(result):
                yield result
        except Exception:  # noqa: BLE001 - see the docstring
            log.exception("group %s: %s callback failed", self.group, getattr(callback, "__name__", "a"))

    # -- offsets ------------------------------------------------------------------------

    def _committed_offsets(self, queue: str, queue_id: int) -> Waits[dict[int, int]]:
        if self.mode == "broadcast":
            return self._local.get(queue, queue_id) if self._local is not None else {}
        return (yield from super()._committed_offsets(queue, queue_id))

    def _save_local(self, offsets: dict[TP, int]) -> Any:
        """Check ``offsets`` and write them to the offsets file (a blocking call, or the
        coroutine that writes)."""
        if self._local is None:
            raise InvalidArgumentError(
                "a broadcast member keeps its offsets in a local file: create it with offsets_path=..."
            )
        unknown = sorted(tp for tp in offsets if tp[0] not in self._queue_ids)
        if unknown:
            raise InvalidArgumentError(f"{unknown} are not partitions of the subscribed queues")
        return self._blocking_io(self._local.save, dict(offsets), dict(self._queue_ids))

    def _commit_member(self, offsets: dict[TP, int]) -> Waits[None]:
        with self._lock:
            member = self._view.member()
        if member is None:
            raise UnknownMemberError(
                f"this consumer is not a member of group {self.group!r} now (it missed heartbeats or "
                f"left), so others may read its partitions; poll() joins again"
            )
        for queue, offs in by_queue(offsets).items():
            for attempt in range(COMMIT_ATTEMPTS):
                with self._lock:
                    generation = self._view.known_generation
                try:
                    yield self._service.commit_offsets(self.group, queue, offs, member_id=member, generation=generation)
                    self._note_stored(queue, offs)
                    break
                except StaleGenerationError:
                    # the group rebalanced: until we acknowledge, we still hold our partitions,
                    # so learn the new generation (without acknowledging it) and commit again
                    if attempt == COMMIT_ATTEMPTS - 1:
                        raise
                    yield from self._heartbeat(member)
                except UnknownMemberError:
                    with self._lock:
                        self._view.lost(member)
                    raise

    # -- the heartbeat (a thread or a task) ------------------------------------------------

    def _beat_interval_s(self) -> float:
        """How long the heartbeat waits before the next one (unless woken)."""
        with self._lock:
            waiting = self._view.waiting
        return (HEARTBEAT_WAITING_MS if waiting else self.settings.heartbeat_interval_ms) / 1000

    @waits
    def _beat_once(self) -> Waits[None]:
        """One heartbeat, or leaving when ``poll`` was not called for too long. Its errors
        are logged: the thread or task that beats must outlive them."""
        with self._lock:
            member = self._view.member()
        if member is None:
            return
        try:
            if time.monotonic() - self._last_poll > self.settings.max_poll_interval_ms / 1000:
                log.warning(
                    "group %s: poll() was not called for max_poll_interval_ms (%d ms); leaving the group "
                    "so others take its partitions; the next poll() joins again",
                    self.group,
                    self.settings.max_poll_interval_ms,
                )
                with self._lock:
                    self._view.lost(member)
                with contextlib.suppress(HeadwaterError):  # it expires on its own then
                    yield self._service.leave_group(self.group, member)
                return
            yield from self._heartbeat(member)
        except UnknownMemberError:
            log.warning("group %s: member %s is no longer in the group; poll() joins again", self.group, member)
        except (UnavailableError, ClosedError) as e:
            if not self._leaving:
                log.info("group %s: heartbeat failed (%s); trying again", self.group, e)
        except Exception:  # noqa: BLE001 - the thread or task must outlive surprises
            log.exception("group %s: heartbeat failed", self.group)

    def _heartbeat(self, member: str) -> Waits[None]:
        """One heartbeat acknowledging what this consumer applied; records the answer (the
        application's thread or task applies it). UnknownMemberError: marks that poll()
        must join again."""
        with self._lock:
            applied = self._view.applied_generation
        try:
            a = yield self._service.heartbeat_group(self.group, member, applied)
        except UnknownMemberError:
            if self._leaving:
                return
            with self._lock:
                self._view.lost(member)
            self._wake_poll()
            raise
        if self._leaving:  # close() is leaving the group: apply nothing, but its closing
            with self._lock:  # commit, refused as stale, heartbeats to learn the generation
                self._view.learned(a)
            return
        with self._lock:
            changed = self._view.heard(a)
        if changed:
            self._wake_poll()

    def _wake_poll(self) -> None:
        with self._lock:
            fut = self._wakeup
        settle(fut)

    # -- what each kind says -------------------------------------------------------------

    _beat: Any  # set() makes the heartbeat beat now (a threading or an asyncio Event)
    _leaving = False  # close() has begun

    def _begin(self) -> None:
        """What the kind does when made, after the settings are checked."""
        raise NotImplementedError

    def _stop_heartbeats(self) -> Any:
        """End the heartbeat (a blocking call, or the coroutine that waits for it to end)."""
        raise NotImplementedError

    def _blocking_io(self, fn: Callable[..., T], *args: Any) -> Any:
        """``fn(*args)``, file I/O: called now (blocking), or the coroutine that calls it in a
        thread (asyncio: the loop must not wait on the disk)."""
        raise NotImplementedError
