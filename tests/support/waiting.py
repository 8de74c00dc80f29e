"""Waiting, in real time, for something another thread or process makes true."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(cond: Callable[[], T], timeout_s: float = 10.0, what: str = "condition", interval_s: float = 0.005) -> T:
    """Call ``cond`` every ``interval_s`` until it returns something truthy, and return that;
    raise AssertionError naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(interval_s)


def gather_until(read: Callable[[], list], n: int, timeout_s: float = 10.0) -> list:
    """Call ``read()`` (a poll or receive of a short timeout) until ``n`` items came, or
    ``timeout_s`` is up; the items, fewer than ``n`` if the time ran out (the caller's
    assert says which)."""
    got: list = []
    deadline = time.monotonic() + timeout_s
    while len(got) < n and time.monotonic() < deadline:
        got += read()
    return got


async def agather_until(read: Callable[[], Awaitable[list]], n: int, timeout_s: float = 10.0) -> list:
    """:func:`gather_until` of an asyncio read (``read()`` returns what to await)."""
    got: list = []
    deadline = time.monotonic() + timeout_s
    while len(got) < n and time.monotonic() < deadline:
        got += await read()
    return got


def poll_until(consumer, n: int, timeout_s: float = 10.0, max_messages: int | None = None) -> list:
    """Poll ``consumer`` (no commit) until ``n`` records came, or ``timeout_s`` is up; the
    records, fewer than ``n`` if the time ran out (the caller's assert says which)."""
    return gather_until(lambda: consumer.poll(max_messages=max_messages, timeout_ms=200), n, timeout_s)
