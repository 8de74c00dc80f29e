"""Messages as produced (:class:`Message`) and as stored and read back (:class:`Record`).

A message id names a stored message: ``(queue_id, partition, offset)``. ``queue_id`` is a
number the store gives a queue at creation and never reuses, so an id of a deleted queue
never names a message of a later queue with the same name. Printed as three fixed-width hex
fields, ids sort as strings in the same order as their messages within a partition::

    >>> mid = MessageId(42, 3, 123456)
    >>> str(mid)
    '0000002a-00000003-000000000001e240'
    >>> MessageId.parse(str(mid)) == mid
    True

A delayed message that is accepted but not yet delivered has an id of its own: the high
bit of the partition field is set (``0x80000000 | partition``) and the offset names its
place in the delay service's schedule (see :mod:`headwater.model.delay`), not in the
partition's log. Such ids print, parse and compare like any other; once the message is
delivered it also gets an ordinary id in its partition::

    >>> MessageId(42, 0x80000003, 1).is_delayed, MessageId(42, 0x80000003, 1).target_partition
    (True, 3)
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime, timedelta
from typing import NamedTuple

import msgspec

from headwater.errors import InvalidArgumentError, InvalidMessageIdError

__all__ = [
    "Message",
    "MessageId",
    "Record",
    "datetime_ms",
    "required_epoch_ms",
    "to_epoch_ms",
    "warn_caller",
    "warn_if_local_naive",
]

_ID_RE = re.compile(r"^([0-9a-f]{8})-([0-9a-f]{8})-([0-9a-f]{16})\Z")


class MessageId(NamedTuple):
    """Where a message lives: queue id, partition, offset. Tuple order = log order."""

    queue_id: int
    partition: int
    offset: int

    @property
    def is_delayed(self) -> bool:
        """True for the id of a delayed message while it waits (partition's high bit set)."""
        return bool(self.partition & 0x80000000)

    @property
    def target_partition(self) -> int:
        """The partition the message is (or will be, when delayed) stored in."""
        return self.partition & 0x7FFFFFFF

    def __str__(self) -> str:
        return f"{self.queue_id:08x}-{self.partition:08x}-{self.offset:016x}"

    @classmethod
    def parse(cls, text: str | MessageId) -> MessageId:
        """Parse a printed id; raises :class:`InvalidMessageIdError` naming the problem."""
        if isinstance(text, MessageId):
            return text
        if not isinstance(text, str):
            hint = ""
            if callable(getattr(text, "result", None)):  # the future of a send
                hint = ": a send's future gives its id once stored (.result(), or await it; or use send_and_wait)"
            raise InvalidMessageIdError(
                f"a message id is a string like '0000002a-00000003-000000000001e240', got {type(text).__name__}{hint}"
            )
        m = _ID_RE.match(text.strip().lower())
        if m is None:
            raise InvalidMessageIdError(
                f"{text!r} is not a message id: expected three hex fields "
                f"8-8-16 characters long, like '0000002a-00000003-000000000001e240'"
            )
        return cls(int(m[1], 16), int(m[2], 16), int(m[3], 16))


class Message(msgspec.Struct, frozen=True, gc=False):
    """A message to send: the body and the optional key, tag and properties.

    >>> Message(b"order 17 paid", key=b"order-17", tag="paid", properties={"source": "web"})
    Message(body=b'order 17 paid', key=b'order-17', tag='paid', properties={'source': 'web'})
    """

    body: bytes
    key: bytes | None = None
    tag: str | None = None
    properties: dict[str, str] | None = None


class Record(msgspec.Struct, frozen=True, gc=False):
    """A stored message as read back: where it lives, when it was appended, what it holds.

    ``timestamp_ms`` is the broker's append time in milliseconds since the epoch; it never
    decreases along a partition, which is what makes time lookups exact. For a delayed
    message that is its delivery time, and ``scheduled_ms`` the time it was scheduled for
    (None for messages sent without a delay); ``timestamp_ms - scheduled_ms`` is how late
    it was delivered. A delayed message read back before delivery (``client.get`` of its
    delayed id) has the acceptance time as ``timestamp_ms``.
    """

    queue: str
    partition: int
    offset: int
    timestamp_ms: int
    body: bytes
    key: bytes | None = None
    tag: str | None = None
    properties: dict[str, str] | None = None
    queue_id: int = 0
    scheduled_ms: int | None = None

    @property
    def message_id(self) -> MessageId:
        return MessageId(self.queue_id, self.partition, self.offset)

    @property
    def timestamp(self) -> datetime:
        return datetime.fromtimestamp(self.timestamp_ms / 1000, tz=UTC)

    @property
    def scheduled(self) -> datetime | None:
        """``scheduled_ms`` as a datetime (None for a message sent without a delay)."""
        if self.scheduled_ms is None:
            return None
        return datetime.fromtimestamp(self.scheduled_ms / 1000, tz=UTC)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)


def datetime_ms(when: datetime) -> int:
    """``when`` (naive means UTC) in epoch milliseconds, exactly, a fraction of a
    millisecond rounded up.

    Headwater keeps times in whole milliseconds, so rounding up gives a bound its exact
    meaning: a message stamped ``T`` ms is "at or after" ``when`` exactly when ``T`` is at
    or after the rounded value. A range that ends at ``datetime.now()`` takes every message
    appended before that call, and a delayed message is never delivered early.

    >>> datetime_ms(datetime(2026, 11, 22, 12, 0, 0, 1000))     # 1 ms past noon
    1795348800001
    >>> datetime_ms(datetime(2026, 11, 22, 12, 0, 0, 1001))     # and 1 µs
    1795348800002
    >>> datetime_ms(datetime(1969, 12, 31, 23, 59, 59, 999500, tzinfo=UTC))
    0
    """
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return -(-((when - _EPOCH) // _US) // 1000)


def warn_if_local_naive(when: datetime, what: str) -> None:
    """A naive datetime is taken as UTC. On a machine whose local zone is not UTC that is
    rarely what ``datetime.now() + ...`` meant (Python's own ``timestamp()`` takes naive as
    local time): say so, once per call site, with what to pass instead."""
    if when.tzinfo is None and datetime.now().astimezone().utcoffset():
        warn_caller(
            f"{what}: a naive datetime is taken as UTC, and this machine's local time is not UTC "
            f"(datetime.now() is local time); pass an aware one, e.g. datetime.now(timezone.utc) + ..."
        )


def warn_caller(message: str) -> None:
    """A UserWarning pointed at the first frame outside headwater: the line of the caller's
    program that passed what it is about, however deep inside the call it is found."""
    import sys
    import warnings

    frame, level = sys._getframe(0), 1
    while frame.f_back is not None and frame.f_globals.get("__name__", "").startswith("headwater."):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, UserWarning, stacklevel=level)


_EPOCH_MS_MIN, _EPOCH_MS_MAX = -(2**63), 2**63 - 1


def to_epoch_ms(value: datetime | int | float | None, what: str = "time") -> int | None:
    """A point in time as epoch milliseconds: datetimes (naive means UTC; see
    :func:`datetime_ms`), or a number of ms (a fraction rounded up, as for datetimes).

    >>> to_epoch_ms(1_795_255_200_000.25, "end_time")
    1795255200001
    >>> to_epoch_ms(float("nan"), "end_time")
    Traceback (most recent call last):
    headwater.errors.InvalidArgumentError: end_time must be a datetime or epoch milliseconds, got nan
    """
    from headwater.errors import InvalidArgumentError

    if value is None:
        return None
    if isinstance(value, datetime):
        warn_if_local_naive(value, what)
        return datetime_ms(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidArgumentError(f"{what} must be a datetime or epoch milliseconds, got {type(value).__name__}")
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidArgumentError(f"{what} must be a datetime or epoch milliseconds, got {value}")
        ms = math.ceil(value)
    else:
        ms = int(value)
    if not _EPOCH_MS_MIN <= ms <= _EPOCH_MS_MAX:  # what the wire carries: embedded refuses it alike
        raise InvalidArgumentError(f"{what} is out of range: epoch milliseconds fit in 64 bits, got {value}")
    return ms


def required_epoch_ms(value: datetime | int | float, what: str = "time") -> int:
    """:func:`to_epoch_ms` where a time must be given (None, "no bound" elsewhere, is refused).

    >>> required_epoch_ms(None, "when")
    Traceback (most recent call last):
    headwater.errors.InvalidArgumentError: when must be a datetime or epoch milliseconds, got None
    """
    ms = to_epoch_ms(value, what)
    if ms is None:
        raise InvalidArgumentError(f"{what} must be a datetime or epoch milliseconds, got None")
    return ms
