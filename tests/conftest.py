"""Shared fixtures: a controllable clock and a fresh embedded broker per test."""

from __future__ import annotations

import pytest

import headwater


class FakeClock:
    """Seconds since the epoch that tests move by hand (like Kafka's MockTime)."""

    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(params=["embedded", "memory"])
def hw(request, tmp_path, clock):
    """A client; every test using it runs against the real store and the in-memory fake."""
    if request.param == "memory":
        from headwater.testing import open_memory

        client = open_memory(clock=clock)
    else:
        client = headwater.open(tmp_path / "data", clock=clock, segment_bytes_max=256 * 1024)
    yield client
    client.close()
