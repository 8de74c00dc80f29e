"""Attacks on the broker's resources leave a well-behaved client its speed (issue 30).

Each test starts a real broker process with its default settings, measures a well-behaved
client alone (the baseline: the median time of a 1 MB ``send_batch`` and the p99 of small
``send`` round trips), then runs one attack from the issue's fault probes and measures the
same client again while the attack goes on, sampling the broker's RSS all along:

- finding 1: 40 connections pipelining 40 FETCHes of 16 MiB each and never reading;
- finding 2: 5 connections announcing frames of ~66 MB and sending them at a byte a second;
- finding 3: 4 connections sending compression bombs (2.6 KB of zstd expanding to 66 MB,
  the expansion stated or hidden) one after another;
- finding 4: a client creating queues of 100,000 partitions until refused, then listing;
- finding 9: 50 connections trickling requests a byte a second after the handshake.

The bound on both figures is twice the baseline. On this 2-core machine the attacker, the
broker and the measured client share the cores, and a baseline under a millisecond is
within a scheduler slice of noise, so a figure may also exceed twice its baseline by up to
2 ms (the p99) or 10 ms (a 1 MB send). Measured here: p99 0.14-0.20 ms alone, 0.16-0.54 ms
under the attacks; a 1 MB send 0.8-1.1 ms alone, 0.9-1.4 ms under them. The RSS bound is
stated per attack from what the broker's settings let it hold. Speed is measured in bench/; these tests check
that an attack costs the others little, not how fast the broker is.
"""

from __future__ import annotations

import socket
import statistics
import struct
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass

import pytest

import headwater
from headwater.protocol import CLIENT, NEED_DATA, ApiKey, Connection, ErrorResponse, Handshake, Request
from headwater.protocol.frames import FrameType
from headwater.protocol.messages import FetchRequest, PingRequest, ProduceRequest
from tests.support.broker_process import BrokerProcess
from tests.support.frames import bomb_batch, raw

# make test runs these alone, after the rest: measures a client's latency against its own baseline
pytestmark = pytest.mark.serial

MIB = 1 << 20
P99_SLACK_S = 0.002
SEND_SLACK_S = 0.010
SMALL_SENDS = 2000
BIG_SENDS = 5


@dataclass
class Figures:
    send_1mb_s: float  # median time of a 1 MB send_batch
    p99_s: float  # p99 of a small send's round trip

    def __str__(self) -> str:
        return f"1 MB send {self.send_1mb_s * 1e3:.1f} ms, small send p99 {self.p99_s * 1e3:.2f} ms"


def measure(address: str) -> Figures:
    with headwater.connect(address, request_timeout_s=120) as hw:
        small = []
        for _ in range(SMALL_SENDS):
            t0 = time.perf_counter()
            hw.send("work", b"x" * 100)
            small.append(time.perf_counter() - t0)
        big = []
        for _ in range(BIG_SENDS):
            t0 = time.perf_counter()
            hw.send_batch("work", [b"z" * 1000] * 1000)
            big.append(time.perf_counter() - t0)
    small.sort()
    return Figures(statistics.median(big), small[int(len(small) * 0.99) - 1])


class RssSampler(threading.Thread):
    def __init__(self, broker: BrokerProcess) -> None:
        super().__init__(daemon=True)
        self.broker, self.stop = broker, threading.Event()
        self.base = self.peak = broker.rss_bytes()

    def run(self) -> None:
        while not self.stop.wait(0.05):
            self.peak = max(self.peak, self.broker.rss_bytes())


def handshaken(port: int) -> tuple[socket.socket, Connection]:
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    conn = Connection(CLIENT)
    s.sendall(conn.send(Handshake("attacker")))
    while True:
        conn.receive_data(s.recv(65536))
        ev = conn.next_event()
        if type(ev).__name__ == "HandshakeAccepted":
            return s, conn


@pytest.fixture
def broker(tmp_path):
    b = BrokerProcess(tmp_path / "data").start()
    with headwater.connect(b.address) as hw:
        hw.admin.create_queue("work", partitions=1)
    yield b
    b.kill()
    log = b.log.read_text(errors="replace")
    assert "Traceback" not in log, log[-3000:]


def under_attack(
    broker: BrokerProcess, attack: Callable[[], AbstractContextManager[None]], rss_growth_max: int
) -> None:
    """Baseline, then the attack, then the same client again; the bounds of the module doc."""
    measure(broker.address)  # warm up: the first connection, the first segment
    base = measure(broker.address)
    rss = RssSampler(broker)
    rss.start()
    with attack():
        hit = measure(broker.address)
        assert broker.alive()
    rss.stop.set()
    rss.join()
    grown = rss.peak - rss.base
    print(f"baseline: {base}\nattacked: {hit}\nbroker RSS {rss.base / MIB:.0f} -> peak {rss.peak / MIB:.0f} MiB")
    assert hit.send_1mb_s <= max(2 * base.send_1mb_s, base.send_1mb_s + SEND_SLACK_S), f"{hit} against {base}"
    assert hit.p99_s <= max(2 * base.p99_s, base.p99_s + P99_SLACK_S), f"{hit} against {base}"
    assert grown <= rss_growth_max, f"broker RSS reached {grown / MIB:.0f} MiB"


@contextmanager
def unread_fetches(broker: BrokerProcess) -> Iterator[None]:
    """Finding 1: 40 connections, each pipelining 40 FETCHes of 16 MiB, never reading."""
    socks = []
    try:
        for _ in range(40):
            s, conn = handshaken(broker.port)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.setblocking(False)
            socks.append(s)
            try:
                for _ in range(40):
                    s.send(conn.send(Request(conn.next_request_id(), FetchRequest("big", 0, 0, 16 * MIB))))
            except BlockingIOError:
                pass  # the broker stopped reading this one: as intended
        time.sleep(1)  # the answers are read from the log and wait in the broker
        yield
    finally:
        for s in socks:
            s.close()


@contextmanager
def trickled_frames(broker: BrokerProcess, connections: int, announced_bytes: int) -> Iterator[None]:
    """Findings 2 and 9: frames begun and sent on at a byte a second, from their own thread."""
    stop = threading.Event()
    head = raw(FrameType.REQUEST, ApiKey.PING, 1, PingRequest())[4:]
    socks = []
    for _ in range(connections):
        s, _conn = handshaken(broker.port)
        s.sendall(struct.pack("<I", announced_bytes - 4) + head[:8])
        socks.append(s)

    def trickle() -> None:
        while not stop.wait(1.0):
            for s in socks:
                try:
                    s.send(b"\0")
                except OSError:
                    pass  # cut off at its deadline: as intended

    t = threading.Thread(target=trickle, daemon=True)
    t.start()
    try:
        time.sleep(1)
        yield
    finally:
        stop.set()
        t.join()
        for s in socks:
            s.close()


@contextmanager
def compression_bombs(broker: BrokerProcess) -> Iterator[None]:
    """Finding 3: four connections, each sending a bomb as soon as the last is answered."""
    stop = threading.Event()
    # 66 MB fits in a batch (64 MiB) and is decoded, in full, before the message size is refused
    bombs = [bomb_batch(66_000_000, state_size=s) for s in (True, False)] + [bomb_batch(80 << 20, state_size=False)]
    assert all(len(b) < 8192 for b in bombs)
    sent = [0]

    def bomber(i: int) -> None:
        s, conn = handshaken(broker.port)
        with s:
            while not stop.is_set():
                s.sendall(conn.send(Request(conn.next_request_id(), ProduceRequest("work", 0, bombs[i % 3]))))
                ev = conn.next_event()
                while ev is NEED_DATA:
                    conn.receive_data(s.recv(65536))
                    ev = conn.next_event()
                assert type(ev) is ErrorResponse and not ev.retriable, ev
                sent[0] += 1

    threads = [threading.Thread(target=bomber, args=(i,), daemon=True) for i in range(4)]
    for t in threads:
        t.start()
    try:
        time.sleep(0.5)
        yield
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert sent[0] >= 8, "the bombs did not go off"


@contextmanager
def partition_flood(broker: BrokerProcess) -> Iterator[None]:
    """Finding 4: queues of 100,000 partitions until the broker refuses; every listing works."""
    refused = 0
    with headwater.connect(broker.address, request_timeout_s=120) as hw:
        for i in range(30):
            try:
                hw.admin.create_queue(f"flood{i}", partitions=100_000)
            except headwater.InvalidArgumentError as e:
                assert "partitions_max" in str(e)
                refused += 1
        assert refused >= 29
        try:
            hw.admin.create_queue("flood-small", partitions=99_000)
        except headwater.InvalidArgumentError:
            pass
        assert {q.name for q in hw.admin.list_queues()} >= {"work"}
        assert hw.status()
    yield


def test_answers_nobody_reads(broker):
    with headwater.connect(broker.address) as hw:
        hw.admin.create_queue("big", partitions=1, ttl_s=None)
        for _ in range(40):
            hw.send_batch("big", [b"y" * 100_000] * 10, partition=0)  # 40 MB to fetch
    # answers may hold half of bytes_in_flight_max (512 MiB by default): 256 MiB, and some room
    under_attack(broker, lambda: unread_fetches(broker), rss_growth_max=320 * MIB)


def test_frames_trickled_at_a_byte_a_second(broker):
    # a frame reserves the budget a step (1 MiB) ahead of the bytes it has sent, not its size
    under_attack(broker, lambda: trickled_frames(broker, 5, 66_000_000), rss_growth_max=32 * MIB)


def test_compression_bombs(broker):
    # a batch decompresses to what its messages may hold (about 1 MiB here), two at a time
    under_attack(broker, lambda: compression_bombs(broker), rss_growth_max=64 * MIB)


def test_a_flood_of_partitions(broker):
    # partitions_max (100,000) partitions in all, at well under 1 KiB each
    under_attack(broker, lambda: partition_flood(broker), rss_growth_max=128 * MIB)


def test_requests_trickled_after_the_handshake(broker):
    under_attack(broker, lambda: trickled_frames(broker, 50, 64), rss_growth_max=32 * MIB)
