"""``headwater status``: what the broker is, how long it has run, and how busy it is.

The broker reports counters (requests served, each partition's end offset), not rates: the
rates are measured here, from two samples ``--interval`` seconds apart. A sample is one
``status`` request and one ``list_queues`` request; those two requests of our own are taken
out of the request rate, so an idle broker shows 0 requests/s.
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

import typer
from rich.console import Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from headwater.cli.context import on_ctrl_c, open_client, out_console
from headwater.cli.output import format_when, print_json
from headwater.cli.parse import Seconds
from headwater.client import Client
from headwater.errors import InvalidArgumentError

__all__ = ["status", "Sample", "take_sample", "measure_rates", "STATUS_INTERVAL_S_DEFAULT"]

STATUS_INTERVAL_S_DEFAULT = 1.0
OWN_REQUESTS_PER_SAMPLE = 2  # the status and list_queues requests a sample itself sends
BUSIEST_QUEUES_SHOWN = 10  # rows of the per-queue rate table (JSON carries every queue)


@dataclass(frozen=True)
class Sample:
    """The broker's counters at one moment, as far as rates need them."""

    at_s: float  # monotonic clock of this process when the sample was complete
    status: dict[str, Any]
    end_offsets: dict[tuple[int, int], int]  # (queue id, partition) -> end offset
    queue_names: dict[int, str]  # queue id -> name


def take_sample(hw: Client, *, clock: Callable[[], float] = time.monotonic) -> Sample:
    """One status request and one list_queues request, in that order (see the module doc)."""
    st = dict(hw.status())
    infos = hw.admin.list_queues()
    ends = {(q.queue_id, p.partition): p.end_offset for q in infos for p in q.partitions}
    return Sample(clock(), st, ends, {q.queue_id: q.name for q in infos})


def measure_rates(before: Sample, after: Sample) -> dict[str, Any]:
    """Messages appended and requests served per second between two samples.

    End offsets only grow (truncating keeps them counting), so the difference per partition
    is what was appended; a partition or queue that appeared in between counts from 0, one
    that was deleted drops out. ``requests_per_s`` is None for an embedded broker, which
    serves no requests.
    """
    dt = after.at_s - before.at_s
    if dt <= 0:
        raise InvalidArgumentError("the samples of a rate must be taken one after the other")
    per_queue: dict[str, float] = {}
    total = 0
    for key, end in after.end_offsets.items():
        appended = max(0, end - before.end_offsets.get(key, 0))
        if appended:
            name = after.queue_names[key[0]]
            per_queue[name] = per_queue.get(name, 0) + appended
            total += appended
    requests_per_s = None
    r0, r1 = before.status.get("requests_total"), after.status.get("requests_total")
    if isinstance(r0, int) and isinstance(r1, int):
        requests_per_s = round(max(0, r1 - r0 - OWN_REQUESTS_PER_SAMPLE) / dt, 1)
    return {
        "interval_s": round(dt, 3),
        "messages_in_per_s": round(total / dt, 1),
        "requests_per_s": requests_per_s,
        "queues_in_per_s": {name: round(n / dt, 1) for name, n in sorted(per_queue.items())},
    }


def _count(n: int, noun: str) -> str:
    """``n`` and ``noun``, plural unless one: ``1 segment``, ``2,048 segments``."""
    return f"{n:,} {noun}" if n == 1 else f"{n:,} {noun}s"


def _cluster(c: dict[str, Any]) -> Text:
    line = Text(
        f"broker {c.get('broker_id')} of cluster {str(c.get('cluster_id', '?'))[:12]}, epoch {c.get('broker_epoch')}, "
        f"ZooKeeper {c.get('zookeeper')}; "
    )
    if c.get("active"):
        line.append("active")
    else:
        line.append("not acting on cluster state: no ZooKeeper session", "bold red")
    return line


def _duration(seconds: float) -> str:
    """``3d 04h 05m``, ``2h 03m 10s``, ``42s``: the largest units, at most three."""
    s = int(seconds)
    parts = [(s // 86400, "d"), (s // 3600 % 24, "h"), (s // 60 % 60, "m"), (s % 60, "s")]
    while len(parts) > 1 and parts[0][0] == 0:
        parts.pop(0)
    first, *rest = parts[:3]
    return " ".join([f"{first[0]}{first[1]}", *(f"{n:02d}{u}" for n, u in rest)])


def _bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if size < 1024 or unit == "TB":
            return f"{n:,} B" if unit == "B" else f"{size:,.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def _delayed(st: dict[str, Any], now_ms: int) -> str:
    pending = int(st.get("delay_pending") or 0)
    delivered = f"{int(st.get('delay_delivered_total') or 0):,} delivered since start"
    if not pending:
        return f"none pending, {delivered}"
    buckets = int(st.get("delay_buckets") or 0)
    return (
        f"{pending:,} pending in {buckets:,} bucket(s), next due "
        f"{format_when(st.get('delay_next_due_ms'), now_ms)}, {delivered}"
    )


def render_status(sample: Sample, rates: dict[str, Any] | None, *, now_ms: int | None = None) -> RenderableType:
    """The facts, one per row, then the busiest queues when rates were measured.

    Queues and partitions are counted from the queue list, the way 'queue list' shows
    them, so they agree with the rates; the broker's internal queues (where it keeps
    committed offsets, keyed and shared groups, subscribers) are counted apart.
    ``now_ms`` (default: this machine's clock) is what "next due in ..." counts from.
    """
    st = sample.status
    if now_ms is None:
        now_ms = int(time.time() * 1000)
    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold", no_wrap=True)
    head.add_column(overflow="fold")
    head.add_row("version", str(st.get("version", "?")))
    where = f"at {st['address']}" if st.get("address") else "(this process)"
    head.add_row("mode", f"{st.get('mode', '?')} {where}")
    head.add_row("data directory", str(st.get("data_dir", "?")))
    head.add_row("uptime", _duration(float(st.get("uptime_s", 0))))
    cluster = st.get("cluster")
    if isinstance(cluster, dict):
        head.add_row("cluster", _cluster(cluster))
    if "connections" in st:
        head.add_row("connections", f"{st['connections']:,} open, {st.get('connections_total', 0):,} since start")
    if "requests_total" in st:
        head.add_row("requests", f"{st['requests_total']:,} since start")
    queues = f"{len(sample.queue_names):,} ({_count(len(sample.end_offsets), 'partition')})"
    if st.get("internal_queues"):
        queues += f", plus {st['internal_queues']:,} internal (the broker's own state)"
    head.add_row("queues", queues)
    head.add_row(
        "storage",
        f"{_bytes(int(st.get('bytes', 0)))} in {_count(st.get('segments', 0), 'segment')} "
        f"({st.get('open_segments', 0):,} open), {_count(st.get('fsyncs', 0), 'fsync')}",
    )
    if "page_cache_keep_bytes" in st:
        head.add_row("page cache", _page_cache(st))
    if "memory_peak_bytes" in st:
        head.add_row("memory", _memory(st))
    if "delay_pending" in st:
        head.add_row("delayed", _delayed(st, now_ms))
    if "push_streams" in st:
        head.add_row(
            "push",
            f"{st['push_streams']:,} subscriber stream(s) open, {st.get('pushes_total', 0):,} pushes since start",
        )
    if "fetch_streams" in st:
        head.add_row(
            "fetch streams",
            f"{st['fetch_streams']:,} consumer stream(s) open, {st.get('stream_pushes_total', 0):,} pushes since start",
        )
    if rates is not None:
        every = f"over {rates['interval_s']:g} s"
        head.add_row("messages in", f"{rates['messages_in_per_s']:,.1f}/s {every}")
        if rates["requests_per_s"] is not None:
            head.add_row("requests", f"{rates['requests_per_s']:,.1f}/s {every}")
    recovery = st.get("recovery") or []
    head.add_row("recovery", "\n".join(recovery) if recovery else Text("nothing repaired", "dim"))
    busiest = sorted((rates or {}).get("queues_in_per_s", {}).items(), key=lambda kv: -kv[1])
    return Group(head, Text(""), _busiest_table(busiest)) if busiest else head


def _page_cache(st: dict[str, Any]) -> str:
    keep = int(st["page_cache_keep_bytes"])
    if not keep:
        return "all of the log left to the kernel (page_cache_keep_bytes=0)"
    return f"the newest {_bytes(keep)} of the log kept, {_bytes(int(st.get('uncached_bytes', 0)))} let go since start"


def _memory(st: dict[str, Any]) -> str:
    memory = f"peak {_bytes(int(st['memory_peak_bytes']))}"
    if "memory_rss_bytes" in st:
        memory = f"{_bytes(int(st['memory_rss_bytes']))} resident, {memory}"
    kept = int(st.get("allocator_cache_bytes", 0))
    return memory + (
        f"; the allocator keeps up to {_bytes(kept)} freed for reuse" if kept else "; the allocator's own defaults"
    )


def _busiest_table(busiest: list[tuple[str, float]]) -> Table:
    """The busiest queues by messages in per second, busiest first."""
    table = Table(show_edge=False, header_style="bold")
    table.add_column("queue")
    table.add_column("messages in/s", justify="right")
    for name, rate in busiest[:BUSIEST_QUEUES_SHOWN]:
        table.add_row(name, f"{rate:,.1f}")
    if len(busiest) > BUSIEST_QUEUES_SHOWN:
        table.caption = f"and {len(busiest) - BUSIEST_QUEUES_SHOWN} more (--json shows all)"
    return table


def _json_doc(sample: Sample, rates: dict[str, Any] | None) -> dict[str, Any]:
    doc = dict(sample.status)
    if rates is not None:
        doc["rates"] = rates
    return doc


def status(
    ctx: typer.Context,
    interval: Annotated[
        float,
        typer.Option(
            "--interval",
            "-i",
            metavar="SECONDS",
            parser=Seconds(),
            help="Measure rates over this many seconds (0: show the counters at once, no rates).",
        ),
    ] = STATUS_INTERVAL_S_DEFAULT,
    watch: Annotated[
        bool,
        typer.Option(
            "--watch",
            "-w",
            help="Refresh every --interval seconds until Ctrl-C (into a pipe or with --json: "
            "one report after another).",
        ),
    ] = False,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help='Print the broker\'s status as JSON, with the measured rates under "rates".',
        ),
    ] = False,
) -> None:
    """Show the broker: version, uptime, connections, queues, storage, delayed messages,
    push subscribers, and current rates.

    Rates (messages appended per second, requests per second, and per queue) are measured
    between two samples taken --interval seconds apart. Works on a running broker
    (--server) and on a data directory (an embedded broker serves no requests).

    Examples:

    ```
    headwater --server 127.0.0.1:7070 status
    headwater --server 127.0.0.1:7070 status --watch --interval 2
    headwater status --interval 0 --json
    ```
    """
    if watch and interval <= 0:
        raise InvalidArgumentError("--watch needs an --interval greater than 0")
    hw = open_client(ctx, read_only=True)
    before = take_sample(hw)
    if interval <= 0:
        _show(before, None, as_json=as_json)
        return
    time.sleep(interval)
    after = take_sample(hw)
    if not watch:
        _show(after, measure_rates(before, after), as_json=as_json)
        return
    try:
        with on_ctrl_c(signal.default_int_handler):  # the repeats of one Ctrl-C are that one
            if as_json or not out_console().is_terminal:  # a pipe or a file: one report after another
                while True:
                    _show(after, measure_rates(before, after), as_json=as_json)
                    if not as_json:
                        out_console().print()  # a blank line between reports
                    time.sleep(interval)
                    before, after = after, take_sample(hw)
            with Live(
                render_status(after, measure_rates(before, after)), console=out_console(), auto_refresh=False
            ) as live:
                while True:
                    time.sleep(interval)
                    before, after = after, take_sample(hw)
                    live.update(render_status(after, measure_rates(before, after)), refresh=True)
    except KeyboardInterrupt:
        pass  # the way to stop watching: not an error


def _show(sample: Sample, rates: dict[str, Any] | None, *, as_json: bool) -> None:
    if as_json:
        print_json(_json_doc(sample, rates))
    else:
        out_console().print(render_status(sample, rates))
    sys.stdout.flush()
