"""ConsumerBase: a consumer's reads and commits, once for the blocking and the asyncio kind.

This is the simple form: you choose the partitions; group membership and rebalancing come
with consumer groups. A ``group`` name gives the consumer a place on the broker to commit
its positions, so the next consumer of that group resumes where this one stopped.

Two positions are kept per partition (:mod:`.positions`): where the next fetch starts, and
what the application has consumed (the offset after the last record ``poll`` returned).
``commit`` stores the second, so a crash re-delivers at most what was polled and not yet
committed. Over the network a fetch stream per queue has the broker push new batches (see
docs/design/client.md); else one long-polling fetch per partition is kept in flight, so the
next batch is on its way while the application works on this one.

The steps that ask the broker are ``@waits`` bodies (:mod:`.twins`):
:class:`~headwater.client.sync.consumer.Consumer` makes them blocking methods,
:class:`~headwater.client.aio.consumer.AsyncConsumer` coroutines. What waits is a
coroutine there (``assign``, ``poll``, ``commit``, ``committed``, the seeks that ask the
broker where the beginning, end or a time is, ``close``); what only moves local state is a
plain method in both (``seek``, ``seek_to_id``, ``position``, ``assignment``,
``unassign``). ``commit_async`` is a plain method in both: it queues the commit on a
:class:`~headwater.client.core.commits.CommitPipeline` and returns; each kind sends the
queued commits in order (a thread, a task: :meth:`_enqueue_commit`) and ``commit`` and
``close`` wait for them first (:meth:`_wait_commits`). Each kind says how it starts a
fetch (:meth:`_fetch`: a thread or the transport's future, a task), how it waits for one
of several (:meth:`_wait_any`), makes a future to be woken by (:meth:`_new_waiter`) and
cancels its reads (:meth:`_cancel_reads`). A ``poll`` steps its generator once per wait, never per record.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from headwater.client.common.positions import TP, ConsumerPositions
from headwater.client.common.twins import Twins, Waits, waits
from headwater.client.core.commits import CommitCallback, CommitPipeline
from headwater.client.core.membership import by_queue
from headwater.client.core.reads import check_poll, partitions_named
from headwater.client.transport.polling import drain_buffers, take_batches
from headwater.model.message import Record, required_epoch_ms
from headwater.model.service import FetchResult

__all__ = ["ConsumerBase"]

log = logging.getLogger("headwater.client")


class ConsumerBase(ConsumerPositions, Twins):
    """Poll records from assigned partitions: the reads of both kinds (see the module's
    docstring); the positions and settings are :class:`ConsumerPositions`'."""

    _commits: CommitPipeline | None = None  # made by the first commit_async
    # guards _commits where a thread sends them (the blocking kind makes a condition)
    _commit_guard: Any = contextlib.nullcontext()

    # -- assignment and seeks that ask the broker (the rest: ConsumerPositions) -----------

    @waits
    def assign(self, queue: str, partitions: int | Iterable[int] | None = None) -> Waits[None]:
        """Read these partitions of ``queue`` (all when None), starting at the group's
        committed offsets, else at the start or the end (``auto_offset_reset``)."""
        self._check_open()
        info = yield self._service.describe_queue(queue)
        parts = partitions_named(info, partitions)
        committed = yield from self._committed_offsets(queue, info.queue_id)
        self._start(queue, info, parts, committed)

    def _committed_offsets(self, queue: str, queue_id: int) -> Waits[dict[int, int]]:
        """Where ``assign`` starts: the group's committed offsets (the broadcast consumer
        keeps its own)."""
        if not self.group:
            return {}
        return (yield self._service.fetch_offsets(self.group, queue))

    @waits
    def seek_to_beginning(self, queue: str, partitions: int | Iterable[int] | None = None) -> Waits[None]:
        """Continue from the oldest retained record (asks the broker where that is)."""
        yield from self._seek_to_edge(queue, partitions, end=False)

    @waits
    def seek_to_end(self, queue: str, partitions: int | Iterable[int] | None = None) -> Waits[None]:
        """Continue with records appended from now on."""
        yield from self._seek_to_edge(queue, partitions, end=True)

    def _seek_to_edge(self, queue: str, partitions: int | Iterable[int] | None, *, end: bool) -> Waits[None]:
        tps = self._parts(queue, partitions)  # checked before the broker is asked
        info = yield self._service.describe_queue(queue)
        info.require_online([p for _, p in tps], f"seek to the {'end' if end else 'start'}")
        for tp in tps:
            p = info.partitions[tp[1]]
            self._set_position(tp, p.end_offset if end else p.start_offset)

    @waits
    def seek_to_time(
        self, queue: str, when: datetime | int, partitions: int | Iterable[int] | None = None
    ) -> Waits[None]:
        """Continue from the first record appended at or after ``when``."""
        ms = required_epoch_ms(when, "when")  # a datetime or a number; None is refused
        for tp in self._parts(queue, partitions):
            self._set_position(tp, (yield self._service.offset_for_time(queue, tp[1], ms)))

    # -- polling ----------------------------------------------------------------------

    @waits
    def poll(self, max_messages: int | None = None, timeout_ms: int = 1000) -> Waits[list[Record]]:
        """Up to ``max_messages`` records, waiting up to ``timeout_ms`` for the first ones.

        Fetches that find nothing wait on the broker for appends (long polling), so records
        produced during the wait are returned as soon as they are stored. Raises
        :class:`~headwater.errors.InvalidArgumentError` while a position ``seek()`` set is
        past its partition's end, :class:`~headwater.errors.QueueDisabledError` for a
        disabled queue; see docs/consumer-groups.md ("Positions").
        """
        self._check_open()
        if self._commits is not None:
            self._run_commit_callbacks()
        limit = check_poll(max_messages, timeout_ms, self.max_poll_messages)
        self._arm_wakeup()
        self._check_woken()
        deadline = time.monotonic() + timeout_ms / 1000  # the event loop's clock too
        for queue in self._seeks_to_check():
            self._check_seeks(queue, (yield self._service.describe_queue(queue)))
        while True:
            out = drain_buffers(self._buffers, self._fetch_pos, self._consumed, limit, self._paused)
            remaining = deadline - time.monotonic()
            if out or not self._fetch_pos:
                return out
            if self._paused and self._paused.issuperset(self._fetch_pos):  # nothing to read: wait out the poll
                yield self._wait_any(self._with_wakeup([self._new_waiter()]), max(0.0, remaining))
                self._check_woken()
                return []
            if self._streams is not None:
                got = yield from self._await_pushes(remaining)
            else:
                self._launch_fetches(max(0, int(remaining * 1000)))
                yield self._wait_any(self._with_wakeup([f for _, f in self._inflight.values()]), remaining)
                got = self._collect()
            if not got and self._gives_up(remaining):
                return []

    def _ready(self, max_messages: int | None = 1, timeout_ms: int = 1000) -> list[Record]:
        """What ``poll(max_messages, timeout_ms)`` would hand out at once, from the buffers
        (else nothing): a poll loop takes it so, without driving a body per call."""
        if self._closed or self._seeked or self._woken:
            return []  # poll raises, or checks the seeks first
        if self._commits is not None:
            self._run_commit_callbacks()
        limit = check_poll(max_messages, timeout_ms, self.max_poll_messages)
        return drain_buffers(self._buffers, self._fetch_pos, self._consumed, limit, self._paused)

    def _with_wakeup(self, futures: list[Any]) -> list[Any]:
        """``futures`` and the future that ends a waiting poll early, if any (``_wakeup``)."""
        if self._wakeup is not None:
            futures.append(self._wakeup)
        return futures

    def _launch_fetches(self, wait_ms: int) -> None:
        """A fetch for each partition not paused with none in flight and room in its buffer,
        the first one in turn, so that no partition waits behind the others every time."""
        tps = list(self._reading())
        if not tps:
            return
        start = next(self._rotation) % len(tps)
        for tp in tps[start:] + tps[:start]:
            if tp in self._inflight or len(self._buffers[tp]) >= self.max_poll_messages:
                continue
            pos = self._fetch_pos[tp]
            self._inflight[tp] = (pos, self._fetch(tp, pos, wait_ms))

    def _collect(self) -> int:
        """Take the records of the fetches that ended; the records taken."""
        got = 0
        for tp, entry in list(self._inflight.items()):
            pos, fut = entry
            if not fut.done() or self._inflight.get(tp) is not entry:
                continue  # not answered yet, or dropped meanwhile (its queue created again)
            del self._inflight[tp]
            res: FetchResult | None = self._outage.result(fut)  # a fetch's error is this poll's error...
            if res is None:
                continue  # ... unless the broker restarts: read again on the next turn
            if self._fetch_pos.get(tp) != pos:
                continue  # the application seeked meanwhile: this answer is stale
            if self._off_course(tp, res.start_offset, res.end_offset, res.batches):
                continue  # the position moved: past the end, or the queue was created again
            start = max(pos, res.start_offset)  # records before start expired: skip them
            got += take_batches(
                tp, res.batches, start, res.next_offset, self._fetch_pos, self._consumed, self._buffers, self._tags
            )
        return got

    # -- fetch streams (stream mode, over the network) ------------------------------------

    def _await_pushes(self, remaining: float) -> Waits[int]:
        """Take what was pushed; if nothing, start opening the streams missing and wait up to
        ``remaining`` seconds for a push (or an answer to an opening). The records taken."""
        streams = self._streams
        assert streams is not None
        got = streams.take(self._fetch_pos, self._consumed, self._buffers, self._tags, self._off_course)
        if got:
            return got
        streams.open_missing(self._reading())
        if not streams.pending():
            self._push_waiter = self._new_waiter()
            try:
                # a blocking wait with no time left still reads what has come (polling.wait_any)
                yield self._wait_any(
                    self._with_wakeup([self._push_waiter, *streams.openings()]), streams.wait_s(remaining)
                )
            finally:
                self._push_waiter = None
        return streams.take(self._fetch_pos, self._consumed, self._buffers, self._tags, self._off_course)

    # -- offsets and closing ------------------------------------------------------------

    @waits
    def commit(self, offsets: dict[TP, int] | None = None) -> Waits[None]:
        """Store positions on the broker under the group: the consumed positions of every
        assigned partition (those this consumer's commits have not stored as they are), or
        the given ``{(queue, partition): offset}``. Returns once the broker has stored them
        (durable as its ``offsets_flush`` says: docs/consumer-groups.md), after every
        :meth:`commit_async` made before it."""
        chosen = self._commit_choice(offsets)
        if self._commits is not None:
            yield self._wait_commits()
        yield from self._send_commit(chosen)

    def commit_async(self, offsets: dict[TP, int] | None = None, callback: CommitCallback | None = None) -> None:
        """Commit as :meth:`commit` does, without waiting for the broker: the commit is sent
        in the background, after the ones before it, and ``callback(offsets, error)`` (if
        given) is called with the offsets and None or the exception, from a later
        ``poll``, ``commit``, ``commit_async`` or ``close`` of this consumer (its thread or
        task). A failed commit is not retried (a newer one may follow it); ``commit()`` and
        ``close()`` wait for those in flight. See :mod:`headwater.client.core.commits`."""
        chosen = self._commit_choice(offsets)
        if self._commits is None:
            self._commits = CommitPipeline()
        self._run_commit_callbacks()
        self._enqueue_commit(chosen, callback)

    def _commit_choice(self, offsets: dict[TP, int] | None) -> dict[TP, int]:
        """What ``commit(offsets)`` stores (checked): the consumed positions of every
        assigned partition, or the given ``{(queue, partition): offset}``."""
        self._to_commit(offsets)  # the checks: open, a group, the offsets' shape
        return self._moved_since_stored() if offsets is None else dict(offsets)

    def _send_commit(self, chosen: dict[TP, int]) -> Waits[None]:
        """Ask the broker to store ``chosen`` (no wait for the queued commits)."""
        for queue, offs in by_queue(chosen).items():
            yield self._service.commit_offsets(self.group, queue, offs)
            self._note_stored(queue, offs)

    @waits
    def _commit_now(self, chosen: dict[TP, int]) -> Waits[None]:
        """One request of the commit pipeline, driven by its thread or task."""
        yield from self._send_commit(chosen)

    def _run_commit_callbacks(self) -> None:
        """Run the callbacks of the asynchronous commits that ended (the application's thread)."""
        commits = self._commits
        if commits is None:
            return
        with self._commit_guard:
            due = commits.take_due()
        for callback, offsets, error in due:
            try:
                callback(offsets, error)
            except Exception:  # a callback's bug must not end the consumer's poll loop
                log.exception("group %s: a commit_async callback raised", self.group)

    @waits
    def committed(self, queue: str, partition: int) -> Waits[int | None]:
        """The group's committed offset of a partition, or None."""
        self._need_group("committed")
        return (yield self._service.fetch_offsets(self.group, queue)).get(partition)

    @waits
    def close(self) -> Waits[None]:
        """Stop: fetches in flight are cancelled (by the asyncio consumer, and awaited: no
        task outlives it)."""
        if self._commits is not None and not self._closed:
            yield self._wait_commits(stop=True)
        self._closed = True
        if self._streams is not None:
            with contextlib.suppress(Exception):  # the client may be closed already
                self._streams.close()
        reads = [f for _, f in self._inflight.values()] + list(self._dropped)
        self._inflight.clear()
        yield self._cancel_reads(reads)

    # -- what each kind says -------------------------------------------------------------

    def _fetch(self, tp: TP, pos: int, wait_ms: int) -> Any:
        """Start a fetch of ``tp`` from ``pos``, waiting up to ``wait_ms`` on the broker: its
        future, or its task."""
        raise NotImplementedError

    def _wait_any(self, futures: list[Any], timeout_s: float, *, lead: bool = True) -> Any:
        """Wait until one of ``futures`` is done or ``timeout_s`` passes (a blocking call, or
        the coroutine that waits). ``lead``: a blocking wait over the network reads the
        answers itself (``polling.wait_any``); a wait for no read of its own does not."""
        raise NotImplementedError

    def _new_waiter(self) -> Any:
        """A future another thread or task completes to end a wait."""
        raise NotImplementedError

    def _cancel_reads(self, reads: list[Any]) -> Any:
        """Cancel the reads ``close`` dropped (a blocking call, or the coroutine that awaits them)."""
        raise NotImplementedError

    def _enqueue_commit(self, chosen: dict[TP, int], callback: CommitCallback | None) -> None:
        """Queue a commit on ``_commits`` and make sure its sender runs."""
        raise NotImplementedError

    def _wait_commits(self, stop: bool = False) -> Any:
        """Wait until the queued and in-flight commits ended and run their callbacks (a
        blocking call, or the coroutine); ``stop``: the sender ends too (close)."""
        raise NotImplementedError
