"""Choosing a partition for each message.

Strategies, by name: ``"default"`` (the key's hash when the message has a key, otherwise
a sticky partition), ``"key"`` (a key is required), ``"round_robin"``, ``"random"``; or any
callable ``(message, partition_count) -> int``.

Messages without a key under ``"default"``, ``"round_robin"`` and ``"random"`` go to one
partition per batch, not one per message (Kafka's sticky partitioner): a ``send_batch`` call
goes to one partition, and ``send()`` calls stick to one partition of the queue until the
batch they form there is sent; the next batch goes to the next partition (round robin,
from a random first one, so that short-lived producers spread too) or to a random one
(``"random"``). So a batch stays one unit on the wire and on disk, and the
partitions still fill evenly. On a cluster they go only to partitions that are online
while any is (Kafka's partitioner takes the available partitions alike): a partition whose
leader is down or out of reach, as the producer's copy of the metadata says or a send to it
has just found, waits for its leader (with what was sent to it), while the messages that
could go anywhere go elsewhere. A keyed message goes to ``key_hash(key) % partitions``
(:mod:`headwater.model.hashing`: CRC32C mixed by MurmurHash3's finalizer), stable across
processes, machines and versions.

>>> from headwater.model.config import PartitionInfo
>>> parts = [PartitionInfo(i, 0, 0) for i in range(4)]
>>> p = Partitioner("round_robin")
>>> first = p.sticky("orders", parts)
>>> p.sticky("orders", parts) == first     # sticks until its batch is sent
True
>>> p.batch_sent("orders", first)
>>> p.sticky("orders", parts) == (first + 1) % 4
True
>>> def batches(n):     # where n batches of unkeyed messages go, one after another
...     went = set()
...     for _ in range(n):
...         went.add(q := p.sticky("orders", parts))
...         p.batch_sent("orders", q)
...     return sorted(went)
>>> batches(8)
[0, 1, 2, 3]
>>> p.avoid("orders", 2, parts)     # a send found partition 2's leader out of reach
>>> batches(8)
[0, 1, 3]
>>> parts = [PartitionInfo(i, 0, 0, online=i != 3) for i in range(4)]  # a new copy: 3 is offline
>>> batches(8)
[0, 1, 2]
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Sequence

from headwater.errors import InvalidArgumentError
from headwater.model.config import PartitionInfo
from headwater.model.hashing import key_hash
from headwater.model.message import Message

__all__ = ["Partitioner", "PartitionFn", "key_partition"]

PartitionFn = Callable[[Message, int], int]


def key_partition(key: bytes, partitions: int) -> int:
    """The partition a key maps to: ``key_hash(key) % partitions``."""
    if type(key) is not bytes:
        raise InvalidArgumentError(
            f"a message key is bytes, got {type(key).__name__}"
            + (" (encode it first, e.g. key.encode())" if isinstance(key, str) else "")
        )
    return key_hash(key) % partitions


class Partitioner:
    """Applies one strategy. Thread-safe: its state is a counter and a dict of sticky
    partitions, each changed by single operations."""

    STRATEGIES = ("default", "key", "round_robin", "random")

    def __init__(self, strategy: str | PartitionFn = "default", *, rng: random.Random | None = None) -> None:
        if not callable(strategy) and strategy not in self.STRATEGIES:
            raise InvalidArgumentError(
                f"unknown partitioner {strategy!r}; use one of {', '.join(self.STRATEGIES)} or a "
                f"function (message, partition_count) -> partition"
            )
        self.strategy = strategy
        #: True when a message of bare bytes (no key) needs ``for_message``: under the other
        #: strategies it goes to the sticky partition, which a hot path may take as None
        self.bytes_need_asking = callable(strategy) or strategy == "key"
        self._rng = rng or random.Random()
        # round robin from a random place: producers that send a batch or two and exit (the
        # CLI's produce, a cron job) would otherwise all fill partition 0
        self._counter = itertools.count(self._rng.randrange(1 << 30))
        self._sticky: dict[str, int] = {}
        # per queue: the copy of its partitions last seen, and which of them are online
        self._online: dict[str, tuple[Sequence[PartitionInfo], list[int]]] = {}

    @property
    def per_message(self) -> bool:
        """True when messages of one batch may go to different partitions."""
        return callable(self.strategy) or self.strategy in ("default", "key")

    def sticky_batch(self, messages: Sequence[Message | bytes]) -> bool:
        """True when every one of ``messages`` goes to the sticky partition (no strategy
        needs to look at them one by one)."""
        s = self.strategy
        if callable(s) or s == "key":
            return False
        return s != "default" or not any(isinstance(m, Message) and m.key is not None for m in messages)

    def for_batch(self, partitions: int) -> int:
        """A fresh partition for a batch of unkeyed messages: the next one, or a random one."""
        if self.strategy == "random":
            return self._rng.randrange(partitions)
        return next(self._counter) % partitions

    def sticky(self, queue: str, partitions: Sequence[PartitionInfo]) -> int:
        """The partition unkeyed messages of ``queue`` go to now, of its ``partitions`` (the
        producer's copy of the queue's metadata): one that is online, while any is."""
        p = self._sticky.get(queue)
        if p is None or p >= len(partitions) or not partitions[p].online:
            p = self._sticky[queue] = self._fresh(queue, partitions)
        return p

    def _fresh(self, queue: str, partitions: Sequence[PartitionInfo]) -> int:
        """:meth:`for_batch` over the partitions that are online (all of them when none is),
        worked out once per copy of the metadata, not once per batch."""
        online = self._online_of(queue, partitions)
        if len(online) == len(partitions) or not online:
            return self.for_batch(len(partitions))
        return online[self.for_batch(len(online))]

    def _online_of(self, queue: str, partitions: Sequence[PartitionInfo]) -> list[int]:
        """Which of ``partitions`` are online, less those avoided since this copy came."""
        known = self._online.get(queue)
        if known is None or known[0] is not partitions:
            known = self._online[queue] = (partitions, [i for i, part in enumerate(partitions) if part.online])
        return known[1]

    def avoid(self, queue: str, partition: int, partitions: Sequence[PartitionInfo]) -> None:
        """A send to ``queue[partition]`` found its leader out of reach: unkeyed messages go
        to the queue's other partitions until a new copy of the metadata (``partitions`` is
        the one in use) says which are online."""
        self._online[queue] = (partitions, [i for i in self._online_of(queue, partitions) if i != partition])
        if self._sticky.get(queue) == partition:
            self._sticky.pop(queue, None)

    def batch_sent(self, queue: str, partition: int) -> None:
        """A batch of ``queue`` left for ``partition``: if that was the sticky one, move on."""
        if self._sticky.get(queue) == partition:
            self._sticky.pop(queue, None)

    def for_message(self, message: Message | bytes, partitions: int) -> int | None:
        """The partition of one message; None means "the sticky partition" (no key, and a
        strategy that does not need one)."""
        s = self.strategy
        if callable(s):
            msg = message if isinstance(message, Message) else Message(message)
            p = s(msg, partitions)
            if isinstance(p, bool) or not isinstance(p, int) or not 0 <= p < partitions:
                raise InvalidArgumentError(
                    f"the partitioner returned {p!r}; it must return an int from 0 to {partitions - 1}"
                )
            return p
        if not self.per_message:
            return None  # round robin and random ignore keys
        key = message.key if isinstance(message, Message) else None
        if key is not None:
            return key_partition(key, partitions)
        if s == "key":
            raise InvalidArgumentError("the 'key' partitioner needs every message to have a key")
        return None
