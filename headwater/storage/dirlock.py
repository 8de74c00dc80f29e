"""A lock on a data directory, so two processes never write one store.

``flock`` on ``<dir>/.lock``: the kernel drops it when the process dies, even by SIGKILL,
so a crashed owner never leaves a stale lock behind. A store opened read-only takes a
shared lock: readers do not exclude each other, and a writer excludes them all.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from headwater.errors import DataDirectoryError, DataDirectoryLockedError

__all__ = ["DirectoryLock"]


class DirectoryLock:
    def __init__(self, directory: Path, *, shared: bool = False) -> None:
        self.path = directory / ".lock"
        self.shared = shared
        self._fd: int | None = None

    def acquire(self) -> None:
        try:
            if self.shared:
                try:
                    fd = os.open(self.path, os.O_RDONLY)
                except FileNotFoundError:  # a copied store: an empty lock file changes no data
                    fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            else:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:  # a read-only file system or folder
            raise DataDirectoryError(
                f"cannot lock {self.path.parent} ({e.strerror}: {self.path}); a data directory "
                f"must be writable, unless opened read-only (read_only=True)"
            ) from e
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if self.shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise DataDirectoryLockedError(
                f"{self.path.parent} is in use by another process (pid {owner}); stop it "
                f"first (one process owns a data directory at a time)"
            ) from None
        if not self.shared:  # the owner's pid, for the message above
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
