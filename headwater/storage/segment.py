"""LogSegment: one file of the store's commit log.

Every queue and partition of a store appends to one sequential commit log (as RocketMQ
does), cut into segment files named by the global position of their first byte. Layout::

    offset size field
     0      8   magic          b"HWLOG001"
     8      2   version        1
    10      2   reserved
    12      4   reserved
    16      8   base_position  global position of byte 0 of this file
    24      8   created_ms
    32     16   store_id       the store this segment belongs to (uuid bytes)
    48     12   reserved
    60      4   crc            CRC32C of bytes [0, 60)
    64      -   record batches, back to back (see headwater.model.batch)

A batch's *position* is ``base_position + its byte offset in the file``; positions grow
across segments, so they order every batch of the store.

Thread-safety: ``append``, ``truncate`` and ``sync`` are called under the store's lock;
``read`` (pread) is safe from any thread while the segment holds an open descriptor, which
callers guarantee with ``reading()``; ``drop_cached`` from any thread (it counts as a
reader, and skips a closed file). Crash policy: the file may end in a torn batch; the
loader finds it by checksum and cuts it (see headwater.storage.loader).
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from headwater.errors import CorruptDataError, StorageError
from headwater.model.batch import crc32c

__all__ = ["LogSegment", "SEGMENT_HEADER_SIZE", "segment_name", "fsync_dir", "write_atomically"]

FREE_CHUNK_BYTES = 8 << 20  # freed at a time when a deleted segment is let go
FREE_PAUSE_S = 0.002  # between two chunks: lets the file system's journal commit others' fsyncs
_PAGE_BYTES = mmap.PAGESIZE


def free_gently(fd: int, chunk_bytes: int = FREE_CHUNK_BYTES, pause_s: float = FREE_PAUSE_S) -> None:
    """Free an unlinked file's blocks by truncating it from the end a chunk at a time."""
    try:
        size = os.fstat(fd).st_size
        while size > chunk_bytes:
            size -= chunk_bytes
            os.ftruncate(fd, size)
            time.sleep(pause_s)
        os.ftruncate(fd, 0)
    except OSError:
        pass  # closing the descriptor frees the rest at once


def _free_and_close(fd: int) -> None:
    try:
        free_gently(fd)
    finally:
        os.close(fd)


_HEADER = struct.Struct("<8sHHIQq16s12sI")
SEGMENT_HEADER_SIZE = _HEADER.size
assert SEGMENT_HEADER_SIZE == 64
_MAGIC = b"HWLOG001"


def segment_name(base_position: int, suffix: str) -> str:
    return f"{base_position:020d}{suffix}"


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` so that a crash leaves the old file or the new one,
    never a mix: write ``<name>.tmp``, fsync it, rename it over ``path``, fsync the folder.
    (Opening a store removes stray ``*.tmp`` files.)
    A failure (a full disk) raises StorageError naming the file and removes the temp file,
    so the space it took comes back and the old file stays in place."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise StorageError(f"cannot write {path}: {e}") from e
    try:
        fsync_dir(path.parent)
    except OSError as e:
        raise StorageError(f"cannot fsync the folder of {path}: {e}") from e


class LogSegment:
    """A segment file: appends go to its end, reads go anywhere by position."""

    def __init__(self, path: Path, base_position: int, size: int) -> None:
        self.path = path
        self.base_position = base_position
        self.size = size  # bytes in the file, header included
        self._fd: int | None = None
        self._open_flags = os.O_RDWR  # O_RDONLY for a store opened read-only
        self._readers = 0
        self._lock = threading.Lock()
        self.deleted = False

    # -- life cycle -------------------------------------------------------------------

    @classmethod
    def create(cls, path: Path, base_position: int, store_id: bytes, created_ms: int) -> LogSegment:
        head = _HEADER.pack(_MAGIC, 1, 0, 0, base_position, created_ms, store_id, b"", 0)
        head = head[:60] + struct.pack("<I", crc32c(head[:60]))
        # A failure (a full disk) removes the file again: left behind, it would make every
        # later roll fail on the existing name, and no append could ever succeed again.
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        except OSError as e:
            raise StorageError(f"cannot create segment {path}: {e}") from e
        try:
            if os.write(fd, head) != len(head):
                raise OSError(errno.ENOSPC, "short write of the segment header")
            os.fsync(fd)
            fsync_dir(path.parent)
        except OSError as e:
            os.close(fd)
            with contextlib.suppress(OSError):
                path.unlink()
            raise StorageError(f"cannot create segment {path}: {e}") from e
        seg = cls(path, base_position, SEGMENT_HEADER_SIZE)
        seg._fd = fd
        return seg

    @classmethod
    def open(cls, path: Path, store_id: bytes, *, writable: bool = True) -> LogSegment:
        """Open an existing segment and check its header (``writable=False``: a read-only
        descriptor, so that nothing can write through it)."""
        flags = os.O_RDWR if writable else os.O_RDONLY
        try:
            fd = os.open(path, flags)
        except OSError as e:
            raise StorageError(f"cannot open segment {path}: {e}") from e
        size = os.fstat(fd).st_size
        head = os.pread(fd, SEGMENT_HEADER_SIZE, 0)
        if len(head) < SEGMENT_HEADER_SIZE:
            os.close(fd)
            raise CorruptDataError(f"segment {path} is shorter than its header ({size} bytes)")
        magic, version, _, _, base, _, sid, _, crc = _HEADER.unpack(head)
        if magic != _MAGIC or crc32c(head[:60]) != crc:
            os.close(fd)
            raise CorruptDataError(f"segment {path} has a damaged header")
        if version != 1:
            os.close(fd)
            raise CorruptDataError(f"segment {path} has unknown version {version}")
        if sid != store_id:
            os.close(fd)
            raise CorruptDataError(f"segment {path} belongs to another store")
        expected = int(path.name.split(".")[0])
        if base != expected:
            os.close(fd)
            raise CorruptDataError(f"segment {path} says its base is {base}, its name {expected}")
        seg = cls(path, base, size)
        seg._fd = fd
        seg._open_flags = flags
        return seg

    @property
    def end_position(self) -> int:
        return self.base_position + self.size

    @property
    def data_bytes(self) -> int:
        return self.size - SEGMENT_HEADER_SIZE

    def _ensure_open(self) -> int:
        if self._fd is None:
            if self.deleted:
                raise StorageError(f"segment {self.path} was deleted")
            self._fd = os.open(self.path, self._open_flags)
        return self._fd

    @property
    def is_open(self) -> bool:
        return self._fd is not None

    def close_if_idle(self) -> bool:
        """Close the descriptor unless a reader holds it; True when closed (or already)."""
        with self._lock:
            if self._readers:
                return False
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
            return True

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def delete(self) -> None:
        """Unlink the file; the descriptor closes when the last reader lets go.

        The file's blocks are then freed a few MiB at a time (``free_gently``): at once when
        nobody reads it, else by a thread of its own when the last reader lets go. Freeing a
        large file at once stalls every fsync on the file system for tens of
        milliseconds (ext4 with discard: one 1 GiB unlink, 28 ms), which sync-flush appends
        would wait for."""
        fd = None
        with self._lock:
            self.deleted = True
            if self._readers == 0:
                fd, self._fd = self._fd, None
                if fd is None:
                    with contextlib.suppress(OSError):
                        fd = os.open(self.path, os.O_RDWR)
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
        if fd is not None:
            _free_and_close(fd)

    @contextlib.contextmanager
    def reading(self) -> Iterator[LogSegment]:
        with self._lock:
            self._ensure_open()
            self._readers += 1
        try:
            yield self
        finally:
            self._let_go()

    def _let_go(self) -> None:
        """A reader is done; the last one out of a deleted segment frees it, as delete()
        would, off this thread."""
        fd = None
        with self._lock:
            self._readers -= 1
            if self.deleted and self._readers == 0 and self._fd is not None:
                fd, self._fd = self._fd, None
        if fd is not None:
            threading.Thread(target=_free_and_close, args=(fd,), name="headwater-free-segment", daemon=True).start()

    # -- I/O --------------------------------------------------------------------------

    def append(self, parts: list[bytes | bytearray | memoryview]) -> int:
        """Write the parts at the end; return the global position where they start."""
        fd = self._fd if self._fd is not None else self._ensure_open()
        pos = self.base_position + self.size
        total = sum(map(len, parts))
        try:
            written = os.pwritev(fd, parts, self.size)
            while written < total:  # rare: a short write; finish it from where it stopped
                rest = b"".join(bytes(p) for p in parts)[written:]
                written += os.pwrite(fd, rest, self.size + written)
        except OSError as e:
            # leave no half batch behind: cut back to where this append began
            with contextlib.suppress(OSError):
                os.ftruncate(fd, self.size)
            raise StorageError(f"cannot write to {self.path}: {e}") from e
        self.size += total
        return pos

    def read(self, position: int, length: int) -> bytes:
        """Read ``length`` bytes at global ``position`` (call inside ``reading()``)."""
        fd = self._fd
        assert fd is not None, "read() outside reading()"
        try:
            data = os.pread(fd, length, position - self.base_position)
        except OSError as e:
            raise StorageError(f"cannot read {self.path}: {e}") from e
        if len(data) != length:
            raise CorruptDataError(
                f"{self.path} ends before position {position + length} (file shorter than its index)"
            )
        return data

    def sync(self) -> None:
        fd = self._ensure_open()
        try:
            os.fdatasync(fd)
        except OSError as e:
            raise StorageError(f"cannot fsync {self.path}: {e}") from e

    def drop_cached(self, start: int, end: int) -> None:
        """Advise the kernel to drop global positions [start, end) from the page cache.

        For durable bytes only: everything before ``end`` must be fsynced, since the page
        holding ``start`` is included whole (a page partly covered at ``end`` stays, for the
        next call to take). Later reads of these bytes go to the disk. A hint: skipped when
        the file is closed or the platform has no ``posix_fadvise``."""
        if not hasattr(os, "posix_fadvise"):
            return
        first = (start - self.base_position) // _PAGE_BYTES * _PAGE_BYTES
        with self._lock:  # held as a reader, not under the lock: readers never wait for the kernel
            if self._fd is None or self.deleted:
                return
            fd = self._fd
            self._readers += 1
        try:
            with contextlib.suppress(OSError):
                os.posix_fadvise(fd, first, end - self.base_position - first, os.POSIX_FADV_DONTNEED)
        finally:
            self._let_go()

    def truncate(self, position: int) -> None:
        """Cut the file at global ``position`` (the first byte not kept)."""
        fd = self._ensure_open()
        keep = position - self.base_position
        assert SEGMENT_HEADER_SIZE <= keep <= self.size
        os.ftruncate(fd, keep)
        os.fsync(fd)
        self.size = keep
