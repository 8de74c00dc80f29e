"""Storage benchmark: append and scan throughput of the embedded store, as ratios to the disk.

Run ``python -m bench.storage`` (about two and a half minutes; ``--quick`` under one) from
the repository root. Every case runs in a fresh ``python -m bench.storage --case NAME``
subprocess on a fresh data directory under /tmp (removed afterwards), so one case's page
cache, heap and GC state do not bleed into the next. The machine's raw sequential write
bandwidth is measured at the start and at the end of the run (see :mod:`bench.machine`);
every figure is also printed as a ratio to the higher of the two.

Cases:

- ``append-<size>-b<batch>-<flush>``: one thread calls ``Producer.send_batch`` with a list
  of ``batch`` bodies of ``size`` bytes for a fixed time. Encoding is inside the timed loop:
  the producer builds the record batch from the list of bodies on every call. *written*
  stops the clock when the last send returns; *incl. final flush* also counts ``close()``, which
  fsyncs what the async flusher has not yet (async writes land in the page cache first).
- ``append16-<size>-b<batch>-sync``: 16 threads share one client and one producer, sync
  flush (each send returns after the fsync that covers it; group commit shares fsyncs).
- ``scan-<size>-b<batch>``: data written with that batch size, the store closed and opened
  again, then scanners over the whole queue are timed, pass after pass until ~2 s have
  passed. The data is in the page cache (the benchmark does not drop the machine's caches),
  so this is the store's and the client's CPU cost of reading, not the disk's.
- ``partitions<N>-100B-b<batch>-async``: the same number of batches sent round robin to a
  queue of 1 or 10,000 partitions, every partition getting several; run interleaved
  (1, 10,000, 1, 10,000) and compared by median.

Payload MB/s counts message bodies only (MB = 10**6 bytes); the log's own bytes (headers,
framing) are in the JSON output as ``log_bytes``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench import machine

__all__ = ["Case", "Settings", "build_cases", "run_case", "main"]

ROOT = Path(__file__).resolve().parent.parent
QUEUE = "bench"
MB = machine.MB
POOL_LISTS = 8  # distinct lists of bodies the loops rotate through
CHILD_TIMEOUT_S = 300


@dataclass(frozen=True)
class Settings:
    """How long each case runs; ``QUICK`` is for a smoke run, ``FULL`` for the record."""

    name: str
    duration_s: float  # each timed append case
    scan_setup_s: float  # time spent writing the data a scan case reads
    scan_setup_bytes_max: int  # ... or until this much payload is written
    scan_min_s: float  # scan the data again until this much time has passed
    partition_workloads: tuple[tuple[int, int], ...]  # (batch, batches per partition)
    partition_rounds: int  # runs of each partition count, interleaved
    raw_write_bytes: int
    fsync_samples: int


FULL = Settings(
    "full",
    duration_s=3.0,
    scan_setup_s=2.0,
    scan_setup_bytes_max=768 * machine.MIB,
    scan_min_s=2.0,
    partition_workloads=((32, 10), (500, 3)),
    partition_rounds=2,
    raw_write_bytes=1 << 30,
    fsync_samples=200,
)
QUICK = Settings(
    "quick",
    duration_s=1.0,
    scan_setup_s=0.7,
    scan_setup_bytes_max=256 * machine.MIB,
    scan_min_s=0.5,
    partition_workloads=((32, 3),),
    partition_rounds=2,
    raw_write_bytes=256 * machine.MIB,
    fsync_samples=100,
)

SIZES = (100, 1024)
BATCHES = (1, 32, 500)
MANY_PARTITIONS = 10_000
APPENDERS = 16


@dataclass(frozen=True)
class Case:
    name: str
    kind: str  # machine | append | append16 | scan | partitions
    body_bytes: int = 100
    batch: int = 500
    flush: str = "async"
    partitions: int = 1
    appenders: int = 1
    batches_total: int = 0  # partitions cases: a fixed count instead of a fixed time


def _size_label(n: int) -> str:
    return f"{n // 1024}KiB" if n % 1024 == 0 else f"{n}B"


def build_cases(settings: Settings) -> list[Case]:
    """Every case of a run, in the order they run (partition rounds are added by the plan)."""
    cases = [Case("machine-start", "machine"), Case("machine-end", "machine")]
    for flush in ("async", "sync"):
        for size in SIZES:
            for batch in BATCHES:
                name = f"append-{_size_label(size)}-b{batch}-{flush}"
                cases.append(Case(name, "append", size, batch, flush))
    for size in SIZES:
        for batch in BATCHES:
            cases.append(
                Case(
                    f"append16-{_size_label(size)}-b{batch}-sync", "append16", size, batch, "sync", appenders=APPENDERS
                )
            )
    for size in SIZES:
        for batch in BATCHES:
            cases.append(Case(f"scan-{_size_label(size)}-b{batch}", "scan", size, batch))
    for batch, per_partition in settings.partition_workloads:
        for parts in (1, MANY_PARTITIONS):
            cases.append(
                Case(
                    f"partitions{parts}-100B-b{batch}-async",
                    "partitions",
                    100,
                    batch,
                    partitions=parts,
                    batches_total=MANY_PARTITIONS * per_partition,
                )
            )
    return cases


def plan(settings: Settings, only: str | None = None) -> list[str]:
    """Case names in run order: machine first and last, partition counts interleaved."""
    cases = build_cases(settings)
    names = [c.name for c in cases if c.kind not in ("machine", "partitions")]
    if only:
        names = [n for n in names if only in n]
    for batch, _ in settings.partition_workloads:
        pair = [f"partitions1-100B-b{batch}-async", f"partitions{MANY_PARTITIONS}-100B-b{batch}-async"]
        if only and not any(only in n for n in pair):
            continue
        names += pair * settings.partition_rounds
    return ["machine-start", *names, "machine-end"]


# -- one case, in its own process -------------------------------------------------------------


@contextlib.contextmanager
def _data_dir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(dir="/tmp", prefix="hw-bench-"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _bodies_pool(body_bytes: int, batch: int) -> list[list[bytes]]:
    return [[os.urandom(body_bytes) for _ in range(batch)] for _ in range(POOL_LISTS)]


def _open(d: Path, flush: str, partitions: int):
    import headwater

    hw = headwater.open(d / "data", flush=flush)
    hw.admin.create_queue(QUEUE, partitions=partitions, ttl_s=None)
    return hw


def _log_bytes(d: Path) -> int:
    return sum(f.stat().st_size for f in (d / "data" / "log").glob("*.log"))


def _fsyncs(hw) -> int | None:
    """The store's fsync count (an internal statistic; None if the layout changed)."""
    try:
        return int(hw.service.store.stats()["fsyncs"])
    except Exception:  # noqa: BLE001 - a benchmark extra, never worth failing for
        return None


def _close_timed(hw) -> float:
    start = time.perf_counter()
    hw.close()
    return time.perf_counter() - start


def run_append(case: Case, settings: Settings) -> dict:
    """One thread, fixed duration; ``close_s`` is the final flush async writes still owe."""
    pool = _bodies_pool(case.body_bytes, case.batch)
    with _data_dir() as d:
        hw = _open(d, case.flush, case.partitions)
        send = hw.producer(partitioner="round_robin").send_batch
        send(QUEUE, pool[0])  # warm the producer's metadata; not counted
        sends = 0
        clock = time.perf_counter
        start = clock()
        deadline = start + settings.duration_s
        while True:
            send(QUEUE, pool[sends % POOL_LISTS])
            sends += 1
            if clock() >= deadline:
                break
        elapsed_s = clock() - start
        fsyncs = _fsyncs(hw)
        close_s = _close_timed(hw)
        log_bytes = _log_bytes(d)
    return {
        "msgs": sends * case.batch,
        "sends": sends,
        "elapsed_s": elapsed_s,
        "close_s": close_s,
        "durable_elapsed_s": elapsed_s + close_s,
        "fsyncs": fsyncs,
        "log_bytes": log_bytes,
    }


def run_append16(case: Case, settings: Settings) -> dict:
    """``case.appenders`` threads, one shared client and producer, fixed duration."""
    pool = _bodies_pool(case.body_bytes, case.batch)
    with _data_dir() as d:
        hw = _open(d, case.flush, case.partitions)
        send = hw.producer(partitioner="round_robin").send_batch
        send(QUEUE, pool[0])
        stop = threading.Event()
        barrier = threading.Barrier(case.appenders + 1)
        counts = [0] * case.appenders
        errors: list[BaseException] = []

        def appender(i: int) -> None:
            bodies = pool[i % POOL_LISTS]
            n = 0
            barrier.wait()
            try:
                while not stop.is_set():
                    send(QUEUE, bodies)
                    n += 1
            except BaseException as e:  # noqa: BLE001 - reported by the parent
                errors.append(e)
            counts[i] = n

        threads = [threading.Thread(target=appender, args=(i,)) for i in range(case.appenders)]
        for t in threads:
            t.start()
        barrier.wait()
        start = time.perf_counter()
        time.sleep(settings.duration_s)
        stop.set()
        for t in threads:
            t.join()
        elapsed_s = time.perf_counter() - start  # includes the sends in flight at the stop
        fsyncs = _fsyncs(hw)
        close_s = _close_timed(hw)
        log_bytes = _log_bytes(d)
    if errors:
        raise RuntimeError(f"{len(errors)} appender(s) failed: {errors[0]!r}")
    sends = sum(counts)
    return {
        "msgs": sends * case.batch,
        "sends": sends,
        "elapsed_s": elapsed_s,
        "close_s": close_s,
        "durable_elapsed_s": elapsed_s + close_s,
        "fsyncs": fsyncs,
        "log_bytes": log_bytes,
        "sends_per_appender_min": min(counts),
        "sends_per_appender_max": max(counts),
    }


def run_scan(case: Case, settings: Settings) -> dict:
    """Write for a while (untimed), close, open again, time one scanner over everything."""
    import headwater

    pool = _bodies_pool(case.body_bytes, case.batch)
    with _data_dir() as d:
        hw = _open(d, "async", case.partitions)
        send = hw.producer(partitioner="round_robin").send_batch
        sends = 0
        cap_sends = max(1, settings.scan_setup_bytes_max // (case.body_bytes * case.batch))
        deadline = time.perf_counter() + settings.scan_setup_s
        while sends < cap_sends and (sends % 64 or time.perf_counter() < deadline):
            send(QUEUE, pool[sends % POOL_LISTS])
            sends += 1
        hw.close()
        written = sends * case.batch
        t0 = time.perf_counter()
        hw = headwater.open(d / "data")
        open_s = time.perf_counter() - t0
        n = passes = 0
        start = time.perf_counter()
        while passes == 0 or time.perf_counter() - start < settings.scan_min_s:
            for _record in hw.scanner(QUEUE):
                n += 1
            passes += 1
        elapsed_s = time.perf_counter() - start
        hw.close()
        log_bytes = _log_bytes(d)
    if n != written * passes:
        raise RuntimeError(f"{passes} scans read {n} messages of the {written} written")
    return {
        "msgs": n,
        "passes": passes,
        "written": written,
        "sends": sends,
        "elapsed_s": elapsed_s,
        "open_s": open_s,
        "log_bytes": log_bytes,
    }


def run_partitions(case: Case, settings: Settings) -> dict:
    """A fixed number of batches, round robin over the queue's partitions."""
    pool = _bodies_pool(case.body_bytes, case.batch)
    with _data_dir() as d:
        hw = _open(d, "async", case.partitions)
        send = hw.producer(partitioner="round_robin").send_batch
        send(QUEUE, pool[0])
        clock = time.perf_counter
        start = clock()
        for i in range(case.batches_total):
            send(QUEUE, pool[i % POOL_LISTS])
        elapsed_s = clock() - start
        ends = [p.end_offset for p in hw.admin.describe_queue(QUEUE).partitions]
        fsyncs = _fsyncs(hw)
        close_s = _close_timed(hw)
        log_bytes = _log_bytes(d)
    return {
        "msgs": case.batches_total * case.batch,
        "sends": case.batches_total,
        "elapsed_s": elapsed_s,
        "close_s": close_s,
        "durable_elapsed_s": elapsed_s + close_s,
        "fsyncs": fsyncs,
        "log_bytes": log_bytes,
        "min_batches_per_partition": min(ends) // case.batch,
    }


def run_machine(case: Case, settings: Settings) -> dict:
    d = Path(tempfile.mkdtemp(dir="/tmp", prefix="hw-bench-"))
    try:
        out = {"write": machine.write_bandwidth(d, total_bytes=settings.raw_write_bytes)}
        if case.name == "machine-start":
            out["fsync"] = machine.fsync_latency(d, samples=settings.fsync_samples)
        return out
    finally:
        shutil.rmtree(d, ignore_errors=True)


RUNNERS = {
    "machine": run_machine,
    "append": run_append,
    "append16": run_append16,
    "scan": run_scan,
    "partitions": run_partitions,
}


def run_case(name: str, settings: Settings) -> dict:
    cases = {c.name: c for c in build_cases(settings)}
    if name not in cases:
        raise SystemExit(f"unknown case {name!r}; cases: {', '.join(cases)}")
    case = cases[name]
    result = RUNNERS[case.kind](case, settings)
    # the machine is shared: the load when the case ended tells how noisy its figure is
    return {"case": name, **asdict(case), **result, "loadavg_1m": os.getloadavg()[0]}


# -- the parent: run every case in a subprocess, then report ---------------------------------


def _run_child(case: Case, quick: bool) -> dict:
    cmd = [sys.executable, "-m", "bench.storage", "--case", case.name] + (["--quick"] if quick else [])
    failed = {"case": case.name, **asdict(case)}
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {**failed, "error": f"timed out after {CHILD_TIMEOUT_S} s"}
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return {**failed, "error": " | ".join(tail) or f"exit status {proc.returncode}"}
    return json.loads(lines[-1])


@dataclass
class Row:
    label: str
    msgs_per_s: float | None = None
    mb_per_s: float | None = None
    ratio: float | None = None
    target: str = ""
    verdict: bool | None = None
    note: str = ""
    target_id: int | None = None
    measured: str = ""  # the judged figure, as the summary prints it
    cases: list[str] = field(default_factory=list)


def _rate_row(label: str, res: dict, raw_mb_s: float, *, durable: bool = False) -> Row:
    if "error" in res:
        return Row(label, note=f"failed: {res['error']}", cases=[res["case"]])
    secs = res["durable_elapsed_s"] if durable else res["elapsed_s"]
    msgs_s = res["msgs"] / secs
    mb_s = res["msgs"] * res["body_bytes"] / secs / MB
    return Row(label, msgs_s, mb_s, mb_s / raw_mb_s, cases=[res["case"]])


def build_rows(runs: dict[str, list[dict]], raw_mb_s: float, raw_low_mb_s: float | None = None) -> list[Row]:
    """Table rows; ratios use ``raw_mb_s``, target 2 also names its ratio to ``raw_low_mb_s``."""
    rows: list[Row] = []
    for name, results in runs.items():
        res = results[0]
        kind = res["kind"]
        if kind == "append":
            rows += _append_rows(name, res, raw_mb_s, raw_low_mb_s or raw_mb_s)
        elif kind == "append16":
            row = _rate_row(f"append 16 threads {_label(res)} sync", res, raw_mb_s)
            row.note = _fsync_note(res)
            _judge(row, 3, row.msgs_per_s, 100_000, "≥ 100,000 msg/s")
            rows.append(row)
        elif kind == "scan":
            row = _rate_row(f"scan {_label(res)} (page cache)", res, raw_mb_s)
            if "open_s" in res:
                row.note = (
                    f"{res['written']:,} msgs × {res['passes']} pass(es); reopening the store "
                    f"took {res['open_s'] * 1000:.0f} ms (not timed)"
                )
            if res.get("body_bytes") == 100:
                _judge(row, 4, row.msgs_per_s, 1_000_000, "≥ 1,000,000 msg/s")
            rows.append(row)
    rows += _partition_rows(runs, raw_mb_s)
    return rows


def _label(res: dict) -> str:
    return f"{_size_label(res['body_bytes'])} ×{res['batch']}" if "body_bytes" in res else res["case"]


def _judge(row: Row, target_id: int, value: float | None, floor: float, text: str) -> None:
    row.target_id, row.target = target_id, f"T{target_id} {text}"
    row.verdict = None if value is None else value >= floor
    if value is not None:
        row.measured = f"{value:,.0f} msg/s" if floor >= 1000 else f"{value:.3f} ×"


def _fsync_note(res: dict) -> str:
    if not res.get("fsyncs"):
        return ""
    return f"{res['fsyncs']:,} fsyncs, {res['sends'] / res['fsyncs']:.1f} sends per fsync"


def _append_rows(name: str, res: dict, raw_mb_s: float, raw_low_mb_s: float) -> list[Row]:
    if "error" in res:
        return [Row(f"append {name}", note=f"failed: {res['error']}", cases=[name])]
    flush, label = res["flush"], _label(res)
    if flush == "sync":
        row = _rate_row(f"append {label} sync", res, raw_mb_s)
        row.note = _fsync_note(res)
        return [row]
    written = _rate_row(f"append {label} async, written", res, raw_mb_s)
    durable = _rate_row(f"append {label} async, incl. final flush", res, raw_mb_s, durable=True)
    fsyncs = f"{res['fsyncs']} fsyncs in {res['elapsed_s']:.1f} s; " if res["fsyncs"] is not None else ""
    written.note = (
        f"{fsyncs}with final flush: {durable.msgs_per_s:,.0f} msg/s, "
        f"{durable.mb_per_s:,.1f} MB/s (close {res['close_s'] * 1000:.0f} ms)"
    )
    durable.note = f"close() took {res['close_s'] * 1000:.0f} ms"
    if res["body_bytes"] == 100 and res["batch"] == 500:
        _judge(written, 1, written.msgs_per_s, 1_000_000, "≥ 1,000,000 msg/s")
    if res["body_bytes"] == 1024 and res["batch"] == 500:
        _judge(durable, 2, durable.ratio, 0.5, "≥ 0.50 × raw")
        if raw_low_mb_s != raw_mb_s:
            durable.note += f"; {durable.mb_per_s / raw_low_mb_s:.3f} × the lower raw figure ({raw_low_mb_s:,.1f} MB/s)"
        written.note = f"{fsyncs}T2 compares the row below"
        return [written, durable]
    return [written]


def _partition_rows(runs: dict[str, list[dict]], raw_mb_s: float) -> list[Row]:
    rows: list[Row] = []
    batches = sorted({int(n.split("-b")[1].split("-")[0]) for n in runs if n.startswith("partitions")})
    for batch in batches:
        medians: dict[int, float | None] = {}
        for parts in (1, MANY_PARTITIONS):
            name = f"partitions{parts}-100B-b{batch}-async"
            good = [r for r in runs.get(name, []) if "error" not in r]
            rates = [r["msgs"] / r["elapsed_s"] for r in good]
            med = statistics.median(rates) if rates else None
            medians[parts] = med
            mb = None if med is None else med * 100 / MB
            row = Row(
                f"{parts:,} partition{'s' if parts > 1 else ''} 100B ×{batch} async, median",
                med,
                mb,
                None if mb is None else mb / raw_mb_s,
                cases=[name],
            )
            row.note = "runs: " + ", ".join(f"{x:,.0f}" for x in rates)
            if good:
                row.note += f"; ≥{min(r['min_batches_per_partition'] for r in good)} batches/partition"
            errs = [r["error"] for r in runs.get(name, []) if "error" in r]
            if errs:
                row.note += f"; failed: {errs[0]}"
            rows.append(row)
        one, many = medians[1], medians[MANY_PARTITIONS]
        share = None if not one or many is None else many / one
        _judge(rows[-1], 5, share, 0.8, "≥ 0.80 × 1 partition")
        if share is not None:
            rows[-1].note = f"{share:.3f} × 1 partition; " + rows[-1].note
    return rows


def _fmt(x: float | None, spec: str) -> str:
    return "—" if x is None else format(x, spec)


def render(console, rows: list[Row], raw_mb_s: float) -> None:
    from rich.table import Table

    table = Table(title=f"Storage engine (ratios to raw sequential write {raw_mb_s:,.1f} MB/s)")
    for col, justify in (
        ("case", "left"),
        ("msgs/s", "right"),
        ("MB/s", "right"),
        ("× raw", "right"),
        ("target", "left"),
        ("verdict", "left"),
        ("notes", "left"),
    ):
        table.add_column(col, justify=justify)
    for r in rows:
        verdict = (
            ""
            if r.target_id is None
            else ("[yellow]n/a[/]" if r.verdict is None else "[green]PASS[/]" if r.verdict else "[red]MISS[/]")
        )
        table.add_row(
            r.label,
            _fmt(r.msgs_per_s, ",.0f"),
            _fmt(r.mb_per_s, ",.1f"),
            _fmt(r.ratio, ".3f"),
            r.target,
            verdict,
            r.note,
        )
    console.print(table)


def summarize(rows: list[Row]) -> list[str]:
    names = {
        1: "embedded produce 100 B ×500 async ≥ 1M msg/s",
        2: "1 KiB ×500 async ≥ 50% of raw write bandwidth (incl. final flush)",
        3: "16 appenders, sync flush ≥ 100k msg/s",
        4: "scan 100 B ≥ 1M msg/s",
        5: "10,000 partitions within 20% of 1 partition",
    }
    lines = []
    for tid, text in names.items():
        judged = [r for r in rows if r.target_id == tid]
        met = [f"{r.label} ({r.measured})" for r in judged if r.verdict]
        missed = [f"{r.label} ({r.measured})" for r in judged if r.verdict is False]
        if not judged or all(r.verdict is None for r in judged):
            lines.append(f"T{tid} {text}: not measured")
        elif not missed:
            lines.append(f"T{tid} {text}: MET by {'; '.join(met)}")
        elif not met:
            lines.append(f"T{tid} {text}: MISSED by {'; '.join(missed)}")
        else:
            lines.append(f"T{tid} {text}: met by {'; '.join(met)} — missed by {'; '.join(missed)}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.storage",
        description="Append and scan throughput of the embedded store, as ratios to the machine's "
        "raw sequential write bandwidth. Data goes to temporary directories under /tmp.",
    )
    parser.add_argument("--quick", action="store_true", help="shorter cases (a smoke run, not for the record)")
    parser.add_argument("--json", metavar="PATH", help="also save every measurement as JSON to PATH")
    parser.add_argument("--only", metavar="TEXT", help="run only the cases whose name contains TEXT")
    parser.add_argument(
        "--case",
        metavar="NAME",
        help="run one case in this process and print its result as JSON "
        "(what each subprocess runs; handy under cProfile)",
    )
    parser.add_argument("--list", action="store_true", help="list the cases of a run and exit")
    args = parser.parse_args(argv)
    settings = QUICK if args.quick else FULL
    if args.case:
        print(json.dumps(run_case(args.case, settings)))
        return 0
    if args.list:
        print("\n".join(plan(settings, args.only)))
        return 0
    return _run_all(args, settings)


def _run_all(args: argparse.Namespace, settings: Settings) -> int:
    from rich.console import Console

    console = Console() if sys.stdout.isatty() else Console(width=200)
    command = "python -m bench.storage" + "".join(f" {a}" for a in sys.argv[1:])
    facts = {**machine.facts("/tmp"), "revision": machine.revision()}
    console.print(f"[bold]{command}[/]  ({settings.name} run)")
    console.print(", ".join(f"{k}={v}" for k, v in facts.items()))
    runs: dict[str, list[dict]] = {}
    order = plan(settings, args.only)
    cases = {c.name: c for c in build_cases(settings)}
    with console.status("") as status:
        for i, name in enumerate(order, 1):
            status.update(f"[{i}/{len(order)}] {name}")
            res = _run_child(cases[name], args.quick)
            runs.setdefault(name, []).append(res)
            console.log(f"{name}: " + (f"[red]{res['error']}[/]" if "error" in res else _brief(res)))
    limits = {k: runs.pop(k)[0] for k in ("machine-start", "machine-end")}
    raw = [m["write"]["mb_per_s"] for m in limits.values() if "write" in m]
    if not raw:
        console.print("[red]could not measure the disk; no ratios[/]")
        return 1
    raw_mb_s = max(raw)  # the higher makes every ratio (and target 2) the harder to meet
    fs = limits["machine-start"].get("fsync", {})
    console.print(
        f"raw sequential write: start {_fmt(_mb(limits['machine-start']), ',.1f')} MB/s, "
        f"end {_fmt(_mb(limits['machine-end']), ',.1f')} MB/s (ratios use {raw_mb_s:,.1f}); "
        f"fsync 4 KiB p50 {_fmt(fs.get('p50_ms'), '.2f')} ms, "
        f"p99 {_fmt(fs.get('p99_ms'), '.2f')} ms"
    )
    rows = build_rows(runs, raw_mb_s, min(raw))
    render(console, rows, raw_mb_s)
    verdicts = summarize(rows)
    for line in verdicts:
        console.print(line)
    if args.json:
        out = {
            "command": command,
            "settings": asdict(settings),
            "machine": facts,
            "limits": limits,
            "raw_mb_per_s_used": raw_mb_s,
            "runs": runs,
            "rows": [asdict(r) for r in rows],
            "targets": verdicts,
        }
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
        console.print(f"saved {args.json}")
    return 0


def _mb(limit: dict) -> float | None:
    return limit.get("write", {}).get("mb_per_s")


def _brief(res: dict) -> str:
    if res.get("kind") == "machine":
        w, f = res["write"], res.get("fsync")
        fsync = f", fsync p50 {f['p50_ms']:.2f} ms p99 {f['p99_ms']:.2f} ms" if f else ""
        return f"{w['mb_per_s']:,.1f} MB/s{fsync}"
    return f"{res['msgs'] / res['elapsed_s']:,.0f} msgs/s ({res['msgs']:,} in {res['elapsed_s']:.2f} s)"


if __name__ == "__main__":
    raise SystemExit(main())
