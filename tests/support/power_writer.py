"""Child process of the power-loss test: append for a while, journaling what is durable.

Usage: power_writer.py DATA_DIR JOURNAL_DIR SEED FLUSH RUN_S SEGMENT_BYTES

Wraps ``os.fsync``/``os.fdatasync`` and ``os.replace`` before the store is opened, so the
parent can rebuild the disk as a power loss at any moment would leave it:

- ``F <start_ns> <end_ns> <path> <size>``: an fsync of a regular file, with the file's size
  when the fsync *began* (what it is sure to cover), journaled once it returned;
- ``R <ns> <path> <copy>``: a file replaced whole (catalog, index, recovery point): its new
  content is kept in ``JOURNAL_DIR/<copy>``;
- ``A <ns> <partition> <base_offset> <count>``: an acknowledged batch, after ``send_batch``
  returned.

Lines go to ``JOURNAL_DIR/journal`` with single unbuffered writes (the page cache keeps them).
The child appends batches of 1..20 messages (``crashdata.message_for``) to the partitions of
queue ``q`` under the store-wide flush policy FLUSH, for RUN_S seconds, then exits without
closing the store (as a crash would).
"""

from __future__ import annotations

import itertools
import os
import random
import stat
import sys
import time

from crashdata import message_for


def install_journal(journal_dir: str) -> int:
    fd = os.open(os.path.join(journal_dir, "journal"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    real_fsync, real_fdatasync, real_replace = os.fsync, os.fdatasync, os.replace
    copies = itertools.count()

    def journaled(real):
        def sync(f: int) -> None:
            st = os.fstat(f)
            start = time.monotonic_ns()
            real(f)
            if stat.S_ISREG(st.st_mode):
                path = os.readlink(f"/proc/self/fd/{f}")
                os.write(fd, b"F %d %d %s %d\n" % (start, time.monotonic_ns(), path.encode(), st.st_size))

        return sync

    def replace(src, dst, *args, **kwargs) -> None:
        copy = f"replaced-{next(copies)}"
        with open(src, "rb") as f:
            data = f.read()
        with open(os.path.join(journal_dir, copy), "wb") as f:
            f.write(data)
        real_replace(src, dst, *args, **kwargs)
        os.write(fd, b"R %d %s %s\n" % (time.monotonic_ns(), os.path.abspath(dst).encode(), copy.encode()))

    os.fsync, os.fdatasync, os.replace = journaled(real_fsync), journaled(real_fdatasync), replace
    return fd


def main() -> None:
    data, journal_dir, seed, flush = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
    run_s, seg_bytes = float(sys.argv[5]), int(sys.argv[6])
    fd = install_journal(journal_dir)
    import headwater  # after the journal: the store's module-level names see the wrappers

    hw = headwater.open(data, flush=flush, segment_bytes_max=seg_bytes, flush_interval_ms=50)
    info = hw.admin.describe_queue("q")
    nxt = {p.partition: p.end_offset for p in info.partitions}
    rng = random.Random(seed)
    prod = hw.producer(compression=rng.choice([None, "zstd"]))
    deadline = time.monotonic() + run_s
    while time.monotonic() < deadline:
        p = rng.choice(list(nxt))
        k = rng.randint(1, 20)
        ids = prod.send_batch("q", [message_for(p, nxt[p] + i) for i in range(k)], partition=p)
        assert ids[0].offset == nxt[p] and len(ids) == k, (p, nxt[p], ids[0])
        os.write(fd, b"A %d %d %d %d\n" % (time.monotonic_ns(), p, nxt[p], k))
        nxt[p] += k
        time.sleep(rng.random() * 0.004)  # about 1 MB/s: many fsyncs, few segments
    os._exit(0)  # no clean close: the parent's crash points are all before this


if __name__ == "__main__":
    main()
