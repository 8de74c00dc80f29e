"""The one-message round trip: ``Producer.send_and_wait`` beside redis-py ``XADD``, alternating
in one run (``python -m bench.rtt``; also ``python -m bench.probes rtt``).

A ``headwater serve`` broker (its own process, flush async by default) and a ``redis-server``
(appendonly, ``appendfsync everysec``), both on 127.0.0.1, are driven from this one process, one
100 B message per call, each call waiting for its answer: ``--calls`` Headwater calls, then as
many ``XADD``, for ``--rounds`` rounds (the order turns each round, so neither always runs
first). Each round prints both rates, the client's and the server's CPU per call (user and
system, from /proc) and the ratio; the end prints the median ratio against the target (issue 32
target 4: at least 1.0) as PASS or MISS. Exit status 0 either way: a benchmark reports.

``--hops`` adds the breakdown of one Headwater call on the caller's thread, timed with
``time.perf_counter_ns`` around the methods it goes through (the wrappers cost a few µs, so
those calls are a little slower than the unwrapped ones): build and encode (from the call to
the socket write), the write (``sendmsg``), the wait for the answer (the broker's whole share,
its CPU and both wake-ups), reading and settling the answer, and the return to the caller.
``--count-calls`` then counts the Python calls of one call in each process (``bench.calls``).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from bench import machine
from bench.peers.base import ensure_debian_packages, wait_until

__all__ = ["main", "run", "TARGET_RATIO"]

TARGET_RATIO = 1.0  # issue 32, target 4: send_and_wait at least redis-py's XADD rate
QUEUE = "rtt"
BODY = b"x" * 100
WARMUP_CALLS = 500
COUNTED_CALLS = 1000  # --count-calls: calls counted, after WARMUP_CALLS


def _broker(
    data: str, flush: str, ready: Any, count: tuple[Any, Any, Any] | None = None, idle_spin_us: int | None = None
) -> None:
    from headwater.broker.run import run_server
    from headwater.broker.server import ServerConfig
    from headwater.storage.store import StoreConfig

    if count is not None:  # --count-calls: count this process's Python calls when told (bench.calls)
        from bench.calls import _counted

        _counted("broker", *count)

    spin = {} if idle_spin_us is None else {"idle_spin_us": idle_spin_us}  # None: the broker's default
    run_server(data, StoreConfig(flush=flush), ServerConfig(host="127.0.0.1", port=0, **spin), on_ready=ready.put)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_redis(workdir: str, fsync: str) -> tuple[subprocess.Popen, Any]:
    ensure_debian_packages({"redis-server": "redis-server"})
    import redis

    port = _free_port()
    args = ["--bind", "127.0.0.1", "--port", str(port), "--dir", workdir, "--appendonly", "yes"]
    args += ["--appendfsync", fsync, "--save", "", "--logfile", "", "--daemonize", "no"]
    proc = subprocess.Popen([shutil.which("redis-server") or "redis-server", *args], stdout=subprocess.DEVNULL)
    client = redis.Redis(host="127.0.0.1", port=port)
    wait_until(client.ping, timeout_s=20, what="redis-server", alive=lambda: proc.poll() is None)
    return proc, client


def _timed(calls: int, one: Callable[[], object], server_pid: int) -> dict[str, float]:
    """Run ``one`` ``calls`` times: calls a second, and CPU µs per call of this process and
    of the server (user, system)."""
    me = os.getpid()
    cu0, cs0 = machine.process_cpu_times(me)
    su0, ss0 = machine.process_cpu_times(server_pid)
    t0 = time.perf_counter()
    for _ in range(calls):
        one()
    took = time.perf_counter() - t0
    cu1, cs1 = machine.process_cpu_times(me)
    su1, ss1 = machine.process_cpu_times(server_pid)
    per = 1e6 / calls
    return {
        "rate": calls / took,
        "us": took * per,
        "client_user_us": (cu1 - cu0) * per,
        "client_sys_us": (cs1 - cs0) * per,
        "server_user_us": (su1 - su0) * per,
        "server_sys_us": (ss1 - ss0) * per,
    }


def _line(label: str, r: dict[str, float]) -> str:
    return (
        f"{label} {r['rate']:,.0f}/s ({r['us']:.0f} µs a call; client CPU {r['client_user_us']:.0f}+"
        f"{r['client_sys_us']:.0f} µs, server {r['server_user_us']:.0f}+{r['server_sys_us']:.0f} µs user+sys)"
    )


def run(
    *,
    rounds: int = 5,
    calls: int = 5000,
    flush: str = "async",
    fsync: str = "everysec",
    hops: bool = False,
    count_calls: bool = False,
    spin_us: int = 0,
    idle_spin_us: int | None = None,
    log=print,
) -> dict[str, Any]:
    """Alternate the two in ``rounds`` rounds of ``calls`` each: every round's figures, the
    ratios (Headwater's rate over Redis's), with ``hops`` the per-phase breakdown and with
    ``count_calls`` the Python calls per Headwater call in the client and in the broker; with
    ``spin_us`` a third side, the same producer whose leading caller spins that long before
    it blocks (``lead_spin_us``), beside it without the spin; ``idle_spin_us`` the broker's
    spin before its loop blocks (None: its default)."""
    import headwater

    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="hw-rtt-") as d:
        os.mkdir(os.path.join(d, "hw"))
        os.mkdir(os.path.join(d, "redis"))
        ready = ctx.Queue()
        broker = ctx.Process(
            target=_broker, args=(os.path.join(d, "hw"), flush, ready, None, idle_spin_us), daemon=True
        )
        broker.start()
        rproc, rclient = _start_redis(os.path.join(d, "redis"), fsync)
        hw = None
        try:
            hw = headwater.connect(f"127.0.0.1:{ready.get(timeout=60)}")
            hw.admin.create_queue(QUEUE, partitions=1, ttl_s=None)
            producer = hw.producer()
            sides: dict[str, tuple[Callable[[], object], int]] = {
                "headwater": (lambda: producer.send_and_wait(QUEUE, BODY), broker.pid),
                "redis": (lambda: rclient.xadd(QUEUE, {"b": BODY}), rproc.pid),
            }
            if spin_us:
                sides.update(_spin_sides(hw, producer, spin_us, broker.pid))
            for one, _ in sides.values():
                for _ in range(WARMUP_CALLS):
                    one()
            out = []
            for r in range(rounds):
                order = list(sides) if r % 2 == 0 else list(sides)[::-1]
                got = {name: _timed(calls, *sides[name]) for name in order}
                ratio = got["headwater"]["rate"] / got["redis"]["rate"]
                log(
                    f"round {r + 1}: {_line('headwater send_and_wait', got['headwater'])}; "
                    f"{_line(f'redis xadd ({fsync})', got['redis'])}; ratio {ratio:.2f}"
                    + (f"; {_line(f'spin {spin_us} µs', got['spin'])}" if spin_us else "")
                )
                out.append({**got, "ratio": ratio})
            breakdown = _hops(producer, calls) if hops else None
            counted = _count_calls(ctx, os.path.join(d, "counted"), flush) if count_calls else None
            producer.close()
        finally:
            if hw is not None:
                hw.close()
            rproc.terminate()
            rproc.wait(timeout=10)
            broker.terminate()
            broker.join(timeout=10)
    ratios = [r["ratio"] for r in out]
    return {"rounds": out, "ratio_median": statistics.median(ratios), "hops": breakdown, "calls": counted}


def _spin_sides(hw: Any, producer: Any, spin_us: int, pid: int) -> dict[str, tuple[Callable[[], object], int]]:
    """send_and_wait with the leading caller's spin off ("headwater") and on ("spin")."""
    transport = hw._service.transport  # one connection: the spin is the transport's setting

    def plain() -> object:
        transport.lead_spin_us = 0
        return producer.send_and_wait(QUEUE, BODY)

    def spin() -> object:
        transport.lead_spin_us = spin_us
        return producer.send_and_wait(QUEUE, BODY)

    return {"headwater": (plain, pid), "spin": (spin, pid)}


def _count_calls(ctx: Any, data: str, flush: str) -> dict[str, float]:
    """Python calls (``sys.setprofile`` "call" events) per send_and_wait, in this thread and
    in every thread of a broker of its own (the counting hook slows a process several times
    over, so the timed rounds' broker never has it): the figure that does not move with the
    host's load."""
    import headwater
    from bench.calls import Counter

    os.mkdir(data)
    ready, start, stop, out = ctx.Queue(), ctx.Event(), ctx.Event(), ctx.Queue()
    broker = ctx.Process(target=_broker, args=(data, flush, ready, (start, stop, out)), daemon=True)
    broker.start()
    hw = headwater.connect(f"127.0.0.1:{ready.get(timeout=60)}")
    try:
        hw.admin.create_queue(QUEUE, partitions=1, ttl_s=None)
        producer = hw.producer()
        for _ in range(WARMUP_CALLS):
            producer.send_and_wait(QUEUE, BODY)
        start.set()
        time.sleep(0.5)  # the broker's watcher thread wakes and starts counting
        counter = Counter()
        counter.install()
        counter.start()
        for _ in range(COUNTED_CALLS):
            producer.send_and_wait(QUEUE, BODY)
        counter.stop()
        counter.uninstall()
        time.sleep(0.5)  # the broker has answered the last call: count nothing after it
        stop.set()
        _, counts = out.get(timeout=60)
        producer.close()
    finally:
        hw.close()
        broker.terminate()
        broker.join(timeout=10)
    return {"client": sum(counter.counts.values()) / COUNTED_CALLS, "broker": sum(counts.values()) / COUNTED_CALLS}


#: The phases of one send_and_wait on the caller's thread, and the stamps that bound them.
PHASES = (
    ("build and encode", "call", "write"),
    ("socket write (sendmsg)", "write", "written"),
    ("wait for the answer", "written", "readable"),
    ("read, parse, settle", "readable", "read"),
    ("back to the caller", "read", "return"),
)


def _hops(producer: Any, calls: int) -> dict[str, float]:
    """p50 µs of each phase of ``calls`` send_and_wait calls (see PHASES), by wrapping the
    transport's write and read for the time of the run."""
    from headwater.client.transport.async_transport import AsyncTransport

    clock = time.perf_counter_ns
    stamp: dict[str, int] = {}
    write, read = AsyncTransport._write_locked, AsyncTransport._lead_ready  # the leader reads in _lead_ready

    def timed_write(self: Any, link: Any, chunks: list) -> None:
        stamp["write"] = clock()
        write(self, link, chunks)
        stamp["written"] = clock()

    def timed_read(self: Any, link: Any, wake: Any, ready: list) -> bool:
        stamp.setdefault("readable", clock())
        alive = read(self, link, wake, ready)
        stamp["read"] = clock()
        return alive

    samples: dict[str, list[int]] = {name: [] for name, _, _ in PHASES}
    AsyncTransport._write_locked, AsyncTransport._lead_ready = timed_write, timed_read  # type: ignore[method-assign]  # a probe's wrappers, removed below
    try:
        for _ in range(calls):
            stamp.clear()
            stamp["call"] = clock()
            producer.send_and_wait(QUEUE, BODY)
            stamp["return"] = clock()
            if len(stamp) == 6:  # every phase seen (a call answered another way is left out)
                for name, a, b in PHASES:
                    samples[name].append(stamp[b] - stamp[a])
    finally:
        AsyncTransport._write_locked, AsyncTransport._lead_ready = write, read  # type: ignore[method-assign]  # restored
    return {name: statistics.median(v) / 1000 for name, v in samples.items() if v}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.rtt", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds (default 5)")
    parser.add_argument("--calls", type=int, default=5000, help="calls per system per round (default 5000)")
    parser.add_argument("--flush", choices=("async", "sync"), default="async", help="the broker's flush policy")
    parser.add_argument("--fsync", choices=("everysec", "always"), default="everysec", help="Redis's appendfsync")
    parser.add_argument(
        "--spin-us", type=int, default=0, help="also time the caller spinning this long before it blocks"
    )
    parser.add_argument(
        "--idle-spin-us",
        type=int,
        default=None,
        help="the broker's idle_spin_us (default: its own, 100; 0: the broker blocks at once)",
    )
    parser.add_argument("--hops", action="store_true", help="then time each phase of a Headwater call")
    parser.add_argument(
        "--count-calls", action="store_true", help="then count Python calls per Headwater call, client and broker"
    )
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.calls < 1:
        parser.error("--rounds and --calls must be at least 1")
    if not 0 <= args.spin_us <= 10_000:
        parser.error("--spin-us must be from 0 (no spin side) to 10000")
    if args.idle_spin_us is not None and not 0 <= args.idle_spin_us <= 1000:
        parser.error("--idle-spin-us must be from 0 (the broker blocks at once) to 1000")
    res = run(
        rounds=args.rounds,
        calls=args.calls,
        flush=args.flush,
        fsync=args.fsync,
        hops=args.hops,
        count_calls=args.count_calls,
        spin_us=args.spin_us,
        idle_spin_us=args.idle_spin_us,
    )
    verdict = "PASS" if res["ratio_median"] >= TARGET_RATIO else "MISS"
    print(
        f"send_and_wait over redis xadd ({args.fsync}), median of {args.rounds} rounds: "
        f"{res['ratio_median']:.2f} (target >= {TARGET_RATIO}): {verdict}"
    )
    if res["hops"]:
        print("one send_and_wait, p50 µs per phase: " + "; ".join(f"{k} {v:.1f}" for k, v in res["hops"].items()))
    if res["calls"]:
        print("Python calls per send_and_wait: client {client:.1f}, broker {broker:.1f}".format(**res["calls"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
