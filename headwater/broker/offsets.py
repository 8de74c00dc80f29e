"""OffsetStore: consumer groups' committed offsets, kept in the store itself.

Commits are appended to an internal queue (no TTL), one message per (group, queue id,
partition) with the offset as its body, and the latest value of each key is kept
in memory, one table per partition of that queue. A partition's records are read back to
rebuild its table when it is loaded. When a partition's log holds many more commits than
live keys, its whole table is appended as one batch and the partition's start is moved to
it, so each log stays a small multiple of its table and a crash at any point leaves either
the old or the new table readable.

Which queue, and which of its partitions this broker serves:

- A broker running alone keeps ``__offsets`` (one partition), loaded at once and for good:
  every group is its own.
- A broker of a cluster (:meth:`OffsetStore.join_cluster`) keeps the cluster's coordinator
  queue (:data:`~headwater.model.cluster.COORDINATOR_QUEUE`): group ``g``'s commits go to
  partition ``coordinator_partition(g, n)``, whose leader is ``g``'s coordinator. The
  cluster node loads a partition when this broker comes to lead it and unloads it when it
  stops (``docs/design/cluster.md``, "Coordinators follow partitions"). Every group call
  asks the node first whether this broker coordinates the group now
  (:meth:`CoordinatorPlace.coordinator_partition`, else NotCoordinatorError), and a
  commit's append runs inside the node's ``producing`` of the partition, so a move's fence
  waits for it and refuses the next.

Commit checks: the partition must exist and the offset must be an int from 0. Alone, it
must also lie within the partition's log (start to end). On a cluster every broker has
every queue but only a partition's leader knows its log, so the log start and end are
checked only for partitions this broker leads (Kafka checks neither).

Keys use the queue's id, not its name: a queue deleted and created again starts with no
committed offsets.

Members: the same log keeps each group's membership (:meth:`OffsetStore.save_members`, a
record per change, key ``\x00members\x00`` + the group's name, an empty body once the group
has no members), so a broker that restarts, after a crash too, or that comes to lead the
partition, finds the members, generation and holders its clients last heard of
(``headwater.broker.groups``). These writes wait for their fsync whatever
``offsets_flush`` says: a generation number handed out and then lost could be given out again.

Durability (the store's ``offsets_flush`` setting, ``docs/consumer-groups.md``): a commit is
answered once its record is written to the log file (the page cache), not after an fsync
(``"async"``, the default), as Kafka answers commits before any fsync. A killed broker
process loses nothing (the page cache outlives it); a power loss or kernel crash loses at
most the commits of the last ``flush_interval_ms`` (the store's background fsync), which
means their messages are delivered again, never that a message is lost. ``"sync"`` answers
after the fsync that covers the record (shared with concurrent appends: group commit). The
internal queue itself is created with sync flush so that an append reports the position to
wait for; whether to wait is this setting's choice. The wait is outside the table's lock,
so commits of other groups do not queue behind one's fsync.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Protocol

from headwater.errors import InvalidArgumentError, NotCoordinatorError, NotLeaderError, PartitionOutOfRangeError
from headwater.model.batch import encode_batch
from headwater.model.batch_reads import decode_records
from headwater.model.checks import check_int_arg, check_name, check_offsets_given
from headwater.model.cluster import COORDINATOR_QUEUE, coordinator_partition
from headwater.model.config import PartitionBounds, QueueConfig
from headwater.model.message import Message
from headwater.storage.api import Store

__all__ = ["CoordinatorPlace", "OffsetStore", "OFFSETS_QUEUE", "validate_group"]

OFFSETS_QUEUE = "__offsets"
_VALUE = struct.Struct("<q")
_CHUNK = 10_000  # records per batch when a table is written whole
_MEMBERS = b"\x00members\x00"  # key prefix of a group's membership record (no group name starts with NUL)


def validate_group(group: object) -> str:
    return check_name(group, "group name")


def _key(group: str, queue_id: int, partition: int) -> bytes:
    return f"{group}\x00{queue_id}\x00{partition}".encode()


def _apply(table: dict[bytes, int], members: dict[str, bytes], key: bytes, body: bytes) -> None:
    """One record of a partition's log into its tables, as :meth:`OffsetStore.load` reads it
    back and as a write takes it: an offset, a membership record, or either's tombstone (an
    empty body)."""
    if key.startswith(_MEMBERS):
        group = key[len(_MEMBERS) :].decode()
        if body:
            members[group] = body
        else:
            members.pop(group, None)
    elif body:
        table[key] = _VALUE.unpack(body)[0]
    else:  # a tombstone: the group's offset was deleted (delete_group)
        table.pop(key, None)


class CoordinatorPlace(Protocol):
    """What the offsets of a broker in a cluster ask of its cluster node."""

    def coordinator_partition(self, group: str) -> int:
        """The coordinator queue's partition of ``group``, if this broker coordinates the
        group now; else NotCoordinatorError naming the coordinator it knows."""
        ...

    def leads(self, queue: str, partition: int) -> bool:
        """Whether this broker leads ``queue[partition]`` now (it knows its log)."""
        ...

    def producing(self, queue: str, partition: int) -> AbstractContextManager[None]:
        """Around an append to ``queue[partition]``: refused unless this broker leads it
        and no move fences it; a fence waits for the appends inside."""
        ...


class OffsetStore:
    """Committed offsets per (group, queue, partition). Thread-safe."""

    def __init__(self, store: Store, *, compact_ratio: int = 4, compact_min: int = 10_000) -> None:
        self._store = store
        self._lock = threading.Lock()
        self._queue = OFFSETS_QUEUE
        self._place: CoordinatorPlace | None = None  # None: a broker alone
        self._tables: dict[int, dict[bytes, int]] = {}  # loaded partition -> key -> offset
        self._members: dict[int, dict[str, bytes]] = {}  # loaded partition -> group -> membership record
        self._appended: dict[int, int] = {}  # loaded partition -> records in its log
        self._compact_ratio = compact_ratio
        self._compact_min = compact_min
        self._sync = store.config.offsets_flush == "sync"
        try:
            store.describe_queue(OFFSETS_QUEUE)
        except Exception:  # noqa: BLE001 - first start of this store
            store.create_queue(OFFSETS_QUEUE, QueueConfig(partitions=1, ttl_s=None, flush="sync"), internal=True)
        self.load(0)

    @property
    def queue(self) -> str:
        """The internal queue the commits go to: ``__offsets`` alone, the coordinator queue
        on a cluster."""
        return self._queue

    def join_cluster(self, place: CoordinatorPlace) -> None:
        """From now on keep the cluster's coordinator queue, of which no partition is
        loaded until the cluster node :meth:`load`\\ s it; ``__offsets`` stays on disk for
        a broker alone."""
        with self._lock:
            self._queue = COORDINATOR_QUEUE
            self._place = place
            self._tables = {}
            self._members = {}
            self._appended = {}

    # -- partitions --------------------------------------------------------------------------

    def loaded(self) -> set[int]:
        """The partitions whose groups this broker serves now."""
        with self._lock:
            return set(self._tables)

    def load(self, partition: int) -> None:
        """Read ``partition``'s records back from the local log into its table (again, if
        loaded: the log may have changed while another broker led it)."""
        queue = self._queue
        offset = self._store.describe_queue(queue).partitions[partition].start_offset
        table: dict[bytes, int] = {}
        members: dict[str, bytes] = {}
        while True:
            res = self._store.fetch(queue, partition, offset, max_bytes=4 << 20)
            for b in res.batches:
                for r in decode_records(b, queue, start_offset=offset):
                    if r.key is not None:
                        _apply(table, members, r.key, r.body)
            if res.next_offset <= offset:
                break
            offset = res.next_offset
        appended = self._store.end_offset(queue, partition) - offset
        with self._lock:
            if self._queue == queue:
                self._tables[partition] = table
                self._members[partition] = members
                self._appended[partition] = appended

    def unload(self, partition: int) -> None:
        """Forget ``partition``'s table: another broker coordinates its groups now."""
        with self._lock:
            self._tables.pop(partition, None)
            self._members.pop(partition, None)
            self._appended.pop(partition, None)

    def groups_of(self, partition: int, groups: Iterable[str]) -> list[str]:
        """Those of ``groups`` whose commits go to ``partition`` of the commit queue, whoever
        coordinates them (its partition count read once, not per group)."""
        if self._place is None:
            return list(groups) if partition == 0 else []
        n = len(self._store.describe_queue(self._queue).partitions)
        return [g for g in groups if coordinator_partition(g, n) == partition]

    def partition_of(self, group: str) -> int:
        """The partition of ``group``'s commits, if this broker coordinates the group now
        (and has loaded it); else NotCoordinatorError."""
        validate_group(group)
        k = 0 if self._place is None else self._place.coordinator_partition(group)
        with self._lock:
            if k not in self._tables:
                raise NotCoordinatorError(
                    f"this broker is taking over as coordinator of group {group!r} (partition {k} of "
                    f"{self._queue} is being loaded): ask again in a moment"
                )
        return k

    # -- commits and reads --------------------------------------------------------------------

    @contextmanager
    def _writing(self, group: str) -> Iterator[int]:
        """``group``'s partition, for a write: inside the cluster node's ``producing`` of it
        (a move's fence waits for the write and refuses the next), whose refusal is told as
        NotCoordinatorError."""
        k = self.partition_of(group)
        place = self._place
        try:
            with place.producing(self._queue, k) if place is not None else nullcontext():
                yield k
        except NotLeaderError as e:  # the partition moved, or is fenced for its move
            raise NotCoordinatorError(f"this broker does not coordinate group {group!r} now: {e}") from None

    def _append(self, group: str, k: int, records: list[tuple[bytes, bytes]]) -> int | None:
        """Under the lock: append ``records`` (key, body) to partition ``k`` and take them
        into its tables, compacting it when due; the position to wait for to have them
        durable (None: the compaction waited for an fsync that covers them)."""
        table, members = self._table(group, k), self._members[k]
        batch = encode_batch([Message(body, key=key) for key, body in records])
        _, durable_at = self._store.append_nowait(self._queue, k, batch)
        for key, body in records:
            _apply(table, members, key, body)
        self._appended[k] += len(records)
        if self._compaction_due(k):
            self._compact(k)
            return None
        return durable_at

    def _table(self, group: str, k: int) -> dict[bytes, int]:
        """Under the lock: partition ``k``'s table, NotCoordinatorError if it was unloaded."""
        table = self._tables.get(k)
        if table is None:
            raise NotCoordinatorError(f"this broker stopped coordinating group {group!r}: ask again")
        return table

    def commit(self, group: str, queue: str, offsets: dict[int, int]) -> None:
        """Commit ``{partition: offset}``; see the module's docstring for the checks."""
        with self._writing(group) as k:
            check_offsets_given(offsets)
            info = self._store.describe_partitions(queue, offsets)
            checked = self._checked(info, offsets)
            records = [(_key(group, info.queue_id, part), _VALUE.pack(off)) for part, off in checked]
            with self._lock:
                durable_at = self._append(group, k, records)
            if self._sync and durable_at is not None:  # (a memory store has no position to wait for)
                self._store.wait_durable(durable_at)

    def delete(self, group: str, queue: str | None = None) -> int:
        """Delete ``group``'s committed offsets (on ``queue`` alone, if given): one tombstone
        (an empty body) per key, so a reload drops it and a compaction leaves it out. How
        many offsets went."""
        names = {q.queue_id: q.name for q in self._store.list_queues()}
        prefix = f"{group}\x00".encode()
        with self._writing(group) as k:
            with self._lock:
                table = self._table(group, k)
                doomed = [
                    key
                    for key in table
                    if key.startswith(prefix) and (queue is None or names.get(int(key.split(b"\x00")[1])) == queue)
                ]
                if not doomed:
                    return 0
                durable_at = self._append(group, k, [(key, b"") for key in doomed])
            if durable_at is not None:  # an operator's call: wait for its fsync whatever offsets_flush says
                self._store.wait_durable(durable_at)
        return len(doomed)

    def save_members(self, group: str, record: bytes) -> None:
        """Write ``group``'s membership record (``b""``: it has no members now), and wait for
        its fsync (see the module's docstring)."""
        with self._writing(group) as k:
            with self._lock:
                self._table(group, k)  # NotCoordinatorError if unloaded
                if not record and group not in self._members[k]:
                    return
                durable_at = self._append(group, k, [(_MEMBERS + group.encode(), record)])
            if durable_at is not None:
                self._store.wait_durable(durable_at)

    def saved_members(self, partition: int | None = None) -> dict[str, bytes]:
        """``{group: membership record}`` of the loaded partitions (or of ``partition``)."""
        with self._lock:
            if partition is not None:
                return dict(self._members.get(partition, {}))
            return {g: r for members in self._members.values() for g, r in members.items()}

    def answers_at_once(self, records: int) -> bool:
        """Whether a commit of ``records`` records would return without waiting for anything
        (so a server may run it on its event loop): ``offsets_flush`` async, a broker alone
        (a cluster's coordinator may have to ask ZooKeeper, or wait for a move's fence), no
        compaction due (it waits for an fsync) and no other commit under way (it may be
        compacting). A compaction can still begin between this answer and the commit, if a
        worker thread's commit slips in: then that one commit waits for its fsync."""
        if self._sync or self._place is not None or not self._lock.acquire(blocking=False):
            return False
        try:
            table = self._tables.get(0)
            if table is None:
                return False
            return not self._compaction_due(0, records)
        finally:
            self._lock.release()

    @property
    def flush(self) -> str:
        """``"async"`` or ``"sync"``: whether a commit is answered before or after its fsync
        (the store's ``offsets_flush``; see the module's docstring)."""
        return "sync" if self._sync else "async"

    def _checked(self, info: PartitionBounds, offsets: dict[int, int]) -> list[tuple[int, int]]:
        out = []
        for part, off in offsets.items():
            if isinstance(part, bool) or not isinstance(part, int) or part not in info.partitions:
                raise PartitionOutOfRangeError(
                    f"queue {info.name!r} has partitions 0..{info.partition_count - 1}; there is no partition {part!r}"
                )
            check_int_arg(off, "an offset")
            if off < 0:
                raise InvalidArgumentError(f"cannot commit offset {off} for {info.name}[{part}]: offsets start at 0")
            if self._place is None or self._place.leads(info.name, part):
                pi = info.partitions[part]
                if off > pi.end_offset:
                    raise InvalidArgumentError(
                        f"cannot commit offset {off} for {info.name}[{part}]: beyond the log end {pi.end_offset}"
                    )
                if off < pi.start_offset:
                    raise InvalidArgumentError(
                        f"cannot commit offset {off} for {info.name}[{part}]: before the log start {pi.start_offset}"
                    )
            out.append((part, off))
        return out

    def fetch(self, group: str, queue: str) -> dict[int, int]:
        """The committed offsets of ``group`` on ``queue``: ``{partition: offset}``."""
        k = self.partition_of(group)
        info = self._store.describe_queue(queue)
        out = {}
        with self._lock:
            table = self._tables.get(k, {})
            for part in range(len(info.partitions)):
                off = table.get(_key(group, info.queue_id, part))
                if off is not None:
                    out[part] = off
        return out

    def fetch_group(self, group: str) -> dict[str, dict[int, int]]:
        """Every committed offset of ``group``: ``{queue name: {partition: offset}}`` (queues
        deleted since are left out)."""
        k = self.partition_of(group)
        prefix = f"{group}\x00".encode()
        names = {q.queue_id: q.name for q in self._store.list_queues()}
        out: dict[str, dict[int, int]] = {}
        with self._lock:
            items = [(key, v) for key, v in self._tables.get(k, {}).items() if key.startswith(prefix)]
        for key, v in items:
            _, qid, part = key.split(b"\x00")
            name = names.get(int(qid))
            if name is not None:
                out.setdefault(name, {})[int(part)] = v
        return {q: dict(sorted(o.items())) for q, o in sorted(out.items())}

    def group_queues(self, partition: int | None = None) -> dict[str, set[str]]:
        """``{group: names of the queues it has committed offsets on}``, for every group of
        the loaded partitions (or of ``partition`` alone)."""
        names = {q.queue_id: q.name for q in self._store.list_queues()}
        out: dict[str, set[str]] = {}
        with self._lock:
            tables = [self._tables.get(partition, {})] if partition is not None else list(self._tables.values())
            keys = [k for t in tables for k in t]
        for k in keys:
            group, qid, _ = k.split(b"\x00")
            name = names.get(int(qid))
            if name is not None:
                out.setdefault(group.decode(), set()).add(name)
        return out

    def _compaction_due(self, partition: int, more: int = 0) -> bool:
        """Under the lock: whether ``partition``'s log (with ``more`` records) holds enough
        more records than its live ones for :meth:`_compact`."""
        live = len(self._tables[partition]) + len(self._members[partition])
        return self._appended[partition] + more > max(self._compact_min, self._compact_ratio * live)

    def _compact(self, partition: int) -> None:
        """Write ``partition``'s live table whole and start its log there (under the lock).
        The old records are deleted only once the new table is durable, under either policy:
        a power loss must find one of the two whole."""
        live = {q.queue_id for q in self._store.list_queues()}
        table = {k: v for k, v in self._tables[partition].items() if int(k.split(b"\x00")[1]) in live}
        self._tables[partition] = table
        snapshot_at = self._store.end_offset(self._queue, partition)
        items = [(k, _VALUE.pack(v)) for k, v in table.items()]
        items += [(_MEMBERS + g.encode(), r) for g, r in self._members[partition].items()]
        durable_at = None
        for i in range(0, len(items), _CHUNK):
            chunk = items[i : i + _CHUNK]
            batch = encode_batch([Message(v, key=k) for k, v in chunk])
            _, durable_at = self._store.append_nowait(self._queue, partition, batch)
        if durable_at is not None:
            self._store.wait_durable(durable_at)
        self._store.delete_before(self._queue, partition, snapshot_at)
        self._appended[partition] = len(items)
