"""Producer edges found by exploratory testing: what cancelling an asyncio send future does,
the largest message a queue can take, and the waiting calls made from a send callback.

Every test runs against the embedded broker, the in-memory fake and the network (the ``hw``
and ``aio_target`` fixtures of conftest.py).
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from headwater import Message
from headwater.errors import InvalidArgumentError, MessageTooLargeError, QueueNotFoundError, UsageError
from headwater.model.batch import BATCH_BYTES_MAX, encode_batch, validate_batch
from tests.support.aio_target import run, scan

# -- cancelling an asyncio send future ----------------------------------------------------


def test_cancelling_a_send_nowait_future_changes_nothing(aio_target):
    """As the sync producer's future: cancel() says no, and the future keeps the id."""

    async def test(hw):
        await hw.admin.create_queue("cx")
        p = hw.producer(linger_ms=500)
        f = p.send_nowait("cx", b"cancel-me")
        assert f.cancel() is False
        assert not f.cancelled() and not f.done()
        await p.flush()
        mid = f.result()
        assert (await hw.get(mid)).body == b"cancel-me"
        assert [r.body for r in await scan(hw, "cx")] == [b"cancel-me"]
        await p.close()

    run(aio_target, test)


def test_a_cancelled_wait_for_a_send_nowait_future_leaves_the_future_alone(aio_target):
    """Giving up waiting (a timeout, a cancelled task) ends the wait at once, not the send."""

    async def test(hw):
        await hw.admin.create_queue("cx")
        p = hw.producer(linger_ms=10_000)
        f = p.send_nowait("cx", b"a")
        t0 = asyncio.get_running_loop().time()
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.05):
                await f
        assert asyncio.get_running_loop().time() - t0 < 5  # at its timeout, not the linger's
        waiter = asyncio.ensure_future(_await(f))
        await asyncio.sleep(0)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(waiter, 1)
        assert not f.done()
        await p.flush()
        assert (await hw.get(f.result())).body == b"a"
        assert await f == f.result()  # awaiting a settled future gives its id
        await p.close()

    run(aio_target, test)


def test_a_send_cancelled_before_its_queue_is_known_is_still_sent_once(aio_target):
    """``await send()`` cancelled while the producer asks for the queue's metadata (its
    first send there): the message is not taken back, as when it is cancelled later."""

    async def test(hw):
        await hw.admin.create_queue("cx")
        p = hw.producer(linger_ms=10_000)  # send() does not linger, cancelled or not
        sending = asyncio.ensure_future(p.send("cx", b"a"))
        await asyncio.sleep(0)  # it asks for the metadata
        sending.cancel()
        with pytest.raises(asyncio.CancelledError):
            await sending
        assert await p.send("cx", b"b")
        await p.flush()
        assert [r.body for r in await scan(hw, "cx")] == [b"a", b"b"]
        with pytest.raises(QueueNotFoundError):  # the errors still reach a caller that waits
            await p.send("nope", b"c")
        await p.close()

    run(aio_target, test)


async def _await(fut):
    return await fut


# -- the largest message ------------------------------------------------------------------


def test_a_queue_cannot_allow_messages_no_batch_can_hold(hw):
    with pytest.raises(InvalidArgumentError, match="message_bytes_max"):
        hw.admin.create_queue("big", message_bytes_max=64 * 1024 * 1024)


def test_the_largest_message_a_queue_allows_can_be_sent(hw):
    from headwater.model.config import MESSAGE_BYTES_MAX

    assert MESSAGE_BYTES_MAX < BATCH_BYTES_MAX
    hw.admin.create_queue("big", message_bytes_max=MESSAGE_BYTES_MAX)
    body = b"x" * MESSAGE_BYTES_MAX
    mid = hw.send("big", body, key=b"k" * 1000, tag="t", properties={"p": "v" * 1000})
    got = hw.get(mid)
    assert len(got.body) == MESSAGE_BYTES_MAX and got.key == b"k" * 1000
    with pytest.raises(MessageTooLargeError, match="message_bytes_max"):
        hw.send("big", body + b"x")


def test_one_message_too_large_for_a_batch_is_named_as_one_message(hw):
    """A body within the queue's limit whose key makes it too large for any batch: the error
    says it is this one message, at once from send(), with the limit that applies."""
    from headwater.model.config import MESSAGE_BYTES_MAX

    hw.admin.create_queue("big", message_bytes_max=MESSAGE_BYTES_MAX)
    huge = Message(b"x" * MESSAGE_BYTES_MAX, key=b"k" * (100 * 1024))
    p = hw.producer()
    for send in (
        lambda: p.send("big", huge),
        lambda: p.send_and_wait("big", huge),
        lambda: p.send_batch("big", [huge]),
    ):
        with pytest.raises(MessageTooLargeError) as e:
            send()
        text = str(e.value)
        assert "one message" in text and str(BATCH_BYTES_MAX) in text and "fewer" not in text
    p.close()
    assert list(hw.scanner("big")) == []


def test_encoding_names_one_message_too_large_and_many_messages_too_many():
    with pytest.raises(MessageTooLargeError) as one:
        encode_batch([b"x" * BATCH_BYTES_MAX])
    assert "one message" in str(one.value) and "fewer" not in str(one.value)
    half = b"x" * (BATCH_BYTES_MAX // 2)
    with pytest.raises(MessageTooLargeError, match="send fewer messages at once"):
        encode_batch([half, half])


def test_the_broker_refuses_a_batch_over_the_limit():
    """What encode_batch will not make, validate_batch (every broker, every mode) refuses."""
    validate_batch(bytes(encode_batch([b"x" * 100])))
    with pytest.raises(MessageTooLargeError, match=str(BATCH_BYTES_MAX)):
        validate_batch(bytes(BATCH_BYTES_MAX + 1))


# -- waiting from a send callback ---------------------------------------------------------


def test_send_and_wait_and_send_batch_from_a_callback_are_refused(hw):
    """Whether or not the partition is busy: a callback must not wait for the producer."""
    hw.admin.create_queue("q", partitions=2)
    p = hw.producer()
    outcomes: list = []
    done = threading.Event()

    def cb(mid, exc):
        for call in (
            lambda: p.send_and_wait("q", b"inline", partition=1),
            lambda: p.send_batch("q", [b"batch"], partition=1),
        ):
            try:
                outcomes.append(call())
            except UsageError as e:
                outcomes.append(e)
        p.send("q", b"queued", partition=1)  # queuing is fine
        done.set()

    p.send("q", b"x", partition=0, callback=cb)
    assert done.wait(30)
    p.flush()
    assert len(outcomes) == 2 and all(isinstance(o, UsageError) for o in outcomes), outcomes
    assert "callback" in str(outcomes[0])
    assert [r.body for r in hw.scanner("q", partitions=1)] == [b"queued"]
    p.close()


def test_a_send_does_not_wait_while_another_thread_encodes_and_sends(server):
    """Batches that go into flight while another thread holds the producer's wire lock wait
    in its outbox for that thread, in order; send() itself returns at once."""
    import headwater

    with headwater.connect(server.address) as hw:
        hw.admin.create_queue("q", partitions=1)
        p = hw.producer(linger_ms=0)
        p._wire.acquire()  # another thread is encoding and sending batches
        futures: list = []
        sender = threading.Thread(target=lambda: futures.extend(p.send("q", b"m%d" % i) for i in range(3)))
        sender.start()
        sender.join(10)
        assert not sender.is_alive(), "send() waited for the wire lock"
        assert not any(f.done() for f in futures)
        p._wire.release()
        p._send_queued()  # what the holder does after letting go: the outbox is its
        ids = [f.result(timeout=10) for f in futures]
        assert [hw.get(i).body for i in ids] == [b"m0", b"m1", b"m2"]
        assert [i.offset for i in ids] == sorted(i.offset for i in ids)
        p.close()


def test_flush_and_close_refuse_a_timeout_that_is_not_one(hw):
    """``flush(-1)`` returned at once, as if done, with messages unsent (and raised "still
    unacknowledged after -1 s" only when some were); ``flush("1")`` a TypeError from inside."""
    from headwater.errors import InvalidArgumentError

    hw.admin.create_queue("to", partitions=1)
    p = hw.producer(linger_ms=10_000)
    fut = p.send("to", b"waits for its linger")
    for bad in (-1, "1", float("nan"), float("inf"), True):
        with pytest.raises(InvalidArgumentError, match=r"flush\(\): timeout_s is how long it waits"):
            p.flush(bad)
        with pytest.raises(InvalidArgumentError, match=r"close\(\): timeout_s"):
            p.close(bad)
    assert not fut.done()  # nothing changed: the producer goes on
    p.flush(30)
    assert fut.result().offset == 0
    p.close(0)


def test_the_asyncio_flush_and_close_refuse_a_timeout_that_is_not_one(aio_target):
    async def test(hw):
        from headwater.errors import InvalidArgumentError

        p = hw.producer()
        for bad in (-1, "1", float("nan")):
            with pytest.raises(InvalidArgumentError, match=r"flush\(\): timeout_s"):
                await p.flush(bad)
            with pytest.raises(InvalidArgumentError, match=r"close\(\): timeout_s"):
                await p.close(bad)
        assert not p.closed
        await p.close()

    run(aio_target, test)
