"""``headwater queue alter``: change a queue's settings after creation (``kafka-configs --alter``)."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from headwater.cli.context import open_client, out_console
from headwater.cli.output import format_ttl, print_json, queue_json
from headwater.cli.parse import parse_ttl
from headwater.errors import UsageError
from headwater.model.config import MESSAGE_BYTES_MAX, QueueConfig

__all__ = ["alter"]


def _shown(c: QueueConfig) -> dict[str, str]:
    return {
        "ttl": format_ttl(c.ttl_s),
        "flush": c.flush or "store default",
        "message_bytes_max": f"{c.message_bytes_max:,}",
    }


def alter(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(metavar="QUEUE", show_default=False, help="The queue's name.")],
    ttl: Annotated[
        str | None,
        typer.Option(
            "--ttl",
            metavar="DURATION",
            show_default=False,
            help="How long messages are kept: seconds, or with a unit (30m, 12h, 7d, 2w); "
            "0, 'none' or 'forever' keeps them forever.",
        ),
    ] = None,
    message_bytes_max: Annotated[
        int | None,
        typer.Option(
            "--message-bytes-max",
            metavar="BYTES",
            min=1,
            max=MESSAGE_BYTES_MAX,
            show_default=False,
            help="Largest message body accepted from now on, in bytes (stored messages stay).",
        ),
    ] = None,
    flush: Annotated[
        str | None,
        typer.Option(
            "--flush",
            metavar="sync|async",
            show_default=False,
            help="sync: acknowledge after fsync; async: fsync on an interval.",
        ),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help='Print {"action": "altered", "queue", "info"} (the queue as changed).')
    ] = False,
) -> None:
    """Change a queue's ttl, largest message or flush policy after creation; the settings not
    given keep their values. Prints each setting before and after. The change is durable; on
    a cluster every broker follows it. A shorter ttl applies at retention's next pass.

    Examples:

    ```
    headwater queue alter orders --ttl 30d
    headwater queue alter orders --ttl none --flush sync
    headwater queue alter orders --message-bytes-max 262144 --json
    ```
    """
    changes: dict[str, Any] = {}
    if ttl is not None:
        changes["ttl_s"] = parse_ttl(ttl)
    if message_bytes_max is not None:
        changes["message_bytes_max"] = message_bytes_max
    if flush is not None:
        if flush.lower() not in ("sync", "async"):
            raise UsageError(f"--flush: {flush!r} is not a flush policy; use sync or async")
        changes["flush"] = flush.lower()
    if not changes:
        raise UsageError("nothing to alter: give --ttl, --message-bytes-max or --flush")
    hw = open_client(ctx)
    before = hw.admin.describe_queue(name).config
    info = hw.admin.alter_queue(name, **changes)
    if as_json:
        print_json({"action": "altered", "queue": name, "info": queue_json(info)})
        return
    table = Table(show_edge=False, header_style="bold")
    for column in ("setting", "before", "after"):
        table.add_column(column, no_wrap=True)
    old, new = _shown(before), _shown(info.config)
    for key in old:
        table.add_row(key, old[key], new[key], style=None if old[key] == new[key] else "bold")
    out_console().print(table)
    out_console().print(f"altered queue {name!r}", style="green")
