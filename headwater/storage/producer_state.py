"""Producer state snapshots on disk: ``<segment base>.producers`` beside a sealed segment.

The table itself (headwater.model.producer_state) decides what a retry is; this module
writes it crash-safely (temp file, fsync, rename, fsync the folder) and reads it back. On
open the store loads the newest snapshot and replays the batches of later segments.
"""

from __future__ import annotations

from pathlib import Path

from headwater.model.producer_state import RECENT_BATCHES, ProducerStateTable
from headwater.storage.segment import write_atomically

__all__ = ["ProducerStateTable", "RECENT_BATCHES", "write_snapshot", "read_snapshot"]


def write_snapshot(table: ProducerStateTable, path: Path) -> None:
    write_atomically(path, table.to_bytes())


def read_snapshot(path: Path, expiry_ms: int) -> ProducerStateTable:
    return ProducerStateTable.from_bytes(path.read_bytes(), expiry_ms, f"producer snapshot {path.name}")
