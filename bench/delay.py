"""Delay benchmark: 200,000 messages due within the same 10 seconds (or ``--window-s``).

Run ``python -m bench.delay`` from the repository root (about a minute). A broker process
(``headwater serve``, async flush unless ``--flush sync``) runs on a free 127.0.0.1 port
with its data under /tmp (removed afterwards); this process produces and consumes over TCP.

1. Plain sends: ``--messages`` messages of 100 B with ``Producer.send`` (linger 5 ms,
   ``--partitions`` partitions, round robin), timed to the end of ``flush()``: messages/s.
2. Delayed sends: the same number, the same way, each with ``deliver_at``; all due within
   one 10 s window that starts ``--lead-s`` after the sends begin (by default long enough
   for every send to be accepted first). Message *i* is due at ``start + 10 s * i / n``:
   the times rise with the send order, as with traffic sent with a fixed delay, so messages
   sent in the same millisecond share a time and a batch. ``--spread random`` shuffles the
   times instead (almost every message its own batch: the worst case for batching).
   ``--window-s 86400`` spreads them over a day (the producer groups those due ten minutes
   ahead or more by the minute). Acceptance rate: messages/s to the end of ``flush()``, and
   its ratio to (1). Target >= 50%.
3. Delivery: a consumer (this process) long-polls every partition from before the window
   until it has every message (of a window longer than ``--watch-s``, 30 s: those due in its
   first ``--watch-s`` seconds; the rest stay scheduled when the broker stops). *Delivery
   lateness* = the record's append time (``timestamp_ms``, the broker's clock when the
   dispatcher appended it) minus its due time (``scheduled_ms``): p50 / p99 / max. Target
   p99 <= 100 ms. *Seen lateness* adds the consumer's side: the wall clock when this process
   got it minus its due time. Both clocks are this machine's ``CLOCK_REALTIME``. The
   broker's own view (``delay stats``) is printed too.
4. ``--cancels K`` (a wide window): then cancel K of the messages due a minute or more after
   the watch, in random order, each timed (their buckets are mostly not loaded: due beyond
   the lookahead). ``--lead-s 18000 --window-s 3600 --watch-s 0 --cancels 100``: every
   message due within one hour, five hours ahead, none awaited. Then three ``delay_stats``
   calls, timed.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import headwater
from bench import machine

ROOT = Path(__file__).resolve().parent.parent
HEADWATER = str(Path(sys.executable).with_name("headwater"))
BODY = b"x" * 100
WINDOW_S = 10.0
WATCH_S = 30.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_broker(data: Path, flush: str) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    proc = subprocess.Popen(
        [HEADWATER, "--data", str(data), "serve", "--port", str(port), "--flush", flush, "--log-level", "warning"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        line = proc.stdout.readline().decode()
        if line.startswith("listening "):
            return proc, f"127.0.0.1:{port}"
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise RuntimeError("the broker did not start")


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(int(q * len(s)), len(s) - 1)]


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc)."""
    return sum(machine.process_cpu_times(pid))


def _send(
    hw,
    queue: str,
    n: int,
    partitions: int,
    times: list[int] | None,
    cpu: dict | None = None,
    broker_pid: int = 0,
    count_objects: bool = False,
    futures: list | None = None,
    **settings: int,
) -> float:
    """Send n messages (with deliver times when given); seconds to the end of flush(). The
    sends' futures go to ``futures`` when given.
    ``count_objects``: five times during the sends, the objects the garbage collector tracks
    beyond those before, beside the messages waiting in the producer (into ``cpu``; the
    counting takes time of its own)."""
    p = hw.producer(linger_ms=5, partitioner="round_robin", **settings)
    gc_s = [0.0, 0.0]  # the client's time in the cyclic garbage collector, and when one began
    gc_runs = [0, 0, 0]  # its collections by generation

    def _gc_timer(phase: str, info: dict) -> None:
        if phase == "start":
            gc_s[1] = time.perf_counter()
            gc_runs[info["generation"]] += 1
        else:
            gc_s[0] += time.perf_counter() - gc_s[1]

    samples: list[tuple[int, int]] = []  # (objects tracked beyond the start, messages waiting)
    every = max(n // 5, 1) if count_objects else n + 1
    base = len(gc.get_objects()) if count_objects else 0
    gc.callbacks.append(_gc_timer)
    c0, b0 = time.process_time(), _cpu_s(broker_pid) if broker_pid else 0.0
    t = time.perf_counter()
    for start in range(0, n, every):
        if times is None:
            for _ in range(start, min(start + every, n)):
                p.send(queue, BODY)
        else:
            for i in range(start, min(start + every, n)):
                f = p.send(queue, BODY, partition=i % partitions, deliver_at=times[i])
                if futures is not None:
                    futures.append(f)
        if count_objects:
            with p._lock:  # the producer's own view: what its batches hold now
                waiting = sum(len(b.messages) for b in p._core.pending())
            samples.append((len(gc.get_objects()) - base, waiting))
    p.flush()
    took = time.perf_counter() - t
    gc.callbacks.remove(_gc_timer)
    if cpu is not None:
        cpu["client_cpu_s"] = round(time.process_time() - c0, 2)
        cpu["client_gc_s"] = round(gc_s[0], 2)
        cpu["client_gc_runs"] = gc_runs
        cpu["broker_cpu_s"] = round(_cpu_s(broker_pid) - b0, 2) if broker_pid else None
        if count_objects:
            cpu["tracked_vs_waiting"] = samples
    p.close()
    return took


def run(
    n: int,
    partitions: int,
    flush: str,
    spread: str,
    lead_s: float | None,
    count_objects: bool = False,
    window_s: float = WINDOW_S,
    watch_s: float = WATCH_S,
    cancels: int = 0,
    **settings: int,
) -> dict:
    """One run; ``settings`` go to the delayed sends' producer (``delay_bucket_ms``, ...)."""
    tmp = Path(tempfile.mkdtemp(prefix="hw-bench-delay-"))
    proc, address = _start_broker(tmp / "data", flush)
    try:
        with headwater.connect(address) as hw:
            hw.admin.create_queue("plain", partitions=partitions, ttl_s=None)
            hw.admin.create_queue("delayed", partitions=partitions, ttl_s=None)
            plain_cpu: dict = {}
            delayed_cpu: dict = {}
            plain_s = _send(hw, "plain", n, partitions, None, plain_cpu, proc.pid, count_objects)
            # the window opens once every send is surely accepted (3x the plain time, >= 5 s)
            lead = lead_s if lead_s is not None else max(5.0, 3 * plain_s + 2)
            start_ms = int((time.time() + lead) * 1000)
            times = [start_ms + int(window_s * 1000 * i / n) for i in range(n)]
            watched = min(window_s, watch_s)
            due_watched = sum(1 for t in times if t < start_ms + watched * 1000)
            if spread == "random":
                random.Random(3).shuffle(times)
            cons = hw.consumer(fetch_bytes=4 << 20, max_poll_messages=5000)
            cons.assign("delayed")
            sent: list = []
            delayed_s = _send(
                hw, "delayed", n, partitions, times, delayed_cpu, proc.pid, count_objects, sent, **settings
            )
            accepted_at = time.time()
            late_ms: list[int] = []
            seen_ms: list[float] = []
            got = 0
            deadline = time.monotonic() + lead + watched + 60
            while got < due_watched and time.monotonic() < deadline:
                recs = cons.poll(timeout_ms=200)
                now = time.time() * 1000
                for r in recs:
                    late_ms.append(r.timestamp_ms - r.scheduled_ms)
                    seen_ms.append(now - r.scheduled_ms)
                got += len(recs)
            cons.close()
            cancel_ms = _cancel(hw, sent, times, start_ms + (watched + 60) * 1000, cancels)
            stats_ms = []
            for _ in range(3):  # what status and a metrics scrape ask
                t = time.perf_counter()
                stats = hw.delay_stats()
                stats_ms.append(round((time.perf_counter() - t) * 1000, 1))
        return {
            "messages": n,
            "partitions": partitions,
            "flush": flush,
            "spread": spread,
            "window_s": window_s,
            "watched_s": watched,
            "due_watched": due_watched,
            "plain_msgs_per_s": round(n / plain_s),
            "delayed_msgs_per_s": round(n / delayed_s),
            "acceptance_ratio": round(plain_s / delayed_s, 3),
            "cpu_s": {"plain": plain_cpu, "delayed": delayed_cpu},
            "accepted_before_window_s": round(start_ms / 1000 - accepted_at, 2),
            "delivered": got,
            "cancel_ms": cancel_ms,
            "delay_stats_ms": stats_ms,
            "lateness_ms": {
                "p50": _pct(late_ms, 0.5),
                "p99": _pct(late_ms, 0.99),
                "max": max(late_ms),
                "mean": round(statistics.fmean(late_ms), 1),
            }
            if late_ms
            else None,
            "seen_lateness_ms": {
                "p50": round(_pct(seen_ms, 0.5), 1),
                "p99": round(_pct(seen_ms, 0.99), 1),
                "max": round(max(seen_ms), 1),
            }
            if seen_ms
            else None,
            "broker_stats": {
                "delivered_total": stats.delivered_total,
                "lateness_p50_ms": stats.lateness_p50_ms,
                "lateness_p99_ms": stats.lateness_p99_ms,
                "lateness_max_ms": stats.lateness_max_ms,
            },
        }
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(tmp, ignore_errors=True)


def _cancel(hw, sent: list, times: list[int], after_ms: int, k: int) -> list[float]:
    """Cancel ``k`` of the messages due after ``after_ms`` (a minute past the watched part of
    the window: none comes due meanwhile), in random order: each cancel's milliseconds."""
    later = [f.result() for f, t in zip(sent, times) if t >= after_ms]
    took = []
    for mid in random.Random(5).sample(later, min(k, len(later))):
        t = time.perf_counter()
        hw.cancel(mid)
        took.append((time.perf_counter() - t) * 1000)
    return took


def _print(r: dict) -> None:
    lat, seen = r["lateness_ms"], r["seen_lateness_ms"]
    print(
        f"delay benchmark: {r['messages']:,} messages of 100 B due within {r['window_s']:g} s, "
        f"{r['partitions']} partitions, {r['flush']} flush, {r['spread']} times"
    )
    print(f"  plain sends     {r['plain_msgs_per_s']:>10,} msgs/s")
    print(
        f"  delayed sends   {r['delayed_msgs_per_s']:>10,} msgs/s   = {r['acceptance_ratio']:.0%} of plain "
        f"(target >= 50%)"
    )
    c = r["cpu_s"]
    print(
        f"  CPU seconds while sending: plain client {c['plain']['client_cpu_s']}, broker "
        f"{c['plain']['broker_cpu_s']}; delayed client {c['delayed']['client_cpu_s']}, broker "
        f"{c['delayed']['broker_cpu_s']}"
    )
    print(
        f"  of which the client's garbage collector: plain {c['plain']['client_gc_s']} s, "
        f"delayed {c['delayed']['client_gc_s']} s (collections by generation: "
        f"{c['plain']['client_gc_runs']}, {c['delayed']['client_gc_runs']})"
    )
    for kind in ("plain", "delayed"):
        if "tracked_vs_waiting" in c[kind]:
            pairs = ", ".join(f"{t:,}/{w:,}" for t, w in c[kind]["tracked_vs_waiting"])
            print(f"  {kind}: objects the collector tracks beyond the start / messages waiting: {pairs}")
    print(
        f"  all accepted {r['accepted_before_window_s']} s before the window opened; delivered "
        f"{r['delivered']:,} of {r['due_watched']:,}"
        + (f" (those due in its first {r['watched_s']:g} s)" if r["due_watched"] < r["messages"] else "")
    )
    if lat:
        print(
            f"  delivery lateness (append time - due)   p50 {lat['p50']} ms  p99 {lat['p99']} ms  "
            f"max {lat['max']} ms   (target p99 <= 100 ms)"
        )
        print(
            f"  seen lateness (consumer got it - due)   p50 {seen['p50']} ms  p99 {seen['p99']} ms  "
            f"max {seen['max']} ms"
        )
    if r["cancel_ms"]:
        c = r["cancel_ms"]
        print(
            f"  cancels of messages due later: {len(c)}, the first {c[0]:.1f} ms, then p50 "
            f"{_pct(c[1:] or c, 0.5):.1f} ms, max {max(c[1:] or c):.1f} ms"
        )
    b = r["broker_stats"]
    calls = ", ".join(map(str, r["delay_stats_ms"]))
    print(
        f"  broker's delay stats ({calls} ms a call): delivered {b['delivered_total']:,}, lateness p50 "
        f"{b['lateness_p50_ms']} ms, p99 {b['lateness_p99_ms']} ms, max {b['lateness_max_ms']} ms"
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.delay", description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--flush", choices=("async", "sync"), default="async")
    ap.add_argument("--spread", choices=("rising", "random"), default="rising")
    ap.add_argument("--lead-s", type=float, default=None, help="seconds from the sends to the window")
    ap.add_argument("--window-s", type=float, default=WINDOW_S, help="seconds the due times spread over (10)")
    ap.add_argument(
        "--watch-s", type=float, default=WATCH_S, help="delivery is awaited for this much of the window (30)"
    )
    ap.add_argument("--delay-bucket-ms", type=int, default=None, help="the delayed producer's delay_bucket_ms")
    ap.add_argument("--delay-batches-max", type=int, default=None, help="the delayed producer's delay_batches_max")
    ap.add_argument(
        "--count-objects",
        action="store_true",
        help="count the objects the garbage collector tracks while messages wait (slows the sends)",
    )
    ap.add_argument(
        "--cancels", type=int, default=0, help="then cancel this many of the messages due after the watch, timed"
    )
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args(argv)
    settings = {
        k: v
        for k, v in (("delay_bucket_ms", args.delay_bucket_ms), ("delay_batches_max", args.delay_batches_max))
        if v is not None
    }
    r = run(
        args.messages,
        args.partitions,
        args.flush,
        args.spread,
        args.lead_s,
        args.count_objects,
        window_s=args.window_s,
        watch_s=args.watch_s,
        cancels=args.cancels,
        **settings,
    )
    _print(r)
    if args.json:
        args.json.write_text(json.dumps(r, indent=2) + "\n")


if __name__ == "__main__":
    main()
