"""Pausing partitions (Kafka's ``pause``/``resume``): a paused partition is neither handed out
nor read until it is resumed, from where it stood, with nothing lost or repeated; the others
go on. Each runs embedded, in memory, over the network (fetch streams and fetches) and on a
cluster, sync and asyncio; a group member stays in its group while everything is paused."""

from __future__ import annotations

import time

import pytest

from headwater.errors import InvalidArgumentError
from tests.support.aio_target import run
from tests.support.waiting import poll_until

STREAM = pytest.mark.parametrize("stream", [True, False], ids=["stream", "fetch"])


def _filled(hw, queue: str = "pq", per_partition: int = 20) -> None:
    hw.admin.create_queue(queue, partitions=2)
    for p in (0, 1):
        hw.send_batch(queue, [b"p%d-%d" % (p, i) for i in range(per_partition)], partition=p)


@STREAM
def test_a_paused_partition_waits_and_resumes_where_it_stood(hw, stream):
    _filled(hw)
    c = hw.consumer(stream=stream, max_poll_messages=7)
    c.assign("pq")
    first = c.poll(max_messages=1, timeout_ms=5000)  # reading has begun on both
    assert len(first) == 1
    c.pause("pq", 0)
    assert c.paused() == [("pq", 0)]
    c.pause("pq", 0)  # twice is once
    rest = poll_until(c, 40, timeout_s=3.0, max_messages=7)
    got = first + rest
    assert {r.partition for r in rest} <= {1}, "a paused partition was handed out"
    ones = [r.offset for r in got if r.partition == 1]
    assert ones == list(range(20))
    stood = c.position("pq", 0)
    hw.send("pq", b"p0-new", partition=0)
    hw.send("pq", b"p1-new", partition=1)
    assert [r.body for r in poll_until(c, 1, timeout_s=3.0, max_messages=7)] == [b"p1-new"]
    assert c.poll(timeout_ms=200) == []  # partition 0 is still paused
    assert c.position("pq", 0) == stood

    c.resume("pq")
    assert c.paused() == []
    zeros = poll_until(c, 21 - stood, max_messages=7)
    assert [r.offset for r in zeros] == list(range(stood, 21)), "resumed from elsewhere than where it stood"
    assert zeros[-1].body == b"p0-new"
    c.close()


def test_pausing_everything_lets_a_poll_wait_out_its_time(hw):
    _filled(hw)
    c = hw.consumer()
    c.assign("pq")
    c.pause("pq")
    assert c.paused() == [("pq", 0), ("pq", 1)]
    started = time.monotonic()
    assert c.poll(timeout_ms=300) == []
    assert time.monotonic() - started >= 0.25  # it waited, as a poll with nothing to read does
    c.resume("pq", [1])
    assert {r.partition for r in poll_until(c, 20, max_messages=7)} == {1}
    c.close()


def test_pause_names_only_assigned_partitions_and_unassign_forgets_it(hw):
    _filled(hw)
    c = hw.consumer()
    c.assign("pq", [0])
    with pytest.raises(InvalidArgumentError, match=r"pq\[1\] is not assigned"):
        c.pause("pq", 1)
    with pytest.raises(InvalidArgumentError, match="no partition of 'other' is assigned"):
        c.resume("other")
    c.pause("pq", 0)
    c.unassign("pq")
    assert c.paused() == []
    c.assign("pq", [0])  # assigned again: read at once
    assert len(poll_until(c, 20, max_messages=7)) == 20
    c.close()


def test_a_group_member_paused_past_its_session_stays_in_its_group(hw):
    _filled(hw)
    c = hw.consumer(group="pausers", subscribe="pq", session_timeout_ms=1500, heartbeat_interval_ms=300)
    assert len(poll_until(c, 40, max_messages=7)) == 40
    generation = c.generation
    c.pause("pq")
    deadline = time.monotonic() + 3.0  # twice the session: heartbeats go on while nothing is read
    while time.monotonic() < deadline:
        assert c.poll(timeout_ms=300) == []
    assert c.generation == generation
    hw.send("pq", b"after", partition=1)
    c.resume("pq")
    assert [r.body for r in poll_until(c, 1, max_messages=7)] == [b"after"]
    c.close()


def test_the_asyncio_consumer_pauses_alike(aio_target):
    async def test(hw):
        await hw.admin.create_queue("pq", partitions=2)
        for p in (0, 1):
            await hw.send_batch("pq", [b"p%d-%d" % (p, i) for i in range(5)], partition=p)
        c = hw.consumer()
        await c.assign("pq")
        c.pause("pq", 0)
        got: list = []
        deadline = time.monotonic() + 5
        while len(got) < 5 and time.monotonic() < deadline:
            got += await c.poll(timeout_ms=200)
        assert [(r.partition, r.offset) for r in got] == [(1, i) for i in range(5)]
        assert await c.poll(timeout_ms=200) == []
        c.resume("pq", 0)
        got = []
        while len(got) < 5 and time.monotonic() < deadline + 5:
            got += await c.poll(timeout_ms=200)
        assert [(r.partition, r.offset) for r in got] == [(0, i) for i in range(5)]
        await c.close()

    run(aio_target, test)
