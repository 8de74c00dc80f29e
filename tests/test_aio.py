"""headwater.aio: the asyncio client, against a real server over TCP and the embedded broker.

Every test runs its coroutine with ``run`` (tests/support/aio_target.py), which also checks that closing was clean: no
task left running, no "Task was destroyed but it is pending" or "exception was never
retrieved", no unclosed transport or socket.
"""

from __future__ import annotations

import asyncio
import doctest
import functools
import random
import time

import pytest

import headwater
import headwater.aio
from headwater import Message, MessageId
from headwater.client.transport.link import settle_from
from headwater.errors import (
    ClosedError,
    InvalidArgumentError,
    InvalidQueueNameError,
    MessageNotFoundError,
    MessageTooLargeError,
    OutOfOrderSequenceError,
    PartitionOutOfRangeError,
    QueueDisabledError,
    QueueExistsError,
    QueueNotFoundError,
    UnavailableError,
)
from headwater.model.batch import decode_header
from tests.support.aio_target import Target, run, scan


@pytest.fixture
def target(aio_target):
    """The client kinds of tests/conftest.py's ``aio_target``: network, embedded, memory, cluster."""
    return aio_target


async def drain(c, expect: int, timeout_s: float = 5.0) -> list:
    out: list = []
    deadline = time.monotonic() + timeout_s
    while len(out) < expect and time.monotonic() < deadline:
        out.extend(await c.poll(timeout_ms=200))
    return out


# -- admin --------------------------------------------------------------------------------


def patch_produce(hw, fn) -> None:
    """Put ``fn`` in place of the service's produce, for one-at-a-time and pipelined sends
    alike (a pipelined send starts it at once, in order, as the network service does)."""
    hw.service.produce = fn
    if hasattr(type(hw.service), "produce_into"):  # the asyncio producer's pipelined sends
        hw.service.produce_into = lambda queue, partition, batch, sink: forward(
            asyncio.ensure_future(fn(queue, partition, batch)), sink
        )


def forward(fut, sink) -> None:
    """Hand the outcome of ``fut`` to a ``produce_into`` sink when it comes."""
    fut.add_done_callback(functools.partial(settle_from, sink))


@pytest.mark.alone("a cluster names its brokers and controller; tests/test_cluster_routing.py checks its METADATA")
def test_a_broker_alone_names_itself_for_every_partition(target):
    async def test(hw):
        await hw.admin.create_queue("orders", partitions=2)
        md = await hw.admin.cluster_metadata(["orders"])
        assert [b.broker_id for b in md.brokers] == [-1] and md.queue("orders").queue_id > 0
        assert await hw.admin.queue_locations("orders") == {0: md.brokers[0], 1: md.brokers[0]}
        with pytest.raises(QueueNotFoundError):
            await hw.admin.queue_locations("nope")

    run(target, test)


def test_admin_round_trip(target):
    async def test(hw):
        a = hw.admin
        info = await a.create_queue("orders", partitions=3, ttl_s=3600, flush="sync", settings={"owner": "b"})
        assert info.name == "orders" and len(info.partitions) == 3
        assert info.config.ttl_s == 3600 and info.config.settings == {"owner": "b"}
        await a.create_queue("audit")
        assert [q.name for q in await a.list_queues()] == ["audit", "orders"]
        assert (await a.describe_queue("audit")).config.ttl_s == 7 * 86400
        with pytest.raises(QueueExistsError):
            await a.create_queue("audit")
        assert (await a.create_queue("audit", partitions=5, exist_ok=True)).partitions == (
            await a.describe_queue("audit")
        ).partitions
        await a.delete_queue("no-such-queue", missing_ok=True)
        with pytest.raises(InvalidQueueNameError):
            await a.create_queue("a b")
        with pytest.raises(InvalidArgumentError):
            await a.create_queue("ok", partitions=0)

        await hw.send_batch("orders", [b"1", b"2"], partition=0)
        info = await a.truncate_queue("orders")
        assert info.message_count == 0 and info.config.settings == {"owner": "b"}
        assert (await hw.send("orders", b"3", partition=0)).offset == 2  # offsets move on

        assert (await a.disable_queue("orders")).enabled is False
        with pytest.raises(QueueDisabledError):
            await hw.send("orders", b"x")
        with pytest.raises(QueueDisabledError):
            await scan(hw, "orders")
        assert (await a.enable_queue("orders")).enabled is True

        assert len((await a.add_partitions("orders", 5)).partitions) == 5
        assert (await hw.send("orders", b"p4", partition=4)).partition == 4  # metadata refreshed
        with pytest.raises(InvalidArgumentError):
            await a.add_partitions("orders", 2)

        await a.delete_queue("audit")
        for call in (a.describe_queue("audit"), a.delete_queue("audit"), a.truncate_queue("audit")):
            with pytest.raises(QueueNotFoundError, match="audit"):
                await call
        status = await hw.status()
        modes = {"network": "server", "embedded": "embedded", "memory": "memory", "cluster": "server"}
        assert status["mode"] == modes[target.kind]

    run(target, test)


# -- producing ----------------------------------------------------------------------------


def test_send_send_batch_send_nowait_flush(target):
    async def test(hw):
        await hw.admin.create_queue("q", partitions=2)
        mid = await hw.send("q", b"one", key=b"k", tag="t", properties={"a": "b"}, partition=1)
        got = await hw.get(mid)
        assert (got.body, got.key, got.tag, got.properties) == (b"one", b"k", "t", {"a": "b"})
        ids = await hw.send_batch("q", [b"a", Message(b"b", tag="x"), b"c"], partition=1)
        assert [i.offset for i in ids] == [1, 2, 3] and {i.partition for i in ids} == {1}

        p = hw.producer(linger_ms=200, idempotent=True)
        calls = []
        produce = hw.service.produce

        async def counting(*args):
            calls.append(args[1])
            return await produce(*args)

        patch_produce(hw, counting)
        futs = [p.send_nowait("q", b"n%d" % i, partition=0) for i in range(100)]
        assert not any(f.done() for f in futs)  # lingering
        await p.flush()
        mids = [f.result() for f in futs]
        assert [m.offset for m in mids] == list(range(100))
        assert len(calls) <= 2  # one batch (two if the metadata lookup split them)
        assert p.producer_id is not None and p.producer_epoch == 0
        lone = p.send_nowait("q", b"lone", partition=1)
        await asyncio.wait_for(lone, 2)  # linger_ms passed: sent without a flush
        assert [r.body for r in await scan(hw, "q", partitions=0)] == [b"n%d" % i for i in range(100)]

        # keyed messages stay on their key's partition, sent as one batch per partition
        keyed = await p.send_batch("q", [Message(b"%d" % i, key=b"k%d" % (i % 3)) for i in range(30)])
        by_key: dict[bytes, set[int]] = {}
        for r in await scan(hw, "q"):
            if r.key is not None and r.key.startswith(b"k"):
                by_key.setdefault(r.key, set()).add(r.partition)
        assert all(len(v) == 1 for v in by_key.values())
        assert [(await hw.get(m)).body for m in keyed[:3]] == [b"0", b"1", b"2"]
        await p.close()
        with pytest.raises(ClosedError):
            p.send_nowait("q", b"late")
        with pytest.raises(ClosedError):
            await p.send("q", b"late")

    run(target, test)


def test_send_nowait_reports_metadata_errors_through_the_future(target):
    async def test(hw):
        p = hw.producer()
        fut = p.send_nowait("nope", b"x")  # metadata unknown: the error arrives in the future
        with pytest.raises(QueueNotFoundError):
            await fut
        await hw.admin.create_queue("q", partitions=2, message_bytes_max=10)
        with pytest.raises(PartitionOutOfRangeError):
            await p.send_nowait("q", b"x", partition=7)
        assert (await p.send_nowait("q", b"x", partition=1)).partition == 1
        # now the metadata is cached: bad input raises at once, before anything is queued
        with pytest.raises(MessageTooLargeError):
            p.send_nowait("q", b"x" * 11)
        with pytest.raises(InvalidArgumentError, match="encode"):
            p.send_nowait("q", "text")  # type: ignore[arg-type]  # the wrong type is what the test checks
        with pytest.raises(PartitionOutOfRangeError):
            p.send_nowait("q", b"x", partition=-1)
        small = hw.producer(buffer_bytes_max=200)
        futs = [small.send_nowait("q", b"x" * 10, partition=0) for _ in range(5)]
        with pytest.raises(UnavailableError, match="buffer full"):
            for _ in range(20):
                futs.append(small.send_nowait("q", b"x" * 10, partition=0))
        await small.flush()  # room again
        futs.append(small.send_nowait("q", b"y", partition=0))
        await asyncio.gather(*futs)

    run(target, test)


def hold_describe(hw) -> tuple[list[str], asyncio.Event]:
    """Hold the service's describe_queue until the returned event is set; the list names
    the queues asked for."""
    asked: list[str] = []
    gate = asyncio.Event()
    real = hw.service.describe_queue

    async def describe(name):
        asked.append(name)
        await gate.wait()
        return await real(name)

    hw.service.describe_queue = describe
    return asked, gate


def test_sends_go_on_with_stale_metadata_while_a_task_refreshes_it(target):
    async def test(hw):
        await hw.admin.create_queue("grow", partitions=1)
        p = hw.producer(partitioner="round_robin", metadata_max_age_ms=50)
        await p.send("grow", b"first")  # an unknown queue: its metadata is awaited
        await hw.admin.add_partitions("grow", 3)
        asked, gate = hold_describe(hw)
        try:
            await asyncio.sleep(0.1)  # the copy is stale now
            ids = [await asyncio.wait_for(p.send_nowait("grow", b"x"), 5) for _ in range(3)] + [
                await asyncio.wait_for(p.send("grow", b"y"), 5) for _ in range(3)
            ]
            assert asked == ["grow"]  # one refresh, held, and nobody waited for it
            assert {m.partition for m in ids} == {0}
        finally:
            gate.set()
        for _ in range(100):
            ids = [await p.send("grow", b"z") for _ in range(3)]
            if {m.partition for m in ids} == {0, 1, 2}:
                break
            await asyncio.sleep(0.01)
        assert {m.partition for m in ids} == {0, 1, 2}
        asked.clear()
        gate.clear()
        await asyncio.sleep(0.1)
        await p.send("grow", b"last")
        assert asked == ["grow"]  # a refresh held when the producer closes: close ends it
        await p.close()

    run(target, test)


def test_retries_resend_the_same_bytes_and_store_once(target):
    async def test(hw):
        await hw.admin.create_queue("q")
        produce = hw.service.produce
        sent: list[bytes] = []
        lose = {"answers": 2}

        async def flaky(queue, partition, batch):
            sent.append(bytes(batch))
            result = await produce(queue, partition, batch)
            if lose["answers"]:
                lose["answers"] -= 1
                raise UnavailableError("the answer was lost")  # stored, but the client never hears
            return result

        patch_produce(hw, flaky)
        p = hw.producer(retry_backoff_ms=10)
        mid = await p.send("q", b"once")
        assert len(sent) == 3 and len(set(sent)) == 1  # the same bytes every time
        assert mid.offset == 0
        assert await p.send("q", b"twice") == MessageId(mid.queue_id, 0, 1)
        assert [r.body for r in await scan(hw, "q")] == [b"once", b"twice"]

        async def refusing(queue, partition, batch):
            raise UnavailableError("down")

        patch_produce(hw, refusing)
        p2 = hw.producer(retries=2, retry_backoff_ms=1)
        with pytest.raises(UnavailableError, match="down"):
            await p2.send("q", b"never")
        assert p2.producer_epoch == 1  # it may have been stored: later batches use a new epoch
        patch_produce(hw, produce)
        await p2.send("q", b"after")
        assert [r.body for r in await scan(hw, "q")] == [b"once", b"twice", b"after"]

    run(target, test)


def test_a_batch_refused_as_out_of_order_is_sent_again_under_a_new_epoch(target):
    """A broker that lost the producer's earlier batches (a crash under async flush) refuses
    the next one as out of order, storing nothing; the producer sends it again from
    sequence 0 of a new epoch, and the next batches follow it."""

    async def test(hw):
        await hw.admin.create_queue("q")
        produce = hw.service.produce
        refuse = {"left": 1}

        async def forgetful(queue, partition, batch):
            if refuse["left"]:
                refuse["left"] -= 1
                raise OutOfOrderSequenceError("expected sequence 0")  # nothing stored
            return await produce(queue, partition, batch)

        p = hw.producer()
        await p.send("q", b"first")
        patch_produce(hw, forgetful)
        assert (await p.send("q", b"second")).offset == 1
        assert p.producer_epoch == 1
        patch_produce(hw, produce)
        await p.send("q", b"third")
        assert [r.body for r in await scan(hw, "q")] == [b"first", b"second", b"third"]

    run(target, test)


def test_retries_under_concurrency_store_each_message_once_in_order(target):
    """Answers lost after the append and refusals before it, at random (seeded), while 50
    tasks send with linger: every message is stored exactly once, in order per key."""
    seed = 7

    async def test(hw):
        rng = random.Random(seed)
        await hw.admin.create_queue("q", partitions=3)
        produce = hw.service.produce

        async def flaky(queue, partition, batch):
            r = rng.random()
            if r < 0.15:
                raise UnavailableError("refused before the append")
            result = await produce(queue, partition, batch)
            if r < 0.3:
                raise UnavailableError("the answer was lost after the append")
            return result

        patch_produce(hw, flaky)
        p = hw.producer(linger_ms=3, retries=50, retry_backoff_ms=1, retry_backoff_max_ms=5, batch_bytes_max=2000)

        async def worker(t: int) -> None:
            futs = []
            for i in range(30):
                if rng.random() < 0.5:
                    futs.append(p.send_nowait("q", b"%d-%d" % (t, i), key=b"k%d" % t))
                else:
                    await asyncio.gather(*futs)
                    futs = []
                    await p.send("q", b"%d-%d" % (t, i), key=b"k%d" % t)
            await asyncio.gather(*futs)

        await asyncio.gather(*(worker(t) for t in range(50)))
        patch_produce(hw, produce)
        seen: dict[int, list[int]] = {}
        async for r in hw.scanner("q"):
            t, i = map(int, r.body.split(b"-"))
            seen.setdefault(t, []).append(i)
        assert len(seen) == 50, f"seed {seed}"
        assert all(v == list(range(30)) for v in seen.values()), f"seed {seed}"

    run(target, test)


def test_200_concurrent_tasks_keep_per_partition_order(target):
    async def test(hw):
        await hw.admin.create_queue("q", partitions=4)
        p = hw.producer()

        async def worker(t: int) -> None:
            for i in range(5):
                await hw.send("q", b"%d-%d" % (t, i), key=b"w%d" % t)
            futs = [p.send_nowait("q", b"%d-%d" % (t, i), key=b"w%d" % t) for i in range(5, 10)]
            await asyncio.gather(*futs)

        await asyncio.gather(*(worker(t) for t in range(200)))
        seen: dict[int, list[int]] = {}
        for r in await scan(hw, "q"):
            t, i = map(int, r.body.split(b"-"))
            seen.setdefault(t, []).append(i)
        assert len(seen) == 200
        assert all(v == list(range(10)) for v in seen.values())

    run(target, test)


# -- reading ------------------------------------------------------------------------------


def test_scanner_bounds_tags_and_errors(target):
    async def test(hw):
        clock = target.clock
        await hw.admin.create_queue("q", partitions=3)
        ids = await hw.send_batch("q", [b"a%d" % i for i in range(10)], partition=0)
        clock.advance(10)
        t_mid = int(clock.now * 1000)
        await hw.send_batch(
            "q", [Message(b"b%d" % i, tag="even" if i % 2 == 0 else "odd") for i in range(6)], partition=1
        )
        assert len(await scan(hw, "q")) == 16
        assert [r.body for r in await scan(hw, "q", partitions=0, start=3, stop=6)] == [b"a3", b"a4", b"a5"]
        assert [r.offset for r in await scan(hw, "q", start=ids[7])] == [7, 8, 9]
        assert [r.offset for r in await scan(hw, "q", start=str(ids[2]), stop=ids[4])] == [2, 3]
        assert [r.body for r in await scan(hw, "q", start={0: 9, 1: 5})] == [b"a9", b"b5"]
        assert [r.body for r in await scan(hw, "q", tags="even")] == [b"b0", b"b2", b"b4"]
        assert len(await scan(hw, "q", start_time=t_mid)) == 6
        assert len(await scan(hw, "q", end_time=t_mid)) == 10
        async with hw.scanner("q", partitions=[0, 1]) as s:
            first = [await s.__anext__() for _ in range(2)]
        assert [r.body for r in first] == [b"a0", b"a1"]
        assert [r async for r in s] == []  # closed by async with

        with pytest.raises(QueueNotFoundError):
            await scan(hw, "nope")
        with pytest.raises(PartitionOutOfRangeError):
            await scan(hw, "q", partitions=3)
        with pytest.raises(InvalidArgumentError, match="different partitions"):
            hw.scanner("q", start=ids[0], stop=MessageId(ids[0].queue_id, 1, 3))

    run(target, test)


def test_get_and_find(target):
    async def test(hw):
        await hw.admin.create_queue("q", partitions=2)
        ids = await hw.send_batch("q", [Message(b"x%d" % i, key=b"user-%d" % (i % 2)) for i in range(6)])
        rec = await hw.get(ids[3])
        assert rec.body == b"x3" and rec.message_id == ids[3]
        assert (await hw.get(str(ids[4]))).body == b"x4"
        found = await hw.find("q", b"user-1")
        assert [r.body for r in found] == [b"x1", b"x3", b"x5"]
        assert len(await hw.find("q", b"user-0", limit=2)) == 2
        with pytest.raises(InvalidArgumentError, match="encode"):
            await hw.find("q", "user-1")  # type: ignore[arg-type]  # the wrong type is what the test checks
        with pytest.raises(QueueNotFoundError):
            await hw.find("nope", b"k")
        assert await hw.offset_for_time("q", ids[0].partition, 0) == 0
        await hw.admin.truncate_queue("q")
        with pytest.raises(MessageNotFoundError):
            await hw.get(ids[0])
        with pytest.raises(InvalidArgumentError):
            await hw.get("not-an-id")

    run(target, test)


def test_consumer_long_poll_returns_soon_after_data_arrives(target):
    async def test(hw):
        await hw.admin.create_queue("q", partitions=2)
        c = hw.consumer()
        await c.assign("q")
        assert await c.poll(timeout_ms=100) == []

        async def later() -> None:
            await asyncio.sleep(0.3)
            await hw.send("q", b"late", partition=1)

        task = asyncio.create_task(later())
        t0 = time.monotonic()
        got = await c.poll(timeout_ms=2500)
        waited = time.monotonic() - t0
        await task
        assert [r.body for r in got] == [b"late"]
        assert 0.2 < waited < 2.0
        assert c.position("q", 1) == 1

    run(target, test)


def test_a_poll_keeps_its_own_timeout_after_a_longer_one_ended_early(target):
    """The waits for a push share one timer: a short poll after a long one that a record
    ended early still ends at its own time, and the long one was not cut short."""

    async def test(hw):
        await hw.admin.create_queue("q")
        c = hw.consumer()
        await c.assign("q")
        assert await c.poll(timeout_ms=50) == []  # the timer armed for a short wait first

        async def later() -> None:
            await asyncio.sleep(0.3)
            await hw.send("q", b"late")

        task = asyncio.create_task(later())
        got = await c.poll(timeout_ms=20_000)  # past the first wait's time, until the record
        await task
        assert [r.body for r in got] == [b"late"]
        t0 = time.monotonic()
        assert await c.poll(timeout_ms=100) == []
        assert time.monotonic() - t0 < 10  # its own 0.1 s, not what was left of the 20 s
        await c.close()

    run(target, test)


def test_long_polls_on_many_partitions_do_not_starve_other_calls(target):
    async def test(hw):
        await hw.admin.create_queue("wide", partitions=40)
        c = hw.consumer()
        await c.assign("wide")
        poll = asyncio.create_task(c.poll(timeout_ms=2500))  # 40 long polls in flight
        await asyncio.sleep(0.1)
        t0 = time.monotonic()
        await hw.send("wide", b"x", partition=17)
        assert time.monotonic() - t0 < 1.0
        assert [r.partition for r in await poll] == [17]

    run(target, test)


def test_threaded_service_without_append_notifications_still_long_polls(clock):
    """Any sync BrokerService can back the asyncio client, even one that cannot notify appends
    (here the fake's broker, its notifications not passed on): long polls then poll it in
    short slices."""
    from headwater.client.aio.service import ThreadedService
    from headwater.testing import open_memory

    async def main() -> None:
        async with headwater.aio.AsyncClient(ThreadedService(open_memory(clock=clock).service)) as hw:
            await hw.admin.create_queue("q", partitions=2)
            c = hw.consumer()
            await c.assign("q")

            async def later() -> None:
                await asyncio.sleep(0.3)
                await hw.send("q", b"late", partition=0)

            task = asyncio.create_task(later())
            t0 = time.monotonic()
            assert [r.body for r in await c.poll(timeout_ms=2000)] == [b"late"]
            assert 0.2 < time.monotonic() - t0 < 1.0
            await task

    asyncio.run(main())


def test_consumer_commit_and_resume(target):
    async def test(hw):
        await hw.admin.create_queue("q", partitions=2)
        await hw.send_batch("q", [b"a%d" % i for i in range(10)], partition=0)
        await hw.send_batch("q", [b"b%d" % i for i in range(10)], partition=1)
        c1 = hw.consumer(group="billing")
        await c1.assign("q")
        got = await c1.poll(max_messages=6, timeout_ms=1000)
        assert len(got) == 6
        await c1.commit()
        assert await c1.committed("q", got[0].partition) == got[-1].offset + 1
        await c1.close()
        with pytest.raises(ClosedError):
            await c1.poll()
        async with hw.consumer(group="billing") as c2:
            await c2.assign("q")
            rest = await drain(c2, 14)
        assert sorted(r.body for r in got + rest) == sorted(
            [b"a%d" % i for i in range(10)] + [b"b%d" % i for i in range(10)]
        )
        other = hw.consumer(group="audit", max_poll_messages=3)
        await other.assign("q")
        assert len(await drain(other, 20)) == 20
        c3 = hw.consumer()
        await c3.assign("q")
        with pytest.raises(InvalidArgumentError, match="group"):
            await c3.commit()

    run(target, test)


def test_consumer_seeks_and_async_iteration(target):
    async def test(hw):
        clock = target.clock
        await hw.admin.create_queue("q")
        ids = await hw.send_batch("q", [b"old%d" % i for i in range(5)], partition=0)
        c = hw.consumer(group="g", auto_offset_reset="latest")
        await c.assign("q")
        assert await c.poll(timeout_ms=50) == []
        clock.advance(10)
        await hw.send("q", b"new", partition=0)
        assert [r.body for r in await drain(c, 1)] == [b"new"]
        c.seek("q", 0, 2)  # plain calls: they only move local positions
        assert [r.body for r in await drain(c, 4)] == [b"old2", b"old3", b"old4", b"new"]
        c.seek_to_id(ids[4])
        assert c.position("q", 0) == 4
        await c.seek_to_beginning("q")
        got = []
        async for r in c:
            got.append(r.body)
            if len(got) == 3:
                break
        assert got == [b"old0", b"old1", b"old2"]
        await c.commit()
        assert await c.committed("q", 0) == 3  # exactly what the loop has seen
        await c.seek_to_time("q", int((clock.now - 5) * 1000))
        assert [r.body for r in await drain(c, 1)] == [b"new"]
        await c.seek_to_end("q")
        assert await c.poll(timeout_ms=50) == []
        with pytest.raises(InvalidArgumentError, match="not assigned"):
            c.seek("q", 3, 0)
        with pytest.raises(InvalidArgumentError, match="when must be a datetime"):
            await c.seek_to_time("q", None)  # was an AssertionError

    run(target, test)


def test_errors_are_the_sync_clients_classes(target):
    async def test(hw):
        await hw.admin.create_queue("q", partitions=2, message_bytes_max=100)
        with pytest.raises(QueueNotFoundError):
            await hw.send("nope", b"x")
        with pytest.raises(QueueNotFoundError):
            await hw.consumer().assign("nope")
        with pytest.raises(PartitionOutOfRangeError, match="0..1"):
            await hw.send("q", b"x", partition=2)
        with pytest.raises(PartitionOutOfRangeError):
            await hw.send_batch("q", [b"x"], partition=5)
        with pytest.raises(PartitionOutOfRangeError):
            await hw.consumer().assign("q", [5])
        with pytest.raises(MessageTooLargeError, match="100"):
            await hw.send("q", b"x" * 101)
        with pytest.raises(InvalidArgumentError):
            await hw.send_batch("q", [])
        with pytest.raises(InvalidArgumentError):
            await hw.send("q", b"x", key="str")  # type: ignore[arg-type]  # the wrong type is what the test checks
        with pytest.raises(InvalidArgumentError, match="key"):
            await hw.producer(partitioner="key").send("q", b"no key")
        with pytest.raises(InvalidArgumentError):
            hw.consumer(auto_offset_reset="middle")
        with pytest.raises(InvalidArgumentError):
            hw.producer(linger_ms=-1)
        assert [r.body for r in await scan(hw, "q")] == []  # nothing was stored

    run(target, test)


def test_close_with_work_in_flight_is_clean(target):
    async def test(hw):
        await hw.admin.create_queue("q", partitions=2)
        p = hw.producer(linger_ms=60_000)
        futs = [p.send_nowait("q", b"%d" % i) for i in range(10)]
        c = hw.consumer()
        await c.assign("q")
        poll = asyncio.create_task(c.poll(timeout_ms=1500))  # long polls in flight
        await asyncio.sleep(0.05)
        poll.cancel()
        with pytest.raises(asyncio.CancelledError):
            await poll
        c.seek("q", 0, 0)  # drops a fetch in flight
        # closing the client flushes the lingering producer and ends the consumer's fetches
        await hw.close()
        assert all(f.done() and f.exception() is None for f in futs)
        with pytest.raises(ClosedError):
            await c.poll()

    run(target, test)


# -- module -------------------------------------------------------------------------------


def test_connect_to_nothing_fails_fast():
    async def main() -> None:
        with pytest.raises(UnavailableError, match="cannot reach"):
            await headwater.aio.connect("127.0.0.1:1", connect_timeout_s=0.3)

    asyncio.run(main())


def test_the_docstring_example():  # (the names are pinned in tests/test_public_api.py)
    result = doctest.testmod(headwater.aio, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


# -- pipelining (over the network) --------------------------------------------------------


class HeldSends:
    """The network service's ``produce_into``, each request held until :meth:`release`
    runs it against the broker in arrival order; call numbers in ``lose`` fail first."""

    def __init__(self, hw, lose=()) -> None:
        self.produce = hw.service.produce
        self.lose = set(lose)
        self.calls = 0
        self.sizes: list[int] = []
        self.held: list[tuple] = []
        hw.service.produce_into = self.produce_into

    def produce_into(self, queue, partition, batch, sink):
        forward(self.hold(queue, partition, batch), sink)

    def hold(self, queue, partition, batch):
        fut = asyncio.get_running_loop().create_future()
        self.calls += 1
        self.sizes.append(decode_header(batch).count)
        self.held.append((self.calls, queue, partition, bytes(batch), fut))
        return fut

    async def release(self, n: int | None = None) -> None:
        items = self.held[: len(self.held) if n is None else n]
        del self.held[: len(items)]
        for call, queue, partition, batch, fut in items:
            if call in self.lose:
                fut.set_exception(UnavailableError(f"injected: call {call} lost"))
                continue
            try:
                fut.set_result(await self.produce(queue, partition, batch))
            except Exception as e:  # noqa: BLE001 - the broker's answer
                fut.set_exception(e)


@pytest.fixture
def network(tmp_path, clock):
    t = Target("network", tmp_path, clock)
    yield t
    t.server.stop()
    if not t.server.thread.is_alive():
        t.server.loop.close()


def test_batches_of_a_partition_are_pipelined_over_the_network(network):
    async def test(hw):
        await hw.admin.create_queue("q")
        p = hw.producer()
        assert p.max_in_flight == 5
        await p.send("q", b"m0", partition=0)  # the queue's metadata is cached from here on
        held = HeldSends(hw)
        try:
            futs = []
            for i in range(1, 9):  # one at a time: each may leave before the next is sent
                futs.append(p.send_nowait("q", f"m{i}".encode(), partition=0))
                await asyncio.sleep(0.005)
            assert held.sizes == [1] * 5  # each left at once; three wait for room
            await held.release(1)
            await asyncio.sleep(0.05)
            assert held.sizes == [1] * 5 + [3]  # what waited left as one batch
        finally:
            await held.release()
        assert [(await f).offset for f in futs] == list(range(1, 9))
        assert [r.body for r in await scan(hw, "q")] == [f"m{i}".encode() for i in range(9)]
        await p.close()

    run(network, test)


@pytest.mark.parametrize("lost", [[1], [2], [3, 4], [1, 2, 3, 4, 5]])
def test_a_lost_pipelined_batch_is_retried_before_the_ones_after_it(network, lost):
    async def test(hw):
        await hw.admin.create_queue("q")
        p = hw.producer(retry_backoff_ms=1)
        await hw.admin.describe_queue("q")
        await p.send("q", b"m0", partition=0)  # metadata cached; calls below count from 1
        held = HeldSends(hw, lose=lost)
        futs = []
        for i in range(1, 6):
            futs.append(p.send_nowait("q", f"m{i}".encode(), partition=0))
            await asyncio.sleep(0.005)
        assert held.sizes == [1] * 5
        futs += [p.send_nowait("q", f"m{i}".encode(), partition=0) for i in range(6, 10)]
        async with asyncio.timeout(20):
            while not all(f.done() for f in futs):
                await held.release()
                await asyncio.sleep(0.005)
        assert [r.body for r in await scan(hw, "q")] == [f"m{i}".encode() for i in range(10)]
        assert [f.result().offset for f in futs] == list(range(1, 10))
        await p.close()

    run(network, test)


def test_a_batch_its_connection_refuses_at_once_is_judged_on_a_later_turn_and_sent_again(network):
    """A request the transport fails inside its submit (here: at once, as a closed connection
    does) is judged after the dispatch that sent it, not inside it: it goes again, in order."""

    async def test(hw):
        await hw.admin.create_queue("q")
        p = hw.producer(retry_backoff_ms=1)
        await p.send("q", b"m0", partition=0)  # metadata cached
        real = hw.service.produce_into
        dispatching: list[bool] = []
        judged_inside: list[bool] = []

        def refuse_first(queue, partition, batch, sink):
            if not dispatching:
                dispatching.append(True)
                sink.set_exception(UnavailableError("injected: refused before it was written"))
                judged_inside.append(bool(p._core.partition("q", 0).retry))  # put to retry yet?
                return
            real(queue, partition, batch, sink)

        hw.service.produce_into = refuse_first
        futs = [p.send_nowait("q", f"m{i}".encode(), partition=0) for i in range(1, 4)]
        async with asyncio.timeout(20):
            ids = await asyncio.gather(*futs)
        assert judged_inside == [False]  # nothing was put to retry while the dispatch ran
        assert [i.offset for i in ids] == [1, 2, 3]
        assert [r.body for r in await scan(hw, "q")] == [b"m0", b"m1", b"m2", b"m3"]
        await p.close()

    run(network, test)
