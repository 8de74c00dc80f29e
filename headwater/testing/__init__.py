"""Helpers for testing code that uses Headwater, without a data directory or a server.

>>> from headwater.testing import open_memory
>>> hw = open_memory()
>>> _ = hw.admin.create_queue("jobs", partitions=2)
>>> hw.send("jobs", b"work", key=b"a").offset
0

The in-memory broker passes the same contract tests as the real one (tests/test_queues.py
runs against both), so code tested against it behaves the same against a real broker,
except for durability: nothing survives ``close()``.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from headwater.client import Client
from headwater.testing.memory import MemoryBroker

__all__ = ["MemoryBroker", "open_memory"]


def open_memory(*, clock: Callable[[], float] = time.time) -> Client:
    """A client over a fresh in-memory broker (see :class:`MemoryBroker`)."""
    return Client(MemoryBroker(clock=clock))
