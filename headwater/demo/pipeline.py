"""The demo pipeline: CDAP's web-analytics example on Headwater and Spark, end to end.

    python -m headwater.demo.pipeline [--events N] [--keep DIR]      # make demo

1. starts a broker (``headwater serve --port 0``) on a free port over a temporary data
   directory, and creates queues ``access-log`` (8 partitions) and ``page-stats`` (4);
2. writes a web shop's access log into ``access-log`` with the network producer, keyed by
   the client address (one visitor's lines stay in order in one partition); the generator
   (:mod:`headwater.demo.accesslog`) keeps its own exact counts;
3. meanwhile starts Spark and a Structured Streaming query that parses the lines and
   counts page views per page and distinct visitors per one-minute window of the lines'
   own timestamps, writing each closed window's results into ``page-stats`` through the
   exactly-once sink (:mod:`headwater.demo.jobs`); it runs while the log is written and
   until it has caught up and closed every window;
4. runs a batch Spark job over the time range of ``access-log`` the generator wrote in,
   and counts again, differently (``count(DISTINCT ...)`` over everything at once);
5. reads ``page-stats`` with a consumer and prints the top pages and the minutes;
6. checks that the generator's counts, the streaming results and the batch results are
   equal, every one, and that ``page-stats`` holds each result exactly once; prints
   ``PASS`` or ``FAIL`` and exits 0 or 1 (2 for an error, 130 for Ctrl-C).

The broker is stopped (SIGTERM) and the temporary directory removed at the end, also after
an error or Ctrl-C; ``--keep DIR`` puts the data, the checkpoint and the logs in DIR and
leaves them there. docs/demo.md explains what the run shows.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

import headwater
from headwater import Message
from headwater.demo import accesslog, jobs, report
from headwater.demo.stats import Stats, compare, stats_of_messages, stats_of_truth

__all__ = ["main", "Pipeline", "Settings"]

EVENTS_DEFAULT = 300_000
SOURCE_PARTITIONS = 8
SINK_PARTITIONS = 4
LINES_PER_SEND = 4_000  # lines per send_batch call (one record batch per partition each)
MAX_OFFSETS_PER_TRIGGER = 100_000  # lines per micro-batch at most
BROKER_START_S = 30.0
CATCH_UP_S_MAX = 600.0  # the streaming query must have caught up by then
SPARK_STOP_WAIT_S = 30.0  # on the way out, how long to let a starting Spark finish starting


@dataclass(frozen=True)
class Settings:
    events: int = EVENTS_DEFAULT
    minutes: int = 10
    seed: int = 5


class DemoError(Exception):
    """Something the demo needs did not happen (not a mismatch of counts)."""


class LocalBroker:
    """``headwater --data DIR serve --port 0`` as a child process in a session of its own
    (so Ctrl-C reaches the demo, which then stops the broker in order)."""

    def __init__(self, data: Path, log: Path) -> None:
        self.data = data
        self.log = log
        self.proc: subprocess.Popen | None = None
        self.address = ""

    def start(self) -> str:
        exe = Path(sys.executable).with_name("headwater")
        cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "headwater.cli.main"]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [*cmd, "--data", str(self.data), "serve", "--port", "0"],
                stdout=subprocess.PIPE,
                stderr=log,
                start_new_session=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        assert self.proc.stdout is not None
        found: list[str] = []

        def read() -> None:  # keeps reading, so a full pipe never blocks the broker
            for raw in self.proc.stdout:  # type: ignore[union-attr]  # started with stdout=PIPE
                line = raw.decode(errors="replace")
                if line.startswith("listening ") and not found:
                    found.append(line.split()[1])

        threading.Thread(target=read, daemon=True).start()
        deadline = time.monotonic() + BROKER_START_S
        while not found:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise DemoError(f"the broker did not start; its log:\n{_tail(self.log)}")
            time.sleep(0.02)
        port = found[0].rsplit(":", 1)[1]
        self.address = f"127.0.0.1:{port}"
        return self.address

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM (the broker flushes and exits), SIGKILL if it does not within the time."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


def _tail(path: Path, chars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return "(no log)"


class SparkSide:
    """Starts Spark and the streaming query in a thread of their own, so that the JVM
    (which takes a while) starts while the log is being written."""

    def __init__(self, work: Path, servers: str) -> None:
        self.work = work
        self.servers = servers
        self.spark = None
        self.query = None
        self.error: BaseException | None = None
        self.ready = threading.Event()
        self.started_s = 0.0
        # What the start is waiting for, shown on the stream's progress line until the query
        # reports progress: 30-60 s of a bare spinner reads as a hang.
        self.step = "waiting to start Spark"
        self.start_monotonic = time.monotonic()
        self._thread = threading.Thread(target=self._start, name="spark-start", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _start(self) -> None:
        t0 = self.start_monotonic = time.monotonic()
        try:
            self.step = "starting the JVM and the Spark session"
            self.spark = jobs.start_spark(self.work / "spark.log")
            self.step = "Spark session ready; starting the streaming query"
            self.query = jobs.start_streaming(
                self.spark, self.servers, str(self.work / "checkpoint"), max_offsets_per_trigger=MAX_OFFSETS_PER_TRIGGER
            )
            self.step = "streaming query started; waiting for its first micro-batch"
        except BaseException as e:  # reported by wait()
            self.error = e
        finally:
            self.started_s = time.monotonic() - t0
            self.ready.set()

    def wait(self) -> None:
        self.ready.wait()
        if self.error is not None:
            raise DemoError(
                f"Spark did not start: {self.error}\nSpark's log ({self.work / 'spark.log'}):\n"
                f"{_tail(self.work / 'spark.log')}"
            ) from self.error

    def catch_up(self, timeout_s: float) -> None:
        """Wait until the query has read everything in the queue and closed what the
        watermark lets it close: ``processAllAvailable`` returns after the no-data
        micro-batch that follows the last move of the watermark (it emits the windows that
        move closed). It runs in a thread so that Ctrl-C still reaches the demo."""
        done = threading.Event()
        failure: list[BaseException] = []

        def wait() -> None:
            try:
                self.query.processAllAvailable()
            except BaseException as e:
                failure.append(e)
            finally:
                done.set()

        threading.Thread(target=wait, name="catch-up", daemon=True).start()
        if not done.wait(timeout_s):
            raise DemoError(f"the streaming query did not catch up within {timeout_s:.0f} s")
        if failure:
            cause = str(failure[0]).split("=== Streaming Query ===")[0].strip()
            raise DemoError(f"the streaming query failed: {cause}") from failure[0]

    def stop(self) -> None:
        if not self.ready.wait(SPARK_STOP_WAIT_S):
            return  # still starting: the JVM exits with this process (its gateway's stdin closes)
        for what in (self.query, self.spark):
            if what is not None:
                try:
                    what.stop()
                except Exception:
                    pass  # stopping after a failure: nothing more to do


class StreamWatch:
    """Shows the streaming query's progress (lines read, micro-batches, watermark, results
    written) on a progress bar, from a thread of its own, every half second."""

    def __init__(self, spark_side: SparkSide, servers: str, progress: Progress, task: TaskID) -> None:
        self._spark_side = spark_side
        self._client = headwater.connect(servers)
        self._progress = progress
        self._task = task
        self.batches = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stream-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            try:
                self.show()
            except Exception:
                pass  # the display only; errors surface from the query itself

    def show(self) -> None:
        side = self._spark_side
        query = side.query
        progress = None if query is None else query.lastProgress
        if not progress:
            elapsed_s = time.monotonic() - side.start_monotonic
            self._progress.update(self._task, description=f"stream: {side.step} ({elapsed_s:.0f} s)")
            return
        end = progress["sources"][0]["endOffset"] if progress["sources"] else None
        if isinstance(end, str):
            end = json.loads(end)
        read = sum(end["offsets"].values()) if end else 0
        watermark = progress["eventTime"].get("watermark") if "eventTime" in progress else None
        self.batches = int(progress["batchId"]) + 1
        written = self._client.admin.describe_queue(jobs.SINK).message_count
        wm = "" if not watermark or watermark.startswith("1970") else f" wm {watermark[11:16]},"
        self._progress.update(
            self._task, completed=read, description=f"stream: {self.batches} batches,{wm} {written:,} results"
        )

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._client.close()


class Pipeline:
    """One run of the demo in directory ``work``."""

    def __init__(self, settings: Settings, work: Path, console: Console) -> None:
        self.settings = settings
        self.work = work
        self.console = console
        self.started = time.monotonic()
        self.stages: dict[str, float] = {}
        self.broker = LocalBroker(work / "data", work / "broker.log")
        self.servers = ""
        self.hw: headwater.Client | None = None
        self.spark_side: SparkSide | None = None
        self.truth = accesslog.Truth()
        self.produce_s = 0.0

    def run(self) -> int:
        """The whole pipeline; returns the exit code (0 PASS, 1 FAIL)."""
        try:
            self._start_broker()
            self.spark_side = SparkSide(self.work, self.servers)
            self.spark_side.start()
            columns = (
                SpinnerColumn(),
                TextColumn("{task.description}"),
                BarColumn(bar_width=12),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
            )
            with Progress(*columns, console=self.console) as progress:
                write = progress.add_task(f"write {jobs.SOURCE}", total=self.settings.events)
                watch = StreamWatch(
                    self.spark_side,
                    self.servers,
                    progress,
                    progress.add_task("stream: starting Spark", total=self.settings.events),
                )
                watch.start()
                try:
                    start_ms, end_ms = self._write_log(progress, write)
                    self._stream_catch_up(watch)
                finally:
                    watch.stop()
                batch, lines_read = self._batch_job(progress, start_ms, end_ms)
                bodies = self._read_results(progress)
            return self._report(batch, lines_read, bodies, watch.batches)
        finally:
            if self.hw is not None:
                self.hw.close()
            if self.spark_side is not None:
                self.spark_side.stop()
            self.broker.stop()

    def _stage(self, name: str, t0: float) -> None:
        self.stages[name] = time.monotonic() - t0

    def _start_broker(self) -> None:
        t0 = time.monotonic()
        self.servers = self.broker.start()
        self.hw = headwater.connect(self.servers)
        self.hw.admin.create_queue(jobs.SOURCE, partitions=SOURCE_PARTITIONS)
        self.hw.admin.create_queue(jobs.SINK, partitions=SINK_PARTITIONS)
        self._stage("broker", t0)
        self.console.print(
            f"broker [bold]{self.servers}[/] (pid {self.broker.proc.pid}), data in "
            f"{self.work}; queues [cyan]{jobs.SOURCE}[/] ({SOURCE_PARTITIONS} partitions), "
            f"[cyan]{jobs.SINK}[/] ({SINK_PARTITIONS})"
        )

    def _write_log(self, progress: Progress, task: TaskID) -> tuple[int, int]:
        """Write the log into ``access-log`` with the network producer; returns the
        append-time range ``[start, end)`` in ms that holds every line (the batch job
        reads exactly that range)."""
        t0 = time.monotonic()
        s = self.settings
        producer = self.hw.producer()  # the default partitioner: the key's hash (the client's address)
        start_ms = int(time.time() * 1000)
        pending: list[Message] = []
        for chunk in accesslog.generate(s.events, minutes=s.minutes, seed=s.seed, truth=self.truth):
            pending.extend(Message(line.text, key=line.key) for line in chunk)
            if len(pending) >= LINES_PER_SEND:
                producer.send_batch(jobs.SOURCE, pending)
                progress.advance(task, len(pending))
                pending = []
        if pending:
            producer.send_batch(jobs.SOURCE, pending)
            progress.advance(task, len(pending))
        producer.close()
        end_ms = int(time.time() * 1000) + 1  # exclusive: past the last append's ms stamp
        self._stage("write log", t0)
        self.produce_s = self.stages["write log"]
        return start_ms, end_ms

    def _stream_catch_up(self, watch: StreamWatch) -> None:
        t0 = time.monotonic()
        self.spark_side.wait()
        self._stage("Spark start (rest)", t0)
        t0 = time.monotonic()
        self.spark_side.catch_up(CATCH_UP_S_MAX)
        watch.show()
        self.spark_side.query.stop()
        self._stage("stream catch-up", t0)

    def _batch_job(self, progress: Progress, start_ms: int, end_ms: int) -> tuple[Stats, int]:
        t0 = time.monotonic()
        task = progress.add_task(f"batch: {_hms(start_ms)}..{_hms(end_ms)} UTC", total=None)
        batch, lines_read = jobs.batch_stats(self.spark_side.spark, self.servers, start_ms, end_ms)
        progress.update(task, total=lines_read, completed=lines_read)
        self._stage("batch job", t0)
        return batch, lines_read

    def _read_results(self, progress: Progress) -> list[bytes]:
        """Every message of ``page-stats``, read with a consumer (group ``top-pages``)."""
        t0 = time.monotonic()
        ends = {p.partition: p.end_offset for p in self.hw.admin.describe_queue(jobs.SINK).partitions}
        task = progress.add_task(f"read {jobs.SINK}", total=sum(ends.values()))
        bodies: list[bytes] = []
        with self.hw.consumer(group="top-pages", auto_offset_reset="earliest") as consumer:
            consumer.assign(jobs.SINK)
            deadline = time.monotonic() + 60
            while any(consumer.position(jobs.SINK, p) < end for p, end in ends.items()):
                if time.monotonic() > deadline:
                    raise DemoError(f"reading {jobs.SINK} stalled")
                records = consumer.poll(timeout_ms=500)
                bodies.extend(r.body for r in records)
                progress.advance(task, len(records))
            consumer.commit()
        self._stage("read results", t0)
        return bodies

    def _report(self, batch: Stats, lines_read: int, bodies: list[bytes], batches: int) -> int:
        truth = self.truth
        streamed, repeated = stats_of_messages(bodies)
        expected = stats_of_truth(truth)
        windows = len(truth.per_window())
        self.console.print(report.top_pages_table(streamed))
        self.console.print(report.minutes_table(streamed))
        checks = _checks(truth, expected, streamed, repeated, batch, lines_read, len(bodies))
        self.console.print(report.checks_table(checks))
        summary = Table.grid(padding=(0, 2))
        summary.add_row("log", f"{truth.lines:,} lines, {truth.total_views:,} page views, {windows} minutes")
        summary.add_row("write", f"{truth.lines / self.produce_s:,.0f} lines/s (made and sent)")
        summary.add_row("stream", f"{batches} micro-batches; Spark started in {self.spark_side.started_s:.1f} s")
        summary.add_row("stages", ", ".join(f"{k} {v:.1f} s" for k, v in self.stages.items()))
        self.console.print(summary)
        total_s = time.monotonic() - self.started
        if all(ok for _, ok, _ in checks):
            self.console.print(
                f"PASS: {truth.total_views:,} page views in {windows} one-minute windows; generator = "
                f"streaming = batch for all {len(expected):,} results; {len(bodies):,} messages in "
                f"{jobs.SINK}, none repeated; {total_s:.1f} s",
                style="bold green",
                highlight=False,
            )
            return 0
        self.console.print(
            "FAIL: " + "; ".join(what for what, ok, _ in checks if not ok), style="bold red", highlight=False
        )
        return 1


def _hms(ms: int) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(ms / 1000))


def _checks(
    truth: accesslog.Truth,
    expected: Stats,
    streamed: Stats,
    repeated: int,
    batch: Stats,
    lines_read: int,
    messages: int,
) -> list[tuple[str, bool, str]]:
    """(check, passed, detail) for every cross-check of the run."""
    rows = []
    d = compare(expected, streamed)
    rows.append(
        ("streaming = generator", not d, "; ".join(d) or f"all {len(expected):,} results, {truth.total_views:,} views")
    )
    d = compare(expected, batch)
    rows.append(("batch = generator", not d, "; ".join(d) or f"all {len(batch):,} results"))
    d = compare(batch, streamed)
    rows.append(("streaming = batch", not d, "; ".join(d) or "every minute, every page"))
    rows.append(("batch read its time range", lines_read == truth.lines, f"{lines_read:,} of {truth.lines:,} lines"))
    rows.append(
        (
            "page-stats: each result once",
            repeated == 0 and messages == len(streamed),
            f"{messages:,} messages, {repeated} repeated",
        )
    )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m headwater.demo.pipeline",
        description="The demo pipeline: an access log through Headwater and Spark (streaming and "
        "batch), cross-checked against the generator's own counts. See docs/demo.md.",
    )
    ap.add_argument(
        "--events", type=int, default=EVENTS_DEFAULT, help=f"access-log lines to write (default {EVENTS_DEFAULT:,})"
    )
    ap.add_argument("--minutes", type=int, default=10, help="minutes of event time they span (default 10)")
    ap.add_argument("--seed", type=int, default=5, help="seed of the generator (default 5)")
    ap.add_argument(
        "--keep",
        type=Path,
        metavar="DIR",
        help="keep the broker's data, the checkpoint and the logs in DIR (default: a "
        "temporary directory, removed at the end)",
    )
    args = ap.parse_args(argv)
    settings = Settings(events=args.events, minutes=args.minutes, seed=args.seed)
    console = Console()
    try:
        accesslog.check_settings(settings.events, settings.minutes)
    except ValueError as e:
        ap.error(str(e))
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
        if any(args.keep.iterdir()):
            ap.error(f"--keep {args.keep}: the directory is not empty")
        work = args.keep
    else:
        work = Path(tempfile.mkdtemp(prefix="headwater-demo-"))

    def on_sigterm(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    console.rule("[bold]Headwater demo: web analytics with Spark")
    try:
        return Pipeline(settings, work, console).run()
    except KeyboardInterrupt:
        console.print("interrupted: Spark and the broker are stopped", style="yellow")
        return 130
    except DemoError as e:
        console.print(f"FAIL: {e}", style="bold red", highlight=False)
        return 2
    except Exception as e:  # a bug or an unexpected failure: show where, then the verdict
        console.print_exception(max_frames=8)
        console.print(f"FAIL: {type(e).__name__}: {e}", style="bold red", highlight=False)
        return 2
    finally:
        signal.signal(signal.SIGTERM, previous)
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
        else:
            console.print(f"kept: {work} (data, checkpoint, broker.log, spark.log)")


if __name__ == "__main__":
    sys.exit(main())
