"""``headwater group reset``: move a group's committed offsets on a queue, as
kafka-consumer-groups --reset-offsets does (a plan first; --execute to commit it)."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from headwater.cli.context import open_client, out_console
from headwater.cli.groups import GroupArg, JsonOpt, cell
from headwater.cli.output import print_json
from headwater.cli.parse import parse_from, parse_partitions
from headwater.client import Client
from headwater.errors import GroupNotEmptyError, InvalidArgumentError
from headwater.model.config import QueueInfo

__all__ = ["reset_group"]


def _target_offsets(hw: Client, info: QueueInfo, to: str, partitions: list[int] | None) -> dict[int, int]:
    """Where ``--to`` (the positions of ``scan --from``: one parser) puts each partition."""
    where = parse_from(to, "--to")
    chosen = [p.partition for p in info.partitions] if partitions is None else partitions
    if where.message_id is not None:
        if partitions is not None and partitions != [where.message_id.partition]:
            raise InvalidArgumentError(
                f"--to names a message of partition {where.message_id.partition}, and --partitions others; "
                f"leave out --partitions (the id picks its own)"
            )
        chosen = [where.message_id.partition]
    by_part = {p.partition: p for p in info.partitions}
    out = {}
    for p in chosen:
        if p not in by_part:
            raise InvalidArgumentError(
                f"queue {info.name!r} has partitions 0..{len(info.partitions) - 1}; there is no partition {p}"
            )
        pi = by_part[p]
        if where.offset is not None:
            out[p] = where.offset  # as given: reset() brings one outside the log inside it, and says so
        elif where.message_id is not None:
            out[p] = where.message_id.offset
        elif where.time_ms is not None:
            out[p] = hw.offset_for_time(info.name, p, where.time_ms)
        else:
            out.update(where.offsets([pi]) or {})
    return out


def reset_group(
    ctx: typer.Context,
    group: GroupArg,
    queue: Annotated[
        str, typer.Option("--queue", "-q", metavar="QUEUE", show_default=False, help="The queue whose offsets to move.")
    ],
    to: Annotated[
        str,
        typer.Option(
            "--to",
            metavar="WHERE",
            show_default=False,
            help="earliest, latest, -N (N before each partition's end), an offset, a message id, "
            "or a time (ISO-8601, -15m, -2h, now): the forms of 'scan --from'.",
        ),
    ],
    partitions: Annotated[
        str | None,
        typer.Option(
            "--partitions",
            "-p",
            metavar="LIST",
            show_default=False,
            help="Only these partitions, e.g. 0,2 or 0-3 (default: all).",
        ),
    ] = None,
    execute: Annotated[
        bool,
        typer.Option(
            "--execute",
            help="Move the offsets. Without it, only the plan is shown (kafka-consumer-groups' --dry-run).",
        ),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Move a group's committed offsets on a queue: shows the plan (partition, current
    offset, new offset, change of lag) and changes nothing unless --execute is given.
    Refused while the group has members: stop them first (or wait their session timeout),
    so no live member's progress is overwritten.

    An offset past a partition's log end (or before its start) is set to the end (the
    start) instead, as kafka-consumer-groups does; the plan marks those partitions.

    With --json: one object {"group", "queue", "executed", "partitions": [{"partition",
    "current", "new", "lag_current", "lag_new", "requested"}]} (current and lag_current null
    where the group has committed nothing; requested is the offset --to named, which differs
    from new where it was outside the log).

    Examples:

    ```
    headwater --server localhost:7070 group reset billing --queue orders --to earliest
    headwater --server localhost:7070 group reset billing --queue orders --to earliest --execute
    headwater group reset billing --queue orders --to 2026-11-21T10:00:00Z --execute
    headwater group reset billing --queue orders --to 1200 --partitions 3 --execute
    ```
    """
    hw = open_client(ctx)
    info = hw.admin.describe_queue(queue)
    before = hw.service.fetch_offsets(group, queue)
    asked = _target_offsets(hw, info, to, parse_partitions(partitions))
    # on a cluster, a partition whose leader is out of reach has no known log: not 0..0
    info.require_online(asked, f"reset {group!r} on {queue!r}")
    # an offset past a partition's log end (or before its start) is brought to the end (the
    # start), as kafka-consumer-groups --to-offset does, and the plan says so: the broker
    # refuses to commit one outside the log, and the plan must show what --execute does
    bounds = {p.partition: (p.start_offset, p.end_offset) for p in info.partitions}
    offsets = {p: min(max(off, bounds[p][0]), bounds[p][1]) for p, off in asked.items()}
    if execute:
        try:
            hw.service.commit_offsets(group, queue, offsets)
        except GroupNotEmptyError as e:
            raise GroupNotEmptyError(f"{e}; see them with 'headwater group describe {group}'") from None
    ends = {p.partition: p.end_offset for p in info.partitions}
    rows = [
        {
            "partition": p,
            "current": before.get(p),
            "new": off,
            "lag_current": None if before.get(p) is None else ends[p] - before[p],
            "lag_new": ends[p] - off,
            "requested": asked[p],
        }
        for p, off in sorted(offsets.items())
    ]
    if as_json:
        print_json({"group": group, "queue": queue, "executed": execute, "partitions": rows})
        return
    table = Table(show_edge=False, header_style="bold")
    for name in ("partition", "current", "new", "lag change"):
        table.add_column(name, justify="right", no_wrap=True)
    for r in rows:
        change = "-" if r["lag_current"] is None else f"{r['lag_new'] - r['lag_current']:+,}"
        change += f" (lag {r['lag_new']:,})"
        table.add_row(str(r["partition"]), cell(r["current"]), f"{r['new']:,}{_clamped(r)}", change)
    out_console().print(table)
    for side, outside in (
        ("past the log end", [r for r in rows if r["requested"] > r["new"]]),
        ("before the log start", [r for r in rows if r["requested"] < r["new"]]),
    ):
        if outside:
            out_console().print(
                f"note: {_offsets_named(outside)} {side} of partition(s) "
                f"{', '.join(str(r['partition']) for r in outside)}: each is set to its log "
                f"{'end' if side.endswith('end') else 'start'} instead, as "
                f"kafka-consumer-groups does",
                style="yellow",
                markup=False,
            )
    if execute:
        out_console().print(f"reset group {group!r} on queue {queue!r} ({len(offsets)} partition(s))", style="green")
    else:
        out_console().print(
            f"plan only, nothing changed: pass --execute to reset group {group!r} on queue {queue!r}", style="yellow"
        )


def _clamped(row: dict[str, Any]) -> str:
    """What the plan's 'new' cell adds when --to fell outside the partition's log."""
    if row["requested"] > row["new"]:
        return " (log end)"
    return " (log start)" if row["requested"] < row["new"] else ""


def _offsets_named(rows: list[dict[str, Any]]) -> str:
    """'offset 99 is' or 'offsets 99, 120 are': what --to asked of these partitions."""
    asked = sorted({r["requested"] for r in rows})
    if len(asked) == 1:
        return f"offset {asked[0]:,} is"
    return f"offsets {', '.join(f'{a:,}' for a in asked)} are"
