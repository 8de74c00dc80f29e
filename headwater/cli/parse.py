"""Turning command-line text into API values: positions, times, durations, lists.

Every parser here raises :class:`~headwater.errors.InvalidArgumentError` with a message
that shows the accepted forms, so a mistyped value reads like any other Headwater error
(``error: ...``, exit code 1) instead of a traceback. The clock is passed in where "now"
matters, so tests can pin it.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from headwater.errors import InvalidArgumentError, InvalidMessageIdError
from headwater.model.config import PARTITIONS_MAX, TTL_S_MAX
from headwater.model.message import MessageId
from headwater.model.positions import (  # the parsers the HTTP API shares, re-exported
    FROM_FORMS,
    ID_LIKE_RE,
    OFFSET_MAX,
    TIME_FORMS,
    UNIT_S,
    From,
    is_digits,
    parse_from,
    parse_offset,
    parse_time,
)

__all__ = [
    "Position",
    "parse_position",
    "parse_message_id",
    "parse_time",
    "parse_ttl",
    "parse_partitions",
    "parse_pairs",
    "parse_seconds",
    "parse_start",
    "From",
    "check_server",
    "parse_from",
    "FROM_FORMS",
    "Seconds",
    "POSITION_FORMS",
    "TIME_FORMS",
    "COUNT_MAX",
    "OFFSET_MAX",
    "WAIT_S_MAX",
]

# Bounds of what a command line may say, so that a value too large for the wire (int64) or
# for the OS (time_t) is refused here, with its range, the same way embedded and over
# --server, instead of failing deep down (a traceback, or a codec error from the broker).
COUNT_MAX = 2**63 - 1  # --limit: "no limit" in practice, and still an int64
WAIT_S_MAX = 365 * 86_400  # --timeout, --interval, HEADWATER_CONNECT_TIMEOUT_S: a year

_DURATION_RE = re.compile(r"^(\d+)([smhdw]?)\Z")

POSITION_FORMS = f"an offset (e.g. 1200), a message id (e.g. 00000001-00000000-00000000000004b0), {TIME_FORMS}"


@dataclass(frozen=True)
class Position:
    """One end of a range as the user wrote it: exactly one field is set."""

    offset: int | None = None
    message_id: MessageId | None = None
    time_ms: int | None = None


def parse_position(text: str, what: str, *, clock: Callable[[], float] = time.time) -> Position:
    """An offset, a message id or a time, told apart by their shape.

    >>> parse_position("42", "--from")
    Position(offset=42, message_id=None, time_ms=None)
    >>> parse_position("00000001-00000002-0000000000000003", "--from").message_id
    MessageId(queue_id=1, partition=2, offset=3)
    """
    s = text.strip()
    if is_digits(s):
        return Position(offset=parse_offset(s, what))
    if ID_LIKE_RE.match(s):
        return Position(message_id=MessageId.parse(s))
    return Position(time_ms=parse_time(s, what, clock=clock, forms=POSITION_FORMS, noun="a position"))


def parse_start(
    text: str, what: str, *, offsets: bool = True, clock: Callable[[], float] = time.time
) -> str | Position:
    """Where a reader starts: ``"earliest"``, ``"latest"``, or a :class:`Position` holding
    an offset (only with ``offsets``) or a time. The error lists exactly these forms.

    >>> parse_start("Earliest", "--to"), parse_start("12", "--to")
    ('earliest', Position(offset=12, message_id=None, time_ms=None))
    >>> parse_start("2026-11-21", "--from", offsets=False).time_ms
    1795219200000
    """
    s = text.strip()
    if s.lower() in ("earliest", "latest"):
        return s.lower()
    if offsets and is_digits(s):
        return Position(offset=parse_offset(s, what))
    forms = f"'earliest', 'latest', {'an offset (e.g. 1200), ' if offsets else ''}or a time: {TIME_FORMS}"
    return Position(time_ms=parse_time(s, what, clock=clock, forms=forms, noun="a position"))


def parse_message_id(text: str) -> MessageId:
    """A message id, with a hint at where ids come from when it does not parse."""
    try:
        return MessageId.parse(text)
    except InvalidMessageIdError as e:
        raise InvalidMessageIdError(f"{e}; ids are printed by 'headwater produce' and by 'headwater scan'") from None


def parse_ttl(text: str) -> int | None:
    """Seconds to keep messages; ``None`` keeps them forever.

    ``0`` and ``forever`` mean forever; a bare number is seconds; a suffix s, m, h, d or w
    picks another unit. At most ``TTL_S_MAX`` (100 years, 36525d): a longer ttl would not
    fit the broker's timestamps, and forever says it better.

    >>> parse_ttl("3600"), parse_ttl("7d"), parse_ttl("forever")
    (3600, 604800, None)
    """
    s = text.strip().lower()
    if s in ("0", "forever", "none", "infinite"):
        return None
    m = _DURATION_RE.match(s)
    if not m or not m[1].isascii():
        raise InvalidArgumentError(
            f"--ttl: {text!r} is not a duration; use seconds (e.g. 3600), a number with a unit "
            f"(e.g. 30m, 12h, 7d, 2w), or 0 / forever to keep messages forever"
        )
    ttl_s = int(m[1]) * UNIT_S[m[2] or "s"]
    if ttl_s > TTL_S_MAX:
        raise InvalidArgumentError(
            f"--ttl: {text!r} is too long; a ttl is from 1 s to {TTL_S_MAX:,} s (100 years, "
            f"{TTL_S_MAX // 86400}d), or 0 / forever to keep messages forever"
        )
    return ttl_s


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
        if is_digits(lo) and (not dash or is_digits(hi)):
            first, last = int(lo), int(hi) if dash else int(lo)
            if last >= PARTITIONS_MAX:  # before range(): 0-99999999999 would fill the memory
                raise InvalidArgumentError(
                    f"--partitions: {text!r} names partition {last}; a queue has at most "
                    f"{PARTITIONS_MAX:,} partitions, numbered from 0"
                )
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


def parse_seconds(text: str, what: str, *, max_s: float = WAIT_S_MAX) -> float:
    """A number of seconds from 0 to ``max_s``: finite (``inf`` and ``nan`` are refused).

    >>> parse_seconds("2.5", "--timeout")
    2.5
    """
    try:
        seconds = float(text)
    except ValueError:
        raise InvalidArgumentError(f"{what}: {text!r} is not a number of seconds; use e.g. 5 or 0.5") from None
    if not (math.isfinite(seconds) and 0 <= seconds <= max_s):
        raise InvalidArgumentError(f"{what}: {text!r} is out of range; use seconds from 0 to {max_s:,.0f}")
    return seconds


class Seconds:
    """The parser of a ``SECONDS`` option (``typer.Option(parser=Seconds())``): see
    :func:`parse_seconds`. ``inf``, ``nan`` and values past ``max_s`` are usage errors (exit
    2), as typer's ``min``/``max`` report other numbers out of range; typer's own float
    range would let ``nan`` through."""

    def __init__(self, max_s: float = WAIT_S_MAX) -> None:
        self.max_s = max_s
        self.__name__ = "seconds"  # typer names the parameter type after the parser

    def __call__(self, value: Any) -> float:
        try:
            return parse_seconds(str(value), "", max_s=self.max_s)
        except InvalidArgumentError as e:
            raise ValueError(str(e).removeprefix(": ")) from None  # typer: a usage error, exit 2


_SCHEME_RE = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://")


def check_server(text: str, what: str = "--server") -> str:
    """A ``--server`` value as :func:`headwater.connect` takes it: ``HOST:PORT``, or a
    cluster's list ``HOST:PORT,HOST:PORT``; an IPv6 host in brackets (``[::1]:7070``).
    A URL (``http://h:7070``), a host without port or a port out of range is refused with
    what to write instead.

    >>> check_server("127.0.0.1:7070,b:7071")
    '127.0.0.1:7070,b:7071'
    """
    form = "HOST:PORT, e.g. 127.0.0.1:7070, or for a cluster HOST:PORT,HOST:PORT"
    addresses = [a.strip() for a in text.split(",")]
    for address in addresses:
        m = _SCHEME_RE.match(address)
        if m:
            bare = address[m.end() :].rstrip("/")
            raise InvalidArgumentError(
                f"{what}: {text!r} is a URL; Headwater speaks its own protocol, not {m[1]}: give {form}"
                + (f" (here: {bare})" if bare else "")
            )
        host, colon, port = address.rpartition(":")
        if not colon or not host or host.endswith(":") and not host.startswith("["):
            raise InvalidArgumentError(
                f"{what}: {address!r} has no port; give {form} (headwater serve listens on 7070 by default)"
            )
        if not (is_digits(port) and 0 < int(port) < 65536):
            raise InvalidArgumentError(
                f"{what}: {address!r}: the port {port!r} is not a number from 1 to 65535; give {form}"
            )
    return ",".join(addresses)
