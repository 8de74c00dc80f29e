"""The recovery point: how far the log is known to be on the disk.

Kafka keeps a recovery-point checkpoint and RocketMQ a checkpoint file for the same reason:
after a crash, only what was written *after* the last fsync can be torn, so only that part
may be cut. Everything before the recovery point was fsynced; damage found there later
(a bad sector, a stray write) is damage, not a torn write, and costs only itself: the
loader skips the bad bytes, resumes at the next valid batch and reports what was lost
(:func:`~headwater.storage.loader.load_segments`).

The point is a log position written to ``log/recovery-point`` after an fsync has
completed, so it never lies beyond what the disk holds. It is written at most about once
a second (the flusher's tick) and at a clean close, by replacing the file whole. An older
point on the disk (a crash before the newest was renamed into place) is never wrong, only
less: the loader then treats a little more of the log as a possible torn tail.
"""

from __future__ import annotations

import struct
from pathlib import Path

from headwater.model.batch import crc32c
from headwater.storage.segment import write_atomically

__all__ = ["RECOVERY_POINT_FILE", "read_recovery_point", "write_recovery_point"]

RECOVERY_POINT_FILE = "recovery-point"

_MAGIC = b"HWRP"
_VERSION = 1
_LAYOUT = struct.Struct("<4sB16sQ")  # magic, version, store id, log position
_CRC = struct.Struct("<I")


def write_recovery_point(log_dir: Path, store_id: bytes, position: int) -> None:
    """Record that the log is on the disk up to ``position`` (call only after an fsync
    that covered it). Raises StorageError when the file cannot be written."""
    body = _LAYOUT.pack(_MAGIC, _VERSION, store_id, position)
    write_atomically(log_dir / RECOVERY_POINT_FILE, body + _CRC.pack(crc32c(body)))


def read_recovery_point(log_dir: Path, store_id: bytes, report: list[str]) -> int:
    """The recorded point, or 0 (nothing known flushed) when there is none or it cannot
    be trusted; a damaged or foreign file is reported and otherwise ignored (it is only
    ever a shortcut: without it the last segment is checked as a possible torn tail)."""
    path = log_dir / RECOVERY_POINT_FILE
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return 0
    except OSError as e:
        report.append(f"ignored {path.name}: cannot read it ({e.strerror})")
        return 0
    if len(data) != _LAYOUT.size + _CRC.size or crc32c(data[: _LAYOUT.size]) != _CRC.unpack_from(data, _LAYOUT.size)[0]:
        report.append(f"ignored {path.name}: it is damaged (treating the last segment as unflushed)")
        return 0
    magic, version, file_store_id, position = _LAYOUT.unpack_from(data)
    if magic != _MAGIC or version != _VERSION or file_store_id != store_id:
        report.append(f"ignored {path.name}: it belongs to another store or version")
        return 0
    return int(position)
