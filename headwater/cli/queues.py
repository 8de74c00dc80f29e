"""``headwater queue ...``: create, inspect and change queues."""

from __future__ import annotations

from enum import Enum
from typing import Annotated

import typer

from headwater.cli.context import err_console, open_client, out_console, stdin_is_tty
from headwater.cli.output import format_ttl, locations_table, print_json, queue_detail, queue_json, queues_table
from headwater.cli.parse import parse_pairs, parse_ttl
from headwater.errors import QueueExistsError, QueueNotFoundError, UsageError
from headwater.model.config import MESSAGE_BYTES_MAX, PARTITIONS_MAX, QueueInfo

__all__ = ["queue_app"]

queue_app = typer.Typer(
    name="queue",
    help="Create, list, describe, truncate, disable, enable and delete queues.",
    no_args_is_help=True,
    rich_markup_mode="markdown",
)

NameArg = Annotated[
    str,
    typer.Argument(
        metavar="NAME",
        show_default=False,
        help="Queue name: letters, digits, '.', '_' and '-'.",
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


class Flush(str, Enum):
    sync = "sync"
    async_ = "async"


ACTION_JSON_HELP = (
    'Print one JSON object instead of a sentence: {"action": ..., "queue": NAME, "info": ...}, '
    "info being what 'queue describe --json' prints (null once deleted)."
)
ActionJsonOpt = Annotated[bool, typer.Option("--json", help=ACTION_JSON_HELP)]


def _done(message: str, as_json: bool = False, action: str = "", name: str = "", info: QueueInfo | None = None) -> None:
    """Say what a change did: a green sentence, or with ``--json`` the action shape
    ``{"action", "queue", "info"}`` (docs/cli.md, 'JSON output')."""
    if as_json:
        print_json({"action": action, "queue": name, "info": None if info is None else queue_json(info)})
    else:
        out_console().print(message, style="green")


@queue_app.command("create")
def create(
    ctx: typer.Context,
    name: NameArg,
    partitions: Annotated[
        int,
        typer.Option(
            "--partitions",
            "-p",
            metavar="N",
            min=1,
            max=PARTITIONS_MAX,
            help="Number of partitions (can grow later with 'queue add-partitions').",
        ),
    ] = 1,
    ttl: Annotated[
        str,
        typer.Option(
            "--ttl",
            metavar="DURATION",
            help="How long messages are kept: seconds, or with a unit (30m, 12h, 7d, 2w); "
            "0 or 'forever' keeps them forever.",
        ),
    ] = "7d",
    flush: Annotated[
        Flush | None,
        typer.Option(
            "--flush",
            case_sensitive=False,
            help="sync: acknowledge after fsync; async: fsync on an interval. Default: the store's policy.",
            show_default=False,
        ),
    ] = None,
    message_bytes_max: Annotated[
        int,
        typer.Option(
            "--message-bytes-max",
            metavar="BYTES",
            min=1,
            max=MESSAGE_BYTES_MAX,
            help="Largest message body accepted, in bytes.",
        ),
    ] = 1024 * 1024,
    settings: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            metavar="KEY=VALUE",
            help="A queue setting key=value (repeatable).",
            show_default=False,
        ),
    ] = None,
    if_not_exists: Annotated[
        bool,
        typer.Option(
            "--if-not-exists",
            help="A queue of that name already there is left as it is (whatever its settings), "
            "and the command succeeds.",
        ),
    ] = False,
    as_json: ActionJsonOpt = False,
) -> None:
    """Create a queue (and the data directory, if it does not exist yet).

    Examples:

    ```
    headwater queue create orders --partitions 8
    headwater queue create audit --partitions 2 --ttl forever --flush sync
    headwater queue create clicks --ttl 12h --set owner=web-team
    headwater queue create orders --partitions 8 --if-not-exists   # in a setup script
    ```
    """
    hw = open_client(ctx, create=True)
    pairs = parse_pairs(settings or [], "--set")
    try:
        info = hw.admin.create_queue(
            name,
            partitions=partitions,
            ttl_s=parse_ttl(ttl),
            flush=None if flush is None else flush.value,
            message_bytes_max=message_bytes_max,
            settings=pairs,
        )
    except QueueExistsError:
        if not if_not_exists:
            raise
        info = hw.admin.describe_queue(name)
        _done(
            f"queue {info.name!r} exists already, with {len(info.partitions)} partition(s), "
            f"ttl {format_ttl(info.config.ttl_s)}; left as it is",
            as_json,
            "exists",
            name,
            info,
        )
        return
    _done(
        f"created queue {info.name!r} with {len(info.partitions)} partition(s), ttl {format_ttl(info.config.ttl_s)}",
        as_json,
        "created",
        name,
        info,
    )


@queue_app.command("list")
def list_(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """List the queues: name, partitions, messages, ttl, flush policy, enabled.

    Examples:

    ```
    headwater queue list
    headwater queue list --json
    ```
    """
    infos = sorted(open_client(ctx, read_only=True).admin.list_queues(), key=lambda q: q.name)
    if as_json:
        print_json([queue_json(q) for q in infos])
    elif not infos:
        out_console().print("no queues yet; create one with 'headwater queue create NAME'")
    else:
        out_console().print(queues_table(infos))


@queue_app.command("describe")
def describe(ctx: typer.Context, name: NameArg, as_json: JsonOpt = False) -> None:
    """Show a queue's settings and each partition's retained offsets (start to end).

    Examples:

    ```
    headwater queue describe orders
    headwater queue describe orders --json
    ```
    """
    info = open_client(ctx, read_only=True).admin.describe_queue(name)
    if as_json:
        print_json(queue_json(info))
    else:
        out_console().print(queue_detail(info))


YesOpt = Annotated[
    bool,
    typer.Option(
        "--yes",
        "-y",
        help="Go ahead without asking (required when there is no terminal to ask on).",
    ),
]


def _confirm(what: str, name: str, question: str) -> None:
    """Ask before a change that cannot be undone; with no terminal to ask on, refuse and
    name ``--yes``."""
    if not stdin_is_tty():
        raise UsageError(
            f"refusing to {what} queue {name!r} without confirmation: there is no terminal to "
            f"ask on; pass --yes to {what} it"
        )
    if not typer.confirm(question, default=False, err=True):
        err_console().print(f"not {what.removesuffix('e')}ed")
        raise typer.Exit(1)


@queue_app.command("truncate")
def truncate(ctx: typer.Context, name: NameArg, yes: YesOpt = False, as_json: ActionJsonOpt = False) -> None:
    """Drop every message of a queue; keep the queue and its settings. Asks first unless
    --yes is given, as 'queue delete' does.

    Offsets keep counting up from where they were, so old message ids never name new messages.

    Examples:

    ```
    headwater queue truncate orders
    headwater queue truncate orders --yes
    ```
    """
    hw = open_client(ctx)
    info = hw.admin.describe_queue(name)  # a missing queue fails before any question
    if not yes:
        question = f"Drop all {info.message_count:,} message(s) of queue {name!r}? This cannot be undone."
        _confirm("truncate", name, question)
    info = hw.admin.truncate_queue(name)
    _done(f"truncated queue {info.name!r}", as_json, "truncated", name, info)


@queue_app.command("delete")
def delete(
    ctx: typer.Context,
    name: NameArg,
    yes: Annotated[
        bool,
        typer.Option(
            "--yes",
            "-y",
            help="Delete without asking (required when there is no terminal to ask on).",
        ),
    ] = False,
    if_exists: Annotated[
        bool,
        typer.Option(
            "--if-exists",
            help="A queue that is not there is not an error: say so and succeed.",
        ),
    ] = False,
    as_json: ActionJsonOpt = False,
) -> None:
    """Delete a queue and all its messages. Asks first unless --yes is given.

    Examples:

    ```
    headwater queue delete orders
    headwater queue delete orders --yes
    headwater queue delete scratch --yes --if-exists   # in a teardown script
    ```
    """
    hw = open_client(ctx)
    try:
        info = hw.admin.describe_queue(name)  # a missing queue fails before any question
    except QueueNotFoundError:
        if not if_exists:
            raise
        _done(f"no queue {name!r}; nothing to delete", as_json, "absent", name)
        return
    if not yes:
        question = f"Delete queue {name!r} and its {info.message_count:,} message(s)? This cannot be undone."
        _confirm("delete", name, question)
    hw.admin.delete_queue(name, missing_ok=if_exists)  # gone meanwhile: fine with --if-exists
    _done(f"deleted queue {name!r}", as_json, "deleted", name)


@queue_app.command("disable")
def disable(ctx: typer.Context, name: NameArg, as_json: ActionJsonOpt = False) -> None:
    """Disable a queue: reads and writes fail until it is enabled again.

    Example:

    ```
    headwater queue disable orders
    ```
    """
    info = open_client(ctx).admin.disable_queue(name)
    _done(f"disabled queue {name!r}; enable it with 'headwater queue enable {name}'", as_json, "disabled", name, info)


@queue_app.command("enable")
def enable(ctx: typer.Context, name: NameArg, as_json: ActionJsonOpt = False) -> None:
    """Enable a disabled queue again.

    Example:

    ```
    headwater queue enable orders
    ```
    """
    info = open_client(ctx).admin.enable_queue(name)
    _done(f"enabled queue {name!r}", as_json, "enabled", name, info)


@queue_app.command("add-partitions")
def add_partitions(
    ctx: typer.Context,
    name: NameArg,
    to: Annotated[
        int,
        typer.Option(
            "--to",
            metavar="N",
            min=1,
            max=PARTITIONS_MAX,
            help="The new total number of partitions (larger than now).",
            show_default=False,
        ),
    ],
    as_json: ActionJsonOpt = False,
) -> None:
    """Grow a queue to a larger total number of partitions.

    Messages already stored stay where they are; keys may map to other partitions from now on.

    Example:

    ```
    headwater queue add-partitions orders --to 16
    ```
    """
    info = open_client(ctx).admin.add_partitions(name, to)
    _done(f"queue {info.name!r} now has {len(info.partitions)} partitions", as_json, "added-partitions", name, info)


@queue_app.command("locations")
def locations(ctx: typer.Context, name: NameArg, as_json: JsonOpt = False) -> None:
    """Show which broker leads each partition of a queue, and its address.

    A broker running alone leads every partition itself (broker -1); in a cluster each
    partition has one leader, which takes its sends and serves its reads.

    Examples:

    ```
    headwater queue locations orders
    headwater queue locations orders --json
    ```
    """
    md = open_client(ctx, read_only=True).admin.cluster_metadata([name])
    parts = md.queue(name).partitions
    if as_json:
        print_json(
            [
                {
                    "partition": p.partition,
                    "leader": p.leader,
                    "address": (b.address if (b := md.broker(p.leader)) is not None and b.host else None),
                    "leader_epoch": p.leader_epoch,
                    "replicas": p.replicas,
                }
                for p in parts
            ]
        )
        return
    out_console().print(locations_table(md, name))
