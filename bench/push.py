"""Push subscription benchmark: end-to-end latency at 2,000 msgs/s, and what filtering costs.

Run ``python -m bench.push`` from the repository root (about a minute; ``--quick`` about
half). Two parts:

- **latency**: ``headwater serve`` in a subprocess (fresh data directory under /tmp, removed
  afterwards), one producer process sending 2,000 msgs/s of 100 B one at a time on a fixed
  schedule (``Producer.send``, ``linger_ms=0``, a send callback stamping each ack), and one
  subscriber process (``client.subscribe``) whose listener stamps each message. Latency =
  time the listener got it - time it was scheduled to be sent, CLOCK_MONOTONIC on both
  sides; the first 200 messages are not counted. Run for ``flush`` async and sync, and once
  more with a tag filter (the subscriber wants one tag of four: only a quarter of the
  messages are pushed), and once with the asyncio subscriber (``headwater.aio``: the
  same subscription as a task on the subscriber's event loop). Target: p99 <= 5 ms. Two shares
  are reported beside it: the
  producer's acknowledgements (scheduled send to ack, the produce path alone), and append to
  listener (the broker's append time, a whole-ms wall clock stamp, to the listener's wall
  clock: the push path alone, ±1 ms).
- **filter**: the broker's filter alone, in this process, on stored batches of 100 messages
  (tags drawn from four; keys from 1,000): time per batch and bytes out for no filter, a tag
  filter taking a quarter, a keyed filter (member 1 of 4), both as *selections* (push
  frames, keyed fetches) and as *runs* (FETCH with a tag mask), for 16 B, 100 B and 1 KiB
  bodies. Bytes out are given relative to the stored bytes.

``--json FILE`` saves the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.machine import SPIN_NS, sleep_until_ns
from bench.peers.base import HOST, STAMP, ServerProcess, free_port, percentile, port_open, wait_until

__all__ = ["main"]

RATE = 2000
SIZE = 100
WARMUP = 200
TARGET_P99_MS = 5.0
QUEUE = "bench"
TAGS = ["a", "b", "c", "d"]


# --------------------------------------------------------------------------- latency


def _subscriber(address: str, name: str, total: int, ready, results, timeout_s: float, flavour: str = "sync") -> None:
    import headwater

    stamps: list[tuple[int, int, int, float]] = []
    clock = time.monotonic_ns

    def stamp(r) -> None:
        sched, seq = STAMP.unpack_from(r.body)
        # and the push's own share: the broker's append time (wall clock, whole ms) to now
        stamps.append((sched, seq, clock(), time.time() * 1000 - r.timestamp_ms))

    async def subscribe_asyncio() -> None:
        import headwater.aio

        hw = await headwater.aio.connect(address)
        sub = hw.subscribe(QUEUE, name, listeners=[stamp])
        await asyncio.sleep(0.2)
        ready.set()
        await sub.wait_for(lambda: len(stamps) >= total, timeout_s=timeout_s)
        await hw.close()  # stops the subscriber
        if sub.error is not None:
            raise sub.error

    try:
        if flavour == "asyncio":
            asyncio.run(subscribe_asyncio())
            results.put({"role": "subscriber", "stamps": stamps})
            return
        hw = headwater.connect(address)
        sub = hw.subscribe(QUEUE, name, listeners=[stamp])
        time.sleep(0.2)
        ready.set()
        deadline = time.monotonic() + timeout_s
        while len(stamps) < total and time.monotonic() < deadline and sub.running:
            time.sleep(0.05)
        sub.stop()
        hw.close()
        results.put({"role": "subscriber", "stamps": stamps})
    except BaseException as e:  # noqa: BLE001
        ready.set()
        results.put({"role": "subscriber", "error": f"{type(e).__name__}: {e}"[:300]})


def _producer(address: str, total: int, rate: int, size: int, tagged: bool, ready, results) -> None:
    import headwater

    try:
        hw = headwater.connect(address)
        p = hw.producer(linger_ms=0)
        pad = os.urandom(max(0, size - STAMP.size))
        interval = 1_000_000_000 // rate
        if not ready.wait(60):
            raise TimeoutError("the subscriber was not ready in 60 s")
        clock = time.monotonic_ns
        t0 = clock() + 50_000_000
        late = 0
        acked: list[tuple[int, int]] = []  # (scheduled, acknowledged) ns, for the producer's share
        failed: list[BaseException] = []

        def on_ack(sched: int) -> Any:
            def done(_mid: Any, exc: BaseException | None) -> None:
                if exc is not None:
                    failed.append(exc)
                elif sched:
                    acked.append((sched, clock()))

            return done

        for seq in range(total):
            sched = t0 + seq * interval
            sleep_until_ns(sched, SPIN_NS)
            if clock() - sched > 1_000_000:
                late += 1
            # tagged: every fourth message carries the subscribed tag, the others the rest
            tag = TAGS[seq % 4] if tagged else None
            # a callback rather than kept futures: 10,000 futures held to the end made the
            # producer's garbage collections long enough to delay its sends
            p.send(
                QUEUE,
                headwater.Message(STAMP.pack(sched, seq) + pad, tag=tag),
                partition=0,
                callback=on_ack(sched if seq >= WARMUP else 0),
            )
        end = clock()
        p.flush(60)
        if failed:
            raise failed[0]
        p.close()
        hw.close()
        ack = sorted((a - s) / 1e6 for s, a in acked)
        results.put(
            {
                "role": "producer",
                "late": late,
                "rate": total / ((end - t0) / 1e9),
                "ack_p50_ms": percentile(ack, 50),
                "ack_p99_ms": percentile(ack, 99),
            }
        )
    except BaseException as e:  # noqa: BLE001
        results.put({"role": "producer", "error": f"{type(e).__name__}: {e}"[:300]})


def run_latency(workdir: Path, flush: str, seconds: float, *, tagged: bool, flavour: str = "sync") -> dict[str, Any]:
    import headwater

    port = free_port()
    data = workdir / f"data-{flush}-{int(tagged)}-{flavour}"
    server = ServerProcess(
        f"headwater-{flush}",
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
            "--flush",
            flush,
            "--log-level",
            "warning",
        ],
        log_path=workdir / f"server-{flush}-{int(tagged)}-{flavour}.log",
    )
    try:
        wait_until(lambda: port_open(port), timeout_s=30, what="headwater serve", alive=server.alive)
        address = f"{HOST}:{port}"
        hw = headwater.connect(address)
        hw.admin.create_queue(QUEUE)
        hw.admin.add_subscriber(QUEUE, "bench", tags=["a"] if tagged else None)
        hw.close()
        total = WARMUP + int(RATE * seconds)
        expect = total // 4 if tagged else total
        ctx = mp.get_context("spawn")
        results, ready = ctx.Queue(), ctx.Event()
        procs = [
            ctx.Process(target=_subscriber, args=(address, "bench", expect, ready, results, seconds + 60, flavour)),
            ctx.Process(target=_producer, args=(address, total, RATE, SIZE, tagged, ready, results)),
        ]
        for proc in procs:
            proc.start()
        outs = [results.get(timeout=seconds + 120) for _ in procs]
        for proc in procs:
            proc.join(10)
        errors = [o["error"] for o in outs if "error" in o]
        if errors:
            return {"error": errors[0]}
        sub = next(o for o in outs if o["role"] == "subscriber")
        prod = next(o for o in outs if o["role"] == "producer")
        lat = sorted((r - s) / 1e6 for s, seq, r, _ in sub["stamps"] if seq >= WARMUP)
        pushed = sorted(a for _, seq, _, a in sub["stamps"] if seq >= WARMUP)
        seqs = [seq for _, seq, _, _ in sub["stamps"]]
        return {
            "flush": flush,
            "tagged": tagged,
            "subscriber": flavour,
            "received": len(seqs),
            "expected": expect,
            "in_order": seqs == sorted(seqs),
            "counted": len(lat),
            "sent_late": prod["late"],
            "rate": prod["rate"],
            "ack_p50_ms": prod["ack_p50_ms"],
            "ack_p99_ms": prod["ack_p99_ms"],
            "append_to_listener_p50_ms": percentile(pushed, 50),
            "append_to_listener_p99_ms": percentile(pushed, 99),
            "p50_ms": percentile(lat, 50),
            "p99_ms": percentile(lat, 99),
            "p999_ms": percentile(lat, 99.9),
            "max_ms": lat[-1],
        }
    finally:
        server.stop()


# --------------------------------------------------------------------------- filter cost


def run_filter(size: int, batches: int) -> dict[str, Any]:
    from headwater import Message
    from headwater.model.batch import encode_batch, patch_batch, tags_mask
    from headwater.model.filtering import TagFilter, TagMaskFilter, filter_batches, select_batches
    from headwater.model.keyed import KeyHashFilter

    rnd = random.Random(7)
    stored = []
    for i in range(batches):
        msgs = [
            Message(rnd.randbytes(size), key=b"user-%d" % rnd.randrange(1000), tag=rnd.choice(TAGS)) for _ in range(100)
        ]
        stored.append(bytes(patch_batch(encode_batch(msgs), 1, 0, i * 100, 1_800_000_000_000)))
    total = sum(map(len, stored))
    out: dict[str, Any] = {"body_bytes": size, "batches": batches, "stored_bytes": total}
    cases = {
        "tag 1/4, selections": lambda: select_batches(stored, TagFilter(frozenset({"a"})))[0],
        "tag 1/4, runs": lambda: filter_batches(stored, TagMaskFilter(tags_mask(["a"]))),
        "key member 1 of 4, selections": lambda: select_batches(stored, KeyHashFilter(None, 4, 1))[0],
        "none": lambda: select_batches(stored, None)[0],
    }
    for name, fn in cases.items():
        fn()  # warm
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            res = fn()
            times.append(time.perf_counter() - t0)
        best = min(times)
        out[name] = {
            "us_per_batch": best / batches * 1e6,
            "stored_mb_per_s": total / best / 1e6,
            "bytes_out_ratio": sum(len(b) for b in res) / total,
        }
    return out


# --------------------------------------------------------------------------- report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="shorter runs (smoke test)")
    ap.add_argument("--json", metavar="FILE", help="save the figures as JSON")
    args = ap.parse_args(argv)
    seconds = 2.0 if args.quick else 5.0
    report: dict[str, Any] = {"rate": RATE, "size": SIZE, "seconds": seconds, "latency": [], "filter": []}
    with tempfile.TemporaryDirectory(prefix="hw-bench-push-", dir="/tmp") as d:
        for flush, tagged, flavour in (
            ("async", False, "sync"),
            ("sync", False, "sync"),
            ("async", True, "sync"),
            ("async", False, "asyncio"),
        ):
            res = run_latency(Path(d), flush, seconds, tagged=tagged, flavour=flavour)
            report["latency"].append(res)
            label = (
                f"{flush}{' + tag filter' if tagged else ''}{', asyncio subscriber' if flavour == 'asyncio' else ''}"
            )
            if "error" in res:
                print(f"latency {label}: ERROR {res['error']}")
                continue
            verdict = "PASS" if res["p99_ms"] <= TARGET_P99_MS else "MISS"
            print(
                f"latency {label}: p50 {res['p50_ms']:.2f} ms, p99 {res['p99_ms']:.2f} ms, "
                f"p99.9 {res['p999_ms']:.2f} ms, max {res['max_ms']:.2f} ms (the producer's acks: p50 "
                f"{res['ack_p50_ms']:.2f}, p99 {res['ack_p99_ms']:.2f} ms; append to listener: p50 "
                f"{res['append_to_listener_p50_ms']:.2f}, p99 {res['append_to_listener_p99_ms']:.2f} ms, "
                f"±1 ms); {res['received']:,} of "
                f"{res['expected']:,} received, in order: {res['in_order']}, {res['sent_late']:,} sent "
                f">1 ms late, {res['rate']:,.0f}/s  [{verdict}: p99 <= {TARGET_P99_MS} ms]"
            )
    for size in (16, 100, 1024):
        res = run_filter(size, 200 if args.quick else 1000)
        report["filter"].append(res)
        print(f"filter, {size} B bodies, batches of 100 ({res['stored_bytes'] / 1e6:.1f} MB stored):")
        for name in ("none", "tag 1/4, selections", "tag 1/4, runs", "key member 1 of 4, selections"):
            r = res[name]
            print(
                f"  {name:32s} {r['us_per_batch']:8.1f} µs/batch  {r['stored_mb_per_s']:8.1f} MB/s  "
                f"bytes out {r['bytes_out_ratio']:.3f} of stored"
            )
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
