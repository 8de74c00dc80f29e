"""A partition copied from one store to another, as a cluster moves it (docs/design/cluster.md,
"Moving a partition"): the target creates the queue under the source's id, resets each
partition to where the source's log begins, and appends every batch a fetch from the source
returns with ``append_copy``. Afterwards the two serve the same bytes at the same offsets,
answer lookups alike, and recognise the same producers' retries, and the target keeps all
of it through a reopen, a SIGKILL and the loss of what it had not flushed.

The contract of each call, with its bad cases, is tested on both stores in
tests/test_store_contract.py; here the stores are mostly LogStores over data directories.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from headwater import Message
from headwater.errors import InvalidArgumentError, ReadOnlyStoreError
from headwater.model.batch import decode_header, encode_batch
from headwater.model.config import QueueConfig
from headwater.model.service import ProduceResult
from headwater.storage import LogStore, StoreConfig
from headwater.storage.api import Store
from headwater.storage.memory import MemoryStore
from headwater.storage.producer_state import RECENT_BATCHES
from headwater.storage.recovery_point import RECOVERY_POINT_FILE
from headwater.storage.segment import segment_name
from headwater.testing import FakeClock

QUEUE, QUEUE_ID, PARTS = "orders", 42, 3
KEYS = [b"k%d" % i for i in range(5)]
# small segments: the source rolls (indexes, producer snapshots) and retention deletes some
SOURCE_CONFIG = StoreConfig(segment_bytes_max=64 * 1024)
TARGET_CONFIG = StoreConfig(segment_bytes_max=96 * 1024)  # another layout: the same offsets anyway
REPO = Path(__file__).resolve().parent.parent


class Source:
    """A store's queue after a life of appends, expiry and deletes; ``acked`` holds every
    idempotent batch it acknowledged, with where it went, for the retries."""

    def __init__(self, store: Store, clock: FakeClock, seed: int = 20261127) -> None:
        self.store = store
        self.acked: list[tuple[int, bytes, ProduceResult]] = []
        rng = random.Random(seed)
        store.create_queue(QUEUE, QueueConfig(partitions=PARTS, ttl_s=3600), queue_id=QUEUE_ID)
        seqs: dict[tuple[int, int, int], int] = {}  # (producer, epoch, partition): next sequence
        for n in range(240):
            if n == 60:
                clock.advance(3000)  # what came before expires 600 s after it is written
            clock.advance(rng.uniform(0, 2))
            self._append(rng, n, seqs)
        clock.advance(700)  # TTL: the first 60 batches expired
        store.enforce_retention()
        start = store.describe_queue(QUEUE).partitions[0].start_offset
        store.delete_before(QUEUE, 0, start + 3)  # inside a batch, most likely
        for n in range(240, 300):
            clock.advance(rng.uniform(0, 2))
            self._append(rng, n, seqs)
        store.enforce_retention()

    def _append(self, rng: random.Random, n: int, seqs: dict[tuple[int, int, int], int]) -> None:
        p = rng.randrange(PARTS)
        msgs: list[Message | bytes] = [
            Message(b"%d.%d" % (n, i) * rng.randint(1, 40), key=rng.choice(KEYS), tag=rng.choice(("a", "b")))
            for i in range(rng.randint(1, 30))
        ]
        kind = rng.randrange(6)
        if kind == 0:  # a delayed batch coming due: stamped by the broker
            self.store.append_stamped(QUEUE_ID, p, encode_batch([b"due %d" % n]), 1_000_000 + n)
            return
        if kind == 1:
            self.store.append(QUEUE, p, encode_batch(msgs, compression=rng.choice((None, "zstd", "lz4"))))
            return
        producer = kind  # 2..5: idempotent producers; 5 bumps its epoch half way
        epoch = 1 if producer == 5 and n >= 150 else 0
        seq = seqs.get((producer, epoch, p), 0)
        batch = bytes(
            encode_batch(
                msgs,
                producer_id=1000 + producer,
                producer_epoch=epoch,
                base_sequence=seq,
                compression=rng.choice((None, "zstd", "lz4")),
            )
        )
        seqs[(producer, epoch, p)] = seq + len(msgs)
        self.acked.append((p, batch, self.store.append(QUEUE, p, batch)))


def copy_partition(src: Store, dst: Store, queue: str, partition: int) -> None:
    """What a broker taking a partition over does (step 2 of a move): reset it to where the
    source's log begins, copy every batch, then move its start to the source's (which may
    lie inside the first batch)."""
    start = src.describe_queue(queue).partitions[partition].start_offset
    first = src.fetch(queue, partition, start, max_bytes=1)
    begin = decode_header(first.batches[0]).base_offset if first.batches else first.end_offset
    dst.reset_partition(queue, partition, begin)
    offset = begin
    while offset < src.end_offset(queue, partition):
        res = src.fetch(queue, partition, offset, max_bytes=32 * 1024)
        for raw in res.batches:
            dst.append_copy(queue, partition, bytes(raw), decode_header(raw).base_offset)
        offset = res.next_offset
    if start > begin:
        dst.delete_before(queue, partition, start)


def everything(store: Store, partition: int) -> list[bytes]:
    out: list[bytes] = []
    offset = 0
    while True:
        res = store.fetch(QUEUE, partition, offset, max_bytes=16 * 1024)
        out += [bytes(b) for b in res.batches]
        if res.next_offset >= res.end_offset:
            return out
        offset = res.next_offset


def assert_same(src: Store, dst: Store) -> None:
    """Same bytes at the same offsets, same answers to every lookup."""
    a, b = src.describe_queue(QUEUE), dst.describe_queue(QUEUE)
    assert b.queue_id == a.queue_id == QUEUE_ID
    assert b.partitions == a.partitions
    times: set[int] = set()
    stamped: list[tuple[int, int, int]] = []
    for p in range(PARTS):
        batches = everything(src, p)
        assert everything(dst, p) == batches, f"partition {p}"
        for raw in batches:
            h = decode_header(raw)
            times |= {h.timestamp_ms - 1, h.timestamp_ms, h.timestamp_ms + 1}
            for offset in (h.base_offset, h.base_offset + h.count - 1):
                if offset >= a.partitions[p].start_offset:
                    assert dst.lookup_id(QUEUE_ID, p, offset) == src.lookup_id(QUEUE_ID, p, offset)
        for ts in sorted(times)[::7] + [0, 2**62]:
            assert dst.offset_for_time(QUEUE, p, ts) == src.offset_for_time(QUEUE, p, ts), (p, ts)
        stamped += [(p, h.base_offset, h.broker_reserved) for h in map(decode_header, batches) if h.broker_reserved]
    for key in KEYS:  # the same batches, in another order: the target appended partition by partition
        assert sorted(dst.lookup_key(QUEUE, key)) == sorted(src.lookup_key(QUEUE, key))
    got = [(h.partition, h.base_offset, h.broker_reserved) for h in dst.stamped_batches(0) if h.queue_id == QUEUE_ID]
    assert sorted(got) == sorted(stamped) and stamped


def assert_retries_are_duplicates(dst: Store, source: Source, partitions: tuple[int, ...] = (0, 1, 2)) -> None:
    """Every producer retrying a batch the source acknowledged, and the target copied, gets
    the source's answer, as far as the producer state can tell (RECENT_BATCHES newest)."""
    ends = [dst.end_offset(QUEUE, p) for p in range(PARTS)]
    copied = {(p, decode_header(raw).base_offset) for p in partitions for raw in everything(dst, p)}
    newest: dict[tuple[int, int, int], list[tuple[bytes, ProduceResult]]] = {}
    for p, batch, placed in source.acked:
        h = decode_header(batch)
        if (p, placed.base_offset) in copied:
            newest.setdefault((h.producer_id, h.producer_epoch, p), []).append((batch, placed))
    retried = 0
    for (pid, epoch, p), sent in newest.items():
        if (pid, epoch) == (1005, 0):
            continue  # fenced by its epoch 1: its retries are refused, on the source too
        for batch, placed in sent[-RECENT_BATCHES:]:
            assert dst.append(QUEUE, p, batch) == placed
            retried += 1
    assert retried >= 5 * len(partitions)
    assert [dst.end_offset(QUEUE, p) for p in range(PARTS)] == ends  # nothing appended twice


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def source(tmp_path, clock):
    store = LogStore(tmp_path / "a", SOURCE_CONFIG, clock=clock)
    src = Source(store, clock)
    info = store.describe_queue(QUEUE)
    assert all(p.start_offset > 0 for p in info.partitions), info  # the copy does not begin at 0
    assert store.stats()["segments"] >= 3
    yield src
    store.close()


def new_target(path: Path, clock: FakeClock, config: StoreConfig = TARGET_CONFIG) -> LogStore:
    dst = LogStore(path, config, clock=clock)
    dst.create_queue("__own", QueueConfig(), internal=True)  # ids of its own: 1, 2
    dst.create_queue("other", QueueConfig())
    dst.create_queue(QUEUE, QueueConfig(partitions=PARTS, ttl_s=3600), queue_id=QUEUE_ID)
    return dst


def test_a_copied_queue_serves_what_its_source_serves(source, tmp_path, clock):
    dst = new_target(tmp_path / "b", clock)
    try:
        for p in range(PARTS):
            copy_partition(source.store, dst, QUEUE, p)
        assert_same(source.store, dst)
        assert dst.create_queue("later", QueueConfig()).queue_id == QUEUE_ID + 1
        assert_retries_are_duplicates(dst, source)
        dst.close()
        dst = LogStore(tmp_path / "b", TARGET_CONFIG, clock=clock)  # reopened: the same, retries too
        assert_same(source.store, dst)
        assert_retries_are_duplicates(dst, source)
        with pytest.raises(InvalidArgumentError, match="queue 'orders' of this store has that id"):
            dst.create_queue("again", QueueConfig(), queue_id=QUEUE_ID)
        clock.advance(3600)  # both expire alike: the copy kept the source's append times
        assert dst.describe_queue(QUEUE).partitions == source.store.describe_queue(QUEUE).partitions
    finally:
        dst.close()


def test_a_copy_into_memory_is_the_same(source, clock):
    dst = MemoryStore(clock=clock)
    dst.create_queue(QUEUE, QueueConfig(partitions=PARTS, ttl_s=3600), queue_id=QUEUE_ID)
    for p in range(PARTS):
        copy_partition(source.store, dst, QUEUE, p)
    assert_same(source.store, dst)
    assert_retries_are_duplicates(dst, source)
    dst.close()


_CHILD = """
import os, signal, sys
sys.path.insert(0, {tests!r})
from test_store_copy import QUEUE, copy_partition, new_target
from headwater.storage import LogStore, StoreConfig
from headwater.testing import FakeClock
clock = FakeClock({now!r})
src = LogStore({src!r}, StoreConfig(read_only=True))
dst = new_target({dst!r}, clock)
copy_partition(src, dst, QUEUE, 0)
copy_partition(src, dst, QUEUE, 1)
dst.reset_partition(QUEUE, 2, 5000)  # reset, nothing appended yet
os.kill(os.getpid(), signal.SIGKILL)  # no close, no flush: what a crash leaves
"""


def test_a_copy_survives_a_sigkill(source, tmp_path, clock):
    source.store.close()  # the child reads it (its lock is exclusive)
    code = _CHILD.format(tests=str(REPO / "tests"), now=clock(), src=str(tmp_path / "a"), dst=str(tmp_path / "b"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    child = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, timeout=120)
    assert child.returncode == -9, child.stderr.decode()
    src = LogStore(tmp_path / "a", SOURCE_CONFIG, clock=clock)
    dst = LogStore(tmp_path / "b", TARGET_CONFIG, clock=clock)
    try:
        for p in (0, 1):
            assert everything(dst, p) == everything(src, p)
            assert dst.describe_queue(QUEUE).partitions[p] == src.describe_queue(QUEUE).partitions[p]
        empty = dst.describe_queue(QUEUE).partitions[2]
        assert (empty.start_offset, empty.end_offset) == (5000, 5000)  # the catalog kept the reset
        assert dst.append(QUEUE, 2, encode_batch([b"x"])).base_offset == 5000
        assert_retries_are_duplicates(dst, source, partitions=(0, 1))
    finally:
        src.close()
        dst.close()


def test_copies_lost_with_the_unflushed_tail_are_copied_again(source, tmp_path, clock):
    """A power loss takes what was not fsynced: the reset (in the catalog) stays, and so does
    the partition's end at the reset offset, from which the copy starts over."""
    config = StoreConfig(segment_bytes_max=8 * 1024 * 1024, flush_interval_ms=3_600_000)
    dst = new_target(tmp_path / "b", clock, config)
    try:
        start = source.store.describe_queue(QUEUE).partitions[1].start_offset
        first = decode_header(source.store.fetch(QUEUE, 1, start, max_bytes=1).batches[0]).base_offset
        dst.reset_partition(QUEUE, 1, first)
        dst.flush()
        flushed = dst.end_position
        copy_partition(source.store, dst, QUEUE, 1)  # resets again, to the same offset: allowed
        assert dst.end_offset(QUEUE, 1) > first
        crashed = tmp_path / "crashed"
        shutil.copytree(tmp_path / "b", crashed)  # the disk as the open store left it
    finally:
        dst.close()
    (crashed / ".lock").unlink()
    log_dir = crashed / "log"
    with (log_dir / segment_name(0, ".log")).open("r+b") as f:
        f.truncate(flushed)  # the copies never reached the disk
    (log_dir / RECOVERY_POINT_FILE).unlink(missing_ok=True)
    dst = LogStore(crashed, config, clock=clock)
    try:
        p1 = dst.describe_queue(QUEUE).partitions[1]
        assert (p1.start_offset, p1.end_offset) == (first, first)
        copy_partition(source.store, dst, QUEUE, 1)
        assert everything(dst, 1) == everything(source.store, 1)
        dst.close()
        dst = LogStore(crashed, config, clock=clock)
        assert everything(dst, 1) == everything(source.store, 1)
    finally:
        dst.close()


def test_older_batches_below_a_reset_do_not_confuse_time_lookups(tmp_path, clock):
    """The target served the partition once, by a clock ahead of the source's: those
    batches, below the reset, have later times than the copies in the same segment."""
    src = MemoryStore(clock=clock)
    src.create_queue(QUEUE, QueueConfig(ttl_s=600), queue_id=QUEUE_ID)
    dst = LogStore(tmp_path / "b", clock=clock)
    dst.create_queue(QUEUE, QueueConfig(ttl_s=600), queue_id=QUEUE_ID)
    try:
        clock.advance(300)
        for i in range(6):
            dst.append(QUEUE, 0, encode_batch([b"old %d" % i] * 3))  # offsets 0..17, at +300 s
        dst.delete_before(QUEUE, 0, 18)
        clock.advance(-300)
        src.reset_partition(QUEUE, 0, 20)
        for i in range(8):
            clock.advance(30)
            src.append(QUEUE, 0, encode_batch([b"new %d" % i] * 2))  # offsets 20..35, from +30 s to +240 s
        copy_partition(src, dst, QUEUE, 0)
        assert everything(dst, 0) == everything(src, 0)
        t0 = int(clock() * 1000)
        for ts in range(t0 - 300_000, t0 + 100_000, 5_000):
            assert dst.offset_for_time(QUEUE, 0, ts) == src.offset_for_time(QUEUE, 0, ts), ts
        clock.advance(350)
        for step in range(13):  # the TTL expires the copies as it does on the source
            clock.advance(30)
            assert dst.describe_queue(QUEUE).partitions == src.describe_queue(QUEUE).partitions, step
    finally:
        src.close()
        dst.close()


def test_a_deleted_queues_id_waits_for_its_batches_to_go(tmp_path, clock):
    """A new queue under the id of a deleted one whose batches are still in the log would
    serve them as its own: refused until retention reclaims them."""
    store = LogStore(tmp_path / "data", StoreConfig(segment_bytes_max=64 * 1024), clock=clock)
    try:
        store.create_queue("gone", QueueConfig(), queue_id=9)
        store.append("gone", 0, encode_batch([b"x" * 1000]))
        store.delete_queue("gone")
        with pytest.raises(InvalidArgumentError, match="still holds batches of a deleted queue with that id"):
            store.create_queue("new", QueueConfig(), queue_id=9)
        store.create_queue("filler", QueueConfig())  # id 10: past the given one
        for _ in range(100):  # roll past the segment with queue 9's batch
            store.append("filler", 0, encode_batch([b"y" * 1000]))
        store.truncate_queue("filler")
        assert store.enforce_retention() >= 1
        assert store.create_queue("new", QueueConfig(), queue_id=9).partitions[0].end_offset == 0
        assert store.fetch("new", 0, 0).batches == []
        store.close()
        store = LogStore(tmp_path / "data", StoreConfig(segment_bytes_max=64 * 1024), clock=clock)
        assert store.describe_queue("new").queue_id == 9
        assert store.create_queue("auto", QueueConfig()).queue_id == 11  # the next id survived too
    finally:
        store.close()


def test_a_reset_jump_is_not_reported_as_lost_with_damage_elsewhere(tmp_path, clock):
    """Recovery names the offsets a partition lost to damaged bytes by the jumps in its
    offsets once damage was seen; a reset's jump is none of those."""
    data = tmp_path / "data"
    with LogStore(data, clock=clock) as store:
        store.create_queue("other", QueueConfig())
        store.create_queue(QUEUE, QueueConfig())
        store.append("other", 0, encode_batch([b"o" * 500]))  # the log's first batch: damaged below
        store.append("other", 0, encode_batch([b"p" * 500]))
        store.append(QUEUE, 0, encode_batch([b"x"] * 10))
        store.delete_before(QUEUE, 0, 10)
        store.reset_partition(QUEUE, 0, 100)
        store.append(QUEUE, 0, encode_batch([b"y"]))
        assert store.stats()["segments"] == 1
    with (data / "log" / segment_name(0, ".log")).open("r+b") as f:
        f.seek(64 + 300)  # inside the first batch, flushed (the recovery point covers it)
        f.write(b"\xff" * 16)
    (data / "log" / segment_name(0, ".idx")).unlink()  # as a crash leaves it: the open reads the segment
    with LogStore(data, clock=clock) as store:
        assert any(m.startswith("skipped ") for m in store.recovery_report)
        assert not any(f"{QUEUE!r} partition 0" in m for m in store.recovery_report), store.recovery_report
        assert len(store.fetch("other", 0, 0).batches) == 1  # the undamaged one
        assert store.append(QUEUE, 0, encode_batch([b"z"])).base_offset == 101


def test_a_rewound_partition_keeps_its_offsets_through_a_reopen(tmp_path, clock):
    """A rewind is saved before it counts: reopened, a partition rewound onto what it kept
    serves it, and one rewound empty (its batches gone with their segments) still begins
    where it was rewound to; a partition that kept only part of what it held (a segment of
    it deleted) cannot be rewound below what it kept."""
    data, big = tmp_path / "data", b"x" * 40_000  # a segment (64 KiB) holds one
    with LogStore(data, SOURCE_CONFIG, clock=clock) as store:
        store.create_queue(QUEUE, QueueConfig(partitions=3, ttl_s=None))
        for p in (0, 1):
            for body in (big, b"b", big):
                store.append(QUEUE, p, encode_batch([body]))
        last = {p: bytes(store.fetch(QUEUE, p, 2).batches[0]) for p in (0, 1)}
        store.delete_before(QUEUE, 0, 3)
        store.delete_before(QUEUE, 1, 2)  # the segment with offsets 0 and 1 goes, not the one with 2
        store.append(QUEUE, 2, encode_batch([big]))  # the segments of 0 and 1 are sealed
        store.enforce_retention()
        store.delete_before(QUEUE, 1, 3)
        with pytest.raises(InvalidArgumentError, match=r"it keeps 1 of offsets 0..2 from before, not all"):
            store.rewind_partition(QUEUE, 1, 0, last[1])
        store.rewind_partition(QUEUE, 1, 2, last[1])
        store.rewind_partition(QUEUE, 0, 0)  # kept nothing
        store.append(QUEUE, 0, encode_batch([b"new"]))
    with LogStore(data, SOURCE_CONFIG, clock=clock) as store:
        parts = store.describe_queue(QUEUE).partitions
        assert [(p.start_offset, p.end_offset) for p in parts[:2]] == [(0, 1), (2, 3)]
        assert [decode_header(b).base_offset for b in store.fetch(QUEUE, 0, 0).batches] == [0]
        assert [decode_header(b).base_offset for b in store.fetch(QUEUE, 1, 0).batches] == [2]
        assert store.append(QUEUE, 0, encode_batch([b"next"])).base_offset == 1


def test_a_copy_is_durable_as_its_queue_says_and_never_into_a_read_only_store(tmp_path, clock):
    src = MemoryStore(clock=clock)
    src.create_queue("sync", QueueConfig(), queue_id=7)
    src.create_queue("lazy", QueueConfig(), queue_id=8)
    for q in ("sync", "lazy"):
        src.append(q, 0, encode_batch([b"x"]))
    batches = {q: bytes(src.fetch(q, 0, 0).batches[0]) for q in ("sync", "lazy")}
    config = StoreConfig(flush_interval_ms=3_600_000)  # no flush but the ones asked for
    data = tmp_path / "data"
    with LogStore(data, config, clock=clock) as store:
        store.create_queue("sync", QueueConfig(flush="sync"), queue_id=7)
        store.create_queue("lazy", QueueConfig(), queue_id=8)
        store.create_queue("empty", QueueConfig())
        before = store.stats()["fsyncs"]
        store.append_copy("lazy", 0, batches["lazy"], 0)
        assert store.stats()["fsyncs"] == before  # async: the flusher's business
        store.append_copy("sync", 0, batches["sync"], 0)
        assert store.stats()["fsyncs"] > before  # on the disk before it returned
    with LogStore(data, StoreConfig(read_only=True), clock=clock) as ro:
        for call in (
            lambda: ro.append_copy("sync", 0, batches["sync"], 1),
            lambda: ro.reset_partition("empty", 0, 5),
            lambda: ro.create_queue("new", QueueConfig(), queue_id=99),
        ):
            with pytest.raises(ReadOnlyStoreError, match="opened read-only"):
                call()
        assert ro.describe_queue("sync").partitions[0].end_offset == 1 and ro.queue_name(99) is None
        assert ro.describe_queue("empty").partitions[0].end_offset == 0  # undone in memory too
    src.close()
