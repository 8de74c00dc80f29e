"""AsyncScanner: a queue's records in a range, with ``async for`` (the reading:
:mod:`headwater.client.common.scanner`)."""

from __future__ import annotations

from headwater.client.common.scanner import ScannerBase
from headwater.client.common.twins import ASYNCIO
from headwater.model.message import Record

__all__ = ["AsyncScanner"]


class AsyncScanner(ScannerBase, driver=ASYNCIO):
    """Iterate records of a queue in a range: ``async for record in scanner``.

    Partitions are read one after the other, each in offset order. ``async with`` closes
    the scanner; one that runs to the end closes itself. It keeps no state on the broker.
    Use it from one task. What needs the broker is looked up when iteration starts, so
    ``hw.scanner(...)`` itself does not wait: errors about the queue itself
    (:class:`QueueNotFoundError`, :class:`QueueDisabledError`, a partition out of range)
    are raised then.
    """

    def __aiter__(self) -> AsyncScanner:
        return self

    async def __anext__(self) -> Record:
        if not self._buffer and (self._closed or (await self._fill() or self._exhausted())):
            raise StopAsyncIteration
        return self._buffer.popleft()

    async def __aenter__(self) -> AsyncScanner:
        await self._open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()
