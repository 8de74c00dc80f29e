"""Cluster benchmark: one broker against three, the same client work.

Run ``python -m bench.cluster`` from the repository root (about a minute; ``--quick`` about
half). ``--json PATH`` saves the figures.

Setup, per case: a ZooKeeper from Debian's package (``headwater.cluster.local_zookeeper``)
for the cluster case, and ``headwater serve`` processes on free 127.0.0.1 ports, data in a
temporary directory under /tmp (removed afterwards): **one** broker running alone, or
**three** brokers of one cluster. A queue of ``PARTITIONS`` partitions (flush async): on three
brokers the controller places two partitions on each. One client process, bootstrapped
from the first broker's address, sends ``BODY_BYTES`` messages round robin with one
producer (batches of up to 1,000 messages, linger 5 ms) for ``SEND_S`` seconds, then a
consumer assigned every partition reads them all.

Figures: acknowledged sends per second, consumed messages per second, and the ratio of
three brokers to one; then, on the cluster, what METADATA costs (one call, and the routed
client's refresh), and the pause of a moved partition: a fourth broker joins, and while a
producer sends about ``PAUSE_RATE`` messages per second to every partition (linger 0,
acknowledgement times taken in the futures' callbacks), ``cluster rebalance`` moves
partitions to it; the figure is the longest gap between two acknowledgements of each moved
partition, next to the longest gap of the partitions that did not move (the baseline).

The machine's facts (cores, CPU model) are printed with the figures: three
brokers and the client on one machine share its cores, so on a small machine the figures
show the cost of routing and of more processes, not a cluster's scaling, which needs
brokers on machines of their own.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.peers.base import free_port, wait_until

__all__ = ["main", "run_case"]

ROOT = Path(__file__).resolve().parent.parent
PARTITIONS = 6
BODY_BYTES = 100
SEND_S = 8.0
HEADWATER = str(Path(sys.executable).with_name("headwater"))
PAUSE_RATE = 2000  # messages per second over all partitions while partitions move


def _serve(data: Path, *extra: str) -> tuple[subprocess.Popen, str]:
    log = open(data.parent / f"{data.name}.log", "ab")  # noqa: SIM115 - the child keeps it open
    proc = subprocess.Popen(
        [HEADWATER, "serve", "--data", str(data), "--host", "127.0.0.1", "--port", "0", *extra],
        stdout=subprocess.PIPE,
        stderr=log,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stdout.readline().decode()
        if line.startswith("listening "):
            return proc, line.split()[1]
        if not line and proc.poll() is not None:
            break
    raise RuntimeError(f"broker at {data} did not start; see {data.parent / (data.name + '.log')}")


def client_work(bootstrap: str, send_s: float) -> dict[str, float]:
    """The measured part, in this process: send for ``send_s`` seconds, then read it all."""
    import headwater

    body = b"x" * BODY_BYTES
    with headwater.connect(bootstrap, connect_timeout_s=30) as hw:
        hw.admin.create_queue("bench", partitions=PARTITIONS, flush="async")
        with hw.producer(linger_ms=5) as producer:
            sent = 0
            started = time.monotonic()
            while time.monotonic() - started < send_s:
                for i in range(1000):
                    producer.send("bench", body, partition=(sent + i) % PARTITIONS)
                sent += 1000
            producer.flush()
            send_elapsed = time.monotonic() - started
        consumer = hw.consumer(auto_offset_reset="earliest")
        consumer.assign("bench")
        got = 0
        started = time.monotonic()
        while got < sent and time.monotonic() - started < 120:
            got += len(consumer.poll(10_000, timeout_ms=500))
        read_elapsed = time.monotonic() - started
        consumer.close()
    return {"sent": sent, "send_per_s": sent / send_elapsed, "read": got, "read_per_s": got / read_elapsed}


def run_case(brokers: int, send_s: float) -> dict[str, Any]:
    procs: list[subprocess.Popen] = []
    zk = None
    with tempfile.TemporaryDirectory(prefix="hw-bench-cluster-", dir="/tmp") as tmp:
        work = Path(tmp)
        try:
            if brokers == 1:
                proc, address = _serve(work / "b1")
                procs.append(proc)
                addresses = [address]
            else:
                from headwater.cluster.local_zookeeper import LocalZooKeeper

                zk = LocalZooKeeper(work / "zookeeper", port=free_port()).start()
                addresses = []
                for i in range(1, brokers + 1):
                    proc, address = _serve(work / f"b{i}", "--zookeeper", zk.hosts, "--broker-id", str(i))
                    procs.append(proc)
                    addresses.append(address)
                wait_until(lambda: _controller_elected(addresses[0]), timeout_s=60, what="a controller")
            figures = client_work(",".join(addresses), send_s)
            if zk is not None:
                figures |= metadata_cost(",".join(addresses))
                hosts = zk.hosts

                def fourth() -> None:
                    procs.append(_serve(work / "b4", "--zookeeper", hosts, "--broker-id", "4")[0])

                figures |= move_pause(",".join(addresses), fourth)
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait(30)
            if zk is not None:
                zk.stop()
    return {"brokers": brokers, **figures}


def metadata_cost(bootstrap: str, calls: int = 200) -> dict[str, float]:
    """Median microseconds of one METADATA call (every queue) and of a routed client's
    refresh of its table."""
    import statistics

    import headwater

    with headwater.connect(bootstrap) as hw:
        one = []
        for _ in range(calls):
            t = time.perf_counter()
            hw.admin.cluster_metadata()
            one.append((time.perf_counter() - t) * 1e6)
        refresh = []
        for _ in range(calls // 10):
            time.sleep(0.15)  # past the client's refresh gate (at most one refresh per 0.1 s)
            t = time.perf_counter()
            hw.service.refresh()
            refresh.append((time.perf_counter() - t) * 1e6)
    return {"metadata_us": statistics.median(one), "refresh_us": statistics.median(refresh)}


def move_pause(bootstrap: str, start_fourth: Callable[[], None]) -> dict[str, float]:
    """The longest gap between acknowledgements of each partition while a rebalance moves
    some of them to a broker that just joined."""
    import threading

    import headwater

    acks: dict[int, list[float]] = {p: [] for p in range(PARTITIONS)}
    stop = threading.Event()
    with headwater.connect(bootstrap) as hw:
        hw.admin.delete_queue("bench")  # the moves are then of this queue's partitions alone
        hw.admin.create_queue("moving", partitions=PARTITIONS)  # two on each of the three brokers
        start_fourth()
        wait_until(lambda: len(hw.admin.cluster_metadata([]).brokers) == 4, timeout_s=60, what="broker 4 joining")

        def send() -> None:
            with hw.producer(linger_ms=0) as producer:
                n = 0
                while not stop.is_set():
                    p = n % PARTITIONS
                    f = producer.send("moving", b"x" * BODY_BYTES, partition=p)
                    f.add_done_callback(lambda f, p=p: f.exception() or acks[p].append(time.monotonic()))
                    n += 1
                    time.sleep(1 / PAUSE_RATE)

        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        time.sleep(1.0)
        began = time.monotonic()
        moved = {m.partition for m in hw.admin.rebalance() if m.queue == "moving"}
        wait_until(lambda: not hw.admin.cluster_metadata([]).moves, timeout_s=120, what="the moves")
        ended = time.monotonic()
        time.sleep(1.0)
        stop.set()
        sender.join(30)

    def longest_gap(p: int) -> float:
        times = [t for t in acks[p] if began - 0.5 <= t <= ended + 0.5]
        return max((b - a for a, b in zip(times, times[1:])), default=0.0) * 1000

    still = [longest_gap(p) for p in range(PARTITIONS) if p not in moved]
    gone = [longest_gap(p) for p in moved]
    return {
        "moved_partitions": len(gone),
        "moved_pause_ms_max": max(gone, default=0.0),
        "unmoved_gap_ms_max": max(still, default=0.0),
        "moves_s": ended - began,
    }


def _controller_elected(address: str) -> bool:
    import headwater

    with headwater.connect(address) as hw:
        return hw.admin.cluster_metadata([]).controller != -1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="send for a third of the time")
    ap.add_argument("--json", type=Path, help="save the figures here")
    args = ap.parse_args()
    send_s = SEND_S / 3 if args.quick else SEND_S
    from bench.machine import facts, revision

    machine = facts("/tmp")
    print(f"machine: {machine['nproc']} CPUs, {machine['cpu_model']}; commit {revision()}")
    rows = [run_case(1, send_s), run_case(3, send_s)]
    one, three = rows
    print(f"{'brokers':>8} {'sent/s':>12} {'read/s':>12}")
    for r in rows:
        print(f"{r['brokers']:>8} {r['send_per_s']:>12,.0f} {r['read_per_s']:>12,.0f}")
    print(
        f"three / one: sends {three['send_per_s'] / one['send_per_s']:.2f}x, "
        f"reads {three['read_per_s'] / one['read_per_s']:.2f}x"
    )
    print(
        f"METADATA (every queue): {three['metadata_us']:,.0f} us; routed client refresh: {three['refresh_us']:,.0f} us"
    )
    print(
        f"rebalance to a 4th broker: {three['moved_partitions']} partition(s) moved in {three['moves_s']:.1f} s; "
        f"longest pause of a moved partition {three['moved_pause_ms_max']:,.0f} ms "
        f"(partitions not moved: longest gap {three['unmoved_gap_ms_max']:,.0f} ms)"
    )
    if args.json:
        args.json.write_text(json.dumps({"machine": machine, "cases": rows}, indent=2))


if __name__ == "__main__":
    main()
