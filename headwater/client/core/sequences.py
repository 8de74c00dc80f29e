"""Idempotence bookkeeping: a producer's (producer id, epoch) and the sequence each of its
partitions counts under it. No I/O, no clock.

A batch carries the sequence of its first message, counted per (queue, partition) and
taken when the batch is encoded; the broker stores a batch only in sequence and answers a
retry of one of a producer's last five batches with the original placement. When a batch
may have been stored and failed for good, the epoch is bumped, so the broker accepts later
batches from sequence 0 instead of refusing them as out of order.

>>> class P: identity, next_sequence = None, 0
>>> part = P()
>>> take_sequence(part, (9, 0), 3), take_sequence(part, (9, 0), 2), take_sequence(part, (9, 1), 1)
((9, 0, 0), (9, 3, 0), (9, 0, 1))
>>> give_back_sequence(part, (9, 1), 0, 1); part.next_sequence
0
"""

from __future__ import annotations

import logging
import secrets
from typing import Protocol

__all__ = [
    "SEQUENCE_MOD",
    "EPOCH_MAX",
    "Identity",
    "Sequenced",
    "new_identity",
    "next_epoch",
    "take_sequence",
    "give_back_sequence",
]

SEQUENCE_MOD = 2**31  # the broker counts sequences modulo this (a signed 32-bit field)
EPOCH_MAX = 2**15 - 1  # the epoch is a signed 16-bit field; past it, a new producer id

Identity = tuple[int, int]  # (producer id, epoch)

log = logging.getLogger("headwater.producer")


class Sequenced(Protocol):
    """A partition's sequence state: the identity its ``next_sequence`` counts under."""

    identity: Identity | None
    next_sequence: int


def new_identity(idempotent: bool) -> Identity | None:
    """A fresh (producer id, epoch): a random 62-bit id, so two producers never share one
    (drawn from ``secrets``, not a seeded generator: ids must differ across processes)."""
    return (secrets.randbits(62), 0) if idempotent else None


def next_epoch(identity: Identity) -> Identity:
    """The identity after a batch failed once it may have been stored: the next epoch, whose
    sequences start afresh (a new id past ``EPOCH_MAX``).

    >>> next_epoch((5, 0)), next_epoch((5, EPOCH_MAX))[0] != 5
    ((5, 1), True)
    """
    pid, epoch = identity
    log.info("producer %d: epoch bumped to %d after a failed batch", pid, epoch + 1)
    return (secrets.randbits(62), 0) if epoch >= EPOCH_MAX else (pid, epoch + 1)


def take_sequence(part: Sequenced, identity: Identity | None, count: int) -> tuple[int, int, int]:
    """(producer id, base sequence, epoch) to encode a batch of ``count`` messages with; the
    partition's next batch follows it, before this one's answer. ``-1``s when not idempotent."""
    if identity is None:
        return -1, -1, -1
    if part.identity != identity:  # first batch, or a new epoch: sequences start afresh
        part.identity, part.next_sequence = identity, 0
    seq = part.next_sequence
    part.next_sequence = (seq + count) % SEQUENCE_MOD
    return identity[0], seq, identity[1]


def give_back_sequence(part: Sequenced, identity: Identity | None, base_sequence: int, count: int) -> None:
    """A batch encoded at ``base_sequence`` was not stored: its range is free again, unless a
    later batch already took the next one (then the broker will say what is missing)."""
    if (
        identity is not None
        and part.identity == identity
        and part.next_sequence == (base_sequence + count) % SEQUENCE_MOD
    ):
        part.next_sequence = base_sequence
