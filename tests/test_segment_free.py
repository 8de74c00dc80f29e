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
