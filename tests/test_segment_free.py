"""Deleted segments free their blocks a chunk at a time (a large unlink stalls fsyncs)."""

from __future__ import annotations

import os

from headwater.storage.segment import free_gently


def test_free_gently_truncates_an_unlinked_file_to_nothing(tmp_path):
    path = tmp_path / "big.log"
    path.write_bytes(os.urandom(1 << 20) * 10)
    fd = os.open(path, os.O_RDWR)
    try:
        path.unlink()
        sizes = []
        real_ftruncate = os.ftruncate

        def spy(fd_, size):
            sizes.append(size)
            real_ftruncate(fd_, size)

        os.ftruncate = spy
        try:
            free_gently(fd, chunk_bytes=3 << 20, pause_s=0)
        finally:
            os.ftruncate = real_ftruncate
        assert os.fstat(fd).st_size == 0
        assert sizes == [7 << 20, 4 << 20, 1 << 20, 0]  # from the end, a chunk at a time
    finally:
        os.close(fd)


def test_retention_deletes_segment_files(tmp_path):
    import headwater

    with headwater.open(tmp_path / "d", segment_bytes_max=64 * 1024) as hw:
        hw.admin.create_queue("q", ttl_s=None)
        p = hw.producer()
        for _ in range(40):
            p.send_batch("q", [os.urandom(1000) for _ in range(10)])
        before = len(list((tmp_path / "d" / "log").glob("*.log")))
        hw.admin.delete_queue("q")
        assert hw.service.store.enforce_retention() >= 1
        after = len(list((tmp_path / "d" / "log").glob("*.log")))
        assert after < before


def test_a_segment_deleted_while_read_is_freed_gently_when_the_last_reader_lets_go(tmp_path, monkeypatch):
    import threading
    import time

    from headwater.storage import segment as seg_mod

    freed: list[tuple[int, str]] = []
    real = seg_mod.free_gently

    def spy(fd, *a, **kw):
        freed.append((os.fstat(fd).st_size, threading.current_thread().name))
        real(fd, *a, **kw)

    monkeypatch.setattr(seg_mod, "free_gently", spy)
    seg = seg_mod.LogSegment.create(tmp_path / "s.log", 0, b"\0" * 16, 0)
    seg.append([os.urandom(1 << 20)])
    with seg.reading():
        seg.delete()
        assert freed == [] and not (tmp_path / "s.log").exists()  # a reader holds it
        assert len(seg.read(seg_mod.SEGMENT_HEADER_SIZE, 10)) == 10
    deadline = time.monotonic() + 5
    while not freed and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(freed) == 1 and freed[0][0] >= 1 << 20  # the whole file, a chunk at a time
    assert freed[0][1] != threading.current_thread().name  # not on the reader's thread
