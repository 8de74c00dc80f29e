"""``headwater group ...`` and ``headwater queue lag``: consumer groups for operators.

Four kinds of group read a queue, and the broker knows each differently:

- **clustering** groups share a queue's partitions among members; the broker keeps their
  membership (while it runs) and their committed offsets (durably);
- **broadcast** groups give every member every partition; members keep their own offsets,
  so the broker knows such a group only while it has live members;
- **shared** groups lease single messages from any partition (per queue; the broker keeps
  each partition's window and leases);
- **keyed** groups split a queue by a key hash among a fixed number of members (per queue;
  the broker keeps each member's positions).

The broker lists every kind (``list_groups``): clustering and broadcast groups by name, and
each queue's keyed and shared groups (one line per group and queue). ``group describe NAME``
looks the name up as each kind, on every queue unless ``--queue`` says which.

Live membership is kept by the broker that serves the queues, so members show only with
``--server``; on a data directory these commands show what is durable.
"""

from __future__ import annotations

import time
from typing import Annotated, Any

import msgspec
import typer
from rich.console import Group
from rich.table import Table
from rich.text import Text

from headwater.cli.context import open_client, out_console
from headwater.cli.output import format_from_now, iso_utc, print_json
from headwater.client import Client
from headwater.errors import GroupNotFoundError, QueueNotFoundError
from headwater.model.config import QueueInfo
from headwater.model.groups import GroupDescription, GroupSummary, partition_lag
from headwater.model.keyed import KeyedGroupInfo
from headwater.model.shared import SharedGroupInfo

__all__ = ["GroupArg", "JsonOpt", "cell", "group_app", "queue_lag"]

group_app = typer.Typer(
    name="group",
    help="Consumer groups (clustering, broadcast, shared, keyed): list them, describe members, "
    "positions, lag and leases, reset offsets.",
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
            rows.append(
                {
                    "queue": q,
                    "partition": pi.partition,
                    "member": holders.get((q, pi.partition)),
                    "committed": c,
                    "end_offset": pi.end_offset if pi.online else None,  # None: its leader is out of reach
                    "lag": partition_lag(c, pi.start_offset, pi.end_offset) if pi.online else None,
                    "pending_leases": None,  # only shared groups lease messages (see _shared_doc)
                }
            )
    return rows


def cell(v: object) -> str:
    return NONE if v is None else f"{v:,}" if isinstance(v, int) else str(v)


def _grid() -> Table:
    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold", no_wrap=True)
    head.add_column()
    return head


def _columns(table: Table, columns: tuple[tuple[str, str], ...]) -> Table:
    for name, justify in columns:
        table.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]  # rich types justify as a Literal; ours is one of its values
    return table


def kind_of(g: GroupSummary | GroupDescription) -> str:
    """``clustering``, ``broadcast``, ``keyed`` or ``shared``: a group without members and
    without a mode is known by its committed offsets, which only clustering groups keep on
    the broker."""
    return g.mode or "clustering"


@group_app.command("list")
def list_(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """List the consumer groups: clustering groups (with live members on a server, or
    committed offsets), broadcast groups (while they have live members: their offsets are the
    members' own), and each queue's keyed groups (members: the group's size; state
    'resizing' while a resize drains) and shared groups (members: those holding a lease
    now; state 'stable' while any does, else 'empty').

    See one in full with 'headwater group describe NAME'.

    Examples:

    ```
    headwater --server localhost:7070 group list
    headwater group list --json
    ```
    """
    groups = open_client(ctx, read_only=True).service.list_groups()
    if as_json:
        print_json(
            [
                {
                    "group": g.group,
                    "kind": kind_of(g),
                    "state": g.state,
                    "mode": g.mode,
                    "strategy": g.strategy,
                    "generation": g.generation,
                    "members": g.members,
                    "queues": g.queues,
                }
                for g in groups
            ]
        )
        return
    console = out_console()
    if not groups:
        console.print("no consumer groups yet")
    else:
        table = _columns(
            Table(show_edge=False, header_style="bold"),
            (
                ("group", "left"),
                ("kind", "left"),
                ("state", "left"),
                ("strategy", "left"),
                ("generation", "right"),
                ("members", "right"),
                ("queues", "left"),
            ),
        )
        for g in groups:
            table.add_row(
                g.group, kind_of(g), g.state, g.strategy or NONE, str(g.generation), str(g.members), ", ".join(g.queues)
            )
        console.print(table)


# clustering and broadcast groups -------------------------------------------------------------


def _consumer_doc(d: GroupDescription, rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "group": d.group,
        "kind": kind_of(d),
        "state": d.state,
        "mode": d.mode,
        "strategy": d.strategy,
        "generation": d.generation,
        "members": [
            {
                "member_id": m.member_id,
                "client_id": m.client_id,
                "state": m.state,
                "queues": m.queues,
                "assignment": m.assignment,
                "pending": m.pending,
                "revoking": m.revoking,
                "heartbeat_age_ms": m.heartbeat_age_ms,
                "session_timeout_ms": m.session_timeout_ms,
            }
            for m in d.members
        ],
        "partitions": rows,
    }


def _consumer_view(d: GroupDescription, rows: list[dict[str, Any]], *, on_server: bool) -> list[Any]:
    head = _grid()
    head.add_row("group", d.group)
    head.add_row("kind", kind_of(d))
    head.add_row("state", d.state)
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
    table = _columns(
        Table(show_edge=False, header_style="bold"),
        (
            ("queue", "left"),
            ("partition", "right"),
            ("member", "left"),
            ("committed", "right"),
            ("end offset", "right"),
            ("lag", "right"),
            ("pending leases", "right"),
        ),
    )
    for r in rows:
        table.add_row(
            r["queue"],
            str(r["partition"]),
            r["member"] or NONE,
            cell(r["committed"]),
            cell(r["end_offset"]),
            cell(r["lag"]),
            cell(r["pending_leases"]),
        )
    parts.append(table if rows else Text("no partitions: the group reads no queue and has no offsets", "dim"))
    if d.mode is None and not on_server:
        parts += [Text(""), Text("live members are kept by a running broker: use --server to see them", "dim")]
    return parts


# shared groups -------------------------------------------------------------------------------


def _shared_doc(info: SharedGroupInfo) -> dict[str, Any]:
    return {
        "group": info.group,
        "kind": "shared",
        "queue": info.queue,
        "settings": msgspec.to_builtins(info.settings),
        "dead_letter_queue": info.dead_letter_queue,
        "pending_leases": info.leased,
        "lag": info.lag,
        "partitions": [
            {
                "queue": info.queue,
                "partition": p.partition,
                "committed": p.committed_offset,
                "delivered_offset": p.delivered_offset,
                "end_offset": p.end_offset,
                "lag": p.lag,
                "pending_leases": p.leased,
                "leases_by_member": dict(p.members),
                "next_lease_deadline": None if p.next_lease_deadline_ms is None else iso_utc(p.next_lease_deadline_ms),
                "awaiting_retry": p.awaiting_retry,
                "acked_ahead": p.acked_ahead,
                "dead_lettered": p.dead_lettered,
            }
            for p in info.partitions
        ],
    }


def _shared_view(info: SharedGroupInfo, now_ms: int) -> list[Any]:
    st = info.settings
    head = _grid()
    head.add_row("group", info.group)
    head.add_row("kind", "shared")
    head.add_row("queue", info.queue)
    head.add_row("pending leases", f"{info.leased:,}")
    head.add_row("lag", f"{info.lag:,} (messages not yet acknowledged)")
    head.add_row("attempts", f"{st.max_attempts} at most, then to {info.dead_letter_queue!r}")
    head.add_row(
        "backoff", f"{st.backoff_ms:,} ms, x{st.backoff_multiplier:g} per attempt, at most {st.backoff_max_ms:,} ms"
    )
    head.add_row("in flight", f"{st.in_flight_max:,} at most per partition")
    # the queue is in the head; two-line headers keep the table within a terminal
    table = _columns(
        Table(show_edge=False, header_style="bold"),
        (
            ("partition", "right"),
            ("committed", "right"),
            ("end\noffset", "right"),
            ("lag", "right"),
            ("pending\nleases", "right"),
            ("leased\nto", "left"),
            ("next lease\nends", "right"),
            ("awaiting\nretry", "right"),
            ("acked\nahead", "right"),
            ("dead-\nlettered", "right"),
        ),
    )
    table.columns[5].no_wrap = False
    for p in info.partitions:
        members = ", ".join(f"{m} ({n})" for m, n in sorted(p.members.items())) or NONE
        ends = NONE if p.next_lease_deadline_ms is None else format_from_now(p.next_lease_deadline_ms, now_ms)
        table.add_row(
            str(p.partition),
            cell(p.committed_offset),
            cell(p.end_offset),
            cell(p.lag),
            cell(p.leased),
            members,
            ends,
            cell(p.awaiting_retry),
            cell(p.acked_ahead),
            cell(p.dead_lettered),
        )
    table.caption = "committed: every offset below it is acknowledged"
    return [head, Text(""), table]


# keyed groups --------------------------------------------------------------------------------


def _keyed_rows(info: KeyedGroupInfo, qi: QueueInfo) -> list[dict[str, Any]]:
    members = range(max(info.size, info.resizing_to or 0))
    rows = []
    for m in members:
        for pi in qi.partitions:
            pos = info.position(m, pi.partition, pi.start_offset)
            rows.append(
                {
                    "queue": info.queue,
                    "partition": pi.partition,
                    "member": m,
                    "role": info.role(m),
                    "committed": info.positions.get(m, {}).get(pi.partition),
                    "position": pos,
                    "end_offset": pi.end_offset if pi.online else None,
                    "offsets_behind": max(0, pi.end_offset - pos) if pi.online else None,
                    "barrier": info.barrier.get(pi.partition),
                }
            )
    return rows


def _keyed_doc(info: KeyedGroupInfo, qi: QueueInfo) -> dict[str, Any]:
    starts = {p.partition: p.start_offset for p in qi.partitions}
    return {
        "group": info.group,
        "kind": "keyed",
        "queue": info.queue,
        "key": info.key,
        "size": info.size,
        "generation": info.generation,
        "resizing_to": info.resizing_to,
        "draining": info.draining(starts),
        "partitions": _keyed_rows(info, qi),
    }


def _keyed_view(info: KeyedGroupInfo, qi: QueueInfo) -> list[Any]:
    doc = _keyed_doc(info, qi)
    head = _grid()
    head.add_row("group", info.group)
    head.add_row("kind", "keyed")
    head.add_row("queue", info.queue)
    head.add_row("key", info.key)
    head.add_row("members", str(info.size))
    head.add_row("generation", str(info.generation))
    if info.resizing_to is not None:
        waiting = ", ".join(map(str, doc["draining"])) or "none"
        head.add_row("resizing", f"to {info.resizing_to} members; still draining up to the barrier: {waiting}")
    columns = [
        ("member", "right"),
        ("role", "left"),
        ("partition", "right"),
        ("position", "right"),
        ("end offset", "right"),
        ("offsets behind", "right"),
    ]
    if info.resizing_to is not None:
        columns.append(("barrier", "right"))
    table = _columns(Table(show_edge=False, header_style="bold"), tuple(columns))
    for r in doc["partitions"]:
        cells = [
            str(r["member"]),
            r["role"],
            str(r["partition"]),
            cell(r["position"]),
            cell(r["end_offset"]),
            cell(r["offsets_behind"]),
        ]
        if info.resizing_to is not None:
            cells.append(cell(r["barrier"]))
        table.add_row(*cells)
    table.caption = "position: its commit, else where the generation began"
    return [head, Text(""), table]


# describe ------------------------------------------------------------------------------------


def _find(hw: Client, group: str, queue: str | None) -> list[tuple[str, Any]]:
    """Every group named ``group``: the consumer group, then shared and keyed groups per
    queue (on ``queue`` only, when given; else on the queues the broker lists them on), as
    (kind, description) pairs."""
    found: list[tuple[str, Any]] = []
    try:
        found.append(("consumer", hw.service.describe_group(group)))
    except GroupNotFoundError:
        pass
    look_ups = {"shared": hw.service.shared_describe, "keyed": hw.admin.describe_keyed_group}
    if queue is not None:
        wanted = [(kind, queue) for kind in look_ups]
    else:  # the broker's list says which queues have a shared or keyed group of that name
        wanted = sorted(
            (
                (g.mode, name)
                for g in hw.service.list_groups()
                if g.group == group and g.mode in look_ups
                for name in g.queues
            ),
            key=lambda kind_queue: (kind_queue[1], kind_queue[0] != "shared"),
        )  # by queue, shared first
    for kind, name in wanted:
        try:
            found.append((kind, look_ups[kind](group, name)))
        except GroupNotFoundError:
            pass
        except QueueNotFoundError:
            if queue is not None:
                raise  # else deleted since it was listed
    return found


@group_app.command("describe")
def describe(
    ctx: typer.Context,
    group: GroupArg,
    queue: Annotated[
        str | None,
        typer.Option(
            "--queue",
            "-q",
            metavar="QUEUE",
            show_default=False,
            help="Look for a shared or keyed group of this name on this queue only (default: every queue).",
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Show a group, whatever its kind, with its position in every partition it reads.

    A clustering or broadcast group: its members, which partitions each holds, and per
    partition the committed offset, the end of the log and the lag between them. A shared
    group (one per queue): per partition the committed floor, the lag, the pending leases
    and whose they are, messages awaiting a retry and dead-lettered. A keyed group (one per
    queue): its key, its members and each one's position per partition, and a resize under
    way. A name used by several kinds, or on several queues, shows each.

    With --json: one JSON object per line, one per group found, each with a "kind".

    Examples:

    ```
    headwater --server localhost:7070 group describe billing
    headwater group describe billing --json
    headwater group describe mailers --queue jobs
    ```
    """
    hw = open_client(ctx, read_only=True)
    found = _find(hw, group, queue)
    if not found:
        where = f"queue {queue!r}" if queue is not None else "any queue"
        raise GroupNotFoundError(
            f"no group {group!r}: no consumer group has that name, and no shared or keyed group on {where}"
        )
    queues: dict[str, QueueInfo] = {}

    def queue_info(name: str) -> QueueInfo:
        if name not in queues:
            queues[name] = hw.admin.describe_queue(name)
        return queues[name]

    if as_json:
        for kind, x in found:
            if kind == "consumer":
                print_json(_consumer_doc(x, _partition_rows(hw, x)))
            elif kind == "shared":
                print_json(_shared_doc(x))
            else:
                print_json(_keyed_doc(x, queue_info(x.queue)))
        return
    on_server = ctx.find_root().params.get("server") is not None
    now_ms = int(time.time() * 1000)
    parts: list[Any] = []
    for kind, x in found:
        if parts:
            parts.append(Text(""))
        if kind == "consumer":
            parts += _consumer_view(x, _partition_rows(hw, x), on_server=on_server)
        elif kind == "shared":
            parts += _shared_view(x, now_ms)
        else:
            parts += _keyed_view(x, queue_info(x.queue))
    out_console().print(Group(*parts))


def queue_lag(
    ctx: typer.Context,
    queue: Annotated[str, typer.Argument(metavar="QUEUE", show_default=False, help="The queue.")],
    group: Annotated[
        str | None,
        typer.Option(
            "--group",
            "-g",
            metavar="GROUP",
            show_default=False,
            help="Only this group (default: every group reading it).",
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """How far behind each consumer group is on a queue: committed offset, end of the log, and
    the lag (messages not yet consumed) per partition, with each group's total.

    Covers the groups that commit offsets on the broker (clustering groups, consume --group).
    A shared or keyed group's lag: 'headwater group describe NAME --queue QUEUE'.

    Examples:

    ```
    headwater queue lag orders
    headwater queue lag orders --group billing --json
    ```
    """
    hw = open_client(ctx, read_only=True)
    info = hw.admin.describe_queue(queue)
    groups = (
        [group]
        if group
        else sorted({g.group for g in hw.service.list_groups() if queue in g.queues and kind_of(g) == "clustering"})
    )
    rows = []
    for g in groups:
        committed = hw.service.fetch_offsets(g, queue)
        for pi in info.partitions:
            c = committed.get(pi.partition)
            rows.append(
                {
                    "group": g,
                    "partition": pi.partition,
                    "committed": c,
                    "end_offset": pi.end_offset if pi.online else None,  # None: its leader is out of reach
                    "lag": partition_lag(c, pi.start_offset, pi.end_offset) if pi.online else None,
                }
            )
    if as_json:
        print_json(rows)
        return
    if not rows:
        out_console().print(f"no consumer group has committed offsets on {queue!r}")
        return
    table = Table(show_edge=False, header_style="bold")
    for name, justify in (
        ("group", "left"),
        ("partition", "right"),
        ("committed", "right"),
        ("end offset", "right"),
        ("lag", "right"),
    ):
        table.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]  # rich types justify as a Literal; ours is one of its values
    for g in groups:
        mine = [r for r in rows if r["group"] == g]
        for r in mine:
            table.add_row(g, str(r["partition"]), cell(r["committed"]), cell(r["end_offset"]), cell(r["lag"]))
        total = sum(r["lag"] for r in mine if r["lag"] is not None)
        table.add_row(Text(g, "bold"), Text("total", "bold"), "", "", Text(f"{total:,}", "bold"), end_section=True)
    out_console().print(table)
