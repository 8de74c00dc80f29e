"""``headwater delay stats | cancel``, and the ``--delay``/``--at`` values of ``produce``.

In embedded mode (``--data``) delayed messages are delivered while some process has the
data directory open (``headwater serve``, or an application); a message that came due
while none did is delivered as soon as one opens it.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from typing import Annotated

import msgspec
import typer
from rich.console import Group
from rich.table import Table
from rich.text import Text

from headwater.cli.context import err_console, open_client, out_console
from headwater.cli.output import format_from_now, format_when, iso_utc, print_json
from headwater.cli.parse import parse_message_id, parse_time
from headwater.errors import InvalidArgumentError, MessageNotFoundError
from headwater.model.config import TTL_S_MAX
from headwater.model.delay import DelayStats

__all__ = ["delay_app", "parse_delay", "deliver_at_option", "BUCKETS_SHOWN"]

BUCKETS_SHOWN = 24  # rows of the bucket table (JSON carries every bucket)
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}
_PART_RE = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h|d|w)")
DELAY_S_MAX = TTL_S_MAX  # what the CLI lets through; the broker's delay_max_s (2 years) bounds it further
AT_FORMS = (
    "an ISO-8601 time (e.g. 2026-12-24T18:00:00Z or 2026-12-24; no zone means UTC), "
    "+DURATION (e.g. +15m, +1h30m) or 'now'"
)

delay_app = typer.Typer(
    name="delay",
    help="Delayed messages: the schedule and its statistics, cancelling a message.",
    no_args_is_help=True,
    rich_markup_mode="markdown",
)


def parse_delay(text: str, what: str = "--delay", *, not_a_duration: str | None = None) -> float:
    """A delay in seconds: a number of seconds, or numbers with units (ms, s, m, h, d, w).
    ``what`` names the option in errors; ``not_a_duration``, the error for text that is no
    duration at all (``--at +bad`` lists the forms of ``--at``).

    >>> parse_delay("15m"), parse_delay("1h30m"), parse_delay("90"), parse_delay("250ms")
    (900.0, 5400.0, 90.0, 0.25)
    """
    s = text.strip().lower()
    seconds = float(s) if re.fullmatch(r"[0-9]+(?:\.[0-9]+)?", s) else _units_s(text, s, what, not_a_duration)
    if not (math.isfinite(seconds) and seconds <= DELAY_S_MAX):
        raise InvalidArgumentError(
            f"{what}: {text!r} is too long; a delay is at most {DELAY_S_MAX:,} s "
            f"(100 years), and the broker's delay_max_s may bound it further"
        )
    return seconds


def _units_s(text: str, s: str, what: str, not_a_duration: str | None) -> float:
    pos, total_ms = 0, 0.0
    for m in _PART_RE.finditer(s):
        if m.start() != pos:
            break
        total_ms += float(m[1]) * _UNIT_MS[m[2]]
        pos = m.end()
    if pos != len(s) or not s:
        raise InvalidArgumentError(
            not_a_duration
            or (
                f"{what}: {text!r} is not a duration; use seconds (e.g. 90) or numbers with units "
                f"ms, s, m, h, d, w (e.g. 15m, 1h30m, 2d)"
            )
        )
    return total_ms / 1000


def deliver_at_option(
    delay: str | None, at: str | None, *, clock: Callable[[], float] = time.time
) -> dict[str, object]:
    """The ``deliver_at``/``delay`` keywords of a send for ``produce --delay/--at``."""
    if delay is not None and at is not None:
        raise InvalidArgumentError("give --delay or --at, not both")
    if delay is not None:
        return {"delay": parse_delay(delay)}
    if at is not None:
        text = at.strip()
        if text.startswith("+"):  # '+15m': a time relative to now, like --delay
            return {
                "delay": parse_delay(text[1:], "--at", not_a_duration=f"--at: {at!r} is not a time; use {AT_FORMS}")
            }
        return {"deliver_at": parse_time(text, "--at", clock=clock, forms=AT_FORMS)}
    return {}


def stats_view(s: DelayStats) -> Group:
    """The stats as a summary table and a table of the first buckets."""
    head = Table(show_header=False, box=None, pad_edge=False)
    head.add_column(style="bold")
    head.add_column()
    lat = (
        f"p50 {s.lateness_p50_ms:.0f} ms, p99 {s.lateness_p99_ms:.0f} ms, max {s.lateness_max_ms} ms"
        if s.lateness_p50_ms is not None
        else "-"
    )
    for k, v in (
        ("pending", f"{s.pending_messages:,} messages in {s.pending_batches:,} batches"),
        ("next due", format_when(s.next_due_ms, s.now_ms)),
        ("delivered", f"{s.delivered_total:,} ({s.delivered_per_s:g}/s over the last 10 s)"),
        ("lateness", lat),
        ("accepted", f"{s.accepted_total:,}"),
        ("cancelled", f"{s.cancelled_total:,}"),
        ("dropped", f"{s.dropped_total:,} (their queue was deleted)"),
        ("buckets", f"{len(s.buckets):,} of {s.bucket_ms // 60000} min, {s.loaded_batches:,} batches in memory"),
    ):
        head.add_row(k, v)
    table = Table(title="pending by bucket", title_justify="left")
    table.add_column("bucket start (UTC)")
    table.add_column("when", justify="right")  # the bucket start, from now
    table.add_column("pending", justify="right")
    table.add_column("in memory")
    for b in s.buckets[:BUCKETS_SHOWN]:
        table.add_row(
            iso_utc(b.start_ms),
            format_from_now(b.start_ms, s.now_ms),
            f"{b.pending_messages:,}",
            "yes" if b.loaded else "",
        )
    parts: list = [head, table]
    if len(s.buckets) > BUCKETS_SHOWN:
        rest = sum(b.pending_messages for b in s.buckets[BUCKETS_SHOWN:])
        parts.append(
            Text(
                f"... {len(s.buckets) - BUCKETS_SHOWN:,} more buckets with {rest:,} "
                f"pending messages (--json shows all)",
                style="dim",
            )
        )
    return Group(*parts)


@delay_app.command("stats")
def stats(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")] = False,
) -> None:
    """Show the schedule: pending messages per bucket, the next due time, deliveries per
    second and their lateness (delivery time minus scheduled time).

    Examples:

    ```
    headwater delay stats
    headwater --server 127.0.0.1:7070 delay stats --json
    ```
    """
    s = open_client(ctx, read_only=True).delay_stats()
    if as_json:
        print_json(msgspec.to_builtins(s))
    else:
        out_console().print(stats_view(s))


@delay_app.command("cancel")
def cancel(
    ctx: typer.Context,
    message_ids: Annotated[
        list[str],
        typer.Argument(
            metavar="MESSAGE_ID...", help="Delayed ids, as produce --delay printed them.", show_default=False
        ),
    ],
    as_json: Annotated[
        bool, typer.Option("--json", help='Print one line {"action": "cancelled", "message_id": ID} per id.')
    ] = False,
) -> None:
    """Cancel delayed messages that are not delivered yet.

    Every id is tried: one that cannot be cancelled (delivered, never existed) is reported
    and the command exits with 1 once the others are cancelled; a malformed id cancels none.

    Examples:

    ```
    headwater delay cancel 00000005-80000001-0e4e1c0000000000
    ```
    """
    ids = [parse_message_id(text) for text in message_ids]  # a mistyped id cancels nothing
    hw = open_client(ctx)
    failed = 0
    for text, message_id in zip(message_ids, ids, strict=True):
        try:
            hw.cancel(message_id)
        except MessageNotFoundError as e:
            # the others are still cancelled (as rm and kill go on), each failure said on its
            # line; the generic hint (ttl, truncation) would mislead
            failed += 1
            err_console().print(Text(f"error: {e}; 'headwater delay stats' shows what waits", style="red"))
            continue
        if as_json:
            print_json({"action": "cancelled", "message_id": text})
        else:
            out_console().print(f"cancelled {text}", style="green")
    if failed:
        raise typer.Exit(1)
