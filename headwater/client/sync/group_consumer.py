"""GroupConsumer: a member of a consumer group, in clustering or broadcast mode.

It is the simple :class:`~headwater.client.sync.consumer.Consumer` (same fetching, positions,
long polling, ``poll``/``commit``/``position``/``close``) whose partitions come from the
group instead of from ``assign()``:

- **clustering**: the members share the partitions of the subscribed queues; the broker
  assigns them (``average`` or ``sticky``) and rebalances when a member joins, leaves or
  stops heartbeating. Offsets are committed to the broker, checked against the member's
  generation. Order holds per partition.
- **broadcast**: every member reads every partition; each keeps its own offsets in a local
  file (``offsets_path``), written crash-safely. The broker only lists the members.

Liveness is decoupled from processing: a background thread heartbeats every
``heartbeat_interval_ms`` whatever the application does between polls, so a slow handler
does not get the member thrown out. (A member that does not call ``poll`` for
``max_poll_interval_ms`` leaves the group on its own, so a stuck application does not hold
partitions forever; its next ``poll`` joins again.)

The heartbeat thread only talks to the broker and records what it answered; every change of
assignment is applied by the application's own thread at the start of ``poll`` (where the
previous batch is known to be handled): revoked partitions are committed (with
``commit_on_revoke``), ``on_revoke`` is called, they are dropped, the new generation is
acknowledged (which frees them for their next holder), and new partitions are added at
their committed offsets and announced with ``on_assign``.

Delivery: at least once. After a member crashes, its partitions restart at the last
committed offsets, so what it polled after its last commit is delivered again (the
"uncommitted window"); a member that is removed while paused cannot commit any more (its
commits are refused), so nothing it does later moves the group's progress.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from headwater.client.common.local_offsets import LocalOffsets
from headwater.client.core.membership import (
    COMMIT_ATTEMPTS,
    HEARTBEAT_WAITING_MS,
    TP,
    GroupSettings,
    MemberView,
    by_queue,
)
from headwater.client.sync.consumer import Consumer
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
from headwater.model.service import BrokerService

__all__ = ["GroupConsumer"]

log = logging.getLogger("headwater.consumer")

Callback = Callable[[list[TP]], None]


class GroupConsumer(Consumer):
    """A member of consumer group ``group`` subscribed to ``subscribe``. Use from one thread.

    Get one with ``hw.consumer(group="billing", subscribe=["orders"])``:

    >>> import headwater, tempfile
    >>> hw = headwater.open(tempfile.mkdtemp())
    >>> _ = hw.admin.create_queue("orders", partitions=4)
    >>> _ = hw.send_batch("orders", [b"a", b"b"], partition=2)
    >>> with hw.consumer(group="billing", subscribe="orders", strategy="sticky") as c:
    ...     print(c.assignment())
    ...     print([r.body for r in c.poll(timeout_ms=500)])
    ...     c.commit()
    [('orders', 0), ('orders', 1), ('orders', 2), ('orders', 3)]
    [b'a', b'b']
    >>> hw.close()

    ``on_assign(partitions)`` and ``on_revoke(partitions)`` are called from ``poll`` (in the
    application's thread) with sorted ``(queue, partition)`` lists; ``close`` revokes
    everything. With ``commit_on_revoke`` (default) the positions of revoked partitions are
    committed first: what ``poll`` returned before is taken as processed, as in the loop
    ``for r in c: handle(r)``. Leaving a ``with`` block because of an exception does not
    commit.
    """

    def __init__(
        self,
        service: BrokerService,
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
        self._local = LocalOffsets(Path(offsets_path), group) if offsets_path is not None else None
        self._lock = threading.Lock()  # guards _view: the heartbeat thread and the application share it
        self._view = MemberView()
        self._last_poll = time.monotonic()
        self._beat = threading.Event()  # heartbeat now
        self._stopping = threading.Event()
        self._join()
        self._thread = threading.Thread(target=self._heartbeat_loop, name=f"headwater-heartbeat-{group}", daemon=True)
        self._thread.start()

    # -- what the application sees ----------------------------------------------------

    @property
    def member_id(self) -> str | None:
        return self._view.member_id

    @property
    def generation(self) -> int:
        """The generation whose assignment this consumer is reading."""
        return self._view.applied_generation

    def assign(self, queue: str, partitions: int | Iterable[int] | None = None) -> None:
        raise InvalidArgumentError(
            "a group consumer's partitions come from its group; create a consumer without "
            "subscribe= to assign partitions yourself"
        )

    def unassign(self, queue: str | None = None) -> None:
        raise InvalidArgumentError("a group consumer's partitions come from its group; close() it to leave")

    def poll(self, max_messages: int | None = None, timeout_ms: int = 1000) -> list[Record]:
        """Up to ``max_messages`` records of the partitions this member holds, waiting up
        to ``timeout_ms``; applies assignment changes first (see the class docs)."""
        self._check_open()
        self._poll_limit(max_messages, timeout_ms)  # the arguments checked before anything waits
        deadline = time.monotonic() + timeout_ms / 1000
        try:
            while True:
                self._last_poll = time.monotonic()
                with self._lock:
                    self._wakeup = concurrent.futures.Future()
                self._sync()
                remaining = deadline - time.monotonic()
                if not self._fetch_pos:  # nothing to read until the group gives us something
                    if remaining > 0:
                        concurrent.futures.wait([self._wakeup], timeout=remaining)
                    if time.monotonic() >= deadline:
                        return []
                    continue
                out = super().poll(max_messages, max(0, int(remaining * 1000)))
                if out or time.monotonic() >= deadline:
                    return out
        finally:
            self._last_poll = time.monotonic()

    def commit(self, offsets: dict[TP, int] | None = None) -> None:
        """Commit the consumed position of every partition this member holds (or the given
        ``{(queue, partition): offset}``): to the broker, as this member and generation
        (clustering), or to the offsets file (broadcast).

        Raises :class:`~headwater.errors.UnknownMemberError` if this member was removed from
        the group (it missed heartbeats or left): its partitions may be read by others now,
        and what it polled since its last commit will be delivered again.
        """
        self._check_open()
        if offsets is not None:
            by_queue(offsets)  # the shape checked, the same for both modes
        chosen = dict(self._consumed) if offsets is None else dict(offsets)
        if not chosen:
            return
        if self.mode == "broadcast":
            self._save_local(chosen)
        else:
            self._commit_member(chosen)

    def committed(self, queue: str, partition: int) -> int | None:
        if self.mode == "broadcast":
            if self._local is None:
                return None
            return self._local.get(queue, self._service.describe_queue(queue).queue_id).get(partition)
        return super().committed(queue, partition)

    def close(self, commit: bool = True) -> None:
        """Revoke everything (committing positions with ``commit_on_revoke``, unless
        ``commit`` is False), leave the group, stop."""
        if self._closed:
            return
        self._stopping.set()
        self._beat.set()
        self._thread.join(timeout=10)
        try:
            with self._lock:
                member = self._view.member()
            if member is not None:
                held = set(self._fetch_pos)
                # a broker that did not answer the closing commit would not answer the leave
                # either: skip it, so that close() costs one request_timeout_s, not two
                if held and not self._revoke(held, commit=commit and self._commit_on_revoke):
                    log.info(
                        "group %s: not leaving, the broker is unreachable; the member expires after session_timeout_ms",
                        self.group,
                    )
                    return
                try:
                    self._service.leave_group(self.group, member)
                except HeadwaterError as e:  # it will expire after its session timeout instead
                    log.info("group %s: leaving failed (%s); the member expires on its own", self.group, e)
        finally:
            with self._lock:
                self._view.left()
            super().close()

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.close(commit=exc_type is None)

    # -- membership, in the application's thread ---------------------------------------

    def _join(self) -> None:
        s = self.settings
        a = self._service.join_group(s.group, None, s.client_id, s.queues, s.mode, s.strategy, s.session_timeout_ms)
        with self._lock:
            self._view.joined(a)
        self._apply(a)

    def _sync(self) -> None:
        """Apply what the heartbeat thread learned: a new assignment, or a lost membership."""
        with self._lock:
            rejoin, update = self._view.take()
        if rejoin:
            if self._fetch_pos:
                self._lose_all()
            try:
                self._join()
            except UnavailableError as e:  # the broker is away: poll again later
                log.info("group %s: cannot join now (%s)", self.group, e)
        elif update is not None:
            self._apply(update)

    def _apply(self, a: GroupAssignment) -> None:
        with self._lock:
            plan = self._view.plan(a, set(self._fetch_pos))
        if plan is None:
            return  # older than what we read already
        new, revoked, added = plan
        if revoked:
            self._revoke(revoked, commit=self._commit_on_revoke)
        with self._lock:
            acked = self._view.applied(a, new)
        if revoked or acked:
            self._beat.set()  # acknowledge now: the revoked partitions go to their next holder
        if added:
            self._add(added)

    def _revoke(self, tps: set[TP], *, commit: bool) -> bool:
        """Commit (if ``commit``), tell ``on_revoke``, forget ``tps``; False when the broker
        could not be reached for the commit."""
        reached = True
        if commit:
            positions = {tp: self._consumed[tp] for tp in tps if tp in self._consumed}
            try:
                if self.mode == "broadcast":
                    if self._local is not None:
                        self._save_local(positions)
                elif positions:
                    self._commit_member(positions)
            except (GroupError, UnavailableError) as e:
                reached = not isinstance(e, UnavailableError)
                log.warning("group %s: could not commit revoked partitions %s: %s", self.group, sorted(tps), e)
        self._call(self._on_revoke, tps)
        self._forget(tps)
        return reached

    def _add(self, tps: set[TP]) -> None:
        for queue, offs in by_queue({tp: 0 for tp in tps}).items():
            try:
                Consumer.assign(self, queue, sorted(offs))
            except HeadwaterError as e:  # e.g. the queue was deleted meanwhile: the group drops it
                log.warning("group %s: cannot read %s%s: %s", self.group, queue, sorted(offs), e)
                tps = {tp for tp in tps if tp[0] != queue}
        if tps:
            self._call(self._on_assign, tps)

    def _lose_all(self) -> None:
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
        self._call(self._on_revoke, held)
        self._forget(held)

    def _call(self, callback: Callback | None, tps: set[TP]) -> None:
        if callback is None:
            return
        try:
            callback(sorted(tps))
        except Exception:  # noqa: BLE001 - the member's state must stay consistent
            log.exception("group %s: %s callback failed", self.group, getattr(callback, "__name__", "a"))

    # -- offsets ------------------------------------------------------------------------

    def _committed_offsets(self, queue: str, queue_id: int) -> dict[int, int]:
        if self.mode == "broadcast":
            return self._local.get(queue, queue_id) if self._local is not None else {}
        return super()._committed_offsets(queue, queue_id)

    def _save_local(self, offsets: dict[TP, int]) -> None:
        if self._local is None:
            raise InvalidArgumentError(
                "a broadcast member keeps its offsets in a local file: create it with offsets_path=..."
            )
        unknown = sorted(tp for tp in offsets if tp[0] not in self._queue_ids)
        if unknown:
            raise InvalidArgumentError(f"{unknown} are not partitions of the subscribed queues")
        self._local.save(offsets, self._queue_ids)

    def _commit_member(self, offsets: dict[TP, int]) -> None:
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
                    self._service.commit_offsets(self.group, queue, offs, member_id=member, generation=generation)
                    break
                except StaleGenerationError:
                    # the group rebalanced: until we acknowledge, we still hold our partitions,
                    # so learn the new generation (without acknowledging it) and commit again
                    if attempt == COMMIT_ATTEMPTS - 1:
                        raise
                    self._heartbeat(member)
                except UnknownMemberError:
                    with self._lock:
                        self._view.lost(member)
                    raise

    # -- the heartbeat thread -----------------------------------------------------------

    def _heartbeat_loop(self) -> None:
        while not self._stopping.is_set():
            with self._lock:
                waiting = self._view.waiting
            self._beat.wait((HEARTBEAT_WAITING_MS if waiting else self.settings.heartbeat_interval_ms) / 1000)
            self._beat.clear()
            if self._stopping.is_set():
                return
            try:
                self._beat_once()
            except (UnavailableError, ClosedError) as e:
                log.info("group %s: heartbeat failed (%s); trying again", self.group, e)
            except Exception:  # noqa: BLE001 - the thread must outlive surprises
                log.exception("group %s: heartbeat failed", self.group)

    def _beat_once(self) -> None:
        with self._lock:
            member = self._view.member()
        if member is None:
            return
        if time.monotonic() - self._last_poll > self.settings.max_poll_interval_ms / 1000:
            log.warning(
                "group %s: poll() was not called for max_poll_interval_ms (%d ms); leaving the group "
                "so others take its partitions; the next poll() joins again",
                self.group,
                self.settings.max_poll_interval_ms,
            )
            with self._lock:
                self._view.lost(member)
            try:
                self._service.leave_group(self.group, member)
            except HeadwaterError:
                pass
            return
        try:
            self._heartbeat(member)
        except UnknownMemberError:
            log.warning("group %s: member %s is no longer in the group; poll() joins again", self.group, member)

    def _heartbeat(self, member: str) -> None:
        """One heartbeat acknowledging what this consumer applied; records the answer (the
        application's thread applies it). UnknownMemberError: marks that poll() must join again."""
        with self._lock:
            applied = self._view.applied_generation
        try:
            a = self._service.heartbeat_group(self.group, member, applied)
        except UnknownMemberError:
            with self._lock:
                self._view.lost(member)
            self._wake_poll()
            raise
        with self._lock:
            changed = self._view.heard(a)
        if changed:
            self._wake_poll()

    def _wake_poll(self) -> None:
        with self._lock:
            fut = self._wakeup
        if fut is not None and not fut.done():
            try:
                fut.set_result(None)
            except concurrent.futures.InvalidStateError:
                pass
