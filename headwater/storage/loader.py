"""LogLoader: open a store's segments after a clean stop, a crash or a power loss.

Crash policy (docs/design/storage.md, "Crash policy"):

* Sealed segments were fsynced before their index was written, so a sealed segment whose
  ``.idx`` passes its checksums and matches the segment's size is trusted as is
  (``verify="all"`` re-reads them anyway).
* The last segment is read batch by batch, checking both checksums and that offsets never
  go backwards, unless the store was closed cleanly: a clean close writes its index (and
  the producers' snapshot) after the last fsync, and an index whose size is the segment's
  and which the recovery point covers whole is trusted as a sealed one's is, so opening
  after a clean stop reads no segment, whatever its size. Any append after that open grows
  the segment past the index, and a crash then makes the next open read it again.
  Beyond the recovery point (:mod:`.recovery_point`: how far the log was known flushed)
  the first bad batch is a torn write: the segment is cut there, and the bytes after it
  are removed, never served. The cut is logged with its
  position and reason.
* Before the recovery point, and anywhere in a sealed segment, the data was flushed: a bad
  batch there is damage, not a torn write, and is never cut. It is skipped, reading
  resumes at the next valid batch (found by its header and both checksums), and the
  damaged range and the offsets it held are reported (:class:`Damage`, :class:`Lost`).
  Readers skip those offsets; every other message stays readable.
* A sealed segment without a valid index is read that way and gets a fresh index.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import NamedTuple

from headwater.errors import CorruptDataError, DataDirectoryError, InvalidBatchError, StorageError
from headwater.model.batch import (
    FLAG_HAS_KEYS,
    HEADER_SIZE,
    BatchHeader,
    check_batch,
    crc32c,
    decode_header,
    decode_payload,
)
from headwater.storage.segment import SEGMENT_HEADER_SIZE, LogSegment, segment_name, write_atomically
from headwater.storage.segment_index import SegmentIndex

__all__ = [
    "Damage",
    "FSYNC_FAILED_FILE",
    "Lost",
    "QUARANTINE_DIR",
    "REPAIR_HINT",
    "Scan",
    "key_hashes",
    "load_segments",
    "scan_segment",
    "walk_headers",
]

#: Left in ``log/`` by a store whose fsync failed (see GroupCommit): the next open reads the
#: last segment from the disk, not from the page cache, whose pages of it may never have
#: reached the disk although they look written.
FSYNC_FAILED_FILE = "FSYNC_FAILED"

log = logging.getLogger("headwater.storage")

_SEGMENT_NAME = re.compile(r"[0-9]{20}\.log")  # segment_name(base, ".log")


def key_hashes(keys: list[bytes | None]) -> list[int]:
    return [crc32c(k) if k is not None else 0 for k in keys]


class Damage(NamedTuple):
    """Bytes of flushed data that failed their checks: skipped, reported, never cut."""

    segment: str  # the segment file's name
    first_byte: int  # positions in the file
    end_byte: int
    reason: str

    def describe(self) -> str:
        return (
            f"skipped {self.end_byte - self.first_byte} damaged bytes of flushed data in {self.segment} "
            f"(bytes {self.first_byte}-{self.end_byte}): {self.reason}"
        )


class Lost(NamedTuple):
    """Offsets of a partition that were in damaged bytes: readers skip from ``first`` to ``end``."""

    queue_id: int
    partition: int
    first: int
    end: int


class Scan:
    """What one open learns across segments: each partition's next offset, the damaged
    ranges skipped, and the offsets they held."""

    def __init__(self) -> None:
        self.ends: dict[tuple[int, int], int] = {}
        self.damage: list[Damage] = []
        self.lost: list[Lost] = []
        self.last_from_close = False  # the last segment's index was the one a clean close wrote


# a batch header: magic 1 at byte 44, header size 96 (little endian) at byte 46
_HEADER_MARK = re.compile(rb"\x01[\x00-\xff]\x60\x00")
_MARK_AT = 44


def _resync(data: memoryview, pos: int, ends: dict[tuple[int, int], int]) -> int | None:
    """The position of the first valid batch after ``pos`` (both checksums pass and its
    offsets do not go back), or None."""
    raw = data.obj if isinstance(data.obj, bytes | bytearray) else bytes(data)
    for m in _HEADER_MARK.finditer(raw, pos + 1 + _MARK_AT):
        at = m.start() - _MARK_AT
        try:
            h = check_batch(data, at)
        except InvalidBatchError:
            continue
        if h.base_offset >= ends.get((h.queue_id, h.partition), 0):
            return at
    return None


def scan_segment(seg: LogSegment, scan: Scan, trusted_end: int = 0) -> tuple[SegmentIndex, str | None]:
    """Index a segment by reading every batch.

    Before ``trusted_end`` (a log position known flushed) a damaged batch is skipped:
    reading resumes at the next valid batch and the damage is added to ``scan``. From
    ``trusted_end`` on, the first damaged batch stops the scan (a torn tail). Returns the
    index (``segment_size`` = bytes read as good or damaged) and what stopped it, if
    anything. ``scan`` carries each partition's next offset across segments.
    """
    ends = scan.ends
    idx = SegmentIndex(seg.base_position)
    problem = None
    with seg.reading():
        data = memoryview(seg.read(seg.base_position, seg.size))
    pos = SEGMENT_HEADER_SIZE
    size = len(data)
    trusted = min(max(trusted_end - seg.base_position, 0), size)
    while pos < size:
        try:
            h = check_batch(data, pos)
            key = (h.queue_id, h.partition)
            if h.base_offset < ends.get(key, 0):
                raise InvalidBatchError(f"offset {h.base_offset} of partition {key} goes back from {ends[key]}")
            hashes = None
            if h.flags & FLAG_HAS_KEYS:
                payload = decode_payload(data, h, pos)
                if payload.keys is not None:
                    hashes = key_hashes(payload.keys)
        except InvalidBatchError as e:
            found = None if pos >= trusted else _resync(data, pos, ends)
            if found is None:  # a torn tail, or damage that nothing valid follows: cut
                problem = f"{e} (at byte {pos} of {size})"
                break
            resume = min(found, trusted)  # what lies beyond the recovery point is a tail
            scan.damage.append(Damage(seg.path.name, pos, resume, str(e)))
            log.error("%s", scan.damage[-1].describe())
            pos = resume
            continue
        if scan.damage and h.base_offset > ends.get(key, h.base_offset):
            scan.lost.append(Lost(h.queue_id, h.partition, ends[key], h.base_offset))
        idx.add_batch(h, seg.base_position + pos, hashes)
        ends[key] = h.base_offset + h.count
        pos += h.size
    data.release()
    idx.segment_size = pos
    return idx, problem


def walk_headers(seg: LogSegment) -> list[BatchHeader]:
    """The headers of every batch of a segment already recovered (no checks: used to
    replay state such as producer sequences)."""
    with seg.reading():
        data = seg.read(seg.base_position, seg.size)
    out = []
    pos = SEGMENT_HEADER_SIZE
    while pos + HEADER_SIZE <= len(data):
        h = decode_header(data, pos)
        out.append(h)
        pos += h.size
    return out


#: Beside ``log/``: what recovery cut, kept for whoever wants to look at it.
QUARANTINE_DIR = "quarantine"


def _cut(seg: LogSegment, idx: SegmentIndex, problem: str, report: list[str]) -> None:
    """Cut the segment after its last good batch, copying what is cut to the quarantine
    folder first (when the disk has no room for the copy, the cut goes ahead: the store
    must open, and the bytes are a tail no reader could use)."""
    keep, size = idx.segment_size, seg.size
    lost = size - keep
    kept_in = ""
    folder = seg.path.parent.parent / QUARANTINE_DIR
    copy = folder / f"{seg.path.stem}.{keep}-{size}.cut"
    try:
        folder.mkdir(exist_ok=True)
        with seg.reading():
            write_atomically(copy, seg.read(seg.base_position + keep, lost))
        kept_in = f", copied to {QUARANTINE_DIR}/{copy.name}"
    except (OSError, StorageError) as e:
        log.error("could not copy the %d bytes cut from %s to %s: %s", lost, seg.path.name, folder, e)
    log.warning("cutting %d bytes from %s%s: %s", lost, seg.path.name, kept_in, problem)
    report.append(f"cut {lost} bytes from {seg.path.name}{kept_in}: {problem}")
    seg.truncate(seg.base_position + keep)


def _read_sealed_index(seg: LogSegment, idx_path: Path, report: list[str]) -> SegmentIndex | None:
    """The index written when ``seg`` was sealed, or None (reported) if it is damaged or
    does not match the segment: the caller rebuilds it by scanning."""
    try:
        idx = SegmentIndex.read(idx_path)
    except CorruptDataError as e:
        log.warning("index %s is damaged (%s); rebuilding", idx_path.name, e)
        report.append(f"rebuilt {idx_path.name}: {e}")
        return None
    if idx.segment_size != seg.size or idx.segment_base != seg.base_position:
        log.warning("index %s does not match its segment; rebuilding", idx_path.name)
        report.append(f"rebuilt {idx_path.name}: it did not match its segment")
        return None
    return idx


def _read_closed_index(seg: LogSegment, idx_path: Path) -> SegmentIndex | None:
    """The index a clean close wrote for the last segment, if it covers the segment as it
    is now; None (the segment is read instead) if there is none, it is damaged, or the
    segment grew since (appends after the open that read it): no repair, nothing reported."""
    try:
        idx = SegmentIndex.read(idx_path)
    except (CorruptDataError, StorageError) as e:
        if idx_path.exists():
            log.info("reading %s: the index of its clean close is unusable (%s)", seg.path.name, e)
        return None
    if idx.segment_size != seg.size or idx.segment_base != seg.base_position:
        return None
    return idx


def _segment_paths(log_dir: Path, report: list[str], read_only: bool) -> list[Path]:
    """The segment files in order, after the leftovers of a crash are dealt with (stray
    temp files and a newest segment never written: removed, or reported when read-only)."""
    for stray in [] if read_only else log_dir.glob("*.tmp"):
        stray.unlink()
    paths = sorted(log_dir.glob("*.log"))
    # Only our own names: a foreign or copied file ("... (copy).log") failed with a bare
    # ValueError, or, sorting last and short, was removed as a segment never written.
    foreign = [p.name for p in paths if not _SEGMENT_NAME.fullmatch(p.name)]
    if foreign:
        raise DataDirectoryError(
            f"{log_dir} holds files that are not segments ({', '.join(foreign[:3])}"
            f"{', ...' if len(foreign) > 3 else ''}); move them out of that folder"
        )
    # a crash while creating the newest segment can leave it shorter than its header
    if paths and paths[-1].stat().st_size < SEGMENT_HEADER_SIZE:
        empty = paths.pop()
        if read_only:
            _needs_repair(f"{empty.name} was created but never written (a crash during a roll)", report)
        else:
            log.warning("removing %s: created but never written (crash during roll)", empty.name)
            report.append(f"removed {empty.name}: created but never written")
            empty.unlink()
    return paths


def _recover_segment(seg: LogSegment, scan: Scan, trusted_end: int, report: list[str], read_only: bool) -> SegmentIndex:
    """Index ``seg`` by reading it: damage before ``trusted_end`` skipped, a torn tail
    after it cut (or, read-only, reported and left out)."""
    if trusted_end > seg.end_position:
        _flushed_data_missing(seg, trusted_end, report)
    damage_before = len(scan.damage)
    idx, problem = scan_segment(seg, scan, trusted_end)
    report.extend(d.describe() for d in scan.damage[damage_before:])
    if problem is not None and read_only:
        lost = seg.size - idx.segment_size
        _needs_repair(f"{lost} bytes at the end of {seg.path.name} are damaged ({problem})", report)
    elif problem is not None:
        _cut(seg, idx, problem, report)
    return idx


def load_segments(
    log_dir: Path,
    store_id: bytes,
    *,
    verify_all: bool = False,
    report: list[str] | None = None,
    recovery_point: int = 0,
    scan: Scan | None = None,
    read_only: bool = False,
) -> list[tuple[LogSegment, SegmentIndex]]:
    """Open every segment in order, recovering as the crash policy above says.

    ``recovery_point`` is the log position known flushed (:mod:`.recovery_point`). What
    recovery had to do (cuts, rebuilt indexes, damage skipped) is appended to ``report``;
    the damaged ranges and the offsets they held, to ``scan``. ``read_only`` changes no
    file: what recovery would cut or remove is reported (with the command that repairs)
    and left out of what is served, and rebuilt indexes stay in memory.
    """
    report = [] if report is None else report
    scan = Scan() if scan is None else scan
    paths = _segment_paths(log_dir, report, read_only)
    note = log_dir / FSYNC_FAILED_FILE
    reread_last = note.exists() and bool(paths)
    if reread_last:
        log.warning(
            "an fsync failed in the last run (%s): reading %s from the disk", note.read_text().strip(), paths[-1].name
        )
        report.append(f"read {paths[-1].name} from the disk: an fsync failed in the last run")
    out: list[tuple[LogSegment, SegmentIndex]] = []
    ends = scan.ends
    seg: LogSegment | None = None
    try:
        for n, path in enumerate(paths):
            seg = LogSegment.open(path, store_id, writable=not read_only)
            last = n == len(paths) - 1
            idx_path = log_dir / segment_name(seg.base_position, ".idx")
            idx = None
            if not last and not verify_all and idx_path.exists():
                idx = _read_sealed_index(seg, idx_path, report)
            elif last and not verify_all and not reread_last and recovery_point >= seg.end_position:
                idx = _read_closed_index(seg, idx_path)
                scan.last_from_close = idx is not None
            if idx is not None:
                for key, pe in idx.partitions.items():
                    ends[key] = max(ends.get(key, 0), pe.end_offset)
            else:
                if last and reread_last:  # its pages a failed write-back left marked clean go too
                    seg.drop_cached(seg.base_position, seg.end_position)
                # a sealed segment was fsynced whole before the next one began
                idx = _recover_segment(seg, scan, recovery_point if last else seg.end_position, report, read_only)
                if not last and not read_only:
                    idx.write(idx_path)
            if out and out[-1][0].end_position > seg.base_position:
                raise CorruptDataError(f"segments overlap at {path.name}")
            out.append((seg, idx))
    except BaseException:
        # a failed open must not leak the descriptors of the segments opened so far
        for s, _ in out:
            s.close()
        if seg is not None:
            seg.close()
        raise
    if not read_only:
        note.unlink(missing_ok=True)
    return out


#: What a read-only open says when the store needs a repair it may not make.
REPAIR_HINT = "run `headwater check --repair` with the broker stopped to repair it"


def _needs_repair(what: str, report: list[str]) -> None:
    message = f"{what}; opened read-only, nothing was changed: {REPAIR_HINT}"
    log.warning("%s", message)
    report.append(message)


def _flushed_data_missing(seg: LogSegment, recovery_point: int, report: list[str]) -> None:
    """The last segment ends before the recovery point: the disk lost bytes it had
    confirmed (or the file was cut by hand). Nothing can bring them back; say so loudly."""
    missing = recovery_point - seg.end_position
    message = (
        f"{seg.path.name} ends {missing} bytes before the recovery point: flushed data is "
        f"missing from the disk (the file was cut, or the disk lost writes it had confirmed)"
    )
    log.error("%s", message)
    report.append(message)
