"""Consumer group rebalance benchmark: the pause in deliveries when a member joins a group of 4.

Run ``python -m bench.groups`` from the repository root (about a minute; ``--quick`` about
half). ``--json PATH`` saves the figures.

Setup, per case: a fresh ``headwater serve`` (a subprocess on a free 127.0.0.1 port, data in
a temporary directory under /tmp, removed afterwards); a queue of 12 partitions; a producer
thread sending ``RATE`` messages per second (100 B, round robin over the partitions, batches
every 10 ms, so each partition gets a message about every 2 ms); four members, each its own
process (``python -m bench.groups --member ...``), polling and committing after every batch.
Once the group is stable and deliveries are steady, a fifth member process joins. Every
member records the time of every delivery (``time.monotonic()``: CLOCK_MONOTONIC, one clock
for every process of the machine) and its assignment changes.

Figures, from the moment the fifth member calls ``join`` (its process has started and
connected; the import and connection time is not counted):

- **group-wide pause**: the longest time with no delivery to any member, from the join until
  the group is stable again (+0.5 s), next to the same figure for the steady state before the
  join (the baseline: what a pause would be without any rebalance);
- **moved-partition pause**: for each partition that changed member, the time from its last
  delivery before the hand-over to its first delivery by its new member (max and median);
- **moved**: how many of the 12 partitions changed member;
- **settled**: join to a stable group of five (polled every 20 ms).

Cases: strategies ``sticky`` and ``average`` with the default heartbeat interval (1000 ms)
and with 100 ms. The hand-over of a moved partition waits for its previous member's next
heartbeat (which tells it to give the partition up), then for that member's next ``poll``,
commit and acknowledging heartbeat, then for the new member's next heartbeat (every 50 ms
while it waits for partitions); partitions that do not move never pause.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from bench.peers.base import (
    HOST,
    ServerProcess,
    free_port,
    install_signal_handlers,
    port_open,
    temp_workdir,
    wait_until,
)

__all__ = ["main", "run_case"]

ROOT = Path(__file__).resolve().parent.parent
PARTITIONS = 12
RATE = 6000  # messages per second, all partitions together
BODY_BYTES = 100
STEADY_S = 3.0  # steady deliveries with four members before the fifth joins (also the baseline window)
AFTER_S = 3.0  # deliveries kept after the group of five is stable
SESSION_MS = 10_000
CASES = [("sticky", 1000), ("average", 1000), ("sticky", 100), ("average", 100)]


# a member process -----------------------------------------------------------------------------


def member_main(argv: list[str]) -> None:
    address, group, queue, strategy, hb_ms, log_path, stop_path = argv
    import headwater

    hw = headwater.connect(address, connect_timeout_s=30)
    events: list[str] = []
    deliveries: list[tuple[float, int, int]] = []

    def note(kind: str, tps) -> None:
        events.append(f"{kind} {time.monotonic():.6f} {' '.join(str(p) for _, p in tps)}")

    events.append(f"J {time.monotonic():.6f}")
    c = hw.consumer(
        group=group,
        subscribe=queue,
        strategy=strategy,
        session_timeout_ms=SESSION_MS,
        heartbeat_interval_ms=int(hb_ms),
        on_assign=lambda tps: note("A", tps),
        on_revoke=lambda tps: note("V", tps),
    )
    events.append(f"M {time.monotonic():.6f} {c.member_id}")
    while not os.path.exists(stop_path):
        recs = c.poll(timeout_ms=50)
        now = time.monotonic()
        deliveries.extend((now, r.partition, r.offset) for r in recs)
        if recs:
            c.commit()
    c.close()
    hw.close()
    with open(log_path, "w") as f:
        f.write("\n".join(events) + "\n")
        f.writelines(f"D {t:.6f} {p} {o}\n" for t, p, o in deliveries)


def _read(path: Path) -> dict[str, Any]:
    out: dict[str, Any] = {"join": None, "joined": None, "events": [], "deliveries": []}
    for line in path.read_text().splitlines():
        kind, t, *rest = line.split(" ")
        if kind == "J":
            out["join"] = float(t)
        elif kind == "M":
            out["joined"] = float(t)
        elif kind in ("A", "V"):
            out["events"].append((float(t), kind, [int(p) for p in rest if p]))
        elif kind == "D":
            out["deliveries"].append((float(t), int(rest[0]), int(rest[1])))
    return out


# one case ---------------------------------------------------------------------------------------


def _max_gap(times: list[float], lo: float, hi: float) -> float:
    """The longest stretch of [lo, hi] with no delivery."""
    inside = [t for t in times if lo <= t <= hi]
    points = [lo, *inside, hi]
    return max(b - a for a, b in zip(points, points[1:]))


def _holders_at(members: list[dict], t: float) -> dict[int, int]:
    """Which member (index) held each partition at time ``t``, from assignment events."""
    held: dict[int, int] = {}
    for i, m in enumerate(members):
        mine: set[int] = set()
        for when, kind, parts in m["events"]:
            if when > t:
                break
            mine = mine | set(parts) if kind == "A" else mine - set(parts)
        for p in mine:
            held[p] = i
    return held


def run_case(
    address: str, strategy: str, hb_ms: int, workdir: Path, *, steady_s: float, after_s: float
) -> dict[str, Any]:
    import headwater

    name = f"rb-{strategy}-{hb_ms}"
    hw = headwater.connect(address)
    hw.admin.create_queue(name, partitions=PARTITIONS, ttl_s=3600)
    stop = workdir / f"{name}.stop"
    logs = [workdir / f"{name}-{i}.log" for i in range(5)]
    producing = threading.Event()
    producing.set()

    def produce() -> None:
        p = hw.producer(linger_ms=2)
        body = b"x" * BODY_BYTES
        per_tick = RATE // 100
        n, t = 0, time.monotonic()
        while producing.is_set():
            for _ in range(per_tick):
                p.send(name, body, partition=n % PARTITIONS)
                n += 1
            t += 0.01
            time.sleep(max(0.0, t - time.monotonic()))
        p.close()

    def spawn(log: Path) -> subprocess.Popen:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bench.groups",
                "--member",
                address,
                name,
                name,
                strategy,
                str(hb_ms),
                str(log),
                str(stop),
            ],
            cwd=ROOT,
        )

    def stable(n: int) -> bool:
        try:
            d = hw.service.describe_group(name)
        except headwater.GroupNotFoundError:
            return False
        return len(d.members) == n and d.state == "stable"

    feeder = threading.Thread(target=produce, daemon=True)
    feeder.start()
    procs = [spawn(log) for log in logs[:4]]
    try:
        wait_until(lambda: stable(4), timeout_s=60, what="a stable group of four")
        time.sleep(steady_s)
        procs.append(spawn(logs[4]))
        wait_until(lambda: logs[4].exists() or stable(5), timeout_s=60, what="the fifth member to join")
        wait_until(lambda: stable(5), timeout_s=60, what="a stable group of five")
        stable_at = time.monotonic()
        time.sleep(after_s)
    finally:
        stop.touch()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        producing.clear()
        feeder.join(10)
    members = [_read(log) for log in logs]
    join_t = members[4]["join"]
    times = sorted(t for m in members for t, _, _ in m["deliveries"])
    before = _holders_at(members, join_t)
    after = _holders_at(members, stable_at + 0.1)
    moved = sorted(p for p in range(PARTITIONS) if before.get(p) != after.get(p))
    pauses = []
    for p in moved:
        old = [t for t, q, _ in members[before[p]]["deliveries"] if q == p and t <= stable_at + 0.1]
        new = [t for t, q, _ in members[after[p]]["deliveries"] if q == p and t >= join_t]
        last_old = max((t for t in old if t >= join_t - 1.0), default=join_t)
        if new:
            pauses.append(min(new) - last_old)
    hw.close()
    return {
        "load_average_1m": round(os.getloadavg()[0], 2),
        "strategy": strategy,
        "heartbeat_interval_ms": hb_ms,
        "join_s": round(members[4]["joined"] - join_t, 4),
        "settled_s": round(stable_at - join_t, 3),
        "moved": len(moved),
        "group_pause_ms": round(1000 * _max_gap(times, join_t, stable_at + 0.5), 1),
        "baseline_pause_ms": round(1000 * _max_gap(times, join_t - steady_s + 0.5, join_t), 1),
        "moved_pause_max_ms": round(1000 * max(pauses), 1) if pauses else None,
        "moved_pause_median_ms": round(1000 * statistics.median(pauses), 1) if pauses else None,
        "deliveries": len(times),
    }


# the run -----------------------------------------------------------------------------------------


def _table(results: list[dict[str, Any]]) -> str:
    head = (
        "| strategy | heartbeat | moved | group-wide pause | baseline | moved-partition pause max / median "
        "| join answer | settled | load (1 min) |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    )
    rows = [
        f"| {r['strategy']} | {r['heartbeat_interval_ms']} ms | {r['moved']} of {PARTITIONS} | "
        f"{r['group_pause_ms']} ms | {r['baseline_pause_ms']} ms | "
        f"{r['moved_pause_max_ms']} / {r['moved_pause_median_ms']} ms | {1000 * r['join_s']:.1f} ms | "
        f"{r['settled_s']} s | {r['load_average_1m']} |"
        for r in results
    ]
    return "\n".join([head, *rows])


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--member":
        member_main(sys.argv[2:])
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="shorter steady windows (smoke run)")
    ap.add_argument("--json", type=Path, help="save the figures here")
    ap.add_argument("--only", help="run only the cases whose name (strategy-heartbeat) contains this")
    args = ap.parse_args()
    install_signal_handlers()
    steady_s, after_s = (1.5, 1.5) if args.quick else (STEADY_S, AFTER_S)
    results = []
    with temp_workdir("headwater-bench-groups-") as workdir:
        for strategy, hb_ms in CASES:
            if args.only and args.only not in f"{strategy}-{hb_ms}":
                continue
            port = free_port()
            data = workdir / f"data-{strategy}-{hb_ms}"
            server = ServerProcess(
                "headwater",
                [
                    sys.executable,
                    "-m",
                    "headwater.cli.main",
                    "--data",
                    str(data),
                    "serve",
                    "--host",
                    HOST,
                    "--port",
                    str(port),
                    "--log-level",
                    "warning",
                ],
                log_path=workdir / f"server-{strategy}-{hb_ms}.log",
            )
            try:
                wait_until(lambda: port_open(port), timeout_s=30, what="headwater serve", alive=server.alive)  # noqa: B023 (called at once, within this iteration)
                r = run_case(f"{HOST}:{port}", strategy, hb_ms, workdir, steady_s=steady_s, after_s=after_s)
            finally:
                server.stop()
            print(json.dumps(r), flush=True)
            results.append(r)
    print()
    print(_table(results))
    if args.json:
        args.json.write_text(
            json.dumps({"rate": RATE, "partitions": PARTITIONS, "cpus": os.cpu_count(), "results": results}, indent=1)
        )


if __name__ == "__main__":
    main()
