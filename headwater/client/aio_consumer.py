"""AsyncConsumer: the :class:`~headwater.client.consumer.Consumer` for asyncio.

The same positions and the same reading: two positions per partition (where the next
fetch starts, and what the application has consumed); over the network a fetch stream per
queue (the broker pushes new batches, see docs/design/client.md), else one long-polling
fetch in flight per partition as a task, so the next batch is on its way while the
application works on this one.

What waits is a coroutine (``assign``, ``poll``, ``commit``, ``committed``, the seeks that
ask the broker where the beginning, end or a time is, ``close``); what only moves local
state is a plain method (``seek``, ``seek_to_id``, ``position``, ``assignment``,
``unassign``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import deque
from collections.abc import Iterable
from datetime import datetime

from headwater.errors import ClosedError, InvalidArgumentError, PartitionOutOfRangeError
from headwater.model.batch import tags_mask
from headwater.model.message import MessageId, Record, to_epoch_ms
from headwater.model.service import FetchResult
from headwater.client.aio_service import AsyncBrokerService
from headwater.client.fetch_stream import STREAM_WINDOW_BYTES, FetchStreams
from headwater.client.polling import drain_buffers, take_batches
from headwater.client.consumer import POLL_MESSAGES_DEFAULT

__all__ = ["AsyncConsumer"]

TP = tuple[str, int]


class AsyncConsumer:
    """Poll records from assigned partitions. Use from one task at a time.

    ``group`` names where ``commit`` stores positions, so the next consumer of the group
    resumes there. ``auto_offset_reset`` (``"earliest"`` or ``"latest"``) is where a
    partition without a committed position starts. ``fetch_bytes`` bounds one fetch;
    ``max_poll_messages`` bounds one ``poll`` and the records buffered per partition.
    ``tags`` filters on the broker.
    """

    def __init__(self, service: AsyncBrokerService, *, group: str | None = None,
                 auto_offset_reset: str = "earliest", fetch_bytes: int = 1024 * 1024,
                 max_poll_messages: int = POLL_MESSAGES_DEFAULT, tags: str | Iterable[str] | None = None,
                 stream: bool = True, stream_window_bytes: int = STREAM_WINDOW_BYTES) -> None:
        if auto_offset_reset not in ("earliest", "latest"):
            raise InvalidArgumentError(f"auto_offset_reset is 'earliest' or 'latest', got {auto_offset_reset!r}")
        if isinstance(max_poll_messages, bool) or not isinstance(max_poll_messages, int) or max_poll_messages < 1:
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
        self._inflight: dict[TP, tuple[int, asyncio.Task[FetchResult]]] = {}
        self._stale: set[asyncio.Task[FetchResult]] = set()  # cancelled by a seek, not yet ended
        self._queue_ids: dict[str, int] = {}
        self._rotation = itertools.count()
        self._closed = False
        # a future a subclass may complete to end a waiting poll early (the group consumer
        # does, when its assignment changes)
        self._wakeup: asyncio.Future[None] | None = None
        # over the network, with stream=True: the broker pushes the partitions' batches
        # (fetch streams) instead of answering a FETCH per batch; embedded, it changes nothing
        self._streams: FetchStreams | None = None
        self._pushed: asyncio.Future[None] | None = None  # done by the next push
        if stream and hasattr(service, "open_fetch_stream"):
            if isinstance(stream_window_bytes, bool) or not isinstance(stream_window_bytes, int) \
                    or stream_window_bytes < 1:
                raise InvalidArgumentError("stream_window_bytes must be a positive int")
            self._streams = FetchStreams(service, window_bytes=stream_window_bytes, notify=self._push_arrived)

    # -- assignment and positions -----------------------------------------------------

    async def assign(self, queue: str, partitions: int | Iterable[int] | None = None) -> None:
        """Read these partitions of ``queue`` (all when None), starting at the group's
        committed offsets, else at the start or the end (``auto_offset_reset``)."""
        self._check_open()
        info = await self._service.describe_queue(queue)
        n = len(info.partitions)
        if partitions is None:
            parts = list(range(n))
        elif isinstance(partitions, int) and not isinstance(partitions, bool):
            parts = [partitions]
        else:
            parts = sorted(set(partitions))
        for p in parts:
            if isinstance(p, bool) or not isinstance(p, int) or not 0 <= p < n:
                raise PartitionOutOfRangeError(
                    f"queue {queue!r} has partitions 0..{n - 1}; there is no partition {p!r}")
        committed = await self._committed_offsets(queue, info.queue_id)
        self._queue_ids[queue] = info.queue_id
        for p in parts:
            pi = info.partitions[p]
            if p in committed:
                pos = max(committed[p], pi.start_offset)
            else:
                pos = pi.start_offset if self.auto_offset_reset == "earliest" else pi.end_offset
            self._set_position((queue, p), pos)

    async def _committed_offsets(self, queue: str, queue_id: int) -> dict[int, int]:
        """Where ``assign`` starts: the group's committed offsets (the broadcast consumer
        keeps its own)."""
        return await self._service.fetch_offsets(self.group, queue) if self.group else {}

    def unassign(self, queue: str | None = None) -> None:
        """Stop reading ``queue`` (every queue when None)."""
        self._forget([tp for tp in self._fetch_pos if queue is None or tp[0] == queue])

    def _forget(self, tps: Iterable[TP]) -> None:
        for tp in tps:
            for d in (self._fetch_pos, self._consumed, self._buffers):
                d.pop(tp, None)
            self._drop_fetch(tp)
            if self._streams is not None:
                self._streams.close(tp[0])

    def assignment(self) -> list[TP]:
        return sorted(self._fetch_pos)

    def position(self, queue: str, partition: int) -> int:
        """The offset of the next record ``poll`` will return from this partition."""
        return self._consumed[self._tp(queue, partition)]

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

    async def seek_to_beginning(self, queue: str, partitions: int | Iterable[int] | None = None) -> None:
        """Continue from the oldest retained record (asks the broker where that is)."""
        tps = self._parts(queue, partitions)
        info = await self._service.describe_queue(queue)
        for tp in tps:
            self._set_position(tp, info.partitions[tp[1]].start_offset)

    async def seek_to_end(self, queue: str, partitions: int | Iterable[int] | None = None) -> None:
        """Continue with records appended from now on."""
        tps = self._parts(queue, partitions)
        info = await self._service.describe_queue(queue)
        for tp in tps:
            self._set_position(tp, info.partitions[tp[1]].end_offset)

    async def seek_to_time(self, queue: str, when: datetime | int,
                           partitions: int | Iterable[int] | None = None) -> None:
        """Continue from the first record appended at or after ``when``."""
        ms = to_epoch_ms(when, "when")
        assert ms is not None
        for tp in self._parts(queue, partitions):
            self._set_position(tp, await self._service.offset_for_time(queue, tp[1], ms))

    def _tp(self, queue: str, partition: int) -> TP:
        tp = (queue, partition)
        if tp not in self._fetch_pos:
            raise InvalidArgumentError(f"{queue}[{partition}] is not assigned to this consumer; assign() it first")
        return tp

    def _parts(self, queue: str, partitions: int | Iterable[int] | None) -> list[TP]:
        if partitions is None:
            tps = [tp for tp in self._fetch_pos if tp[0] == queue]
            if not tps:
                raise InvalidArgumentError(f"no partition of {queue!r} is assigned; assign() it first")
            return tps
        if isinstance(partitions, int):
            partitions = [partitions]
        return [self._tp(queue, p) for p in partitions]

    def _set_position(self, tp: TP, offset: int) -> None:
        self._fetch_pos[tp] = offset
        self._consumed[tp] = offset
        self._buffers[tp] = deque()
        self._drop_fetch(tp)
        if self._streams is not None:
            self._streams.close(tp[0])  # the next poll streams from here

    def _drop_fetch(self, tp: TP) -> None:
        """Forget the partition's fetch in flight: its answer is for an old position."""
        got = self._inflight.pop(tp, None)
        if got is not None:
            task = got[1]
            if task.done():
                _retrieve(task)
            else:
                task.cancel()
                self._stale.add(task)
                task.add_done_callback(self._stale_ended)

    def _stale_ended(self, task: asyncio.Task[FetchResult]) -> None:
        self._stale.discard(task)
        _retrieve(task)

    # -- polling ----------------------------------------------------------------------

    async def poll(self, max_messages: int | None = None, timeout_ms: int = 1000) -> list[Record]:
        """Up to ``max_messages`` records, waiting up to ``timeout_ms`` for the first ones.

        Fetches that find nothing wait on the broker for appends (long polling), so records
        produced during the wait are returned as soon as they are stored.
        """
        self._check_open()
        limit = max_messages or self.max_poll_messages
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000
        while True:
            out = drain_buffers(self._buffers, self._fetch_pos, self._consumed, limit)
            remaining = deadline - loop.time()
            if out or not self._fetch_pos:
                return out
            if self._streams is not None:
                got = await self._await_pushes(remaining)
                if not got and (remaining <= 0 or (self._wakeup is not None and self._wakeup.done())):
                    return []
                continue
            self._launch_fetches(max(0, int(remaining * 1000)))
            tasks: list[asyncio.Future] = [t for _, t in self._inflight.values()]
            if self._wakeup is not None:
                tasks.append(self._wakeup)
            if remaining > 0 and tasks:
                await asyncio.wait(tasks, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
            got = self._collect()
            if not got and (remaining <= 0 or (self._wakeup is not None and self._wakeup.done())):
                return []

    # -- fetch streams (stream mode, over the network) ------------------------------------

    async def _await_pushes(self, remaining: float) -> int:
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
                sid = await self._service.open_fetch_stream(queue, offsets, handler, credit_bytes=streams.window_bytes,
                                                            tag_mask=self._mask, push_bytes_max=self._fetch_bytes)
            except BaseException:
                streams.failed(queue)
                raise
            streams.opened(queue, sid)
        if remaining > 0 and not streams.pending():
            pushed = self._pushed = asyncio.get_running_loop().create_future()
            waits: list[asyncio.Future] = [pushed] if self._wakeup is None else [pushed, self._wakeup]
            try:
                await asyncio.wait(waits, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
            finally:
                self._pushed = None
        return streams.take(self._fetch_pos, self._consumed, self._buffers, self._tags)

    def _push_arrived(self) -> None:
        """A push came (on the loop): end the wait for one."""
        pushed = self._pushed
        if pushed is not None and not pushed.done():
            pushed.set_result(None)

    def _launch_fetches(self, wait_ms: int) -> None:
        tps = list(self._fetch_pos)
        if not tps:
            return
        start = next(self._rotation) % len(tps)
        for tp in tps[start:] + tps[:start]:
            if tp in self._inflight or len(self._buffers[tp]) >= self.max_poll_messages:
                continue
            pos = self._fetch_pos[tp]
            task = asyncio.ensure_future(self._service.fetch(
                tp[0], tp[1], pos, max_bytes=self._fetch_bytes, tag_mask=self._mask, max_wait_ms=wait_ms))
            self._inflight[tp] = (pos, task)

    def _collect(self) -> int:
        got = 0
        for tp, (pos, task) in list(self._inflight.items()):
            if not task.done():
                continue
            del self._inflight[tp]
            res = task.result()  # a fetch's error is this poll's error
            start = max(pos, res.start_offset)  # records before start expired: skip them
            got += take_batches(tp, res.batches, start, res.next_offset, self._fetch_pos, self._consumed,
                                self._buffers, self._tags)
        return got

    def __aiter__(self) -> AsyncConsumer:
        """Records one at a time, forever (until :meth:`close`): ``async for r in consumer``.

        Each record counts as consumed when it is handed out, so ``commit`` stores exactly
        what the loop has seen."""
        return self

    async def __anext__(self) -> Record:
        while not self._closed:
            got = await self.poll(max_messages=1)
            if got:
                return got[0]
        raise StopAsyncIteration

    # -- offsets ----------------------------------------------------------------------

    async def commit(self, offsets: dict[TP, int] | None = None) -> None:
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
            await self._service.commit_offsets(self.group, queue, offs)

    async def committed(self, queue: str, partition: int) -> int | None:
        """The group's committed offset of a partition, or None."""
        if not self.group:
            raise InvalidArgumentError("committed needs a group: create the consumer with group='name'")
        return (await self._service.fetch_offsets(self.group, queue)).get(partition)

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("this consumer is closed")

    async def close(self) -> None:
        """Stop: fetches in flight are cancelled and awaited, so no task outlives the consumer."""
        self._closed = True
        if self._streams is not None:
            with contextlib.suppress(Exception):  # the client may be closed already
                self._streams.close()
        tasks = [t for _, t in self._inflight.values()] + list(self._stale)
        self._inflight.clear()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def __aenter__(self) -> AsyncConsumer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _retrieve(task: asyncio.Future) -> None:
    """Mark the outcome of a task nobody will await as seen (no "never retrieved" noise)."""
    if not task.cancelled():
        task.exception()
