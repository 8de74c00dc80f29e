"""Consumer: reads partitions you assign, from positions it keeps, with long polling.

This is the simple form: you choose the partitions; group membership and rebalancing come
with consumer groups. A ``group`` name gives the consumer a place on the broker to commit
its positions, so the next consumer of that group resumes where this one stopped.

Two positions are kept per partition: where the next fetch starts, and what the
application has consumed (the offset after the last record ``poll`` returned). ``commit``
stores the second, so a crash re-delivers at most what was polled and not yet committed.
One fetch per partition is kept in flight, so the next batch is on its way while the
application works on this one.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import itertools
import time
from collections.abc import Iterable, Iterator
from datetime import datetime
from typing import Any

from headwater.client.common.positions import TP, ConsumerPositions
from headwater.client.core.reads import POLL_MESSAGES_DEFAULT, partitions_named
from headwater.client.transport.fetch_stream import STREAM_WINDOW_BYTES
from headwater.client.transport.polling import drain_buffers, take_batches, wait_any
from headwater.client.transport.send_future import LazyFuture
from headwater.model.message import Record
from headwater.model.service import BrokerService, FetchesAsync, FetchResult, Leads

__all__ = ["Consumer", "POLL_MESSAGES_DEFAULT"]


class Consumer(ConsumerPositions):
    """Poll records from assigned partitions. Use from one thread.

    >>> import headwater, tempfile
    >>> hw = headwater.open(tempfile.mkdtemp())
    >>> _ = hw.admin.create_queue("jobs", partitions=2)
    >>> _ = hw.send_batch("jobs", [b"a", b"b"], partition=1)
    >>> c = hw.consumer(group="workers")
    >>> c.assign("jobs")
    >>> [r.body for r in c.poll(timeout_ms=100)]
    [b'a', b'b']
    >>> c.commit(); c.close(); hw.close()
    """

    _inflight: dict[TP, tuple[int, concurrent.futures.Future]]

    def __init__(
        self,
        service: BrokerService,
        *,
        group: str | None = None,
        auto_offset_reset: str = "earliest",
        fetch_bytes: int = 1024 * 1024,
        max_poll_messages: int = POLL_MESSAGES_DEFAULT,
        tags: str | Iterable[str] | None = None,
        fetch_threads_max: int = 16,
        stream: bool = True,
        stream_window_bytes: int = STREAM_WINDOW_BYTES,
    ) -> None:
        super().__init__(
            service,
            group=group,
            auto_offset_reset=auto_offset_reset,
            fetch_bytes=fetch_bytes,
            max_poll_messages=max_poll_messages,
            tags=tags,
            stream=stream,
            stream_window_bytes=stream_window_bytes,
            on_push=self._push_arrived,
        )
        self._rotation = itertools.count()
        self._fetch_async = service.fetch_async if isinstance(service, FetchesAsync) else None
        # over the network: read answers on this thread
        self._lead = service.lead if isinstance(service, Leads) else None
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._fetch_threads_max = fetch_threads_max
        self._arrived: concurrent.futures.Future | None = None  # done by the next push (fetch streams)

    # -- assignment and positions (the rest: ConsumerPositions) --------------------------

    def assign(self, queue: str, partitions: int | Iterable[int] | None = None) -> None:
        """Read these partitions of ``queue`` (all when None), starting at the group's
        committed offsets, else at the start or the end (``auto_offset_reset``)."""
        self._check_open()
        info = self._service.describe_queue(queue)
        parts = partitions_named(info, partitions)
        self._start(queue, info, parts, self._committed_offsets(queue, info.queue_id))

    def _committed_offsets(self, queue: str, queue_id: int) -> dict[int, int]:
        """Where ``assign`` starts: the group's committed offsets (the broadcast consumer
        keeps its own)."""
        return self._service.fetch_offsets(self.group, queue) if self.group else {}

    def seek_to_beginning(self, queue: str, partitions: int | Iterable[int] | None = None) -> None:
        """Continue from the oldest retained record (asks the broker where that is)."""
        tps = self._parts(queue, partitions)
        info = self._service.describe_queue(queue)
        for tp in tps:
            self._set_position(tp, info.partitions[tp[1]].start_offset)

    def seek_to_end(self, queue: str, partitions: int | Iterable[int] | None = None) -> None:
        """Continue with records appended from now on."""
        tps = self._parts(queue, partitions)
        info = self._service.describe_queue(queue)
        for tp in tps:
            self._set_position(tp, info.partitions[tp[1]].end_offset)

    def seek_to_time(self, queue: str, when: datetime | int, partitions: int | Iterable[int] | None = None) -> None:
        """Continue from the first record appended at or after ``when``."""
        ms = self._when_ms(when)
        for tp in self._parts(queue, partitions):
            self._set_position(tp, self._service.offset_for_time(queue, tp[1], ms))

    # -- polling ----------------------------------------------------------------------

    def poll(self, max_messages: int | None = None, timeout_ms: int = 1000) -> list[Record]:
        """Up to ``max_messages`` records, waiting up to ``timeout_ms`` for the first ones.

        Raises :class:`~headwater.errors.InvalidArgumentError` while a position ``seek()``
        set is past its partition's end, :class:`~headwater.errors.QueueDisabledError` for
        a disabled queue; see docs/consumer-groups.md ("Positions")."""
        self._check_open()
        limit = self._poll_limit(max_messages, timeout_ms)
        deadline = time.monotonic() + timeout_ms / 1000
        for queue in self._seeks_to_check():
            self._check_seeks(queue, self._service.describe_queue(queue))
        while True:
            out = drain_buffers(self._buffers, self._fetch_pos, self._consumed, limit)
            remaining = deadline - time.monotonic()
            if out or not self._fetch_pos:
                return out
            if self._streams is not None:
                if not self._await_pushes(remaining) and self._gives_up(remaining):
                    return []
                continue
            wait_ms = max(0, int(remaining * 1000))
            self._launch_fetches(wait_ms)
            futures = [f for _, f in self._inflight.values()]
            if self._wakeup is not None:
                futures.append(self._wakeup)
            wait_any(futures, remaining, lead=self._lead, interrupt=self._wakeup)  # see polling.wait_any
            if not self._collect() and self._gives_up(remaining):
                return []

    def _launch_fetches(self, wait_ms: int) -> None:
        tps = list(self._fetch_pos)
        if not tps:
            return
        if self._fetch_async is None and len(tps) > self._fetch_threads_max:
            wait_ms = min(wait_ms, 50)  # let a few threads cycle over many partitions
        start = next(self._rotation) % len(tps)
        for tp in tps[start:] + tps[:start]:
            if tp in self._inflight or len(self._buffers[tp]) >= self.max_poll_messages:
                continue
            pos = self._fetch_pos[tp]
            kwargs: dict[str, Any] = dict(max_bytes=self._fetch_bytes, tag_mask=self._mask, max_wait_ms=wait_ms)
            if self._fetch_async is not None:
                if self._lead is not None:
                    kwargs["lead"] = True  # this thread reads the answer (polling.wait_any)
                fut = self._fetch_async(tp[0], tp[1], pos, **kwargs)
            else:
                if self._pool is None:
                    self._pool = concurrent.futures.ThreadPoolExecutor(
                        self._fetch_threads_max, thread_name_prefix="headwater-consumer"
                    )
                fut = self._pool.submit(self._service.fetch, tp[0], tp[1], pos, **kwargs)
            self._inflight[tp] = (pos, fut)

    # -- fetch streams (stream mode, over the network) ------------------------------------

    def _await_pushes(self, remaining: float) -> int:
        """Take what was pushed; if nothing, start opening the streams missing and wait up to
        ``remaining`` seconds for a push (or an answer to an opening). The records taken."""
        streams = self._streams
        assert streams is not None
        got = streams.take(self._fetch_pos, self._consumed, self._buffers, self._tags, self._reset_past_end)
        if got:
            return got
        streams.open_missing(self._fetch_pos)
        arrived = self._arrived = LazyFuture()  # no condition unless another thread leads
        if not streams.pending():
            futures = [arrived, *streams.openings()]
            if self._wakeup is not None:
                futures.append(self._wakeup)
            wait_any(futures, max(0.0, streams.wait_s(remaining)), lead=self._lead, interrupt=self._wakeup)
        self._arrived = None
        return streams.take(self._fetch_pos, self._consumed, self._buffers, self._tags, self._reset_past_end)

    def _push_arrived(self) -> None:
        """A push came (any thread): end the wait for one."""
        waiter = self._arrived
        if waiter is not None and not waiter.done():
            try:
                waiter.set_result(None)
            except concurrent.futures.InvalidStateError:  # another push came first
                pass

    def _collect(self) -> int:
        got = 0
        for tp, (pos, fut) in list(self._inflight.items()):
            if not fut.done():
                continue
            del self._inflight[tp]
            res: FetchResult | None = self._outage.result(fut)
            if res is None:
                continue  # the broker restarts: read again on the next turn
            if self._fetch_pos.get(tp) != pos:
                continue  # the application seeked meanwhile: this answer is stale
            if pos > res.end_offset:
                self._reset_past_end(tp, res.start_offset, res.end_offset)
                continue
            start = max(pos, res.start_offset)  # records before start expired: skip them
            got += take_batches(
                tp, res.batches, start, res.next_offset, self._fetch_pos, self._consumed, self._buffers, self._tags
            )
        return got

    def __iter__(self) -> Iterator[Record]:
        """Records forever (until :meth:`close`), polling as needed."""
        while not self._closed:
            yield from self.poll()

    # -- offsets ----------------------------------------------------------------------

    def commit(self, offsets: dict[TP, int] | None = None) -> None:
        """Store positions on the broker under the group: the consumed positions of every
        assigned partition, or the given ``{(queue, partition): offset}``."""
        for queue, offs in self._to_commit(offsets).items():
            self._service.commit_offsets(self.group, queue, offs)

    def committed(self, queue: str, partition: int) -> int | None:
        """The group's committed offset of a partition, or None."""
        self._need_group("committed")
        return self._service.fetch_offsets(self.group, queue).get(partition)

    def close(self) -> None:
        self._closed = True
        self._inflight.clear()
        if self._streams is not None:
            with contextlib.suppress(Exception):  # the client may be closed already
                self._streams.close()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
