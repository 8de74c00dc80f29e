"""A clock that tests move by hand, for every place Headwater takes ``clock=``.

Headwater reads time through a callable that returns seconds since the epoch (the broker,
the store, ``open_memory``); pass a :class:`FakeClock` instead of ``time.time`` and a test
of a TTL, a delay or a session timeout moves time forward instead of waiting for it, as
Kafka's ``MockTime`` does.
"""

from __future__ import annotations

__all__ = ["FakeClock"]


class FakeClock:
    """Seconds since the epoch that only move when told to.

    Call it (``clock()``) or read ``now`` for the time; move it with ``advance(seconds)``
    or by setting ``now``. It starts at ``1_800_000_000.0`` (2027-01-15 08:00 UTC), a
    fixed and round point, so timestamps in a test are the same on every run.

    >>> from headwater.testing import FakeClock, open_memory
    >>> clock = FakeClock()
    >>> clock()
    1800000000.0
    >>> clock.advance(1.5)
    >>> clock.now
    1800000001.5
    >>> hw = open_memory(clock=clock)
    >>> _ = hw.admin.create_queue("codes", ttl_s=300)
    >>> _ = hw.send("codes", b"493021")
    >>> clock.advance(301)
    >>> list(hw.scanner("codes"))  # expired: never served
    []
    """

    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now
        """The current time in seconds since the epoch; tests may set it directly."""

    def __call__(self) -> float:
        """The current time in seconds since the epoch (the ``time.time`` signature)."""
        return self.now

    def advance(self, seconds: float) -> None:
        """Move the clock forward by ``seconds`` (backward if negative, to test clock steps)."""
        self.now += seconds

    def __repr__(self) -> str:
        return f"FakeClock(now={self.now!r})"
