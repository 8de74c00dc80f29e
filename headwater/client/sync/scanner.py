"""Scanner: a queue's records in a range, with ``for`` (the reading: :mod:`headwater.client.common.scanner`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from headwater.client.common.closing import ClosesOnExit
from headwater.client.common.scanner import ScannerBase
from headwater.client.common.twins import BLOCKING
from headwater.model.message import Record
from headwater.model.service import BrokerService

__all__ = ["Scanner"]


class Scanner(ScannerBase, Iterator[Record], ClosesOnExit, driver=BLOCKING):
    """Iterate records of a queue in a range. Use as an iterator and a context manager.

    Errors about the queue itself (:class:`QueueNotFoundError`, :class:`QueueDisabledError`,
    a partition out of range) are raised when the scanner is made. The bounds are
    :class:`~headwater.client.common.scanner.ScannerBase`'s."""

    def __init__(self, service: BrokerService, queue: str, **bounds: Any) -> None:
        super().__init__(service, queue, **bounds)
        self._open()

    def __next__(self) -> Record:
        if not self._buffer and (self._closed or (self._fill() or self._exhausted())):
            raise StopIteration
        return self._buffer.popleft()
