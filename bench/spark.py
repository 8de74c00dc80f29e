"""Spark benchmark: batch read from a queue next to Parquet, and streaming queue -> queue.

Run ``python -m bench.spark`` from the repository root (about 2 to 4 minutes; ``--quick``
is a smoke run of 1,000,000 rows, not for the record). ``--json FILE`` saves the figures;
``--repeat-bodies`` fills the queue with 1,000 different bodies per partition, repeated,
instead of all different ones (Parquet then dictionary-encodes them: a best case for it).

What it does, in one run, on this machine:

- ``headwater serve`` in a subprocess (fresh data directory under /tmp, removed afterwards);
  queue ``bench-src`` with 8 partitions filled with 5,000,000 messages of 100 random bytes,
  each different (no key, tag or properties), in batches of 1,000 per partition by one
  network producer (a thread per partition).
- One SparkSession, ``local[2]``, as the tests use it. The same rows are first copied from
  the queue into Parquet files on local disk (``spark.read.format("headwater")...write
  .parquet``: every column the connector gives, snappy, the default), so both sides hold
  exactly the same rows and columns.
- **Batch read.** Both sides do the same work: every column of every row is materialized by
  ``df.write.format("noop")`` (a ``count()`` would let Parquet answer from its footers).
  One untimed run of each warms the JVM, the Python workers and the page cache (the files
  and the broker's segments are read from memory, both sides alike); then the timed runs
  alternate queue, Parquet, queue, Parquet, ... so that a change in the machine's load hits
  both. Figures: rows / median seconds; ratio = queue rate / Parquet rate.
- **Ceiling.** A Python data source that does nothing but hand Spark ready-made Arrow
  batches of the same schema and rows (one batch of 65,536 rows read from the queue,
  yielded again and again), 8 partitions of the same size: what any Python data source can
  reach on this machine, Spark's own cost of taking Arrow batches into rows.
- **Where the time goes.** CPU seconds of the JVM, the Python workers and the broker over
  one timed queue read (from /proc), per row; and the connector's Python read path alone
  (``headwater.spark.reading.read_arrow`` of one partition, in this process, one core).
- **Streaming.** ``readStream`` of ``bench-src`` (``maxOffsetsPerTrigger`` 1,000,000,
  ``Trigger.AvailableNow``) -> ``select(value, partition)`` -> ``writeStream`` into
  ``bench-dst`` (8 partitions) through the exactly-once sink. Figures: rows over the
  query's whole life (start to stop), and rows over the micro-batches' own time; the
  output queue must then hold exactly 5,000,000 messages.

Targets (issue 5): batch read >= 1,000,000 rows/s and >= 30% of the Parquet rate.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import machine
from bench.peers.base import ServerProcess, free_port, install_signal_handlers, port_open, temp_workdir, wait_until

__all__ = ["main", "Settings", "FULL", "QUICK"]

ROOT = Path(__file__).resolve().parent.parent
SIZE = 100
PARTITIONS = 8
FILL_BATCH = 1_000
SOURCE, SINK = "bench-src", "bench-dst"
TARGET_ROWS_S = 1_000_000
TARGET_RATIO = 0.30
CEILING_BATCH_ROWS = 65_536
SPARK_CONF = {
    "spark.master": "local[2]",
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.memory": "2g",
    "spark.sql.session.timeZone": "UTC",
}


@dataclass(frozen=True)
class Settings:
    name: str
    rows: int
    runs: int  # timed runs of each batch read, after one untimed
    stream_trigger_rows: int


FULL = Settings("full", rows=5_000_000, runs=5, stream_trigger_rows=1_000_000)
QUICK = Settings("quick", rows=1_000_000, runs=2, stream_trigger_rows=250_000)


# --------------------------------------------------------------------------- processes


def _proc_stat(pid: int) -> tuple[int, float]:
    """(parent pid, CPU seconds of the process and its reaped children)."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text.rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    utime, stime, cutime, cstime = (int(x) for x in fields[11:15])
    return int(fields[1]), (utime + stime + cutime + cstime) / ticks


def _cpu_of_tree(root: int) -> dict[str, float]:
    """CPU seconds so far of ``root`` (itself) and of its descendants (with theirs)."""
    parents: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)], cpu[int(entry.name)] = _proc_stat(int(entry.name))
            except (OSError, ValueError, IndexError):
                continue
    tree, frontier = set(), {root}
    while frontier:
        frontier = {p for p, parent in parents.items() if parent in frontier} - tree
        tree |= frontier
    own = Path(f"/proc/{root}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return {"self": (int(own[11]) + int(own[12])) / ticks, "children": sum(cpu.get(p, 0.0) for p in tree)}


def _cpu_snapshot(jvm_pid: int, broker_pid: int) -> dict[str, float]:
    tree = _cpu_of_tree(jvm_pid)
    return {
        "jvm": tree["self"],
        "python_workers": tree["children"],
        "broker": _proc_stat(broker_pid)[1],
        "driver": _proc_stat(os.getpid())[1],
    }


# --------------------------------------------------------------------------- steps


def start_broker(workdir: Path) -> tuple[ServerProcess, str]:
    port = free_port()
    server = ServerProcess(
        "headwater",
        [
            sys.executable,
            "-m",
            "headwater.cli.main",
            "--data",
            str(workdir / "data"),
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        log_path=workdir / "broker.log",
        cwd=ROOT,
    )
    wait_until(lambda: port_open(port), timeout_s=30, what="headwater serve", alive=server.alive)
    return server, f"127.0.0.1:{port}"


def fill(servers: str, rows: int, repeat_bodies: bool = False, per_send: int = FILL_BATCH) -> dict[str, Any]:
    """``rows`` messages of SIZE random bytes into SOURCE, spread evenly over its partitions,
    ``per_send`` a send (each send one stored batch; 1: a queue filled one message at a
    time, as by a web application); every body different, or with ``repeat_bodies`` the
    same FILL_BATCH bodies per partition over and over (then Parquet's dictionary encoding
    shrinks the files ~50x)."""
    import headwater

    with headwater.connect(servers) as hw:
        hw.admin.create_queue(SOURCE, partitions=PARTITIONS)
        hw.admin.create_queue(SINK, partitions=PARTITIONS)
        producer = hw.producer()
        per_partition = [rows // PARTITIONS + (1 if p < rows % PARTITIONS else 0) for p in range(PARTITIONS)]

        def fill_partition(p: int) -> None:  # one thread per partition: their sends pipeline
            left = per_partition[p]
            block = os.urandom(FILL_BATCH * SIZE)
            at = 0
            while left:
                n = min(per_send, left, FILL_BATCH - at)
                if at == 0 and not repeat_bodies:
                    block = os.urandom(FILL_BATCH * SIZE)
                bodies = [block[i : i + SIZE] for i in range(at * SIZE, (at + n) * SIZE, SIZE)]
                producer.send_batch(SOURCE, bodies, partition=p)
                left -= n
                at = (at + n) % FILL_BATCH

        t0 = time.perf_counter()
        with ThreadPoolExecutor(PARTITIONS) as pool:
            list(pool.map(fill_partition, range(PARTITIONS)))
        seconds = time.perf_counter() - t0
        producer.close()
        held = hw.admin.describe_queue(SOURCE).message_count
    if held != rows:
        raise RuntimeError(f"{SOURCE} holds {held} messages, not {rows}")
    return {"rows": rows, "seconds": seconds, "rows_per_s": rows / seconds}


def start_spark():
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    import headwater.spark

    builder = SparkSession.builder.appName("headwater-bench-spark")
    for k, v in SPARK_CONF.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    headwater.spark.register(spark)
    return spark


def _noop(df) -> float:
    t0 = time.perf_counter()
    df.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - t0


def batch_reads(
    spark, servers: str, workdir: Path, settings: Settings, jvm_pid: int, broker_pid: int, log
) -> dict[str, Any]:
    queue_df = spark.read.format("headwater").option("servers", servers).option("queue", SOURCE).load()
    parquet_dir = workdir / "parquet"
    t0 = time.perf_counter()
    queue_df.write.mode("overwrite").parquet(str(parquet_dir))
    parquet_write_s = time.perf_counter() - t0
    parquet_df = spark.read.parquet(str(parquet_dir))
    files = list(parquet_dir.glob("*.parquet"))
    parquet_bytes = sum(f.stat().st_size for f in files)
    log(f"parquet: {len(files)} files, {parquet_bytes / 1e6:,.0f} MB, written in {parquet_write_s:.1f} s")
    counts = (queue_df.count(), parquet_df.count())
    if counts != (settings.rows, settings.rows):
        raise RuntimeError(f"row counts differ: queue {counts[0]}, parquet {counts[1]}, want {settings.rows}")
    if parquet_df.schema != queue_df.schema:
        raise RuntimeError(f"schemas differ: {parquet_df.schema.simpleString()} vs {queue_df.schema.simpleString()}")

    ceiling_df = ceiling_frame(spark, servers, settings.rows)
    warm = {"queue": _noop(queue_df), "parquet": _noop(parquet_df), "ceiling": _noop(ceiling_df)}
    log("warm-up runs (s): " + ", ".join(f"{k} {v:.2f}" for k, v in warm.items()))
    runs: dict[str, list[float]] = {"queue": [], "parquet": [], "ceiling": []}
    cpu: list[dict[str, float]] = []
    for i in range(settings.runs):
        before = _cpu_snapshot(jvm_pid, broker_pid)
        runs["queue"].append(_noop(queue_df))
        after = _cpu_snapshot(jvm_pid, broker_pid)
        cpu.append({k: after[k] - before[k] for k in after})
        runs["parquet"].append(_noop(parquet_df))
        runs["ceiling"].append(_noop(ceiling_df))
        log(
            f"run {i + 1}: "
            + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in runs.items())
            + f" (load {os.getloadavg()[0]:.1f})"
        )
    out: dict[str, Any] = {
        "parquet_files": len(files),
        "parquet_bytes": parquet_bytes,
        "parquet_write_s": parquet_write_s,
        "warmup_s": warm,
        "runs_s": runs,
    }
    for k, v in runs.items():
        out[f"{k}_rows_per_s"] = settings.rows / statistics.median(v)
        out[f"{k}_best_rows_per_s"] = settings.rows / min(v)
    out["ratio"] = out["queue_rows_per_s"] / out["parquet_rows_per_s"]
    # per run, the ratio of neighbours (the same minute of the machine's load)
    out["ratios_per_run"] = [p / q for q, p in zip(runs["queue"], runs["parquet"], strict=True)]
    cpu_median = {k: statistics.median(c[k] for c in cpu) for k in cpu[0]}
    out["cpu_s_per_queue_read"] = cpu_median
    out["cpu_us_per_row"] = {k: v / settings.rows * 1e6 for k, v in cpu_median.items()}
    return out


# --------------------------------------------------------------------------- the ceiling


def ceiling_frame(spark, servers: str, rows: int):
    """A dataframe of ``rows`` rows from a Python data source that only yields a ready
    Arrow batch (of real rows read from the queue), in PARTITIONS partitions."""
    from headwater.spark.schema import READ_SCHEMA, arrow_schema

    batch = next(_read_partition(servers, 0, CEILING_BATCH_ROWS, arrow_schema(READ_SCHEMA)))
    spark.dataSource.register(_ceiling_source(batch))
    return spark.read.format("bench_arrow_ceiling").option("rows", str(rows)).load()


def _read_partition(servers: str, partition: int, rows: int, schema):
    """The connector's own read path (what a Spark task runs), in this process."""
    import headwater
    from headwater.spark.reading import ReadTask, read_arrow

    with headwater.connect(servers) as hw:
        info = hw.admin.describe_queue(SOURCE)
    p = info.partitions[partition]
    task = ReadTask(
        servers=servers,
        queue=SOURCE,
        queue_id=info.queue_id,
        partition=partition,
        start=p.start_offset,
        end=min(p.end_offset, p.start_offset + rows),
        tags=None,
        fail_on_data_loss=True,
        fetch_bytes=4 * 1024 * 1024,
        connect_timeout_s=10,
        request_timeout_s=60,
    )
    return read_arrow(task, schema)


def python_read_path(servers: str, rows: int) -> dict[str, Any]:
    """µs per row of the connector's Python read path alone: one partition, one core."""
    from headwater.spark.schema import READ_SCHEMA, arrow_schema

    schema = arrow_schema(READ_SCHEMA)
    per_partition = rows // PARTITIONS
    best = None
    for _ in range(3):
        t0, c0 = time.perf_counter(), time.process_time()
        n = sum(b.num_rows for b in _read_partition(servers, 1, per_partition, schema))
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        if best is None or cpu < best[1]:
            best = (wall, cpu, n)
    wall, cpu, n = best
    return {"rows": n, "wall_s": wall, "cpu_s": cpu, "cpu_us_per_row": cpu / n * 1e6, "rows_per_s": n / wall}


def _ceiling_source(batch):
    """The ceiling's data source class (made here, so that pyspark is imported only when
    the benchmark runs; cloudpickle sends such a class to the workers by value)."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    from headwater.spark.schema import READ_SCHEMA

    class CeilingPartition(InputPartition):
        def __init__(self, rows: int) -> None:
            super().__init__(rows)
            self.rows = rows

    class CeilingReader(DataSourceReader):
        def __init__(self, rows: int) -> None:
            self.rows = rows
            self.batch = batch

        def partitions(self):
            return [
                CeilingPartition(self.rows // PARTITIONS + (1 if i < self.rows % PARTITIONS else 0))
                for i in range(PARTITIONS)
            ]

        def read(self, partition):
            left = partition.rows
            while left > 0:
                n = min(left, self.batch.num_rows)
                yield self.batch if n == self.batch.num_rows else self.batch.slice(0, n)
                left -= n

    class CeilingSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "bench_arrow_ceiling"

        def schema(self):
            return READ_SCHEMA

        def reader(self, schema):
            return CeilingReader(int(self.options["rows"]))

    return CeilingSource


# --------------------------------------------------------------------------- streaming


def streaming(spark, servers: str, workdir: Path, settings: Settings, log) -> dict[str, Any]:
    import headwater

    query = (
        spark.readStream.format("headwater")
        .option("servers", servers)
        .option("queue", SOURCE)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(settings.stream_trigger_rows))
        .load()
        .select("value", "partition")
        .writeStream.format("headwater")
        .option("servers", servers)
        .option("queue", SINK)
        .option("checkpointLocation", str(workdir / "checkpoint"))
        .trigger(availableNow=True)
    )
    t0 = time.perf_counter()
    q = query.start()
    q.awaitTermination()
    wall = time.perf_counter() - t0
    if q.exception() is not None:
        raise RuntimeError(f"the streaming query failed: {q.exception()}")
    batches = [p for p in q.recentProgress if p["numInputRows"]]
    rows = sum(p["numInputRows"] for p in batches)
    batch_s = sum(p["durationMs"]["triggerExecution"] for p in batches) / 1000
    with headwater.connect(servers) as hw:
        held = hw.admin.describe_queue(SINK).message_count
    log(f"streaming: {len(batches)} micro-batches, {rows:,} rows in {wall:.1f} s; {SINK} holds {held:,}")
    return {
        "rows": rows,
        "micro_batches": len(batches),
        "wall_s": wall,
        "rows_per_s": rows / wall,
        "micro_batch_s": batch_s,
        "micro_batch_rows_per_s": rows / batch_s if batch_s else 0.0,
        "micro_batch_rows": [p["numInputRows"] for p in batches],
        "micro_batch_ms": [p["durationMs"]["triggerExecution"] for p in batches],
        "output_messages": held,
        "exactly_once": held == settings.rows == rows,
    }


# --------------------------------------------------------------------------- report


def render(result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    b, s, py = result["batch"], result["streaming"], result["python_read_path"]
    rows = result["settings"]["rows"]
    per = result["settings"].get("fill_batch", FILL_BATCH)
    table = Table(title=f"Spark: {rows:,} rows of {SIZE} B ({per:,} a stored batch), {PARTITIONS} partitions, local[2]")
    for col in ("case", "rows/s", "best run", "÷ Parquet", "target", ""):
        table.add_column(col, justify="left" if col in ("case", "target") else "right")

    def verdict(ok: bool) -> str:
        return "[bold green]PASS[/]" if ok else "[bold red]MISS[/]"

    pq = b["parquet_rows_per_s"]
    table.add_row(
        "queue, batch read",
        f"{b['queue_rows_per_s']:,.0f}",
        f"{b['queue_best_rows_per_s']:,.0f}",
        f"{b['ratio']:.1%}",
        f"≥ {TARGET_ROWS_S / 1e6:g}M rows/s",
        verdict(b["queue_rows_per_s"] >= TARGET_ROWS_S),
    )
    table.add_row("", "", "", "", f"≥ {TARGET_RATIO:.0%} of Parquet", verdict(b["ratio"] >= TARGET_RATIO))
    table.add_row("Parquet, batch read", f"{pq:,.0f}", f"{b['parquet_best_rows_per_s']:,.0f}", "100%", "", "")
    table.add_row(
        "ceiling: ready Arrow",
        f"{b['ceiling_rows_per_s']:,.0f}",
        f"{b['ceiling_best_rows_per_s']:,.0f}",
        f"{b['ceiling_rows_per_s'] / pq:.1%}",
        "",
        "",
    )
    table.add_row("stream queue→queue", f"{s['rows_per_s']:,.0f}", "", "", "whole query", "")
    table.add_row("", f"{s['micro_batch_rows_per_s']:,.0f}", "", "", "micro-batches", "")
    console.print(table)
    cpu = b["cpu_us_per_row"]
    console.print(
        f"CPU per row over a queue read (median of runs): JVM {cpu['jvm']:.2f} µs, Python workers "
        f"{cpu['python_workers']:.2f} µs, broker {cpu['broker']:.2f} µs, driver {cpu['driver']:.2f} µs; "
        f"the Python read path alone {py['cpu_us_per_row']:.2f} µs/row ({py['rows_per_s']:,.0f} rows/s on one core)"
    )
    runs = {k: [round(x, 2) for x in v] for k, v in b["runs_s"].items()}
    console.print(
        f"runs (s): queue {runs['queue']}, parquet {runs['parquet']}, ceiling {runs['ceiling']}; "
        f"ratio per run {[round(r, 3) for r in b['ratios_per_run']]}"
    )
    console.print(
        f"streaming: {s['micro_batches']} micro-batches {s['micro_batch_rows']}, "
        f"{s['micro_batch_ms']} ms; output queue holds {s['output_messages']:,} "
        f"({'exactly once' if s['exactly_once'] else 'NOT exactly once'})"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1,000,000 rows, 2 runs: a smoke run")
    ap.add_argument("--json", type=Path, help="save the figures to this file")
    ap.add_argument(
        "--repeat-bodies",
        action="store_true",
        help=f"{FILL_BATCH:,} different bodies per partition, repeated (default: all different)",
    )
    ap.add_argument(
        "--fill-batch",
        type=int,
        default=FILL_BATCH,
        metavar="N",
        help=f"messages a send while filling, each send one stored batch (default {FILL_BATCH:,}; "
        "1: a queue filled one message at a time)",
    )
    args = ap.parse_args(argv)
    if not 1 <= args.fill_batch <= FILL_BATCH:
        ap.error(f"--fill-batch must be from 1 to {FILL_BATCH:,}, got {args.fill_batch}")
    settings = QUICK if args.quick else FULL
    install_signal_handlers()

    def log(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)

    result: dict[str, Any] = {
        "settings": {**settings.__dict__, "repeat_bodies": args.repeat_bodies, "fill_batch": args.fill_batch},
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    with temp_workdir("hw-bench-spark-") as workdir:
        result["machine"] = machine.facts(workdir)
        server, servers = start_broker(workdir)
        spark = None
        try:
            log(
                f"broker {servers}; filling {SOURCE} with {settings.rows:,} messages of {SIZE} B, "
                f"{args.fill_batch:,} a send"
            )
            result["fill"] = fill(servers, settings.rows, args.repeat_bodies, args.fill_batch)
            log(f"filled at {result['fill']['rows_per_s']:,.0f} msgs/s")
            result["python_read_path"] = python_read_path(servers, settings.rows)
            spark = start_spark()
            jvm_pid = spark.sparkContext._gateway.proc.pid
            result["batch"] = batch_reads(spark, servers, workdir, settings, jvm_pid, server.proc.pid, log)
            result["streaming"] = streaming(spark, servers, workdir, settings, log)
        finally:
            if spark is not None:
                spark.stop()
            server.stop()
    result["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    result["loadavg_end"] = os.getloadavg()
    render(result)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
