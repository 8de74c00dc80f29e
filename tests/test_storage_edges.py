"""The embedded storage engine at its edges: a full disk, a damaged or missing catalog.

Real files on a real (small) file system: the disk-full tests mount a 2 MiB tmpfs, so they
need root and skip without it. Every test here reopens the directory and checks that what
was acknowledged is there, exactly once.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import headwater
from headwater.errors import (
    CorruptDataError,
    DataDirectoryError,
    NotADataDirectoryError,
    QueueNotFoundError,
    ReadOnlyStoreError,
    StorageError,
)
from tests.support.broker_process import HEADWATER, BrokerProcess

PAGE = 4096


@pytest.fixture
def small_disk(tmp_path: Path):
    """A 2 MiB tmpfs, unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "disk"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode:
        pytest.skip(f"cannot mount a tmpfs: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=True)


def fill(disk: Path, leave_pages: int = 0) -> Path:
    """Fill the file system but ``leave_pages`` pages with a file; return it."""
    filler = disk / f"filler{len(list(disk.glob('filler*')))}"
    st = os.statvfs(disk)
    left = st.f_bavail * st.f_frsize - leave_pages * PAGE
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        while left > 0:
            left -= os.write(fd, b"\0" * min(left, 1 << 20))
    except OSError:
        pass  # full
    finally:
        os.close(fd)
    return filler


def bodies(hw, queue: str) -> list[bytes]:
    return [r.body for r in hw.scanner(queue)]


# -- a full disk ----------------------------------------------------------------------------


@pytest.mark.parametrize("leave_pages", range(6))
def test_a_disk_full_while_a_segment_rolls_leaves_the_store_writable(small_disk, leave_pages):
    """The roll to a new segment writes a producer snapshot, an index and the new segment's
    header; whichever of them the full disk stops, the append fails with a StorageError and
    appends work again once space is freed. (A segment file left half created made every
    later roll fail with FileExistsError until the store was reopened.)"""
    data = small_disk / "data"
    hw = headwater.open(data, flush="sync", segment_bytes_max=64 * 1024)
    hw.admin.create_queue("q", partitions=1)
    acked = []
    for i in range(6):  # 6 x ~10 KiB: the next batch does not fit and rolls the segment
        hw.send("q", b"%d|" % i + b"x" * 10_000)
        acked.append(i)
    assert len(list((data / "log").glob("*.log"))) == 1
    filler = fill(small_disk, leave_pages)
    try:
        hw.send("q", b"6|" + b"x" * 10_000)
        acked.append(6)
    except StorageError as e:
        assert "No space left" in str(e)
    filler.unlink()
    for i in range(7, 12):
        hw.send("q", b"%d|" % i + b"x" * 10_000)
        acked.append(i)
    hw.close()
    assert not list(data.rglob("*.tmp"))
    with headwater.open(data) as hw:
        assert [int(b.split(b"|")[0]) for b in bodies(hw, "q")] == acked


def test_admin_changes_the_full_disk_refused_are_not_made(small_disk):
    """An admin change whose catalog write fails is undone in memory too. (A queue created
    while the disk was full existed in memory only: a retry said it already existed, it took
    acknowledged messages, and it vanished with them at the next open.)"""
    data = small_disk / "data"
    hw = headwater.open(data, flush="sync")
    hw.admin.create_queue("kept", partitions=2)
    hw.send("kept", b"a", partition=0)
    filler = fill(small_disk)
    with pytest.raises(StorageError, match="headwater.json"):
        hw.admin.create_queue("new", partitions=1)
    with pytest.raises(QueueNotFoundError):
        hw.admin.describe_queue("new")
    with pytest.raises(StorageError):
        hw.admin.truncate_queue("kept")
    with pytest.raises(StorageError):
        hw.admin.delete_queue("kept")
    with pytest.raises(StorageError):
        hw.admin.add_partitions("kept", 3)
    info = hw.admin.describe_queue("kept")
    assert len(info.partitions) == 2 and info.partitions[0].start_offset == 0
    assert bodies(hw, "kept") == [b"a"]
    filler.unlink()
    hw.admin.create_queue("new", partitions=1)  # the retry works once there is room
    hw.send("new", b"n")
    hw.close()
    assert not list(data.rglob("*.tmp"))
    with headwater.open(data) as hw:
        assert bodies(hw, "new") == [b"n"]
        assert bodies(hw, "kept") == [b"a"]


def test_retention_frees_a_full_disk_it_cannot_write_the_catalog_on(small_disk, clock):
    """Retention saves the moved start offsets before it deletes segments; on a disk with no
    room for the catalog that save failed, so nothing was ever deleted and the disk stayed
    full although expired segments filled it. Now it first deletes the segments whose loss
    moves no offset back, then saves."""
    data = small_disk / "data"
    hw = headwater.open(data, flush="sync", segment_bytes_max=64 * 1024, clock=clock)
    hw.admin.create_queue("old", partitions=1, ttl_s=60)
    hw.admin.create_queue("live", partitions=1, ttl_s=None)
    sent = 0
    with pytest.raises(StorageError, match="No space left"):
        while True:
            hw.send("old", b"x" * 20_000)
            sent += 1
    fill(small_disk)  # someone else takes the last pages
    clock.advance(120)  # everything in "old" expires
    assert hw.service.store.enforce_retention() > 0
    hw.send("live", b"y" * 20_000)
    hw.close()
    with headwater.open(data, clock=clock) as hw:
        assert hw.admin.describe_queue("old").partitions[0].end_offset == sent  # no offset goes back
        assert bodies(hw, "old") == []
        assert bodies(hw, "live") == [b"y" * 20_000]


# -- the catalog ----------------------------------------------------------------------------


def _store_with_data(path: Path) -> None:
    with headwater.open(path) as hw:
        hw.admin.create_queue("q", partitions=2)
        for i in range(4):
            hw.send("q", b"m%d" % i, partition=i % 2)


def test_a_missing_catalog_beside_segments_is_refused_and_nothing_is_written(tmp_path):
    """Without headwater.json the store used to write a fresh catalog (a new store id) and
    then fail on 'segment ... belongs to another store', leaving the directory worse."""
    data = tmp_path / "data"
    _store_with_data(data)
    (data / "headwater.json").unlink()
    with pytest.raises(NotADataDirectoryError, match="headwater.json is missing"):
        headwater.open(data)
    assert not (data / "headwater.json").exists()


@pytest.mark.parametrize("damage", ["invalid utf-8", "store id", "start offsets", "queue id"])
def test_a_damaged_catalog_is_refused_with_an_error_naming_it(tmp_path, damage):
    data = tmp_path / "data"
    _store_with_data(data)
    path = data / "headwater.json"
    raw = path.read_bytes()
    if damage == "invalid utf-8":
        raw = raw.replace(b'"q"', b'"\xf3"', 1)
    else:
        cat = json.loads(raw)
        if damage == "store id":
            cat["store_id"] = "not-a-uuid"
        elif damage == "start offsets":
            cat["queues"]["q"]["start_offsets"] = [0]  # two partitions
        else:
            cat["queues"]["q"]["queue_id"] = cat["next_queue_id"]
        raw = json.dumps(cat).encode()
    path.write_bytes(raw)
    with pytest.raises((NotADataDirectoryError, CorruptDataError), match="headwater.json"):
        headwater.open(data)
    shutil.rmtree(data)


@pytest.mark.parametrize("checksum", ["kept", "dropped"])
def test_a_queue_id_swapped_for_another_queues_is_refused(tmp_path, checksum):
    """Issue 30, finding 8: queue a given queue b's id opened fine, and a's partitions were
    served as empty (its batches are b's now). The checksum catches the edit; a catalog with
    no checksum (as written before it existed) still has two queues with one id refused."""
    data = tmp_path / "data"
    with headwater.open(data) as hw:
        hw.admin.create_queue("a")
        hw.admin.create_queue("b")
        hw.send("a", b"kept")
    path = data / "headwater.json"
    cat = json.loads(path.read_bytes())
    cat["queues"]["a"]["queue_id"] = cat["queues"]["b"]["queue_id"]
    if checksum == "dropped":
        del cat["checksum"]
    path.write_text(json.dumps(cat, indent=2))
    want = "checksum does not match" if checksum == "kept" else "'a' and 'b' both have id"
    with pytest.raises(CorruptDataError, match=want):
        headwater.open(data)


def test_one_changed_byte_that_stays_valid_json_is_refused(tmp_path):
    data = tmp_path / "data"
    _store_with_data(data)
    path = data / "headwater.json"
    raw = path.read_bytes()
    at = raw.index(b'"created_ms": ') + len(b'"created_ms": ')
    digit = raw[at : at + 1]
    path.write_bytes(raw[:at] + (b"1" if digit != b"1" else b"2") + raw[at + 1 :])
    with pytest.raises(CorruptDataError, match="headwater.json is damaged: its checksum"):
        headwater.open(data)


def test_a_catalog_written_before_checksums_opens_and_gets_one(tmp_path):
    data = tmp_path / "data"
    _store_with_data(data)
    path = data / "headwater.json"
    cat = json.loads(path.read_bytes())
    del cat["checksum"]
    path.write_text(json.dumps(cat, indent=2))
    with headwater.open(data) as hw:
        assert [r.body for r in hw.scanner("q", partitions=[0])] == [b"m0", b"m2"]
        hw.admin.create_queue("later")  # a save
    assert json.loads(path.read_bytes())["checksum"]
    with headwater.open(data) as hw:
        assert "later" in {q.name for q in hw.admin.list_queues()}


# -- the data directory ----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["00000000000000000000 (copy).log", "zz-notes.log"])
def test_a_foreign_file_among_the_segments_is_refused_and_left_alone(tmp_path, name):
    """A copied segment failed the open with a bare ValueError; a small foreign file that
    sorted last was deleted as 'a segment created but never written'."""
    data = tmp_path / "data"
    _store_with_data(data)
    foreign = data / "log" / name
    shutil.copy(data / "log" / "00000000000000000000.log", foreign) if "copy" in name else foreign.write_bytes(b"x")
    with pytest.raises(DataDirectoryError, match="not segments"):
        headwater.open(data)
    assert foreign.exists()
    foreign.unlink()
    with headwater.open(data) as hw:
        assert sorted(bodies(hw, "q")) == [b"m0", b"m1", b"m2", b"m3"]


def test_a_data_directory_that_cannot_be_created_says_so(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(DataDirectoryError, match="cannot create the data directory"):
        headwater.open(tmp_path / "file" / "data")


def test_a_full_disk_does_not_set_off_an_epoch_storm(small_disk):
    """Issue 30, finding 5: appends refused by a full disk failed their batches at once and
    fenced the producer; every batch in flight behind them then failed as out of order under
    a new epoch (epochs climbed to 731). They are now sent again, the same bytes, until the
    delivery timeout: once there is room every message is stored once, in order, under the
    producer's first epoch."""
    data = small_disk / "data"
    broker = BrokerProcess(data).start()
    try:
        with headwater.connect(broker.address) as hw:
            hw.admin.create_queue("q")
            p = hw.producer(
                linger_ms=1, retries=1000, delivery_timeout_ms=60_000, retry_backoff_ms=20, retry_backoff_max_ms=200
            )
            p.send_and_wait("q", b"first")
            epoch = p.producer_epoch
            filler = fill(small_disk)
            futures = [p.send("q", b"%d:" % i + b"x" * 2048) for i in range(200)]
            time.sleep(1.5)  # a few rounds of refusals and resends
            failed = [f.exception() for f in futures if f.done() and f.exception()]
            assert not failed, f"batches failed on the full disk: {failed[:3]}"
            assert not all(f.done() for f in futures), "the disk was never full"
            filler.unlink()
            ids = [f.result(timeout=60) for f in futures]
            assert p.producer_epoch == epoch
            assert [m.offset for m in ids] == list(range(1, 201))
            assert bodies(hw, "q") == [b"first"] + [b"%d:" % i + b"x" * 2048 for i in range(200)]
    finally:
        broker.kill()


@contextlib.contextmanager
def _read_only_mount(data: Path, tmp_path: Path) -> Iterator[Path]:
    """``data`` bind-mounted read-only (root only; skipped otherwise), unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("a read-only bind mount needs root")
    ro = tmp_path / "ro"
    ro.mkdir()
    subprocess.run(["mount", "--bind", str(data), str(ro)], check=True)
    try:
        if subprocess.run(["mount", "-o", "remount,bind,ro", str(ro)]).returncode:
            pytest.skip("cannot remount read-only")
        yield ro
    finally:
        subprocess.run(["umount", "-l", str(ro)], check=True)


def test_a_read_only_data_directory_says_so(tmp_path):
    data = tmp_path / "data"
    _store_with_data(data)
    with _read_only_mount(data, tmp_path) as ro:
        with pytest.raises(DataDirectoryError, match="must be writable") as refused:
            headwater.open(ro)
        assert "read_only=True" in str(refused.value) and "serve --set read_only=true" in str(refused.value)
        with headwater.open(ro, read_only=True) as hw:  # reading it needs no write
            assert sorted(bodies(hw, "q")) == [b"m0", b"m1", b"m2", b"m3"]


def test_a_copy_without_its_lock_file_reads_from_a_read_only_mount(tmp_path):
    """A store copied without ``.lock`` (a backup restored, say) and mounted read-only: a
    read-only open wanted to create the lock file and failed, "a data directory must be
    writable, unless opened read-only" (it was); the CLI's reads and ``check`` alike."""
    data = tmp_path / "data"
    _store_with_data(data)
    (data / ".lock").unlink()
    with _read_only_mount(data, tmp_path) as ro:
        with headwater.open(ro, read_only=True) as hw:
            assert sorted(bodies(hw, "q")) == [b"m0", b"m1", b"m2", b"m3"]
        for argv in (["queue", "list"], ["check"]):
            out = subprocess.run([HEADWATER, "--data", str(ro), *argv], capture_output=True, text=True, timeout=60)
            assert out.returncode == 0, out.stderr
        with pytest.raises(DataDirectoryError, match="must be writable"):
            headwater.open(ro)  # a writer still cannot
    assert not (data / ".lock").exists()


def test_a_read_only_open_of_an_empty_directory_reads_no_queues_and_writes_nothing(tmp_path):
    """An empty directory opened read-only is a store with no queues, as a new one is, and
    stays empty: every write is refused as on any read-only store. (The CLI's reading
    commands open it so; they used to open it read-write, which made a store there.)"""
    empty = tmp_path / "empty"
    empty.mkdir()
    with headwater.open(empty, read_only=True) as hw:
        assert hw.admin.list_queues() == [] and hw.status()["data_dir"] == str(empty)
        assert hw.service.list_groups() == [] and hw.delay_stats().pending_messages == 0
        with pytest.raises(ReadOnlyStoreError, match="read-only"):
            hw.admin.create_queue("q")
    assert list(empty.iterdir()) == []


# -- reading --------------------------------------------------------------------------------


def test_a_tag_filtered_fetch_skips_a_bounded_number_of_batches_per_call(tmp_path):
    """The walk over the index that skips batches without the wanted tags holds the store's
    lock, so every append waited for it: 300,000 skipped batches held it for 0.1 s, and a
    partition's whole history could be walked at once. A fetch now answers after a bounded
    number of skipped batches with where it got to; readers ask again from there."""
    from headwater.model import Message
    from headwater.model.batch import encode_batch, tag_bit

    with headwater.open(tmp_path / "data") as hw:
        hw.admin.create_queue("q", partitions=1)
        store = hw.service.store
        common = bytes(encode_batch([Message(b"c", tag="common")]))
        n = 20_000
        for _ in range(n):
            store.append("q", 0, common)
        hw.send("q", b"needle", tag="rare", partition=0)
        res = store.fetch("q", 0, 0, tag_mask=tag_bit("rare"))
        assert res.batches == [] and 0 < res.next_offset < n  # moved on, not to the end at once
        assert [r.body for r in hw.scanner("q", tags="rare")] == [b"needle"]
        assert [r.offset for r in hw.scanner("q", tags="rare")] == [n]


def test_an_index_damaged_after_the_open_is_named_by_the_error(tmp_path):
    """A sealed index read again after it left the cache said only 'index header damaged'."""
    data = tmp_path / "data"
    with headwater.open(data, segment_bytes_max=64 * 1024, index_cache_segments=1) as hw:
        hw.admin.create_queue("q", partitions=1)
        for _i in range(60):
            hw.send("q", b"x" * 3000)
        idx = data / "log" / "00000000000000000000.idx"
        idx.write_bytes(b"\0" * 64)
        with pytest.raises(CorruptDataError, match="00000000000000000000.idx"):
            list(hw.scanner("q"))


# -- retention deleting a segment between a lookup's plan and its read ----------------------


def test_lookups_racing_retention_say_not_retained_or_look_again(tmp_path, clock, monkeypatch):
    """Retention may delete a segment after a lookup planned to read it: a lookup by key looks
    again, and one by id says the message is no longer retained (both raised a bare
    "segment ... was deleted" StorageError)."""
    from headwater.errors import MessageNotFoundError

    hw = headwater.open(tmp_path / "data", segment_bytes_max=64 * 1024, clock=clock)
    store = hw.service.store
    real = store._read_plan

    def read_after_retention(plan):
        monkeypatch.setattr(store, "_read_plan", real)
        clock.advance(40)  # what was sent 40 s before the last message expires now, before it is read
        assert store.enforce_retention() > 0
        return real(plan)

    def fill() -> headwater.MessageId:
        first = p.send_and_wait("q", headwater.Message(b"x" * 20_000, key=b"k"))
        for _ in range(6):
            p.send_and_wait("q", headwater.Message(b"y" * 20_000, key=b"k"))
        clock.advance(30)
        p.send_and_wait("q", headwater.Message(b"z", key=b"k"))  # keeps the queue's tail alive
        return first

    try:
        hw.admin.create_queue("q", ttl_s=60)
        p = hw.producer()
        fill()
        monkeypatch.setattr(store, "_read_plan", read_after_retention)
        found = [r.body for r in hw.find("q", b"k")]
        assert found == [b"z"]  # the rest expired meanwhile
        first = fill()
        monkeypatch.setattr(store, "_read_plan", read_after_retention)
        with pytest.raises(MessageNotFoundError, match="no longer retained"):
            hw.get(first)
    finally:
        hw.close()


def test_a_broker_killed_with_its_disk_full_starts_again_and_serves(small_disk):
    """Issue 30, finding 5: after delayed sends failed on a full disk, SIGKILL and restart
    were refused ('cannot write .../delay/dispatch.ckpt: No space left on device'). The
    broker now starts, serves what it holds, refuses delayed sends while the disk is full
    (naming it), and takes them again once there is room."""
    data = small_disk / "data"
    broker = BrokerProcess(data).start()
    try:
        with headwater.connect(broker.address) as hw:
            hw.admin.create_queue("q")
            hw.send("q", b"before")
            p = hw.producer(retries=0)
            pending = p.send_and_wait("q", b"later", delay=3600)
            filler = fill(small_disk)
            with pytest.raises(StorageError, match="No space left"):
                for i in range(50):  # until a bucket write meets the full disk
                    p.send_and_wait("q", b"x" * 4096, delay=3600 + i)
        broker.kill()
        broker.start()
        with headwater.connect(broker.address) as hw:
            assert [r.body for r in hw.scanner("q")] == [b"before"]
            assert hw.get(pending).body == b"later"  # still pending, still known
            assert any("dispatch checkpoint could not be moved" in line for line in hw.status()["recovery"])
            with pytest.raises(StorageError, match="No space left"):
                hw.producer(retries=0).send_and_wait("q", b"y" * 4096, delay=60)
            filler.unlink()
            again = hw.producer().send_and_wait("q", b"room again", delay=60)
            assert hw.get(again).body == b"room again"
    finally:
        broker.kill()
