"""``headwater consume``: follow a queue, printing messages as they arrive.

Unlike ``scan``, which reads a fixed range and stops, ``consume`` long-polls for new
messages until Ctrl-C, ``--limit`` or ``--timeout`` (``--timeout 0``: what is there when
it starts, then stop). With ``--group`` it is a member of that consumer group, as
kafka-console-consumer is with ``--group``: the broker divides the queue's partitions among
the group's running members (two ``consume --group G`` print each message once between
them), heartbeats keep it a member, and it commits its position after every printed batch
and when it stops, so the next run of the same group goes on from there. While it runs,
the group has a live member, so ``group reset`` refuses to move the group under it.

Stopping is careful about what was printed: Ctrl-C only sets a flag, the batch in hand is
printed whole and committed, and then the command ends. (A second Ctrl-C stops at once;
repeats of the first within a second, as ``timeout -s INT`` sends them, are the first.)
``--limit`` never polls more messages than it may still print (the consumer keeps the
rest of what it fetched for a later poll), so the committed position is right after the
last printed message, never past it.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Annotated, Any

import typer
from rich.table import Table

from headwater.cli.context import err_console, on_ctrl_c, open_client, out_console
from headwater.cli.output import records_table, write_json_lines
from headwater.cli.parse import COUNT_MAX, From, Seconds, parse_from, parse_partitions
from headwater.cli.records import FormatOpt, RawOpt, output_template
from headwater.cli.template import compile_template
from headwater.client import Client, Consumer
from headwater.client.sync.group_consumer import GroupConsumer
from headwater.errors import GroupError, GroupNotEmptyError, QueueDisabledError, UsageError
from headwater.model.config import QueueInfo
from headwater.model.message import Record

__all__ = ["consume", "POLL_MESSAGES_MAX", "POLL_WAIT_MS"]

POLL_MESSAGES_MAX = 500  # messages per poll, and so per printed batch and per commit
POLL_WAIT_MS = 1000  # longest wait of one poll: also how soon Ctrl-C and --timeout are noticed
DRAIN_POLL_MS = 100  # longest wait of one poll under --timeout 0, which waits for nothing new

JSON_HELP = (
    "Print JSON lines instead of table rows, one object per message, with the same keys as 'headwater scan --json'."
)


class _Stop:
    """Set by the first Ctrl-C; the consume loop checks it between polls."""

    def __init__(self) -> None:
        self.requested = False


@contextmanager
def _ctrl_c_stops(stop: _Stop) -> Iterator[None]:
    """Turn the first SIGINT into a stop request; a second one interrupts as usual."""

    def handler(signum: int, frame: Any) -> None:
        if stop.requested:
            raise KeyboardInterrupt
        stop.requested = True

    with on_ctrl_c(handler):
        yield


class _Rows:
    """Table rows printed batch after batch, lined up as one table as far as possible.

    Each batch is a :func:`records_table` (the rows of ``scan``); the header is printed
    with the first batch and again whenever the columns change (say, the first tagged
    message arrives). Columns whose width varies keep the widest width seen so far.
    """

    def __init__(self) -> None:
        self._columns: tuple[str, ...] | None = None
        self._widths: dict[str, int] = {}

    def print(self, records: list[Record]) -> None:
        console = out_console()
        table: Table = records_table(records, console.width)
        columns = tuple(str(c.header) for c in table.columns)
        table.show_header = columns != self._columns
        self._columns = columns
        for col in table.columns[:-1]:  # the value, last, may take whatever is left
            name = str(col.header)
            cells = [len(str(c)) for c in col.cells]
            width = max([len(name), self._widths.get(name, 0), *cells])
            self._widths[name] = col.min_width = min(width, 60)
        console.print(table)


#: How a batch is printed: table rows, a --format template's renderer, or None for JSON lines.
Printer = _Rows | Callable[[Record], bytes] | None


def consume(
    ctx: typer.Context,
    queue: Annotated[str, typer.Argument(metavar="QUEUE", help="Queue name.", show_default=False)],
    group: Annotated[
        str | None,
        typer.Option(
            "--group",
            "-g",
            metavar="NAME",
            help="Join this consumer group: share the queue's partitions with its other running members, "
            "start where it last committed, and commit after every printed batch.",
            show_default=False,
        ),
    ] = None,
    from_: Annotated[
        str,
        typer.Option(
            "--from",
            metavar="POSITION",
            help="earliest or latest: where to start a partition the group has not committed "
            "(without --group: every partition). -N (the last N messages of each partition), "
            "an offset (of every partition), a message id (its partition only; not with "
            "--group) or a time (ISO-8601 such as 2026-11-21T10:00:00Z, or -15m, -2h, -1d, "
            "now: the first message appended then): the same forms as 'scan --from'; with "
            "--group, the group's offsets are moved there first, as 'group reset' does "
            "(refused while the group has other members).",
        ),
    ] = "latest",
    partitions: Annotated[
        str | None,
        typer.Option(
            "--partitions",
            metavar="LIST",
            help="Partitions to follow, e.g. 0,2,5 or 0-3 (default: all). Not with --group, whose "
            "partitions the broker assigns.",
            show_default=False,
        ),
    ] = None,
    tags: Annotated[
        list[str] | None,
        typer.Option(
            "--tag",
            "-t",
            metavar="TAG",
            help="Only messages with this tag (repeatable: any of them), filtered on the broker. "
            "The others are passed over, and the position a group commits moves past them.",
            show_default=False,
        ),
    ] = None,
    limit: Annotated[
        int | None,
        typer.Option(
            "--limit",
            "-n",
            metavar="N",
            min=1,
            max=COUNT_MAX,
            help="Stop after printing N messages.",
            show_default=False,
        ),
    ] = None,
    timeout: Annotated[
        float | None,
        typer.Option(
            "--timeout",
            metavar="SECONDS",
            parser=Seconds(),
            help="Stop when no message was printed for this long; 0: print what is there now, "
            "without waiting for more, and stop. Default: follow until Ctrl-C.",
            show_default=False,
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
    template: FormatOpt = None,
    raw: RawOpt = False,
) -> None:
    """Follow a queue: print messages as they arrive, until Ctrl-C, --limit or --timeout.

    Rows look like those of 'headwater scan'; --json prints the same JSON lines as
    'scan --json'. With --group it joins the group: the partitions are divided among the
    group's running members, and each starts where the group last committed; a partition it
    has not committed (every partition, without --group) starts at --from: latest unless
    said otherwise, so only what arrives from now on is shown. --timeout 0 prints what is
    there now and stops without waiting for more.

    Examples:

    ```
    headwater consume orders
    headwater consume orders --from earliest --limit 10
    headwater consume orders --group billing --from earliest --json
    headwater consume orders --from -15m --tag paid --timeout 5
    headwater consume orders --group billing --from earliest --timeout 0
    headwater consume orders --from -10 --timeout 0 --format '%k %v\\n'
    ```
    """
    fmt = output_template(as_json, template, raw)
    render = None if fmt is None else compile_template(fmt)
    where = parse_from(from_, "--from")
    reset = where.edge or "latest"
    start_ms = where.time_ms
    parts = parse_partitions(partitions)
    if group is not None and parts is not None:
        raise UsageError(
            "--partitions and --group do not go together: the members of a group share the queue's "
            "partitions as the broker assigns them (run several 'consume --group' to divide them); "
            "leave out --group to read chosen partitions"
        )
    if where.message_id is not None:
        if group is not None:
            raise UsageError(
                "--from MESSAGE_ID and --group do not go together: an id names one partition, and a "
                "group's members share them all; use an offset, -N or a time to move the group"
            )
        if parts is not None and parts != [where.message_id.partition]:
            raise UsageError(
                f"--from names a message of partition {where.message_id.partition}, and --partitions "
                f"others; leave out --partitions (the id picks its own)"
            )
        parts = [where.message_id.partition]
    hw = open_client(ctx)
    info = hw.admin.describe_queue(queue)
    if not info.enabled:  # fail now, not at the first poll
        raise QueueDisabledError(f"queue {queue!r} is disabled; enable it to read or write")
    seeks = _start_offsets(info, where, parts)
    if group is not None and start_ms is not None:
        _move_group_to(hw, group, info, _time_offsets(hw, info, start_ms))
    elif group is not None and seeks is not None:
        _move_group_to(hw, group, info, seeks)
    if group is None:
        consumer: Consumer = hw.consumer(auto_offset_reset=reset, tags=tags or None)
    else:  # a member: the partitions are shared with the group's other members, and heartbeated
        consumer = hw.consumer(group=group, subscribe=queue, auto_offset_reset=reset, tags=tags or None)
    stop = _Stop()
    done = False
    try:
        if group is None:
            consumer.assign(queue, partitions=parts)
            if start_ms is not None:
                consumer.seek_to_time(queue, start_ms, partitions=parts)
            for partition, offset in (seeks or {}).items():
                consumer.seek(queue, partition, offset)
        if err_console().is_terminal:
            err_console().print(f"following {queue!r}; Ctrl-C to stop", style="dim")
        rows: Printer = render if render is not None else None if as_json else _Rows()
        with _ctrl_c_stops(stop):
            if timeout == 0:
                ends = {
                    (queue, p.partition): p.end_offset for p in info.partitions if parts is None or p.partition in parts
                }
                printed = _drain(consumer, stop, rows=rows, limit=limit, ends=ends)
            else:
                printed = _follow(consumer, stop, rows=rows, limit=limit, idle_s_max=timeout)
        if group is not None:
            # also when nothing was printed: a new group then starts here next time, not at
            # whatever is latest by then
            _commit(consumer)
        done = True
    finally:
        if isinstance(consumer, GroupConsumer):
            consumer.close(commit=done)  # leaves the group; a second Ctrl-C commits nothing more
        else:
            consumer.close()
    if err_console().is_terminal or stop.requested:
        err_console().print(f"consumed {printed:,} message(s)", style="dim")


def _start_offsets(info: QueueInfo, where: From, parts: list[int] | None) -> dict[int, int] | None:
    """Where ``--from`` -N, an offset or a message id starts each partition read; None when
    the consumer's reset (earliest, latest) or a time decides."""
    if where.edge is not None:
        return None
    if where.message_id is not None:
        return {where.message_id.partition: where.message_id.offset}
    chosen = [p for p in info.partitions if parts is None or p.partition in parts]
    info.require_online([p.partition for p in chosen], "start reading with --from")
    return where.offsets(chosen)


def _time_offsets(hw: Client, info: QueueInfo, start_ms: int) -> dict[int, int]:
    return {p.partition: hw.offset_for_time(info.name, p.partition, start_ms) for p in info.partitions}


def _move_group_to(hw: Client, group: str, info: QueueInfo, offsets: dict[int, int]) -> None:
    """``--group G --from POSITION`` (not earliest or latest): commit G's offsets there
    before joining, as ``group reset`` does, and refused in the same way while G has live
    members (moving their partitions under them would make them lose or repeat messages)."""
    try:
        hw.service.commit_offsets(group, info.name, offsets)
    except GroupNotEmptyError as e:
        raise GroupNotEmptyError(
            f"{e}; --from POSITION moves the group's committed offsets, which is refused while it has "
            f"members: leave out --from to join them, or stop them first "
            f"(see them with 'headwater group describe {group}')"
        ) from None


def _commit(consumer: Consumer) -> None:
    """Commit what was printed; a member the group dropped meanwhile (it missed heartbeats,
    the broker restarted) cannot, and what it printed since its last commit will be read
    again by the group: say so and go on, as the group consumer itself rejoins."""
    try:
        consumer.commit()
    except GroupError as e:
        err_console().print(f"warning: not committed: {e}", style="yellow")


def _follow(consumer: Consumer, stop: _Stop, *, rows: Printer, limit: int | None, idle_s_max: float | None) -> int:
    """Poll and print until stopped, ``limit`` printed or ``idle_s_max`` without a message;
    commit after every printed batch when the consumer has a group. Returns how many were
    printed."""
    printed = 0
    idle_since = time.monotonic()
    while not stop.requested and (limit is None or printed < limit):
        wait_ms = POLL_WAIT_MS
        if idle_s_max is not None:
            left_s = idle_s_max - (time.monotonic() - idle_since)
            if left_s <= 0:
                break
            wait_ms = max(1, min(wait_ms, int(left_s * 1000)))
        batch = consumer.poll(max_messages=_want(limit, printed), timeout_ms=wait_ms)
        if not batch:
            continue
        printed += _print(consumer, batch, rows)
        idle_since = time.monotonic()
    return printed


def _drain(
    consumer: Consumer, stop: _Stop, *, rows: Printer, limit: int | None, ends: dict[tuple[str, int], int]
) -> int:
    """``--timeout 0``: print what the partitions held when the command started (``ends``),
    without waiting for anything newer. Polls once even when there is nothing, and then
    while some partition is behind its end; such a poll waits at most ``DRAIN_POLL_MS`` (the
    broker answers at once: the messages are there). Passing over messages (--tag) moves the
    positions without printing anything; ``POLL_WAIT_MS`` without any progress ends it too."""
    printed = 0
    progress_at = time.monotonic()
    while not stop.requested and (limit is None or printed < limit):
        before = {tp: consumer.position(*tp) for tp in _held(consumer, ends)}
        behind = any(pos < ends[tp] for tp, pos in before.items())
        batch = consumer.poll(max_messages=_want(limit, printed), timeout_ms=DRAIN_POLL_MS if behind else 0)
        if batch:
            printed += _print(consumer, batch, rows)
        held = _held(consumer, ends)
        if all(consumer.position(*tp) >= ends[tp] for tp in held):
            break
        if batch or any(consumer.position(*tp) != pos for tp, pos in before.items() if tp in held):
            progress_at = time.monotonic()
        elif time.monotonic() - progress_at >= POLL_WAIT_MS / 1000:
            break  # a partition that stays behind (a broker that does not answer in time)
    return printed


def _held(consumer: Consumer, ends: dict[tuple[str, int], int]) -> list[tuple[str, int]]:
    """The partitions of ``ends`` the consumer reads now (a group member's change as the
    group rebalances)."""
    return [tp for tp in consumer.assignment() if tp in ends]


def _want(limit: int | None, printed: int) -> int:
    return POLL_MESSAGES_MAX if limit is None else min(POLL_MESSAGES_MAX, limit - printed)


def _print(consumer: Consumer, batch: list[Record], rows: Printer) -> int:
    """Print one polled batch, then commit it when the consumer has a group."""
    if rows is None:
        write_json_lines(batch)
    elif not isinstance(rows, _Rows):  # a --format template
        sys.stdout.buffer.write(b"".join(rows(r) for r in batch))
        sys.stdout.buffer.flush()
    else:
        rows.print(batch)
        sys.stdout.flush()
    if consumer.group is not None:
        _commit(consumer)
    return len(batch)
