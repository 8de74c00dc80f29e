"""AsyncConsumer: the :class:`~headwater.client.sync.consumer.Consumer` for asyncio.

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
from collections.abc import Iterable
from datetime import datetime

from headwater.client.aio.service import AsyncBrokerService
from headwater.client.common.positions import TP, ConsumerPositions
from headwater.client.core.reads import POLL_MESSAGES_DEFAULT, partitions_named
from headwater.client.transport.fetch_stream import STREAM_WINDOW_BYTES
from headwater.client.transport.polling import drain_buffers, retrieve, take_batches
from headwater.model.message import Record
from headwater.model.service import FetchResult

__all__ = ["AsyncConsumer"]


class AsyncConsumer(ConsumerPositions):
    """Poll records from assigned partitions. Use from one task at a time.

    ``group`` names where ``commit`` stores positions, so the next consumer of the group
    resumes there. ``auto_offset_reset`` (``"earliest"`` or ``"latest"``) is where a
    partition without a committed position starts. ``fetch_bytes`` bounds one fetch;
    ``max_poll_messages`` bounds one ``poll`` and the records buffered per partition.
    ``tags`` filters on the broker.
    """

    _inflight: dict[TP, tuple[int, asyncio.Task[FetchResult]]]

    def __init__(
        self,
        service: AsyncBrokerService,
        *,
        group: str | None = None,
        auto_offset_reset: str = "earliest",
        fetch_bytes: int = 1024 * 1024,
        max_poll_messages: int = POLL_MESSAGES_DEFAULT,
        tags: str | Iterable[str] | None = None,
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
        self._stale: set[asyncio.Task[FetchResult]] = set()  # cancelled by a seek, not yet ended
        self._rotation = itertools.count()
        self._pushed: asyncio.Future[None] | None = None  # done by the next push (fetch streams)

    # -- assignment and positions (the rest: ConsumerPositions) --------------------------

    async def assign(self, queue: str, partitions: int | Iterable[int] | None = None) -> None:
        """Read these partitions of ``queue`` (all when None), starting at the group's
        committed offsets, else at the start or the end (``auto_offset_reset``)."""
        self._check_open()
        info = await self._service.describe_queue(queue)
        parts = partitions_named(info, partitions)
        self._start(queue, info, parts, await self._committed_offsets(queue, info.queue_id))

    async def _committed_offsets(self, queue: str, queue_id: int) -> dict[int, int]:
        """Where ``assign`` starts: the group's committed offsets (the broadcast consumer
        keeps its own)."""
        return await self._service.fetch_offsets(self.group, queue) if self.group else {}

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

    async def seek_to_time(
        self, queue: str, when: datetime | int, partitions: int | Iterable[int] | None = None
    ) -> None:
        """Continue from the first record appended at or after ``when``."""
        ms = self._when_ms(when)
        for tp in self._parts(queue, partitions):
            self._set_position(tp, await self._service.offset_for_time(queue, tp[1], ms))

    def _drop_fetch(self, tp: TP) -> None:
        """Forget the partition's fetch in flight: its answer is for an old position."""
        got = self._inflight.pop(tp, None)
        if got is not None:
            task = got[1]
            if task.done():
                retrieve(task)
            else:
                task.cancel()
                self._stale.add(task)
                task.add_done_callback(self._stale_ended)

    def _stale_ended(self, task: asyncio.Task[FetchResult]) -> None:
        self._stale.discard(task)
        retrieve(task)

    # -- polling ----------------------------------------------------------------------

    async def poll(self, max_messages: int | None = None, timeout_ms: int = 1000) -> list[Record]:
        """Up to ``max_messages`` records, waiting up to ``timeout_ms`` for the first ones.

        Fetches that find nothing wait on the broker for appends (long polling), so records
        produced during the wait are returned as soon as they are stored. Raises
        :class:`~headwater.errors.InvalidArgumentError` while a position ``seek()`` set is
        past its partition's end, :class:`~headwater.errors.QueueDisabledError` for a
        disabled queue; see docs/consumer-groups.md ("Positions").
        """
        self._check_open()
        limit = self._poll_limit(max_messages, timeout_ms)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000
        for queue in self._seeks_to_check():
            self._check_seeks(queue, await self._service.describe_queue(queue))
        while True:
            out = drain_buffers(self._buffers, self._fetch_pos, self._consumed, limit)
            remaining = deadline - loop.time()
            if out or not self._fetch_pos:
                return out
            if self._streams is not None:
                if not await self._await_pushes(remaining) and self._gives_up(remaining):
                    return []
                continue
            self._launch_fetches(max(0, int(remaining * 1000)))
            tasks: list[asyncio.Future] = [t for _, t in self._inflight.values()]
            if self._wakeup is not None:
                tasks.append(self._wakeup)
            if remaining > 0 and tasks:
                await asyncio.wait(tasks, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
            if not self._collect() and self._gives_up(remaining):
                return []

    # -- fetch streams (stream mode, over the network) ------------------------------------

    async def _await_pushes(self, remaining: float) -> int:
        """Take what was pushed; if nothing, start opening the streams missing and wait up to
        ``remaining`` seconds for a push (or an answer to an opening). The records taken."""
        streams = self._streams
        assert streams is not None
        got = streams.take(self._fetch_pos, self._consumed, self._buffers, self._tags, self._reset_past_end)
        if got:
            return got
        streams.open_missing(self._fetch_pos)
        wait_s = streams.wait_s(remaining)
        if wait_s > 0 and not streams.pending():
            pushed = self._pushed = asyncio.get_running_loop().create_future()
            waits: list[asyncio.Future] = [pushed, *streams.openings()]
            if self._wakeup is not None:
                waits.append(self._wakeup)
            try:
                await asyncio.wait(waits, timeout=wait_s, return_when=asyncio.FIRST_COMPLETED)
            finally:
                self._pushed = None
        return streams.take(self._fetch_pos, self._consumed, self._buffers, self._tags, self._reset_past_end)

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
            task = asyncio.ensure_future(
                self._service.fetch(
                    tp[0], tp[1], pos, max_bytes=self._fetch_bytes, tag_mask=self._mask, max_wait_ms=wait_ms
                )
            )
            self._inflight[tp] = (pos, task)

    def _collect(self) -> int:
        got = 0
        for tp, (pos, task) in list(self._inflight.items()):
            if not task.done():
                continue
            del self._inflight[tp]
            res = self._outage.result(task)  # a fetch's error is this poll's error...
            if res is None:
                continue  # ... unless the broker restarts: read again on the next turn
            if pos > res.end_offset:
                self._reset_past_end(tp, res.start_offset, res.end_offset)
                continue
            start = max(pos, res.start_offset)  # records before start expired: skip them
            got += take_batches(
                tp, res.batches, start, res.next_offset, self._fetch_pos, self._consumed, self._buffers, self._tags
            )
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
        for queue, offs in self._to_commit(offsets).items():
            await self._service.commit_offsets(self.group, queue, offs)

    async def committed(self, queue: str, partition: int) -> int | None:
        """The group's committed offset of a partition, or None."""
        self._need_group("committed")
        return (await self._service.fetch_offsets(self.group, queue)).get(partition)

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
