"""A simulated power loss at thousands of moments: the disk keeps what was fsynced, and
maybe a torn piece of the page after it.

A child appends under one flush policy and journals every fsync (with the file's size when
it began), every file replaced whole, and every acknowledgement
(``tests/support/power_writer.py``). From that journal and the files it left, the disk as a
power loss at moment T would leave it is rebuilt: an appended file cut to what its last
fsync before T covered, then, at random, the rest of that page partly written (the real
bytes, zeros or garbage); a replaced file as its last version before T. The store opens
each and is checked:

- **sync** flush loses nothing that was acknowledged before T;
- **async** flush loses only a suffix of each partition, and only messages acknowledged
  after the last fsync that completed before T began (docs/design/storage.md, "Flush
  policies and the loss window"); the widest window seen is printed;
- both: what is served is exactly what was written, offsets without holes, and the store
  takes new appends after it.

``HEADWATER_SEED=<seed>`` reruns a failure; ``make test-all`` runs many more points.
"""

from __future__ import annotations

import bisect
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

import headwater
from tests.support.crashdata import expected_tuple, record_tuple

SEED = int(os.environ.get("HEADWATER_SEED") or random.randrange(2**32))
SUPPORT = Path(__file__).parent / "support"
SEGMENT_BYTES = 64 * 1024
PARTS = 3
PAGE = 4096


class Sync(NamedTuple):
    start_ns: int
    end_ns: int
    path: str
    size: int


class Journal(NamedTuple):
    syncs: list[Sync]  # by end time
    replaced: dict[str, list[tuple[int, bytes]]]  # path -> [(time, content)], by time
    acks: list[tuple[int, int, int, int]]  # (time, partition, base, count), by time
    final: dict[str, bytes]  # every file the child left, as it left it
    baseline: dict[str, bytes]  # every file before the child ran


def _files(d: Path) -> dict[str, bytes]:
    return {str(p.resolve()): p.read_bytes() for p in d.rglob("*") if p.is_file() and p.name != ".lock"}


def _run_child(tmp: Path, flush: str, run_s: float) -> tuple[Path, Journal]:
    data, journal_dir = tmp / "data", tmp / "journal"
    journal_dir.mkdir()
    with headwater.open(data, segment_bytes_max=SEGMENT_BYTES) as hw:
        hw.admin.create_queue("q", partitions=PARTS, ttl_s=None)
    baseline = _files(data)
    args = [str(data), str(journal_dir), str(SEED), flush, str(run_s), str(SEGMENT_BYTES)]
    done = subprocess.run(
        [sys.executable, str(SUPPORT / "power_writer.py"), *args], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    syncs, replaced, acks = [], {}, []
    for line in (journal_dir / "journal").read_text().splitlines():
        kind, *rest = line.split(" ")
        if kind == "F":
            syncs.append(Sync(int(rest[0]), int(rest[1]), rest[2], int(rest[3])))
        elif kind == "R":
            replaced.setdefault(rest[1], []).append((int(rest[0]), (journal_dir / rest[2]).read_bytes()))
        else:
            acks.append((int(rest[0]), int(rest[1]), int(rest[2]), int(rest[3])))
    syncs.sort(key=lambda s: s.end_ns)
    assert acks and syncs, "the child acknowledged nothing: the test would prove nothing"
    return data, Journal(syncs, replaced, acks, _files(data), baseline)


def _disk_at(j: Journal, t_ns: int, dest: Path, data: Path, rng: random.Random) -> None:
    """Write into ``dest`` the data directory as a power loss at ``t_ns`` leaves it."""
    durable: dict[str, int] = {}
    for s in j.syncs[: bisect.bisect_right([s.end_ns for s in j.syncs], t_ns)]:
        durable[s.path] = max(durable.get(s.path, 0), s.size)
    root = str(data.resolve())
    for path in set(j.final) | set(j.baseline) | set(j.replaced):
        if path.endswith(".tmp"):
            continue  # half-made copies: opening removes them anyway
        versions = [c for t, c in j.replaced.get(path, []) if t <= t_ns]
        if versions or path in j.replaced:
            content = versions[-1] if versions else j.baseline.get(path)
        elif path in durable or path in j.baseline:
            final = j.final.get(path, b"")
            keep = max(durable.get(path, 0), len(j.baseline.get(path, b"")))
            content = final[:keep]
            torn = min(PAGE - keep % PAGE, len(final) - keep)
            if torn > 0 and rng.random() < 0.5:  # part of the next page reached the disk
                n = rng.randrange(1, torn + 1)
                content += rng.choice([final[keep : keep + n], bytes(n), rng.randbytes(n)])
        else:
            continue  # created after the last fsync before t_ns: never reached the disk
        if content is None:
            continue
        target = dest / os.path.relpath(path, root)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)


def _check_point(j: Journal, t_ns: int, dest: Path, flush: str, ctx: str) -> int:
    """Open the disk of moment ``t_ns`` and check the promise; return the widest loss
    window (ns between the oldest lost acknowledgement and ``t_ns``), 0 when none."""
    acked_end = [0] * PARTS
    ack_times: list[list[tuple[int, int]]] = [[] for _ in range(PARTS)]  # (end offset, time)
    for t, p, base, n in j.acks:
        if t <= t_ns:
            acked_end[p] = base + n
            ack_times[p].append((base + n, t))
    log_syncs = [s for s in j.syncs if s.end_ns <= t_ns and s.path.endswith(".log")]
    last_sync_start = log_syncs[-1].start_ns if log_syncs else 0
    window = 0
    with headwater.open(dest, segment_bytes_max=SEGMENT_BYTES) as hw:
        info = hw.admin.describe_queue("q")
        for p in range(PARTS):
            end = info.partitions[p].end_offset
            got = [record_tuple(r) for r in hw.scanner("q", partitions=p)]
            assert got == [expected_tuple(p, o) for o in range(end)], f"partition {p} served wrong data; {ctx}"
            if flush == "sync":
                assert end >= acked_end[p], f"partition {p}: acked up to {acked_end[p]}, found {end}; {ctx}"
            for batch_end, t in ack_times[p]:
                if batch_end > end:  # lost: acknowledged after the last completed fsync began
                    assert t >= last_sync_start, (
                        f"partition {p}: a batch acked {(last_sync_start - t) / 1e6:.1f} ms before the last "
                        f"completed fsync began is lost; {ctx}"
                    )
                    window = max(window, t_ns - t)
        for p in range(PARTS):  # the store goes on after what survived
            hw.send_batch("q", [b"after"], partition=p)
    return window


def _power_losses(tmp_path: Path, flush: str, points: int, run_s: float) -> None:
    data, j = _run_child(tmp_path, flush, run_s)
    rng = random.Random(SEED)
    first, last = j.syncs[0].start_ns, max(j.acks[-1][0], j.syncs[-1].end_ns)
    # moments at random, and just before and after fsyncs end (where the edges are)
    moments = [rng.randrange(first, last + 1) for _ in range(points // 2)]
    for s in rng.sample(j.syncs, min(points - len(moments), len(j.syncs))):
        moments.append(s.end_ns + rng.choice([-1, 0, 1]))
    widest = 0
    for i, t in enumerate(sorted(moments)):
        dest = tmp_path / f"point{i}"
        _disk_at(j, t, dest, data, random.Random(f"{SEED}:{i}"))
        ctx = f"seed={SEED} (rerun with HEADWATER_SEED={SEED}) flush={flush} point={i} t={t - first} ns"
        widest = max(widest, _check_point(j, t, dest, flush, ctx))
        shutil.rmtree(dest)
    acked = sum(n for *_, n in j.acks)
    print(
        f"\n{flush}: {len(moments)} power losses over {acked} acknowledged messages; widest loss {widest / 1e6:.1f} ms"
    )
    if flush == "sync":
        assert widest == 0


@pytest.mark.parametrize("flush", ["sync", "async"])
def test_power_loss_keeps_what_the_flush_policy_promises(tmp_path, flush):
    _power_losses(tmp_path, flush, points=60, run_s=1.5)


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("flush", ["sync", "async"])
def test_power_loss_soak(tmp_path, flush):
    _power_losses(tmp_path, flush, points=1500, run_s=4.0)
