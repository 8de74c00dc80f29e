"""Consuming with a commit after every poll, beside Redis Streams XREADGROUP + XACK.

Issue 32, target 2 and the commit's part of target 1, in one run and in alternating rounds
(every round runs every case once, so the host's noise lands on all of them alike):

- **consume + commit**: 100 B messages read from one partition by a consumer of a group
  that commits after every poll (``commit()``, and ``commit_async()``), against one
  stream read by XREADGROUP (COUNT 500) with an XACK of the ids of every read, the Redis
  equivalent of a consumer group's progress. Ratio against the 3x target.
- **plain streaming consume**: the same without a commit (the fetch stream), against
  1.5 M msg/s.
- **end-to-end latency with a commit after each poll**: a producer sends one message at a
  time at ``--rate`` msg/s (a blocking send, Headwater's ``send``, Redis's ``XADD``), a
  consumer in another process polls, commits (``commit()`` / XACK) and records each
  message's age (CLOCK_MONOTONIC is shared by the processes); p50, p99, p99.9, max.

Both servers run as processes of their own: ``headwater serve --flush async`` (offsets
async, the default) and ``redis-server --appendonly yes --appendfsync everysec``. Run from
the repository root: ``python -m bench.commits`` (``--quick`` for a smoke run).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import headwater
from bench.peers.base import free_port, wait_until

HOST = "127.0.0.1"
QUEUE = "bench"
STREAM = "bench"
COUNT = 500  # messages per poll / XREADGROUP, as bench.network reads
SIZE = 100
CONSUME_TARGET = 3.0  # consume + commit: at least 3x Redis XREADGROUP + XACK
STREAM_TARGET = 1_500_000  # plain streaming consume, msg/s
_STAMP = struct.Struct("<q")
# --compare-reads: (system, fetch stream?, commit after each poll) beside the default runs
_COMPARED = [("headwater", False, "sync"), ("headwater", True, "async"), ("headwater", False, "async")]


def start_servers(work: Path, offsets_flush: str = "async") -> tuple[list[subprocess.Popen], str, int]:
    """A Headwater broker and a Redis server, each a process; (processes, address, port)."""
    hw_port, redis_port = free_port(), free_port()
    exe = str(Path(sys.executable).with_name("headwater"))
    broker = subprocess.Popen(
        [exe, "serve", "--data", str(work / "hw"), "--host", HOST, "--port", str(hw_port), "--flush", "async",
         "--set", f"offsets_flush={offsets_flush}"],
        stdout=subprocess.DEVNULL,
        stderr=open(work / "headwater.log", "wb"),  # noqa: SIM115 - the child keeps it open
    )  # fmt: skip
    (work / "redis").mkdir()
    redis = subprocess.Popen(
        [shutil.which("redis-server") or "redis-server", "--bind", HOST, "--port", str(redis_port), "--dir",
         str(work / "redis"), "--appendonly", "yes", "--appendfsync", "everysec", "--save", "", "--logfile", ""],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    address = f"{HOST}:{hw_port}"
    wait_until(lambda: _pings(address), timeout_s=30, what="headwater serve")
    wait_until(lambda: _redis(redis_port).ping(), timeout_s=30, what="redis-server")
    return [broker, redis], address, redis_port


def _pings(address: str) -> bool:
    try:
        with headwater.connect(address, connect_timeout_s=0.5):
            return True
    except headwater.UnavailableError:
        return False


def _redis(port: int) -> Any:
    import redis

    return redis.Redis(host=HOST, port=port, socket_timeout=30)


def fill(address: str, port: int, total: int) -> None:
    body = b"x" * SIZE
    with headwater.connect(address) as hw:
        hw.admin.create_queue(QUEUE, partitions=1, ttl_s=None)
        for _ in range(0, total, 1000):
            hw.send_batch(QUEUE, [body] * 1000, partition=0)
    r = _redis(port)
    for _ in range(0, total, 1000):
        p = r.pipeline(transaction=False)
        for _ in range(1000):
            p.xadd(STREAM, {"d": body})
        p.execute()


def consume_headwater(address: str, total: int, commit: str) -> float:
    """msg/s reading ``total`` messages, committing after every poll as ``commit`` says
    (``sync``: commit(), ``async``: commit_async(), ``none``)."""
    with headwater.connect(address) as hw:
        c = hw.consumer(group=f"g-{uuid.uuid4().hex[:8]}", max_poll_messages=COUNT)
        c.assign(QUEUE, 0)
        got, t0 = 0, time.perf_counter()
        while got < total:
            n = len(c.poll(max_messages=COUNT, timeout_ms=5000))
            got += n
            if commit == "sync":
                c.commit()
            elif commit == "async":
                c.commit_async()
        c.close()  # waits for the commits in flight: counted
        return got / (time.perf_counter() - t0)


def consume_redis(port: int, total: int) -> float:
    """msg/s reading ``total`` entries with XREADGROUP and acknowledging each read's ids."""
    r = _redis(port)
    group = f"g-{uuid.uuid4().hex[:8]}"
    r.xgroup_create(STREAM, group, id="0")
    got, t0 = 0, time.perf_counter()
    while got < total:
        res = r.xreadgroup(group, "c", {STREAM: ">"}, count=COUNT, block=5000)
        ids = [i for i, _ in res[0][1]] if res else []
        if ids:
            r.xack(STREAM, group, *ids)
        got += len(ids)
    rate = got / (time.perf_counter() - t0)
    r.xgroup_destroy(STREAM, group)
    return rate


# -- end-to-end latency with a commit after each poll -----------------------------------


def _latency_consumer(
    system: str, where: Any, total: int, ready: Any, out: Any, stream: bool = True, commit: str = "sync"
) -> None:
    ages: list[int] = []
    if system == "headwater":
        with headwater.connect(where) as hw:
            c = hw.consumer(group=f"l-{uuid.uuid4().hex[:8]}", stream=stream)
            c.assign(QUEUE, 0)
            c.seek_to_end(QUEUE)
            ready.set()
            while len(ages) < total:
                for rec in c.poll(timeout_ms=200):
                    ages.append(time.perf_counter_ns() - _STAMP.unpack_from(rec.body)[0])
                if commit == "sync":
                    c.commit()
                elif commit == "async":
                    c.commit_async()
            c.close()
    else:
        r = _redis(where)
        group = f"l-{uuid.uuid4().hex[:8]}"
        r.xgroup_create(STREAM, group, id="$")
        ready.set()
        while len(ages) < total:
            res = r.xreadgroup(group, "c", {STREAM: ">"}, count=COUNT, block=200)
            now = time.perf_counter_ns()
            entries = res[0][1] if res else []
            for _, fields in entries:
                ages.append(now - _STAMP.unpack_from(fields[b"d"])[0])
            if entries:
                r.xack(STREAM, group, *[i for i, _ in entries])
    out.put(ages)


def latency(
    system: str, where: Any, rate: int, seconds: float, stream: bool = True, commit: str = "sync"
) -> dict[str, float]:
    """p50/p99/p99.9/max ms of ``rate`` msg/s for ``seconds``, one blocking send at a time
    (``stream``: Headwater's consumer reads a fetch stream, else long-polling fetches;
    ``commit``: after each poll, ``sync`` commit(), ``async`` commit_async(), ``none``)."""
    total = int(rate * seconds)
    ctx = mp.get_context("spawn")  # a fresh interpreter: no client state copied
    ready, out = ctx.Event(), ctx.Queue()
    proc = ctx.Process(target=_latency_consumer, args=(system, where, total, ready, out, stream, commit))
    proc.start()
    ready.wait(30)
    pad = b"x" * (SIZE - _STAMP.size)
    interval_ns = 1_000_000_000 // rate
    if system == "headwater":
        hw = headwater.connect(where)
        send = lambda body: hw.send(QUEUE, body, partition=0)  # noqa: E731 - one line each
    else:
        r = _redis(where)
        send = lambda body: r.xadd(STREAM, {"d": body})  # noqa: E731
    nxt = time.perf_counter_ns()
    for _ in range(total):
        while (now := time.perf_counter_ns()) < nxt:
            if nxt - now > 200_000:
                time.sleep((nxt - now - 100_000) / 1e9)
        send(_STAMP.pack(time.perf_counter_ns()) + pad)
        nxt += interval_ns
    ages = sorted(out.get(timeout=60))
    proc.join(10)
    if system == "headwater":
        hw.close()

    def q(p: float) -> float:
        return ages[min(len(ages) - 1, int(p * len(ages)))] / 1e6

    return {"p50": q(0.50), "p99": q(0.99), "p99.9": q(0.999), "max": ages[-1] / 1e6}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    ap.add_argument("--messages", type=int, default=300_000, help="messages each consume reads (default 300,000)")
    ap.add_argument("--rate", type=int, default=2000, help="end-to-end: msg/s (default 2,000)")
    ap.add_argument("--seconds", type=float, default=5.0, help="end-to-end: seconds per run (default 5)")
    ap.add_argument(
        "--offsets-flush", choices=("async", "sync"), default="async", help="the broker's offsets_flush (default async)"
    )
    ap.add_argument(
        "--compare-reads",
        action="store_true",
        help="end-to-end also with stream=False and with commit_async (the fetch stream's tail, issue 32)",
    )
    ap.add_argument("--quick", action="store_true", help="a smoke run: 1 round, 50,000 messages, 2 s")
    args = ap.parse_args(argv)
    if args.quick:
        args.rounds, args.messages, args.seconds = 1, 50_000, 2.0
    work = Path(tempfile.mkdtemp(prefix="bench-commits-"))
    procs, address, port = start_servers(work, args.offsets_flush)
    rows: dict[str, list[float]] = {}
    try:
        fill(address, port, args.messages)
        for rnd in range(args.rounds):
            cases = [
                ("headwater consume + commit()", lambda: consume_headwater(address, args.messages, "sync")),
                ("headwater consume + commit_async()", lambda: consume_headwater(address, args.messages, "async")),
                ("headwater streaming consume", lambda: consume_headwater(address, args.messages, "none")),
                ("redis XREADGROUP + XACK", lambda: consume_redis(port, args.messages)),
            ]
            for name, fn in cases[rnd % 4 :] + cases[: rnd % 4]:  # rotate who runs first
                rows.setdefault(name, []).append(fn())
            runs = [("headwater", address, True, "sync"), ("redis", port, True, "sync")]
            if args.compare_reads:  # where the tail goes: the fetch stream against FETCH, commit_async
                runs += [(system, address, stream, how) for system, stream, how in _COMPARED]
            for system, where, stream, how in runs[:: 1 if rnd % 2 == 0 else -1]:
                lat = latency(system, where, args.rate, args.seconds, stream=stream, commit=how)
                name = (
                    system
                    + ("" if stream else " (stream=False)")
                    + (" + commit" if how == "sync" else " + commit_async")
                )
                for k, v in lat.items():
                    rows.setdefault(f"e2e {name} {k} ms", []).append(v)
            print(f"round {rnd + 1} done", file=sys.stderr)
    finally:
        for p in procs:
            p.terminate()
            p.wait(20)
        shutil.rmtree(work, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in rows.items()}
    for k, v in rows.items():
        print(f"{k:52s} median {med[k]:>12,.2f}   rounds " + ", ".join(f"{x:,.2f}" for x in v))
    redis_rate = med["redis XREADGROUP + XACK"]
    for name in ("headwater consume + commit()", "headwater consume + commit_async()"):
        ratio = med[name] / redis_rate
        print(
            f"{name} / redis: {ratio:.2f}x (target {CONSUME_TARGET}x: {'PASS' if ratio >= CONSUME_TARGET else 'MISS'})"
        )
    s = med["headwater streaming consume"]
    print(f"streaming consume: {s:,.0f} msg/s (target {STREAM_TARGET:,}: {'PASS' if s >= STREAM_TARGET else 'MISS'})")
    for k in ("p50", "p99"):
        h, r = med[f"e2e headwater + commit {k} ms"], med[f"e2e redis + commit {k} ms"]
        print(f"e2e with a commit after each poll {k}: headwater {h:.2f} ms, redis {r:.2f} ms ({h / r:.2f}x)")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
