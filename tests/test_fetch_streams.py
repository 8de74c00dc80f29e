"""Fetch streams: the broker pushes a consumer's partitions as they grow (FETCH_STREAM,
STREAM_CREDIT, CLOSE_STREAM; docs/protocol.md 7.5.5), and the consumer that reads them."""

from __future__ import annotations

import concurrent.futures
import threading
import time

import pytest

import headwater
from headwater.client.transport.remote import RemoteService
from headwater.errors import (
    InvalidArgumentError,
    PartitionOutOfRangeError,
    QueueNotFoundError,
    SubscriberNotFoundError,
    UnavailableError,
)
from headwater.model.batch import encode_batch
from headwater.model.config import QueueConfig
from headwater.model.service import PushStreamSpec
from headwater.protocol import messages as m
from tests.support.broker_process import BrokerProcess, Restart, free_port
from tests.support.server_thread import ServerThread
from tests.support.waiting import wait_for


class Pushes:
    """A stream handler that keeps what it gets, from any thread."""

    def __init__(self) -> None:
        self.got: list = []
        self.lock = threading.Lock()

    def __call__(self, push) -> None:
        with self.lock:
            self.got.append(push)

    def bodies(self, partition: int | None = None) -> list[bytes]:
        from headwater.client.core.lookups import decode_stored

        out = []
        with self.lock:
            pushes = list(self.got)
        for p in pushes:
            if p is None or p.ended or (partition is not None and p.partition != partition):
                continue
            for b in p.batches:
                out += [r.body for r in decode_stored(b, "q")]
        return out


@pytest.fixture
def remote(server):
    svc = RemoteService(server.address)
    svc.create_queue("q", QueueConfig(partitions=2))
    yield svc
    svc.close()


@pytest.fixture
def net(server):
    """A network client of ``server``."""
    client = headwater.connect(server.address)
    yield client
    client.close()


def reading(svc: RemoteService, cond, what: str):
    """``wait_for(cond)`` while this thread reads the connection: a fetch stream's pushes
    are read by the thread that polls (the client's loop does not read for them)."""
    never: concurrent.futures.Future = concurrent.futures.Future()
    return wait_for(lambda: (svc.lead([never], 0.02), cond())[1], what=what)


def open_stream(svc: RemoteService, queue: str, positions: dict[int, int], handler, **kw) -> int:
    """Open a fetch stream and wait for the broker's answer; its id."""
    sid, answer = svc.open_fetch_stream(queue, positions, handler, **kw)
    assert answer.result(5) is None
    return sid


def produce(svc: RemoteService, partition: int, *bodies: bytes) -> None:
    svc.produce("q", partition, encode_batch(list(bodies)))


def test_pushes_start_at_the_positions_given_and_follow_appends(remote):
    produce(remote, 0, b"a", b"b", b"c")
    produce(remote, 1, b"x")
    pushes = Pushes()
    sid = open_stream(remote, "q", {0: 1, 1: 0}, pushes, credit_bytes=1 << 20)
    # a batch may begin before the position: the client skips what is before it
    reading(remote, lambda: {p.partition for p in pushes.got} == {0, 1}, what="the first pushes")
    assert all(p.stream_id == sid for p in pushes.got)
    assert [p.next_offset for p in pushes.got if p.partition == 0] == [3]
    produce(remote, 0, b"d")
    produce(remote, 1, b"y", b"z")
    reading(remote, lambda: pushes.bodies(1) == [b"x", b"y", b"z"], what="the pushes after the appends")
    assert pushes.bodies(0)[-1] == b"d"
    last = [p for p in pushes.got if p.partition == 1][-1]
    assert (last.next_offset, last.start_offset, last.end_offset) == (3, 0, 3)


def test_credit_bounds_what_is_pushed_and_more_credit_resumes(remote):
    pushes = Pushes()
    sid = open_stream(remote, "q", {0: 0}, pushes, credit_bytes=1)
    for i in range(5):
        produce(remote, 0, b"m%d" % i)
    reading(remote, lambda: pushes.got, what="the first push")
    remote.lead([concurrent.futures.Future()], 0.2)
    assert pushes.bodies() == [b"m0"]  # one batch overshoots the credit, then nothing
    remote.credit_fetch_stream(sid, 1 << 20).result(5)
    reading(remote, lambda: pushes.bodies() == [b"m%d" % i for i in range(5)], what="the rest, once credited")


def test_a_closed_stream_pushes_no_more(server, remote):
    pushes = Pushes()
    sid = open_stream(remote, "q", {0: 0}, pushes, credit_bytes=1 << 20)
    produce(remote, 0, b"one")
    reading(remote, lambda: pushes.bodies() == [b"one"], what="a push")
    remote.close_fetch_stream(sid)  # without waiting
    wait_for(
        lambda: server.call(lambda: server.server._streams.stats()["fetch_streams"]) == 0, what="the stream to close"
    )
    with pytest.raises(SubscriberNotFoundError, match="no fetch stream"):
        remote.credit_fetch_stream(sid, 10).result(5)
    produce(remote, 0, b"two")
    remote.lead([concurrent.futures.Future()], 0.2)
    assert pushes.bodies() == [b"one"]


@pytest.mark.parametrize(
    "body, error, match",
    [
        (m.FetchStreamRequest(7, "nope", {0: 0}, 100), QueueNotFoundError, "nope"),
        (m.FetchStreamRequest(7, "q", {5: 0}, 100), PartitionOutOfRangeError, "not 5"),
        (m.FetchStreamRequest(7, "q", {0: 0}, 0), InvalidArgumentError, "needs some credit"),
        (m.FetchStreamRequest(7, "q", {}, 100), InvalidArgumentError, "at least one partition"),
        (m.FetchStreamRequest(7, "q", {0: -1}, 100), InvalidArgumentError, "offsets are >= 0"),
        (m.StreamCreditRequest(99, 100), SubscriberNotFoundError, "no fetch stream 99"),
    ],
)
def test_bad_requests_are_refused_and_the_connection_keeps_serving(remote, body, error, match):
    with pytest.raises(error, match=match):
        remote._call(body)  # a stream request: never sent again (its spec)
    assert remote._call(m.CloseStreamRequest(12345)) is None  # closing what is not open is fine
    assert remote.describe_queue("q").name == "q"


def test_a_stream_id_in_use_is_refused(remote):
    sid = open_stream(remote, "q", {0: 0}, Pushes(), credit_bytes=100)
    with pytest.raises(InvalidArgumentError, match=f"stream {sid} is already open"):
        remote._call(m.FetchStreamRequest(sid, "q", {1: 0}, 100))


def test_stream_ids_are_unique_among_subscriptions_and_fetch_streams(remote):
    remote.add_subscriber("q", "audit")
    sub_id, _ = remote.open_push_stream(PushStreamSpec("q", "audit", 10, 1000), Pushes())
    with pytest.raises(InvalidArgumentError, match=f"stream {sub_id} is already open"):
        remote._call(m.FetchStreamRequest(sub_id, "q", {0: 0}, 100))
    sid = open_stream(remote, "q", {0: 0}, Pushes(), credit_bytes=100)
    with pytest.raises(InvalidArgumentError, match=f"stream {sid} is already open"):
        remote._call(m.SubscribeRequest(sid, "q", "other", 10, 100))


def test_deleting_the_queue_ends_its_streams(remote):
    pushes = Pushes()
    open_stream(remote, "q", {0: 0}, pushes, credit_bytes=1 << 20)
    remote.delete_queue("q")
    [last] = reading(remote, lambda: [p for p in pushes.got if p is not None and p.ended], what="the last push")
    assert last.ended_code == QueueNotFoundError.code and "q" in last.ended


def test_stopping_the_broker_ends_streams_with_a_retriable_reason(tmp_path, clock):
    server = ServerThread(tmp_path / "data", clock)
    svc = RemoteService(server.address)
    try:
        svc.create_queue("q", QueueConfig(partitions=1))
        pushes = Pushes()
        open_stream(svc, "q", {0: 0}, pushes, credit_bytes=1 << 20)
        server.stop()
        reading(svc, lambda: None in pushes.got, what="the connection's end")
        [last] = [p for p in pushes.got if p is not None and p.ended]
        assert last.ended_code == UnavailableError.code and "stopping" in last.ended
    finally:
        svc.close()


def test_a_peer_that_stops_reading_holds_about_one_push_on_the_broker(server, remote):
    import socket

    from headwater.protocol import CLIENT, NEED_DATA, Connection, Handshake, Request

    sock = socket.create_connection(("127.0.0.1", server.port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    try:
        conn = Connection(CLIENT)
        sock.sendall(conn.send(Handshake("silent")))
        while conn.next_event() is NEED_DATA:
            conn.receive_data(sock.recv(65536))
        sock.sendall(
            conn.send(Request(conn.next_request_id(), m.FetchStreamRequest(1, "q", {0: 0}, 1 << 30, 0, 64 * 1024)))
        )
        for _ in range(40):  # 40 x 256 KiB, never read
            produce(remote, 0, *[bytes(1024)] * 256)

        def buffered() -> int:
            return max(c.transport.get_write_buffer_size() for c in server.server.connections)

        time.sleep(0.3)
        assert buffered() < 2 << 20  # not the 10 MiB the credit allows
        assert remote.describe_queue("q").partitions[0].end_offset == 40 * 256  # others are served
    finally:
        sock.close()


# the consumer ---------------------------------------------------------------------------


def poll_until(consumer, n: int, timeout_s: float = 10.0) -> list[bytes]:
    got: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < n and time.monotonic() < deadline:
        got += [r.body for r in consumer.poll(timeout_ms=200)]
    return got


def test_a_streaming_consumer_reads_seeks_and_changes_its_assignment(net):
    net.admin.create_queue("q", partitions=2)
    net.admin.create_queue("other", partitions=1)
    net.send_batch("q", [b"a0", b"a1"], partition=0)
    net.send_batch("q", [b"b0"], partition=1)
    c = net.consumer(group="g")
    assert c._streams is not None  # over the network it streams
    c.assign("q")
    assert sorted(poll_until(c, 3)) == [b"a0", b"a1", b"b0"]
    net.send_batch("q", [b"a2"], partition=0)
    assert poll_until(c, 1) == [b"a2"]
    c.seek("q", 0, 1)
    assert poll_until(c, 2) == [b"a1", b"a2"]
    assert c.position("q", 0) == 3
    c.commit()
    assert net.service.fetch_offsets("g", "q") == {0: 3, 1: 1}
    c.unassign("q")
    c.assign("other")
    net.send_batch("q", [b"not mine"], partition=0)
    net.send_batch("other", [b"o0"], partition=0)
    assert poll_until(c, 1) == [b"o0"]
    assert c.poll(timeout_ms=100) == []
    c.close()


def test_a_seek_while_opening_and_a_refused_opening(server, net):
    """poll() sends FETCH_STREAM and takes the answer on a later turn: a seek right after the
    first poll closes the stream, perhaps still opening (one stream stays on the broker), and
    a stream the broker refuses raises its reason from poll(). (That a poll does not wait for
    the opening is timed in tests/test_restarts.py, with the broker away.)"""

    def open_streams() -> int:
        return server.call(lambda: server.server._streams.stats()["fetch_streams"])

    net.admin.create_queue("q", partitions=1)
    net.send_batch("q", [b"a", b"b"], partition=0)
    c = net.consumer()
    c.assign("q")
    c.poll(timeout_ms=0)  # opens the stream without waiting (on a quick machine a push may come with it)
    c.seek("q", 0, 1)  # closes the stream (perhaps still opening); the next poll opens another
    assert poll_until(c, 1) == [b"b"]
    wait_for(lambda: open_streams() == 1, what="one stream on the broker")
    net.admin.create_queue("gone", partitions=1)
    d = net.consumer()
    d.assign("gone")
    net.admin.delete_queue("gone")
    with pytest.raises(QueueNotFoundError, match="gone"):
        poll_until(d, 1)
    assert poll_until(c, 0) == [] and c.poll(timeout_ms=0) == []  # the other consumer reads on
    net.send_batch("q", [b"c"], partition=0)
    assert poll_until(c, 1) == [b"c"]
    c.close()
    d.close()


def test_a_small_window_still_delivers_everything_in_order(net, tmp_path):
    net.admin.create_queue("q", partitions=1)
    c = net.consumer(stream_window_bytes=2000, fetch_bytes=500)  # the window, set as users set it
    assert c._streams is not None and c._streams.window_bytes == 2000
    for bad in (0, -1, 1.5, "4MiB"):  # refused embedded as over the network
        with headwater.open(tmp_path / "embedded") as hw:
            for client in (net, hw):
                with pytest.raises(InvalidArgumentError, match="stream_window_bytes must be a positive int"):
                    client.consumer(stream_window_bytes=bad)
    c.assign("q")
    sent = [b"%05d" % i + bytes(100) for i in range(2000)]
    p = net.producer(linger_ms=1)
    for body in sent:
        p.send("q", body)
    p.flush()
    assert poll_until(c, len(sent), timeout_s=30) == sent


def test_a_streaming_consumer_with_tags_gets_only_those(net):
    net.admin.create_queue("q", partitions=1)
    c = net.consumer(tags=["keep"])
    c.assign("q")
    assert c.poll(timeout_ms=50) == []
    p = net.producer(linger_ms=0)
    for i in range(10):
        p.send("q", headwater.Message(b"%d" % i, tag="keep" if i % 2 else "drop"))
    p.flush()
    assert poll_until(c, 5) == [b"1", b"3", b"5", b"7", b"9"]
    assert c.position("q", 0) == 10


@pytest.mark.parametrize("stop", ["terminate", "kill"])
def test_a_streaming_consumer_goes_on_across_a_broker_restart(tmp_path, stop):
    """The broker restarts while a consumer polls: its polls open the stream again and go
    on, none of them failing (Kafka's consumer, too, rides through a broker's restart)."""
    broker = BrokerProcess(tmp_path / "data", port=free_port()).start()
    restart = Restart(broker, stop)
    try:
        hw = headwater.connect(broker.address, request_timeout_s=5)
        hw.admin.create_queue("q", partitions=1)
        hw.send_batch("q", [b"before"], partition=0)
        c = hw.consumer()
        c.assign("q")
        assert poll_until(c, 1) == [b"before"]
        restart.start()
        got: list[bytes] = []
        deadline = time.monotonic() + 30
        while not (got and restart.done.is_set()) and time.monotonic() < deadline:
            got += [r.body for r in c.poll(timeout_ms=200)]  # no poll may fail
        assert restart.error is None and got == [b"after"]
        hw.close()
    finally:
        restart.join(30)
        restart.broker.kill()


def test_the_asyncio_streaming_consumer_goes_on_across_a_broker_restart(tmp_path):
    import asyncio

    import headwater.aio

    broker = BrokerProcess(tmp_path / "data", port=free_port()).start()
    restart = Restart(broker, "terminate")

    async def main() -> None:
        hw = await headwater.aio.connect(broker.address, request_timeout_s=5)
        try:
            await hw.admin.create_queue("q", partitions=1)
            await hw.send_batch("q", [b"before"], partition=0)
            c = hw.consumer()
            await c.assign("q")
            assert [r.body for r in await c.poll(timeout_ms=5000)] == [b"before"]
            restart.start()
            got: list[bytes] = []
            deadline = time.monotonic() + 30
            while not (got and restart.done.is_set()) and time.monotonic() < deadline:
                got += [r.body for r in await c.poll(timeout_ms=200)]
            assert restart.error is None and got == [b"after"]
        finally:
            await hw.close()

    try:
        asyncio.run(main())
    finally:
        restart.join(30)
        restart.broker.kill()


def test_a_consumer_can_still_fetch_instead(server, net):
    net.admin.create_queue("q", partitions=1)
    net.send_batch("q", [b"x"], partition=0)
    c = net.consumer(stream=False)
    c.assign("q")
    assert c._streams is None and poll_until(c, 1) == [b"x"]
    assert server.call(lambda: server.server._streams.stats()["fetch_streams"]) == 0


def test_a_streaming_consumer_waiting_behind_another_reader_gets_its_pushes_promptly(server, net):
    """Another thread reads the connection (its blocking call leads) when the consumer's
    poll begins: once that call is done, the consumer takes the reading over, rather than
    its pushes waiting in the socket until its poll times out."""
    other = headwater.connect(server.address)
    try:
        net.admin.create_queue("q", partitions=1)
        net.admin.create_queue("empty", partitions=1)
        c = net.consumer()
        c.assign("q")
        assert c.poll(timeout_ms=50) == []  # opens the stream
        for i in range(3):
            # a long poll on an empty queue: this thread reads the connection for 300 ms
            reader = threading.Thread(
                target=net.service.fetch, args=("empty", 0, 0), kwargs=dict(max_bytes=1000, max_wait_ms=300)
            )
            reader.start()
            wait_for(lambda: net.service.transport._leader is not None, what="the other thread to read")
            threading.Timer(0.5, other.send_batch, args=("q", [b"%d" % i]), kwargs=dict(partition=0)).start()
            t = time.monotonic()
            got = c.poll(timeout_ms=5000)
            assert [r.body for r in got] == [b"%d" % i]
            assert time.monotonic() - t < 2.0  # not the poll's whole 5 s
            reader.join()
    finally:
        other.close()


# the asyncio consumer ------------------------------------------------------------------------


def test_the_asyncio_consumer_streams_too(server):
    import asyncio

    import headwater.aio

    async def apoll_until(c, n: int) -> list[bytes]:
        got: list[bytes] = []
        deadline = time.monotonic() + 10
        while len(got) < n and time.monotonic() < deadline:
            got += [r.body for r in await c.poll(timeout_ms=200)]
        return got

    def open_streams() -> int:
        return server.call(lambda: server.server._streams.stats()["fetch_streams"])

    async def main() -> None:
        hw = await headwater.aio.connect(server.address)
        try:
            await hw.admin.create_queue("q", partitions=2)
            await hw.send_batch("q", [b"a0", b"a1"], partition=0)
            c = hw.consumer(group="g", tags=None)
            assert c._streams is not None
            await c.assign("q")
            assert await apoll_until(c, 2) == [b"a0", b"a1"]
            assert open_streams() == 1
            p = hw.producer(linger_ms=0)
            t = time.monotonic()
            await p.send_and_wait("q", b"b0", partition=1)
            assert await apoll_until(c, 1) == [b"b0"]
            assert time.monotonic() - t < 2
            c.seek("q", 0, 1)
            assert await apoll_until(c, 1) == [b"a1"]
            assert c.position("q", 0) == 2 and c.position("q", 1) == 1
            await c.commit()
            await c.close()
            await asyncio.sleep(0.1)
            assert open_streams() == 0  # closing the consumer closed its stream
            f = hw.consumer(stream=False)
            assert f._streams is None
            await f.assign("q")
            assert sorted(await apoll_until(f, 3)) == [b"a0", b"a1", b"b0"]
            await f.close()
        finally:
            await hw.close()

    asyncio.run(main())
