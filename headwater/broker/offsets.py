"""OffsetStore: consumer groups' committed offsets, kept in the store itself.

Commits are appended to the internal queue ``__offsets`` (one partition, no TTL, sync
flush), one message per (group, queue id, partition) with the offset as its body, and the
latest value of each key is kept in memory. On open the queue is read back to rebuild the
table. When the log holds many more commits than live keys, the whole table is appended as
one batch and the queue's start is moved to it, so the log stays a small multiple of the
table and a crash at any point leaves either the old or the new table readable.

Keys use the queue's id, not its name: a queue deleted and created again starts with no
committed offsets.
"""

from __future__ import annotations

import re
import struct
import threading

from headwater.errors import InvalidArgumentError
from headwater.model.batch import decode_records, encode_batch
from headwater.model.checks import check_int_arg, check_offsets_given
from headwater.model.config import QueueConfig
from headwater.model.message import Message
from headwater.storage.api import Store

__all__ = ["OffsetStore", "OFFSETS_QUEUE", "validate_group"]

OFFSETS_QUEUE = "__offsets"
_GROUP_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")
_VALUE = struct.Struct("<q")


def validate_group(group: object) -> str:
    if not isinstance(group, str) or not _GROUP_RE.match(group):
        raise InvalidArgumentError(
            f"invalid group name {group!r}: use 1-200 letters, digits, '.', '_' and '-', "
            f"starting with a letter or digit"
        )
    return group


def _key(group: str, queue_id: int, partition: int) -> bytes:
    return f"{group}\x00{queue_id}\x00{partition}".encode()


class OffsetStore:
    """Committed offsets per (group, queue, partition). Thread-safe."""

    def __init__(self, store: Store, *, compact_ratio: int = 4, compact_min: int = 10_000) -> None:
        self._store = store
        self._lock = threading.Lock()
        self._offsets: dict[bytes, int] = {}
        self._compact_ratio = compact_ratio
        self._compact_min = compact_min
        try:
            store.describe_queue(OFFSETS_QUEUE)
        except Exception:  # noqa: BLE001 - first start of this store
            store.create_queue(OFFSETS_QUEUE, QueueConfig(partitions=1, ttl_s=None, flush="sync"), internal=True)
        self._load()

    def _load(self) -> None:
        offset = self._store.describe_queue(OFFSETS_QUEUE).partitions[0].start_offset
        while True:
            res = self._store.fetch(OFFSETS_QUEUE, 0, offset, max_bytes=4 << 20)
            for b in res.batches:
                for r in decode_records(b, OFFSETS_QUEUE, start_offset=offset):
                    if r.key is not None:
                        self._offsets[r.key] = _VALUE.unpack(r.body)[0]
            if res.next_offset <= offset:
                break
            offset = res.next_offset
        self._appended = self._store.end_offset(OFFSETS_QUEUE, 0) - offset

    def commit(self, group: str, queue: str, offsets: dict[int, int]) -> None:
        """Commit ``{partition: offset}``; each offset must lie within what the partition
        holds (start to end, end meaning: everything consumed)."""
        validate_group(group)
        check_offsets_given(offsets)
        info = self._store.describe_queue(queue)
        msgs = []
        for part, off in offsets.items():
            if isinstance(part, bool) or not isinstance(part, int) or not 0 <= part < len(info.partitions):
                from headwater.errors import PartitionOutOfRangeError

                raise PartitionOutOfRangeError(
                    f"queue {queue!r} has partitions 0..{len(info.partitions) - 1}; there is no partition {part!r}"
                )
            pi = info.partitions[part]
            check_int_arg(off, "an offset")
            if off > pi.end_offset:
                raise InvalidArgumentError(
                    f"cannot commit offset {off} for {queue}[{part}]: beyond the log end {pi.end_offset}"
                )
            if off < pi.start_offset:
                raise InvalidArgumentError(
                    f"cannot commit offset {off} for {queue}[{part}]: before the log start {pi.start_offset}"
                )
            msgs.append(Message(_VALUE.pack(off), key=_key(group, info.queue_id, part)))
        with self._lock:
            self._store.append(OFFSETS_QUEUE, 0, encode_batch(msgs))
            for m in msgs:
                self._offsets[m.key] = _VALUE.unpack(m.body)[0]  # type: ignore[index]  # an offsets record always has a key
            self._appended += len(msgs)
            if self._appended > max(self._compact_min, self._compact_ratio * len(self._offsets)):
                self._compact()

    def fetch(self, group: str, queue: str) -> dict[int, int]:
        """The committed offsets of ``group`` on ``queue``: ``{partition: offset}``."""
        validate_group(group)
        info = self._store.describe_queue(queue)
        out = {}
        with self._lock:
            for part in range(len(info.partitions)):
                off = self._offsets.get(_key(group, info.queue_id, part))
                if off is not None:
                    out[part] = off
        return out

    def fetch_group(self, group: str) -> dict[str, dict[int, int]]:
        """Every committed offset of ``group``: ``{queue name: {partition: offset}}`` (queues
        deleted since are left out)."""
        validate_group(group)
        prefix = f"{group}\x00".encode()
        names = {q.queue_id: q.name for q in self._store.list_queues()}
        out: dict[str, dict[int, int]] = {}
        with self._lock:
            items = [(k, v) for k, v in self._offsets.items() if k.startswith(prefix)]
        for k, v in items:
            _, qid, part = k.split(b"\x00")
            name = names.get(int(qid))
            if name is not None:
                out.setdefault(name, {})[int(part)] = v
        return {q: dict(sorted(o.items())) for q, o in sorted(out.items())}

    def group_queues(self) -> dict[str, set[str]]:
        """``{group: names of the queues it has committed offsets on}``, for every group."""
        names = {q.queue_id: q.name for q in self._store.list_queues()}
        out: dict[str, set[str]] = {}
        with self._lock:
            keys = list(self._offsets)
        for k in keys:
            group, qid, _ = k.split(b"\x00")
            name = names.get(int(qid))
            if name is not None:
                out.setdefault(group.decode(), set()).add(name)
        return out

    def _compact(self) -> None:
        live = {q.queue_id for q in self._store.list_queues()}
        table = {k: v for k, v in self._offsets.items() if int(k.split(b"\x00")[1]) in live}
        self._offsets = table
        snapshot_at = self._store.end_offset(OFFSETS_QUEUE, 0)
        items = list(table.items())
        for i in range(0, len(items), 10_000):
            chunk = items[i : i + 10_000]
            self._store.append(OFFSETS_QUEUE, 0, encode_batch([Message(_VALUE.pack(v), key=k) for k, v in chunk]))
        self._store.delete_before(OFFSETS_QUEUE, 0, snapshot_at)
        self._appended = len(items)
