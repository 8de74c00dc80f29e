"""Idempotent appends: a retried batch is stored once and gets its original ids back."""

from __future__ import annotations

import pytest

import headwater
from headwater.errors import OutOfOrderSequenceError, ProducerFencedError
from headwater.model.batch import encode_batch


def batch(seq: int, n: int = 3, pid: int = 77, epoch: int = 0) -> bytes:
    return encode_batch(
        [f"s{seq + i}".encode() for i in range(n)], producer_id=pid, base_sequence=seq, producer_epoch=epoch
    )


def test_retry_returns_original_placement_and_stores_once(tmp_path):
    with headwater.open(tmp_path / "d") as hw:
        hw.admin.create_queue("q", partitions=2)
        svc = hw.service
        first = svc.produce("q", 1, batch(0))
        again = svc.produce("q", 1, batch(0))
        assert again == first
        svc.produce("q", 1, batch(3))
        assert svc.produce("q", 1, batch(0)) == first  # still among the recent batches
        assert [r.body for r in hw.scanner("q")] == [f"s{i}".encode() for i in range(6)]
        with pytest.raises(OutOfOrderSequenceError, match="expected 6"):
            svc.produce("q", 1, batch(9))
        with pytest.raises(OutOfOrderSequenceError):
            svc.produce("q", 1, batch(1))  # overlaps without matching a batch
        svc.produce("q", 0, batch(0))  # sequences are per partition
        svc.produce("q", 1, batch(0, epoch=1))  # a new epoch starts afresh
        with pytest.raises(ProducerFencedError):
            svc.produce("q", 1, batch(6, epoch=0))


def test_dedupe_survives_restart_and_segment_rolls(tmp_path):
    d = tmp_path / "d"
    with headwater.open(d, segment_bytes_max=64 * 1024) as hw:
        hw.admin.create_queue("q")
        placements = [hw.service.produce("q", 0, batch(i * 3, pid=5)) for i in range(1000)]
        assert hw.service.store.stats()["segments"] >= 2
    for _ in range(2):
        with headwater.open(d, segment_bytes_max=64 * 1024) as hw:
            assert hw.service.produce("q", 0, batch(999 * 3, pid=5)) == placements[-1]
            assert hw.service.produce("q", 0, batch(998 * 3, pid=5)) == placements[-2]
            assert hw.admin.describe_queue("q").partitions[0].end_offset == 3000
    with headwater.open(d, segment_bytes_max=64 * 1024) as hw:
        hw.service.produce("q", 0, batch(3000, pid=5))
        assert hw.admin.describe_queue("q").partitions[0].end_offset == 3003


def test_a_first_batch_must_start_at_sequence_zero(tmp_path):
    """A batch that arrives first for its producer id (or epoch) but does not start at 0
    follows a lost batch: storing it would put it ahead of that batch's retry."""
    with headwater.open(tmp_path / "d") as hw:
        hw.admin.create_queue("q")
        svc = hw.service
        with pytest.raises(OutOfOrderSequenceError, match="first batch has sequence 0"):
            svc.produce("q", 0, batch(3, pid=9))
        assert hw.admin.describe_queue("q").partitions[0].end_offset == 0  # nothing stored
        svc.produce("q", 0, batch(0, pid=9))
        svc.produce("q", 0, batch(3, pid=9))
        with pytest.raises(OutOfOrderSequenceError, match="new epoch"):
            svc.produce("q", 0, batch(3, pid=9, epoch=1))
        svc.produce("q", 0, batch(0, pid=9, epoch=1))
        assert [r.body for r in hw.scanner("q")] == [f"s{i}".encode() for i in (0, 1, 2, 3, 4, 5, 0, 1, 2)]
