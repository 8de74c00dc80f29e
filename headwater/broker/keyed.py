"""KeyedGroups: the broker's keyed groups (rules in :mod:`headwater.model.keyed`).

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
from collections.abc import Iterable

import msgspec

from headwater.broker.offsets import validate_group
from headwater.broker.table import DurableTable
from headwater.errors import GroupNotFoundError, InvalidArgumentError
from headwater.model.config import QueueInfo
from headwater.model.filtering import select_batches
from headwater.model.groups import GroupSummary
from headwater.model.keyed import (
    KeyedFetchResult,
    KeyedGroupInfo,
    KeyedGroupState,
    KeyHashFilter,
    parse_key_spec,
)
from headwater.storage.store import LogStore

__all__ = ["KeyedGroups", "KEYED_QUEUE"]

KEYED_QUEUE = "__keyed"
_decoder = msgspec.msgpack.Decoder(KeyedGroupInfo)
_encoder = msgspec.msgpack.Encoder()


def _ranges(info: QueueInfo) -> dict[int, tuple[int, int]]:
    return {p.partition: (p.start_offset, p.end_offset) for p in info.partitions}


def _starts(info: QueueInfo) -> dict[int, int]:
    return {p.partition: p.start_offset for p in info.partitions}


class KeyedGroups:
    """Every keyed group of one store. Thread-safe."""

    def __init__(self, store: LogStore) -> None:
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
                st = KeyedGroupState.create(queue, group, key, size, start, _ranges(qi))  # type: ignore[arg-type]
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
