"""``headwater cluster ...``: the brokers of a cluster, its controller, who leads what."""

from __future__ import annotations

import time
from collections import Counter
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from headwater.cli.context import err_console, open_client, out_console
from headwater.cli.output import print_json
from headwater.client import Client
from headwater.model.cluster import ALONE, ClusterMetadata, MoveOutcome, PartitionMove

__all__ = ["cluster_app"]

cluster_app = typer.Typer(
    name="cluster",
    help="The brokers of a cluster, its controller, which broker leads which partitions; moving them.",
    no_args_is_help=True,
    rich_markup_mode="markdown",
)


def status_json(md: ClusterMetadata) -> dict[str, object]:
    leads = Counter(p.leader for q in md.queues for p in q.partitions)
    return {
        "cluster_id": md.cluster_id or None,
        "controller": md.controller,
        "brokers": [
            {
                "broker_id": b.broker_id,
                "address": b.address if b.host else None,
                "epoch": b.epoch,
                "leads": leads[b.broker_id],
            }
            for b in md.brokers
        ],
        "queues": len(md.queues),
        "partitions": sum(leads.values()),
        "leaderless": leads[-1] if md.cluster_id else 0,
        "moves": [move_json(m) for m in md.moves],
    }


def move_json(m: PartitionMove) -> dict[str, object]:
    return {"queue": m.queue, "partition": m.partition, "source": m.source, "target": m.target, "phase": m.phase}


def moves_table(moves: list[PartitionMove]) -> Table:
    table = Table(show_edge=False, header_style="bold")
    for name, justify in (
        ("queue", "left"),
        ("partition", "right"),
        ("from", "right"),
        ("to", "right"),
        ("phase", "left"),
    ):
        table.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]  # rich types justify as a Literal; ours is one of its values
    for m in moves:
        table.add_row(m.queue, str(m.partition), str(m.source), str(m.target), m.phase)
    return table


@cluster_app.command("status")
def status(
    ctx: typer.Context, as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False
) -> None:
    """Show the cluster: its brokers (address, broker epoch, partitions each leads) and its
    controller. Any broker answers; a broker running alone says so.

    Examples:

    ```
    headwater --server 127.0.0.1:7071 cluster status
    headwater --server 127.0.0.1:7071 cluster status --json
    ```
    """
    md = open_client(ctx, read_only=True).admin.cluster_metadata()
    doc = status_json(md)
    if as_json:
        print_json(doc)
        return
    console = out_console()
    if not md.cluster_id:
        console.print("this broker runs alone (no cluster): it leads every partition itself")
        console.print(f"{doc['queues']} queue(s), {doc['partitions']} partition(s)")
        return
    console.print(
        f"cluster {md.cluster_id}: {len(md.brokers)} broker(s), controller "
        + (f"broker {md.controller}" if md.controller != ALONE else "none elected now")
        + f"; {doc['queues']} queue(s), {doc['partitions']} partition(s)"
    )
    table = Table(show_edge=False, header_style="bold")
    for name, justify in (
        ("broker", "right"),
        ("address", "left"),
        ("epoch", "right"),
        ("leads", "right"),
        ("", "left"),
    ):
        table.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]  # rich types justify as a Literal; ours is one of its values
    leads = Counter(p.leader for q in md.queues for p in q.partitions)
    for b in md.brokers:
        role = Text("controller", "bold") if b.broker_id == md.controller else Text("")
        table.add_row(str(b.broker_id), b.address, str(b.epoch), f"{leads[b.broker_id]:,}", role)
    console.print(table)
    if doc["leaderless"]:
        console.print(Text(f"{doc['leaderless']} partition(s) have no live leader now", "bold red"))
    if md.moves:
        console.print(f"{len(md.moves)} partition move(s) not finished:")
        console.print(moves_table(md.moves))


_DRY_RUN = typer.Option("--dry-run", help="Show the plan; move nothing.")
_NO_WAIT = typer.Option("--no-wait", help="Start the moves and return; `cluster status` shows them.")
_JSON = typer.Option("--json", help="Print JSON instead of a table.")
WAIT_POLL_S = 0.5  # how often the progress asks where the moves are
# a broker's view learns a move's end, how it ended and the partition's new leader by
# separate watches: a finished move the view does not judge yet (no outcome, its partition
# still on its source) is asked again this long before it counts as rolled back
SETTLE_S = 3.0
# an outcome counts for a move planned here if it ended at most this long before the plan
# was asked for, by this machine's clock (the controller's may differ a little)
CLOCK_SKEW_MS = 30_000
MOVES_ROLLED_BACK = 4  # the exit code of a rebalance or decommission that waited and left partitions where they were


@cluster_app.command("rebalance")
def rebalance(
    ctx: typer.Context,
    dry_run: Annotated[bool, _DRY_RUN] = False,
    no_wait: Annotated[bool, _NO_WAIT] = False,
    as_json: Annotated[bool, _JSON] = False,
) -> None:
    """Move partitions so that every live broker leads within one partition of the others
    (a new broker takes its share; partitions leave brokers that are gone when they can).
    Sends and reads go on while a partition moves: a short pause on it, nothing lost.
    Exit code 4 when a move rolled back (each is named, with why).

    Examples:

    ```
    headwater --server 127.0.0.1:7071 cluster rebalance --dry-run
    headwater --server 127.0.0.1:7071 cluster rebalance
    ```
    """
    hw = open_client(ctx)
    asked_ms = int(time.time() * 1000)
    _run_plan(hw, hw.admin.rebalance(dry_run=dry_run), "rebalance", dry_run, no_wait, as_json, asked_ms)


@cluster_app.command("decommission")
def decommission(
    ctx: typer.Context,
    broker: Annotated[int, typer.Argument(help="The id of the broker to empty.")],
    dry_run: Annotated[bool, _DRY_RUN] = False,
    no_wait: Annotated[bool, _NO_WAIT] = False,
    as_json: Annotated[bool, _JSON] = False,
) -> None:
    """Move every partition off broker BROKER, each to the least loaded other live broker;
    once done, BROKER can be stopped without leaving a partition without its leader.
    Exit code 4 when a move rolled back: the broker still leads those partitions.

    Examples:

    ```
    headwater --server 127.0.0.1:7071 cluster decommission 3 --dry-run
    headwater --server 127.0.0.1:7071 cluster decommission 3
    ```
    """
    hw = open_client(ctx)
    asked_ms = int(time.time() * 1000)
    planned = hw.admin.decommission(broker, dry_run=dry_run)
    _run_plan(hw, planned, "decommission", dry_run, no_wait, as_json, asked_ms)


def _run_plan(
    hw: Client, planned: list[PartitionMove], what: str, dry_run: bool, no_wait: bool, as_json: bool, asked_ms: int
) -> None:
    """Show the plan; then, unless told not to, the moves' progress until they are done."""
    wait = not (dry_run or no_wait) and bool(planned)
    if not as_json:
        console = out_console()
        if not planned:
            console.print(f"{what}: nothing to move")
            return
        verb = "would move" if dry_run else "moving"
        console.print(f"{what}: {verb} {len(planned)} partition(s)")
        console.print(moves_table(planned))
    finished = _wait_for(hw, planned, progress=not as_json, asked_ms=asked_ms) if wait else None
    if as_json:
        doc: dict[str, object] = {"dry_run": dry_run, "moves": [move_json(m) for m in planned]}
        if finished is not None:
            doc["outcome"] = finished
        print_json(doc)
        _exit_if_rolled_back(finished)
        return
    if finished is not None:
        moved = sum(1 for o in finished if o["outcome"] == "moved")
        out_console().print(f"{what}: {moved} of {len(planned)} partition(s) moved")
        for o in finished:
            if o["outcome"] != "moved":
                why = o.get("why") or "the target went, or it took too long"
                err_console().print(
                    f"{o['queue']}[{o['partition']}] did not move to broker {o['target']}: its move was rolled back "
                    f"({why}); it stays on broker {o['leader']}",
                    markup=False,
                )
        _exit_if_rolled_back(finished)


def _exit_if_rolled_back(finished: list[dict[str, object]] | None) -> None:
    if finished is not None and any(o["outcome"] != "moved" for o in finished):
        raise typer.Exit(MOVES_ROLLED_BACK)


def _wait_for(
    hw: Client, planned: list[PartitionMove], *, progress: bool, asked_ms: int | None = None
) -> list[dict[str, object]]:
    """Poll the metadata until none of ``planned`` is unfinished; each move's outcome, as
    the controller recorded it (with why a rolled back one was), or where the partition is
    led when the brokers predate those records. ``asked_ms``: when the plan was asked for."""
    keys = {(m.queue, m.partition) for m in planned}
    queues = sorted({m.queue for m in planned})
    with Progress(
        TextColumn("moving"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err_console(),
        disable=not progress,
        transient=True,
    ) as bar:
        task = bar.add_task("moves", total=len(planned))
        while True:
            md = hw.admin.cluster_metadata(queues)
            left = [m for m in md.moves if (m.queue, m.partition) in keys]
            bar.update(task, completed=len(planned) - len(left))
            if not left:
                break
            time.sleep(WAIT_POLL_S)
    settled_by = time.monotonic() + SETTLE_S
    while True:
        leaders = {(q.name, p.partition): p.leader for q in md.queues for p in q.partitions}
        ended = _ended(md, planned, asked_ms)
        unjudged = [m for m in planned if m not in ended and leaders.get((m.queue, m.partition)) != m.target]
        if not unjudged or time.monotonic() >= settled_by:
            break
        time.sleep(0.1)
        md = hw.admin.cluster_metadata(queues)
    rows: list[dict[str, object]] = []
    for m in planned:
        row: dict[str, object] = {**move_json(m), "leader": leaders.get((m.queue, m.partition), -1)}
        outcome = ended.get(m)
        if outcome is not None:
            row["outcome"] = outcome.outcome
            if outcome.why:
                row["why"] = outcome.why
        else:
            row["outcome"] = "moved" if leaders.get((m.queue, m.partition)) == m.target else "rolled back"
        rows.append(row)
    return rows


def _ended(md: ClusterMetadata, planned: list[PartitionMove], asked_ms: int | None) -> dict[PartitionMove, MoveOutcome]:
    """The recorded outcome of each planned move that has one: the latest of its partition,
    if it went from its source to its target and ended since the plan was asked for."""
    if asked_ms is None:
        return {}
    found: dict[PartitionMove, MoveOutcome] = {}
    for m in planned:
        for o in reversed(md.ended_moves):
            if (o.queue, o.partition) == (m.queue, m.partition):
                if (o.source, o.target) == (m.source, m.target) and o.ended_ms >= asked_ms - CLOCK_SKEW_MS:
                    found[m] = o
                break  # an earlier move of the partition is not this one's outcome
    return found
