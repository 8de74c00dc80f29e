"""Rendering records and queues: rich tables for people, JSON lines for programs.

JSON lines (one object per record, ``--json``) carry exactly these keys::

    message_id  printed id, e.g. "00000001-00000000-000000000000002a"
    partition   int
    offset      int
    timestamp   append time, ISO-8601 UTC with milliseconds, e.g. "2026-11-21T10:00:00.000Z"
    key         the key as text, or null when the message has none
    tag         the tag, or null
    properties  an object of string -> string ({} when there are none)
    value       the body as text
    scheduled   for a delayed message, the time it was scheduled for (ISO-8601 UTC, like
                timestamp, which is then its delivery time); null for any other message

The keys come in this order; ``scheduled`` was added last so that the others kept their
places. Bytes (``value``, ``key``) are written as UTF-8 text when they decode as UTF-8;
otherwise they are base64 and the record gains ``"value_encoding": "base64"`` (or
``"key_encoding": "base64"``), after the keys above. Decode with ``base64.b64decode`` when
that key is present.
"""

from __future__ import annotations

import base64
import json
import sys
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from headwater.model.cluster import ALONE, ClusterMetadata
from headwater.model.config import QueueInfo
from headwater.model.message import Record

__all__ = [
    "record_json",
    "write_json_lines",
    "records_table",
    "record_detail",
    "queues_table",
    "queue_detail",
    "queue_json",
    "format_ttl",
    "iso_utc",
    "format_when",
    "format_from_now",
    "print_json",
]

VALUE_CHARS_MAX = 200  # longer values are cut in tables (JSON always carries them whole)


def iso_utc(epoch_ms: int) -> str:
    """``2026-11-21T10:00:00.000Z``: ISO-8601, UTC, millisecond precision."""
    dt = datetime.fromtimestamp(epoch_ms / 1000, tz=UTC)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{epoch_ms % 1000:03d}Z"


def _span(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.1f}s"


def format_from_now(epoch_ms: int, now_ms: int) -> str:
    """``in 14.5m`` or ``3.0s ago``: how far ``epoch_ms`` is from ``now_ms``."""
    left_s = (epoch_ms - now_ms) / 1000
    return f"in {_span(left_s)}" if left_s >= 0 else f"{_span(-left_s)} ago"


def format_when(epoch_ms: int | None, now_ms: int) -> str:
    """``2026-11-21T10:15:00.000Z (in 14.5m)`` or ``... (3.0s ago)``; ``-`` for None."""
    if epoch_ms is None:
        return "-"
    return f"{iso_utc(epoch_ms)} ({format_from_now(epoch_ms, now_ms)})"


def _text_or_base64(data: bytes) -> tuple[str, bool]:
    try:
        return data.decode("utf-8"), False
    except UnicodeDecodeError:
        return base64.b64encode(data).decode("ascii"), True


def _dumps(obj: Any) -> str:
    # Plain UTF-8 when stdout takes it; \u escapes otherwise, never an encoding crash.
    encoding = (getattr(sys.stdout, "encoding", None) or "").lower().replace("-", "")
    return json.dumps(obj, ensure_ascii=not encoding.startswith("utf8"))


def record_json(rec: Record) -> dict[str, Any]:
    """The JSON object of one record (see the module docstring for the keys)."""
    value, value_b64 = _text_or_base64(rec.body)
    key: str | None = None
    key_b64 = False
    if rec.key is not None:
        key, key_b64 = _text_or_base64(rec.key)
    out: dict[str, Any] = {
        "message_id": str(rec.message_id),
        "partition": rec.partition,
        "offset": rec.offset,
        "timestamp": iso_utc(rec.timestamp_ms),
        "key": key,
        "tag": rec.tag,
        "properties": dict(rec.properties or {}),
        "value": value,
        "scheduled": None if rec.scheduled_ms is None else iso_utc(rec.scheduled_ms),
    }
    if key_b64:
        out["key_encoding"] = "base64"
    if value_b64:
        out["value_encoding"] = "base64"
    return out


def write_json_lines(records: Iterable[Record]) -> int:
    """Stream records to stdout as JSON lines; return how many were written."""
    out = sys.stdout
    n = 0
    for rec in records:
        out.write(_dumps(record_json(rec)) + "\n")
        n += 1
    out.flush()
    return n


def _cell(data: bytes | None, width_max: int = VALUE_CHARS_MAX) -> Text:
    if data is None:
        return Text("")
    text, b64 = _text_or_base64(data)
    if len(text) > width_max:
        text = text[: width_max - 1] + "…"
    if b64:
        return Text.assemble(("(base64) ", "dim"), text)
    return Text(text)


def _props(props: dict[str, str] | None) -> str:
    return " ".join(f"{k}={v}" for k, v in (props or {}).items())


def records_table(records: list[Record], width: int) -> Table:
    """A table of records that fits ``width`` columns.

    The key, tag and properties columns appear when any record has one, and the scheduled
    time when any record is a delayed message. On a narrow terminal the columns that repeat
    what the id already says go first (partition and offset), then the scheduled time, then
    the timestamp, so the value keeps room to be read.
    """
    with_key = any(r.key is not None for r in records)
    with_tag = any(r.tag is not None for r in records)
    with_props = any(r.properties for r in records)
    # a column costs its content plus 3 for the separator and padding
    room = width - 37 - 20 - 13 * with_key - 10 * with_tag - 16 * with_props
    with_time = room >= 27
    room -= 27 * with_time
    with_scheduled = room >= 27 and any(r.scheduled_ms is not None for r in records)
    room -= 27 * with_scheduled
    with_position = room >= 14
    table = Table(show_edge=False, header_style="bold")
    table.add_column("message id", no_wrap=True, style="cyan")
    if with_position:
        table.add_column("p", justify="right", no_wrap=True)
        table.add_column("offset", justify="right", no_wrap=True)
    if with_time:
        table.add_column("timestamp (UTC)", no_wrap=True)
    if with_scheduled:
        table.add_column("scheduled (UTC)", no_wrap=True)
    if with_key:
        table.add_column("key", overflow="fold")
    if with_tag:
        table.add_column("tag", overflow="fold")
    if with_props:
        table.add_column("properties", overflow="fold")
    table.add_column("value", overflow="fold")
    for r in records:
        row: list[Any] = [str(r.message_id)]
        if with_position:
            row += [str(r.partition), str(r.offset)]
        if with_time:
            row.append(iso_utc(r.timestamp_ms))
        if with_scheduled:
            row.append("" if r.scheduled_ms is None else iso_utc(r.scheduled_ms))
        if with_key:
            row.append(_cell(r.key, 60))
        if with_tag:
            row.append(r.tag or "")
        if with_props:
            row.append(_props(r.properties))
        row.append(_cell(r.body))
        table.add_row(*row)
    return table


def record_detail(rec: Record) -> Table:
    """One record, field by field (``headwater get``); the value is shown whole.

    A delayed message still waiting (its id is a delayed id) has no place in its partition
    yet: its timestamp is when the broker accepted it. Once delivered, the timestamp is the
    delivery time and ``scheduled`` says how late that was.
    """
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    table.add_row("message id", str(rec.message_id))
    table.add_row("queue", rec.queue)
    mid = rec.message_id
    if mid.is_delayed:
        table.add_row("partition", f"{mid.target_partition} (once delivered)")
        table.add_row("offset", Text("(given when delivered)", "dim"))
        table.add_row("timestamp", f"{iso_utc(rec.timestamp_ms)} (accepted)")
    else:
        table.add_row("partition", str(rec.partition))
        table.add_row("offset", str(rec.offset))
        table.add_row("timestamp", iso_utc(rec.timestamp_ms))
    if rec.scheduled_ms is not None:
        if mid.is_delayed:
            state = "waiting for it"
        else:
            state = f"delivered {max(0, rec.timestamp_ms - rec.scheduled_ms):,} ms after it"
        table.add_row("scheduled", f"{iso_utc(rec.scheduled_ms)} ({state})")
    table.add_row("key", _cell(rec.key, 10**9) if rec.key is not None else Text("(none)", "dim"))
    table.add_row("tag", rec.tag if rec.tag is not None else Text("(none)", "dim"))
    table.add_row("properties", _props(rec.properties) or Text("(none)", "dim"))
    table.add_row("value", _cell(rec.body, 10**9))
    return table


def format_ttl(ttl_s: int | None) -> str:
    """``7d``, ``12h``, ``90s``, ``forever``: the largest unit that divides exactly."""
    if ttl_s is None:
        return "forever"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if ttl_s % size == 0:
            return f"{ttl_s // size}{unit}"
    return f"{ttl_s}s"


def _flush(info: QueueInfo) -> str:
    return info.config.flush or "default"


def queues_table(infos: list[QueueInfo]) -> Table:
    table = Table(show_edge=False, header_style="bold")
    for name, justify in (
        ("name", "left"),
        ("partitions", "right"),
        ("messages", "right"),
        ("ttl", "right"),
        ("flush", "left"),
        ("enabled", "left"),
    ):
        table.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]  # rich types justify as a Literal; ours is one of its values
    for q in infos:
        enabled = Text("yes", "green") if q.enabled else Text("no", "red")
        count = Text(f"{q.message_count:,}+ ({len(q.offline)} offline)", "red") if q.offline else f"{q.message_count:,}"
        table.add_row(q.name, str(len(q.partitions)), count, format_ttl(q.config.ttl_s), _flush(q), enabled)
    return table


def locations_table(md: ClusterMetadata, queue: str) -> Table:
    """One row per partition of ``queue``: its leader, the leader's address, the leader epoch
    and the brokers holding a copy."""
    table = Table(show_edge=False, header_style="bold")
    for name in ("partition", "leader", "address", "leader epoch", "replicas"):
        table.add_column(name, justify="left" if name == "address" else "right", no_wrap=True)
    for p in md.queue(queue).partitions:
        b = md.broker(p.leader)
        if b is None:
            where = Text("no leader now", "red")
        else:
            where = Text(b.address) if b.host else Text("this process (embedded)", "dim")
        leader = "this broker (alone)" if p.leader == ALONE else str(p.leader)
        table.add_row(
            str(p.partition),
            leader,
            where,
            str(p.leader_epoch),
            ", ".join("this broker" if r == ALONE else str(r) for r in p.replicas),
        )
    return table


def queue_detail(info: QueueInfo) -> Group:
    """Settings, then one row per partition with its retained offsets."""
    c = info.config
    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold", no_wrap=True)
    head.add_column()
    head.add_row("queue", info.name)
    head.add_row("id", str(info.queue_id))
    enabled = Text("yes", "green") if info.enabled else Text("no (reads and writes fail)", "red")
    head.add_row("enabled", enabled)
    head.add_row("created", iso_utc(info.created_ms))
    head.add_row("partitions", str(len(info.partitions)))
    offline = info.offline
    head.add_row("messages", f"{info.message_count:,}" + (" (offline partitions not counted)" if offline else ""))
    if offline:
        head.add_row(
            "offline",
            Text(f"{len(offline)} partition(s): their leader is down or out of reach (cluster status)", "red"),
        )
    head.add_row("ttl", format_ttl(c.ttl_s) + ("" if c.ttl_s is None else f" ({c.ttl_s} s)"))
    head.add_row("flush", _flush(info))
    head.add_row("message bytes max", f"{c.message_bytes_max:,}")
    for k, v in sorted(c.settings.items()):
        head.add_row(f"setting {k}", v)
    parts = Table(show_edge=False, header_style="bold")
    for name in ("partition", "start offset", "end offset", "messages"):
        parts.add_column(name, justify="right", no_wrap=True)
    for p in info.partitions:
        if p.online:
            parts.add_row(
                str(p.partition), str(p.start_offset), str(p.end_offset), f"{p.end_offset - p.start_offset:,}"
            )
        else:
            parts.add_row(str(p.partition), "-", "-", Text("offline", "red"))
    return Group(head, Text(""), parts)


def queue_json(info: QueueInfo) -> dict[str, Any]:
    c = info.config
    return {
        "name": info.name,
        "queue_id": info.queue_id,
        "enabled": info.enabled,
        "created": iso_utc(info.created_ms),
        "ttl_s": c.ttl_s,
        "flush": c.flush,
        "message_bytes_max": c.message_bytes_max,
        "settings": dict(c.settings),
        "messages": info.message_count,
        "partitions": [
            {"partition": p.partition, "start_offset": p.start_offset, "end_offset": p.end_offset}
            if p.online
            else {"partition": p.partition, "start_offset": None, "end_offset": None, "online": False}
            for p in info.partitions
        ],
    }


def print_json(obj: Any) -> None:
    """One JSON document on a line of stdout."""
    sys.stdout.write(_dumps(obj) + "\n")
