"""Shared-group throughput with 1, 2, 4 and 8 members on a 2-partition queue.

Run ``python -m bench.shared_groups`` from the repository root (about a minute; ``--quick``
about 20 s). One broker process (``headwater serve``, data in a temporary directory under
/tmp, removed afterwards); for each member count a fresh 2-partition queue is filled with
``messages_per_member * members`` 100-byte messages (untimed), then that many member
processes of one shared group (started and connected before the clock starts) receive
batches of ``--batch`` messages, handle each with ``--work-ms`` of real work (a sleep, as a
handler waiting on a database or a service would), and ack each batch. The clock runs from
the start signal until the broker reports the group's lag as 0 (every message acked).

What it shows: a shared group is not bound to partitions, so members beyond the partition
count still add throughput, until the broker (one process, an fsync per receive and per
ack, shared by group commit) or the machine's cores become the limit. ``ideal`` is
``members * 1000 / work_ms`` messages per second: the handlers' own ceiling.

``--member`` is the entry point of the member processes (not for direct use).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MEMBERS = (1, 2, 4, 8)
PARTITIONS = 2
BODY = b"x" * 100


def member_main(address: str, group: str, queue: str, go: str, stop: str, batch: int, work_ms: float) -> None:
    import headwater

    hw = headwater.connect(address)
    c = hw.shared_consumer(group, queue, visibility_timeout_ms=60_000)
    while not os.path.exists(go):
        time.sleep(0.005)
    work_s = work_ms / 1000
    while not os.path.exists(stop):
        msgs = c.receive(max_messages=batch, timeout_ms=100)
        for _ in msgs:
            time.sleep(work_s)  # the handler's real work
        if msgs:
            c.ack(msgs)
    os._exit(0)


def _start_broker(data: Path) -> tuple[subprocess.Popen, str]:
    exe = str(Path(sys.executable).with_name("headwater"))
    proc = subprocess.Popen(
        [exe, "--data", str(data), "serve", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=open(data.parent / "broker.log", "ab"),
    )  # noqa: SIM115
    assert proc.stdout is not None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stdout.readline().decode()
        if line.startswith("listening "):
            return proc, "127.0.0.1:" + line.rsplit(":", 1)[1].strip()
        if not line and proc.poll() is not None:
            break
    raise RuntimeError(f"the broker did not start; see {data.parent / 'broker.log'}")


def run_one(hw, address: str, work: Path, members: int, messages: int, batch: int, work_ms: float) -> dict:
    queue, group = f"q{members}", f"g{members}"
    hw.admin.create_queue(queue, partitions=PARTITIONS)
    for p in range(PARTITIONS):
        for i in range(0, messages // PARTITIONS, 500):
            hw.send_batch(queue, [BODY] * min(500, messages // PARTITIONS - i), partition=p)
    go, stop = work / f"go-{members}", work / f"stop-{members}"
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bench.shared_groups",
                "--member",
                address,
                group,
                queue,
                str(go),
                str(stop),
                str(batch),
                str(work_ms),
            ],
            cwd=ROOT,
        )
        for _ in range(members)
    ]
    time.sleep(1.0 + 0.3 * members)  # let them import and connect before the clock starts
    go.touch()
    t0 = time.monotonic()
    while True:
        time.sleep(0.01)
        try:
            info = hw.service.shared_describe(group, queue)
        except Exception:  # noqa: BLE001 - no receive yet: the group does not exist
            continue
        if info.lag == 0:
            break
    elapsed = time.monotonic() - t0
    stop.touch()
    for p in procs:
        p.wait(30)
    return {
        "members": members,
        "messages": messages,
        "seconds": round(elapsed, 3),
        "msgs_per_s": round(messages / elapsed),
        "ideal_msgs_per_s": round(members * 1000 / work_ms) if work_ms else None,
    }  # no work: no ceiling


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--member":
        a = argv[1:]
        member_main(a[0], a[1], a[2], a[3], a[4], int(a[5]), float(a[6]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer messages (a smoke run)")
    parser.add_argument("--batch", type=int, default=16, help="messages per receive (default 16)")
    parser.add_argument("--work-ms", type=float, default=1.0, help="handler time per message (default 1 ms)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "shared_groups.json")
    args = parser.parse_args(argv)
    if args.work_ms < 0 or args.batch < 1:
        parser.error("--work-ms is 0 or more (0: no work, the broker's own pace) and --batch 1 or more")
    per_member = 600 if args.quick else 2500

    import headwater
    from bench import machine

    with tempfile.TemporaryDirectory(prefix="hw-bench-shared-", dir="/tmp") as tmp:
        work = Path(tmp)
        fsync = machine.fsync_latency(work)
        broker, address = _start_broker(work / "data")
        try:
            hw = headwater.connect(address)
            rows = [run_one(hw, address, work, k, per_member * k, args.batch, args.work_ms) for k in MEMBERS]
            hw.close()
        finally:
            broker.terminate()
            broker.wait(30)
    base = rows[0]["msgs_per_s"]
    print(
        f"shared group on a {PARTITIONS}-partition queue, batch {args.batch}, {args.work_ms} ms of work per "
        f"message; fsync p50 {fsync['p50_ms']:.2f} ms"
    )
    print(f"{'members':>7} {'messages':>8} {'seconds':>8} {'msgs/s':>8} {'vs 1':>6} {'ideal':>7}")
    for r in rows:
        print(
            f"{r['members']:>7} {r['messages']:>8} {r['seconds']:>8.2f} {r['msgs_per_s']:>8} "
            f"{r['msgs_per_s'] / base:>5.2f}x {r['ideal_msgs_per_s'] or '-':>7}"
        )
    rises = rows[2]["msgs_per_s"] > rows[1]["msgs_per_s"] and rows[3]["msgs_per_s"] > rows[1]["msgs_per_s"]
    print(f"throughput rises past {PARTITIONS} members (the partition count): {'yes' if rises else 'NO'}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "when": time.strftime("%Y-%m-%d %H:%M:%S"),
                "batch": args.batch,
                "work_ms": args.work_ms,
                "partitions": PARTITIONS,
                "fsync": fsync,
                "cpus": os.cpu_count(),
                "rows": rows,
                "rises_past_partitions": rises,
            },
            indent=2,
        )
        + "\n"
    )
    return 0 if rises else 1


if __name__ == "__main__":
    sys.exit(main())
