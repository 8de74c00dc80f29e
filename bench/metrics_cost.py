"""What the broker's Prometheus metrics cost on the produce path (issue 33: at most 3 %).

Run ``python -m bench.metrics_cost`` from the repository root (about 1 minute; ``--quick``
about 20 s). Two ``headwater serve`` brokers run side by side on free 127.0.0.1 ports, data in
temporary directories, async flush: one with metrics (the default), one with ``--set
metrics=false``. One client process (this one) produces to them in turn, ABBA order (on,
off, off, on, ...) so a drift of the machine's load falls on both alike: batches of 500 × 100
B to one partition (``--batch``), each acknowledged before the next, for ``--round-s``
seconds a round.

Printed: each side's median messages per second over its rounds, the ratio on ÷ off (target
≥ 0.97), the median of the per-pair ratios, and each broker's CPU per message (its own
/proc figures: the cost itself, less blurred by the client's share of the machine; their
ratio off ÷ on reads like the throughput ratio), then the
time of one METRICS request with the queues and groups the run made. ``--json`` prints the
figures as JSON too.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import machine

__all__ = ["main", "TARGET_RATIO"]

HEADWATER = str(Path(sys.executable).with_name("headwater"))
TARGET_RATIO = 0.97
BATCH = 500
BODY = b"x" * 100
QUEUE = "cost"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(data: Path, *extra: str) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    proc = subprocess.Popen(
        [HEADWATER, "--data", str(data), "serve", "--port", str(port), "--log-level", "warning", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stdout.readline().decode()
        if line.startswith("listening "):
            return proc, f"127.0.0.1:{port}"
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise RuntimeError(f"the broker {' '.join(extra) or '(metrics on)'} did not start")


def _round(hw: Any, pid: int, seconds: float, batch: int = BATCH) -> tuple[float, float]:
    """Produce for ``seconds``: (messages per second, broker CPU µs per message)."""
    messages = [BODY] * batch
    cpu0 = sum(machine.process_cpu_times(pid))
    sent = 0
    start = time.perf_counter()
    end = start + seconds
    while time.perf_counter() < end:
        hw.send_batch(QUEUE, messages, partition=0)
        sent += batch
    took = time.perf_counter() - start
    cpu = sum(machine.process_cpu_times(pid)) - cpu0
    return sent / took, cpu / sent * 1e6


def _scrape_ms(hw: Any, times: int = 5) -> float:
    took = []
    for _ in range(times):
        t = time.perf_counter()
        hw.admin.metrics()
        took.append((time.perf_counter() - t) * 1000)
    return statistics.median(took)


def run(rounds: int, round_s: float, batch: int = BATCH, console: Any = print) -> dict[str, Any]:
    import headwater

    with tempfile.TemporaryDirectory(prefix="hw-metrics-cost-") as tmp:
        off_proc, off_addr = _start(Path(tmp) / "off", "--set", "metrics=false")
        on_proc, on_addr = _start(Path(tmp) / "on")
        try:
            with headwater.connect(on_addr) as on, headwater.connect(off_addr) as off:
                sides = {"on": (on, on_proc.pid), "off": (off, off_proc.pid)}
                for hw, pid in sides.values():
                    hw.admin.create_queue(QUEUE, partitions=1)
                    _round(hw, pid, min(1.0, round_s), batch)  # warm up: first segment, connection, caches
                rates: dict[str, list[float]] = {"on": [], "off": []}
                cpus: dict[str, list[float]] = {"on": [], "off": []}
                for i in range(rounds):
                    order = ("on", "off") if i % 2 == 0 else ("off", "on")
                    for side in order:
                        rate, cpu = _round(*sides[side], round_s, batch)
                        rates[side].append(rate)
                        cpus[side].append(cpu)
                    console(f"round {i + 1}/{rounds}: on {rates['on'][-1]:,.0f}  off {rates['off'][-1]:,.0f} msgs/s")
                scrape = _scrape_ms(on)
        finally:
            for p in (on_proc, off_proc):
                p.terminate()
                p.wait(timeout=30)
    med = {k: statistics.median(v) for k, v in rates.items()}
    return {
        "batch": batch,
        "rounds": rounds,
        "round_s": round_s,
        "on_msgs_per_s": round(med["on"]),
        "off_msgs_per_s": round(med["off"]),
        "ratio": round(med["on"] / med["off"], 4),
        "pair_ratio_median": round(statistics.median(a / b for a, b in zip(rates["on"], rates["off"])), 4),
        "broker_cpu_us_per_msg_on": round(statistics.median(cpus["on"]), 3),
        "broker_cpu_us_per_msg_off": round(statistics.median(cpus["off"]), 3),
        "cpu_ratio": round(statistics.median(cpus["off"]) / statistics.median(cpus["on"]), 4),
        "scrape_ms": round(scrape, 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.metrics_cost", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="4 rounds of 2 s a side (a smoke run)")
    parser.add_argument("--rounds", type=int, default=10, help="rounds, each running both sides once (10)")
    parser.add_argument("--round-s", type=float, default=3.0, help="seconds one side produces in a round (3)")
    parser.add_argument(
        "--batch", type=int, default=BATCH, help=f"messages per produce ({BATCH}; 1: the per-request cost)"
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON too")
    args = parser.parse_args(argv)
    rounds, round_s = (4, 2.0) if args.quick else (args.rounds, args.round_s)
    res = run(rounds, round_s, args.batch)
    verdict = "PASS" if res["ratio"] >= TARGET_RATIO else "MISS"
    print(
        f"produce 100 B x{args.batch}, async, 1 partition: metrics on {res['on_msgs_per_s']:,} msgs/s, "
        f"off {res['off_msgs_per_s']:,} msgs/s"
    )
    print(
        f"ratio on/off {res['ratio']:.3f} (median of pairs {res['pair_ratio_median']:.3f}); "
        f"target >= {TARGET_RATIO}: {verdict}"
    )
    print(
        f"broker CPU per message: on {res['broker_cpu_us_per_msg_on']:.3f} us, "
        f"off {res['broker_cpu_us_per_msg_off']:.3f} us (off/on {res['cpu_ratio']:.3f}); "
        f"one METRICS request {res['scrape_ms']:.2f} ms"
    )
    if args.json:
        print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
