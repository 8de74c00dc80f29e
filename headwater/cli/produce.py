"""``headwater produce``: writing messages, from arguments, a file or stdin.

The input is cut into messages as :mod:`headwater.cli.produce_input` describes: lines by
default, any delimiter (``--delimiter``), or a whole file as one message (``--file``); with
``--key-separator`` each message is ``KEY<sep>VALUE``.
"""

from __future__ import annotations

import itertools
import os
import stat
import sys
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Annotated, Any, BinaryIO

import typer
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from headwater.cli.context import _state, err_console, on_ctrl_c, open_client, out_console, stdin_is_tty
from headwater.cli.delay import deliver_at_option
from headwater.cli.output import print_json
from headwater.cli.parse import parse_pairs
from headwater.cli.produce_input import parse_delimiter, read_whole, split_keys, split_stream
from headwater.cli.records import QueueArg, _arg_bytes, _require_enabled
from headwater.errors import HeadwaterError, UsageError
from headwater.model.config import PARTITIONS_MAX
from headwater.model.message import Message

__all__ = ["produce", "BATCH_SIZE_DEFAULT"]

BATCH_SIZE_DEFAULT = 500  # lines per send_batch: one record batch, one append, one fsync
BATCH_SIZE_MAX = 100_000


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
            help="Message bodies. When none are given, each line of stdin is one message (or see --file, --delimiter).",
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
    file: Annotated[
        str | None,
        typer.Option(
            "--file",
            "-F",
            metavar="PATH",
            help="Read this file (- for stdin) instead of stdin; all of it is ONE message, "
            "bytes as they are, unless --delimiter cuts it.",
            show_default=False,
        ),
    ] = None,
    delimiter: Annotated[
        str | None,
        typer.Option(
            "--delimiter",
            "-D",
            metavar="DELIM",
            help="Cut the input into messages at DELIM instead of at line ends (kcat -D); "
            "binary-safe, escapes \\n \\t \\r \\0 \\\\ \\xHH, e.g. -D '\\0' for "
            "find -print0 output. Default: lines (\\n, a \\r before it dropped).",
            show_default=False,
        ),
    ] = None,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help='Print one JSON line per message sent, {"message_id", "partition", "offset"}; with '
            '--quiet, one object {"queue", "sent", "partitions"}.',
        ),
    ] = False,
    key_separator: Annotated[
        str | None,
        typer.Option(
            "--key-separator",
            "-K",
            metavar="SEP",
            help="Each message is KEY<SEP>VALUE: cut at the first SEP (kcat -K; escapes as "
            "--delimiter); one without SEP is sent without a key.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Send messages to a queue and print their ids, one per line.

    Messages come from the arguments, or else from stdin, one per line (every line is a
    message, empty ones too; a trailing \\n or \\r\\n is removed). Lines are sent in batches,
    so piping a large file is fast. A progress bar is shown on a terminal.

    --file sends a whole file (or stdin, with -) as one message, bytes as they are;
    --delimiter cuts the input at another delimiter (binary-safe); --key-separator takes a
    key from each message.

    Examples:

    ```
    headwater produce orders 'order 17 paid' 'order 18 paid'
    headwater produce orders --key order-17 --tag paid --property source=web 'paid'
    seq 100000 | headwater produce orders --quiet
    headwater produce orders --partition 3 < messages.txt
    headwater produce reminders --delay 15m 'call the customer back'
    headwater produce reminders --at 2026-12-24T18:00:00Z 'ring the bell'
    headwater produce images --key cat.png --file cat.png
    find . -name '*.log' -print0 | headwater produce paths --delimiter '\\0'
    printf 'order-17:paid\\norder-18:refunded\\n' | headwater produce orders --key-separator :
    ```
    """
    from_stdin = not messages and file in (None, "-")
    if from_stdin and _state(ctx).keep_open:
        raise UsageError("in the shell, give the messages as arguments (or --file PATH): produce QUEUE 'message' ...")
    if messages and file is not None:
        raise UsageError("--file and MESSAGE arguments do not go together: the messages come from one of them")
    if key is not None and key_separator is not None:
        raise UsageError(
            "--key and --key-separator do not go together: the key is either fixed or read from each message"
        )
    delim = None if delimiter is None else parse_delimiter(delimiter, "--delimiter")
    key_sep = None if key_separator is None else parse_delimiter(key_separator, "--key-separator")
    props = parse_pairs(properties or [], "--property") or None
    when = deliver_at_option(delay, at)
    hw = open_client(ctx)
    _require_enabled(hw, queue)
    key_b = None if key is None else _arg_bytes(key)
    with _input(file) as stream:
        pieces = _pieces([_arg_bytes(m) for m in messages or []], stream, file=file, delimiter=delim)
        if from_stdin and stdin_is_tty():
            how = "one per line" if delim is None and file is None else "as --file/--delimiter say"
            err_console().print(f"reading messages from stdin, {how}; end with Ctrl-D", style="dim")
        _send(
            hw,
            queue,
            _messages(pieces, key_b, tag, props, key_sep),
            batch_size=batch_size,
            partition=partition,
            when=when,
            quiet=quiet,
            progress_input=from_stdin,
            as_json=as_json,
        )


@contextmanager
def _input(file: str | None) -> Iterator[BinaryIO]:
    """The input stream: the file, or stdin (``-`` or no --file)."""
    if file is None or file == "-":
        yield sys.stdin.buffer
        return
    with open(file, "rb") as f:  # an OSError names the file: 'error: No such file or directory: x'
        yield f


def _pieces(args: list[bytes], stream: BinaryIO, *, file: str | None, delimiter: bytes | None) -> Iterator[bytes]:
    if args:
        return iter(args)
    if delimiter is not None:
        return split_stream(stream, delimiter)
    if file is not None:
        return iter([read_whole(stream, "--file")])
    return split_stream(stream, b"\n", crlf=True)


def _messages(
    pieces: Iterator[bytes], key: bytes | None, tag: str | None, props: dict[str, str] | None, key_sep: bytes | None
) -> Iterator[bytes | Message]:
    """The bodies as they are when nothing is added to them (the producer's fast path), else
    Messages with their key, tag and properties."""
    if key_sep is not None:
        return (Message(value, k, tag, props) for k, value in split_keys(pieces, key_sep))
    if key is None and tag is None and props is None:
        return pieces
    return (Message(b, key, tag, props) for b in pieces)


def _size(item: bytes | Message) -> int:
    return len(item) if isinstance(item, bytes) else len(item.body) + len(item.key or b"")


def _send(
    hw: Any,
    queue: str,
    items: Iterator[bytes | Message],
    *,
    batch_size: int,
    partition: int | None,
    when: dict[str, Any],
    quiet: bool,
    progress_input: bool,
    as_json: bool = False,
) -> None:
    """Send in batches, printing each id (or, ``quiet``, a count at the end)."""
    chunks = _batched(items, batch_size)
    from_stdin = progress_input
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
                batch = chunk
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
                    elif as_json:  # the sent shape: one object a message
                        sys.stdout.write(
                            "".join(
                                f'{{"message_id": "{mid}", "partition": {mid.partition}, "offset": {mid.offset}}}\n'
                                for mid in ids
                            )
                        )
                    else:
                        sys.stdout.write("".join(f"{mid}\n" for mid in ids))
                    if progress is not None and task is not None:
                        progress.update(task, advance=sum(_size(b) + 1 for b in chunk), messages=total)
                guard.check()
    except KeyboardInterrupt:
        sys.stdout.flush()  # the ids of what was sent, every one of them
        err_console().print(
            f"sent {total:,} message(s) to queue {queue!r}; stopped by Ctrl-C, the rest of the input was not sent",
            style="dim",
        )
        raise typer.Exit(130) from None
    sys.stdout.flush()
    if quiet and as_json:  # the count shape
        print_json({"queue": queue, "sent": total, "partitions": sorted(partitions_used)})
    elif quiet:
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


def _batched(items: Iterator[Any], size: int) -> Iterator[list[Any]]:
    while chunk := list(itertools.islice(items, size)):
        yield chunk
