"""Type checks of the values callers pass through to the broker, in one wording for every
layer: the store, the in-memory broker and the model refuse a wrong type with these, and the
network client runs them before encoding (else msgspec's encoder would say it in its own
words), so a wrong type reads the same embedded, in memory and over the network.

>>> check_int_arg(True, "an offset")
Traceback (most recent call last):
headwater.errors.InvalidArgumentError: an offset is an int, got bool
"""

from __future__ import annotations

from collections.abc import Mapping

from headwater.errors import InvalidArgumentError

__all__ = ["check_int_arg", "check_offsets_arg", "check_queue_arg"]


def check_queue_arg(name: object) -> None:
    """InvalidArgumentError unless ``name`` is a string (whether it names a queue is the
    broker's to say)."""
    if not isinstance(name, str):
        raise InvalidArgumentError(f"a queue name is a string, got {type(name).__name__}")


def check_int_arg(value: object, what: str) -> None:
    """InvalidArgumentError unless ``value`` is an int (not a bool): "{what} is an int"."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentError(f"{what} is an int, got {type(value).__name__}")


def check_offsets_arg(offsets: object) -> None:
    """InvalidArgumentError unless ``offsets`` is a ``{partition: offset}`` mapping of ints."""
    if not isinstance(offsets, Mapping):
        raise InvalidArgumentError(f"offsets is a {{partition: offset}} mapping, got {type(offsets).__name__}")
    for partition, offset in offsets.items():
        check_int_arg(partition, "a partition")
        check_int_arg(offset, "an offset")
