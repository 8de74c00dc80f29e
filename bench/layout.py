"""Why one commit log per store: the write patterns of the two layouts, measured raw.

Writes the same batches (default 50 KB, round robin over N partitions) either to one
sequential commit log or to one file per partition, with the OS page cache (async flush)
and with an fsync per group of 16 appends (sync flush with group commit: one fdatasync
for the shared log, one per distinct file touched for per-partition logs).

    python -m bench.layout [--partitions 10000] [--batches 20000] [--batch-bytes 51200]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import tempfile
import time

from rich.console import Console
from rich.table import Table


def commit_log(d: str, batches: int, payload: bytes, sync_every: int | None) -> float:
    fd = os.open(os.path.join(d, "log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    t = time.perf_counter()
    for i in range(batches):
        os.write(fd, payload)
        if sync_every and i % sync_every == sync_every - 1:
            os.fdatasync(fd)
    os.fdatasync(fd)
    dt = time.perf_counter() - t
    os.close(fd)
    return dt


def per_partition(
    d: str, partitions: int, batches: int, payload: bytes, sync_every: int | None, fd_cache: int
) -> float:
    fds: dict[int, int] = {}
    touched: set[int] = set()
    t = time.perf_counter()
    for i in range(batches):
        p = i % partitions
        fd = fds.get(p)
        if fd is None:
            if len(fds) >= fd_cache:  # evict the oldest descriptor (insertion order)
                old = next(iter(fds))
                if old in touched:  # its unsynced bytes must reach the disk before it closes
                    os.fdatasync(fds[old])
                    touched.discard(old)
                os.close(fds.pop(old))
            fd = fds[p] = os.open(os.path.join(d, f"p{p}"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.write(fd, payload)
        touched.add(p)
        if sync_every and i % sync_every == sync_every - 1:
            for q in touched:
                os.fdatasync(fds[q])
            touched.clear()
    for q in touched:
        os.fdatasync(fds[q])
    dt = time.perf_counter() - t
    for fd in fds.values():
        os.close(fd)
    return dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--partitions", type=int, default=10_000)
    ap.add_argument("--batches", type=int, default=20_000)
    ap.add_argument("--sync-batches", type=int, default=4_000, help="batches in the fsync cases")
    ap.add_argument("--batch-bytes", type=int, default=50 * 1024)
    args = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    fd_all = min(args.partitions, soft - 64)
    payload = os.urandom(args.batch_bytes)
    rows = []
    for name, fn in [
        ("commit log, page cache", lambda d: commit_log(d, args.batches, payload, None)),
        (
            f"per-partition x{args.partitions}, all fds open ({fd_all}), page cache",
            lambda d: per_partition(d, args.partitions, args.batches, payload, None, fd_all),
        ),
        (
            f"per-partition x{args.partitions}, 1000 fds cached, page cache",
            lambda d: per_partition(d, args.partitions, args.batches, payload, None, 1000),
        ),
        ("commit log, fsync per 16 appends", lambda d: commit_log(d, args.sync_batches, payload, 16)),
        (
            f"per-partition x{args.partitions}, fsync 16 files per 16 appends",
            lambda d: per_partition(d, args.partitions, args.sync_batches, payload, 16, fd_all),
        ),
    ]:
        d = tempfile.mkdtemp(dir="/tmp", prefix="hw-layout-")
        try:
            n = args.sync_batches if "fsync" in name else args.batches
            dt = fn(d)
        finally:
            shutil.rmtree(d)
        rows.append((name, n / dt, n * args.batch_bytes / dt / 1e6))
    t = Table(
        title=f"layouts: {args.batch_bytes} B batches, round robin over {args.partitions} partitions "
        f"(RLIMIT_NOFILE soft={soft})"
    )
    for c in ("layout", "batches/s", "MB/s", "vs commit log"):
        t.add_column(c, justify="right" if c != "layout" else "left")
    base = {False: rows[0][2], True: rows[3][2]}
    for name, bps, mbs in rows:
        t.add_row(name, f"{bps:,.0f}", f"{mbs:,.0f}", f"{mbs / base['fsync' in name]:.2f}x")
    Console().print(t)


if __name__ == "__main__":
    main()
