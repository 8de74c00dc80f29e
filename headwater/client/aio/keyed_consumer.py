"""AsyncKeyedConsumer: a member of a keyed group, for asyncio (what it does:
:mod:`headwater.client.common.keyed_consumer`).

The names and behaviour of :class:`~headwater.client.sync.keyed_consumer.KeyedConsumer`; what
talks to the broker is a coroutine (``poll``, ``commit``, ``refresh``, ``close``). Get one
with ``hw.keyed_consumer(group, queue, member=..., size=...)`` on an
:class:`~headwater.client.aio.client.AsyncClient`: making it does not wait, and the member joins
its group on its first ``poll()`` (or ``start()``, or ``async with``), which is where a
declaration that disagrees with the group's is reported.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from headwater.client.aio.service import AsyncBrokerService
from headwater.client.common.closing import AsyncClosesOnExit
from headwater.client.common.keyed_consumer import KeyedConsumerBase
from headwater.client.common.twins import ASYNCIO
from headwater.client.transport.polling import retrieve
from headwater.model.keyed import KeyedGroupInfo
from headwater.model.message import Record

__all__ = ["AsyncKeyedConsumer"]


class AsyncKeyedConsumer(KeyedConsumerBase, AsyncClosesOnExit, driver=ASYNCIO):
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

    async def start(self) -> KeyedGroupInfo:
        """Join the group now (``poll()`` does when it has not yet); the group as it stands."""
        self._check_open()
        if self._info is None:
            await self.refresh()
        return self.info

    async def poll(self, max_messages: int | None = None, timeout_ms: int = 1000) -> list[Record]:
        return self._buffered(max_messages, timeout_ms) or await self._poll(max_messages, timeout_ms)

    poll.__doc__ = KeyedConsumerBase._poll.__doc__  # one docstring, on the body

    def wakeup(self) -> None:
        """End the poll that awaits now with :class:`~headwater.errors.WakeupError`, or
        the next poll if none awaits (``KeyedConsumer.wakeup``'s twin): from another task,
        or from another thread (a plain call: it hands the wake to the consumer's loop).
        Cancelling the polling task ends it too, with CancelledError. Each call raises
        once; buffered records, positions and membership are kept."""
        self._wake_asyncio()

    def _ask_partitions(self) -> None:
        self._asked_partitions(asyncio.ensure_future(self._service.describe_queue(self.queue)))

    def _start_fetch(self, args: tuple, wait_ms: int) -> Any:
        return asyncio.ensure_future(self._service.keyed_fetch(*args, max_bytes=self._fetch_bytes, max_wait_ms=wait_ms))

    async def _wait_fetches(self, timeout_s: float) -> None:
        tasks = [t for _, t in self._inflight.values()]
        if tasks and timeout_s > 0:
            await asyncio.wait([*tasks, self._wakeup], timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)

    async def _nap(self, timeout_s: float) -> None:
        await asyncio.wait([self._wakeup], timeout=timeout_s)

    def _new_waiter(self) -> asyncio.Future[None]:
        return asyncio.get_running_loop().create_future()

    def _drop_inflight(self) -> None:
        for _, task in self._inflight.values():
            task.cancel()
            task.add_done_callback(retrieve)
        self._inflight.clear()

    async def __aiter__(self) -> AsyncIterator[Record]:
        """This member's records forever (until :meth:`close`), polling as needed: ``async
        for record in member``; a poll comes once the loop has taken the one before's."""
        while not self._closed:
            for r in await self.poll():
                yield r

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
