"""A lock on a data directory, so two processes never write one store.

``flock`` on ``<dir>/.lock``: the kernel drops it when the process dies, even by SIGKILL,
so a crashed owner never leaves a stale lock behind. A store opened read-only takes a
shared lock: readers do not exclude each other, and a writer excludes them all. A reader
of a store without a lock file on a read-only file system (a copy restored without it)
takes none: no process can write there.
"""

from __future__ import annotations

import errno
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
                    try:
                        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
                    except OSError as e:
                        if e.errno != errno.EROFS:
                            raise
                        # a read-only file system (a backup mounted read-only, say): nobody can
                        # write the store there, so a reader has no writer to keep out
                        return
            else:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:  # a read-only file system or folder
            raise DataDirectoryError(
                f"cannot lock {self.path.parent} ({e.strerror}: {self.path}); a data directory "
                f"must be writable, unless opened read-only (headwater.open(DIR, read_only=True); "
                f"'headwater serve --set read_only=true'; the CLI's reading commands do)"
            ) from e
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if self.shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except BlockingIOError:
            message = self._refusal(fd)
            os.close(fd)
            raise DataDirectoryLockedError(message) from None
        if not self.shared:  # the owner's pid, for the message above
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def _refusal(self, fd: int) -> str:
        """Why the lock was refused, naming who holds it. The kernel's table of locks says
        who does; the pid in the file is only the last process that opened the store for
        writing, which a reader's lock does not replace (readers write nothing)."""
        holders = _holders(fd)
        if any(pid == os.getpid() for pid, _ in holders):
            return (
                f"{self.path.parent} is in use in this process already (pid {os.getpid()}); close that "
                f"store first, or use it (one process owns a data directory at a time)"
            )
        if holders:
            who = "; ".join(
                f"pid {pid}{_command(pid)}, which has it open {'read-only' if shared else 'for writing'}"
                for pid, shared in holders
            )
        else:  # no /proc/locks (not Linux): the last writer's pid is all there is
            who = "pid " + (os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown")
        return (
            f"{self.path.parent} is in use by another process ({who}); stop it first, or, if it "
            f"is a broker, send the command to it with --server HOST:PORT "
            f"(one process owns a data directory at a time)"
        )


def _holders(fd: int) -> list[tuple[int, bool]]:
    """(pid, shared) of each flock held on the file open as ``fd``, from ``/proc/locks``;
    empty where there is no such table. Matched by inode, and by device where the table's
    device agrees with ``fstat``'s (btrfs reports another device to ``stat``)."""
    st = os.fstat(fd)
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    on_inode: list[tuple[str, int, bool]] = []
    for line in lines:
        parts = line.split()
        # "1: FLOCK  ADVISORY  WRITE 4242 fe:00:2164057 0 EOF"; a waiter's line has "->"
        if len(parts) < 6 or parts[1] != "FLOCK" or not parts[4].isdigit():
            continue
        device, _, inode = parts[5].rpartition(":")
        if inode == str(st.st_ino) and int(parts[4]) > 0:
            on_inode.append((device, int(parts[4]), parts[3] == "READ"))
    here = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}"
    same_device = [(pid, shared) for device, pid, shared in on_inode if device == here]
    return same_device or [(pid, shared) for _, pid, shared in on_inode]


def _command(pid: int) -> str:
    """`` (<command line>)`` of a process, shortened, or nothing when it cannot be read."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().rstrip(b"\0").split(b"\0")
    except OSError:
        return ""
    text = " ".join(a.decode(errors="replace") for a in argv if a)
    if len(text) > 120:
        text = text[:117] + "..."
    return f" ({text})" if text else ""
