"""The store lets the OS page cache drop its fsynced log beyond ``page_cache_keep_bytes``.

Checked twice: with the kernel's own answer (``mincore`` on the segment files: which pages
are resident), and by recording the advice given, across segment rolls.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import time
from pathlib import Path

import pytest

from headwater.errors import InvalidArgumentError
from headwater.model.batch import encode_batch
from headwater.model.batch_reads import decode_records
from headwater.model.config import QueueConfig
from headwater.storage import LogStore, StoreConfig
from headwater.storage import segment as segment_module

MIB = 1024 * 1024
PAGE = mmap.PAGESIZE
CHUNK = 8 * MIB  # the store lets go of this much at a time, or more

pytestmark = pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="no posix_fadvise on this platform")


def resident_pages(path: Path) -> list[bool]:
    """Which pages of the file the page cache holds (mincore(2) over a mapping of it)."""
    size = path.stat().st_size
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    with path.open("rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY) as m:
        pages = (size + PAGE - 1) // PAGE
        vec = (ctypes.c_ubyte * pages)()
        # the c_char view is a temporary: its export of the mapping ends before the mapping closes
        addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
        if libc.mincore(ctypes.c_void_p(addr), ctypes.c_size_t(size), vec) != 0:
            raise OSError(ctypes.get_errno(), "mincore failed")
        return [bool(v & 1) for v in vec]


def page_cache_can_drop(directory: Path) -> bool:
    """False on file systems that cannot drop clean pages on advice (tmpfs keeps them)."""
    probe = directory / "probe"
    fd = os.open(probe, os.O_CREAT | os.O_RDWR)
    try:
        os.write(fd, os.urandom(MIB))
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, MIB, os.POSIX_FADV_DONTNEED)
        return not any(resident_pages(probe))
    finally:
        os.close(fd)
        probe.unlink()


def let_go(store: LogStore, keep: int) -> None:
    """Wait for the flusher thread to let go of the page cache behind the head, as it does
    after every ``flush_bytes`` written and on its interval."""
    deadline = time.monotonic() + 10
    while store._uncached_upto < store.end_position - keep - CHUNK and time.monotonic() < deadline:
        time.sleep(0.01)


def batch(i: int, size: int = 512 * 1024) -> bytes:
    return encode_batch([bytes([i % 256]) * 1024] * (size // 1030))


def test_the_fsynced_log_beyond_the_window_leaves_the_page_cache(tmp_path):
    if not page_cache_can_drop(tmp_path):
        pytest.skip("this file system keeps clean pages on POSIX_FADV_DONTNEED (tmpfs?)")
    cfg = StoreConfig(flush="sync", page_cache_keep_bytes=2 * MIB, segment_bytes_max=6 * MIB)
    store = LogStore(tmp_path / "d", cfg)
    store.create_queue("q", QueueConfig())
    for i in range(60):  # about 30 MiB over five or six segments, each append fsynced
        store.append("q", 0, batch(i))
    let_go(store, 2 * MIB)
    segs = sorted((tmp_path / "d" / "log").glob("*.log"))
    assert len(segs) >= 5
    end = store.end_position
    resident = {int(p.name.split(".")[0]): resident_pages(p) for p in segs}
    behind = [  # pages behind the window and the last drop: (position, still cached)
        (base + n * PAGE, r)
        for base, pages in resident.items()
        for n, r in enumerate(pages)
        if base + (n + 1) * PAGE <= end - 2 * MIB - CHUNK
    ]
    assert len(behind) > 2000, len(behind)
    # the advice is a hint: the kernel keeps a page it cannot drop at that moment (one it
    # still holds in another CPU's batch of new pages, or one a neighbour's readahead just
    # brought back, say). Under the whole suite one page of about 5,000 stayed once, and
    # six (a run of four and a run of two) another time; without the advice all of them do.
    # One in a hundred tells the two apart without counting on a quiet machine (the
    # advice's ranges are checked exactly in the next test)
    stayed = [pos for pos, r in behind if r]
    assert len(stayed) <= len(behind) // 100, f"pages at positions {stayed[:10]} of {end} still cached"
    newest = resident[max(resident)]
    assert all(newest[-(MIB // PAGE) :]), "the newest MiB was dropped: it is inside the window"
    # nothing read differently: every message is back, in order, from the disk this time
    got, offset = [], 0
    while offset < store.end_offset("q", 0):
        res = store.fetch("q", 0, offset, max_bytes=4 * MIB)
        for b in res.batches:
            got.extend(r.body[0] for r in decode_records(b, "q"))
        offset = res.next_offset
    assert got == [i % 256 for i in range(60) for _ in range(512 * 1024 // 1030)]
    store.close()


def test_the_advice_covers_durable_ranges_of_each_segment_once(tmp_path, monkeypatch):
    calls: list[tuple[str, int, int]] = []
    real = os.posix_fadvise

    def record(fd, offset, length, advice):
        assert advice == os.POSIX_FADV_DONTNEED
        calls.append((os.readlink(f"/proc/self/fd/{fd}"), offset, length))
        real(fd, offset, length, advice)

    monkeypatch.setattr(segment_module.os, "posix_fadvise", record)
    cfg = StoreConfig(flush="sync", page_cache_keep_bytes=4 * MIB, segment_bytes_max=5 * MIB)
    store = LogStore(tmp_path / "d", cfg)
    store.create_queue("q", QueueConfig())
    for i in range(80):
        store.append("q", 0, batch(i, 256 * 1024))
    let_go(store, 4 * MIB)
    end = store.end_position
    assert calls, "nothing was let go of after 20 MiB with a 4 MiB window"
    ranges = []
    for path, offset, length in calls:
        base = int(Path(path).name.split(".")[0])
        assert length > 0 and offset >= 0 and base + offset + length <= Path(path).stat().st_size + base
        ranges.append((base + offset, base + offset + length))
    ranges.sort()
    # each range starts at the page holding the previous one's end: no gap, no more overlap
    assert all(0 <= a[1] - b[0] < PAGE for a, b in zip(ranges, ranges[1:])), f"gaps or overlaps: {ranges}"
    assert ranges[-1][1] <= end - 4 * MIB, "advice reached into the newest page_cache_keep_bytes"
    assert ranges[-1][1] >= end - 4 * MIB - CHUNK, "advice fell behind by more than a chunk"
    # what status shows: the log let go of since the store opened (from the first header's end)
    assert ranges[-1][1] - PAGE < store.stats()["uncached_bytes"] <= ranges[-1][1]
    store.close()


def test_zero_leaves_the_page_cache_to_the_kernel(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(segment_module.os, "posix_fadvise", lambda *a: calls.append(a))
    store = LogStore(tmp_path / "d", StoreConfig(flush="sync", page_cache_keep_bytes=0))
    store.create_queue("q", QueueConfig())
    for i in range(40):
        store.append("q", 0, batch(i))
    time.sleep(0.5)  # two of the flusher's intervals
    store.close()
    assert calls == []


@pytest.mark.parametrize("value", [1000, -1, 2**41])
def test_page_cache_keep_bytes_is_checked(tmp_path, value):
    with pytest.raises(InvalidArgumentError, match="page_cache_keep_bytes"):
        LogStore(tmp_path / "d", StoreConfig(page_cache_keep_bytes=value))
