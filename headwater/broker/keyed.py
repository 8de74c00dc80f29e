"""KeyedGroups: the broker's keyed groups, each a :class:`KeyedGroupState` (the values and
pure rules are :mod:`headwater.model.keyed`).

Each group's state — key, size, generation, base, positions, a resize's barrier — is one
record of the internal table ``__keyed`` (:class:`~headwater.broker.table.DurableTable`),
keyed by (queue id, group name): a queue deleted and created again starts without groups.
Every change (a commit, a resize starting or completing) rewrites the record durably
before the call returns, so a broker restart resumes every member from its commit and a
resize from its barrier.

A member's fetch reads the partition from the store, stops at the barrier while a resize
drains, and keeps only the member's messages (:class:`~headwater.model.keyed.KeyHashFilter`):
other members' messages never leave the broker.

Thread-safety: one lock serialises changes (each waits for its fsync, like a commit of
offsets); fetches read an immutable snapshot of the state and then the store, unlocked.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping

import msgspec

from headwater.broker.offsets import validate_group
from headwater.broker.table import DurableTable
from headwater.errors import (
    GroupNotFoundError,
    InvalidArgumentError,
    PartitionOutOfRangeError,
    StaleGenerationError,
    UsageError,
)
from headwater.model.checks import check_int_arg, check_offsets_given
from headwater.model.config import QueueInfo
from headwater.model.filtering import select_batches
from headwater.model.groups import GroupSummary
from headwater.model.keyed import (
    START_FORMS,
    KeyedFetchResult,
    KeyedGroupInfo,
    KeyHashFilter,
    check_keyed_size,
    parse_key_spec,
)
from headwater.storage.api import Store

__all__ = ["KeyedGroups", "KeyedGroupState", "KEYED_QUEUE"]

KEYED_QUEUE = "__keyed"
_decoder = msgspec.msgpack.Decoder(KeyedGroupInfo)
_encoder = msgspec.msgpack.Encoder()


def _ranges(info: QueueInfo) -> dict[int, tuple[int, int]]:
    return {p.partition: (p.start_offset, p.end_offset) for p in info.partitions}


def _starts(info: QueueInfo) -> dict[int, int]:
    return {p.partition: p.start_offset for p in info.partitions}


class KeyedGroupState:
    """One keyed group's state and its transitions (:mod:`headwater.model.keyed` explains
    them): every transition is checked before it is made, so a refused call leaves the state
    as it was. Thread-safety: none; :class:`KeyedGroups` holds its lock around every call."""

    def __init__(self, info: KeyedGroupInfo) -> None:
        self.info = info

    @classmethod
    def create(
        cls, queue: str, group: str, key: str, size: int, start: str, ranges: Mapping[int, tuple[int, int]]
    ) -> KeyedGroupState:
        """A new group; ``start`` ``"earliest"`` or ``"latest"`` picks its members' first
        position in each partition (``ranges``: partition -> (start, end) offsets)."""
        parse_key_spec(key)
        check_keyed_size(size)
        if start not in START_FORMS:
            raise InvalidArgumentError(f"start is 'earliest' or 'latest', got {start!r}")
        base = {p: (lo if start == "earliest" else hi) for p, (lo, hi) in ranges.items()}
        return cls(KeyedGroupInfo(queue=queue, group=group, key=key, size=size, base=base))

    def check_declared(self, key: str | None, size: int | None) -> None:
        """A member's declaration must agree with the group (``None``: no opinion)."""
        i = self.info
        if key is not None and key != i.key:
            parse_key_spec(key)
            raise InvalidArgumentError(
                f"keyed group {i.group!r} of queue {i.queue!r} is keyed by {i.key!r}, not {key!r}"
            )
        if size is not None:
            check_keyed_size(size)
            if size not in (i.size, i.resizing_to):
                now = f"{i.size} members" + (f", resizing to {i.resizing_to}" if i.resizing_to else "")
                raise InvalidArgumentError(
                    f"keyed group {i.group!r} of queue {i.queue!r} has {now}, not {size}; change "
                    f"its size with a resize (admin.resize_keyed_group)"
                )

    def check_member(self, member: int, generation: int) -> None:
        """Refuse a fetch or commit from outside the current generation."""
        i = self.info
        if isinstance(member, bool) or not isinstance(member, int) or member < 0:
            raise InvalidArgumentError(f"a member index is an int >= 0, got {member!r}")
        if generation != i.generation:
            raise StaleGenerationError(
                f"keyed group {i.group!r} is at generation {i.generation} (size {i.size}); "
                f"member {member} called for generation {generation}: refresh and continue "
                f"from the group's positions"
            )
        if member >= i.size:
            what = (
                f"it joins when the resize to {i.resizing_to} completes"
                if i.resizing_to is not None and member < i.resizing_to
                else "it is not in the group"
            )
            raise StaleGenerationError(
                f"keyed group {i.group!r} generation {i.generation} has members 0..{i.size - 1}; "
                f"member {member}: {what}"
            )

    def stop_offset(self, partition: int) -> int | None:
        """Where a member of the current generation must stop reading ``partition``."""
        if self.info.resizing_to is None:
            return None
        return self.info.barrier.get(partition, 0)

    def commit(
        self, member: int, generation: int, offsets: Mapping[int, int], ranges: Mapping[int, tuple[int, int]]
    ) -> None:
        """Record ``member``'s positions; ``ranges``: partition -> (start, end) offsets."""
        self.check_member(member, generation)
        check_offsets_given(offsets)
        i = self.info
        for part, off in offsets.items():
            if isinstance(part, bool) or not isinstance(part, int) or part not in ranges:
                raise PartitionOutOfRangeError(
                    f"queue {i.queue!r} has partitions 0..{len(ranges) - 1}; there is no partition {part!r}"
                )
            check_int_arg(off, "an offset")
            lo, hi = ranges[part]
            stop = self.stop_offset(part)
            if stop is not None and off > max(stop, lo):
                raise InvalidArgumentError(
                    f"cannot commit offset {off} for {i.queue}[{part}]: keyed group {i.group!r} is "
                    f"resizing and generation {i.generation} stops at the barrier {stop}"
                )
            if off > hi:
                raise InvalidArgumentError(f"cannot commit offset {off} for {i.queue}[{part}]: beyond the log end {hi}")
            if off < lo:
                raise InvalidArgumentError(
                    f"cannot commit offset {off} for {i.queue}[{part}]: before the log start {lo}"
                )
        positions = {m: dict(p) for m, p in i.positions.items()}
        positions.setdefault(member, {}).update(offsets)
        self.info = msgspec.structs.replace(i, positions=positions)

    def resize(self, size: int, ranges: Mapping[int, tuple[int, int]]) -> None:
        """Begin a resize to ``size`` members with the barrier at the end offsets now."""
        check_keyed_size(size, "new size")
        i = self.info
        if i.resizing_to is not None:
            if size == i.resizing_to:
                return  # asked again (a retry): already under way
            raise UsageError(
                f"keyed group {i.group!r} is already resizing from {i.size} to {i.resizing_to} "
                f"members; wait until its members reach the barrier"
            )
        if size == i.size:
            return
        barrier = {p: hi for p, (lo, hi) in ranges.items()}
        self.info = msgspec.structs.replace(i, resizing_to=size, barrier=barrier)

    def try_complete(self, starts: Mapping[int, int]) -> bool:
        """Finish a resize whose members all reached the barrier; True if it finished."""
        i = self.info
        if i.resizing_to is None or i.draining(starts):
            return False
        self.info = msgspec.structs.replace(
            i,
            size=i.resizing_to,
            generation=i.generation + 1,
            base=dict(i.barrier),
            positions={},
            resizing_to=None,
            barrier={},
        )
        return True


class KeyedGroups:
    """Every keyed group of one store. Thread-safe."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._lock = threading.Lock()
        self._table = DurableTable(store, KEYED_QUEUE, keep=self._live_keys)
        self._cache: dict[bytes, KeyedGroupInfo] = {}

    def _live_keys(self, queues: Iterable[QueueInfo] | None = None):  # noqa: ANN202 - the DurableTable compaction hook
        """Whether a record's key is of one of ``queues`` (the store's now, when None)."""
        live = {str(q.queue_id).encode() for q in (self._store.list_queues() if queues is None else queues)}
        return lambda key: key.split(b"\x00", 2)[1] in live

    @staticmethod
    def _key(info: QueueInfo, group: str) -> bytes:
        return b"g\x00%d\x00%s" % (info.queue_id, group.encode())

    def _get(self, key: bytes) -> KeyedGroupInfo | None:
        info = self._cache.get(key)
        if info is None:
            raw = self._table.get(key)
            if raw is None:
                return None
            info = self._cache[key] = _decoder.decode(raw)
        return info

    def _save(self, key: bytes, info: KeyedGroupInfo) -> None:
        self._table.put({key: _encoder.encode(info)})
        self._cache[key] = info

    def _existing(self, qi: QueueInfo, group: str) -> tuple[bytes, KeyedGroupInfo]:
        key = self._key(qi, group)
        info = self._get(key)
        if info is None:
            raise GroupNotFoundError(
                f"queue {qi.name!r} has no keyed group {group!r}; a member creates it "
                f"(client.keyed_consumer(..., size=N))"
            )
        return key, info

    # -- calls ----------------------------------------------------------------------------

    def summaries(self, queues: Iterable[QueueInfo]) -> list[GroupSummary]:
        """A line per keyed group of ``queues`` (the store's now: a deleted queue's groups are
        not listed; see ``KeyedGroupInfo.summary``)."""
        live = self._live_keys(queues)
        out = []
        with self._lock:
            for key, _ in self._table.items(b"g\x00"):
                info = self._get(key) if live(key) else None
                if info is not None:
                    out.append(info.summary())
        return sorted(out, key=lambda g: (g.group, g.queues))

    def group(
        self, queue: str, group: str, key: str | None = None, size: int | None = None, start: str = "earliest"
    ) -> KeyedGroupInfo:
        """Look a group up; with ``key`` and ``size``, create it if absent or check it."""
        validate_group(group)
        if (key is None) != (size is None):
            raise InvalidArgumentError("declare a keyed group with both key and size, or neither to look it up")
        with self._lock:
            qi = self._store.describe_queue(queue)
            k = self._key(qi, group)
            info = self._get(k)
            if info is None:
                if key is None:
                    self._existing(qi, group)  # raises GroupNotFoundError
                st = KeyedGroupState.create(queue, group, key, size, start, _ranges(qi))  # type: ignore[arg-type]  # key is not None here: _existing raised otherwise
                self._save(k, st.info)
                return st.info
            st = KeyedGroupState(info)
            st.check_declared(key, size)
            if st.try_complete(_starts(qi)):  # what a resize waited for may have expired
                self._save(k, st.info)
            return st.info

    def fetch_now(
        self, queue: str, group: str, member: int, generation: int, partition: int, offset: int, max_bytes: int
    ) -> KeyedFetchResult:
        """The member's messages from ``offset`` on (never waits)."""
        validate_group(group)
        qi = self._store.describe_queue(queue)
        _, info = self._existing(qi, group)  # unlocked: a snapshot, never held up by a commit's fsync
        st = KeyedGroupState(info)
        st.check_member(member, generation)
        stop = st.stop_offset(partition)
        res = self._store.fetch(queue, partition, offset, max_bytes=max_bytes, end_offset=stop)
        flt = KeyHashFilter(parse_key_spec(info.key), info.size, member)
        batches, selections = select_batches(
            res.batches, flt, start_offset=max(offset, res.start_offset), end_offset=stop
        )
        return KeyedFetchResult(
            batches, res.next_offset, res.start_offset, res.end_offset, info.generation, stop, selections
        )

    def commit(self, queue: str, group: str, member: int, generation: int, offsets: dict[int, int]) -> KeyedGroupInfo:
        validate_group(group)
        with self._lock:
            qi = self._store.describe_queue(queue)
            k, info = self._existing(qi, group)
            st = KeyedGroupState(info)
            st.commit(member, generation, offsets, _ranges(qi))
            st.try_complete(_starts(qi))
            self._save(k, st.info)
            return st.info

    def resize(self, queue: str, group: str, size: int) -> KeyedGroupInfo:
        validate_group(group)
        with self._lock:
            qi = self._store.describe_queue(queue)
            k, info = self._existing(qi, group)
            st = KeyedGroupState(info)
            st.resize(size, _ranges(qi))
            st.try_complete(_starts(qi))
            if st.info != info:
                self._save(k, st.info)
            return st.info
