"""SegmentIndex: where each partition's batches sit in one segment, and its key hashes.

One entry per *batch* (not per message), so the index grows with batches. Entries of one
partition form columns (base offset, count, position, size, timestamp, tag mask), sorted by offset and,
because the store's append times never decrease, by timestamp too: both the offset lookup and
the time lookup are binary searches. Batches with keys also record the CRC32C of every key,
so a lookup by key is a search through 4 bytes per keyed message of the segment.

The index of the active segment lives in memory and is rebuilt from the segment on open.
When a segment is sealed its index is written beside it (``.idx``), all integers
little-endian::

    header (64 B)
      0   8  magic           b"HWIDX001"
      8   8  segment_base    base position of the segment
     16   8  segment_size    bytes of the segment this index covers
     24   4  partition_count
     28   4  entry_count
     32   4  key_batch_count
     36   4  key_hash_count
     40   8  min_ts
     48   8  max_ts
     56   4  body_crc        CRC32C of everything after the header
     60   4  header_crc      CRC32C of bytes [0, 60)
    partition table: partition_count x (queue_id u32, partition u32, entry_start u32,
                     entry_count u32) = 16 B
    entry columns:   5 x entry_count x i64 (base_offset, count, position, size, timestamp)
                     then entry_count x u64 (tag_mask), each grouped by partition in table order
    key batches:     key_batch_count x (queue_id u32, partition u32, base_offset i64,
                     hash_start u32, count u32) = 24 B
    key hashes:      key_hash_count x u32

Thread-safety: mutated only under the store's lock; readers take ``snapshot`` ranges under
the same lock. A sealed index is immutable. Crash policy: an index file that fails its
checksums or disagrees with its segment's size is ignored and rebuilt from the segment.
"""

from __future__ import annotations

import struct
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterator
from pathlib import Path

from headwater.errors import CorruptDataError, StorageError
from headwater.model.batch import BatchHeader, crc32c
from headwater.storage.segment import write_atomically

__all__ = ["PartitionEntries", "SegmentIndex"]

_HEADER = struct.Struct("<8sQQIIIIqqII")
_TABLE = struct.Struct("<IIII")
_KEYB = struct.Struct("<IIqII")
_MAGIC = b"HWIDX001"
_MAX_TS = 2**62


class PartitionEntries:
    """The batches of one partition inside one segment, as parallel columns."""

    __slots__ = ("offsets", "counts", "positions", "sizes", "timestamps", "tag_masks")

    def __init__(self) -> None:
        self.offsets = array("q")
        self.counts = array("q")
        self.positions = array("q")
        self.sizes = array("q")
        self.timestamps = array("q")
        self.tag_masks = array("Q")

    def columns(self) -> tuple[array[int], ...]:
        return (self.offsets, self.counts, self.positions, self.sizes, self.timestamps, self.tag_masks)

    def __len__(self) -> int:
        return len(self.offsets)

    @property
    def first_offset(self) -> int:
        return self.offsets[0]

    @property
    def end_offset(self) -> int:
        return self.offsets[-1] + self.counts[-1]

    def index_of_offset(self, offset: int) -> int:
        """Index of the batch holding ``offset``, or of the first batch after it."""
        i = bisect_right(self.offsets, offset) - 1
        if i < 0:
            return 0
        if self.offsets[i] + self.counts[i] <= offset:
            return i + 1
        return i

    def index_of_time(self, ts: int) -> int:
        """Index of the first batch appended at or after ``ts``."""
        return bisect_left(self.timestamps, ts)

    def entry(self, i: int) -> tuple[int, int, int, int, int, int]:
        """(base_offset, count, position, size, timestamp, tag_mask) of batch ``i``."""
        return (
            self.offsets[i],
            self.counts[i],
            self.positions[i],
            self.sizes[i],
            self.timestamps[i],
            self.tag_masks[i],
        )


class SegmentIndex:
    """Index of one segment: partition entries, key hashes, time bounds."""

    def __init__(self, segment_base: int) -> None:
        self.segment_base = segment_base
        self.segment_size = 0
        self.partitions: dict[tuple[int, int], PartitionEntries] = {}
        self.key_batches: list[tuple[int, int, int, int, int]] = []
        self.key_hashes = array("I")
        self.min_ts = _MAX_TS
        self.max_ts = -1

    def add_batch(self, h: BatchHeader, position: int, key_hashes: list[int] | None) -> PartitionEntries:
        key = (h.queue_id, h.partition)
        pe = self.partitions.get(key)
        if pe is None:
            pe = self.partitions[key] = PartitionEntries()
        # the batch's row, appended here rather than by a method: once per append (4 + length: h.size)
        pe.offsets.append(h.base_offset)
        pe.counts.append(h.count)
        pe.positions.append(position)
        pe.sizes.append(4 + h.length)
        pe.timestamps.append(h.timestamp_ms)
        pe.tag_masks.append(h.tag_mask)
        if key_hashes is not None:
            self.key_batches.append((h.queue_id, h.partition, h.base_offset, len(self.key_hashes), h.count))
            self.key_hashes.extend(key_hashes)
        if h.timestamp_ms < self.min_ts:
            self.min_ts = h.timestamp_ms
        if h.timestamp_ms > self.max_ts:
            self.max_ts = h.timestamp_ms
        return pe

    def find_key(self, key_hash: int) -> Iterator[tuple[int, int, int]]:
        """(queue_id, partition, offset) of every message whose key hash matches."""
        blob = self.key_hashes.tobytes()
        pat = struct.pack("<I", key_hash)
        starts = [kb[3] for kb in self.key_batches]
        i = blob.find(pat)
        while i >= 0:
            if i % 4:
                i = blob.find(pat, i + 1)
                continue
            ordinal = i // 4
            kb = self.key_batches[bisect_right(starts, ordinal) - 1]
            yield kb[0], kb[1], kb[2] + (ordinal - kb[3])
            i = blob.find(pat, i + 4)

    # -- the .idx file ----------------------------------------------------------------

    def to_bytes(self) -> bytes:
        table = []
        cols: list[array[int]] = [array("q") for _ in range(5)] + [array("Q")]
        start = 0
        for (qid, part), pe in self.partitions.items():
            n = len(pe)
            table.append(_TABLE.pack(qid, part, start, n))
            for col, src in zip(cols, pe.columns()):
                col.extend(src)
            start += n
        body = b"".join(table) + b"".join(c.tobytes() for c in cols)
        body += b"".join(_KEYB.pack(*kb) for kb in self.key_batches) + self.key_hashes.tobytes()
        head = _HEADER.pack(
            _MAGIC,
            self.segment_base,
            self.segment_size,
            len(self.partitions),
            start,
            len(self.key_batches),
            len(self.key_hashes),
            self.min_ts,
            self.max_ts,
            crc32c(body),
            0,
        )
        head = head[:60] + struct.pack("<I", crc32c(head[:60]))
        return head + body

    @classmethod
    def from_bytes(cls, data: bytes) -> SegmentIndex:
        if len(data) < _HEADER.size:
            raise CorruptDataError("index file shorter than its header")
        magic, base, size, pcount, ecount, kbcount, khcount, min_ts, max_ts, bcrc, hcrc = _HEADER.unpack_from(data)
        if magic != _MAGIC or crc32c(data[:60]) != hcrc:
            raise CorruptDataError("index header damaged")
        body = memoryview(data)[_HEADER.size :]
        expected = pcount * _TABLE.size + 48 * ecount + kbcount * _KEYB.size + 4 * khcount
        if len(body) != expected or crc32c(body) != bcrc:
            raise CorruptDataError("index body damaged")
        idx = cls(base)
        idx.segment_size, idx.min_ts, idx.max_ts = size, min_ts, max_ts
        pos = pcount * _TABLE.size
        cols = []
        for code in "qqqqqQ":
            c = array(code)
            c.frombytes(body[pos : pos + 8 * ecount])
            cols.append(c)
            pos += 8 * ecount
        for t in range(pcount):
            qid, part, start, n = _TABLE.unpack_from(body, t * _TABLE.size)
            pe = PartitionEntries()
            (pe.offsets, pe.counts, pe.positions, pe.sizes, pe.timestamps, pe.tag_masks) = (
                c[start : start + n] for c in cols
            )
            idx.partitions[(qid, part)] = pe
        idx.key_batches = [_KEYB.unpack_from(body, pos + i * _KEYB.size) for i in range(kbcount)]
        pos += kbcount * _KEYB.size
        idx.key_hashes.frombytes(body[pos : pos + 4 * khcount])
        return idx

    def write(self, path: Path) -> None:
        """Write the index beside its segment: temp file, fsync, rename, fsync the folder."""
        write_atomically(path, self.to_bytes())

    @classmethod
    def read(cls, path: Path) -> SegmentIndex:
        """The index in ``path``; errors name the file (a reader far from the open that
        checked it gets them too, when the index left the cache and was damaged since)."""
        try:
            return cls.from_bytes(path.read_bytes())
        except CorruptDataError as e:
            raise CorruptDataError(f"{path}: {e}") from e
        except OSError as e:
            raise StorageError(f"cannot read the index {path}: {e.strerror}") from e
