"""Type checks of the values callers pass through to the broker, in one wording for every
layer: the store, the in-memory broker and the model refuse a wrong type with these, and the
network client runs them before encoding (else msgspec's encoder would say it in its own
words), so a wrong type reads the same embedded, in memory and over the network.

>>> check_int_arg(True, "an offset")
Traceback (most recent call last):
headwater.errors.InvalidArgumentError: an offset is an int, got bool
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from headwater.errors import InvalidArgumentError, PartitionOutOfRangeError

__all__ = [
    "check_name",
    "shown",
    "check_int_arg",
    "check_offsets_arg",
    "check_offsets_given",
    "check_queue_arg",
    "mapping_copy",
    "partition_list_arg",
    "partitions_of_queue",
    "tag_filter_arg",
    "tag_list_arg",
]


def check_queue_arg(name: object) -> None:
    """InvalidArgumentError unless ``name`` is a string (whether it names a queue is the
    broker's to say)."""
    if not isinstance(name, str):
        raise InvalidArgumentError(f"a queue name is a string, got {type(name).__name__}")


def check_int_arg(value: object, what: str) -> None:
    """InvalidArgumentError unless ``value`` is an int (not a bool): "{what} is an int"."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentError(f"{what} is an int, got {type(value).__name__}")


def check_offsets_given(offsets: object) -> None:
    """InvalidArgumentError unless ``offsets`` is a non-empty mapping (what it maps is the
    caller's to check: whether the partitions exist, the offsets are in range)."""
    if not isinstance(offsets, Mapping) or not offsets:
        got = "an empty one" if isinstance(offsets, Mapping) else type(offsets).__name__
        raise InvalidArgumentError(f"offsets is a non-empty {{partition: offset}} mapping, got {got}")


def check_offsets_arg(offsets: object) -> None:
    """InvalidArgumentError unless ``offsets`` is a ``{partition: offset}`` mapping of ints
    (an empty one is the broker's to refuse, in its order of checks)."""
    if not isinstance(offsets, Mapping):
        check_offsets_given(offsets)  # refuses it, in its words
        return
    for partition, offset in offsets.items():
        check_int_arg(partition, "a partition")
        check_int_arg(offset, "an offset")


def partition_list_arg(partitions: object) -> list[int]:
    """``partitions`` (one int, or an iterable of ints) as a sorted list without repeats;
    InvalidArgumentError for anything else (whether they exist is the caller's to say).

    >>> partition_list_arg(3), partition_list_arg((2, 0, 2))
    ([3], [0, 2])
    >>> partition_list_arg(True)
    Traceback (most recent call last):
    headwater.errors.InvalidArgumentError: partitions is a partition number or a list of them, got bool
    >>> partition_list_arg([0, "1"])
    Traceback (most recent call last):
    headwater.errors.InvalidArgumentError: a partition is an int, got str
    """
    if isinstance(partitions, int) and not isinstance(partitions, bool):
        return [partitions]
    if isinstance(partitions, (str, bytes, bytearray, Mapping)) or not isinstance(partitions, Iterable):
        raise InvalidArgumentError(
            f"partitions is a partition number or a list of them, got {type(partitions).__name__}"
        )
    parts = list(partitions)
    for p in parts:
        check_int_arg(p, "a partition")
    return sorted(set(parts))


def partitions_of_queue(partitions: object, count: int, queue: str) -> list[int]:
    """:func:`partition_list_arg`, each checked to be one of the ``count`` partitions of
    ``queue`` (PartitionOutOfRangeError)."""
    parts = partition_list_arg(partitions)
    for p in parts:
        if not 0 <= p < count:
            raise PartitionOutOfRangeError(
                f"queue {queue!r} has partitions 0..{count - 1}; there is no partition {p!r}"
            )
    return parts


def mapping_copy(value: object) -> object:
    """A dict copy of a mapping a caller passed, anything else as it is (for the checks that
    follow to refuse in their words, where ``dict(value)`` would raise a bare TypeError)."""
    return dict(value) if isinstance(value, Mapping) else value


def tag_list_arg(tags: object, *, empty_ok: bool = False) -> list[str]:
    """``tags`` (one tag, or an iterable of tags) as a list; InvalidArgumentError unless each
    is a non-empty string (``empty_ok``: a string; the broker refuses an empty one, after it
    has checked the queue). ``"*"`` (every message) is the caller's to read.

    >>> tag_list_arg("billing"), tag_list_arg(("a", "b"))
    (['billing'], ['a', 'b'])
    >>> tag_list_arg(5)
    Traceback (most recent call last):
    headwater.errors.InvalidArgumentError: tags is a tag, a list of tags or '*' (every message), got int
    >>> tag_list_arg(["a", ""])
    Traceback (most recent call last):
    headwater.errors.InvalidArgumentError: tags are non-empty strings, got ''
    """
    if isinstance(tags, str):
        names = [tags]
    elif isinstance(tags, (bytes, bytearray, Mapping)) or not isinstance(tags, Iterable):
        raise InvalidArgumentError(f"tags is a tag, a list of tags or '*' (every message), got {type(tags).__name__}")
    else:
        names = list(tags)
    for t in names:
        if not isinstance(t, str) or not (t or empty_ok):
            raise InvalidArgumentError(f"tags are non-empty strings, got {t!r}")
    return names


def tag_filter_arg(tags: object) -> frozenset[str] | None:
    """``tags`` as a reader filters on them: None (every message) for None or ``"*"``."""
    if tags is None:
        return None
    names = tag_list_arg(tags)
    return None if "*" in names else frozenset(names)


_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
SHOWN_CHARS = 80  # how much of a bad value an error message repeats


def shown(value: object) -> str:
    """``repr(value)`` for an error message, cut short past :data:`SHOWN_CHARS` (saying how
    long the string was): a 10,000-character name is not repeated whole.

    >>> shown("a" * 100)[-30:]
    'aaaaaaaaaa... (100 characters)'
    """
    text = repr(value)
    if len(text) <= SHOWN_CHARS:
        return text
    size = f" ({len(value)} characters)" if isinstance(value, str) else ""
    return f"{text[:SHOWN_CHARS]}...{size}"


def check_name(value: object, what: str) -> str:
    """A group's or a subscriber's name: 1-200 letters, digits, '.', '_' and '-', starting
    with a letter or digit (nothing after them: not even a newline); else
    :class:`InvalidArgumentError` naming ``what``.

    >>> check_name("billing\\n", "group name")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    headwater.errors.InvalidArgumentError: invalid group name 'billing\\n': use 1-200 letters, ...
    """
    if isinstance(value, str) and _NAME_RE.fullmatch(value):
        return value
    raise InvalidArgumentError(
        f"invalid {what} {shown(value)}: use 1-200 letters, digits, '.', '_' and '-', starting with a letter or digit"
    )
