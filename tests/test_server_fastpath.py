"""The server's inline serving: order, bounds and clean stops, seen from a raw socket."""

from __future__ import annotations

import socket
import time

import pytest

from headwater.model.batch import encode_batch
from headwater.model.config import QueueConfig
from headwater.protocol import (
    CLIENT,
    NEED_DATA,
    Connection,
    ErrorResponse,
    FrameType,
    Handshake,
    HandshakeAccepted,
    Request,
    Response,
)
from headwater.protocol.frames import FrameReader
from headwater.protocol.messages import (
    ApiKey,
    CreateQueueRequest,
    FetchRequest,
    PingRequest,
    ProduceRequest,
)
from tests.support.broker_process import BrokerProcess
from tests.support.server_thread import ServerThread


class InProcessServer(ServerThread):
    """A BrokerServer with its own settings on an event loop in a thread."""

    def __init__(self, path, **settings) -> None:
        super().__init__(path, server_settings=settings)


class RawClient:
    """A blocking socket speaking the protocol, pipelining as the test says."""

    def __init__(self, port: int, rcvbuf: int | None = None) -> None:
        self.sock = socket.socket()
        if rcvbuf is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(10)
        self.sock.connect(("127.0.0.1", port))
        self.conn = Connection(CLIENT)
        self.sock.sendall(self.conn.send(Handshake("fastpath-test")))
        assert isinstance(self.next_event(), HandshakeAccepted)

    def next_event(self):
        while (ev := self.conn.next_event()) is NEED_DATA:
            data = self.sock.recv(1 << 20)
            assert data, "the server closed the connection"
            self.conn.receive_data(data)
        return ev

    def send(self, body) -> int:
        rid = self.conn.next_request_id()
        self.sock.sendall(self.conn.send(Request(rid, body)))
        return rid

    def call(self, body):
        self.send(body)
        ev = self.next_event()
        assert isinstance(ev, Response), ev
        return ev.body

    def answers(self, n: int) -> dict[int, object]:
        out = {}
        while len(out) < n:
            ev = self.next_event()
            assert isinstance(ev, (Response, ErrorResponse)), ev
            out[ev.request_id] = ev
        return out

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def server(tmp_path):
    s = InProcessServer(tmp_path / "data")
    yield s
    s.stop()


def idempotent_batch(i: int, size: int) -> bytearray:
    """Batch number ``i`` of a producer whose batches all hold ``size`` messages."""
    return encode_batch([b"m%d" % i] * size, producer_id=77, producer_epoch=0, base_sequence=i * size)


@pytest.mark.parametrize("flush", ["async", "sync"])
def test_pipelined_produces_are_appended_in_send_order(server, flush):
    c = RawClient(server.port)
    c.call(CreateQueueRequest("q", QueueConfig(partitions=1, flush=flush)))
    n, size = 200, 3  # below requests_in_flight_max: all in flight at once
    rids = [c.send(ProduceRequest("q", 0, idempotent_batch(i, size))) for i in range(n)]
    got = c.answers(n)
    offsets = []
    for rid in rids:
        ev = got[rid]
        assert isinstance(ev, Response), ev  # an out-of-order sequence would be refused
        offsets.append(ev.body.base_offset)
    assert offsets == [i * size for i in range(n)]
    c.close()


def test_produces_fetches_and_pings_interleaved_keep_their_order(server):
    c = RawClient(server.port)
    c.call(CreateQueueRequest("q", QueueConfig(partitions=1)))
    sent = []
    for i in range(60):
        sent.append(("produce", i, c.send(ProduceRequest("q", 0, idempotent_batch(i, 1)))))
        sent.append(("fetch", i, c.send(FetchRequest("q", 0, i, 1 << 16))))
        sent.append(("ping", i, c.send(PingRequest())))
    got = c.answers(len(sent))
    for kind, i, rid in sent:
        body = got[rid].body
        if kind == "produce":
            assert body.base_offset == i
        elif kind == "fetch":  # the fetch follows its produce: it sees that message
            assert body.next_offset == i + 1
    c.close()


def test_long_poll_is_woken_by_a_produce_of_the_same_connection(server):
    c = RawClient(server.port)
    c.call(CreateQueueRequest("q", QueueConfig(partitions=1)))
    t0 = time.monotonic()
    fetch = c.send(FetchRequest("q", 0, 0, 1 << 16, max_wait_ms=5000))
    produce = c.send(ProduceRequest("q", 0, encode_batch([b"wake"])))
    got = c.answers(2)
    assert got[produce].body.base_offset == 0
    assert got[fetch].body.next_offset == 1
    assert time.monotonic() - t0 < 2
    c.close()


def test_a_peer_that_does_not_read_is_paused_not_buffered(tmp_path):
    s = InProcessServer(tmp_path / "data", write_buffer_bytes_max=16 * 1024, connection_bytes_in_flight_max=256 * 1024)
    try:
        c = RawClient(s.port, rcvbuf=4096)
        c.call(CreateQueueRequest("big", QueueConfig(partitions=1)))
        for _ in range(50):
            c.call(ProduceRequest("big", 0, encode_batch([b"y" * 1000] * 64)))
        # fetches of ~64 KiB and produces, pipelined, none of the answers read for now
        sent = []
        for i in range(120):
            sent.append(("fetch", c.send(FetchRequest("big", 0, 0, 64 * 1024))))
            sent.append(("produce", c.send(ProduceRequest("big", 0, encode_batch([b"z%d" % i])))))
        time.sleep(0.5)

        def held() -> tuple[int, int, int]:
            (st,) = s.server.connections
            return st.transport.get_write_buffer_size(), st.budget.used, s.server.budget.total.used

        buffered, conn_used, all_used = s.call(held)
        assert buffered < 16 * 1024 + 256 * 1024  # the bound, plus at most one fetch answer
        assert conn_used <= 256 * 1024 and all_used == conn_used
        got = c.answers(len(sent))  # reading again: the server goes on where it stopped
        produced = [got[rid].body.base_offset for kind, rid in sent if kind == "produce"]
        assert produced == list(range(50 * 64, 50 * 64 + 120))
        assert all(len(got[rid].body.batches) > 0 for kind, rid in sent if kind == "fetch")
        deadline = time.monotonic() + 2
        while s.call(lambda: s.server.budget.total.used) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert s.call(lambda: s.server.budget.total.used) == 0  # everything went out: nothing held
        c.close()
    finally:
        s.stop()


def test_pings_from_a_peer_that_never_reads_are_bounded(tmp_path):
    s = InProcessServer(tmp_path / "data", write_buffer_bytes_max=8 * 1024)
    try:
        c = RawClient(s.port, rcvbuf=4096)
        # inline answers leave nothing in flight, so any number may be pipelined; the frames
        # are built by hand (the client side would refuse more than 256 in flight)
        from tests.support.frames import raw

        frames = b"".join(raw(FrameType.REQUEST, ApiKey.PING, rid, PingRequest()) for rid in range(1, 20_001))
        c.sock.setblocking(False)
        sent = 0
        deadline = time.monotonic() + 3
        while sent < len(frames) and time.monotonic() < deadline:
            try:
                sent += c.sock.send(frames[sent:])
            except BlockingIOError:
                time.sleep(0.01)
        (buffered,) = s.call(lambda: [st.transport.get_write_buffer_size() for st in s.server.connections])
        assert buffered < 8 * 1024 + 512 * 1024  # the bound plus the answers of one read
        c.sock.setblocking(True)
        c.sock.settimeout(10)
        c.sock.sendall(frames[sent:])
        reader = FrameReader(1 << 20, lambda h: None)
        answers = 0
        while answers < 20_000:
            data = c.sock.recv(1 << 20)
            assert data
            reader.feed(data)
            while reader.next_frame() is not None:
                answers += 1
        c.close()
    finally:
        s.stop()


def test_idle_connection_is_closed(tmp_path):
    s = InProcessServer(tmp_path / "data", idle_timeout_s=0.5)
    try:
        c = RawClient(s.port)
        c.call(PingRequest())
        t0 = time.monotonic()
        assert c.sock.recv(100) == b""
        assert 0.3 < time.monotonic() - t0 < 3
        c.close()
    finally:
        s.stop()


def test_sigterm_with_clients_connected_stops_cleanly(tmp_path):
    b = BrokerProcess(tmp_path / "data").start()
    try:
        c = RawClient(b.port)
        c.call(CreateQueueRequest("q", QueueConfig(partitions=1)))
        parked = c.send(FetchRequest("q", 0, 0, 1 << 16, max_wait_ms=30_000))
        idle = RawClient(b.port)
        time.sleep(0.2)
        t0 = time.monotonic()
        assert b.terminate() == 0
        assert time.monotonic() - t0 < 5
        answer = c.answers(1)[parked]  # the parked long poll was answered before the close
        assert isinstance(answer, Response) and answer.body.batches == []
        for client in (c, idle):  # each hears why the connection ends: it may connect again
            bye = client.next_event()
            assert isinstance(bye, ErrorResponse) and bye.request_id == 0 and bye.code == 40
            assert "the broker is stopping" in bye.message
        c.close()
        idle.close()
    finally:
        if b.alive():
            b.kill()
    log = b.log.read_text()
    assert "ERROR" not in log and "Traceback" not in log, log[-3000:]
    assert "stopping: 2 connections, 1 requests waiting" in log and "stopped cleanly" in log


def test_parked_fetches_wake_on_append_and_leave_nothing_behind(server):
    """Long polls park without a task: an append answers them from the appending
    connection's turn, a deadline answers them empty, and a client that goes away while
    parked leaves no waiter behind."""
    c = RawClient(server.port)
    c.call(CreateQueueRequest("q", QueueConfig(partitions=1)))
    readers = [RawClient(server.port) for _ in range(3)]
    rids = [r.send(FetchRequest("q", 0, 0, 1 << 20, 0, None, 10_000)) for r in readers]
    timed = RawClient(server.port)
    timed.send(FetchRequest("q", 0, 0, 1 << 20, 0, None, 50))
    ev = timed.next_event()
    assert isinstance(ev, Response) and ev.body.batches == []  # its deadline: answered empty
    gone = RawClient(server.port)
    gone.send(FetchRequest("q", 0, 0, 1 << 20, 0, None, 10_000))
    deadline = time.monotonic() + 5
    while server.call(lambda: sum(len(v) for v in server.server._waiters._waiting.values())) < 4:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    gone.close()
    while server.call(lambda: sum(len(v) for v in server.server._waiters._waiting.values())) > 3:
        assert time.monotonic() < deadline, "a closed connection's parked fetch was not dropped"
        time.sleep(0.01)
    c.call(ProduceRequest("q", 0, encode_batch([b"hello"])))
    for r, rid in zip(readers, rids):
        ev = r.next_event()
        assert isinstance(ev, Response) and ev.request_id == rid
        assert len(ev.body.batches) == 1
    assert server.call(lambda: server.server._waiters._waiting) == {}


def test_a_parked_fetch_woken_while_the_budget_is_short_waits_for_it(tmp_path):
    s = InProcessServer(tmp_path / "data", connection_bytes_in_flight_max=4096)
    try:
        c = RawClient(s.port)
        c.call(CreateQueueRequest("q", QueueConfig(partitions=1)))
        r = RawClient(s.port)
        rid = r.send(FetchRequest("q", 0, 0, 1 << 20, 0, None, 10_000))
        deadline = time.monotonic() + 5
        while not (parked := s.call(lambda: [st for st in s.server.connections if st.parked])):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        reader = parked[0]
        s.call(lambda: reader.budget.charge(4096))  # the reader's connection budget, all taken
        c.call(ProduceRequest("q", 0, encode_batch([b"x" * 100])))
        time.sleep(0.1)
        assert s.call(lambda: len(reader.tasks)) == 1  # woken, it waits for budget in a task
        s.call(lambda: reader.budget.release(4096))
        ev = r.next_event()
        assert isinstance(ev, Response) and ev.request_id == rid and len(ev.body.batches) == 1
    finally:
        s.stop()


def _buffered_by_server(s) -> list[int]:
    return s.call(lambda: sorted(st.conn._reader.buffered_bytes for st in s.server.connections))


def test_big_frames_half_sent_hold_the_byte_budget_not_unbounded_memory(tmp_path):
    """Five peers each begin a 3 MiB produce and stop half way. The server reserves a big
    frame's budget a step (1 MiB) ahead of its bytes as they arrive: frames being received
    hold at most half of bytes_in_flight_max, so it reads as much as fits, and keeps the
    rest of their bodies in the kernel (it stopped reading them). Before, it buffered every
    body it was sent, without bound. Other clients go on meanwhile; when the peers finish,
    every frame is served."""
    mib = 1024 * 1024
    s = InProcessServer(tmp_path / "data", bytes_in_flight_max=8 * mib)
    try:
        healthy = RawClient(s.port)
        healthy.call(CreateQueueRequest("big", QueueConfig(partitions=1, message_bytes_max=4 * mib)))
        batch = encode_batch([b"x" * (3 * mib)])
        senders = [RawClient(s.port) for _ in range(5)]
        for c in senders:
            c.frame = frame = c.conn.send(Request(c.conn.next_request_id(), ProduceRequest("big", 0, batch)))
            half = len(frame) // 2 + mib // 2
            c.sock.setblocking(False)
            sent = 0
            deadline = time.monotonic() + 2
            while sent < half and time.monotonic() < deadline:  # what the kernel takes, not more
                try:
                    sent += c.sock.send(frame[sent:half])
                except BlockingIOError:
                    time.sleep(0.01)
            c.sent = sent
        time.sleep(0.5)
        buffered = _buffered_by_server(s)
        reserved = s.call(lambda: s.server.budget.receiving)
        # frames being received: at most half of the 8 MiB, but the oldest, which may always
        # take its next step (else frames holding parts of the share would wait on each other)
        assert mib < reserved <= 4 * mib + len(senders[0].frame)
        # what the server holds of them: what they reserved, and at most one read each beyond
        assert sum(buffered) <= reserved + len(senders) * 256 * 1024, (buffered, reserved)
        t0 = time.monotonic()
        healthy.call(ProduceRequest("big", 0, encode_batch([b"small"])))  # others are served meanwhile
        healthy.call(PingRequest())
        assert time.monotonic() - t0 < 1
        for c in senders:
            c.sock.setblocking(True)
            c.sock.sendall(c.frame[c.sent :])
        offsets = sorted(c.answers(1).popitem()[1].body.base_offset for c in senders)
        assert offsets == [1, 2, 3, 4, 5]
        assert s.call(lambda: (s.server.budget.receiving, s.server.budget.total.used)) == (0, 0)
        for c in [healthy, *senders]:
            c.close()
    finally:
        s.stop()


def _a_client_and_a_hog(port: int) -> tuple[RawClient, RawClient]:
    """A client that filled queue q (40 batches of 60 kB), and a peer with a tiny receive
    buffer that asked for all of it 16 times over and reads nothing: the kernel's buffers
    take the first few answers, the rest wait in the server."""
    healthy = RawClient(port)
    healthy.call(CreateQueueRequest("q", QueueConfig(partitions=1)))
    for _ in range(40):
        healthy.call(ProduceRequest("q", 0, encode_batch([b"y" * 60_000])))
    hog = RawClient(port, rcvbuf=4096)
    for _ in range(16):
        hog.send(FetchRequest("q", 0, 0, 1024 * 1024))
    return healthy, hog


def test_a_fetch_short_of_memory_waits_alone_and_requests_behind_it_are_answered(tmp_path):
    """A peer that reads none of its answers holds all the server budget answers may take
    (half of it: the rest stays for requests). Another client's fetch then waits for memory
    in a task of its own (and gets an empty answer after a second); a PING pipelined behind
    it is answered at once. Before, the fetch blocked its whole connection until the budget
    came back (minutes: until the idle timeout)."""
    s = InProcessServer(tmp_path / "data", bytes_in_flight_max=1024 * 1024, write_buffer_bytes_max=8 * 1024)
    try:
        healthy, hog = _a_client_and_a_hog(s.port)
        deadline = time.monotonic() + 3
        answers = s.server.budget.answers
        while s.call(lambda: answers.used) < answers.limit and time.monotonic() < deadline:
            time.sleep(0.02)
        assert s.call(lambda: answers.used) >= answers.limit == 512 * 1024
        t0 = time.monotonic()
        fetch = healthy.send(FetchRequest("q", 0, 0, 1024 * 1024))
        ping = healthy.send(PingRequest())
        first = healthy.next_event()
        assert first.request_id == ping and time.monotonic() - t0 < 0.5
        answer = healthy.next_event()
        assert answer.request_id == fetch and answer.body.batches == [] and answer.body.next_offset == 0
        assert 0.9 < time.monotonic() - t0 < 3
        healthy.close()
        hog.close()
    finally:
        s.stop()


def test_a_peer_that_takes_none_of_its_answers_is_cut_off_after_send_timeout_s(tmp_path, caplog):
    s = InProcessServer(tmp_path / "data", write_buffer_bytes_max=8 * 1024, send_timeout_s=0.5)
    try:
        with caplog.at_level("WARNING", logger="headwater.server"):
            healthy, hog = _a_client_and_a_hog(s.port)
            deadline = time.monotonic() + 5
            while s.call(lambda: len(s.server.connections)) > 1 and time.monotonic() < deadline:
                time.sleep(0.05)
        assert s.call(lambda: (len(s.server.connections), s.server.budget.total.used)) == (1, 0)
        assert any("took none of the" in r.getMessage() and "send_timeout_s" in r.getMessage() for r in caplog.records)
        healthy.call(PingRequest())
        healthy.close()
    finally:
        s.stop()


def test_connections_over_the_limit_hear_why_and_are_logged_once(tmp_path, caplog):
    from headwater.errors import UnavailableError

    s = InProcessServer(tmp_path / "data", connections_max=2)
    try:
        kept = [RawClient(s.port) for _ in range(2)]
        with caplog.at_level("WARNING", logger="headwater.server"):
            for _ in range(30):
                sock = socket.create_connection(("127.0.0.1", s.port), timeout=5)
                conn = Connection(CLIENT)
                sock.sendall(conn.send(Handshake("one-too-many")))
                while (ev := conn.next_event()) is NEED_DATA:
                    data = sock.recv(65536)
                    assert data, "closed without a word"
                    conn.receive_data(data)
                assert isinstance(ev, ErrorResponse) and ev.request_id == 0
                assert isinstance(ev.exception(), UnavailableError)
                assert "connections_max" in ev.message and "try again later" in ev.message
                sock.close()
        refusals = [r for r in caplog.records if "refusing" in r.getMessage()]
        assert len(refusals) == 1  # not one line per attempt
        for c in kept:
            c.close()
    finally:
        s.stop()


def test_tasks_cut_off_before_they_start_leave_no_warning(tmp_path):
    """A connection closed for too many requests in flight cancels tasks that never ran:
    their work is closed, not reported as a coroutine never awaited."""
    import gc
    import warnings

    from tests.support.frames import raw

    s = InProcessServer(tmp_path / "data")
    try:
        c = RawClient(s.port)
        from headwater.protocol.messages import ListQueuesRequest

        c.call(CreateQueueRequest("q", QueueConfig(partitions=1)))
        # pings (answered inline), long polls (parked, no task), then list_queues (a task each):
        # the 257th request in flight comes in the same turn of 64 as the last tasks, which
        # are cancelled before their first step
        frames = b"".join(
            [raw(FrameType.REQUEST, ApiKey.PING, rid, PingRequest()) for rid in range(100, 110)]
            + [
                raw(FrameType.REQUEST, ApiKey.FETCH, rid, FetchRequest("q", 0, 0, 1024, max_wait_ms=10_000))
                for rid in range(200, 450)
            ]
            + [raw(FrameType.REQUEST, ApiKey.LIST_QUEUES, rid, ListQueuesRequest()) for rid in range(500, 520)]
        )
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            c.sock.sendall(frames)
            assert closed_by_server(c.sock)
            s.call(gc.collect)
            gc.collect()
        assert not [w for w in caught if "never awaited" in str(w.message)]
    finally:
        s.stop()


def closed_by_server(sock: socket.socket, timeout_s: float = 5.0) -> bool:
    sock.settimeout(timeout_s)
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
    return True
