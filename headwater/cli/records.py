"""``headwater scan | get | find``: reading messages (``produce`` is in :mod:`headwater.cli.produce`)."""

from __future__ import annotations

import itertools
import sys
from collections.abc import Iterable
from typing import Annotated, Any

import typer

from headwater.cli.context import err_console, open_client, out_console
from headwater.cli.output import record_detail, records_table, write_json_lines
from headwater.cli.parse import (
    COUNT_MAX,
    From,
    parse_from,
    parse_message_id,
    parse_partitions,
    parse_position,
    parse_time,
)
from headwater.cli.template import RAW_TEMPLATE, compile_template
from headwater.client import Client
from headwater.errors import InvalidArgumentError, QueueDisabledError, UsageError
from headwater.model.message import Record

__all__ = ["scan", "get", "find", "TABLE_ROWS_DEFAULT", "output_template", "write_formatted"]

TABLE_ROWS_DEFAULT = 100  # a table is built in memory; --json streams without a cap

JSON_HELP = (
    "Print JSON lines instead of a table, one object per message with the keys message_id, "
    "partition, offset, timestamp (ISO-8601 UTC), key, tag, properties, value and scheduled "
    "(when a delayed message was due, else null). A value or key that is not UTF-8 is base64 "
    'and adds value_encoding / key_encoding: "base64".'
)
QueueArg = Annotated[str, typer.Argument(metavar="QUEUE", help="Queue name.", show_default=False)]
JsonOpt = Annotated[bool, typer.Option("--json", help=JSON_HELP)]


def _arg_bytes(text: str) -> bytes:
    # surrogateescape gives back the exact bytes of arguments that are not valid UTF-8
    return text.encode("utf-8", "surrogateescape")


def output_template(as_json: bool, template: str | None, raw: bool) -> str | None:
    """The ``--format`` template of a command's options (``--raw``: the values alone), or
    None for a table or JSON; more than one of ``--json``, ``--format`` and ``--raw`` is an
    error."""
    given = [name for name, on in (("--json", as_json), ("--format", template is not None), ("--raw", raw)) if on]
    if len(given) > 1:
        raise UsageError(f"{' and '.join(given)} do not go together: each picks how records are printed; give one")
    return RAW_TEMPLATE if raw else template


def write_formatted(records: Iterable[Record], template: str) -> int:
    """Write records through a ``--format`` template, as bytes, streamed; returns the count."""
    render = compile_template(template)
    out = sys.stdout.buffer
    count = 0
    for rec in records:
        out.write(render(rec))
        count += 1
    out.flush()
    return count


def _emit(records: Iterable[Record], *, as_json: bool, limit: int | None, template: str | None = None) -> None:
    """Print records as JSON lines or through a template (streamed) or as one table (capped
    when no --limit)."""
    if template is not None:
        write_formatted(itertools.islice(records, limit), template)
        return
    if as_json:
        write_json_lines(itertools.islice(records, limit))
        return
    cap = TABLE_ROWS_DEFAULT if limit is None else limit
    rows = list(itertools.islice(records, cap + 1 if limit is None else cap))
    more = len(rows) > cap
    rows = rows[:cap]
    if not rows:
        out_console().print("no messages in this range", style="dim")
        return
    console = out_console()
    console.print(records_table(rows, console.width))
    if more:
        err_console().print(
            f"showing the first {cap} messages; pass --limit N for more, or --json to stream them all",
            style="dim",
        )


FROM_HELP = (
    "earliest, latest, -N (the last N messages of each partition, e.g. -10), an offset "
    "(1200), a message id, an ISO-8601 time (2026-11-21T10:00:00Z, 2026-11-21), a time "
    "relative to now (-15m, -2h, -1d; units s m h d w) or now."
)
FromOpt = Annotated[
    str | None,
    typer.Option(
        "--from",
        metavar="POSITION",
        show_default=False,
        help=f"Start here (inclusive): {FROM_HELP} Default: earliest.",
    ),
]
FORMAT_HELP = (
    "Print each message through this template instead of a table, as bytes (kcat -f): %v value, "
    "%k key, %p partition, %o offset, %i id, %T time (ms), %I time (ISO-8601), %t queue, %g tag, "
    "%h properties (k=v,...), %S / %K value / key length, %% a %; \\n newline, \\t tab, \\0 NUL. "
    "No newline is added: end with \\n. E.g. -f '%p:%o %k=%v\\n'."
)
FormatOpt = Annotated[
    str | None, typer.Option("--format", "-f", metavar="TEMPLATE", show_default=False, help=FORMAT_HELP)
]
RawOpt = Annotated[
    bool, typer.Option("--raw", help="Print the values alone, as bytes, one a line (= --format '%v\\n').")
]
ToOpt = Annotated[
    str | None,
    typer.Option(
        "--to",
        metavar="POSITION",
        show_default=False,
        help="Stop before here (exclusive); same forms as --from.",
    ),
]
LimitOpt = Annotated[
    int | None,
    typer.Option(
        "--limit",
        "-n",
        metavar="N",
        min=1,
        max=COUNT_MAX,
        show_default=False,
        help=f"Print at most N messages. Default: {TABLE_ROWS_DEFAULT} in a table, all with --json.",
    ),
]


def _scan_bounds(
    hw: Client, queue: str, partitions: list[int] | None, start: From | None, to: str | None
) -> dict[str, Any]:
    """Scanner keyword arguments for --from (see :func:`~headwater.cli.parse.parse_from`)
    and --to (an offset, a message id or a time)."""
    bounds: dict[str, Any] = {}
    pinned: list[int] = []
    if start is not None and (start.edge == "latest" or start.last_n is not None):
        # per partition, from where each one ends now
        info = hw.admin.describe_queue(queue)
        chosen = [p for p in info.partitions if partitions is None or p.partition in partitions]
        bounds["start"] = start.offsets(chosen)
    elif start is not None and start.message_id is not None:
        bounds["start"] = start.message_id
        pinned.append(start.message_id.partition)
    elif start is not None and start.time_ms is not None:
        bounds["start_time"] = start.time_ms
    elif start is not None and start.offset is not None:
        bounds["start"] = start.offset
    for text, what, pos_key, time_key in ((to, "--to", "stop", "end_time"),):
        if text is None:
            continue
        pos = parse_position(text, what)
        if pos.time_ms is not None:
            bounds[time_key] = pos.time_ms
        elif pos.message_id is not None:
            bounds[pos_key] = pos.message_id
            pinned.append(pos.message_id.partition)
        else:
            bounds[pos_key] = pos.offset
    if len(set(pinned)) > 1:
        raise InvalidArgumentError(
            f"--from and --to are message ids of different partitions ({pinned[0]} and {pinned[1]}); "
            f"ids bound a scan of one partition, so use offsets or times to scan several"
        )
    return bounds


def _require_enabled(hw: Client, queue: str) -> None:
    """Fail early on a missing or disabled queue: before reading stdin (produce), and even
    when the range is empty (the scanner itself fails only once it fetches)."""
    if not hw.admin.describe_queue(queue).enabled:
        raise QueueDisabledError(f"queue {queue!r} is disabled; enable it to read or write")


def scan(
    ctx: typer.Context,
    queue: QueueArg,
    partitions: Annotated[
        str | None,
        typer.Option(
            "--partitions",
            metavar="LIST",
            help="Partitions to read, e.g. 0,2,5 or 0-3 (default: all; a message id in --from/--to picks its own).",
            show_default=False,
        ),
    ] = None,
    from_: FromOpt = None,
    to: ToOpt = None,
    tags: Annotated[
        list[str] | None,
        typer.Option(
            "--tag",
            "-t",
            metavar="TAG",
            help="Only messages with this tag (repeatable: any of them).",
            show_default=False,
        ),
    ] = None,
    limit: LimitOpt = None,
    as_json: JsonOpt = False,
    template: FormatOpt = None,
    raw: RawOpt = False,
) -> None:
    """Read messages of a queue, partition by partition, each in offset order.

    --from and --to each take an offset (for every partition), a message id (which
    restricts the scan to that id's partition) or a time: ISO-8601 such as
    2026-11-21T10:00:00Z (no zone means UTC), or relative to now such as -15m, -2h, -1d.
    Times select by append time. --from also takes earliest (the default), latest and -N:
    the last N messages of each partition.

    With --json, each message is one line of JSON with exactly the keys message_id,
    partition, offset, timestamp (ISO-8601 UTC), key, tag, properties, value and
    scheduled (for a message sent with a delay, the time it was due, and timestamp is
    when it was delivered; null otherwise). A value or key that is not valid UTF-8 is
    printed as base64 and the line gets the extra key "value_encoding": "base64" (or
    "key_encoding": "base64").

    Examples:

    ```
    headwater scan orders
    headwater scan orders --partitions 0,2 --from 100 --to 200
    headwater scan orders --from -15m --tag paid --tag refunded
    headwater scan orders --from 2026-11-21T10:00:00Z --to 2026-11-21T11:00:00Z --json
    headwater scan orders --from 00000001-00000002-0000000000000064 --limit 10
    headwater scan orders --from -5 --format '%p:%o %k %v\\n'
    headwater scan orders --raw | wc -l
    ```
    """
    fmt = output_template(as_json, template, raw)
    if fmt is not None:
        compile_template(fmt)  # a bad template is refused before anything is opened
    start = None if from_ is None else parse_from(from_, "--from")
    hw = open_client(ctx, read_only=True)
    parts = parse_partitions(partitions)
    bounds = _scan_bounds(hw, queue, parts, start, to)
    _require_enabled(hw, queue)
    with hw.scanner(queue, partitions=parts, tags=tags, **bounds) as scanner:
        _emit(scanner, as_json=as_json, limit=limit, template=fmt)


def get(
    ctx: typer.Context,
    message_id: Annotated[
        str,
        typer.Argument(
            metavar="MESSAGE_ID",
            help="A message id as printed by produce or scan.",
            show_default=False,
        ),
    ],
    as_json: JsonOpt = False,
) -> None:
    """Show one message by its id.

    A delayed id (as produce --delay or --at printed it) shows the message while it waits,
    with the time it is scheduled for, and the delivered message once it was delivered.

    Examples:

    ```
    headwater get 00000001-00000002-0000000000000064
    headwater get 00000001-00000002-0000000000000064 --json
    ```
    """
    rec = open_client(ctx, read_only=True).get(parse_message_id(message_id))
    if as_json:
        write_json_lines([rec])
    else:
        out_console().print(record_detail(rec))


def find(
    ctx: typer.Context,
    queue: QueueArg,
    key: Annotated[
        str,
        typer.Option(
            "--key",
            "-k",
            metavar="KEY",
            help="The key to look for.",
            show_default=False,
        ),
    ],
    from_: Annotated[
        str | None,
        typer.Option(
            "--from",
            metavar="TIME",
            help="Appended at or after this time: ISO-8601 (2026-11-21T10:00:00Z) or relative (-15m, -2h, -1d).",
            show_default=False,
        ),
    ] = None,
    to: Annotated[
        str | None,
        typer.Option(
            "--to",
            metavar="TIME",
            help="Appended before this time (exclusive); same forms as --from.",
            show_default=False,
        ),
    ] = None,
    limit: Annotated[
        int,
        typer.Option(
            "--limit",
            "-n",
            metavar="N",
            min=1,
            max=COUNT_MAX,
            help="Print at most N messages (the oldest first).",
        ),
    ] = 1000,
    as_json: JsonOpt = False,
) -> None:
    """Find the messages of a queue that have a key, oldest first, using the key index.

    Examples:

    ```
    headwater find orders --key order-17
    headwater find orders --key order-17 --from -1d --json
    ```
    """
    hw = open_client(ctx, read_only=True)
    start = None if from_ is None else parse_time(from_, "--from")
    end = None if to is None else parse_time(to, "--to")
    records = hw.find(queue, _arg_bytes(key), start_time=start, end_time=end, limit=limit)
    _emit(records, as_json=as_json, limit=limit)
