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

On a cluster (:meth:`KeyedGroups.join_cluster`; docs/design/cluster.md, "Keyed groups
(built)") the records live in the cluster's queue ``__cluster_keyed``, one table per
partition: group (q, g)'s in partition ``coordinator_partition("q/g", n)``, whose leader
coordinates the group. The cluster node loads a partition when this broker comes to lead
it and unloads it when it stops, as it does the consumer groups' partitions; a change is
appended inside the node's ``producing`` of the partition, so a move's fence waits for it
and refuses the next (``NotCoordinatorError``). The logs of partitions led elsewhere come
from their leaders (:class:`KeyedPlace`), and a fetch at a partition's leader that does not
coordinate the group reads with the coordinator's state.

Thread-safety: one lock serialises changes (each waits for its fsync, like a commit of
offsets; on a cluster a new group also waits for the other leaders' answers, which a
resize and a commit ask for before taking it);
fetches read an immutable snapshot of the state and then the store, unlocked.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from contextlib import AbstractContextManager
from typing import Protocol

import msgspec

from headwater.broker.coordinated import CoordinatedTables
from headwater.broker.offsets import validate_group
from headwater.broker.table import DurableTable
from headwater.errors import (
    GroupNotFoundError,
    InvalidArgumentError,
    NotCoordinatorError,
    PartitionOutOfRangeError,
    StaleGenerationError,
    UsageError,
)
from headwater.model.checks import check_int_arg, check_offsets_given
from headwater.model.cluster import KEYED_COORDINATOR_QUEUE, keyed_coordinator_name
from headwater.model.config import QueueIdentity, QueueInfo
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

__all__ = ["KeyedGroups", "KeyedGroupState", "KeyedPlace", "KEYED_QUEUE", "LOG_END_UNKNOWN"]

KEYED_QUEUE = "__keyed"
#: A log end a cluster's coordinator does not know (the partition's leader is another
#: broker): a commit there is checked against the barrier alone.
LOG_END_UNKNOWN = (1 << 63) - 1
_decoder = msgspec.msgpack.Decoder(KeyedGroupInfo)
_encoder = msgspec.msgpack.Encoder()


def _serving(info: KeyedGroupInfo) -> tuple[object, ...]:
    """What a fetch is served by: the fields of the state a member's messages depend on."""
    return (info.key, info.size, info.generation, info.resizing_to, info.barrier)


def _starts(ranges: Mapping[int, tuple[int, int]]) -> dict[int, int]:
    return {p: lo for p, (lo, _) in ranges.items()}


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


class KeyedPlace(Protocol):
    """What the keyed groups of a broker in a cluster ask of its cluster node."""

    def coordinator_partition(self, group: str, of: str = ...) -> int:
        """The partition of queue ``of`` whose leader coordinates ``group`` (here a keyed
        group's :func:`keyed_coordinator_name`), if this broker does now; else
        NotCoordinatorError naming the coordinator it knows."""
        ...

    def producing(self, queue: str, partition: int) -> AbstractContextManager[None]:
        """Around an append: refused unless this broker leads it and no move fences it."""
        ...

    def check_leader(self, queue: str, partition: int) -> None:
        """NotLeaderError unless this broker leads ``queue[partition]`` now."""
        ...

    def log_ranges(self, queue: QueueInfo, ask_leaders: bool) -> dict[int, tuple[int, int]]:
        """Each partition's (start, end) offsets: from the local log where this broker leads
        it; from its leader when ``ask_leaders`` (UnavailableError if it cannot answer),
        else ``(0, LOG_END_UNKNOWN)``."""
        ...

    def keyed_state(self, queue: QueueIdentity, group: str, generation: int, fresh: bool = False) -> KeyedGroupInfo:
        """The group's state as its coordinator has it (cached a moment; asked again when
        ``generation`` is newer than the cached one's, or ``fresh``)."""
        ...


class _Part:
    """One table of groups (the broker's ``__keyed``, or a loaded partition of the
    cluster's keyed coordinator queue) and its decoded records."""

    def __init__(self, table: DurableTable) -> None:
        self.table = table
        self.cache: dict[bytes, KeyedGroupInfo] = {}

    def get(self, key: bytes) -> KeyedGroupInfo | None:
        info = self.cache.get(key)
        if info is None:
            raw = self.table.get(key)
            if raw is None:
                return None
            info = self.cache[key] = _decoder.decode(raw)
        return info


class KeyedGroups:
    """Every keyed group of one store (alone), or of the keyed coordinator partitions this
    broker leads (on a cluster, :meth:`join_cluster`). Thread-safe."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._lock = threading.Lock()
        self._tables: CoordinatedTables[_Part] = CoordinatedTables(
            _Part(DurableTable(store, KEYED_QUEUE, keep=self._live_keys)),
            lambda n: _Part(DurableTable(store, KEYED_COORDINATOR_QUEUE, n, keep=self._live_keys)),
            KEYED_COORDINATOR_QUEUE,
            "keyed group",
        )
        self._place: KeyedPlace | None = None  # None: a broker alone

    def join_cluster(self, place: KeyedPlace) -> None:
        """From now on keep the cluster's keyed coordinator queue, of which no partition is
        loaded until the cluster node :meth:`load`\\ s it; ``__keyed`` stays on disk."""
        self._place = place
        self._tables.join_cluster(place)

    def load(self, partition: int) -> None:
        """Read ``partition``'s records back from the local log (again, if loaded)."""
        self._tables.load(partition)

    def unload(self, partition: int) -> None:
        """Forget ``partition``'s groups: another broker coordinates them now."""
        self._tables.unload(partition)

    def loaded(self) -> set[int]:
        return self._tables.loaded()

    def _live_keys(self, queues: Iterable[QueueInfo] | None = None):  # noqa: ANN202 - the DurableTable compaction hook
        """Whether a record's key is of one of ``queues`` (the store's now, when None)."""
        live = {str(q.queue_id).encode() for q in (self._store.list_queues() if queues is None else queues)}
        return lambda key: key.split(b"\x00", 2)[1] in live

    @staticmethod
    def _key(info: QueueIdentity, group: str) -> bytes:
        return b"g\x00%d\x00%s" % (info.queue_id, group.encode())

    def _part_of(self, queue: str, group: str) -> tuple[int, _Part]:
        """The table of the group (on a cluster NotCoordinatorError unless coordinated here)."""
        return self._tables.of(keyed_coordinator_name(queue, group), f"{group!r} of {queue!r}")

    def _save(self, k: int, part: _Part, key: bytes, info: KeyedGroupInfo) -> None:
        with self._tables.writing(k, part, f"{info.group!r} of {info.queue!r}"):
            part.table.put({key: _encoder.encode(info)})
        part.cache[key] = info

    def _ranges(self, qi: QueueInfo, ask_leaders: bool) -> dict[int, tuple[int, int]]:
        if self._place is None:
            return {p.partition: (p.start_offset, p.end_offset) for p in qi.partitions}
        return self._place.log_ranges(qi, ask_leaders)

    def _existing(self, qi: QueueIdentity, group: str, part: _Part) -> tuple[bytes, KeyedGroupInfo]:
        key = self._key(qi, group)
        info = part.get(key)
        if info is None:
            raise GroupNotFoundError(
                f"queue {qi.name!r} has no keyed group {group!r}; a member creates it "
                f"(client.keyed_consumer(..., size=N))"
            )
        return key, info

    # -- calls ----------------------------------------------------------------------------

    def summaries(self, queues: Iterable[QueueInfo]) -> list[GroupSummary]:
        """A line per keyed group of ``queues`` (the store's now: a deleted queue's groups are
        not listed; see ``KeyedGroupInfo.summary``); on a cluster, those coordinated here."""
        return sorted((info.summary() for info in self.infos(queues)), key=lambda g: (g.group, g.queues))

    def infos(self, queues: Iterable[QueueInfo]) -> list[KeyedGroupInfo]:
        """The keyed groups of ``queues`` as they are stored (on a cluster, those coordinated
        here), changing nothing: for lists and the metrics' lag."""
        live = self._live_keys(queues)
        out = []
        with self._lock:
            for part in self._tables.all():
                for key, _ in part.table.items(b"g\x00"):
                    info = part.get(key) if live(key) else None
                    if info is not None:
                        out.append(info)
        return out

    def group(
        self, queue: str, group: str, key: str | None = None, size: int | None = None, start: str = "earliest"
    ) -> KeyedGroupInfo:
        """Look a group up; with ``key`` and ``size``, create it if absent or check it."""
        validate_group(group)
        if (key is None) != (size is None):
            raise InvalidArgumentError("declare a keyed group with both key and size, or neither to look it up")
        self._part_of(queue, group)  # first: the first keyed call of a cluster makes its queue, unlocked
        with self._lock:
            n, part = self._part_of(queue, group)
            qi = self._store.describe_queue(queue)
            k = self._key(qi, group)
            info = part.get(k)
            if info is None:
                if key is None:
                    self._existing(qi, group, part)  # raises GroupNotFoundError
                ranges = self._ranges(qi, ask_leaders=True)
                st = KeyedGroupState.create(queue, group, key, size, start, ranges)  # type: ignore[arg-type]  # key is not None here: _existing raised otherwise
                self._save(n, part, k, st.info)
                return st.info
            st = KeyedGroupState(info)
            st.check_declared(key, size)
            # what a resize waited for may have expired (a lookup asks no other broker)
            if info.resizing_to is not None and st.try_complete(_starts(self._ranges(qi, key is not None))):
                self._save(n, part, k, st.info)
            return st.info

    def fetch_now(
        self, queue: str, group: str, member: int, generation: int, partition: int, offset: int, max_bytes: int
    ) -> KeyedFetchResult:
        """The member's messages from ``offset`` on (never waits). On a cluster this broker
        leads the partition and may not coordinate the group: it reads with the state it
        has from the coordinator (a moment old), and before it answers with messages asks
        again, so a member the group has left behind (a resize) gets none."""
        validate_group(group)
        qi = self._store.describe_partitions(queue, ())  # its name and id: each partition's fetch asks
        info, remote = self._state(qi, group, generation)  # unlocked: a snapshot, never held up by a commit's fsync
        res = self._read(info, member, generation, partition, offset, max_bytes)
        if remote and res.batches:
            fresh, _ = self._state(qi, group, generation, fresh=True)
            if _serving(fresh) != _serving(info):
                res = self._read(fresh, member, generation, partition, offset, max_bytes)
        return res

    def _read(
        self, info: KeyedGroupInfo, member: int, generation: int, partition: int, offset: int, max_bytes: int
    ) -> KeyedFetchResult:
        st = KeyedGroupState(info)
        st.check_member(member, generation)
        stop = st.stop_offset(partition)
        res = self._store.fetch(info.queue, partition, offset, max_bytes=max_bytes, end_offset=stop)
        flt = KeyHashFilter(parse_key_spec(info.key), info.size, member)
        batches, selections = select_batches(
            res.batches, flt, start_offset=max(offset, res.start_offset), end_offset=stop
        )
        return KeyedFetchResult(
            batches, res.next_offset, res.start_offset, res.end_offset, info.generation, stop, selections
        )

    def _state(
        self, qi: QueueIdentity, group: str, generation: int, fresh: bool = False
    ) -> tuple[KeyedGroupInfo, bool]:
        """The group's state, and whether it came from another broker (the coordinator)."""
        place = self._place
        if place is not None:
            try:
                self._part_of(qi.name, group)
            except NotCoordinatorError:
                return place.keyed_state(qi, group, generation, fresh), True
        _, part = self._part_of(qi.name, group)
        return self._existing(qi, group, part)[1], False

    def commit(self, queue: str, group: str, member: int, generation: int, offsets: dict[int, int]) -> KeyedGroupInfo:
        validate_group(group)
        qi = self._store.describe_queue(queue)
        # on a cluster the logs led here; while a resize drains, every leader's (a log start
        # past the barrier lets a member commit there, and completes the resize): asked
        # before the lock, so a slow leader holds up no other group's change
        draining = self._draining(qi, group)
        ranges = self._ranges(qi, ask_leaders=draining)
        with self._lock:
            n, part = self._part_of(queue, group)
            k, info = self._existing(qi, group, part)
            if info.resizing_to is not None and not draining:  # the resize began meanwhile
                ranges = self._ranges(qi, ask_leaders=True)
            st = KeyedGroupState(info)
            st.commit(member, generation, offsets, ranges)
            st.try_complete(_starts(ranges))
            self._save(n, part, k, st.info)
            return st.info

    def resize(self, queue: str, group: str, size: int) -> KeyedGroupInfo:
        validate_group(group)
        qi = self._store.describe_queue(queue)
        self._draining(qi, group)  # NotCoordinatorError or GroupNotFoundError before asking the leaders
        ranges = self._ranges(qi, ask_leaders=True)  # the barrier: every partition's end now (before the lock)
        with self._lock:
            n, part = self._part_of(queue, group)
            k, info = self._existing(qi, group, part)
            st = KeyedGroupState(info)
            st.resize(size, ranges)
            st.try_complete(_starts(ranges))
            if st.info != info:
                self._save(n, part, k, st.info)
            return st.info

    def _draining(self, qi: QueueInfo, group: str) -> bool:
        """Whether the group is resizing now (a snapshot, unlocked)."""
        _, part = self._part_of(qi.name, group)
        return self._existing(qi, group, part)[1].resizing_to is not None
