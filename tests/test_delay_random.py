"""Delayed messages sent in random order of due times (issue 32): batched by due bucket,
each delivered at its own time, none early, each once; cancel and lookups by id still find
each message (the producer reorders a batch by due time, so an id must follow its message).

The ``hw`` test runs embedded, on the in-memory fake, over TCP and on a cluster (there on the
wall clock: it waits for the times instead of moving them)."""

from __future__ import annotations

import random
import time
from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import headwater.testing
from headwater.testing import FakeClock
from tests.support.cluster_contract import WallClock
from tests.support.waiting import wait_for


def _move_to(clock, at_ms: int) -> None:
    """The brokers' clock at ``at_ms``: moved when a test can, else waited for."""
    if isinstance(clock, WallClock):
        while time.time() * 1000 < at_ms:
            time.sleep(0.02)
    else:
        clock.now = at_ms / 1000


def _check_not_early(recs, due: dict[bytes, int]) -> None:
    for r in recs:
        assert r.scheduled_ms == due[r.body] and r.timestamp_ms >= r.scheduled_ms, (r.body, r.timestamp_ms)


def test_random_due_times_arrive_each_once_none_early_and_cancel_works(hw, clock):
    hw.admin.create_queue("rnd", partitions=3, ttl_s=None)
    rng = random.Random(32)
    t0 = int(clock() * 1000) + 1_500  # far enough for every send to be accepted first
    slots = [t0 + rng.randrange(1_200) for _ in range(40)]  # shared times: order kept among them
    due = {f"m{i:03}".encode(): rng.choice(slots) for i in range(240)}
    p = hw.producer(linger_ms=20, delay_bucket_ms=300, delay_batches_max=2)
    futs = {body: p.send("rnd", body, partition=i % 3, deliver_at=at) for i, (body, at) in enumerate(due.items())}
    p.flush()
    ids = {body: f.result() for body, f in futs.items()}
    assert all(m.is_delayed for m in ids.values())
    for body in list(due)[::12]:  # each id finds its own message, though its batch was reordered
        got = hw.get(ids[body])
        assert got.body == body and got.scheduled_ms == due[body]
    cancelled = set(list(due)[5::17])
    for body in cancelled:
        hw.cancel(ids[body])
    expect = set(due) - cancelled
    for step_ms in range(0, 1_400, 150):  # walk through the window: what is out is due by then
        _move_to(clock, t0 + step_ms)
        _check_not_early(list(hw.scanner("rnd")), due)
    _move_to(clock, t0 + 1_300)
    recs = wait_for(lambda: (r := list(hw.scanner("rnd"))) and len(r) >= len(expect) and r, what="every delivery")
    _check_not_early(recs, due)
    assert Counter(r.body for r in recs) == Counter(expect), "each once, the cancelled never"
    for part in range(3):  # in due order within a partition; equal times in send order
        in_p = sorted((r for r in recs if r.partition == part), key=lambda r: r.offset)
        assert [(r.scheduled_ms, r.body) for r in in_p] == sorted((r.scheduled_ms, r.body) for r in in_p)


def _when_due(hw, due: dict[bytes, int], now_ms: int) -> tuple[list] | None:
    """The queue's records (in a tuple: there may be none) once at least the messages due
    by ``now_ms`` are there."""
    recs = list(hw.scanner("prop"))
    return (recs,) if len(recs) >= sum(at <= now_ms for at in due.values()) else None


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sends=st.lists(st.tuples(st.integers(1, 3_000), st.integers(0, 1)), min_size=1, max_size=60),
    steps=st.lists(st.integers(1, 900), min_size=1, max_size=6),
    bucket_ms=st.sampled_from([1, 7, 250, 1_000, 60_000]),
    batches_max=st.integers(1, 4),
)
def test_no_message_is_delivered_before_its_time_and_each_exactly_once(sends, steps, bucket_ms, batches_max):
    clock = FakeClock()
    t0 = int(clock() * 1000)
    with headwater.testing.open_memory(clock=clock) as hw:
        hw.admin.create_queue("prop", partitions=2, ttl_s=None)
        due = {}
        with hw.producer(linger_ms=5, delay_bucket_ms=bucket_ms, delay_batches_max=batches_max) as p:
            for i, (delay_ms, part) in enumerate(sends):
                body = f"p{i}".encode()
                due[body] = t0 + delay_ms
                p.send("prop", body, partition=part, deliver_at=t0 + delay_ms)
        now = t0
        for step in [*steps, 3_000]:
            now += step
            clock.now = now / 1000
            (recs,) = wait_for(lambda now=now: _when_due(hw, due, now), what="what is due")
            assert all(due[r.body] <= now and r.scheduled_ms == due[r.body] for r in recs), "none early"
        assert Counter(r.body for r in recs) == Counter(list(due)), "each exactly once"
