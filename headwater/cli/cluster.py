"""``headwater cluster ...``: the brokers of a cluster, its controller, who leads what."""

from __future__ import annotations

from collections import Counter
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from headwater.cli.context import open_client, out_console
from headwater.cli.output import print_json
from headwater.model.cluster import ALONE, ClusterMetadata

__all__ = ["cluster_app"]

cluster_app = typer.Typer(
    name="cluster",
    help="The brokers of a cluster, its controller, and which broker leads which partitions.",
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
    }


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
