"""ScheduleFile: one bucket of the delay schedule on disk; and the dispatch checkpoint.

The delay service (headwater.broker.delay) keeps the delayed batches it accepted in one
file per *bucket*, the batches due in ``[bucket_start_ms, bucket_end_ms)`` (QMQ's hourly
schedule logs)::

    DATA/delay/<bucket_start_ms:015d>.sched     schedule records of one bucket
    DATA/delay/dispatch.ckpt                    the dispatch checkpoint (below)

A bucket file is append-only. Its header (64 bytes, integers little-endian)::

    offset size field
     0      8   magic            b"HWSCHED1"
     8      2   version          1
    10      6   reserved
    16      8   bucket_start_ms
    24      8   bucket_end_ms
    32     16   store_id         the store this file belongs to (uuid bytes)
    48      8   created_ms
    56      4   reserved
    60      4   crc              CRC32C of bytes [0, 60)

then records, back to back::

    offset size field
     0      4   length           bytes after this field (52, plus the batch of a SCHEDULE)
     4      4   crc              CRC32C of bytes [8, 4 + length)
     8      1   kind             1 SCHEDULE, 2 DELIVERED, 3 CANCELLED, 4 DROPPED, 5 MOVED,
                                 6 ADOPTED
     9      3   reserved
    12      4   queue_id
    16      4   partition
    20      4   count            SCHEDULE: messages in the batch; CANCELLED: the index of the
                                 cancelled message in its batch; DELIVERED, DROPPED: the index
                                 of the first message of the run they are about (a batch whose
                                 messages are due at several times is delivered run by run);
                                 MOVED, ADOPTED: 0
    24      8   number           number of the batch's first message in this bucket
    32      8   time_ms          SCHEDULE: deliver_at_ms; ADOPTED: the leader epoch from which
                                 it may be delivered; others: when it happened
    40      8   value            SCHEDULE: accepted_ms; DELIVERED: base offset in the partition
    48      8   accept_seq       SCHEDULE: the broker-wide acceptance sequence; ADOPTED: the
                                 delayed offset its producer was given (unsigned); others 0
    56      -   batch            SCHEDULE only: the producer's batch as it arrived

A message number identifies a batch within its bucket (its first message's number); every
later record about the batch (DELIVERED, CANCELLED, DROPPED, MOVED) names it by that number.
On a cluster (docs/design/delay.md, "On a cluster"): MOVED closes every open run of a batch
whose partition moved to another broker, which took the batch; ADOPTED comes right before
the SCHEDULE record of a batch taken from another broker (in the same write, so a SCHEDULE
of an adopted batch never survives without it) and says which id it keeps and from which
leader epoch on it may be delivered.

Thread-safety: a per-file lock guards the descriptor, so ``append``, ``read``, ``sync`` and
``close`` may be called from any thread; the owner serialises appends. Crash policy: the
file may end in a torn record; :meth:`ScheduleFile.scan` finds it by length and checksum
and cuts it (the bytes after the last good record are removed, never read). A record is
written with one ``pwritev``; durability is the owner's ``sync`` (group commit).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import struct
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from headwater.errors import CorruptDataError, StorageError
from headwater.model.batch import FLAG_DELIVER_TIMES, crc32c, decode_deliver_offsets, decode_header
from headwater.storage.segment import fsync_dir, write_atomically

__all__ = [
    "ScheduleFile",
    "ScheduleDirectory",
    "ScheduleRecord",
    "DispatchCheckpoint",
    "SCHEDULE",
    "DELIVERED",
    "CANCELLED",
    "DROPPED",
    "MOVED",
    "ADOPTED",
    "bucket_file_name",
    "encode_file_header",
    "encode_record",
    "read_checkpoint",
    "write_checkpoint",
    "CHECKPOINT_FILE",
]

SCHEDULE, DELIVERED, CANCELLED, DROPPED, MOVED, ADOPTED = 1, 2, 3, 4, 5, 6
_KINDS = (SCHEDULE, DELIVERED, CANCELLED, DROPPED, MOVED, ADOPTED)

_FILE_HEADER = struct.Struct("<8sH6sqq16sq4sI")
FILE_HEADER_SIZE = _FILE_HEADER.size
assert FILE_HEADER_SIZE == 64
_MAGIC = b"HWSCHED1"

_REC = struct.Struct("<IIB3sIIIqqqQ")
REC_HEAD_SIZE = _REC.size
assert REC_HEAD_SIZE == 56
_READ_CHUNK = 4 << 20
_IOV_MAX = 1024  # pwritev refuses more parts (Linux UIO_MAXIOV)
_RECORD_BYTES_MAX = 80 << 20  # a batch is at most 64 MiB

CHECKPOINT_FILE = "dispatch.ckpt"
_CKPT = struct.Struct("<8sqqqI")
_CKPT_MAGIC = b"HWDCKPT1"

log = logging.getLogger("headwater.delay")


def bucket_file_name(bucket_start_ms: int) -> str:
    return f"{bucket_start_ms:015d}.sched"


class ScheduleRecord(NamedTuple):
    """A record as scanned: its fields and where its batch lies in the file."""

    kind: int
    queue_id: int
    partition: int
    count: int  # type: ignore[assignment]  # the record field's name; it shadows tuple.count
    number: int
    time_ms: int
    value: int
    accept_seq: int
    position: int  # of the record in the file
    batch_size: int  # 0 unless SCHEDULE
    producer: tuple[int, int, int] | None  # SCHEDULE: (producer_id, base_sequence, epoch)
    offsets: list[int] | None = None  # SCHEDULE of a batch with several deliver times

    @property
    def batch_position(self) -> int:
        return self.position + REC_HEAD_SIZE


def encode_record(
    kind: int,
    queue_id: int,
    partition: int,
    count: int,
    number: int,
    time_ms: int,
    value: int = 0,
    accept_seq: int = 0,
    batch: bytes | bytearray | memoryview = b"",
) -> list[bytes | bytearray | memoryview]:
    """The parts of one record, ready for :meth:`ScheduleFile.append` (``batch`` is not copied)."""
    head = bytearray(REC_HEAD_SIZE)
    _REC.pack_into(
        head,
        0,
        REC_HEAD_SIZE - 4 + len(batch),
        0,
        kind,
        b"",
        queue_id,
        partition,
        count,
        number,
        time_ms,
        value,
        accept_seq,
    )
    crc = crc32c(memoryview(head)[8:])
    if batch:
        crc = crc32c(batch, crc)
    struct.pack_into("<I", head, 4, crc)
    return [head, batch] if batch else [head]


def encode_file_header(bucket_start_ms: int, bucket_end_ms: int, store_id: bytes, created_ms: int) -> bytes:
    """The 64 bytes a bucket file opens with."""
    head = bytearray(_FILE_HEADER.pack(_MAGIC, 1, b"", bucket_start_ms, bucket_end_ms, store_id, created_ms, b"", 0))
    struct.pack_into("<I", head, 60, crc32c(head[:60]))
    return bytes(head)


class ScheduleFile:
    """One bucket file: appends go to its end, reads go anywhere."""

    def __init__(self, path: Path, bucket_start_ms: int, bucket_end_ms: int, size: int) -> None:
        self.path = path
        self.bucket_start_ms = bucket_start_ms
        self.bucket_end_ms = bucket_end_ms
        self.size = size
        self.unsynced = False
        self.deleted = False
        self._fd: int | None = None
        self._open_flags = os.O_RDWR  # O_RDONLY in a store opened read-only
        self._lock = threading.Lock()

    @classmethod
    def create(
        cls, directory: Path, bucket_start_ms: int, bucket_end_ms: int, store_id: bytes, created_ms: int
    ) -> ScheduleFile:
        path = directory / bucket_file_name(bucket_start_ms)
        head = encode_file_header(bucket_start_ms, bucket_end_ms, store_id, created_ms)
        tmp = path.with_name(path.name + ".tmp")
        fd = None
        try:
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
            if os.write(fd, head) != len(head):
                raise OSError(errno.ENOSPC, "short write of the schedule file's header")
            os.fsync(fd)
            os.replace(tmp, path)  # a crash never leaves a file without its header
            fsync_dir(directory)
        except OSError as e:
            if fd is not None:
                os.close(fd)
            with contextlib.suppress(OSError):
                tmp.unlink()  # a full disk: give its space back now, not at the next open
            raise StorageError(f"cannot create schedule file {path}: {e}") from e
        f = cls(path, bucket_start_ms, bucket_end_ms, FILE_HEADER_SIZE)
        f._fd = fd
        return f

    @classmethod
    def open(cls, path: Path, store_id: bytes, *, writable: bool = True) -> ScheduleFile:
        """Open an existing file and check its header (records are checked by :meth:`scan`);
        ``writable=False``: a read-only descriptor, so nothing can write through it."""
        flags = os.O_RDWR if writable else os.O_RDONLY
        try:
            fd = os.open(path, flags)
        except OSError as e:
            raise StorageError(f"cannot open schedule file {path}: {e}") from e
        try:
            size = os.fstat(fd).st_size
            head = os.pread(fd, FILE_HEADER_SIZE, 0)
            if len(head) < FILE_HEADER_SIZE:
                raise CorruptDataError(f"schedule file {path} is shorter than its header")
            magic, version, _, start, end, sid, _, _, crc = _FILE_HEADER.unpack(head)
            if magic != _MAGIC or crc32c(head[:60]) != crc:
                raise CorruptDataError(f"schedule file {path} has a damaged header")
            if version != 1:
                raise CorruptDataError(f"schedule file {path} has unknown version {version}")
            if sid != store_id:
                raise CorruptDataError(f"schedule file {path} belongs to another store")
            if path.name != bucket_file_name(start) or end <= start:
                raise CorruptDataError(f"schedule file {path} says its bucket is [{start}, {end})")
        except BaseException:
            os.close(fd)
            raise
        f = cls(path, start, end, size)
        f._fd = fd
        f._open_flags = flags
        return f

    # -- descriptor ---------------------------------------------------------------------

    def _fd_locked(self) -> int:
        if self._fd is None:
            if self.deleted:
                raise StorageError(f"schedule file {self.path} was deleted")
            try:
                self._fd = os.open(self.path, self._open_flags)
            except OSError as e:
                raise StorageError(f"cannot open schedule file {self.path}: {e}") from e
        return self._fd

    @property
    def is_open(self) -> bool:
        return self._fd is not None

    def close(self) -> None:
        """Close the descriptor (fsyncing first what was written since the last sync)."""
        with self._lock:
            if self._fd is not None:
                if self.unsynced:
                    os.fdatasync(self._fd)
                    self.unsynced = False
                os.close(self._fd)
                self._fd = None

    def delete(self) -> None:
        with self._lock:
            self.deleted = True
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()

    # -- I/O --------------------------------------------------------------------------

    def append(self, parts: list[bytes | bytearray | memoryview]) -> int:
        """Write the parts at the end; return the position where they start."""
        with self._lock:
            fd = self._fd_locked()
            pos = self.size
            total = sum(len(p) for p in parts)
            if len(parts) > _IOV_MAX:
                parts = [b"".join(parts)]
            try:
                written = os.pwritev(fd, parts, pos)
                while written < total:  # rare: a short write; finish it from where it stopped
                    rest = b"".join(bytes(p) for p in parts)[written:]
                    written += os.pwrite(fd, rest, pos + written)
            except OSError as e:
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, pos)
                raise StorageError(f"cannot write to {self.path}: {e}") from e
            self.size = pos + total
            self.unsynced = True
            return pos

    def read(self, position: int, length: int) -> bytes:
        with self._lock:
            fd = self._fd_locked()
            try:
                data = os.pread(fd, length, position)
            except OSError as e:
                raise StorageError(f"cannot read {self.path}: {e}") from e
        if len(data) != length:
            raise CorruptDataError(f"{self.path} ends before byte {position + length}")
        return data

    def sync(self) -> None:
        with self._lock:
            if self._fd is None or not self.unsynced:
                return
            self.unsynced = False
            try:
                os.fdatasync(self._fd)
            except OSError as e:
                self.unsynced = True
                raise StorageError(f"cannot fsync {self.path}: {e}") from e

    def scan(
        self,
        *,
        start: int = FILE_HEADER_SIZE,
        end: int | None = None,
        cut: bool = True,
        problems: list[str] | None = None,
    ) -> Iterator[ScheduleRecord]:
        """Every good record in ``[start, end)`` (``end``: the size now), in file order.

        At the first torn or damaged record the scan stops; with ``cut`` the file is cut
        there (fsynced) and what was cut is added to ``problems``.
        """
        pos = start
        buf = b""
        buf_at = start  # file position of buf[0]
        end = self.size if end is None else end
        problem = None
        while pos < end:
            need = pos + REC_HEAD_SIZE - buf_at
            if need > len(buf):
                buf, buf_at = self._refill(buf, buf_at, pos, REC_HEAD_SIZE, end)
            rel = pos - buf_at
            if len(buf) - rel < REC_HEAD_SIZE:
                problem = f"a torn record at byte {pos} of {end}"
                break
            length, crc, kind, _, qid, part, count, number, time_ms, value, seq = _REC.unpack_from(buf, rel)
            total = 4 + length
            if (
                kind not in _KINDS
                or length < REC_HEAD_SIZE - 4
                or total > _RECORD_BYTES_MAX
                or (kind != SCHEDULE and total != REC_HEAD_SIZE)
            ):
                problem = f"a damaged record at byte {pos} of {end}"
                break
            if pos + total > end:
                problem = f"a torn record at byte {pos} of {end} ({total} bytes, {end - pos} present)"
                break
            if total > len(buf) - rel:
                buf, buf_at = self._refill(buf, buf_at, pos, total, end)
                rel = pos - buf_at
            with memoryview(buf) as mv:
                if crc32c(mv[rel + 8 : rel + total]) != crc:
                    problem = f"a record with a bad checksum at byte {pos} of {end}"
                    break
            producer = offsets = None
            if kind == SCHEDULE:
                b = rel + REC_HEAD_SIZE
                producer = struct.unpack_from("<qih", buf, b + 64) if total - REC_HEAD_SIZE >= 96 else (-1, -1, -1)
                if total - REC_HEAD_SIZE >= 96 and buf[b + 45] & FLAG_DELIVER_TIMES:
                    with memoryview(buf) as mv:  # checked when accepted; the checksum held since
                        offsets = decode_deliver_offsets(mv[b : rel + total], decode_header(mv, b))
            yield ScheduleRecord(
                kind, qid, part, count, number, time_ms, value, seq, pos, total - REC_HEAD_SIZE, producer, offsets
            )
            pos += total
        if problem is not None and cut:
            lost = self.size - pos
            self._cut(pos)
            if problems is not None:
                problems.append(f"cut {lost} bytes from {self.path.name}: {problem}")

    def _cut(self, size: int) -> None:
        """Cut the file to ``size`` bytes, durably (a torn tail found by :meth:`scan`)."""
        with self._lock:
            fd = self._fd_locked()
            os.ftruncate(fd, size)
            os.fsync(fd)
            self.size = size

    def _refill(self, buf: bytes, buf_at: int, pos: int, need: int, end: int) -> tuple[bytes, int]:
        """A buffer starting at ``pos`` holding at least ``need`` bytes (or up to ``end``)."""
        keep = buf[pos - buf_at :] if pos - buf_at < len(buf) else b""
        want = min(max(need, _READ_CHUNK), end - pos) - len(keep)
        if want > 0:
            keep = keep + self.read(pos + len(keep), want)
        return keep, pos


class ScheduleDirectory:
    """The delay schedule of a data directory: ``DATA/delay/`` (a
    :class:`~headwater.storage.api.ScheduleStore`)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def exists(self) -> bool:
        return self.path.exists()

    def prepare(self) -> None:
        self.path.mkdir(exist_ok=True)
        fsync_dir(self.path.parent)

    def open_buckets(self, store_id: bytes, report: list[str], *, read_only: bool = False) -> Iterator[ScheduleFile]:
        """Every bucket file, checked; ``read_only`` changes no file (a damaged one is
        reported and skipped, not set aside)."""
        for stray in [] if read_only else self.path.glob("*.tmp"):  # a bucket or checkpoint a crash left half made
            stray.unlink()
        for path in sorted(self.path.glob("*.sched")):
            try:
                f = ScheduleFile.open(path, store_id, writable=not read_only)
            except CorruptDataError as e:
                if read_only:
                    report.append(f"skipped {path.name}: {e}; opened read-only, nothing was changed")
                    continue
                path.rename(path.with_name(path.name + ".damaged"))
                report.append(f"set aside {path.name}: {e}")
                log.error("set aside %s: %s", path.name, e)
                continue
            yield f

    def create_bucket(self, start_ms: int, end_ms: int, store_id: bytes, created_ms: int) -> ScheduleFile:
        return ScheduleFile.create(self.path, start_ms, end_ms, store_id, created_ms)

    def read_checkpoint(self) -> DispatchCheckpoint | None:
        return read_checkpoint(self.path / CHECKPOINT_FILE)

    def write_checkpoint(self, ckpt: DispatchCheckpoint) -> None:
        write_checkpoint(self.path / CHECKPOINT_FILE, ckpt)

    def sync_deletes(self) -> None:
        fsync_dir(self.path)


# -- the dispatch checkpoint ------------------------------------------------------------


class DispatchCheckpoint(NamedTuple):
    """What the delay service persists besides the bucket files.

    ``log_position``: every batch the service appended to the log before this position has
    its DELIVERED record durable in its bucket file, so a recovery reads the log's batch
    headers only from here. ``floor_ms``: buckets ending at or before it may have been
    deleted; a batch due earlier is filed in the bucket starting at the floor, so a bucket
    file (and its message numbers) is never created twice. ``accept_seq`` and
    ``producers``: the idempotence table of delayed batches as of that acceptance.
    """

    log_position: int
    floor_ms: int
    accept_seq: int
    producers: bytes


def write_checkpoint(path: Path, ckpt: DispatchCheckpoint) -> None:
    body = (
        _CKPT.pack(_CKPT_MAGIC, ckpt.log_position, ckpt.floor_ms, ckpt.accept_seq, len(ckpt.producers)) + ckpt.producers
    )
    data = body + struct.pack("<I", crc32c(body))
    try:
        write_atomically(path, data)
    except OSError as e:
        raise StorageError(f"cannot write {path}: {e}") from e


def read_checkpoint(path: Path) -> DispatchCheckpoint | None:
    """The checkpoint, or None if there is none yet; raises CorruptDataError if damaged."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    if len(data) < _CKPT.size + 4 or struct.unpack_from("<I", data, len(data) - 4)[0] != crc32c(data[:-4]):
        raise CorruptDataError(f"the dispatch checkpoint {path} is damaged")
    magic, position, floor, seq, n = _CKPT.unpack_from(data)
    if magic != _CKPT_MAGIC or _CKPT.size + n + 4 != len(data):
        raise CorruptDataError(f"the dispatch checkpoint {path} is damaged")
    return DispatchCheckpoint(position, floor, seq, data[_CKPT.size : _CKPT.size + n])
