"""Choosing a partition for each message.

Strategies, by name: ``"default"`` (the key's hash when the message has a key, otherwise
round robin), ``"key"`` (a key is required), ``"round_robin"``, ``"random"``; or any callable
``(message, partition_count) -> int``. Round robin and random choose one partition per
``send_batch`` call, not per message (as Kafka's sticky partitioner does): a batch stays one
unit on the wire and on disk. The key hash is CRC32C of the key bytes modulo the partition
count, stable across processes, machines and versions.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable

from headwater.errors import InvalidArgumentError
from headwater.model.batch import crc32c
from headwater.model.message import Message

__all__ = ["Partitioner", "PartitionFn", "key_partition", "make_partitioner"]

PartitionFn = Callable[[Message, int], int]


def key_partition(key: bytes, partitions: int) -> int:
    """The partition a key maps to: ``crc32c(key) % partitions``."""
    if type(key) is not bytes:
        raise InvalidArgumentError(
            f"a message key is bytes, got {type(key).__name__}"
            + (" (encode it first, e.g. key.encode())" if isinstance(key, str) else "")
        )
    return crc32c(key) % partitions


class Partitioner:
    """Applies one strategy; thread-safe."""

    STRATEGIES = ("default", "key", "round_robin", "random")

    def __init__(self, strategy: str | PartitionFn = "default", *, rng: random.Random | None = None) -> None:
        if not callable(strategy) and strategy not in self.STRATEGIES:
            raise InvalidArgumentError(
                f"unknown partitioner {strategy!r}; use one of {', '.join(self.STRATEGIES)} or a "
                f"function (message, partition_count) -> partition"
            )
        self.strategy = strategy
        self._counter = itertools.count()
        self._rng = rng or random.Random()

    @property
    def per_message(self) -> bool:
        """True when messages of one batch may go to different partitions."""
        return callable(self.strategy) or self.strategy in ("default", "key")

    def for_batch(self, partitions: int) -> int:
        """The partition of a whole batch under round robin or random."""
        if self.strategy == "random":
            return self._rng.randrange(partitions)
        return next(self._counter) % partitions

    def for_message(self, message: Message | bytes, partitions: int) -> int:
        s = self.strategy
        key = message.key if isinstance(message, Message) else None
        if callable(s):
            msg = message if isinstance(message, Message) else Message(message)
            p = s(msg, partitions)
            if isinstance(p, bool) or not isinstance(p, int) or not 0 <= p < partitions:
                raise InvalidArgumentError(
                    f"the partitioner returned {p!r}; it must return an int from 0 to {partitions - 1}"
                )
            return p
        if key is not None:
            return key_partition(key, partitions)
        if s == "key":
            raise InvalidArgumentError("the 'key' partitioner needs every message to have a key")
        return self.for_batch(partitions)
