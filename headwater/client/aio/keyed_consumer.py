"""AsyncKeyedConsumer: a member of a keyed group, for asyncio.

The names and behaviour of :class:`~headwater.client.sync.keyed_consumer.KeyedConsumer`; what
talks to the broker is a coroutine (``poll``, ``commit``, ``refresh``, ``close``). Get one
with ``hw.keyed_consumer(group, queue, member=..., size=...)`` on an
:class:`~headwater.client.aio.client.AsyncClient`: making it does not wait, and the member joins
its group on its first ``poll()`` (or ``start()``, or ``async with``), which is where a
declaration that disagrees with the group's is reported.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from headwater.client.aio.service import AsyncBrokerService
from headwater.client.core.reads import check_poll
from headwater.client.sync.keyed_consumer import KeyedConsumerBase
from headwater.client.transport.polling import drain_buffers, retrieve
from headwater.errors import StaleGenerationError
from headwater.model.keyed import KeyedGroupInfo
from headwater.model.message import Record

__all__ = ["AsyncKeyedConsumer"]


class AsyncKeyedConsumer(KeyedConsumerBase):
    """Member ``member`` of keyed group ``group`` on ``queue``, for asyncio. Use from one task.

    >>> import asyncio, headwater, headwater.aio, tempfile
    >>> async def main():
    ...     async with await headwater.aio.open(tempfile.mkdtemp()) as hw:
    ...         _ = await hw.admin.create_queue("clicks", partitions=2)
    ...         _ = await hw.send_batch("clicks", [headwater.Message(b"x", key=b"user-%d" % i) for i in range(9)])
    ...         m0 = hw.keyed_consumer("counters", "clicks", member=0, size=2)
    ...         m1 = hw.keyed_consumer("counters", "clicks", member=1, size=2)
    ...         got0, got1 = await m0.poll(timeout_ms=200), await m1.poll(timeout_ms=200)
    ...         await m0.commit(); await m1.commit()
    ...         return len(got0) + len(got1), {r.key for r in got0} & {r.key for r in got1}
    >>> asyncio.run(main())
    (9, set())
    """

    _service: AsyncBrokerService

    # -- the group ------------------------------------------------------------------------

    async def start(self) -> KeyedGroupInfo:
        """Join the group now (``poll()`` does when it has not yet); the group as it stands."""
        self._check_open()
        if self._info is None:
            key, size, start = self._declared
            await self._follow(await self._service.keyed_group(self.queue, self.group, key, size, start))
        return self.info

    async def _follow(self, info: KeyedGroupInfo) -> None:
        if self._adopt(info):
            self._add_partitions(await self._service.describe_queue(self.queue))

    async def refresh(self) -> KeyedGroupInfo:
        """Ask the broker where the group stands now (and follow it)."""
        if self._info is None:
            return await self.start()
        await self._follow(await self._service.keyed_group(self.queue, self.group))
        return self.info

    def _check_partitions(self) -> None:
        """Every ``_PARTITIONS_CHECK_S``, look for partitions added to the queue, without
        waiting: the answer is taken on a later poll."""
        if self._checked_partitions():
            self._asked_partitions(asyncio.ensure_future(self._service.describe_queue(self.queue)))

    def _drop_inflight(self) -> None:
        for _, task in self._inflight.values():
            task.cancel()
            task.add_done_callback(retrieve)
        self._inflight.clear()

    # -- polling ----------------------------------------------------------------------------

    async def poll(self, max_messages: int | None = None, timeout_ms: int = 1000) -> list[Record]:
        """Up to ``max_messages`` of this member's records, waiting up to ``timeout_ms``.

        Calling it again means the records it returned before are processed: a draining
        member commits at the barrier then, by itself."""
        self._check_open()
        limit = check_poll(max_messages, timeout_ms, self.max_poll_messages)
        if self._info is None:
            await self.start()
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            out = drain_buffers(self._buffers, self._fetch_pos, self._consumed, limit)
            if out:
                return out
            remaining = deadline - time.monotonic()
            step = self._step()
            if step == "stop":
                return []
            if step == "commit":
                await self.commit()
                continue
            if step == "wait":
                if remaining <= 0:
                    return []
                await asyncio.sleep(min(self._refresh_s, remaining))
                await self.refresh()
                continue
            if self.role == "active":
                self._check_partitions()
            wait_ms = max(0, int(remaining * 1000))
            for p, pos in self._to_fetch():
                task = asyncio.ensure_future(
                    self._service.keyed_fetch(
                        *self._fetch_args(p, pos), max_bytes=self._fetch_bytes, max_wait_ms=wait_ms
                    )
                )
                self._inflight[p] = (pos, task)
            tasks = [t for _, t in self._inflight.values()]
            if tasks and remaining > 0:
                await asyncio.wait(tasks, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
            got, stale = self._collect()
            if stale:
                await self.refresh()
            if not got and remaining <= 0:
                return []

    # -- positions --------------------------------------------------------------------------

    async def commit(self) -> None:
        """Store the positions of what :meth:`poll` returned, on the broker, durably."""
        positions = self._to_commit()
        if positions is None:
            return
        try:
            info = await self._service.keyed_commit(
                self.queue, self.group, self.member, self.info.generation, positions
            )
        except StaleGenerationError:
            await self.refresh()  # the group moved on without these positions: they no longer count
            return
        self._committed = positions
        await self._follow(info)

    async def close(self) -> None:
        """Stop (positions not committed are not stored)."""
        self._closed = True
        self._drop_inflight()
        check = self._partitions_check
        if check is not None:
            check.cancel()
            check.add_done_callback(retrieve)

    async def __aenter__(self) -> AsyncKeyedConsumer:
        await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()
