"""Crash recovery and damage: SIGKILLed writers, cut, flipped and padded files, lost indexes,
and the data directory lock, all against real files and real processes.

The promise under test (DESIGN.md, "Model and storage"): every acknowledged message is
readable after a restart, exactly once and in order; a torn or damaged tail (beyond the
recovery point) is detected by checksum and cut, never served; damage inside flushed data
is skipped and reported, and costs only the batches it hit; the store keeps working
afterwards.

Positions and sizes are drawn from a seed printed in every failure message; rerun one with
``HEADWATER_SEED=<seed> pytest tests/test_recovery.py``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from itertools import zip_longest
from pathlib import Path
from typing import NamedTuple

import pytest

import headwater
from headwater import MessageId
from headwater.errors import CorruptDataError, DataDirectoryLockedError, MessageNotFoundError, ReadOnlyStoreError
from headwater.storage.loader import REPAIR_HINT
from headwater.storage.recovery_point import RECOVERY_POINT_FILE
from headwater.storage.segment_index import SegmentIndex
from tests.support.crashdata import (
    BatchLoc,
    expected_tuple,
    message_for,
    parse_acks,
    read_layout,
    record_tuple,
)

SEED = int(os.environ.get("HEADWATER_SEED") or random.randrange(2**32))
SUPPORT = Path(__file__).parent / "support"
SEGMENT_BYTES = 64 * 1024  # the smallest allowed: every test crosses many segment rolls
HEADER = 64  # bytes of a segment file's header


def _ctx(**kw) -> str:
    where = " ".join(f"{k}={v}" for k, v in kw.items())
    return f"seed={SEED} (rerun with HEADWATER_SEED={SEED}) {where}"


@contextlib.contextmanager
def storage_warnings():
    """Collect the warnings the storage engine logs inside the block."""
    got: list[logging.LogRecord] = []

    class _Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            got.append(record)

    logger = logging.getLogger("headwater.storage")
    handler = _Collect(level=logging.WARNING)
    old_level = logger.level
    logger.addHandler(handler)
    if logger.getEffectiveLevel() > logging.WARNING:
        logger.setLevel(logging.WARNING)
    try:
        yield got
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)


def assert_partition(hw, partition: int, want, ctx: str, *, start: int = 0) -> int:
    """Stream-compare the records of ``partition`` from ``start`` with ``want`` (an iterable
    of expected tuples); return how many matched."""

    def show(t):
        return None if t is None else (t[0], f"{len(t[1])} bytes", t[1][:16], t[2], t[3])

    n = 0
    scan = hw.scanner("q", partitions=partition, start=start)
    for got_r, want_t in zip_longest(scan, want):
        got_t = None if got_r is None else record_tuple(got_r)
        if got_t != want_t:
            pytest.fail(
                f"partition {partition}, record #{n} after offset {start}: served "
                f"{show(got_t)}, expected {show(want_t)}; {ctx}"
            )
        n += 1
    return n


# -- SIGKILL of a writer -------------------------------------------------------------------


class KillRig:
    """Rounds of: start a writer child, SIGKILL it at a random moment, reopen, check.

    ``verified[p]`` is the end offset of partition ``p`` the last check saw, every message
    below it having been compared byte for byte; a full check re-reads from offset 0.
    """

    def __init__(self, tmp: Path, *, partitions: int, threads: int, seed: int) -> None:
        self.tmp = tmp
        self.data = tmp / "data"
        self.partitions = partitions
        self.threads = threads
        self.seed = seed
        self.rng = random.Random(seed)
        self.verified = [0] * partitions
        self.acked_total = 0
        self.unacked_kept = 0
        self.cuts = 0
        with headwater.open(self.data, flush="sync", segment_bytes_max=SEGMENT_BYTES) as hw:
            hw.admin.create_queue("q", partitions=partitions, ttl_s=None)

    def _wait_ready(self, child: subprocess.Popen, acks: Path, ctx: str) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if acks.exists() and acks.read_bytes().startswith(b"ready\n"):
                return
            if child.poll() is not None:
                break
            time.sleep(0.005)
        pytest.fail(f"the writer never became ready (exit {child.poll()}): {self._stderr(ctx)}")

    def _stderr(self, ctx: str) -> str:
        err = self.tmp / "child.err"
        return f"{ctx}; child stderr: {err.read_text()[-3000:] if err.exists() else ''}"

    def round(self, r: int, *, full_check: bool) -> None:
        acks = self.tmp / f"acks-{r}.txt"
        early = self.rng.random() < 0.2  # kill at any moment, start-up and recovery included
        delay = self.rng.uniform(0.05, 0.5)
        ctx = _ctx(round=r, early=early, delay=f"{delay:.3f}", threads=self.threads)
        with (self.tmp / "child.err").open("wb") as err:
            child = subprocess.Popen(
                [
                    sys.executable,
                    str(SUPPORT / "appender.py"),
                    str(self.data),
                    str(acks),
                    f"{self.seed}:{r}",
                    str(self.threads),
                    str(SEGMENT_BYTES),
                ],
                stdout=err,
                stderr=err,
            )
        try:
            if not early:
                self._wait_ready(child, acks, ctx)
            time.sleep(delay)
            if child.poll() is not None:
                pytest.fail(f"the writer exited by itself with {child.returncode}: {self._stderr(ctx)}")
            os.kill(child.pid, signal.SIGKILL)
        finally:
            if child.poll() is None:
                child.kill()
            child.wait()
        _, got = parse_acks(acks.read_text() if acks.exists() else "")
        acked_end = list(self.verified)
        for p, base, n in got:
            # the child saw exactly what the last check saw, then appended contiguously
            assert base == acked_end[p], f"partition {p}: acked base {base}, expected {acked_end[p]}; {ctx}"
            acked_end[p] = base + n
            self.acked_total += n
        self.check(acked_end, full=full_check, verify="all" if r % 4 == 3 else "tail", ctx=ctx)

    def check(self, acked_end: list[int], *, full: bool, verify: str, ctx: str) -> None:
        with storage_warnings() as warns:
            hw = headwater.open(self.data, flush="sync", segment_bytes_max=SEGMENT_BYTES, verify=verify)
        self.cuts += len(warns)
        try:
            info = hw.admin.describe_queue("q")
            for p, pi in enumerate(info.partitions):
                assert pi.start_offset == 0, ctx
                assert pi.end_offset >= acked_end[p], (
                    f"partition {p} ends at {pi.end_offset}: acknowledged messages up to {acked_end[p]} are lost; {ctx}"
                )
                assert pi.end_offset >= self.verified[p], (
                    f"partition {p} ends at {pi.end_offset}, below {self.verified[p]} seen by the "
                    f"previous check (after a clean close); {ctx}"
                )
                start = 0 if full else self.verified[p]
                # whatever lies beyond the acks must be what the writer was writing, intact
                n = assert_partition(
                    hw,
                    p,
                    (expected_tuple(p, o) for o in range(start, pi.end_offset)),
                    f"{ctx} verify={verify}",
                    start=start,
                )
                assert n == pi.end_offset - start
                self.unacked_kept += pi.end_offset - acked_end[p]
                self.verified[p] = pi.end_offset
        finally:
            hw.close()


def _kill_rounds(tmp_path: Path, *, rounds: int, partitions: int, threads: int, full_every: int) -> None:
    rig = KillRig(tmp_path, partitions=partitions, threads=threads, seed=SEED)
    for r in range(rounds):
        rig.round(r, full_check=r % full_every == 0 or r == rounds - 1)
    assert rig.acked_total > 0, "no round acknowledged anything: the test proved nothing"
    print(
        f"\n{rounds} rounds, {threads} thread(s): {rig.acked_total} messages acknowledged, "
        f"{rig.unacked_kept} unacknowledged ones kept intact, {rig.cuts} recovery cut(s); {_ctx()}"
    )


@pytest.mark.timeout(300)
def test_sigkill_loses_no_acknowledged_message(tmp_path):
    _kill_rounds(tmp_path, rounds=15, partitions=4, threads=1, full_every=1)


@pytest.mark.timeout(300)
def test_sigkill_with_concurrent_appenders(tmp_path):
    """Several threads share fsyncs (group commit); each owns some partitions."""
    _kill_rounds(tmp_path, rounds=8, partitions=8, threads=4, full_every=1)


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_sigkill_soak(tmp_path):
    _kill_rounds(tmp_path, rounds=200, partitions=4, threads=1, full_every=25)


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_sigkill_soak_concurrent(tmp_path):
    _kill_rounds(tmp_path, rounds=100, partitions=8, threads=4, full_every=25)


# -- damage to the files of a closed store -------------------------------------------------

PARTS = 3


class Pristine(NamedTuple):
    data: Path
    queue_id: int
    segments: list[str]  # file names, in order
    batches: list[BatchLoc]

    def sizes(self) -> list[int]:
        return [(self.data / "log" / s).stat().st_size for s in self.segments]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Pristine:
    """A closed store of ~10 segments: 3 partitions, plain and compressed batches."""
    data = tmp_path_factory.mktemp("pristine") / "data"
    with headwater.open(data, segment_bytes_max=SEGMENT_BYTES) as hw:
        queue_id = hw.admin.create_queue("q", partitions=PARTS, ttl_s=None).queue_id
        producers = [hw.producer(), hw.producer(compression="zstd"), hw.producer(compression="lz4")]
        rng = random.Random(20240601)  # fixed: the layout is the same every run
        nxt = [0] * PARTS
        for _ in range(90):
            p, k = rng.randrange(PARTS), rng.randint(1, 20)
            msgs = [message_for(p, nxt[p] + i) for i in range(k)]
            rng.choice(producers).send_batch("q", msgs, partition=p)
            nxt[p] += k
    paths, batches = read_layout(data / "log")
    assert len(paths) >= 6, "the pristine store should span several segments"
    assert all((data / "log" / p.name).with_suffix(".idx").exists() for p in paths[:-1])
    return Pristine(data, queue_id, [p.name for p in paths], batches)


def _expected(survivors, gen_tail: dict[int, list[tuple]] | None = None) -> dict[int, list[tuple]]:
    out: dict[int, list[tuple]] = {p: [] for p in range(PARTS)}
    for b in sorted(survivors, key=lambda b: (b.partition, b.base_offset)):
        offsets = range(b.base_offset, b.base_offset + b.count)
        out[b.partition].extend(expected_tuple(b.partition, o) for o in offsets)
    for p, extra in (gen_tail or {}).items():
        out[p].extend(extra)
    return out


def _assert_store(hw, want: dict[int, list[tuple]], ctx: str) -> None:
    info = hw.admin.describe_queue("q")
    for p in range(PARTS):
        end = want[p][-1][0] + 1 if want[p] else 0
        assert info.partitions[p].end_offset == end, f"partition {p}: {info.partitions[p]}; {ctx}"
        assert_partition(hw, p, want[p], ctx)


def check_recovered(data: Path, survivors, ctx: str, *, warned: bool, verify: str = "tail") -> dict:
    """Open a damaged copy and check the promise (issue 30's acceptance, for every case):

    - read-only first: it serves exactly the survivors (nothing outside the damage lost,
      nothing damaged served as good) and leaves every file byte-identical;
    - then the repair (a read-write open, as ``check --repair`` does): the same survivors;
      append, close, reopen: everything is there;
    - then ``check`` (a read-only open verifying every segment) finds nothing left to repair.
    """
    before = _tree(data)
    with storage_warnings():
        ro = headwater.open(data, segment_bytes_max=SEGMENT_BYTES, verify=verify, read_only=True)
    try:
        _assert_store(ro, _expected(survivors), ctx + " (read-only)")
    finally:
        ro.close()
    assert _tree(data) == before, f"a read-only open changed files; {ctx}"
    with storage_warnings() as warns:
        hw = headwater.open(data, segment_bytes_max=SEGMENT_BYTES, verify=verify)
    try:
        assert bool(warns) == warned, f"warnings {[w.getMessage() for w in warns]}, expected {warned}; {ctx}"
        want = _expected(survivors)
        _assert_store(hw, want, ctx)
        # the store keeps working: append a new generation after what survived
        prod = hw.producer()
        for p in range(PARTS):
            for _ in range(2):
                start = want[p][-1][0] + 1 if want[p] else 0
                prod.send_batch("q", [message_for(p, start + i, 1) for i in range(5)], partition=p)
                want[p].extend(expected_tuple(p, start + i, 1) for i in range(5))
        _assert_store(hw, want, ctx + " after appending")
    finally:
        hw.close()
    with storage_warnings() as warns:
        hw = headwater.open(data, segment_bytes_max=SEGMENT_BYTES, verify=verify)
    try:
        # damage skipped in flushed data stays where it is (and is reported again); a cut is final
        repeated = [w.getMessage() for w in warns if not w.getMessage().startswith("skipped ")]
        assert not repeated, f"a second open still cut something: {repeated}; {ctx}"
        _assert_store(hw, want, ctx + " after reopening")
    finally:
        hw.close()
    with storage_warnings(), headwater.open(data, verify="all", read_only=True) as checked:  # `headwater check`
        left = [m for m in checked.status()["recovery"] if REPAIR_HINT in m]  # skipped damage stays reported
    assert not left, f"check still finds work for a repair: {left}; {ctx}"
    return want


def _copy(pristine: Pristine, dest: Path, *, closed_cleanly: bool = False) -> Path:
    """A copy of the pristine store. Unless ``closed_cleanly``, as a crash after the last
    fsync leaves it: without the index and producer snapshot a clean close writes for the
    last segment, so opening reads that segment (what these tests damage and cut)."""
    shutil.copytree(pristine.data, dest)
    (dest / ".lock").unlink(missing_ok=True)
    if not closed_cleanly:
        last = Path(pristine.segments[-1])
        for suffix in (".idx", ".producers"):
            (dest / "log" / last.with_suffix(suffix)).unlink()
    return dest


def _unflushed(data: Path) -> Path:
    """Make the copy look like a crash before its last segment was known flushed (no
    recovery point): its tail is then checked as a possible torn write, and cut."""
    (data / "log" / RECOVERY_POINT_FILE).unlink()
    return data


def _flip(path: Path, positions: list[int], rng: random.Random) -> None:
    with path.open("r+b") as f:
        for pos in positions:
            f.seek(pos)
            b = f.read(1)[0]
            f.seek(pos)
            f.write(bytes([b ^ rng.randint(1, 255)]))


CASES = 12  # per damage kind in the default run
CASES_SLOW = 150  # per damage kind in test_damage_soak


def _truncate_last(tmp_path: Path, pristine: Pristine, cases: int) -> None:
    rng = random.Random(SEED)
    last = len(pristine.segments) - 1
    size = pristine.sizes()[last]
    in_last = [b for b in pristine.batches if b.segment == last]
    boundaries = {HEADER} | {b.end for b in in_last}
    for case in range(cases):
        if case == 0:
            cut = rng.randrange(0, HEADER)  # shorter than the header: a segment torn at birth
        elif rng.random() < 0.4:
            b = rng.choice(in_last)
            cut = max(0, min(size - 1, rng.choice([b.start, b.end]) + rng.choice([-1, 0, 1])))
        else:
            cut = rng.randrange(0, size)
        ctx = _ctx(case=case, damage=f"truncate last segment to {cut} of {size} bytes")
        data = _unflushed(_copy(pristine, tmp_path / f"case{case}"))
        os.truncate(data / "log" / pristine.segments[last], cut)
        survivors = [b for b in pristine.batches if b.segment < last or b.end <= cut]
        check_recovered(data, survivors, ctx, warned=cut not in boundaries)


def test_truncated_last_segment(tmp_path, pristine):
    _truncate_last(tmp_path, pristine, CASES)


def _flip_last(tmp_path: Path, pristine: Pristine, cases: int) -> None:
    rng = random.Random(SEED + 1)
    last = len(pristine.segments) - 1
    size = pristine.sizes()[last]
    for case in range(cases):
        positions = sorted(rng.randrange(HEADER, size) for _ in range(rng.randint(1, 4)))
        ctx = _ctx(case=case, damage=f"flip bytes {positions} of the last segment ({size} bytes)")
        data = _unflushed(_copy(pristine, tmp_path / f"case{case}"))
        _flip(data / "log" / pristine.segments[last], positions, rng)
        bad = next(b for b in pristine.batches if b.segment == last and b.start <= positions[0] < b.end)
        survivors = [b for b in pristine.batches if b.segment < last or b.end <= bad.start]
        check_recovered(data, survivors, ctx, warned=True)


def test_flipped_bytes_in_last_segment(tmp_path, pristine):
    _flip_last(tmp_path, pristine, CASES)


def _flip_sealed(tmp_path: Path, pristine: Pristine, cases: int) -> None:
    rng = random.Random(SEED + 2)
    sizes = pristine.sizes()
    for case in range(cases):
        seg = rng.randrange(0, len(pristine.segments) - 1)
        positions = sorted(rng.randrange(HEADER, sizes[seg]) for _ in range(rng.randint(1, 3)))
        ctx = _ctx(case=case, damage=f"flip bytes {positions} of sealed segment #{seg}")
        data = _copy(pristine, tmp_path / f"case{case}")
        _flip(data / "log" / pristine.segments[seg], positions, rng)
        damaged = [b for b in pristine.batches if b.segment == seg and any(b.start <= x < b.end for x in positions)]
        bad = damaged[0]

        # verify="tail" trusts the sealed segment's index: the damage is found by the reader,
        # which refuses it (CorruptDataError) after serving only intact records
        with storage_warnings() as warns:
            hw = headwater.open(data, segment_bytes_max=SEGMENT_BYTES)
        try:
            assert not warns, ctx
            want = _expected(pristine.batches)
            for p in range(PARTS):
                served = []
                try:
                    served.extend(record_tuple(r) for r in hw.scanner("q", partitions=p))
                except CorruptDataError:
                    assert any(b.partition == p for b in damaged), f"partition {p} wrongly refused; {ctx}"
                else:
                    assert not any(b.partition == p for b in damaged), f"damage in partition {p} served; {ctx}"
                assert served == want[p][: len(served)], f"partition {p}; {ctx}"
        finally:
            hw.close()

        # verify="all" re-reads every segment; a sealed segment is flushed data, so the
        # damaged batches are skipped (reported) and everything else stays readable
        survivors = [b for b in pristine.batches if b not in damaged]
        want = check_recovered(data, survivors, ctx, warned=True, verify="all")
        # offsets inside a gap (below data kept after it) name nothing: a lookup says so and
        # a scan bounded inside the gap ends, instead of spinning
        kept_end = max((b.base_offset + b.count for b in survivors if b.partition == bad.partition), default=0)
        gap = [o for o in range(bad.base_offset, bad.base_offset + bad.count) if o < kept_end]
        if not gap:
            continue  # the damage took the partition's tail: its offsets were reused by new appends
        o = rng.choice(gap)
        with headwater.open(data, segment_bytes_max=SEGMENT_BYTES) as hw:
            with pytest.raises(MessageNotFoundError):
                hw.get(MessageId(pristine.queue_id, bad.partition, o))
            below = [record_tuple(r) for r in hw.scanner("q", partitions=bad.partition, stop=o + 1)]
            assert below == [t for t in want[bad.partition] if t[0] < o], ctx


def test_after_a_clean_close_the_last_segment_is_trusted_like_a_sealed_one(tmp_path, pristine, monkeypatch):
    """Issue 32, target 5: opening read the whole last segment even after a clean close
    (0.5 s for 77 MB). The close writes its index and producer snapshot; opening uses them
    and reads no segment. Damage there is then found by the reader, as in a sealed
    segment, and by verify="all" at open; a crash (no such index) reads it as before."""
    from headwater.storage import loader

    scanned: list[str] = []
    real_scan = loader.scan_segment
    monkeypatch.setattr(
        loader, "scan_segment", lambda seg, *a, **k: scanned.append(seg.path.name) or real_scan(seg, *a, **k)
    )
    data = _copy(pristine, tmp_path / "clean", closed_cleanly=True)
    with headwater.open(data, segment_bytes_max=SEGMENT_BYTES) as hw:
        assert scanned == []
        _assert_store(hw, _expected(pristine.batches), "clean")
        hw.send_batch("q", [b"after"], partition=0)  # the segment grows past its index
    assert scanned == []
    with headwater.open(data, segment_bytes_max=SEGMENT_BYTES) as hw:  # closed cleanly again: trusted
        assert scanned == [] and [r.body for r in hw.scanner("q", partitions=0)][-1] == b"after"
    crashed = _copy(pristine, tmp_path / "crashed")
    with headwater.open(crashed, segment_bytes_max=SEGMENT_BYTES) as hw:
        assert scanned == [pristine.segments[-1]]
        _assert_store(hw, _expected(pristine.batches), "crashed")
    # the last run appended after the clean close's index, then died: the index is stale
    running = _copy(pristine, tmp_path / "running", closed_cleanly=True)
    with headwater.open(running, segment_bytes_max=SEGMENT_BYTES) as hw:
        hw.send_batch("q", [b"after"], partition=1)
        hw.service.flush()
        stale = _copy(Pristine(running, 0, [], []), tmp_path / "stale", closed_cleanly=True)  # the disk now
    scanned.clear()
    with headwater.open(stale, segment_bytes_max=SEGMENT_BYTES) as hw:
        assert scanned == [pristine.segments[-1]]
        assert [r.body for r in hw.scanner("q", partitions=1)][-1] == b"after"


@pytest.mark.timeout(30)  # a hang here is the bug this test found
def test_flipped_bytes_in_sealed_segment(tmp_path, pristine):
    _flip_sealed(tmp_path, pristine, CASES)


def _damage_flushed_last(tmp_path: Path, pristine: Pristine, cases: int) -> None:
    """The probe of issue 30: 64 bytes of 0xff written into the middle of a flushed last
    segment; and a page the disk gave back as zeros. Opening skips the batches hit, reports
    them and the offsets they held, cuts nothing, and every other message stays readable."""
    rng = random.Random(SEED + 5)
    last = len(pristine.segments) - 1
    in_last = [b for b in pristine.batches if b.segment == last]
    for case in range(cases):
        # never the final batch: damage that nothing valid follows is a tail (cut)
        first = rng.choice(in_last[:-1])
        if case % 2:  # a zeroed page (4 KiB, aligned in the file)
            fill, at = b"\0", max(HEADER, rng.randrange(first.start, first.end) // 4096 * 4096)
            end = min(at + 4096, in_last[-1].start)
        else:
            fill, at = b"\xff", rng.randrange(first.start, first.end)
            end = min(at + 64, in_last[-1].start)  # the damage stops before the final batch
        hit = [b for b in in_last if b.start < end and at < b.end]
        ctx = _ctx(case=case, damage=f"{fill!r} over bytes {at}-{end} of the flushed last segment")
        data = _copy(pristine, tmp_path / f"case{case}")
        with (data / "log" / pristine.segments[last]).open("r+b") as f:
            f.seek(at)
            f.write(fill * (end - at))
        with storage_warnings() as warns:
            hw = headwater.open(data, segment_bytes_max=SEGMENT_BYTES)
        try:
            said = [w.getMessage() for w in warns]
            assert said and all(m.startswith("skipped ") for m in said), f"{said}; {ctx}"
            assert f"bytes {hit[0].start}-{hit[-1].end}" in said[0], f"{said}; {ctx}"
            report = hw.status()["recovery"]
            assert any(m.startswith("skipped ") for m in report), ctx
            for b in hit:  # each partition hit says which offsets it lost, when later data shows it
                later = [x for x in pristine.batches if x.partition == b.partition and x.start > b.start]
                if later:
                    assert any(f"partition {b.partition}: offsets" in m for m in report), f"{report}; {ctx}"
        finally:
            hw.close()
        survivors = [b for b in pristine.batches if b not in hit]
        # reported once: the clean close after it wrote the index that leaves the damage out
        check_recovered(data, survivors, ctx, warned=False)


def test_damage_inside_flushed_data_costs_only_itself(tmp_path, pristine):
    _damage_flushed_last(tmp_path, pristine, CASES)


def test_a_last_segment_shorter_than_its_recovery_point_is_reported(tmp_path, pristine):
    """Flushed data missing from the disk (a file cut by hand, a disk that lost confirmed
    writes) cannot come back; opening says so instead of passing it off as a torn write."""
    last = len(pristine.segments) - 1
    in_last = [b for b in pristine.batches if b.segment == last]
    data = _copy(pristine, tmp_path / "data")
    os.truncate(data / "log" / pristine.segments[last], in_last[-2].end)
    with storage_warnings() as warns:
        hw = headwater.open(data, segment_bytes_max=SEGMENT_BYTES)
    try:
        said = [w.getMessage() for w in warns]
        missing = in_last[-1].end - in_last[-2].end
        assert said == [
            f"{pristine.segments[last]} ends {missing} bytes before the recovery point: flushed data is "
            f"missing from the disk (the file was cut, or the disk lost writes it had confirmed)"
        ]
        assert said[0] in hw.status()["recovery"]
    finally:
        hw.close()


def test_the_recovery_point_follows_the_flushed_log(tmp_path):
    """Written when a store opens and closes, and by the flusher as fsyncs complete; a
    damaged or foreign file is reported and ignored, never trusted."""
    from headwater.storage.recovery_point import read_recovery_point, write_recovery_point
    from headwater.storage.store import LogStore

    data = tmp_path / "data"
    report: list[str] = []
    with headwater.open(data, flush_interval_ms=20) as hw:
        hw.admin.create_queue("q", ttl_s=None)
        store = hw.service.store
        store_id, log_dir = store.store_id, data / "log"
        assert read_recovery_point(log_dir, store_id, report) == store.end_position  # written at open
        hw.send_batch("q", [b"x" * 100] * 100)
        deadline = time.monotonic() + 10
        while read_recovery_point(log_dir, store_id, report) != store.end_position:
            assert time.monotonic() < deadline, "the flusher never moved the recovery point"
            time.sleep(0.05)
        assert isinstance(store, LogStore)
    assert not report
    path = log_dir / RECOVERY_POINT_FILE
    good, written_ns = path.read_bytes(), path.stat().st_mtime_ns
    with headwater.open(data):  # after a clean close the point covers the log: nothing to write
        pass
    assert path.stat().st_mtime_ns == written_ns and path.read_bytes() == good
    write_recovery_point(log_dir, bytes(16), 123)  # another store's
    assert read_recovery_point(log_dir, store_id, report) == 0 and "another store" in report[-1]
    path.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
    assert read_recovery_point(log_dir, store_id, report) == 0 and "damaged" in report[-1]


def _tree(d: Path) -> dict[str, tuple[bytes, int]]:
    """Every file below ``d`` but the lock file (a copied store has none; the open makes
    an empty one to lock): its bytes and modification time."""
    files = [p for p in sorted(d.rglob("*")) if p.is_file() and p.name != ".lock"]
    return {str(p.relative_to(d)): (p.read_bytes(), p.stat().st_mtime_ns) for p in files}


def test_a_read_only_open_changes_no_file_and_names_the_repair(tmp_path, pristine):
    """A torn tail, a half-made segment, a lost index and a stray temp file: opened
    read-only, the store serves what is intact, says what a repair would do and which
    command does it, refuses writes, and leaves every byte and every file where it was."""
    last = len(pristine.segments) - 1
    in_last = [b for b in pristine.batches if b.segment == last]
    data = _unflushed(_copy(pristine, tmp_path / "data"))
    log_dir = data / "log"
    os.truncate(log_dir / pristine.segments[last], in_last[-1].end - 7)  # a torn last batch
    (log_dir / pristine.segments[0]).with_suffix(".idx").unlink()  # rebuilt in memory only
    (log_dir / "00000000000999999999.log").write_bytes(b"")  # created, never written
    (log_dir / "headwater.json.tmp").write_bytes(b"half")
    before = _tree(data)
    with storage_warnings() as warns:
        hw = headwater.open(data, segment_bytes_max=SEGMENT_BYTES, read_only=True)
    try:
        said = [w.getMessage() for w in warns]
        report = hw.status()["recovery"]
        assert any("are damaged" in m and "headwater check --repair" in m for m in report), report
        assert any("never written" in m and "headwater check --repair" in m for m in report), report
        assert said, "the repair a read-only open could not make is logged"
        _assert_store(hw, _expected(pristine.batches[:-1]), "read-only")
        for write in (
            lambda: hw.send("q", b"x"),
            lambda: hw.admin.create_queue("other"),
            lambda: hw.admin.truncate_queue("q"),
            lambda: hw.send("q", b"later", delay=3600),
        ):
            with pytest.raises(ReadOnlyStoreError, match="read-only"):
                write()
        with headwater.open(data, read_only=True) as second:  # readers share the directory
            assert second.admin.describe_queue("q").queue_id == pristine.queue_id
        with pytest.raises(DataDirectoryLockedError):
            headwater.open(data)  # a writer waits for the readers
    finally:
        hw.close()
    assert _tree(data) == before
    # the repair is the read-write open, which copies what it cuts to quarantine/ first
    with headwater.open(data, segment_bytes_max=SEGMENT_BYTES) as hw:
        report = hw.status()["recovery"]
    assert any(m.startswith("cut ") and "copied to quarantine/" in m for m in report), report
    (kept,) = (data / "quarantine").iterdir()
    torn = in_last[-1]
    original = (pristine.data / "log" / pristine.segments[last]).read_bytes()
    assert kept.read_bytes() == original[torn.start : torn.end - 7]


def _damage_index(tmp_path: Path, pristine: Pristine, cases: int) -> None:
    rng = random.Random(SEED + 3)
    modes = ["delete", "truncate", "flip", "wrong size", "other segment's", "garbage"]
    for case in range(max(cases, len(modes))):
        seg = rng.randrange(0, len(pristine.segments) - 1)
        mode = modes[case % len(modes)]
        ctx = _ctx(case=case, damage=f"{mode} index of sealed segment #{seg}")
        data = _copy(pristine, tmp_path / f"case{case}")
        idx_path = (data / "log" / pristine.segments[seg]).with_suffix(".idx")
        original = idx_path.read_bytes()
        if mode == "delete":
            idx_path.unlink()
        elif mode == "truncate":
            os.truncate(idx_path, rng.randrange(0, len(original)))
        elif mode == "flip":
            _flip(idx_path, [rng.randrange(0, len(original))], rng)
        elif mode == "wrong size":  # checksums fine, but it describes another length
            idx = SegmentIndex.from_bytes(original)
            idx.segment_size += rng.choice([-1, 1])
            idx_path.write_bytes(idx.to_bytes())
        elif mode == "other segment's":
            other = (seg + 1) % (len(pristine.segments) - 1)
            other_path = (data / "log" / pristine.segments[other]).with_suffix(".idx")
            if other == seg:
                continue
            shutil.copyfile(other_path, idx_path)
        else:
            idx_path.write_bytes(rng.randbytes(rng.randrange(1, 4000)))
        check_recovered(data, pristine.batches, ctx, warned=mode != "delete")
        # the rebuilt index says exactly what the lost one said
        assert SegmentIndex.read(idx_path).to_bytes() == original, ctx


def test_damaged_or_missing_index_is_rebuilt(tmp_path, pristine):
    _damage_index(tmp_path, pristine, CASES)


def _junk_after_last(tmp_path: Path, pristine: Pristine, cases: int) -> None:
    rng = random.Random(SEED + 4)
    last = len(pristine.segments) - 1
    last_batch = [b for b in pristine.batches if b.segment == last][-1]
    kinds = ["random", "zeros", "torn copy", "whole copy"]
    for case in range(cases):
        kind = kinds[case % len(kinds)]
        path = pristine.data / "log" / pristine.segments[last]
        batch = path.read_bytes()[last_batch.start : last_batch.end]
        if kind == "random":
            junk = rng.randbytes(rng.randint(1, 3000))
        elif kind == "zeros":
            junk = bytes(rng.randint(1, 3000))
        elif kind == "torn copy":  # a batch whose write stopped part way
            junk = batch[: rng.randrange(1, len(batch))]
        else:  # a valid batch that repeats offsets already stored
            junk = batch
        ctx = _ctx(case=case, damage=f"{kind} junk of {len(junk)} bytes after the last batch")
        data = _copy(pristine, tmp_path / f"case{case}")
        with (data / "log" / pristine.segments[last]).open("ab") as f:
            f.write(junk)
        check_recovered(data, pristine.batches, ctx, warned=True)


def test_junk_after_last_segment(tmp_path, pristine):
    _junk_after_last(tmp_path, pristine, CASES)


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_damage_soak(tmp_path, pristine):
    kinds = [_truncate_last, _flip_last, _flip_sealed, _damage_index, _junk_after_last, _damage_flushed_last]
    for i, fn in enumerate(kinds):
        d = tmp_path / f"kind{i}"
        d.mkdir()
        fn(d, pristine, CASES_SLOW)


def test_crash_during_segment_roll(tmp_path, pristine):
    """A crash right after creating the next segment file leaves it shorter than a header;
    a crash while writing an index leaves a temp file. Both are removed; nothing is lost."""
    rng = random.Random(SEED + 5)
    for case in range(4):
        data = _copy(pristine, tmp_path / f"case{case}")
        last = data / "log" / pristine.segments[-1]
        next_base = int(last.stem) + last.stat().st_size
        torn = rng.randrange(0, HEADER)
        (data / "log" / f"{next_base:020d}.log").write_bytes(rng.randbytes(torn))
        (last.with_suffix(".idx.tmp")).write_bytes(rng.randbytes(100))
        ctx = _ctx(case=case, damage=f"next segment torn at {torn} bytes")
        check_recovered(data, pristine.batches, ctx, warned=True)
        assert not list((data / "log").glob("*.tmp")), ctx


def test_damaged_segment_header_refuses_to_open(tmp_path, pristine):
    """A segment whose header fails its checksum is not silently dropped with its data:
    opening fails loudly, naming the file, and leaves the directory unlocked."""
    rng = random.Random(SEED + 6)
    for case in range(4):
        data = _copy(pristine, tmp_path / f"case{case}")
        seg = rng.randrange(len(pristine.segments))
        path = data / "log" / pristine.segments[seg]
        _flip(path, [rng.randrange(0, HEADER)], rng)
        fds = len(os.listdir("/proc/self/fd"))
        for _ in range(2):  # the second try must not find the directory still locked
            with pytest.raises(CorruptDataError, match=path.name):
                headwater.open(data, segment_bytes_max=SEGMENT_BYTES)
        assert len(os.listdir("/proc/self/fd")) == fds, f"a failed open leaked file descriptors; {_ctx(case=case)}"


def test_crash_while_creating_a_store(tmp_path):
    """Killed during the very first open, after the catalog's temp file was written but
    before it was renamed: the directory holds only our own files and must open."""
    data = tmp_path / "data"
    (data / "log").mkdir(parents=True)
    (data / ".lock").write_text("12345\n")
    (data / "headwater.json.tmp").write_bytes(b'{"format": "headwater-st')
    with headwater.open(data) as hw:
        hw.admin.create_queue("q", ttl_s=None)
        hw.send("q", b"x")
    with headwater.open(data) as hw:
        assert [r.body for r in hw.scanner("q")] == [b"x"]


# -- the directory lock --------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_second_process_is_locked_out_until_the_owner_dies(tmp_path):
    data, ready = tmp_path / "data", tmp_path / "ready"
    with (tmp_path / "child.err").open("wb") as err:
        child = subprocess.Popen(
            [sys.executable, str(SUPPORT / "holder.py"), str(data), str(ready)], stdout=err, stderr=err
        )
    try:
        deadline = time.monotonic() + 30
        while not (ready.exists() and ready.read_text().endswith("\n")):
            assert child.poll() is None, (tmp_path / "child.err").read_text()
            assert time.monotonic() < deadline, "the holder never became ready"
            time.sleep(0.01)
        with pytest.raises(DataDirectoryLockedError, match=f"pid {child.pid}"):
            headwater.open(data)
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    # the kernel released the flock with the process: no stale lock to clean up by hand
    with headwater.open(data) as hw:
        assert [r.body for r in hw.scanner("q")] == [b"held"]


READER = """
import sys, time
import headwater
hw = headwater.open(sys.argv[1], read_only=True)
open(sys.argv[2], "w").write("ready\\n")
time.sleep(60)
"""


@pytest.mark.timeout(120)
def test_a_locked_out_open_names_the_process_holding_the_lock(tmp_path):
    """The lock file keeps the pid of the last process that opened the store read-write;
    readers (read-only opens, the CLI's reading commands) cannot write theirs. Refused
    while a reader held the directory, the error named that last writer, long gone (or its
    pid reused by another program), as the one to stop."""
    data, ready = tmp_path / "data", tmp_path / "ready"
    with headwater.open(data) as hw:  # the last writer: this process, whose pid stays in .lock
        hw.admin.create_queue("q")
    assert (data / ".lock").read_text() == f"{os.getpid()}\n"
    child = subprocess.Popen([sys.executable, "-c", READER, str(data), str(ready)], stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while not (ready.exists() and ready.read_text().endswith("\n")):
            assert child.poll() is None, child.stderr.read() if child.stderr else ""
            assert time.monotonic() < deadline, "the reader never became ready"
            time.sleep(0.01)
        with pytest.raises(DataDirectoryLockedError) as refused:
            headwater.open(data)
        said = str(refused.value)
        assert re.findall(r"pid (\d+)", said) == [str(child.pid)] and "open read-only" in said, said
    finally:
        child.kill()
        child.wait()
    with headwater.open(data), pytest.raises(DataDirectoryLockedError, match="in use in this process already"):
        headwater.open(data, read_only=True)  # a second open in one process: the holder is this one
