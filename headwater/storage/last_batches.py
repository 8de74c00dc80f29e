"""LastBatches: a copy of each partition's newest small batch, for readers following its end.

A consumer at a partition's end (a fetch stream's push, a woken long poll) asks for the batch
just appended. The store keeps a copy of each partition's last batch of ``batch_bytes_max``
or less, as stored (broker fields stamped), and answers such a fetch from it instead of
reading the file back; it checks there that the copy is still the partition's last batch and
still readable (start offset, truncation, TTL). A bigger batch replaces the copy with none.

The copies of all partitions together stay within ``bytes_max``, the least recently
appended dropped first. With many partitions most copies go before anyone reads them, so a
copy must be cheap: an ``OrderedDict`` finds the oldest at once, where a plain dict walks over
every entry deleted at its front.

Thread-safety: none of its own; the store calls it under its lock.

>>> last = LastBatches(batch_bytes_max=8, bytes_max=10)
>>> last.keep((1, 0), 0, 2, 0, b"ab", b"cd")
>>> last.get((1, 0)).data, last.get((1, 0)).end_offset
(b'abcd', 2)
>>> last.keep((1, 1), 0, 1, 0, b"12345", b"6789")  # 9 bytes: too big to copy
>>> last.get((1, 1)) is None
True
>>> last.keep((1, 2), 0, 1, 0, b"1234", b"5678")
>>> last.get((1, 0)) is None, last.bytes  # the oldest went to stay within 10 bytes
(True, 8)
"""

from __future__ import annotations

from collections import OrderedDict
from typing import NamedTuple

__all__ = ["LastBatches", "Tail", "BATCH_BYTES_MAX", "BYTES_MAX"]

BATCH_BYTES_MAX = 16 * 1024  # larger batches are read back from the segment file
BYTES_MAX = 4 * 1024 * 1024  # the copies of all partitions; past it the least recently appended go

Key = tuple[int, int]  # (queue id, partition)


class Tail(NamedTuple):
    """A copy of a partition's last batch as stored, and the offsets it holds."""

    base_offset: int
    end_offset: int
    tag_mask: int
    data: bytes


# a Tail from a tuple without the namedtuple's Python-level __new__: one call fewer per append
_new_tail = tuple.__new__


class LastBatches:
    """The copies, by (queue id, partition), within ``bytes_max`` in all."""

    def __init__(self, *, batch_bytes_max: int = BATCH_BYTES_MAX, bytes_max: int = BYTES_MAX) -> None:
        self.batch_bytes_max = batch_bytes_max
        self.bytes_max = bytes_max
        self._tails: OrderedDict[Key, Tail] = OrderedDict()  # least recently appended first
        self.bytes = 0

    def keep(
        self, key: Key, base_offset: int, end_offset: int, tag_mask: int, head: bytes, rest: bytes | memoryview
    ) -> None:
        """The partition's new last batch is ``head + rest``: copy it when it is small, else
        forget the old copy; then drop the oldest copies past ``bytes_max``."""
        tails = self._tails
        old = tails.pop(key, None)
        if old is not None:
            self.bytes -= len(old.data)
        if len(head) + len(rest) > self.batch_bytes_max:
            return
        tails[key] = _new_tail(Tail, (base_offset, end_offset, tag_mask, head + rest))
        self.bytes += len(head) + len(rest)
        while self.bytes > self.bytes_max:
            self.bytes -= len(tails.popitem(last=False)[1].data)

    def drop(self, key: Key) -> None:
        """Forget the partition's copy (its end went back: the copy is no longer its last)."""
        old = self._tails.pop(key, None)
        if old is not None:
            self.bytes -= len(old.data)

    def get(self, key: Key) -> Tail | None:
        return self._tails.get(key)

    def keys(self) -> list[Key]:
        """The partitions with a copy, the least recently appended first."""
        return list(self._tails)
