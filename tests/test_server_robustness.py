"""Bad peers never hurt the broker or its other clients (a real broker process)."""

from __future__ import annotations

import resource
import socket
import struct
import time

import pytest

import headwater
from headwater.protocol import CLIENT, ApiKey, Connection, Handshake, Request
from headwater.protocol.messages import FetchRequest, PingRequest
from tests.support.broker_process import BrokerProcess


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = BrokerProcess(tmp_path_factory.mktemp("robust") / "data", "--set", "handshake_timeout_s=1").start()
    yield b
    if b.alive():
        assert b.terminate() == 0
    print(b.log.read_text()[-2000:])


def healthy(broker: BrokerProcess) -> None:
    """A well-behaved client can still do real work, quickly."""
    assert broker.alive()
    t0 = time.monotonic()
    with headwater.connect(broker.address) as hw:
        try:
            hw.admin.create_queue("health", partitions=1)
        except headwater.QueueExistsError:
            pass
        mid = hw.send("health", b"ok")
        assert hw.get(mid).body == b"ok"
    assert time.monotonic() - t0 < 3


def raw_conn(broker: BrokerProcess, handshake: bool = True) -> tuple[socket.socket, Connection]:
    s = socket.create_connection(("127.0.0.1", broker.port), timeout=5)
    conn = Connection(CLIENT)
    if handshake:
        s.sendall(conn.send(Handshake("bad-peer")))
        s.settimeout(5)
        while True:
            conn.receive_data(s.recv(65536))
            ev = conn.next_event()
            if ev is not None and type(ev).__name__ == "HandshakeAccepted":
                break
    return s, conn


def closed_by_peer(s: socket.socket, timeout_s: float = 5.0) -> bool:
    """True when the broker closes the connection within the timeout; closes ours too."""
    s.settimeout(timeout_s)
    try:
        while True:
            data = s.recv(65536)
            if not data:
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False
    finally:
        s.close()


@pytest.mark.parametrize(
    "junk",
    [
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        b"\x00" * 64,
        b"\xff\xff\xff\xff" + b"x" * 100,  # a frame claiming 4 GiB
        struct.pack("<I", 100) + b"\x01" * 100,  # right length, bad checksum
    ],
)
def test_garbage_before_handshake_is_refused(broker, junk):
    s = socket.create_connection(("127.0.0.1", broker.port), timeout=5)
    s.sendall(junk)
    assert closed_by_peer(s)
    healthy(broker)


def test_garbage_after_handshake_and_unknown_api(broker):
    s, conn = raw_conn(broker)
    s.sendall(b"\x10\x00\x00\x00" + b"\x00" * 16)  # a short frame with a wrong checksum
    assert closed_by_peer(s)
    from headwater.protocol import FrameType
    from tests.support.frames import raw

    s, conn = raw_conn(broker)
    s.sendall(raw(FrameType.REQUEST, 999, 1, PingRequest()))
    assert closed_by_peer(s)
    healthy(broker)


def test_truncated_frame_then_silence_is_closed(broker):
    s, conn = raw_conn(broker)
    frame = conn.send(Request(conn.next_request_id(), PingRequest()))
    s.sendall(frame[:7])
    s.shutdown(socket.SHUT_WR)
    assert closed_by_peer(s)
    healthy(broker)


def test_wrong_protocol_version(broker):
    import msgspec

    from headwater.protocol import FrameType
    from headwater.protocol.frames import encode_frame
    from headwater.protocol.messages import HandshakeBody

    s = socket.create_connection(("127.0.0.1", broker.port), timeout=5)
    head = msgspec.msgpack.encode(HandshakeBody("headwater", 7, 9, "future-client", 1 << 20))
    s.sendall(b"".join(encode_frame(FrameType.HANDSHAKE, 0, 0, head, [])))
    s.settimeout(5)
    reply = s.recv(65536)
    assert b"version" in reply  # an error frame that names the problem
    assert closed_by_peer(s)
    healthy(broker)


def test_client_that_never_sends_is_dropped(broker):
    s = socket.create_connection(("127.0.0.1", broker.port), timeout=5)
    t0 = time.monotonic()
    assert closed_by_peer(s, timeout_s=10)
    assert time.monotonic() - t0 < 5  # handshake_timeout_s=1 here
    healthy(broker)


def test_ten_thousand_idle_connections(broker):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 10_500:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 12_000), hard))
    hello = Connection(CLIENT).send(Handshake("idle-client"))
    socks = []
    try:
        for _ in range(10_000):  # connected, handshaken, then silent
            s = socket.create_connection(("127.0.0.1", broker.port), timeout=5)
            s.sendall(hello)
            socks.append(s)
        with headwater.connect(broker.address) as hw:
            deadline = time.monotonic() + 30
            while hw.status()["connections"] < 10_001 and time.monotonic() < deadline:
                time.sleep(0.2)
            assert hw.status()["connections"] >= 10_001
            healthy(broker)
            for _ in range(200):  # real work goes on while they idle (speed: see bench/)
                hw.send_batch("health", [b"x" * 100] * 100)
            assert sum(1 for _ in hw.scanner("health")) >= 20_000
    finally:
        for s in socks:
            s.close()
    healthy(broker)


def test_client_that_stops_reading_does_not_stall_others(broker):
    with headwater.connect(broker.address) as hw:
        hw.admin.create_queue("big", partitions=1, ttl_s=None)
        for _ in range(20):
            hw.send_batch("big", [b"y" * 1000] * 1000, partition=0)
    rss_before = broker.rss_bytes()
    s, conn = raw_conn(broker)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.setblocking(False)
    sent = 0
    try:
        for _ in range(2000):  # ask for ~1 MiB each, never read the answers
            data = conn.send(Request(conn.next_request_id(), FetchRequest("big", 0, 0, 1 << 20)))
            s.send(data)
            sent += 1
    except (BlockingIOError, ValueError, headwater.HeadwaterError):
        pass  # the broker stopped reading us: backpressure, as intended
    time.sleep(1)
    healthy(broker)
    grown = broker.rss_bytes() - rss_before
    assert grown < 400 * 1024 * 1024, f"broker grew {grown / 1e6:.0f} MB for one slow reader"
    s.close()
    healthy(broker)


def test_a_deeply_nested_body_is_a_protocol_error_logged_once(broker):
    """Issue 30, finding 6: a PING whose body nests 1,000 levels raised an uncaught
    RecursionError in the decoder: a full traceback in the log and a close without an error
    frame, for each such request (2,000 requests: 2,015 tracebacks, 1.7 MB of log)."""
    from headwater.protocol import ErrorResponse, FrameType
    from tests.support.frames import raw

    log_before = broker.log.stat().st_size
    for i in range(200):
        s, conn = raw_conn(broker)
        s.sendall(raw(FrameType.REQUEST, ApiKey.PING, 1, b"\x91" * 1000 + b"\x90"))
        s.settimeout(5)
        answer = None
        while answer is None:
            data = s.recv(65536)
            assert data, f"request {i}: closed without an error frame"
            conn.receive_data(data)
            answer = conn.next_event()
        assert type(answer) is ErrorResponse and "malformed" in answer.message
        assert closed_by_peer(s)
    healthy(broker)
    logged = broker.log.read_bytes()[log_before:].decode()
    assert "Traceback" not in logged
    assert logged.count("malformed") <= 2, logged[-2000:]


def test_a_frame_trickled_a_byte_at_a_time_is_cut_off_at_its_deadline(tmp_path):
    """Issue 30, finding 9: a request sent at 1 byte/s after the handshake kept its connection
    open for 45 s and counting, since every byte put the idle timeout off again. A frame
    begun must now be whole within frame_timeout_s; the peer hears why."""
    from headwater.protocol import ErrorResponse, FrameType
    from tests.support.frames import raw

    b = BrokerProcess(tmp_path / "data", "--set", "frame_timeout_s=1.5").start()
    try:
        s, conn = raw_conn(b)
        frame = raw(FrameType.REQUEST, ApiKey.PING, 1, PingRequest())
        t0 = time.monotonic()
        answer = None
        s.settimeout(0.2)
        for byte in frame[:-1]:  # never the last one
            s.sendall(bytes([byte]))
            try:
                data = s.recv(65536)
            except TimeoutError:
                continue
            if data:
                conn.receive_data(data)
                answer = conn.next_event()
            break
        assert type(answer) is ErrorResponse and "frame_timeout_s" in answer.message, answer
        assert 1.4 <= time.monotonic() - t0 < 10  # cut off at its deadline, not before
        assert closed_by_peer(s)
        healthy(b)
    finally:
        b.kill()


def test_answers_nobody_reads_leave_room_for_others_produces(tmp_path):
    """Issue 30, finding 1: 40 connections pipelining 16 MiB FETCHes and never reading their
    answers filled the server's byte budget with those answers; a well-behaved client's 1 MB
    send_batch then waited 28.6 s, until send_timeout_s cut the readers off. Answers may now
    hold at most half of the server's budget: a produce always finds room."""
    b = BrokerProcess(
        tmp_path / "data",
        "--set",
        "bytes_in_flight_max=67108864",  # 64 MiB, so a few peers fill it
        "--set",
        "connection_bytes_in_flight_max=33554432",
        "--set",
        "fetch_bytes_max=16777216",
        "--set",
        "send_timeout_s=60",
    ).start()
    socks = []
    try:
        with headwater.connect(b.address) as hw:
            hw.admin.create_queue("big", partitions=1, ttl_s=None)
            for _ in range(40):
                hw.send_batch("big", [b"y" * 100_000] * 10, partition=0)
        for _ in range(6):
            s, conn = raw_conn(b)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.setblocking(False)
            socks.append(s)
            try:
                for _ in range(40):  # never read
                    s.send(conn.send(Request(conn.next_request_id(), FetchRequest("big", 0, 0, 16 << 20))))
            except (BlockingIOError, ValueError, headwater.HeadwaterError):
                pass
        time.sleep(1)  # their answers are read from the log and wait in the broker
        with headwater.connect(b.address, request_timeout_s=20) as hw:
            hw.admin.create_queue("work", partitions=1)
            t0 = time.monotonic()
            hw.send_batch("work", [b"z" * 1000] * 1000)  # 1 MB
            waited = time.monotonic() - t0
        assert waited < 10, f"a 1 MB send waited {waited:.1f} s behind answers nobody reads"
    finally:
        for s in socks:
            s.close()
        b.kill()


def test_a_batch_that_expands_past_a_mebibyte_is_decoded_off_the_event_loop(tmp_path):
    """Issue 30, finding 3: a 2.6 KB zstd batch that expands to 66 MB was decoded inline, on
    the event loop; four connections sending them took a well-behaved client's median
    latency from 0.9 to 300 ms. An append whose payload says it expands past
    INLINE_DECODE_BYTES (or does not say) is decoded and appended in a decode thread while
    its connection waits, so every other connection goes on and its own produces stay in
    order; a small batch is still appended inline."""
    import threading

    from tests.support.server_thread import ServerThread

    srv = ServerThread(tmp_path / "data")
    threads: list[tuple[int, str]] = []
    real = srv.broker.produce_nowait

    def recording(queue, partition, batch):
        threads.append((len(batch), threading.current_thread().name))
        return real(queue, partition, batch)

    srv.broker.produce_nowait = recording
    try:
        with headwater.connect(srv.address) as hw:
            hw.admin.create_queue("q")
            p = hw.producer(compression="zstd", linger_ms=0)
            # a small batch, a bomb (one batch of 8 MB of zeros, a few hundred bytes compressed), a small one
            bomb = [bytes(1_000_000)] * 8
            before = p.send("q", b"before")
            ids = p.send_batch("q", bomb)
            after = p.send("q", b"after")
            p.flush()
            offsets = [before.result(timeout=30).offset, *(m.offset for m in ids), after.result(timeout=30).offset]
            assert offsets == list(range(10))  # the connection's produces stayed in order
            assert [r.body for r in hw.scanner("q")] == [b"before", *bomb, b"after"]
        loop_thread = srv.thread.name
        big = [name for size, name in threads if size < 100_000 and name.startswith("headwater-decode")]
        small = [name for size, name in threads if name == loop_thread]
        assert big, f"the expanding batch was not decoded off the loop: {threads}"
        assert small, f"small batches should stay on the loop: {threads}"
    finally:
        srv.stop()


def test_frames_trickled_slowly_do_not_hold_the_budget_others_need(tmp_path):
    """Issue 30, finding 2: five connections announcing big frames and sending them at a
    byte a second reserved the server's receive budget for their announced sizes; a
    well-behaved client's 1 MB send_batch waited until they were cut off (122 s then).
    A big frame now reserves the budget as its bytes arrive, a step ahead of them, so a
    trickler holds about one step, and the others' frames find room."""
    from headwater.protocol import FrameType
    from tests.support.frames import raw

    b = BrokerProcess(
        tmp_path / "data",
        "--set",
        "bytes_in_flight_max=67108864",  # 64 MiB: half of it (32 MiB) for frames being received
        "--set",
        "connection_bytes_in_flight_max=33554432",
        "--set",
        "frame_timeout_s=60",
    ).start()
    socks = []
    try:
        with headwater.connect(b.address) as hw:
            hw.admin.create_queue("work", partitions=1)
        head = raw(FrameType.REQUEST, ApiKey.PING, 1, PingRequest())[4:]
        for _ in range(5):  # two of them announce the whole receive budget
            s, _conn = raw_conn(b)
            s.sendall(struct.pack("<I", (16 << 20) - 4) + head)  # a 16 MiB frame; a few bytes of it sent
            socks.append(s)
        time.sleep(0.5)
        with headwater.connect(b.address, request_timeout_s=30) as hw:
            t0 = time.monotonic()
            hw.send_batch("work", [b"z" * 1000] * 1000)  # 1 MB: a big frame itself
            waited = time.monotonic() - t0
        assert waited < 5, f"a 1 MB send waited {waited:.1f} s behind frames trickled by others"
        healthy(b)
    finally:
        for s in socks:
            s.close()
        b.kill()
