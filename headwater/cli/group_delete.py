"""``headwater group delete``: remove a consumer group's committed offsets."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from headwater.cli.context import err_console, open_client, out_console, stdin_is_tty
from headwater.cli.output import print_json
from headwater.errors import GroupNotEmptyError, GroupNotFoundError, UsageError

__all__ = ["delete_group"]


def delete_group(
    ctx: typer.Context,
    group: Annotated[str, typer.Argument(metavar="GROUP", show_default=False, help="The group's name.")],
    queue: Annotated[
        str | None,
        typer.Option(
            "--queue",
            "-q",
            metavar="QUEUE",
            show_default=False,
            help="Delete only the offsets on this queue (kafka-consumer-groups --delete-offsets).",
        ),
    ] = None,
    yes: Annotated[
        bool,
        typer.Option("--yes", "-y", help="Delete without asking (required when there is no terminal to ask on)."),
    ] = False,
    as_json: Annotated[
        bool,
        typer.Option("--json", help='Print {"action": "deleted", "group", "queue", "offsets"} instead of text.'),
    ] = False,
) -> None:
    """Delete a consumer group's committed offsets (all, or on one queue with --queue).
    Asks first unless --yes is given. Refused while the group has live members: stop them
    first (or wait for their session timeout). Afterwards 'group list' no longer shows the
    group and a new member starts from its reset policy (earliest or latest).

    With --json: {"action": "deleted", "group", "queue" (null: every queue), "offsets":
    {queue: {partition: offset}}}, the offsets deleted.

    Examples:

    ```
    headwater group delete billing
    headwater group delete billing --queue orders --yes
    ```
    """
    hw = open_client(ctx)
    d = hw.service.describe_group(group)  # GroupNotFoundError before any question
    if d.members:
        raise GroupNotEmptyError(
            f"group {group!r} has {len(d.members)} live member(s): stop them first (or wait for their "
            f"session timeout), then delete it; see them with 'headwater group describe {group}'"
        )
    offsets = {q: o for q, o in d.offsets.items() if queue is None or q == queue}
    if not offsets:
        on = f" on queue {queue!r}" if queue is not None else ""
        raise GroupNotFoundError(f"group {group!r} has no committed offsets{on}: nothing to delete")
    if not yes:
        _confirm(group, offsets)
    try:
        hw.admin.delete_group(group, queue=queue)
    except GroupNotEmptyError as e:  # a member joined meanwhile
        raise GroupNotEmptyError(f"{e}; see them with 'headwater group describe {group}'") from None
    if as_json:
        doc: dict[str, Any] = {"action": "deleted", "group": group, "queue": queue, "offsets": offsets}
        print_json(doc)
        return
    table = Table(show_edge=False, header_style="bold")
    table.add_column("queue", no_wrap=True)
    table.add_column("partition", justify="right", no_wrap=True)
    table.add_column("offset", justify="right", no_wrap=True)
    for q, o in offsets.items():
        for p, off in sorted(o.items()):
            table.add_row(q, str(p), f"{off:,}")
    out_console().print(table)
    what = f"group {group!r}" if queue is None else f"group {group!r}'s offsets on queue {queue!r}"
    out_console().print(f"deleted {what}", style="green")


def _confirm(group: str, offsets: dict[str, dict[int, int]]) -> None:
    if not stdin_is_tty():
        raise UsageError(
            f"refusing to delete group {group!r} without confirmation: there is no terminal to ask on; "
            f"pass --yes to delete it"
        )
    n = sum(len(o) for o in offsets.values())
    question = f"Delete group {group!r}'s {n} committed offset(s) on {', '.join(offsets)}? This cannot be undone."
    if not typer.confirm(question, default=False, err=True):
        err_console().print("not deleted")
        raise typer.Exit(1)
