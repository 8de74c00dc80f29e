"""``headwater group ...`` and ``headwater queue lag``: consumer groups for operators.

Live membership is kept by the broker that serves the queues, so ``group list`` and
``group describe`` show members only with ``--server``; on a data directory they show what
is durable: committed offsets and lag.
"""

from __future__ import annotations

from typing import Annotated, Any, Optional

import typer
from rich.console import Group
from rich.table import Table
from rich.text import Text

from headwater.cli.context import open_client, out_console
from headwater.cli.output import print_json
from headwater.cli.parse import parse_partitions, parse_time
from headwater.client import Client
from headwater.errors import GroupNotEmptyError, InvalidArgumentError, QueueNotFoundError
from headwater.model.config import QueueInfo
from headwater.model.groups import GroupDescription

__all__ = ["group_app", "queue_lag"]

group_app = typer.Typer(
    name="group",
    help="Consumer groups: list them, describe members, assignment and lag, reset offsets.",
    no_args_is_help=True,
    rich_markup_mode="markdown",
)

GroupArg = Annotated[str, typer.Argument(metavar="GROUP", show_default=False, help="The group's name.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")]
NONE = "-"


def _holders(d: GroupDescription) -> dict[tuple[str, int], str]:
    return {(q, p): m.member_id for m in d.members for q, ps in m.assignment.items() for p in ps}


def _queues_of(d: GroupDescription) -> list[str]:
    return sorted(set(d.offsets) | {q for m in d.members for q in m.queues})


def _partition_rows(hw: Client, d: GroupDescription) -> list[dict[str, Any]]:
    holders = _holders(d)
    rows = []
    for q in _queues_of(d):
        try:
            info = hw.admin.describe_queue(q)
        except QueueNotFoundError:  # deleted since
            continue
        committed = d.offsets.get(q, {})
        for pi in info.partitions:
            c = committed.get(pi.partition)
            rows.append({
                "queue": q, "partition": pi.partition, "member": holders.get((q, pi.partition)),
                "committed": c, "end_offset": pi.end_offset,
                "lag": None if c is None else max(0, pi.end_offset - max(c, pi.start_offset)),
                "pending_leases": None,  # shared groups report theirs with 'headwater shared describe'
            })
    return rows


def _cell(v: object) -> str:
    return NONE if v is None else f"{v:,}" if isinstance(v, int) else str(v)


@group_app.command("list")
def list_(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """List the consumer groups: those with live members (on a server) or committed offsets.

    Examples:

    ```
    headwater --server localhost:7070 group list
    headwater group list --json
    ```
    """
    groups = open_client(ctx).service.list_groups()
    if as_json:
        print_json([{"group": g.group, "state": g.state, "mode": g.mode, "strategy": g.strategy,
                     "generation": g.generation, "members": g.members, "queues": g.queues} for g in groups])
        return
    if not groups:
        out_console().print("no consumer groups yet")
        return
    table = Table(show_edge=False, header_style="bold")
    for name, justify in (("group", "left"), ("state", "left"), ("mode", "left"), ("strategy", "left"),
                          ("generation", "right"), ("members", "right"), ("queues", "left")):
        table.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for g in groups:
        table.add_row(g.group, g.state, g.mode or NONE, g.strategy or NONE, str(g.generation),
                      str(g.members), ", ".join(g.queues))
    out_console().print(table)


@group_app.command("describe")
def describe(ctx: typer.Context, group: GroupArg, as_json: JsonOpt = False) -> None:
    """Show a group: its members, which partitions each holds, and per partition the committed
    offset, the end of the log and the lag between them.

    Examples:

    ```
    headwater --server localhost:7070 group describe billing
    headwater group describe billing --json
    ```
    """
    hw = open_client(ctx)
    d = hw.service.describe_group(group)
    rows = _partition_rows(hw, d)
    if as_json:
        print_json({
            "group": d.group, "state": d.state, "mode": d.mode, "strategy": d.strategy, "generation": d.generation,
            "members": [{"member_id": m.member_id, "client_id": m.client_id, "state": m.state, "queues": m.queues,
                         "assignment": m.assignment, "pending": m.pending, "revoking": m.revoking,
                         "heartbeat_age_ms": m.heartbeat_age_ms, "session_timeout_ms": m.session_timeout_ms}
                        for m in d.members],
            "partitions": rows,
        })
        return
    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold", no_wrap=True)
    head.add_column()
    head.add_row("group", d.group)
    head.add_row("state", d.state)
    head.add_row("mode", d.mode or NONE)
    head.add_row("strategy", d.strategy or NONE)
    head.add_row("generation", str(d.generation))
    head.add_row("members", str(len(d.members)))
    parts: list[Any] = [head, Text("")]
    if d.members:
        members = Table(show_edge=False, header_style="bold")
        for name in ("member", "client", "state", "partitions", "last heartbeat"):
            members.add_column(name, no_wrap=True)
        for m in d.members:
            held = ", ".join(f"{q}{ps}" for q, ps in m.assignment.items()) or NONE
            members.add_row(m.member_id, m.client_id, m.state, held, f"{m.heartbeat_age_ms} ms ago")
        parts += [members, Text("")]
    table = Table(show_edge=False, header_style="bold")
    for name, justify in (("queue", "left"), ("partition", "right"), ("member", "left"), ("committed", "right"),
                          ("end offset", "right"), ("lag", "right"), ("pending leases", "right")):
        table.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for r in rows:
        table.add_row(r["queue"], str(r["partition"]), r["member"] or NONE, _cell(r["committed"]),
                      _cell(r["end_offset"]), _cell(r["lag"]), _cell(r["pending_leases"]))
    parts.append(table if rows else Text("no partitions: the group reads no queue and has no offsets", "dim"))
    if d.mode is None and ctx.find_root().params.get("server") is None:
        parts += [Text(""), Text("live members are kept by a running broker: use --server to see them", "dim")]
    out_console().print(Group(*parts))


def _target_offsets(hw: Client, info: QueueInfo, to: str, partitions: list[int] | None) -> dict[int, int]:
    chosen = [p.partition for p in info.partitions] if partitions is None else partitions
    by_part = {p.partition: p for p in info.partitions}
    out = {}
    for p in chosen:
        if p not in by_part:
            raise InvalidArgumentError(f"queue {info.name!r} has partitions 0..{len(info.partitions) - 1}; "
                                       f"there is no partition {p}")
        pi = by_part[p]
        if to == "earliest":
            out[p] = pi.start_offset
        elif to == "latest":
            out[p] = pi.end_offset
        elif to.isdigit():
            out[p] = int(to)
        else:
            out[p] = hw.offset_for_time(info.name, p, parse_time(to, "--to"))
    return out


@group_app.command("reset")
def reset(
    ctx: typer.Context,
    group: GroupArg,
    queue: Annotated[str, typer.Option("--queue", "-q", metavar="QUEUE", show_default=False,
                                       help="The queue whose offsets to move.")],
    to: Annotated[str, typer.Option("--to", metavar="WHERE", show_default=False,
                                    help="earliest, latest, an offset, or a time (ISO-8601, -15m, -2h, now).")],
    partitions: Annotated[Optional[str], typer.Option(
        "--partitions", "-p", metavar="LIST", show_default=False,
        help="Only these partitions, e.g. 0,2 or 0-3 (default: all).")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Move a group's committed offsets on a queue. Refused while the group has members: stop
    them first (or wait their session timeout), so no live member's progress is overwritten.

    Examples:

    ```
    headwater --server localhost:7070 group reset billing --queue orders --to earliest
    headwater group reset billing --queue orders --to 2026-11-21T10:00:00Z
    headwater group reset billing --queue orders --to 1200 --partitions 3
    ```
    """
    hw = open_client(ctx)
    info = hw.admin.describe_queue(queue)
    before = hw.service.fetch_offsets(group, queue)
    offsets = _target_offsets(hw, info, to.strip().lower() if to.strip().isalpha() else to.strip(),
                              parse_partitions(partitions))
    try:
        hw.service.commit_offsets(group, queue, offsets)
    except GroupNotEmptyError as e:
        raise GroupNotEmptyError(f"{e}; see them with 'headwater group describe {group}'") from None
    if as_json:
        print_json([{"partition": p, "before": before.get(p), "after": off} for p, off in sorted(offsets.items())])
        return
    table = Table(show_edge=False, header_style="bold")
    for name in ("partition", "before", "after"):
        table.add_column(name, justify="right", no_wrap=True)
    for p, off in sorted(offsets.items()):
        table.add_row(str(p), _cell(before.get(p)), f"{off:,}")
    out_console().print(table)
    out_console().print(f"reset group {group!r} on queue {queue!r} ({len(offsets)} partition(s))", style="green")


def queue_lag(
    ctx: typer.Context,
    queue: Annotated[str, typer.Argument(metavar="QUEUE", show_default=False, help="The queue.")],
    group: Annotated[Optional[str], typer.Option("--group", "-g", metavar="GROUP", show_default=False,
                                                 help="Only this group (default: every group reading it).")] = None,
    as_json: JsonOpt = False,
) -> None:
    """How far behind each consumer group is on a queue: committed offset, end of the log, and
    the lag (messages not yet consumed) per partition, with each group's total.

    Examples:

    ```
    headwater queue lag orders
    headwater queue lag orders --group billing --json
    ```
    """
    hw = open_client(ctx)
    info = hw.admin.describe_queue(queue)
    groups = [group] if group else [g.group for g in hw.service.list_groups() if queue in g.queues]
    rows = []
    for g in groups:
        committed = hw.service.fetch_offsets(g, queue)
        for pi in info.partitions:
            c = committed.get(pi.partition)
            rows.append({"group": g, "partition": pi.partition, "committed": c, "end_offset": pi.end_offset,
                         "lag": None if c is None else max(0, pi.end_offset - max(c, pi.start_offset))})
    if as_json:
        print_json(rows)
        return
    if not rows:
        out_console().print(f"no consumer group has committed offsets on {queue!r}")
        return
    table = Table(show_edge=False, header_style="bold")
    for name, justify in (("group", "left"), ("partition", "right"), ("committed", "right"),
                          ("end offset", "right"), ("lag", "right")):
        table.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for g in groups:
        mine = [r for r in rows if r["group"] == g]
        for r in mine:
            table.add_row(g, str(r["partition"]), _cell(r["committed"]), _cell(r["end_offset"]), _cell(r["lag"]))
        total = sum(r["lag"] for r in mine if r["lag"] is not None)
        table.add_row(Text(g, "bold"), Text("total", "bold"), "", "", Text(f"{total:,}", "bold"), end_section=True)
    out_console().print(table)
