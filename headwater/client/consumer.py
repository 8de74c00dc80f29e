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
from collections import deque
from collections.abc import Iterable, Iterator
from datetime import datetime

from headwater.errors import ClosedError, InvalidArgumentError
from headwater.model.batch import tags_mask
from headwater.model.message import MessageId, Record, to_epoch_ms
from headwater.model.service import BrokerService, FetchResult
from headwater.client.fetch_stream import STREAM_WINDOW_BYTES, FetchStreams
from headwater.client.polling import drain_buffers, take_batches, wait_any
from headwater.client.send_future import LazyFuture

__all__ = ["Consumer", "POLL_MESSAGES_DEFAULT"]

#: Records one poll returns at most, unless told otherwise: 32, as EQueue's batch pull.
POLL_MESSAGES_DEFAULT = 32

TP = tuple[str, int]


class Consumer:
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

    def __init__(self, service: BrokerService, *, group: str | None = None,
                 auto_offset_reset: str = "earliest", fetch_bytes: int = 1024 * 1024,
                 max_poll_messages: int = POLL_MESSAGES_DEFAULT, tags: str | Iterable[str] | None = None,
                 fetch_threads_max: int = 16, stream: bool = True,
                 stream_window_bytes: int = STREAM_WINDOW_BYTES) -> None:
        if auto_offset_reset not in ("earliest", "latest"):
            raise InvalidArgumentError(f"auto_offset_reset is 'earliest' or 'latest', got {auto_offset_reset!r}")
        if not isinstance(max_poll_messages, int) or max_poll_messages < 1:
            raise InvalidArgumentError("max_poll_messages must be a positive int")
        self._service = service
        self.group = group
        self.auto_offset_reset = auto_offset_reset
        self._fetch_bytes = fetch_bytes
        self.max_poll_messages = max_poll_messages
        if isinstance(tags, str):
            tags = [tags]
        self._tags = None if tags is None or "*" in tags else frozenset(tags)
        self._mask = tags_mask(self._tags) if self._tags else 0
        self._fetch_pos: dict[TP, int] = {}
        self._consumed: dict[TP, int] = {}
        self._buffers: dict[TP, deque[Record]] = {}
        self._inflight: dict[TP, tuple[int, concurrent.futures.Future]] = {}
        self._queue_ids: dict[str, int] = {}
        self._rotation = itertools.count()
        self._fetch_async = getattr(service, "fetch_async", None)
        self._lead = getattr(service, "lead", None)  # over the network: read answers on this thread
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._fetch_threads_max = fetch_threads_max
        self._closed = False
        # over the network, with stream=True: the broker pushes the partitions' batches
        # (fetch streams) instead of answering a FETCH per batch; embedded, it changes nothing
        self._streams: FetchStreams | None = None
        self._arrived: concurrent.futures.Future | None = None  # done by the next push
        if stream and hasattr(service, "open_fetch_stream"):
            if isinstance(stream_window_bytes, bool) or not isinstance(stream_window_bytes, int) \
                    or stream_window_bytes < 1:
                raise InvalidArgumentError("stream_window_bytes must be a positive int")
            self._streams = FetchStreams(service, window_bytes=stream_window_bytes, notify=self._push_arrived)
        # a future a subclass may complete from another thread to end a waiting poll early
        # (the group consumer does, when its assignment changes)
        self._wakeup: concurrent.futures.Future | None = None

    # -- assignment and positions -----------------------------------------------------

    def assign(self, queue: str, partitions: int | Iterable[int] | None = None) -> None:
        """Read these partitions of ``queue`` (all when None), starting at the group's
        committed offsets, else at the start or the end (``auto_offset_reset``)."""
        self._check_open()
        info = self._service.describe_queue(queue)
        n = len(info.partitions)
        if partitions is None:
            parts = list(range(n))
        elif isinstance(partitions, int) and not isinstance(partitions, bool):
            parts = [partitions]
        else:
            parts = sorted(set(partitions))
        for p in parts:
            if isinstance(p, bool) or not isinstance(p, int) or not 0 <= p < n:
                from headwater.errors import PartitionOutOfRangeError

                raise PartitionOutOfRangeError(
                    f"queue {queue!r} has partitions 0..{n - 1}; there is no partition {p!r}")
        committed = self._committed_offsets(queue, info.queue_id)
        self._queue_ids[queue] = info.queue_id
        for p in parts:
            pi = info.partitions[p]
            if p in committed:
                pos = max(committed[p], pi.start_offset)
            else:
                pos = pi.start_offset if self.auto_offset_reset == "earliest" else pi.end_offset
            self._set_position((queue, p), pos)

    def _committed_offsets(self, queue: str, queue_id: int) -> dict[int, int]:
        """Where ``assign`` starts: the group's committed offsets (the broadcast consumer
        keeps its own)."""
        return self._service.fetch_offsets(self.group, queue) if self.group else {}

    def unassign(self, queue: str | None = None) -> None:
        self._forget([tp for tp in self._fetch_pos if queue is None or tp[0] == queue])

    def _forget(self, tps: Iterable[TP]) -> None:
        for tp in tps:
            for d in (self._fetch_pos, self._consumed, self._buffers, self._inflight):
                d.pop(tp, None)
            if self._streams is not None:
                self._streams.close(tp[0])

    def assignment(self) -> list[TP]:
        return sorted(self._fetch_pos)

    def position(self, queue: str, partition: int) -> int:
        """The offset of the next record ``poll`` will return from this partition."""
        return self._consumed[self._tp(queue, partition)]

    def _tp(self, queue: str, partition: int) -> TP:
        tp = (queue, partition)
        if tp not in self._fetch_pos:
            raise InvalidArgumentError(f"{queue}[{partition}] is not assigned to this consumer; assign() it first")
        return tp

    def _set_position(self, tp: TP, offset: int) -> None:
        self._fetch_pos[tp] = offset
        self._consumed[tp] = offset
        self._buffers[tp] = deque()
        self._inflight.pop(tp, None)
        if self._streams is not None:
            self._streams.close(tp[0])  # the next poll streams from here

    def _parts(self, queue: str, partitions: int | Iterable[int] | None) -> list[TP]:
        if partitions is None:
            tps = [tp for tp in self._fetch_pos if tp[0] == queue]
            if not tps:
                raise InvalidArgumentError(f"no partition of {queue!r} is assigned; assign() it first")
            return tps
        if isinstance(partitions, int):
            partitions = [partitions]
        return [self._tp(queue, p) for p in partitions]

    def seek(self, queue: str, partition: int, offset: int) -> None:
        """Continue ``partition`` from ``offset``."""
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise InvalidArgumentError(f"an offset is an int >= 0, got {offset!r}")
        self._set_position(self._tp(queue, partition), offset)

    def seek_to_id(self, message_id: MessageId | str) -> None:
        """Continue the message's partition from that message."""
        mid = MessageId.parse(message_id)
        for queue, qid in self._queue_ids.items():
            if qid == mid.queue_id:
                self.seek(queue, mid.partition, mid.offset)
                return
        raise InvalidArgumentError(f"message id {mid} is not of an assigned queue")

    def seek_to_beginning(self, queue: str, partitions: int | Iterable[int] | None = None) -> None:
        info = self._service.describe_queue(queue)
        for tp in self._parts(queue, partitions):
            self._set_position(tp, info.partitions[tp[1]].start_offset)

    def seek_to_end(self, queue: str, partitions: int | Iterable[int] | None = None) -> None:
        info = self._service.describe_queue(queue)
        for tp in self._parts(queue, partitions):
            self._set_position(tp, info.partitions[tp[1]].end_offset)

    def seek_to_time(self, queue: str, when: datetime | int, partitions: int | Iterable[int] | None = None) -> None:
        """Continue from the first record appended at or after ``when``."""
        ms = to_epoch_ms(when, "when")
        for tp in self._parts(queue, partitions):
            self._set_position(tp, self._service.offset_for_time(queue, tp[1], ms))

    # -- polling ----------------------------------------------------------------------

    def poll(self, max_messages: int | None = None, timeout_ms: int = 1000) -> list[Record]:
        """Up to ``max_messages`` records, waiting up to ``timeout_ms`` for the first ones."""
        self._check_open()
        limit = max_messages or self.max_poll_messages
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            out = drain_buffers(self._buffers, self._fetch_pos, self._consumed, limit)
            remaining = deadline - time.monotonic()
            if out or not self._fetch_pos:
                return out
            if self._streams is not None:
                got = self._await_pushes(remaining)
                if not got and (remaining <= 0 or (self._wakeup is not None and self._wakeup.done())):
                    return []
                continue
            wait_ms = max(0, int(remaining * 1000))
            self._launch_fetches(wait_ms)
            futures = [f for _, f in self._inflight.values()]
            if self._wakeup is not None:
                futures.append(self._wakeup)
            wait_any(futures, remaining, lead=self._lead, interrupt=self._wakeup)  # see polling.wait_any
            got = self._collect()
            if not got and (remaining <= 0 or (self._wakeup is not None and self._wakeup.done())):
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
            kwargs = dict(max_bytes=self._fetch_bytes, tag_mask=self._mask, max_wait_ms=wait_ms)
            if self._fetch_async is not None:
                if self._lead is not None:
                    kwargs["lead"] = True  # this thread reads the answer (polling.wait_any)
                fut = self._fetch_async(tp[0], tp[1], pos, **kwargs)
            else:
                if self._pool is None:
                    self._pool = concurrent.futures.ThreadPoolExecutor(
                        self._fetch_threads_max, thread_name_prefix="headwater-consumer")
                fut = self._pool.submit(self._service.fetch, tp[0], tp[1], pos, **kwargs)
            self._inflight[tp] = (pos, fut)

    # -- fetch streams (stream mode, over the network) ------------------------------------

    def _await_pushes(self, remaining: float) -> int:
        """Take what was pushed; if nothing, open the streams missing and wait up to
        ``remaining`` seconds for a push. The records taken."""
        streams = self._streams
        assert streams is not None
        got = streams.take(self._fetch_pos, self._consumed, self._buffers, self._tags)
        if got:
            return got
        for queue, offsets in streams.to_open(self._fetch_pos).items():
            handler = streams.handler_for(queue)
            try:
                sid = self._service.open_fetch_stream(queue, offsets, handler, credit_bytes=streams.window_bytes,
                                                      tag_mask=self._mask, push_bytes_max=self._fetch_bytes)
            except BaseException:
                streams.failed(queue)
                raise
            streams.opened(queue, sid)
        arrived = self._arrived = LazyFuture()  # no condition unless another thread leads
        if not streams.pending():
            futures = [arrived] if self._wakeup is None else [arrived, self._wakeup]
            wait_any(futures, max(0.0, remaining), lead=self._lead, interrupt=self._wakeup)
        self._arrived = None
        return streams.take(self._fetch_pos, self._consumed, self._buffers, self._tags)

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
            res: FetchResult = fut.result()
            if self._fetch_pos.get(tp) != pos:
                continue  # the application seeked meanwhile: this answer is stale
            start = max(pos, res.start_offset)  # records before start expired: skip them
            got += take_batches(tp, res.batches, start, res.next_offset, self._fetch_pos, self._consumed,
                                self._buffers, self._tags)
        return got

    def __iter__(self) -> Iterator[Record]:
        """Records forever (until :meth:`close`), polling as needed."""
        while not self._closed:
            yield from self.poll()

    # -- offsets ----------------------------------------------------------------------

    def commit(self, offsets: dict[TP, int] | None = None) -> None:
        """Store positions on the broker under the group: the consumed positions of every
        assigned partition, or the given ``{(queue, partition): offset}``."""
        self._check_open()
        if not self.group:
            raise InvalidArgumentError("commit needs a group: create the consumer with group='name'")
        chosen = dict(self._consumed) if offsets is None else dict(offsets)
        by_queue: dict[str, dict[int, int]] = {}
        for (queue, part), off in chosen.items():
            by_queue.setdefault(queue, {})[part] = off
        for queue, offs in by_queue.items():
            self._service.commit_offsets(self.group, queue, offs)

    def committed(self, queue: str, partition: int) -> int | None:
        """The group's committed offset of a partition, or None."""
        if not self.group:
            raise InvalidArgumentError("committed needs a group: create the consumer with group='name'")
        return self._service.fetch_offsets(self.group, queue).get(partition)

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("this consumer is closed")

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
