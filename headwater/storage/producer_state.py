"""Producer state snapshots on disk: ``<segment base>.producers`` beside a sealed segment.

The table itself (headwater.model.producer_state) decides what a retry is; this module
writes it crash-safely (temp file, fsync, rename, fsync the folder) and reads it back. On
open the store loads the newest snapshot and replays the batches of later segments.
"""

from __future__ import annotations

import os
from pathlib import Path

from headwater.model.producer_state import RECENT_BATCHES, ProducerStateTable
from headwater.storage.segment import fsync_dir

__all__ = ["ProducerStateTable", "RECENT_BATCHES", "write_snapshot", "read_snapshot"]


def write_snapshot(table: ProducerStateTable, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, table.to_bytes())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def read_snapshot(path: Path, expiry_ms: int) -> ProducerStateTable:
    return ProducerStateTable.from_bytes(path.read_bytes(), expiry_ms, f"producer snapshot {path.name}")
