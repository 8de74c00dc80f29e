"""``headwater subscriber ...``: add, delete, list and describe push subscribers (HQueue's shell).

A subscriber is registered here; a process attaches to it with ``client.subscribe(QUEUE,
NAME, listeners=[...])`` and the broker pushes to it (docs/subscriptions.md).
"""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from headwater.cli import parse
from headwater.cli.context import open_client, out_console
from headwater.cli.output import iso_utc, print_json
from headwater.cli.parse import parse_partitions
from headwater.model.config import QueueInfo
from headwater.model.subscription import SubscriberInfo, subscribed_partitions

__all__ = ["subscriber_app", "parse_start"]

subscriber_app = typer.Typer(
    name="subscriber",
    help="Add, delete, list and describe push subscribers of a queue.",
    no_args_is_help=True,
    rich_markup_mode="markdown",
)

QueueArg = Annotated[str, typer.Argument(metavar="QUEUE", show_default=False, help="The queue.")]
NameArg = Annotated[
    str,
    typer.Argument(
        metavar="NAME",
        show_default=False,
        help="Subscriber name: letters, digits, '.', '_' and '-'.",
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


def parse_start(text: str) -> str:
    """``--from``: ``earliest``, ``latest``, an offset, or a time, as the API's start form.

    >>> parse_start("earliest"), parse_start("42"), parse_start("2026-11-21T10:00:00Z")
    ('earliest', 'offset:42', 'time:1795255200000')
    """
    where = parse.parse_start(text, "--from")
    if isinstance(where, str):
        return where
    return f"offset:{where.offset}" if where.offset is not None else f"time:{where.time_ms}"


def _lag(info: SubscriberInfo, qi: QueueInfo) -> dict[int, tuple[int, int, int]]:
    """partition -> (checkpoint, end offset, messages behind)."""
    out = {}
    for p in subscribed_partitions(info, len(qi.partitions)):
        pi = qi.partitions[p]
        cp = info.checkpoint(p, pi.start_offset)
        out[p] = (cp, pi.end_offset, max(0, pi.end_offset - cp))
    return out


def _json(info: SubscriberInfo, qi: QueueInfo) -> dict[str, Any]:
    return {
        "queue": info.queue,
        "name": info.name,
        "partitions": info.partitions,
        "tags": info.tags,
        "created": iso_utc(info.created_ms),
        "checkpoints": [
            {"partition": p, "checkpoint": cp, "end_offset": end, "lag": lag}
            for p, (cp, end, lag) in _lag(info, qi).items()
        ],
    }


def _done(message: str) -> None:
    out_console().print(message, style="green")


@subscriber_app.command("add")
def add(
    ctx: typer.Context,
    queue: QueueArg,
    name: NameArg,
    partitions: Annotated[
        str | None,
        typer.Option(
            "--partitions",
            "-p",
            metavar="LIST",
            help="Partitions to follow, e.g. 0,2,5 or 0-3 (default: all, and those added later).",
            show_default=False,
        ),
    ] = None,
    tags: Annotated[
        str | None,
        typer.Option(
            "--tags",
            "-t",
            metavar="TAGS",
            help="Tags to deliver, comma-separated, or '*' for every message (the default).",
            show_default=False,
        ),
    ] = None,
    start: Annotated[
        str,
        typer.Option(
            "--from",
            metavar="POSITION",
            help="Where delivery starts: 'latest' (what is appended from now on), 'earliest', an "
            "offset (in each partition) or a time (2026-11-21T10:00:00Z, -15m, now).",
        ),
    ] = "latest",
    as_json: JsonOpt = False,
) -> None:
    """Register a push subscriber on a queue.

    Examples:

    ```
    headwater subscriber add orders audit
    headwater subscriber add orders billing --tags paid,refunded --from earliest
    headwater subscriber add orders replay --partitions 0-3 --from 2026-11-21T10:00:00Z
    ```
    """
    tag_list = None if tags is None else [t.strip() for t in tags.split(",") if t.strip()]
    client = open_client(ctx)
    info = client.admin.add_subscriber(
        queue, name, partitions=parse_partitions(partitions), tags=tag_list, start=parse_start(start)
    )
    if as_json:
        print_json(_json(info, client.admin.describe_queue(queue)))
        return
    where = ", ".join(f"{p}:{o}" for p, o in sorted(info.checkpoints.items()))
    _done(f"added subscriber {name!r} to queue {queue!r}, starting at {where or 'the first partition offsets'}")


@subscriber_app.command("delete")
def delete(
    ctx: typer.Context,
    queue: QueueArg,
    name: NameArg,
    as_json: Annotated[
        bool, typer.Option("--json", help='Print {"action": "deleted", "queue": QUEUE, "subscriber": NAME}.')
    ] = False,
) -> None:
    """Delete a subscriber and its checkpoint; a process attached to it stops.

    Example:

    ```
    headwater subscriber delete orders audit
    ```
    """
    open_client(ctx).admin.delete_subscriber(queue, name)
    if as_json:
        print_json({"action": "deleted", "queue": queue, "subscriber": name})
    else:
        _done(f"deleted subscriber {name!r} of queue {queue!r}")


@subscriber_app.command("list")
def list_(
    ctx: typer.Context,
    queue: Annotated[
        str | None, typer.Argument(metavar="[QUEUE]", show_default=False, help="Only this queue's subscribers.")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """List subscribers with what they follow and how far behind they are.

    Examples:

    ```
    headwater subscriber list
    headwater subscriber list orders --json
    ```
    """
    client = open_client(ctx, read_only=True)
    subs = client.admin.list_subscribers(queue)
    queues = {q: client.admin.describe_queue(q) for q in {s.queue for s in subs}}
    if as_json:
        print_json([_json(s, queues[s.queue]) for s in subs])
        return
    if not subs:
        where = f"queue {queue!r} has" if queue else "there are"
        out_console().print(f"{where} no subscribers; add one with 'headwater subscriber add QUEUE NAME'")
        return
    table = Table(show_edge=False, header_style="bold")
    for col, justify in (
        ("queue", "left"),
        ("name", "left"),
        ("partitions", "left"),
        ("tags", "left"),
        ("lag", "right"),
        ("created", "left"),
    ):
        table.add_column(col, justify=justify, no_wrap=True)  # type: ignore[arg-type]  # rich types justify as a Literal; ours is one of its values
    for s in subs:
        lag = sum(x[2] for x in _lag(s, queues[s.queue]).values())
        parts = "all" if s.partitions is None else ",".join(map(str, s.partitions))
        table.add_row(
            s.queue, s.name, parts, "*" if s.tags is None else ",".join(s.tags), f"{lag:,}", iso_utc(s.created_ms)
        )
    out_console().print(table)


@subscriber_app.command("describe")
def describe(ctx: typer.Context, queue: QueueArg, name: NameArg, as_json: JsonOpt = False) -> None:
    """A subscriber's checkpoint and lag per partition.

    Example:

    ```
    headwater subscriber describe orders audit
    ```
    """
    client = open_client(ctx, read_only=True)
    info = client.admin.describe_subscriber(queue, name)
    qi = client.admin.describe_queue(queue)
    if as_json:
        print_json(_json(info, qi))
        return
    console = out_console()
    console.print(
        f"[bold]subscriber[/bold] {info.name}  [bold]queue[/bold] {info.queue}  "
        f"[bold]tags[/bold] {'*' if info.tags is None else ','.join(info.tags)}  "
        f"[bold]created[/bold] {iso_utc(info.created_ms)}"
    )
    table = Table(show_edge=False, header_style="bold")
    for col in ("partition", "checkpoint", "end offset", "lag"):
        table.add_column(col, justify="right", no_wrap=True)
    for p, (cp, end, lag) in _lag(info, qi).items():
        table.add_row(str(p), str(cp), str(end), f"{lag:,}")
    console.print(table)
