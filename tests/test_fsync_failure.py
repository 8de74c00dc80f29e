"""A failed fsync is final: the store acknowledges nothing after it until it is opened again.

Linux reports a write-back error to one fsync and marks the pages clean, so a later fsync can
succeed although the bytes never reached the disk (PostgreSQL's "fsyncgate"). An fsync error
cannot be made on demand here (a loop device on a full tmpfs drops writes without one), so
these tests make ``LogSegment.sync`` fail: everything around it is the real store on real files.
"""

from __future__ import annotations

import threading

import pytest

import headwater
from headwater.errors import StorageError
from headwater.storage.flusher import GroupCommit
from headwater.storage.loader import FSYNC_FAILED_FILE
from headwater.storage.segment import LogSegment

REFUSED = "acknowledges nothing more since an fsync failed"


@pytest.fixture
def failing_fsync(monkeypatch):
    """``fail()`` makes the next fsync of a segment raise, as a disk's write-back error would."""
    real = LogSegment.sync
    armed = threading.Event()

    def sync(self: LogSegment) -> None:
        if armed.is_set():
            armed.clear()
            raise StorageError(f"cannot fsync {self.path}: [Errno 5] Input/output error (injected)")
        real(self)

    monkeypatch.setattr(LogSegment, "sync", sync)
    return armed.set


def test_group_commit_refuses_every_wait_after_a_failed_fsync():
    told = []
    calls = {"n": 0}

    def sync_fn() -> int:
        calls["n"] += 1
        if calls["n"] == 1:
            raise StorageError("cannot fsync: injected")
        return 100

    gc = GroupCommit(sync_fn, on_fail=told.append)
    with pytest.raises(StorageError, match="injected"):
        gc.wait_durable(10)
    for _ in range(2):
        with pytest.raises(StorageError, match=REFUSED):
            gc.wait_durable(10)  # the next fsync would "succeed": it is not asked
    gc.sync_now()  # the async flusher's tick: nothing, quietly
    assert calls["n"] == 1 and len(told) == 1


def test_sync_flush_appends_nothing_after_a_failed_fsync_and_the_next_open_reads_the_tail_from_disk(
    tmp_path, failing_fsync
):
    data = tmp_path / "data"
    hw = headwater.open(data, flush="sync")
    hw.admin.create_queue("q")
    p = hw.producer()
    before = p.send_and_wait("q", b"acknowledged")
    failing_fsync()
    with pytest.raises(StorageError, match="Input/output error"):
        p.send_and_wait("q", b"its fsync failed")
    with pytest.raises(StorageError, match=REFUSED):
        p.send_and_wait("q", b"after")  # the fsync would succeed now; it must not be trusted
    assert (data / "log" / FSYNC_FAILED_FILE).exists()
    assert hw.get(before).body == b"acknowledged"  # reads still work
    with pytest.raises(StorageError, match=REFUSED):
        hw.close()  # what was written since the failure was never made durable
    hw = headwater.open(data, flush="sync")
    try:
        assert any("an fsync failed in the last run" in line for line in hw.service.store.recovery_report)
        assert not (data / "log" / FSYNC_FAILED_FILE).exists()
        assert hw.get(before).body == b"acknowledged"
        hw.producer().send_and_wait("q", b"writable again")
    finally:
        hw.close()


def test_async_flush_appends_nothing_after_its_flusher_saw_an_fsync_fail(tmp_path, failing_fsync):
    with headwater.open(tmp_path / "data", flush="async") as hw:
        hw.admin.create_queue("q")
        p = hw.producer()
        p.send_and_wait("q", b"one")
        failing_fsync()
        with pytest.raises(StorageError, match="Input/output error"):
            hw.service.store.flush()
        with pytest.raises(StorageError, match=REFUSED):
            p.send_and_wait("q", b"two")
        with pytest.raises(StorageError, match=REFUSED):
            hw.close()


def test_a_segment_whose_seal_failed_to_fsync_takes_no_more_appends(tmp_path, failing_fsync):
    hw = headwater.open(tmp_path / "data", flush="async", segment_bytes_max=64 * 1024)
    hw.admin.create_queue("q")
    p = hw.producer()
    body = b"x" * 20_000
    for _ in range(3):
        p.send_and_wait("q", body)
    failing_fsync()
    with pytest.raises(StorageError, match="Input/output error"):
        for _ in range(10):  # the segment fills, and its seal's fsync fails
            p.send_and_wait("q", body)
    with pytest.raises(StorageError, match=REFUSED):
        p.send_and_wait("q", body)
    with pytest.raises(StorageError):
        hw.close()
