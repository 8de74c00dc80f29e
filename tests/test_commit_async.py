"""``commit_async`` of the consumer and the group consumer, blocking and asyncio, on every
backend (the ``hw`` and ``aio_target`` fixtures: embedded, memory, network, cluster): the
commits land in order, a failed one reaches its callback and is not retried, ``commit()``
and ``close()`` wait for those in flight. The pipeline's own rules: tests at the end."""

from __future__ import annotations

import pytest

from headwater.client.core.commits import CommitPipeline
from headwater.errors import InvalidArgumentError, PartitionOutOfRangeError, UnavailableError
from tests.support.aio_target import run


def _fill(hw, n: int = 10) -> None:
    hw.admin.create_queue("q", partitions=2)
    hw.send_batch("q", [b"m%d" % i for i in range(n)], partition=0)


def test_commits_land_in_order_and_callbacks_run_in_order(hw):
    _fill(hw)
    seen = []
    with hw.consumer(group="g") as c:
        c.assign("q", 0)
        for off in range(1, 11):
            c.commit_async({("q", 0): off}, lambda offsets, error: seen.append((offsets, error)))
        c.commit_async({("q", 0): 4})  # no callback: merged with whatever waits
        c.commit({("q", 1): 0})  # waits for the ten before it, and runs their callbacks
        assert seen == [({("q", 0): off}, None) for off in range(1, 11)]
        assert c.committed("q", 0) == 4  # the last one made, not the largest
        assert c.committed("q", 1) == 0


def test_a_failed_commit_reaches_its_callback_and_is_not_retried(hw):
    _fill(hw)
    seen = []
    with hw.consumer(group="g") as c:
        c.assign("q", 0)
        c.commit_async({("q", 0): 3}, lambda o, e: seen.append(("first", e)))
        c.commit()  # the first is stored before the bad one is sent
        c.commit_async({("q", 9): 1}, lambda o, e: seen.append(("bad", e)))  # no partition 9
        c.commit_async({("q", 0): 5}, lambda o, e: seen.append(("after", e)))
        c.commit({("q", 0): 6})
    assert seen[0] == ("first", None)
    # the bad one and the one queued behind it may share a request (merged): both hear its error
    bad = [e for name, e in seen if name == "bad"]
    assert len(bad) == 1 and isinstance(bad[0], PartitionOutOfRangeError)
    with hw.consumer(group="g") as c:
        assert c.committed("q", 0) == 6


def test_close_waits_for_commits_in_flight(hw):
    _fill(hw)
    seen = []
    c = hw.consumer(group="g")
    c.assign("q", 0)
    got = []
    while len(got) < 10:
        got += c.poll(timeout_ms=5000)
    c.commit_async(callback=lambda o, e: seen.append((o, e)))
    c.close()
    assert seen == [({("q", 0): 10}, None)]
    with hw.consumer(group="g") as again:
        assert again.committed("q", 0) == 10


def test_commit_async_checks_its_arguments_at_once(hw):
    _fill(hw)
    with hw.consumer(group="g") as c:
        with pytest.raises(InvalidArgumentError, match="offsets are a dict"):
            c.commit_async([("q", 0, 1)])
    with hw.consumer() as c, pytest.raises(InvalidArgumentError, match="needs a group"):
        c.commit_async()


def test_group_member_commit_async(hw):
    _fill(hw)
    seen = []
    c = hw.consumer(group="members", subscribe="q")
    got = []
    while len(got) < 10:
        got += c.poll(timeout_ms=5000)
    c.commit_async({("q", 0): 4}, lambda o, e: seen.append((o, e)))
    c.commit_async(callback=lambda o, e: seen.append((o, e)))
    c.commit()
    assert [e for _, e in seen] == [None, None]
    assert c.committed("q", 0) == 10
    c.commit_async({("q", 0): 7}, lambda o, e: seen.append((o, e)))
    c.close(commit=False)  # waits for it, commits nothing more
    assert seen[-1] == ({("q", 0): 7}, None)
    with hw.consumer(group="members", subscribe="q") as again:
        assert again.committed("q", 0) == 7


def test_asyncio_commit_async(aio_target):
    async def test(hw):
        await hw.admin.create_queue("q", partitions=2)
        await hw.send_batch("q", [b"m%d" % i for i in range(10)], partition=0)
        seen = []
        c = hw.consumer(group="g")
        await c.assign("q", 0)
        for off in range(1, 6):
            c.commit_async({("q", 0): off}, lambda o, e: seen.append((o, e)))
        c.commit_async({("q", 9): 1}, lambda o, e: seen.append((o, e)))
        await c.commit({("q", 0): 2})
        assert [o for o, _ in seen[:5]] == [{("q", 0): off} for off in range(1, 6)]
        assert isinstance(seen[-1][1], PartitionOutOfRangeError)
        assert await c.committed("q", 0) == 2
        c.commit_async({("q", 0): 8}, lambda o, e: seen.append((o, e)))
        await c.close()
        assert seen[-1] == ({("q", 0): 8}, None)
        async with hw.consumer(group="g", subscribe="q") as m:
            assert await m.committed("q", 0) == 8
            got = []
            while len(got) < 2:
                got += await m.poll(timeout_ms=5000)
            m.commit_async(callback=lambda o, e: seen.append((o, e)))
        assert seen[-1] == ({("q", 0): 8 + len(got), ("q", 1): 0}, None)

    run(aio_target, test)


# -- the pipeline (client/core/commits.py), no broker ------------------------------------


def test_pipeline_one_request_at_a_time_merged_in_order():
    p = CommitPipeline()
    calls = []
    p.add({("q", 0): 1}, lambda o, e: calls.append(("a", o, e)))
    assert p.next_send() == {("q", 0): 1}
    p.add({("q", 0): 5, ("q", 1): 1}, lambda o, e: calls.append(("b", o, e)))
    p.add({("q", 0): 3}, None)
    p.add({("q", 0): 4}, None)  # merged with the one before: nobody waits on either
    assert p.next_send() is None  # the first is in flight
    boom = RuntimeError("boom")
    p.ended(boom)
    due = p.take_due()
    assert [(o, e) for _, o, e in due] == [({("q", 0): 1}, boom)]
    assert p.next_send() == {("q", 0): 4, ("q", 1): 1}  # a later offset replaces an earlier one
    p.ended(None)
    assert [(o, e) for _, o, e in p.take_due()] == [({("q", 0): 5, ("q", 1): 1}, None)]
    assert p.idle and p.next_send() is None


def test_pipeline_is_bounded_and_gives_up_queued_commits():
    p = CommitPipeline(queued_max=2)
    p.add({("q", 0): 1}, lambda o, e: None)
    p.add({("q", 0): 2}, lambda o, e: None)
    with pytest.raises(UnavailableError, match="2 asynchronous commits are waiting"):
        p.add({("q", 0): 3}, lambda o, e: None)
    p.add({("q", 0): 3}, None)  # without a callback: always taken
    closed = RuntimeError("closed")
    p.fail_queued(closed)
    assert [e for _, _, e in p.take_due()] == [closed, closed]
    assert p.idle
