"""The network transport (headwater.client.transport.async_transport) and the sync RemoteService over it.

Against a real server: requests reach the wire in submission order (the producer's
pipelining relies on it), with back-to-back calls, big batches that overflow the socket's
buffer, calls from many threads and asyncio tasks. Against a hand-driven fake broker:
deadlines, a lost connection, a late answer, the in-flight limit, close().
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import re
import socket
import threading
import time

import pytest

import headwater.aio
from headwater.client.transport.async_transport import AsyncTransport, parse_address
from headwater.client.transport.remote import RemoteService
from headwater.errors import ClosedError, InvalidArgumentError, UnavailableError
from headwater.model.batch import encode_batch
from headwater.model.config import QueueConfig
from headwater.protocol import messages as m
from tests.support.fake_broker import FakeBroker, produced
from tests.support.waiting import wait_for


@pytest.fixture
def remote(server):
    svc = RemoteService(server.address)
    svc.create_queue("q", QueueConfig(partitions=1))
    yield svc
    svc.close()


# order on the wire -----------------------------------------------------------------------


def test_produce_async_back_to_back_lands_in_submission_order(remote):
    batch = encode_batch([b"x" * 100])
    futures = [remote.produce_async("q", 0, batch) for _ in range(2000)]
    offsets = [f.result(timeout=30).base_offset for f in futures]
    assert offsets == list(range(2000))


def test_big_batches_past_the_socket_buffer_keep_their_order(remote):
    """About 32 MB at once: the socket takes part, the rest waits, requests queue behind it."""
    batches = [encode_batch([bytes([i % 256]) * 256 * 1024]) for i in range(128)]
    futures = [remote.produce_async("q", 0, b) for b in batches]
    assert [f.result(timeout=60).base_offset for f in futures] == list(range(128))
    fetched = remote.fetch("q", 0, 0, max_bytes=1024)
    assert fetched is not None
    # and the connection is in a sane state afterwards
    remote.ping()


def test_each_thread_sees_its_own_submissions_in_order(remote):
    batch = encode_batch([b"y"])
    results: dict[int, list[int]] = {}

    def run(n: int) -> None:
        futures = [remote.produce_async("q", 0, batch) for _ in range(300)]
        results[n] = [f.result(timeout=30).base_offset for f in futures]

    threads = [threading.Thread(target=run, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    all_offsets = sorted(o for offs in results.values() for o in offs)
    assert all_offsets == list(range(6 * 300))
    for offs in results.values():
        assert offs == sorted(offs)


def test_blocking_calls_from_many_threads(remote):
    errors: list[BaseException] = []

    def run() -> None:
        try:
            for _ in range(200):
                remote.ping()
                remote.describe_queue("q")
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors


def test_asyncio_tasks_keep_creation_order(server):
    async def main() -> list[int]:
        hw = await headwater.aio.connect(server.address)
        try:
            await hw.service.create_queue("q", QueueConfig(partitions=1))
            batch = encode_batch([b"z"])
            results = await asyncio.gather(*(hw.service.produce("q", 0, batch) for _ in range(1000)))
            return [r.base_offset for r in results]
        finally:
            await hw.close()

    assert asyncio.run(main()) == list(range(1000))


def test_the_in_flight_limit_holds_and_the_excess_waits_in_order(fake_broker):
    offsets = iter(range(10**6))
    broker = fake_broker(lambda body: produced(next(offsets)), requests_in_flight_max=2, answer_delay_s=0.002)
    svc = RemoteService(broker.address)
    try:
        futures = [svc.produce_async("q", 0, encode_batch([str(i).encode()])) for i in range(100)]
        assert [f.result(timeout=30).base_offset for f in futures] == list(range(100))
    finally:
        svc.close()
    assert not broker.errors  # the fake's Connection refuses a third request in flight
    sent = [b for _, b in broker.requests if isinstance(b, m.ProduceRequest)]
    assert [bytes(b.batch) for b in sent] == [encode_batch([str(i).encode()]) for i in range(100)]


# deadlines and failures --------------------------------------------------------------------


def test_a_call_without_an_answer_fails_at_its_deadline(fake_broker):
    broker = fake_broker()  # answers pings only
    svc = RemoteService(broker.address, request_timeout_s=0.3)
    try:
        t0 = time.monotonic()
        with pytest.raises(UnavailableError, match=r"PRODUCE to 127\.0\.0\.1:\d+ got no answer in 0\.3 s"):
            svc.produce("q", 0, encode_batch([b"x"]))
        assert 0.25 < time.monotonic() - t0 < 3
        futures = [svc.produce_async("q", 0, encode_batch([b"x"])) for _ in range(5)]
        for f in futures:
            with pytest.raises(UnavailableError, match="got no answer"):
                f.result(timeout=5)
        svc.ping()  # the connection still works
    finally:
        svc.close()


def test_a_late_answer_is_ignored(fake_broker):
    broker = fake_broker(lambda body: produced(7), answer_delay_s=0.5)
    svc = RemoteService(broker.address, request_timeout_s=0.2)
    try:
        with pytest.raises(UnavailableError, match="got no answer in 0.2 s"):
            svc.produce("q", 0, encode_batch([b"x"]))
        time.sleep(0.5)
        svc.ping()
    finally:
        svc.close()


def test_a_lost_connection_fails_every_call_in_flight_then_reconnects(fake_broker):
    broker = fake_broker()  # answers pings only
    svc = RemoteService(broker.address, request_timeout_s=60)
    try:
        futures = [svc.produce_async("q", 0, encode_batch([b"x"])) for _ in range(5)]
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and len(broker.requests) < 6:  # the ping, then 5 produces
            time.sleep(0.01)
        t0 = time.monotonic()
        broker.drop_connections()
        for f in futures:
            with pytest.raises(UnavailableError, match="lost"):
                f.result(timeout=5)
        assert time.monotonic() - t0 < 5
        svc.ping()  # the next call reconnects
        assert len(broker.conns) == 2
    finally:
        svc.close()


def test_a_call_made_while_the_broker_is_down_waits_for_it_to_come_back(fake_broker):
    """The next call reconnects, with backoff, until the broker listens again."""
    first = fake_broker()
    svc = RemoteService(first.address, connect_timeout_s=10)
    try:
        first.close()  # down: the connection and the listener are gone
        port = int(first.address.rsplit(":", 1)[1])
        time.sleep(0.2)  # the client sees its connection end
        back: list[FakeBroker] = []
        threading.Timer(0.5, lambda: back.append(fake_broker(port=port))).start()
        t0 = time.monotonic()
        svc.ping()
        assert 0.4 < time.monotonic() - t0 < 5
        assert len(back) == 1 and len(back[0].conns) == 1
    finally:
        svc.close()


def _unused_address() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    address = f"127.0.0.1:{s.getsockname()[1]}"
    s.close()
    return address


def test_nobody_listening_fails_within_connect_timeout():
    """One connect_timeout_s, not one per retry: a call is not sent again after an attempt to
    connect made for it has given up (it was sent again three times, so the CLI took 17 s to
    say that nothing listened, with its timeout at 5 s)."""
    address = _unused_address()
    t0 = time.monotonic()
    with pytest.raises(UnavailableError, match="cannot reach the broker"):
        RemoteService(address, connect_timeout_s=1.0)
    assert time.monotonic() - t0 < 1.9

    async def main() -> float:
        t0 = time.monotonic()
        with pytest.raises(UnavailableError, match="cannot reach the broker"):
            await headwater.aio.connect(address, connect_timeout_s=1.0)
        return time.monotonic() - t0

    assert asyncio.run(main()) < 1.9


def test_a_request_waiting_for_a_connection_can_be_taken_back(fake_broker):
    """withdraw(): a request not written yet (the client is connecting again) is taken back
    and never written, its future left as it was, and the give-up of that connection attempt
    is recorded with its reason; a request already written cannot be taken back."""
    first = fake_broker()
    port = int(first.address.rsplit(":", 1)[1])
    svc = RemoteService(first.address, connect_timeout_s=1.0)
    try:
        written = svc._submit(m.PingRequest())
        assert not svc.withdraw(written)  # on its way (or answered) already
        written.result(5)
        first.close()
        time.sleep(0.2)  # the client sees its connection end
        t0 = time.monotonic()
        waiting = svc._submit(m.ListQueuesRequest())
        time.sleep(0.1)
        assert svc.withdraw(waiting) and not svc.withdraw(waiting)
        deadline = time.monotonic() + 5
        while not svc.transport.gave_up_connecting_since(t0):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert not waiting.done()  # not failed with the others: it was not there any more
        assert "cannot reach the broker" in str(svc.transport.connect_failure)
        back = fake_broker(port=port)
        svc.ping()
        assert [type(b) for _, b in back.requests] == [m.PingRequest]  # the list never went out
    finally:
        svc.close()


def test_a_broker_gone_for_good_fails_a_call_within_connect_timeout(fake_broker):
    first = fake_broker()
    svc = RemoteService(first.address, connect_timeout_s=1.0)
    try:
        first.close()
        time.sleep(0.2)  # the client sees its connection end
        t0 = time.monotonic()
        with pytest.raises(UnavailableError, match="cannot reach the broker"):
            svc.ping()  # a read: retried after a lost connection, not after an attempt to connect gave up
        assert time.monotonic() - t0 < 1.9
    finally:
        svc.close()


def test_close_fails_what_is_in_flight_and_refuses_what_follows(fake_broker):
    broker = fake_broker()  # answers pings only
    svc = RemoteService(broker.address)
    futures = [svc.produce_async("q", 0, encode_batch([b"x"])) for _ in range(3)]
    svc.close()
    for f in futures:
        with pytest.raises(UnavailableError, match="closed"):
            f.result(timeout=5)
    with pytest.raises(ClosedError):
        svc.ping()


def test_asyncio_call_deadline_and_close(fake_broker):
    broker = fake_broker()  # answers pings only

    async def main() -> None:
        transport = AsyncTransport(broker.address, request_timeout_s=0.2)
        await transport.call(m.PingRequest())
        with pytest.raises(UnavailableError, match="got no answer in 0.2 s"):
            await transport.call(m.ProduceRequest("q", 0, encode_batch([b"x"])))
        produce = m.ProduceRequest("q", 0, encode_batch([b"x"]))
        pending = asyncio.ensure_future(transport.call(produce, timeout_s=30))
        await asyncio.sleep(0.05)
        await transport.close()
        with pytest.raises(UnavailableError, match="closed"):
            await pending
        with pytest.raises(ClosedError):
            await transport.call(m.PingRequest())

    asyncio.run(main())


def test_a_cancelled_future_does_not_break_the_connection(fake_broker):
    broker = fake_broker(lambda body: produced(1), answer_delay_s=0.05)
    svc = RemoteService(broker.address)
    try:
        f = svc.produce_async("q", 0, encode_batch([b"x"]))
        assert f.cancel()
        time.sleep(0.2)  # its answer comes, for nobody
        svc.ping()
        assert svc.produce_async("q", 0, encode_batch([b"x"])).result(timeout=5).base_offset == 1
        with pytest.raises(concurrent.futures.CancelledError):
            f.result()
    finally:
        svc.close()


# a blocking caller reading for itself (AsyncTransport.lead) ----------------------------------


def loop_stood_aside(svc: RemoteService) -> bool:
    """Ping until the loop's reader has stood aside for the pinging (leading) thread; on a
    loaded machine the loop may read the first answers itself, which is correct too."""
    return wait_for(lambda: (svc.ping(), svc.transport._link.paused)[1])


def record_settling_threads(consumer) -> list[int]:
    """Wrap a consumer's fetches: the list fills with the thread that settled each answer."""
    settled_on: list[int] = []
    fetch_async = consumer._fetch_async

    def recording_fetch_async(*args, **kw):
        fut = fetch_async(*args, **kw)
        fut.add_done_callback(lambda f: settled_on.append(threading.get_ident()))
        return fut

    consumer._fetch_async = recording_fetch_async
    return settled_on


def test_a_polling_consumer_reads_its_answers_on_its_own_thread(server):
    """The consumer's fetches are answered on the polling thread, not handed over from the
    client's loop thread (each hand-over is a wake-up of both threads)."""
    hw = headwater.connect(server.address)
    try:
        hw.admin.create_queue("q", partitions=1)
        producer = hw.producer(linger_ms=0)
        consumer = hw.consumer(stream=False)
        consumer.assign("q", partitions=[0])
        settled_on = record_settling_threads(consumer)
        assert loop_stood_aside(hw.service)
        got: list[bytes] = []
        for i in range(20):
            producer.send_and_wait("q", b"m%d" % i)
            while len(got) <= i:
                got += [r.body for r in consumer.poll(timeout_ms=2000)]
        assert got == [b"m%d" % i for i in range(20)]
        assert settled_on and set(settled_on) == {threading.get_ident()}
    finally:
        hw.close()


def test_a_streaming_consumer_takes_its_pushes_on_its_own_thread(server):
    """A fetch stream's pushes are handled by the thread that polls, as it reads them: not
    handed over from the client's loop thread, which does not read for the stream at all."""
    hw = headwater.connect(server.address)
    try:
        hw.admin.create_queue("q", partitions=1)
        consumer = hw.consumer()  # streams over the network
        consumer.assign("q", partitions=[0])
        assert consumer.poll(timeout_ms=50) == []  # opens the stream
        handled_on: list[int] = []
        notify = consumer._streams._notify  # called by the stream's handler after each push
        consumer._streams._notify = lambda: (handled_on.append(threading.get_ident()), notify())
        assert loop_stood_aside(hw.service)
        other = headwater.connect(server.address)
        producer = other.producer(linger_ms=0)
        try:
            got: list[bytes] = []
            for i in range(20):
                producer.send_and_wait("q", b"m%d" % i)
                while len(got) <= i:
                    got += [r.body for r in consumer.poll(timeout_ms=2000)]
                time.sleep(0.01)  # the push waits in the socket: the loop must not take it
            assert got == [b"m%d" % i for i in range(20)]
        finally:
            other.close()
        assert handled_on and set(handled_on) == {threading.get_ident()}
    finally:
        hw.close()


def test_a_keyed_consumer_reads_its_answers_on_its_own_thread(server):
    """The same for a keyed group's member: its keyed fetches are answered on the polling
    thread. (One partition: with more, a fetch still waiting when poll() returns is read by
    the loop thread, as nobody else is reading then.)"""
    hw = headwater.connect(server.address)
    try:
        hw.admin.create_queue("q", partitions=1)
        producer = hw.producer(linger_ms=0, partitioner="key")
        member = hw.keyed_consumer("g", "q", member=0, size=1)
        settled_on = record_settling_threads(member)
        assert loop_stood_aside(hw.service)
        got: list[bytes] = []
        for i in range(20):
            producer.send_and_wait("q", b"m%d" % i, key=b"k%d" % (i % 3))
            while len(got) <= i:
                got += [r.body for r in member.poll(timeout_ms=2000)]
        assert sorted(got) == sorted(b"m%d" % i for i in range(20))
        assert settled_on and set(settled_on) == {threading.get_ident()}
    finally:
        hw.close()


def test_while_one_thread_leads_the_others_get_their_answers(remote):
    """A long poll leads; a blocking call from another thread is answered at once (the leader
    reads it), and an async produce's callback still runs on the loop's thread."""
    end = remote.describe_queue("q").partitions[0].end_offset
    results: list = []
    leader = threading.Thread(
        target=lambda: results.append(remote.fetch("q", 0, end, max_bytes=1 << 20, max_wait_ms=5000))
    )
    leader.start()
    assert wait_for(lambda: remote.transport._leader is not None)
    t0 = time.monotonic()
    assert remote.describe_queue("q").name == "q"
    assert time.monotonic() - t0 < 1.0
    callback_threads: list[str] = []
    fut = remote.produce_async("q", 0, encode_batch([b"hello"]))
    fut.add_done_callback(lambda f: callback_threads.append(threading.current_thread().name))
    assert fut.result(timeout=5).base_offset == end
    leader.join(5)
    assert not leader.is_alive()
    assert [len(r.batches) for r in results] == [1]  # the long poll ended with the message
    assert wait_for(lambda: callback_threads == ["headwater-client"])


def test_a_caller_that_found_another_leading_gets_its_answer_after_that_one_is_done(remote):
    """B's call starts while A leads, and its answer comes after A is done: the loop must
    read it (B waits on its sink, it does not lead)."""
    end = remote.describe_queue("q").partitions[0].end_offset
    took: dict[str, float] = {}

    def call(name: str, wait_ms: int) -> None:
        t0 = time.monotonic()
        remote.fetch("q", 0, end, max_bytes=1024, max_wait_ms=wait_ms)
        took[name] = time.monotonic() - t0

    a = threading.Thread(target=call, args=("a", 300))
    a.start()
    assert wait_for(lambda: remote.transport._leader is not None)
    b = threading.Thread(target=call, args=("b", 800))
    b.start()
    a.join(10)
    b.join(10)
    assert not b.is_alive() and 0.7 < took["b"] < 3, took


def test_pushes_a_caller_read_reach_the_loop_s_handler_before_those_the_loop_reads_later(server, monkeypatch):
    """A cluster's consumer has its stream's pushes handled on the client's loop, while
    other threads' blocking calls read the connection for their answers and hand what else
    they read to the loop. Here the loop is about to read the connection (its reader is due)
    when a caller reads push 1 first; the loop then reads push 2. The handler must get 1
    before 2: a push from behind the consumer's position looks like a log cut short, and
    the consumer would go back to the start (auto_offset_reset)."""
    from headwater.client.transport.reading import Reading

    armed, at_reader, go_on = threading.Event(), threading.Event(), threading.Event()
    readable = Reading._readable

    def slow_reader(self, link):  # the loop's reader, held up once (a busy loop)
        if armed.is_set() and self is svc.transport:
            armed.clear()
            at_reader.set()
            go_on.wait(10)
        readable(self, link)

    monkeypatch.setattr(Reading, "_readable", slow_reader)
    svc = RemoteService(server.address)
    sender = RemoteService(server.address)
    try:
        svc.create_queue("q", QueueConfig(partitions=1))
        got: list[int] = []
        sid, answer = svc.open_fetch_stream(
            "q", {0: 0}, lambda push: push and got.append(push.next_offset), credit_bytes=1 << 20, on_loop=True
        )
        assert answer.result(5) is None
        armed.set()
        sender.produce("q", 0, encode_batch([b"one"]))  # push 1: the loop's reader is due, and held
        assert at_reader.wait(5)
        svc.lead([concurrent.futures.Future()], 0.2)  # a caller reads push 1, for the loop to deliver
        sender.produce("q", 0, encode_batch([b"two"]))  # push 2, left in the socket for the loop
        time.sleep(0.2)
        go_on.set()
        wait_for(lambda: len(got) == 2, what="both pushes")
        assert got == [1, 2]
        svc.close_fetch_stream(sid)
    finally:
        go_on.set()
        svc.close()
        sender.close()


def test_polls_without_waiting_still_receive(server):
    """poll(timeout_ms=0) never blocks, yet reads the answers that came meanwhile."""
    hw = headwater.connect(server.address)
    try:
        hw.admin.create_queue("q", partitions=1)
        consumer = hw.consumer()
        consumer.assign("q", partitions=[0])
        assert consumer.poll(timeout_ms=0) == []
        hw.producer().send_and_wait("q", b"late")
        got: list = []
        deadline = time.monotonic() + 5
        while not got and time.monotonic() < deadline:
            got = consumer.poll(timeout_ms=0)
            time.sleep(0.001)
        assert [r.body for r in got] == [b"late"]
    finally:
        hw.close()


def test_a_connection_left_unread_is_checked_before_it_is_written_to(fake_broker):
    """After led calls the loop stops reading; a broker that closed the connection meanwhile
    is seen before the next request is written, which then goes to a new connection."""
    broker = fake_broker(lambda body: produced(7))
    svc = RemoteService(broker.address)
    try:
        assert loop_stood_aside(svc)
        broker.drop_connections()
        time.sleep(0.2)
        assert svc.produce("q", 0, encode_batch([b"x"])).base_offset == 7  # not retried: a new connection
        assert len(broker.conns) == 2
    finally:
        svc.close()


def test_a_connection_read_a_moment_ago_is_written_to_without_reading_it_again(fake_broker, monkeypatch):
    """The check above costs a recv() per request; a caller that read the socket within
    UNREAD_CHECK_S (a polling consumer, calls one after another) is spared it."""
    import headwater.client.transport.async_transport as transport

    broker = fake_broker(lambda body: produced(7))
    svc = RemoteService(broker.address)
    checks: list[int] = []
    check = svc.transport._check_unread_locked

    def counting(link, outcomes):
        checks.append(1)
        return check(link, outcomes)

    monkeypatch.setattr(svc.transport, "_check_unread_locked", counting)
    try:
        assert loop_stood_aside(svc)
        monkeypatch.setattr(transport, "UNREAD_CHECK_S", 30.0)
        checks.clear()
        for _ in range(20):
            svc.ping()
        assert checks == []
        monkeypatch.setattr(transport, "UNREAD_CHECK_S", 0.0)
        for _ in range(20):
            svc.ping()
        assert len(checks) == 20
    finally:
        svc.close()


def test_closing_the_client_ends_a_leading_poll_at_once(server):
    hw = headwater.connect(server.address)
    hw.admin.create_queue("q", partitions=1)
    consumer = hw.consumer()
    consumer.assign("q", partitions=[0])
    outcome: list = []

    def poll() -> None:
        try:
            outcome.append(consumer.poll(timeout_ms=10_000))
        except Exception as e:  # noqa: BLE001 - the test looks at it
            outcome.append(e)

    t = threading.Thread(target=poll)
    t.start()
    assert wait_for(lambda: hw.service.transport._leader is not None)
    t0 = time.monotonic()
    hw.close()
    t.join(5)
    assert not t.is_alive() and time.monotonic() - t0 < 2
    assert len(outcome) == 1 and isinstance(outcome[0], (UnavailableError, ClosedError, list))


def test_an_interrupt_from_another_thread_ends_a_lead_at_once(remote, monkeypatch):
    import headwater.client.transport.leading as leading

    monkeypatch.setattr(leading, "LEAD_SLICE_S", 30.0)  # only a poke can end the wait early
    end = remote.describe_queue("q").partitions[0].end_offset
    fetch = remote.fetch_async("q", 0, end, max_bytes=1024, max_wait_ms=20_000, lead=True)
    interrupt: concurrent.futures.Future = concurrent.futures.Future()
    threading.Timer(0.2, interrupt.set_result, (None,)).start()
    t0 = time.monotonic()
    remote.lead([fetch, interrupt], 20.0, interrupt=interrupt)
    assert interrupt.done() and not fetch.done()
    assert time.monotonic() - t0 < 5


def test_a_deadline_ends_a_leading_call_at_once(fake_broker, monkeypatch):
    import headwater.client.transport.leading as leading

    monkeypatch.setattr(leading, "LEAD_SLICE_S", 30.0)  # only a poke can end the wait early
    broker = fake_broker()  # answers pings only
    svc = RemoteService(broker.address, request_timeout_s=0.3)
    try:
        t0 = time.monotonic()
        with pytest.raises(UnavailableError, match="got no answer in 0.3 s"):
            svc.produce("q", 0, encode_batch([b"x"]))
        assert time.monotonic() - t0 < 5
    finally:
        svc.close()


@pytest.mark.parametrize(
    "address, expected",
    [
        ("broker-1:7070", ("broker-1", 7070)),
        ("7171", ("127.0.0.1", 7171)),  # a port alone: this machine
        ("[::1]:7070", ("::1", 7070)),
    ],
)
def test_addresses_that_parse(address, expected):
    assert parse_address(address) == expected


@pytest.mark.parametrize(
    "address, says",
    [
        ("localhost", "'localhost' has no port: write 'localhost:7070'"),
        ("[::1]", "'[::1]' has no port: write '[::1]:7070'"),
        ("::1", "an IPv6 address goes in brackets before the port, like '[::1]:7070'"),  # was host ':', port 1
        ("host:http", "the port must be a number"),
        ("host:70000", "the port must be from 1 to 65535"),
        ("", "a server address is 'host:port'"),
    ],
)
def test_addresses_that_do_not_parse_say_why(address, says):
    with pytest.raises(InvalidArgumentError, match=re.escape(says)):
        parse_address(address)


def test_a_server_that_is_not_a_broker_is_named_at_once(tmp_path):
    """Something else on the port (a web server, Redis): the first answer is not a handshake.
    That is said at once, with what it sent, and not retried for connect_timeout_s as if the
    broker were restarting."""
    from headwater.protocol import RemoteProtocolError

    listener = socket.create_server(("127.0.0.1", 0))
    address = f"127.0.0.1:{listener.getsockname()[1]}"

    def answer_like_http() -> None:
        while True:
            try:
                c, _ = listener.accept()
            except OSError:
                return
            with c:
                c.recv(100)
                c.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")

    threading.Thread(target=answer_like_http, daemon=True).start()
    try:
        t0 = time.monotonic()
        with pytest.raises(
            RemoteProtocolError,
            match=r"answered, but not as a Headwater broker \(its first bytes: "
            r"b'HTTP/1.1 400 Bad Request",
        ):
            RemoteService(address, connect_timeout_s=10)
        assert time.monotonic() - t0 < 5  # once, not retried until the timeout
    finally:
        listener.close()
