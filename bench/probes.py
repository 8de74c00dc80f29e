"""Small probes behind the explanations in docs/benchmarks.md: where a message's CPU goes.

Run ``python -m bench.probes PROBE`` from the repository root; each prints its figures:

- ``codec``: in one process, without sockets, the protocol work of one consumer round trip
  (a FETCH encoded by the client, parsed and answered by the server, the answer parsed and
  its record decoded by the client) and the store's work for one message (an append of a
  one-message batch, a fetch of it, an empty fetch at the end of the log); µs each.
- ``ping``: a ``headwater serve`` subprocess answering PINGs from a raw client, one at a
  time every 0.4 ms, and a bare uvloop echo server (:func:`echo_server`) answering the same
  bytes, alternately, twice each: the round trip (p50, p99), the server's CPU per request and
  answer (/proc), and its voluntary and involuntary context switches per request; so the
  fixed cost of a request in the broker on this machine, beside the least an event loop in
  Python pays.
- ``send``: the time of one loopback TCP ``send()`` of 1 byte to a process blocked in
  ``recv()``, every 0.5 ms: what the kernel charges the sender to hand over and wake.
- ``disk``: the machine check's write bandwidth (1 GiB, one fdatasync), three times in a
  row, then 4 GiB in 8 MiB writes with an fdatasync every 256 MiB, each window timed, twice:
  leaving the page cache to the kernel, then dropping the fsynced bytes more than 1 GiB
  behind from it (what the store's ``page_cache_keep_bytes`` does): how far a burst and a
  sustained write differ on this machine right now, and how much of that is the memory
  the page cache takes rather than the disk.
- ``produce``: three back-to-back runs of the network benchmark's 1 KiB producer workload
  (batches of 500, 3 s) against one broker (async flush).
- ``memory``: a broker with the defaults and one with ``page_cache_keep_bytes=0`` and
  ``allocator_cache_bytes=0`` (the page cache and glibc's allocator left as they are),
  alternately, three times each: a 1 KiB x 500 producer for 10 s against each, its MB/s, the
  broker's user and system CPU seconds per GB written, its peak resident memory, and how much
  the machine's page cache grew meanwhile.
- ``open``: a store whose one segment holds about 64 MB (``OPEN_BYTES``) opened again three
  times after a clean close, and three times as a crash leaves it (the clean close's index of
  the last segment removed, so the segment is read batch by batch): the median of each, ms.
- ``follow``: in one process, without sockets (the transports only collect the bytes), a
  broker's server answering one-message produces while one fetch stream follows the
  partition: the server's CPU per produce, which covers parsing the request, the append, the
  push to the follower and the acknowledgement, and the Python function calls it takes. It runs
  on a queue with the default TTL and on one without, and with 4 MiB copied before each
  produce (``COLD_BYTES``: the caches as cold as the pipeline's other processes leave them
  between two messages), in turn, three times each: the work behind the server's share of an
  end-to-end latency run.
- ``hops``: a broker, a producer and a consumer, each its own process, at 2,000 one-message
  sends a second (the latency benchmark's workload): each message's time from hop to hop
  (send call, socket write, broker read, parse, log write, push, consumer read, hand-out),
  p50/p90/p99 and over the slowest 1 %, with each process's CPU per message; async then
  sync flush, twice. See ``bench/hops.py``.
- ``awake``: the hops probe's async run with the broker alone on CPU 0 and the producer and
  the consumer on CPU 1, alternately as it is and with CPU 0 kept from going idle by a
  spinning process of the lowest priority (SCHED_IDLE), twice each: what the broker's CPU
  waking from a halt between messages costs it and the tail. See :func:`bench.hops.awake`.
- ``calls``: the hops probe's three processes, one message at a time at 500 a second: the
  Python function calls each process (and each of its threads) makes per message, async then
  sync flush, twice. A count, not a time: it moves only when the code does. See
  ``bench/calls.py``.
- ``rtt``: ``Producer.send_and_wait`` of one 100 B message beside redis-py ``XADD``
  (appendfsync everysec), alternating in one process, three rounds: each one's calls a
  second, client and server CPU per call, the ratio, then the time of each phase of one
  Headwater call. See ``bench/rtt.py`` (``python -m bench.rtt`` for the options).
- ``consume``: one broker holding 1.5 million messages of 100 B; a fresh consumer reads them
  all, through a fetch stream and then with a FETCH per batch (``stream=False``), three
  times each, alternating: what the fetch streams change for reading a backlog.
- ``wide``: 100,000 messages of 100 B, one a stored batch, over 10 partitions and over
  10,000, read back by a fresh consumer of the whole queue (by fetch stream, by FETCH) and
  by the one member of a keyed group, three times each: whether a poll's cost grows with
  the partitions read. See :func:`wide`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing as mp
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

from bench import machine
from bench.peers.base import free_port, port_open, process_group_cpu_s, wait_until

__all__ = ["main"]


def codec(n: int = 20_000) -> None:
    from headwater.client.core.lookups import decode_stored
    from headwater.model.batch import encode_batch
    from headwater.model.config import QueueConfig
    from headwater.protocol import CLIENT, Connection, Request, Response
    from headwater.protocol.messages import FetchRequest, FetchResponse
    from headwater.storage.store import LogStore, StoreConfig

    with tempfile.TemporaryDirectory(prefix="hw-probe-") as d:
        store = LogStore(d, StoreConfig())
        try:
            store.create_queue("q", QueueConfig(partitions=1))
            batches = [encode_batch([os.urandom(100)]) for _ in range(n)]
            t0 = time.perf_counter()
            for b in batches:
                store.append_nowait("q", 0, b)
            t1 = time.perf_counter()
            for _ in range(n):
                store.fetch("q", 0, n - 1, max_bytes=1 << 20)
            t2 = time.perf_counter()
            for _ in range(n):
                store.fetch("q", 0, n, max_bytes=1 << 20)
            t3 = time.perf_counter()
            stored = store.fetch("q", 0, n - 1, max_bytes=1 << 20)
        finally:
            store.close()
    print(
        f"store: append of a 1-message batch {(t1 - t0) / n * 1e6:.1f} µs, fetch of it "
        f"{(t2 - t1) / n * 1e6:.1f} µs, empty fetch {(t3 - t2) / n * 1e6:.1f} µs"
    )

    cli = Connection(CLIENT)
    srv = _handshake_locally(cli)
    enc = parse = answer = 0.0
    clock = time.perf_counter
    for i in range(n):
        a = clock()
        chunks = cli.send_chunks(Request(cli.next_request_id(), FetchRequest("q", 0, i, 1 << 20, 0, None, 500)))
        b = clock()
        srv.receive_data(b"".join(chunks))
        ev = srv.next_event()
        srv.next_event()
        out = b"".join(srv.send_chunks(Response(ev.request_id, FetchResponse(stored.batches, 1, 0, 1))))
        c = clock()
        cli.receive_data(out)
        res = cli.next_event().body.result()
        cli.next_event()
        decode_stored(res.batches[0], "q", start_offset=0, tags=None)
        d = clock()
        enc, parse, answer = enc + b - a, parse + c - b, answer + d - c
    print(
        f"protocol: client encodes a FETCH {enc / n * 1e6:.1f} µs; server parses it and encodes the "
        f"answer {parse / n * 1e6:.1f} µs; client parses the answer and decodes its record "
        f"{answer / n * 1e6:.1f} µs"
    )


def ping(n: int = 6000, rounds: int = 2) -> None:
    """A request's fixed cost in the broker, against a bare uvloop echo server's: each answers
    ``n`` PING frames from a raw client, one at a time every 0.4 ms; alternately, ``rounds``
    times each. The broker's round trip includes the client parsing the answer frame; the
    echo's ends when the bytes are back."""
    from headwater.protocol import CLIENT, Connection, Handshake, Request
    from headwater.protocol.messages import PingRequest

    for _ in range(rounds):
        for kind in ("headwater serve", "uvloop echo"):
            port = free_port()
            with tempfile.TemporaryDirectory(prefix="hw-probe-") as d:
                if kind == "headwater serve":
                    cmd = [
                        sys.executable,
                        "-m",
                        "headwater.cli.main",
                        "--data",
                        d,
                        "serve",
                        "--port",
                        str(port),
                        "--log-level",
                        "warning",
                    ]
                else:
                    cmd = [sys.executable, "-c", f"from bench.probes import echo_server; echo_server({port})"]
                server = subprocess.Popen(
                    cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
                )
                try:
                    wait_until(lambda: port_open(port), timeout_s=30, what=kind)  # noqa: B023 (called at once, within this iteration)
                    s = socket.create_connection(("127.0.0.1", port))
                    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    c = Connection(CLIENT)
                    if kind == "headwater serve":
                        s.sendall(c.send(Handshake("probe")))
                        _ping_read(s, c)
                        r = _ping_rounds(
                            s,
                            c,
                            server.pid,
                            n,
                            lambda: c.send(Request(c.next_request_id(), PingRequest())),  # noqa: B023 (called at once, within this iteration)
                        )
                    else:  # the echo writes back whatever comes: one PING frame, every time
                        _handshake_locally(c)
                        same = c.send(Request(c.next_request_id(), PingRequest()))
                        r = _ping_rounds(s, None, server.pid, n, lambda: same)  # noqa: B023 (called at once, within this iteration)
                    s.close()
                finally:
                    server.terminate()
                    server.wait(timeout=30)
            print(
                f"ping, {kind}: round trip p50 {r['p50_us']:.0f} µs, p99 {r['p99_us']:.0f} µs; the server used "
                f"{r['cpu_us']:.0f} µs of CPU and {r['voluntary']:.2f} voluntary + {r['involuntary']:.2f} "
                f"involuntary context switches per request and answer, at {r['rate']:,.0f}/s"
            )


def _handshake_locally(c: Any) -> Any:
    """Take client Connection ``c`` through its handshake with a server Connection in this
    process, so that requests can be encoded and parsed without a socket (or sent to a
    server that speaks no protocol); that server Connection."""
    from headwater.protocol import SERVER, Connection, Handshake, HandshakeAccepted

    srv = Connection(SERVER)
    srv.receive_data(c.send(Handshake("probe")))
    srv.next_event()
    c.receive_data(b"".join(srv.send_chunks(HandshakeAccepted(1, "probe"))))
    c.next_event()
    return srv


def _ping_read(s: socket.socket, c: Any) -> None:
    """Read until ``c`` (a client Connection) has a whole event; take it."""
    from headwater.protocol import NEED_DATA

    while c.next_event() is NEED_DATA:
        data = s.recv(65536)
        if not data:
            raise ConnectionError("the server closed the connection")
        c.receive_data(data)


def _ping_rounds(s: socket.socket, c: Any, pid: int, n: int, frame: Callable[[], bytes]) -> dict:
    """Send ``frame()`` ``n`` times, one at a time, each once the answer to the last came
    (read through client Connection ``c``; with None, the same bytes back from an echo
    server): round trips and the server's cost."""
    rtts: list[float] = []
    cpu0, sw0, t0 = process_group_cpu_s(pid), machine.context_switches(pid), time.monotonic()
    clock = time.perf_counter_ns
    for _ in range(n):
        data = frame()
        a = clock()
        s.sendall(data)
        if c is None:
            got = 0
            while got < len(data):
                chunk = s.recv(65536)
                if not chunk:
                    raise ConnectionError("the echo server closed the connection")
                got += len(chunk)
        else:
            _ping_read(s, c)
        rtts.append((clock() - a) / 1000)
        time.sleep(0.0004)
    cpu1, sw1, t1 = process_group_cpu_s(pid), machine.context_switches(pid), time.monotonic()
    rtts.sort()
    return {
        "p50_us": rtts[len(rtts) // 2],
        "p99_us": rtts[min(len(rtts) - 1, len(rtts) * 99 // 100)],
        "cpu_us": (cpu1 - cpu0) / n * 1e6,
        "voluntary": (sw1[0] - sw0[0]) / n,
        "involuntary": (sw1[1] - sw0[1]) / n,
        "rate": n / (t1 - t0),
    }


def echo_server(port: int) -> None:
    """A uvloop (else asyncio) server on 127.0.0.1:``port`` writing back whatever it reads:
    the least a Python server on an event loop does per request (``ping``'s yardstick)."""

    class Echo(asyncio.Protocol):
        def connection_made(self, transport: Any) -> None:
            self.transport = transport

        def data_received(self, data: bytes) -> None:
            self.transport.write(data)

    async def serve() -> None:
        server = await asyncio.get_running_loop().create_server(Echo, "127.0.0.1", port)
        await server.serve_forever()

    try:
        import uvloop
    except ImportError:
        asyncio.run(serve())
    else:
        uvloop.run(serve())


def _receiver(port: int, n: int, listening) -> None:
    with socket.create_server(("127.0.0.1", port)) as srv:
        listening.set()
        conn, _ = srv.accept()
        got = 0
        while got < n:
            data = conn.recv(100)
            if not data:
                break
            got += len(data)


def send(n: int = 4000) -> None:
    port = free_port()
    ctx = mp.get_context("spawn")
    listening = ctx.Event()
    p = ctx.Process(target=_receiver, args=(port, n, listening))
    p.start()
    if not listening.wait(30):
        raise RuntimeError("the receiver did not start listening within 30 s")
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    took: list[int] = []
    for _ in range(n):
        t = time.perf_counter_ns()
        s.send(b"x")
        took.append(time.perf_counter_ns() - t)
        time.sleep(0.0005)
    s.close()
    p.join(timeout=30)
    took.sort()
    print(
        f"send: a 1-byte loopback send() to a blocked receiver took p50 {took[n // 2] / 1e3:.1f} µs, "
        f"mean {sum(took) / n / 1e3:.1f} µs"
    )


def disk() -> None:
    with tempfile.TemporaryDirectory(prefix="hw-probe-") as d:
        bursts = [machine.write_bandwidth(d)["mb_per_s"] for _ in range(3)]
        print("disk: 1 GiB then one fdatasync, three times: " + ", ".join(f"{x:,.0f}" for x in bursts) + " MB/s")
        for keep in (None, 1 << 30):
            rates, reads = _sustained_write(os.path.join(d, "sustained.bin"), keep)
            how = (
                "the page cache left to the kernel"
                if keep is None
                else f"fsynced bytes over {keep >> 20:,} MiB behind dropped from the page cache"
            )
            print(
                f"disk: 4 GiB in 8 MiB writes, fdatasync every 256 MiB, {how}, each window: "
                + ", ".join(f"{x:,.0f}" for x in rates)
                + " MB/s"
            )
            if reads:
                print(
                    "disk: read back in 1 MiB reads: the first 1 GiB (dropped) {:,.0f} MB/s, "
                    "the last 1 GiB (cached) {:,.0f} MB/s".format(*reads)
                )


def _sustained_write(path: str, keep_bytes: int | None) -> tuple[list[float], list[float]]:
    """MB/s of each 256 MiB window; with ``keep_bytes``, as the store's
    ``page_cache_keep_bytes`` does, fsynced pages further behind are dropped after each fsync,
    and the file's first and last GiB are then read back (MB/s each)."""
    chunk = os.urandom(8 << 20)
    rates, reads = [], []
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        written = 0
        for _ in range(16):
            t = time.perf_counter()
            for _ in range(32):
                os.write(fd, chunk)
            os.fdatasync(fd)
            written += 256 << 20
            if keep_bytes is not None and written > keep_bytes:
                os.posix_fadvise(fd, 0, written - keep_bytes, os.POSIX_FADV_DONTNEED)
            rates.append((256 << 20) / (time.perf_counter() - t) / 1e6)
        if keep_bytes is not None:
            for start in (0, written - (1 << 30)):
                t = time.perf_counter()
                for pos in range(start, start + (1 << 30), 1 << 20):
                    os.pread(fd, 1 << 20, pos)
                reads.append((1 << 30) / (time.perf_counter() - t) / 1e6)
    finally:
        os.close(fd)
        os.unlink(path)
    return rates, reads


def produce() -> None:
    from bench.network import BATCH, FULL
    from bench.peers import driver_class
    from bench.peers.base import temp_workdir

    with temp_workdir("hw-probe-") as wd:
        driver = driver_class("headwater")(wd, log=lambda msg: None)
        driver.setup()
        try:
            mode = driver.modes[0]
            driver.use_mode(mode)
            figures = []
            for _ in range(3):
                driver.reset(mode, 1)
                r = driver.produce(
                    mode, producers=1, size=1024, batch=BATCH, n=FULL.produce_msgs_max, seconds=FULL.produce_s
                )
                figures.append(r.get("mb_per_s"))
        finally:
            driver.teardown()
    print(
        f"produce: 1 KiB x {BATCH}, async, back to back against one broker: "
        + ", ".join("error" if x is None else f"{x:,.1f}" for x in figures)
        + " MB/s"
    )


@contextlib.contextmanager
def _broker(fill: Callable[[str], None] | None = None) -> Iterator[Any]:
    """A ``headwater serve`` subprocess (async flush, a temporary data directory that
    ``fill(path)`` writes first, when given) and a client of it."""
    import headwater

    port = free_port()
    with tempfile.TemporaryDirectory(prefix="hw-probe-") as d:
        if fill is not None:
            fill(d)
        server = subprocess.Popen(
            [sys.executable, "-m", "headwater.cli.main", "--data", d, "serve", "--host", "127.0.0.1",
             "--port", str(port), "--log-level", "warning"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        try:
            wait_until(lambda: port_open(port), timeout_s=30, what="headwater serve")
            hw = headwater.connect(f"127.0.0.1:{port}")
            try:
                yield hw
            finally:
                hw.close()
        finally:
            server.terminate()
            server.wait(30)


def _read_all(hw: Any, queue: str, n: int, how: str) -> float:
    """A fresh reader of every partition of ``queue`` reads its ``n`` messages: msgs/s.
    ``how``: ``"stream"`` (a consumer's fetch stream), ``"fetch"`` (a FETCH per batch) or
    ``"keyed"`` (the one member of a new keyed group)."""
    if how == "keyed":
        c = hw.keyed_consumer(f"probe-{time.monotonic_ns()}", queue, member=0, size=1, max_poll_messages=500)
    else:
        c = hw.consumer(stream=how == "stream", max_poll_messages=500)
        c.assign(queue)
    got, t0 = 0, time.perf_counter()
    while got < n:
        got += len(c.poll(max_messages=500, timeout_ms=1000))
    rate = n / (time.perf_counter() - t0)
    c.close()
    return rate


def consume(n: int = 1_500_000) -> None:
    with _broker() as hw:
        hw.admin.create_queue("q", partitions=1)
        p = hw.producer(linger_ms=5, batch_bytes_max=1 << 20)
        bodies = [os.urandom(100) for _ in range(500)]
        for _ in range(n // 500):
            p.send_batch("q", bodies, partition=0)
        rates: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(3):
            for stream in (True, False):
                rates[stream].append(_read_all(hw, "q", n, "stream" if stream else "fetch"))
    print(
        f"consume: {n:,} x 100 B, one consumer: fetch stream "
        + ", ".join(f"{x:,.0f}" for x in rates[True])
        + " msgs/s; a FETCH per batch "
        + ", ".join(f"{x:,.0f}" for x in rates[False])
        + " msgs/s"
    )


def wide(n: int = 100_000, partitions: int = 10_000, rounds: int = 3) -> None:
    """The same ``n`` messages of 100 B, one a stored batch, over ``partitions`` partitions and
    over 10 (written embedded before the broker starts); a fresh reader of the whole queue
    reads them through a fetch stream, by FETCH, and as a keyed group's one member,
    ``rounds`` times each: what a poll costs as the partitions grow, the batches alike
    (issue 32: no workload falls off a cliff)."""
    import headwater

    sizes = (10, partitions)
    ways = {"stream": "fetch stream", "fetch": "a FETCH per batch", "keyed": "a keyed member"}

    def fill(d: str) -> None:
        with headwater.open(d) as hw:
            for k in sizes:
                hw.admin.create_queue(f"wide{k}", partitions=k)
                for i in range(n):
                    hw.send_batch(f"wide{k}", [os.urandom(100)], partition=i % k)

    rates: dict[tuple[int, str], list[float]] = {(k, how): [] for k in sizes for how in ways}
    with _broker(fill) as hw:
        for _ in range(rounds):
            for k in sizes:
                for how in ways:
                    rates[(k, how)].append(_read_all(hw, f"wide{k}", n, how))
    for how, label in ways.items():
        few, many = rates[(10, how)], rates[(partitions, how)]
        print(
            f"wide, {label}: {n:,} x 100 B, one a batch, over 10 partitions "
            + ", ".join(f"{x:,.0f}" for x in few)
            + f" msgs/s; over {partitions:,} "
            + ", ".join(f"{x:,.0f}" for x in many)
            + f" msgs/s; {partitions:,} / 10: {statistics.median(many) / statistics.median(few):.2f}"
        )


def memory(rounds: int = 3, seconds: float = 10.0) -> None:
    import headwater

    settings = {"defaults": {}, "off": {"HEADWATER_PAGE_CACHE_KEEP_BYTES": "0", "HEADWATER_ALLOCATOR_CACHE_BYTES": "0"}}
    figures: dict[str, list[str]] = {name: [] for name in settings}
    bodies = [os.urandom(1024) for _ in range(500)]
    for _ in range(rounds):
        for name, env in settings.items():
            port = free_port()
            with tempfile.TemporaryDirectory(prefix="hw-probe-") as d:
                server = subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "headwater.cli.main",
                        "--data",
                        d,
                        "serve",
                        "--host",
                        "127.0.0.1",
                        "--port",
                        str(port),
                        "--log-level",
                        "warning",
                    ],
                    env={**os.environ, **env},
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,
                )
                try:
                    wait_until(lambda: port_open(port), timeout_s=30, what="headwater serve")  # noqa: B023 (called at once, within this iteration)
                    hw = headwater.connect(f"127.0.0.1:{port}")
                    hw.admin.create_queue("q", partitions=1)
                    p = hw.producer()
                    cached0 = machine.meminfo_kib("Cached")
                    cpu0, t0, sent = machine.process_cpu_times(server.pid), time.perf_counter(), 0
                    while time.perf_counter() - t0 < seconds:
                        p.send_batch("q", bodies, partition=0)
                        sent += len(bodies)
                    elapsed, cpu1 = time.perf_counter() - t0, machine.process_cpu_times(server.pid)
                    grown_mib = (machine.meminfo_kib("Cached") - cached0) / 1024
                    peak_mib = _status_kib(server.pid, "VmHWM") / 1024
                    hw.close()
                finally:
                    server.terminate()
                    server.wait(30)
            gb = sent * 1024 / 1e9
            figures[name].append(
                f"{gb * 1e3 / elapsed:,.0f} MB/s (broker CPU s/GB: user "
                f"{(cpu1[0] - cpu0[0]) / gb:.2f}, system {(cpu1[1] - cpu0[1]) / gb:.2f}; "
                f"broker peak RSS {peak_mib:,.0f} MiB; page cache grew {grown_mib:,.0f} MiB)"
            )
    for name, env in settings.items():
        how = (
            "the store's and the broker's defaults"
            if not env
            else "page cache and allocator left alone (" + " ".join(f"{k}={v}" for k, v in env.items()) + ")"
        )
        print(f"memory: 1 KiB x 500 for {seconds:.0f} s, {how}: " + "; ".join(figures[name]))


class _Collect:
    """The follow probe's transport: counts the server's writes, and keeps them while
    ``keep`` is a list (the answers the probe reads back)."""

    def __init__(self) -> None:
        self.writes = 0
        self.keep: list[bytes] | None = None

    def get_extra_info(self, name, default=None):
        return ("127.0.0.1", 0) if name == "peername" else default

    def set_write_buffer_limits(self, high=0, low=0) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0

    def writelines(self, chunks) -> None:
        self.writes += 1
        if self.keep is not None:
            self.keep.append(b"".join(bytes(c) for c in chunks))

    def write(self, data) -> None:
        self.writelines([data])

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


#: what ``follow`` copies between two produces to push the server's code and data out of a
#: core's own caches, as the other processes of a pipeline do between two messages (a core's
#: L2 is 2 MiB on the project's machines)
COLD_BYTES = 4 << 20


def follow(n: int = 20_000, rounds: int = 3) -> None:
    for r in range(rounds):
        for ttl, cold in ((7 * 86400, False), (None, False), (7 * 86400, True)):
            cpu_us, calls = asyncio.run(_follow(n if not cold else n // 4, ttl, cold_bytes=COLD_BYTES if cold else 0))
            label = "default TTL (7 days)" if ttl else "no TTL"
            if cold:
                label += f", caches cold ({COLD_BYTES >> 20} MiB copied between produces)"
            print(
                f"follow {r + 1}, {label}: {cpu_us:.1f} µs of server CPU per one-message produce "
                f"with a follower; {calls:.0f} Python calls each"
            )


async def _follow(n: int, ttl_s: int | None, *, cold_bytes: int = 0) -> tuple[float, float]:
    """(CPU µs, Python calls) per one-message produce, answered and pushed to one follower;
    with ``cold_bytes``, that many bytes are copied before each produce (not timed), so that
    it runs with the caches as cold as another process leaves them."""
    import cProfile
    import pstats

    from headwater.broker import Broker
    from headwater.broker.connection import ClientConnection
    from headwater.broker.server import BrokerServer, ServerConfig
    from headwater.model.batch import encode_batch
    from headwater.model.config import QueueConfig
    from headwater.protocol import CLIENT, NEED_DATA, Connection, Handshake, Request
    from headwater.protocol.messages import FetchStreamRequest, ProduceRequest
    from headwater.storage import StoreConfig

    with tempfile.TemporaryDirectory(prefix="hw-probe-") as d:
        broker = Broker.open(d, StoreConfig(flush="async"))
        srv = BrokerServer(broker, ServerConfig(port=0))
        await srv.start()
        ends: list[tuple[Connection, _Collect, ClientConnection]] = []
        try:
            broker.create_queue("q", QueueConfig(partitions=1, ttl_s=ttl_s))
            for name in ("follower", "producer"):
                conn, transport = Connection(CLIENT), _Collect()
                st = ClientConnection(srv)
                st.connection_made(transport)
                transport.keep = []
                st.data_received(conn.send(Handshake(name)))
                conn.receive_data(transport.keep.pop())
                conn.next_event()
                transport.keep = None
                ends.append((conn, transport, st))
            (fconn, ftr, fst), (pconn, ptr, pst) = ends
            fst.data_received(fconn.send(Request(fconn.next_request_id(), FetchStreamRequest(1, "q", {0: 0}, 1 << 30))))
            await asyncio.sleep(0.05)
            body = os.urandom(100)
            ptr.keep = []
            pushes = ftr.writes
            profile = cProfile.Profile()
            cpu = 0.0
            junk = bytearray(cold_bytes)
            fill = (bytes(cold_bytes), b"\x01" * cold_bytes)
            for i in range(n):
                batch = encode_batch([body], producer_id=7, base_sequence=i, producer_epoch=0)
                data = pconn.send(Request(pconn.next_request_id(), ProduceRequest("q", 0, batch)))
                if cold_bytes:
                    junk[:] = fill[i & 1]
                measured = i % 10 != 0  # every tenth produce runs under the profiler instead
                if not measured:
                    profile.enable()
                c0 = time.process_time()
                pst.data_received(data)
                c1 = time.process_time()
                if measured:
                    cpu += c1 - c0
                else:
                    profile.disable()
                pconn.receive_data(ptr.keep.pop())
                while pconn.next_event() is not NEED_DATA:
                    pass
            if ftr.writes - pushes != n:
                raise RuntimeError(f"{ftr.writes - pushes} pushes for {n} produces")
            profiled = len(range(0, n, 10))
            calls = pstats.Stats(profile).total_calls / profiled
            return cpu * 1e6 / (n - profiled), calls
        finally:
            for _, _, st in ends:
                st.connection_lost(None)  # (stop() would wait for them to close)
            await srv.stop()  # closes the broker too


def _status_kib(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def hops() -> None:
    from bench.hops import hops as run_hops

    run_hops()


def awake() -> None:
    from bench.hops import awake as run_awake

    run_awake()


def calls() -> None:
    from bench.calls import calls as run_calls

    run_calls()


def rtt() -> None:
    from bench.rtt import main as run_rtt

    run_rtt(["--rounds", "3", "--hops"])


OPEN_BYTES = 64 << 20


def open_store(size_bytes: int = OPEN_BYTES) -> None:
    """Print how long opening takes after a clean close and as after a crash (docstring)."""
    import headwater
    from headwater.storage.segment import segment_name

    with tempfile.TemporaryDirectory(prefix="hw-probe-") as d:
        data = os.path.join(d, "data")
        with headwater.open(data, segment_bytes_max=1 << 30) as hw:
            hw.admin.create_queue("q", partitions=4, ttl_s=None)
            producer = hw.producer()
            body = os.urandom(100)
            for _ in range(max(1, size_bytes // 10_500)):  # 100 messages of about 105 bytes stored each
                producer.send_batch("q", [body] * 100)
            producer.flush()
        last = sorted(os.listdir(os.path.join(data, "log")))
        log_bytes = sum(os.path.getsize(os.path.join(data, "log", f)) for f in last if f.endswith(".log"))

        def timed(crashed: bool) -> float:
            took = []
            for _ in range(3):
                if crashed:  # a crash leaves no index of the last segment that matches it
                    segs = sorted(f for f in os.listdir(os.path.join(data, "log")) if f.endswith(".log"))
                    idx = os.path.join(data, "log", segment_name(int(segs[-1][:-4]), ".idx"))
                    if os.path.exists(idx):
                        os.unlink(idx)
                t0 = time.perf_counter()
                hw = headwater.open(data)
                took.append(time.perf_counter() - t0)
                hw.close()
            return statistics.median(took) * 1000

        clean = timed(False)
        crashed = timed(True)
        print(
            f"open: a store of {log_bytes / 1e6:.0f} MB in one segment: {clean:.0f} ms after a clean close, "
            f"{crashed:.0f} ms as after a crash (the last segment read); median of 3 each"
        )


PROBES = {
    "codec": codec,
    "open": open_store,
    "follow": follow,
    "ping": ping,
    "send": send,
    "disk": disk,
    "produce": produce,
    "consume": consume,
    "wide": wide,
    "memory": memory,
    "hops": hops,
    "awake": awake,
    "calls": calls,
    "rtt": rtt,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.probes", description=__doc__.split("\n\n")[0])
    parser.add_argument("probes", nargs="*", metavar="PROBE", help=f"which to run ({', '.join(PROBES)}; default: all)")
    args = parser.parse_args(argv)
    unknown = [p for p in args.probes if p not in PROBES]
    if unknown:
        parser.error(f"unknown probe(s) {', '.join(unknown)}; choose from {', '.join(PROBES)}")
    for name in args.probes or PROBES:
        PROBES[name]()
    return 0


if __name__ == "__main__":
    sys.exit(main())
