"""``headwater produce | scan | get | find``: writing and reading messages."""

from __future__ import annotations

import itertools
import os
import stat
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from headwater.cli.context import _state, err_console, on_ctrl_c, open_client, out_console, stdin_is_tty
from headwater.cli.delay import deliver_at_option
from headwater.cli.output import record_detail, records_table, write_json_lines
from headwater.cli.parse import (
    COUNT_MAX,
    parse_message_id,
    parse_pairs,
    parse_partitions,
    parse_position,
    parse_time,
)
from headwater.client import Client
from headwater.errors import HeadwaterError, InvalidArgumentError, QueueDisabledError, UsageError
from headwater.model.config import PARTITIONS_MAX
from headwater.model.message import Message, Record

__all__ = ["produce", "scan", "get", "find", "BATCH_SIZE_DEFAULT", "TABLE_ROWS_DEFAULT"]

BATCH_SIZE_DEFAULT = 500  # lines per send_batch: one record batch, one append, one fsync
BATCH_SIZE_MAX = 100_000
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


def _stdin_lines() -> Iterator[bytes]:
    """Lines of stdin as bytes, without their line ending (\\n or \\r\\n)."""
    for line in sys.stdin.buffer:
        if line.endswith(b"\n"):
            line = line[:-2] if line.endswith(b"\r\n") else line[:-1]
        yield line


def _progress(total_bytes: int | None) -> Progress:
    columns: list[Any] = [SpinnerColumn(), TextColumn("{task.fields[messages]:,} messages sent")]
    if total_bytes is not None:
        columns += [BarColumn(), TextColumn("{task.percentage:>3.0f}%")]
    columns.append(TimeElapsedColumn())
    # stdout stays a plain stream: ids must reach a pipe, not the progress console
    return Progress(*columns, console=err_console(), transient=True, redirect_stdout=False, redirect_stderr=False)


def _stdin_size() -> int | None:
    try:
        st = os.fstat(sys.stdin.fileno())
    except (AttributeError, OSError, ValueError):
        return None
    return st.st_size if stat.S_ISREG(st.st_mode) else None


def produce(
    ctx: typer.Context,
    queue: QueueArg,
    messages: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="[MESSAGE]...",
            help="Message bodies. When none are given, each line of stdin is one message.",
            show_default=False,
        ),
    ] = None,
    key: Annotated[
        str | None,
        typer.Option(
            "--key",
            "-k",
            metavar="KEY",
            help="Key of every message (messages with one key go to one partition).",
            show_default=False,
        ),
    ] = None,
    tag: Annotated[
        str | None,
        typer.Option(
            "--tag",
            "-t",
            metavar="TAG",
            help="Tag of every message (scan --tag filters on it).",
            show_default=False,
        ),
    ] = None,
    partition: Annotated[
        int | None,
        typer.Option(
            "--partition",
            "-p",
            min=0,
            max=PARTITIONS_MAX - 1,
            metavar="N",
            help="Send to this partition instead of letting the key or round robin choose.",
            show_default=False,
        ),
    ] = None,
    properties: Annotated[
        list[str] | None,
        typer.Option(
            "--property",
            "-P",
            metavar="KEY=VALUE",
            help="A property key=value of every message (repeatable).",
            show_default=False,
        ),
    ] = None,
    quiet: Annotated[
        bool,
        typer.Option(
            "--quiet",
            "-q",
            help="Print only a count of messages sent, not every id.",
        ),
    ] = False,
    batch_size: Annotated[
        int,
        typer.Option(
            "--batch-size",
            metavar="N",
            min=1,
            max=BATCH_SIZE_MAX,
            help="Stdin lines sent per batch.",
        ),
    ] = BATCH_SIZE_DEFAULT,
    delay: Annotated[
        str | None,
        typer.Option(
            "--delay",
            metavar="DURATION",
            help="Deliver the messages this much later (e.g. 90, 15m, 1h30m, 2d); they are "
            "kept by the broker until then and get delayed ids.",
            show_default=False,
        ),
    ] = None,
    at: Annotated[
        str | None,
        typer.Option(
            "--at",
            metavar="TIME",
            help="Deliver the messages at this time: ISO-8601 (no zone means UTC) or +DURATION.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Send messages to a queue and print their ids, one per line.

    Messages come from the arguments, or else from stdin, one per line (every line is a
    message, empty ones too; a trailing \\n or \\r\\n is removed). Lines are sent in batches,
    so piping a large file is fast. A progress bar is shown on a terminal.

    Examples:

    ```
    headwater produce orders 'order 17 paid' 'order 18 paid'
    headwater produce orders --key order-17 --tag paid --property source=web 'paid'
    seq 100000 | headwater produce orders --quiet
    headwater produce orders --partition 3 < messages.txt
    headwater produce reminders --delay 15m 'call the customer back'
    headwater produce reminders --at 2026-12-24T18:00:00Z 'ring the bell'
    ```
    """
    if not messages and _state(ctx).keep_open:
        raise UsageError("in the shell, give the messages as arguments: produce QUEUE 'message' ...")
    hw = open_client(ctx)
    _require_enabled(hw, queue)
    props = parse_pairs(properties or [], "--property") or None
    when = deliver_at_option(delay, at)
    key_b = None if key is None else _arg_bytes(key)
    plain = key_b is None and tag is None and props is None
    from_stdin = not messages
    if messages:
        chunks = _batched(iter([_arg_bytes(m) for m in messages]), batch_size)
    else:
        chunks = _batched(_stdin_lines(), batch_size)
        if stdin_is_tty():
            err_console().print("reading messages from stdin, one per line; end with Ctrl-D", style="dim")
    # a bar for piped input only: while someone types, a spinner would just get in the way
    show_progress = from_stdin and not stdin_is_tty() and err_console().is_terminal
    size = _stdin_size() if show_progress else None
    progress = _progress(size) if show_progress else None
    producer = hw.producer()
    total = 0
    partitions_used: set[int] = set()
    guard = _SendGuard()
    try:
        with progress or nullcontext(), guard.installed():
            task = progress.add_task("produce", total=size, messages=0) if progress else None
            for chunk in chunks:
                batch = chunk if plain else [Message(b, key_b, tag, props) for b in chunk]
                with guard.sending():  # sent, counted and printed, or not sent at all
                    try:
                        ids = producer.send_batch(queue, batch, partition=partition, **when)
                    except HeadwaterError as e:
                        if total:  # say what already went out, so a rerun does not send it twice
                            raise type(e)(f"{e} (the {total:,} message(s) before this batch were sent)") from e
                        raise
                    total += len(ids)
                    if quiet:
                        partitions_used.update(mid.partition for mid in ids)
                    else:
                        sys.stdout.write("".join(f"{mid}\n" for mid in ids))
                    if progress is not None and task is not None:
                        progress.update(task, advance=sum(len(b) + 1 for b in chunk), messages=total)
                guard.check()
    except KeyboardInterrupt:
        sys.stdout.flush()  # the ids of what was sent, every one of them
        err_console().print(
            f"sent {total:,} message(s) to queue {queue!r}; stopped by Ctrl-C, the rest of the input was not sent",
            style="dim",
        )
        raise typer.Exit(130) from None
    sys.stdout.flush()
    if quiet:
        where = ", ".join(str(p) for p in sorted(partitions_used)) or "-"
        out_console().print(f"sent {total:,} message(s) to queue {queue!r} (partitions {where})")


class _SendGuard:
    """Ctrl-C during ``produce``: while a batch is being sent, the interrupt waits until the
    broker has answered and the batch is counted and its ids printed (so every message is
    either acknowledged and reported, or not sent at all); while reading input, it stops at
    once. A second Ctrl-C during a send stops at once too. Either way the
    command says how many messages were sent."""

    def __init__(self) -> None:
        self._in_send = False
        self._deferred = False

    @contextmanager
    def installed(self) -> Iterator[None]:
        def handler(signum: int, frame: object) -> None:
            if self._in_send and not self._deferred:
                self._deferred = True
                return
            raise KeyboardInterrupt

        with on_ctrl_c(handler):
            yield

    @contextmanager
    def sending(self) -> Iterator[None]:
        self._in_send = True
        try:
            yield
        finally:
            self._in_send = False

    def check(self) -> None:
        """Raise the Ctrl-C that came during the send, now that it is counted."""
        if self._deferred:
            raise KeyboardInterrupt


def _batched(items: Iterator[bytes], size: int) -> Iterator[list[bytes]]:
    while chunk := list(itertools.islice(items, size)):
        yield chunk


def _emit(records: Iterable[Record], *, as_json: bool, limit: int | None) -> None:
    """Print records as JSON lines (streamed) or as one table (capped when no --limit)."""
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


FromOpt = Annotated[
    str | None,
    typer.Option(
        "--from",
        metavar="POSITION",
        show_default=False,
        help="Start here (inclusive): an offset (1200), a message id, an ISO-8601 time "
        "(2026-11-21T10:00:00Z, 2026-11-21), a time relative to now (-15m, -2h, -1d; "
        "units s m h d w) or now.",
    ),
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


def _scan_bounds(from_: str | None, to: str | None) -> dict[str, Any]:
    """Scanner keyword arguments for --from / --to, each an offset, a message id or a time."""
    bounds: dict[str, Any] = {}
    pinned: list[int] = []
    for text, what, pos_key, time_key in ((from_, "--from", "start", "start_time"), (to, "--to", "stop", "end_time")):
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
) -> None:
    """Read messages of a queue, partition by partition, each in offset order.

    --from and --to each take an offset (for every partition), a message id (which
    restricts the scan to that id's partition) or a time: ISO-8601 such as
    2026-11-21T10:00:00Z (no zone means UTC), or relative to now such as -15m, -2h, -1d.
    Times select by append time.

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
    ```
    """
    hw = open_client(ctx, read_only=True)
    bounds = _scan_bounds(from_, to)
    _require_enabled(hw, queue)
    with hw.scanner(queue, partitions=parse_partitions(partitions), tags=tags, **bounds) as scanner:
        _emit(scanner, as_json=as_json, limit=limit)


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
