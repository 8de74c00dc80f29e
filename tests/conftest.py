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


@pytest.fixture
def hw(tmp_path, clock):
    client = headwater.open(tmp_path / "data", clock=clock, segment_bytes_max=256 * 1024)
    yield client
    client.close()
