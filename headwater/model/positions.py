"""Positions in a queue as people write them: ``earliest``, ``latest``, ``-N``, an offset, a
message id or a time (ISO-8601, relative to now, ``now``). One parser for every front end,
so that the same text means the same place to ``headwater group reset --to`` (the CLI) and
to ``POST /v1/groups/{g}/reset`` (the HTTP API): headwater/cli/parse.py and
headwater/http/admin.py both use it.

Every parser raises :class:`~headwater.errors.InvalidArgumentError` with a message that names
what was given (``what``) and shows the accepted forms. The clock is passed in where "now"
matters, so tests can pin it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any

from headwater.errors import InvalidArgumentError
from headwater.model.message import MessageId, datetime_ms

__all__ = [
    "From",
    "parse_from",
    "parse_time",
    "parse_offset",
    "is_digits",
    "FROM_FORMS",
    "TIME_FORMS",
    "OFFSET_MAX",
    "TIME_MS_MIN",
    "TIME_MS_MAX",
    "UNIT_S",
    "ID_LIKE_RE",
]

# Bounds, so that a value too large for the wire (int64) is refused here, with its range.
OFFSET_MAX = 2**63 - 1  # offsets are int64 on the wire and on disk
TIME_MS_MIN = datetime_ms(datetime(1, 1, 1, tzinfo=UTC))  # the range ISO-8601 can say
TIME_MS_MAX = datetime_ms(datetime(9999, 12, 31, 23, 59, 59, 999000, tzinfo=UTC))

UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_RELATIVE_RE = re.compile(r"^-(\d+(?:\.\d+)?)([smhdw])\Z")
ID_LIKE_RE = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{8}-[0-9a-fA-F]{16}\Z")
_ASCII_INT_RE = re.compile(r"[0-9]+")  # str.isdigit() also takes '²' and '٣', which int() refuses

TIME_FORMS = (
    "an ISO-8601 time (e.g. 2026-11-21T10:00:00Z or 2026-11-21), a time relative to now "
    "(e.g. -15m, -2h, -1d; units s, m, h, d, w) or 'now'"
)


def is_digits(text: str) -> bool:
    """ASCII digits alone (``str.isdigit`` also takes '²', which ``int`` refuses)."""
    return _ASCII_INT_RE.fullmatch(text) is not None


def parse_offset(text: str, what: str) -> int:
    """Digits as an offset, at most :data:`OFFSET_MAX`; InvalidArgumentError naming ``what``."""
    n = int(text)
    if n > OFFSET_MAX:
        raise InvalidArgumentError(f"{what}: offset {text} is out of range; offsets go from 0 to {OFFSET_MAX:,}")
    return n


def _ms_up(seconds: float) -> int:
    """Epoch seconds as milliseconds, a fraction of one (to the µs) rounded up."""
    return -(-round(seconds * 1_000_000) // 1000)


def parse_time(
    text: str, what: str, *, clock: Callable[[], float] = time.time, forms: str = TIME_FORMS, noun: str = "a time"
) -> int:
    """A point in time as epoch milliseconds.

    Accepts ISO-8601 (``2026-11-21T10:00:00Z``, ``2026-11-21T11:00:00+01:00``, a date alone
    for midnight; no zone means UTC), relative to now (``-15m``, ``-2h``, ``-1d``) or
    ``now``. A fraction of a millisecond rounds up, as append times are whole milliseconds:
    ``--to now`` takes everything appended before it. ``noun`` and ``forms``: what the error
    says the text is not, and lists as accepted (an option that takes more than times passes
    its own). A time outside the years 1-9999 is refused.

    >>> parse_time("2026-11-21T10:00:00Z", "--from")
    1795255200000
    >>> parse_time("2026-11-21T10:00:00.000001Z", "--to")
    1795255200001
    >>> parse_time("-1h", "--from", clock=lambda: 7200.0)
    3600000
    >>> parse_time("now", "--to", clock=lambda: 7200.0004)
    7200001
    """
    s = text.strip()
    if s == "now":
        return _ms_up(clock())
    m = _RELATIVE_RE.match(s)
    if m:
        seconds = clock() - float(m[1]) * UNIT_S[m[2]]
        if not TIME_MS_MIN / 1000 <= seconds <= TIME_MS_MAX / 1000:  # also inf, from 1e400 digits
            raise InvalidArgumentError(
                f"{what}: {text!r} is out of range; a time goes back at most to the year 1 (0001-01-01T00:00:00Z)"
            )
        return _ms_up(seconds)
    try:
        if len(s) == 10:  # a date alone: midnight UTC
            d = date.fromisoformat(s)
            dt = datetime(d.year, d.month, d.day, tzinfo=UTC)
        else:
            dt = datetime.fromisoformat(s)
    except ValueError:
        raise InvalidArgumentError(f"{what}: {text!r} is not {noun}; use {forms}") from None
    try:
        ms = datetime_ms(dt)
    except OverflowError:  # 0001-01-01 in a zone east of UTC is before the year 1
        ms = TIME_MS_MIN - 1
    if not TIME_MS_MIN <= ms <= TIME_MS_MAX:
        raise InvalidArgumentError(f"{what}: {text!r} is out of range; use a time from the year 1 to 9999")
    return ms


FROM_FORMS = (
    "'earliest', 'latest', -N (the last N messages of each partition, e.g. -10), an offset "
    f"(e.g. 1200), a message id (e.g. 00000001-00000002-0000000000000064) or {TIME_FORMS}"
)
_LAST_N_RE = re.compile(r"^-([0-9]+)\Z")


@dataclass(frozen=True)
class From:
    """Where ``scan --from`` and ``consume --from`` start, as the user wrote it: exactly one
    field is set. ``edge`` is ``"earliest"`` or ``"latest"``; ``last_n`` the last N messages
    of each partition (kcat's ``-o -N``)."""

    edge: str | None = None
    last_n: int | None = None
    offset: int | None = None
    message_id: MessageId | None = None
    time_ms: int | None = None

    def offsets(self, partitions: Iterable[Any]) -> dict[int, int] | None:
        """The start offset of each partition (``PartitionInfo``-like: ``partition``,
        ``start_offset``, ``end_offset``) for an edge, ``-N`` or an offset; None for a time
        or a message id, which the reader resolves itself. An offset below what a partition
        keeps starts at its first kept message; one past its end, at its end."""
        out: dict[int, int] = {}
        for p in partitions:
            if self.edge == "earliest":
                out[p.partition] = p.start_offset
            elif self.edge == "latest":
                out[p.partition] = p.end_offset
            elif self.last_n is not None:
                out[p.partition] = max(p.start_offset, p.end_offset - self.last_n)
            elif self.offset is not None:
                out[p.partition] = min(max(p.start_offset, self.offset), p.end_offset)
            else:
                return None
        return out


def parse_from(text: str, what: str = "--from", *, clock: Callable[[], float] = time.time) -> From:
    """The one parser of ``--from`` for ``scan`` and ``consume``: ``earliest``, ``latest``,
    ``-N``, an offset, a message id or a time (see :data:`FROM_FORMS`).

    ``-N`` (digits alone) is the last N messages of each partition; a relative time always
    has a unit (``-15m``), so the two never meet.

    >>> parse_from("-10"), parse_from("LATEST").edge, parse_from("42").offset
    (From(edge=None, last_n=10, offset=None, message_id=None, time_ms=None), 'latest', 42)
    >>> parse_from("-1h", clock=lambda: 7200.0).time_ms
    3600000
    """
    s = text.strip()
    if s.lower() in ("earliest", "latest"):
        return From(edge=s.lower())
    m = _LAST_N_RE.match(s)
    if m:
        n = int(m[1])
        if not 0 < n <= OFFSET_MAX:
            raise InvalidArgumentError(
                f"{what}: {text!r} asks for the last {m[1]} messages; use -N with N from 1 to {OFFSET_MAX:,}, e.g. -10"
            )
        return From(last_n=n)
    if is_digits(s):
        return From(offset=parse_offset(s, what))
    if ID_LIKE_RE.match(s):
        return From(message_id=MessageId.parse(s))
    return From(time_ms=parse_time(s, what, clock=clock, forms=FROM_FORMS, noun="a position"))
