"""A send's future is detached from its batch (issue 32): a message waiting in a batch costs
no object the cyclic garbage collector walks unless its caller keeps the future, and the
futures still behave as ``concurrent.futures`` futures and get their own message's id when
the batch was put in due order. Counts of objects, never speeds."""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import random
import threading
import time
import weakref

import pytest

import headwater
from headwater.client.transport.send_future import AsyncSendFuture, BatchOutcome, SendFuture
from headwater.model.message import MessageId
from headwater.model.service import ProduceResult

STORED = ProduceResult(queue_id=3, partition=1, base_offset=100, count=4, timestamp_ms=0)


def _ids(futs) -> list[int]:
    return [f.result(timeout=10).offset for f in futs]


def test_detached_futures_read_their_ids_from_the_outcome_after_a_reorder():
    o = BatchOutcome()
    futs = [SendFuture(o, i) for i in range(4)]
    assert not any(f.done() for f in futs) and not o.listened()
    o.reordered([3, 1, 0, 2])
    o.reordered([1, 0, 2, 3])  # encoded again: composed with the first order
    o.settle(STORED, None)
    # now in order: [1, 3, 0, 2] of the sends, at offsets 100..103
    assert _ids(futs) == [102, 100, 103, 101]
    assert futs[0].result() == MessageId(3, 1, 102) and "finished" in repr(futs[0])
    assert o.listeners is None, "nobody waited: no future was kept"
    with pytest.raises(concurrent.futures.InvalidStateError):  # settled once
        futs[1].set_result(MessageId(3, 1, 7))
    assert not futs[1].cancel() and not futs[1].cancelled() and not futs[1].running()


def test_a_failed_batch_fails_every_future_whoever_waits():
    o = BatchOutcome()
    waited, quiet = SendFuture(o, 0), SendFuture(o, 1)
    seen: list = []
    waited.add_done_callback(lambda f: seen.append(f.exception()))
    assert o.listened() and not quiet.has_done_callbacks()
    err = ValueError("refused")
    o.settle(None, err)
    o.settle(STORED, None)  # a batch is settled once: the second is ignored
    assert seen == [err] and quiet.exception() is err
    with pytest.raises(ValueError):
        waited.result()


def test_waiters_and_callbacks_before_the_answer_are_settled_with_it():
    o = BatchOutcome()
    futs = [SendFuture(o, i) for i in range(4)]
    called: list = []
    futs[2].add_done_callback(lambda f: called.append(f.result().offset))
    o.reordered([2, 3, 0, 1])
    threading.Timer(0.05, o.settle, (STORED, None)).start()
    assert futs[0].result(timeout=10).offset == 102  # a thread waited first: a condition of its own
    done, _ = concurrent.futures.wait(futs, timeout=10)
    assert done == set(futs) and called == [100]
    assert set(concurrent.futures.as_completed(futs, timeout=10)) == set(futs)
    futs[3].add_done_callback(lambda f: called.append("late"))  # after: called at once
    assert called == [100, "late"]


def test_futures_waited_on_while_their_batch_is_settled_get_their_own_ids():
    """Threads wait on, read, and add callbacks to the futures of a batch while another
    settles it: each future gets its message's id once, however the two interleave."""

    def read(f: SendFuture, start: threading.Barrier, got: list) -> None:
        start.wait()
        f.add_done_callback(lambda x: got.append(("cb", x.result().offset)))
        got.append(("result", f.result(timeout=10).offset))

    expect = sorted([("cb", 100 + 3 - i) for i in range(4)] + [("result", 100 + 3 - i) for i in range(4)])
    for _ in range(100):
        o = BatchOutcome()
        futs = [SendFuture(o, i) for i in range(4)]
        o.reordered([3, 2, 1, 0])
        got: list = []
        start = threading.Barrier(5)
        threads = [threading.Thread(target=read, args=(f, start, got)) for f in futs]
        for t in threads:
            t.start()
        start.wait()
        o.settle(STORED, None)
        for t in threads:
            t.join(10)
        assert sorted(got) == expect
        assert _ids(futs) == [103, 102, 101, 100]


def test_wait_on_detached_futures_ends_when_the_batch_is_settled():
    o = BatchOutcome()
    futs = [SendFuture(o, i) for i in range(3)]
    threading.Timer(0.05, o.settle, (STORED, None)).start()
    done, not_done = concurrent.futures.wait(futs, timeout=10)
    assert len(done) == 3 and not not_done and _ids(futs) == [100, 101, 102]


def test_the_batch_keeps_no_reference_to_a_future():
    o = BatchOutcome()
    fut = SendFuture(o, 0)
    ref = weakref.ref(fut)
    del fut
    assert ref() is None, "a future nobody keeps is gone at once (the outcome does not hold it)"
    o.settle(STORED, None)


def _tracked() -> int:
    gc.collect()
    return len(gc.get_objects())


def test_waiting_delayed_messages_cost_no_tracked_object_each(tmp_path):
    """5,000 delayed messages in random order of due times wait in their open batches (a
    long linger): with the futures dropped, the collector tracks a few objects per batch,
    none per message; with them kept, one per message (the future). Then they are sent and
    each kept future gets its own message's id."""
    n, partitions = 5_000, 4
    hw = headwater.open(tmp_path / "data")
    try:
        hw.admin.create_queue("d", partitions=partitions, ttl_s=None)
        p = hw.producer(linger_ms=600_000)
        p.send_and_wait("d", b"warm", partition=0, deliver_at=int(time.time() * 1000) + 3_600_000)
        rng = random.Random(32)
        t0 = int(time.time() * 1000) + 3_600_000  # an hour ahead: nothing comes due
        times = [t0 + rng.randrange(10_000) for _ in range(n)]
        callback_calls: list = []

        def callback(mid, exc):  # one function for every send, as an application has
            callback_calls.append(exc)

        before = _tracked()
        for i in range(n):
            p.send("d", b"x" * 20, partition=i % partitions, deliver_at=times[i], callback=callback)
        dropped = _tracked() - before
        batches = p._core.pending()
        assert sum(len(b.messages) for b in batches) == n, "all of them wait in open batches"
        # per batch: itself, its outcome, lists of messages, times, callbacks, an array; and
        # the sender thread's few
        assert dropped < 10 * len(batches) + 60, f"{dropped} tracked for {n} messages in {len(batches)} batches"
        assert dropped < n * 0.1

        before = _tracked()
        kept = {
            f"k{i}".encode(): p.send("d", f"k{i}".encode(), partition=i % partitions, deliver_at=times[i])
            for i in range(n)
        }
        held = _tracked() - before
        assert held < n * 1.02, f"{held} objects tracked for {n} kept futures"
        called_back: dict[bytes, MessageId] = {}
        for i in range(0, n, 10):  # a callback of its own: it must get its own message's id
            body = f"c{i}".encode()
            p.send(
                "d",
                body,
                partition=i % partitions,
                deliver_at=times[i],
                callback=lambda mid, exc, body=body: called_back.__setitem__(body, mid),
            )

        p.flush()
        assert callback_calls == [None] * n
        ids = {body: f.result() for body, f in kept.items()}
        assert all(mid.is_delayed for mid in ids.values())
        for body in list(kept)[::250]:  # each id names its own message, though its batch was reordered
            assert hw.get(ids[body]).body == body
        assert len(called_back) == n // 10 and len(set(called_back.values())) == n // 10
        for body in list(called_back)[::25]:
            assert hw.get(called_back[body]).body == body
        p.close()
    finally:
        hw.close()


def test_waiting_plain_messages_cost_no_tracked_object_each(tmp_path):
    """Plain sends share the detached future: 5,000 waiting in one open batch, their futures
    dropped, cost the collector the batch's few objects."""
    hw = headwater.open(tmp_path / "data")
    try:
        hw.admin.create_queue("q", partitions=1)
        p = hw.producer(linger_ms=600_000)
        p.send_and_wait("q", b"warm")
        before = _tracked()
        for i in range(5_000):
            p.send("q", b"m%d" % i)
        dropped = _tracked() - before
        assert sum(len(b.messages) for b in p._core.pending()) == 5_000
        assert dropped < 60, f"{dropped} tracked for 5,000 waiting messages"
        kept = p.send("q", b"last")
        p.flush()
        assert hw.get(kept.result()).body == b"last" and kept.result().offset == 5_001
        p.close()
    finally:
        hw.close()


def test_the_asyncio_producer_keeps_only_the_future_of_a_waiting_message(tmp_path):
    """The asyncio producer's futures are ``asyncio.Future``s, which the batch must keep:
    a waiting message costs the collector that one object, no entry tuple beside it; and
    each future gets its own message's id after its batch was put in due order."""
    import headwater.aio

    n, partitions = 3_000, 3

    async def main() -> None:
        hw = await headwater.aio.open(tmp_path / "data")
        try:
            await hw.admin.create_queue("d", partitions=partitions, ttl_s=None)
            p = hw.producer(linger_ms=600_000)
            t0 = int(time.time() * 1000) + 3_600_000
            await p.send("d", b"warm", partition=0, deliver_at=t0)
            rng = random.Random(32)
            times = [t0 + rng.randrange(10_000) for _ in range(n)]
            before = _tracked()
            futs = {
                f"m{i}".encode(): p.send_nowait("d", f"m{i}".encode(), partition=i % partitions, deliver_at=times[i])
                for i in range(n)
            }
            held = _tracked() - before
            batches = p._core.pending()
            assert sum(len(b.messages) for b in batches) == n, "all of them wait in open batches"
            assert held < n + 12 * len(batches) + 60, f"{held} tracked for {n} messages in {len(batches)} batches"
            await p.flush()
            ids = {body: f.result() for body, f in futs.items()}
            for body in list(futs)[::200]:  # each id names its own message
                assert (await hw.get(ids[body])).body == body
            await p.close()
        finally:
            await hw.close()

    asyncio.run(main())


# -- the asyncio send future ------------------------------------------------------------------


def test_every_task_awaiting_an_asyncio_send_future_gets_its_outcome_and_a_given_up_wait_logs_nothing():
    """Awaiting waits on a waiter of the task's own: the first is settled with the future,
    the others by a callback; a task that gives up waiting leaves the future alone, and its
    later error is not reported as never retrieved (as with asyncio.shield)."""
    problems: list[str] = []

    async def wait(fut):
        return await fut

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _loop, ctx: problems.append(ctx["message"]))
        ok = AsyncSendFuture(loop=loop)
        waits = [asyncio.ensure_future(wait(ok)) for _ in range(3)]
        await asyncio.sleep(0)
        ok.set_result(MessageId(1, 0, 5))
        assert await asyncio.gather(*waits) == [MessageId(1, 0, 5)] * 3
        bad = AsyncSendFuture(loop=loop)
        waits = [asyncio.ensure_future(wait(bad)) for _ in range(2)]
        await asyncio.sleep(0)
        bad.set_exception(KeyError("lost"))
        assert [type(r) for r in await asyncio.gather(*waits, return_exceptions=True)] == [KeyError, KeyError]
        given_up = AsyncSendFuture(loop=loop)
        task = asyncio.ensure_future(wait(given_up))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not given_up.done() and not given_up.cancel()
        given_up.set_exception(KeyError("after the wait"))

    asyncio.run(main())
    gc.collect()
    assert problems == []
