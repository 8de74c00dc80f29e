"""Turning command-line text into API values: positions, times, durations, lists.

Every parser here raises :class:`~headwater.errors.InvalidArgumentError` with a message
that shows the accepted forms, so a mistyped value reads like any other Headwater error
(``error: ...``, exit code 1) instead of a traceback. The clock is passed in where "now"
matters, so tests can pin it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import date, datetime, timezone

from headwater.errors import InvalidArgumentError, InvalidMessageIdError
from headwater.model.message import MessageId, datetime_ms

__all__ = [
    "Position",
    "parse_position",
    "parse_message_id",
    "parse_time",
    "parse_ttl",
    "parse_partitions",
    "parse_pairs",
    "POSITION_FORMS",
]

_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_RELATIVE_RE = re.compile(r"^-(\d+(?:\.\d+)?)([smhdw])$")
_DURATION_RE = re.compile(r"^(\d+)([smhdw]?)$")
_ID_LIKE_RE = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{8}-[0-9a-fA-F]{16}$")

POSITION_FORMS = (
    "an offset (e.g. 1200), a message id (e.g. 00000001-00000000-00000000000004b0), "
    "an ISO-8601 time (e.g. 2026-11-21T10:00:00Z or 2026-11-21), a time relative to now "
    "(e.g. -15m, -2h, -1d; units s, m, h, d, w) or 'now'"
)


@dataclass(frozen=True)
class Position:
    """One end of a range as the user wrote it: exactly one field is set."""

    offset: int | None = None
    message_id: MessageId | None = None
    time_ms: int | None = None


def _ms_up(seconds: float) -> int:
    """Epoch seconds as milliseconds, a fraction of one (to the µs) rounded up."""
    return -(-round(seconds * 1_000_000) // 1000)


def parse_time(text: str, what: str, *, clock: Callable[[], float] = time.time) -> int:
    """A point in time as epoch milliseconds.

    Accepts ISO-8601 (``2026-11-21T10:00:00Z``, ``2026-11-21T11:00:00+01:00``, a date alone
    for midnight; no zone means UTC), relative to now (``-15m``, ``-2h``, ``-1d``) or
    ``now``. A fraction of a millisecond rounds up, as append times are whole milliseconds:
    ``--to now`` takes everything appended before it.

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
        return _ms_up(clock() - float(m[1]) * _UNIT_S[m[2]])
    try:
        if len(s) == 10:  # a date alone: midnight UTC
            d = date.fromisoformat(s)
            dt = datetime(d.year, d.month, d.day, tzinfo=timezone.utc)
        else:
            dt = datetime.fromisoformat(s)
    except ValueError:
        raise InvalidArgumentError(
            f"{what}: {text!r} is not a time; use an ISO-8601 time (e.g. 2026-11-21T10:00:00Z "
            f"or 2026-11-21), a time relative to now (e.g. -15m, -2h, -1d) or 'now'"
        ) from None
    return datetime_ms(dt)


def parse_position(text: str, what: str, *, clock: Callable[[], float] = time.time) -> Position:
    """An offset, a message id or a time, told apart by their shape.

    >>> parse_position("42", "--from")
    Position(offset=42, message_id=None, time_ms=None)
    >>> parse_position("00000001-00000002-0000000000000003", "--from").message_id
    MessageId(queue_id=1, partition=2, offset=3)
    """
    s = text.strip()
    if s.isdigit():
        return Position(offset=int(s))
    if _ID_LIKE_RE.match(s):
        return Position(message_id=MessageId.parse(s))
    try:
        return Position(time_ms=parse_time(s, what, clock=clock))
    except InvalidArgumentError:
        raise InvalidArgumentError(f"{what}: {text!r} is not a position; use {POSITION_FORMS}") from None


def parse_message_id(text: str) -> MessageId:
    """A message id, with a hint at where ids come from when it does not parse."""
    try:
        return MessageId.parse(text)
    except InvalidMessageIdError as e:
        raise InvalidMessageIdError(
            f"{e}; ids are printed by 'headwater produce' and by 'headwater scan'"
        ) from None


def parse_ttl(text: str) -> int | None:
    """Seconds to keep messages; ``None`` keeps them forever.

    ``0`` and ``forever`` mean forever; a bare number is seconds; a suffix s, m, h, d or w
    picks another unit.

    >>> parse_ttl("3600"), parse_ttl("7d"), parse_ttl("forever")
    (3600, 604800, None)
    """
    s = text.strip().lower()
    if s in ("0", "forever", "none", "infinite"):
        return None
    m = _DURATION_RE.match(s)
    if not m:
        raise InvalidArgumentError(
            f"--ttl: {text!r} is not a duration; use seconds (e.g. 3600), a number with a unit "
            f"(e.g. 30m, 12h, 7d, 2w), or 0 / forever to keep messages forever"
        )
    return int(m[1]) * _UNIT_S[m[2] or "s"]


def parse_partitions(text: str | None) -> list[int] | None:
    """A partition list such as ``0,2,5`` or ``0-3,8`` (ranges inclusive); ``None`` means all.

    >>> parse_partitions("0,2,5"), parse_partitions("0-3,8")
    ([0, 2, 5], [0, 1, 2, 3, 8])
    """
    if text is None:
        return None
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        lo, dash, hi = part.partition("-")
        if lo.isdigit() and (not dash or hi.isdigit()):
            first, last = int(lo), int(hi) if dash else int(lo)
            if first <= last:
                out.extend(range(first, last + 1))
                continue
        raise InvalidArgumentError(
            f"--partitions: {text!r} is not a partition list; use numbers and ranges separated "
            f"by commas, e.g. 0,2,5 or 0-3,8"
        )
    return sorted(set(out))


def parse_pairs(items: Iterable[str], option: str) -> dict[str, str]:
    """``key=value`` items (repeatable options) as a dict; the value may contain ``=``.

    >>> parse_pairs(["source=web", "expr=a=b"], "--property")
    {'source': 'web', 'expr': 'a=b'}
    """
    out: dict[str, str] = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise InvalidArgumentError(f"{option}: {item!r} is not key=value, e.g. {option} source=web")
        out[key] = value
    return out
