"""``Consumer.wakeup()`` (Kafka's): another thread ends a waiting poll, or the next one, with
``WakeupError``; each call raises once and the consumer goes on unchanged, its positions and
its group membership kept. Each runs embedded, in memory, over the network (fetch streams and
fetches) and on a cluster; the asyncio consumers take it from another task or thread. The
keyed members' polls have it alike, and the shared consumers' receives, which lose nothing
leased when a request woken away from goes on waiting on the broker."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from headwater import Message
from headwater.errors import StateConflictError, WakeupError
from tests.support.aio_target import run
from tests.support.waiting import agather_until, gather_until, poll_until

STREAM = pytest.mark.parametrize("stream", [True, False], ids=["stream", "fetch"])


def _later(seconds: float, fn) -> threading.Thread:
    def run() -> None:
        time.sleep(seconds)
        fn()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _woken_from_a_thread(call, wakeup, what: str) -> None:
    """``call(timeout_ms=20_000)`` raises WakeupError naming the ``call`` when another thread
    calls ``wakeup`` 0.3 s in, not after its timeout."""
    waker = _later(0.3, wakeup)
    started = time.monotonic()
    with pytest.raises(WakeupError, match=rf"wakeup\(\) ended this {call.__name__}"):
        call(timeout_ms=20_000)
    assert time.monotonic() - started < 10, f"the {what} waited on after wakeup()"
    waker.join()


async def _woken_from_a_task_and_a_thread(call, wakeup, what: str) -> None:
    """``call(timeout_ms=20_000)`` raises WakeupError when ``wakeup`` is called from another
    task, then from another thread, each within 0.3 s, not after the call's timeout."""
    asyncio.get_running_loop().call_later(0.3, wakeup)  # another task
    started = time.monotonic()
    with pytest.raises(WakeupError):
        await call(timeout_ms=20_000)
    _later(0.3, wakeup)  # another thread
    with pytest.raises(WakeupError):
        await call(timeout_ms=20_000)
    assert time.monotonic() - started < 15, f"a {what} waited on after wakeup()"


@STREAM
def test_wakeup_ends_a_waiting_poll_and_the_consumer_goes_on(hw, stream):
    hw.admin.create_queue("wq", partitions=2)
    c = hw.consumer(stream=stream)
    c.assign("wq")
    assert c.poll(timeout_ms=100) == []  # reading has begun: the next poll waits on the broker
    _woken_from_a_thread(c.poll, c.wakeup, "poll")
    assert c.poll(timeout_ms=100) == []  # once per wakeup(): the next poll waits as any does
    hw.send_batch("wq", [b"a", b"b"], partition=1)
    assert [r.body for r in poll_until(c, 2)] == [b"a", b"b"]
    c.close()


def test_a_wakeup_before_the_poll_ends_the_next_one_and_loses_nothing(hw):
    hw.admin.create_queue("wq")
    hw.send_batch("wq", [b"m%d" % i for i in range(5)])
    c = hw.consumer(max_poll_messages=2)
    c.assign("wq")
    assert [r.offset for r in c.poll(timeout_ms=5000)] == [0, 1]  # three more wait in its buffer
    c.wakeup()
    c.wakeup()  # twice before a poll is once
    with pytest.raises(WakeupError) as raised:
        c.poll(timeout_ms=5000)  # buffered records are not handed out past a wakeup
    assert isinstance(raised.value, StateConflictError) and not raised.value.retriable
    assert c.position("wq", 0) == 2
    assert [r.offset for r in poll_until(c, 3)] == [2, 3, 4]
    c.close()


def test_wakeup_ends_a_consumer_loop_from_another_thread(hw):
    hw.admin.create_queue("wq")
    c = hw.consumer(group="wakers", subscribe="wq")
    hw.send_batch("wq", [b"x%d" % i for i in range(10)])
    seen: list[bytes] = []

    def loop() -> None:
        try:
            for record in c:  # iterates for good: only wakeup() (or close) ends it
                seen.append(record.body)
        except WakeupError:
            c.close()  # a group member commits what it read as it leaves

    reader = threading.Thread(target=loop)
    reader.start()
    deadline = time.monotonic() + 15
    while len(seen) < 10 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(seen) == 10
    c.wakeup()
    reader.join(10)
    assert not reader.is_alive(), "wakeup() did not end the loop"
    assert c.closed
    after = hw.consumer(group="wakers", subscribe="wq")
    hw.send("wq", b"later")
    assert [r.body for r in poll_until(after, 1)] == [b"later"], "the member's reads were not committed"
    after.close()


def test_wakeup_ends_a_group_members_wait_for_an_assignment(hw):
    hw.admin.create_queue("wq")  # one partition: the second member of the group gets nothing
    first = hw.consumer(group="g", subscribe="wq")
    first.poll(timeout_ms=100)
    second = hw.consumer(group="g", subscribe="wq")
    deadline = time.monotonic() + 10
    while (first.assignment() and second.assignment()) or not (first.assignment() or second.assignment()):
        first.poll(timeout_ms=100)
        second.poll(timeout_ms=100)
        assert time.monotonic() < deadline, "the group did not settle"
    idle = second if not second.assignment() else first
    _later(0.3, idle.wakeup)
    started = time.monotonic()
    with pytest.raises(WakeupError):
        idle.poll(timeout_ms=20_000)
    assert time.monotonic() - started < 10
    generation = idle.generation
    assert idle.poll(timeout_ms=100) == [] and idle.generation == generation  # still in its group
    first.close()
    second.close()


def test_the_asyncio_consumers_are_woken_from_a_task_or_a_thread(aio_target):
    async def test(hw):
        await hw.admin.create_queue("wq", partitions=2)
        c = hw.consumer()
        await c.assign("wq")
        assert await c.poll(timeout_ms=100) == []
        await _woken_from_a_task_and_a_thread(c.poll, c.wakeup, "poll")
        await hw.send_batch("wq", [b"a"], partition=0)
        assert [r.body for r in await agather_until(lambda: c.poll(timeout_ms=200), 1)] == [b"a"]
        await c.close()

        member = hw.consumer(group="aio-wakers", subscribe="wq")
        await member.poll(timeout_ms=100)
        asyncio.get_running_loop().call_later(0.3, member.wakeup)
        joined = time.monotonic()
        with pytest.raises(WakeupError):
            while time.monotonic() - joined < 10:  # its first poll may join and return: poll again
                await member.poll(timeout_ms=20_000)
        await member.close()

    run(aio_target, test)


def _keyed(n: int, prefix: bytes = b"m") -> list[Message]:
    return [Message(prefix + b"%d" % i, key=b"k%d" % i) for i in range(n)]


def test_wakeup_ends_a_keyed_members_waiting_poll_and_it_goes_on(hw):
    hw.admin.create_queue("wq", partitions=2)
    m = hw.keyed_consumer("kg", "wq", member=0, size=1)
    assert m.poll(timeout_ms=100) == []  # joined, reading: the next poll waits on the broker
    _woken_from_a_thread(m.poll, m.wakeup, "keyed poll")
    generation = m.generation
    assert m.poll(timeout_ms=100) == [] and m.generation == generation  # once; still in its group
    hw.send_batch("wq", _keyed(4), partition=1)
    assert sorted(r.body for r in poll_until(m, 4)) == [b"m0", b"m1", b"m2", b"m3"]
    m.close()


def test_a_wakeup_before_a_keyed_poll_ends_it_and_keeps_the_buffered_records(hw):
    hw.admin.create_queue("wq")
    hw.send_batch("wq", _keyed(5))
    m = hw.keyed_consumer("kg", "wq", member=0, size=1, max_poll_messages=2)
    assert [r.offset for r in m.poll(timeout_ms=5000)] == [0, 1]  # three more wait in its buffer
    m.wakeup()
    m.wakeup()  # twice before a poll is once
    with pytest.raises(WakeupError) as raised:
        m.poll(timeout_ms=5000)  # buffered records are not handed out past a wakeup
    assert isinstance(raised.value, StateConflictError) and not raised.value.retriable
    assert m.position(0) == 2
    assert [r.offset for r in poll_until(m, 3)] == [2, 3, 4]
    m.commit()
    m.close()


def test_the_asyncio_keyed_member_is_woken_from_a_task_or_a_thread(aio_target):
    async def test(hw):
        await hw.admin.create_queue("wq", partitions=2)
        m = hw.keyed_consumer("kg", "wq", member=0, size=1)
        assert await m.poll(timeout_ms=100) == []
        await _woken_from_a_task_and_a_thread(m.poll, m.wakeup, "keyed poll")
        m.wakeup()  # before the poll: the next one raises, records stay for the one after
        await hw.send_batch("wq", _keyed(3), partition=0)
        with pytest.raises(WakeupError):
            await m.poll(timeout_ms=5000)
        got = await agather_until(lambda: m.poll(timeout_ms=200), 3)
        assert sorted(r.body for r in got) == [b"m0", b"m1", b"m2"]
        await m.close()

    run(aio_target, test)


def test_wakeup_ends_a_waiting_shared_receive_and_the_member_goes_on(hw):
    hw.admin.create_queue("wq", partitions=2)
    c = hw.shared_consumer("sg", "wq", visibility_timeout_ms=600_000)
    _woken_from_a_thread(c.receive, c.wakeup, "receive")
    assert c.receive(timeout_ms=100) == []  # once per wakeup(): the next receive waits as any does
    hw.send_batch("wq", [b"a", b"b"], partition=1)
    got = _receive_until(c, 2)
    assert sorted((d.body, d.attempt) for d in got) == [(b"a", 1), (b"b", 1)]
    c.ack(got)
    c.close()


def test_a_wakeup_before_a_receive_ends_it_and_loses_nothing(hw):
    hw.admin.create_queue("wq")
    hw.send_batch("wq", [b"m0", b"m1", b"m2"])
    c = hw.shared_consumer("sg", "wq", visibility_timeout_ms=600_000)
    c.wakeup()
    c.wakeup()  # twice before a receive is once
    with pytest.raises(WakeupError) as raised:
        c.receive(timeout_ms=5000)
    assert isinstance(raised.value, StateConflictError) and not raised.value.retriable
    got = _receive_until(c, 3)
    assert sorted((d.body, d.attempt) for d in got) == [(b"m0", 1), (b"m1", 1), (b"m2", 1)]
    c.ack(got)
    c.close()


@pytest.mark.parametrize("at_most_once", [False, True], ids=["leased", "at-most-once"])
def test_a_shared_receive_woken_while_its_request_waits_on_the_broker_loses_nothing(hw, at_most_once):
    """Over the network the woken receive's request goes on waiting on the broker (there is
    no cancel): what it leases there is handed out by a later receive, at most once too."""
    hw.admin.create_queue("wq")
    c = hw.shared_consumer("sg", "wq", visibility_timeout_ms=600_000, at_most_once=at_most_once)
    _later(0.3, c.wakeup)
    with pytest.raises(WakeupError):
        c.receive(timeout_ms=10_000)
    hw.send("wq", b"precious")  # the woken request, still parked on the broker, may take it
    got = _receive_until(c, 1)
    assert [(d.body, d.attempt) for d in got] == [(b"precious", 1)]
    c.ack(got)
    c.close()


def test_closing_after_a_wakeup_gives_back_what_the_request_in_flight_leased(hw, request):
    if request.node.callspec.params["hw"] == "cluster":
        pytest.skip("on a cluster a late answer is kept by the client until it closes (docs/shared-groups.md)")
    hw.admin.create_queue("wq")
    c = hw.shared_consumer("sg", "wq", visibility_timeout_ms=600_000)
    _later(0.3, c.wakeup)
    with pytest.raises(WakeupError):
        c.receive(timeout_ms=3000)
    hw.send("wq", b"second")  # over the network the woken request leases it
    c.close()  # waits for that answer, and gives it back at once (not when its lease runs out)
    other = hw.shared_consumer("sg", "wq")
    got = _receive_until(other, 1)
    assert [d.body for d in got] == [b"second"]
    other.ack(got)
    other.close()


def test_a_sigterm_handler_ends_a_receive_loop(hw):
    import os
    import signal

    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers run in the main thread")
    hw.admin.create_queue("wq")
    c = hw.shared_consumer("sg", "wq", visibility_timeout_ms=600_000)
    hw.send_batch("wq", [b"x%d" % i for i in range(5)])
    seen: list[bytes] = []
    before = signal.signal(signal.SIGTERM, lambda signum, frame: c.wakeup())
    try:
        _later(1.0, lambda: os.kill(os.getpid(), signal.SIGTERM))
        started = time.monotonic()
        with pytest.raises(WakeupError):
            for d in c:  # receives for good: only the handler's wakeup() ends it
                seen.append(d.body)
                d.ack()
        assert time.monotonic() - started < 10
    finally:
        signal.signal(signal.SIGTERM, before)
    assert sorted(seen) == [b"x%d" % i for i in range(5)]
    c.close()


def test_the_asyncio_shared_consumer_is_woken_and_loses_nothing(aio_target):
    async def test(hw):
        await hw.admin.create_queue("wq")
        c = hw.shared_consumer("sg", "wq", visibility_timeout_ms=600_000)
        await _woken_from_a_task_and_a_thread(c.receive, c.wakeup, "receive")
        await hw.send("wq", b"precious")  # a woken request parked on the broker may take it
        got = await agather_until(lambda: c.receive(timeout_ms=200), 1)
        assert [(d.body, d.attempt) for d in got] == [(b"precious", 1)]
        await c.ack(got)
        c.wakeup()  # before the receive: it raises once, the next goes on
        with pytest.raises(WakeupError):
            await c.receive(timeout_ms=5000)
        assert await c.receive(timeout_ms=100) == []
        await c.close()

    run(aio_target, test)


def _receive_until(c, n: int, timeout_s: float = 10.0) -> list:
    return gather_until(lambda: c.receive(timeout_ms=200), n, timeout_s)


@STREAM
def test_polls_over_the_network_leave_nothing_piling_up_on_the_wakeup_future(server, stream):
    """Each poll that reads the connection hands its wakeup future to the transport, which
    adds a done-callback to it: a future kept from poll to poll grew by a few a poll."""
    import headwater

    hw = headwater.connect(server.address)
    hw.admin.create_queue("wq", partitions=2)
    c = hw.consumer(stream=stream)
    c.assign("wq")
    for _ in range(100):
        c.poll(timeout_ms=1)
    assert len(c._wakeup._callbacks or ()) < 10  # LazyFuture's list, made by the first callback
    c.close()
    hw.close()
