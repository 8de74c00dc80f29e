"""How many partitions a store holds: the checks both stores run before they add any.

A partition costs memory whether or not it holds data (its offsets, its index entries, its
line in every queue listing), so a broker bounds them: ``queue_partitions_max`` for one
queue and ``partitions_max`` for all queues together, the broker's own included (settings
of :class:`~headwater.storage.settings.StoreConfig`). Without them, a client could create
queues of 100,000 partitions until the broker's memory was gone and every listing too large
to answer. Both stores call these checks under their lock, with the counts they hold.
"""

from __future__ import annotations

from headwater.errors import InvalidArgumentError
from headwater.model.config import PARTITIONS_MAX
from headwater.storage.settings import StoreConfig

__all__ = ["check_new_queue", "check_added_partitions"]


def check_new_queue(cfg: StoreConfig, name: str, partitions: int, total_now: int) -> None:
    """Refuse a new queue of ``partitions`` partitions past either bound."""
    _check_bounds(cfg, name, partitions, total_now + partitions)


def check_added_partitions(cfg: StoreConfig, name: str, now_n: int, partitions: int, total_now: int) -> None:
    """Refuse growing queue ``name`` from ``now_n`` to ``partitions`` partitions unless it grows
    (never shrinks: keys would move) and stays within both bounds."""
    if isinstance(partitions, bool) or not isinstance(partitions, int) or not now_n < partitions <= PARTITIONS_MAX:
        raise InvalidArgumentError(
            f"queue {name!r} has {now_n} partitions; the new count must be larger "
            f"(up to {PARTITIONS_MAX}), got {partitions!r}"
        )
    _check_bounds(cfg, name, partitions, total_now - now_n + partitions)


def _check_bounds(cfg: StoreConfig, name: str, partitions: int, total_after: int) -> None:
    if partitions > cfg.queue_partitions_max:
        raise InvalidArgumentError(
            f"queue {name!r} would have {partitions:,} partitions; this broker allows at most "
            f"{cfg.queue_partitions_max:,} in one queue (setting queue_partitions_max)"
        )
    if total_after > cfg.partitions_max:
        raise InvalidArgumentError(
            f"queue {name!r} would bring this broker to {total_after:,} partitions in all; its limit "
            f"is {cfg.partitions_max:,} (setting partitions_max): delete queues you no longer use, "
            f"or raise the setting"
        )
