"""KeyedPeers: what a broker of a cluster asks other brokers about keyed groups
(docs/design/cluster.md, "Keyed groups (built)").

- The coordinator of a keyed group asks each partition's leader for its log's start and
  end (DESCRIBE_QUEUE) when it needs them all: the base of a new group and the barrier of a
  resize, and a commit while a resize drains (the log starts it completes by). Another
  commit asks nobody: it is checked against the logs led here and, elsewhere, against the
  partition count only (:meth:`KeyedPeers.log_ranges`).
- A partition's leader serves a member's KEYED_FETCH with the group's state (key, size,
  generation, barrier) asked of the coordinator (KEYED_GROUP) and cached a moment
  (``state_max_age_s``), asked again at once when a member names a newer generation
  (:meth:`KeyedPeers.keyed_state`), and before an answer that holds messages: a waiting
  fetch with nothing to give costs no call, and a member a resize left behind gets no
  message it should not (StaleGenerationError instead). It filters by key hash itself, so
  other members' messages never leave the broker that stores them.

A broker's coordinator or leader that cannot be reached, or no longer coordinates or
leads, is answered as ``UnavailableError`` (retriable): the client refreshes and sends
again. Thread-safety: thread-safe; one connection per peer, one call on it at a time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

from headwater.broker.keyed import LOG_END_UNKNOWN
from headwater.broker.peer import PeerClient, PeerError
from headwater.cluster.metadata import ClusterView
from headwater.errors import GroupNotFoundError, NotCoordinatorError, NotLeaderError, UnavailableError
from headwater.model.cluster import KEYED_COORDINATOR_QUEUE, coordinator_partition, keyed_coordinator_name
from headwater.model.config import QueueIdentity, QueueInfo
from headwater.model.keyed import KeyedGroupInfo
from headwater.storage.api import Store

__all__ = ["KEYED_STATE_MAX_AGE_S", "KeyedPeers"]

#: How long a partition's leader serves fetches with a keyed group's state before asking
#: its coordinator again: a resize's barrier reaches the leader within this time.
KEYED_STATE_MAX_AGE_S = 1.0
#: The most keyed groups' states one broker keeps (the oldest forgotten first).
KEYED_STATES_MAX = 10_000
#: How long a peer may take to answer a keyed call: a fetch or a commit waits for it.
KEYED_PEER_TIMEOUT_S = 10.0
T = TypeVar("T")


class KeyedPeers:
    """The calls of one broker (``broker_id``) to the others, by the view ``view()``."""

    def __init__(
        self,
        store: Store,
        broker_id: int,
        view: Callable[[], ClusterView],
        *,
        state_max_age_s: float = KEYED_STATE_MAX_AGE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._broker_id = broker_id
        self._view = view
        self._max_age_s = state_max_age_s
        self._clock = clock
        self._lock = threading.Lock()
        self._links: dict[str, tuple[threading.Lock, list[PeerClient]]] = {}
        self._states: dict[tuple[int, str], tuple[float, KeyedGroupInfo]] = {}

    def close(self) -> None:
        with self._lock:
            links, self._links = self._links, {}
        for _, held in links.values():
            for peer in held:
                peer.close()

    # -- the coordinator's side --------------------------------------------------------------

    def log_ranges(self, queue: QueueInfo, ask_leaders: bool) -> dict[int, tuple[int, int]]:
        """Each partition's (start, end) offsets: from the local store where this broker
        leads it; from its leader when ``ask_leaders`` (UnavailableError when it cannot
        answer), else ``(0, LOG_END_UNKNOWN)``."""
        view = self._view()
        ranges: dict[int, tuple[int, int]] = {}
        by_leader: dict[int, list[int]] = {}
        for p in queue.partitions:
            leader = view.leader(queue.name, p.partition)
            if leader == self._broker_id:
                ranges[p.partition] = (p.start_offset, p.end_offset)
            elif ask_leaders:
                by_leader.setdefault(-1 if leader is None else leader, []).append(p.partition)
            else:
                ranges[p.partition] = (0, LOG_END_UNKNOWN)
        for leader, partitions in sorted(by_leader.items()):
            info = self._ask(
                view, leader, f"the leader of {queue.name}{partitions}", lambda c: c.describe_queue(queue.name)
            )
            for n in partitions:
                if n >= len(info.partitions):
                    raise UnavailableError(f"broker {leader} does not have {queue.name}[{n}] yet: ask again")
                ranges[n] = (info.partitions[n].start_offset, info.partitions[n].end_offset)
        return ranges

    def offset_for_time(self, queue: str, partition: int, timestamp_ms: int) -> int:
        """The first offset of ``queue[partition]`` at or after ``timestamp_ms``: from the
        local store where this broker leads it, else from its leader (UnavailableError when
        it cannot answer)."""
        view = self._view()
        leader = view.leader(queue, partition)
        if leader == self._broker_id:
            return self._store.offset_for_time(queue, partition, timestamp_ms)
        return self._ask(
            view, -1 if leader is None else leader, f"the leader of {queue}[{partition}]",
            lambda c: c.offset_for_time(queue, partition, timestamp_ms),
        )  # fmt: skip

    # -- the partition leader's side ---------------------------------------------------------

    def keyed_state(self, queue: QueueIdentity, group: str, generation: int, fresh: bool = False) -> KeyedGroupInfo:
        """The group's state as its coordinator has it: the cached one if younger than
        ``state_max_age_s``, not older than ``generation`` and not ``fresh``, else asked
        again (the leader asks afresh before it answers with messages). Cached by
        queue id: a queue made again under its old name has none of the old one's groups."""
        now = self._clock()
        name, cached = queue.name, (queue.queue_id, group)
        with self._lock:
            held = self._states.get(cached)
        if not fresh and held is not None and now - held[0] < self._max_age_s and held[1].generation >= generation:
            return held[1]
        view = self._view()
        qv = view.queues.get(KEYED_COORDINATOR_QUEUE)
        if qv is None:
            raise GroupNotFoundError(f"queue {name!r} has no keyed group {group!r}: the cluster has no keyed group")
        k = coordinator_partition(keyed_coordinator_name(name, group), len(qv.partitions))
        leader = view.leader(KEYED_COORDINATOR_QUEUE, k)
        info = self._ask(
            view, -1 if leader is None else leader, f"the coordinator of keyed group {group!r}",
            lambda c: c.keyed_group(name, group),
        )  # fmt: skip
        with self._lock:
            if len(self._states) >= KEYED_STATES_MAX:
                self._states.pop(next(iter(self._states)))
            self._states.pop(cached, None)
            self._states[cached] = (now, info)
        return info

    # -- connections -------------------------------------------------------------------------

    def _ask(self, view: ClusterView, broker_id: int, who: str, call: Callable[[PeerClient], T]) -> T:
        """``call`` on a connection to ``broker_id``; its trouble as UnavailableError."""
        address = view.broker_address(broker_id)
        if address is None:
            raise UnavailableError(f"{who} (broker {broker_id}) is not registered now: ask again in a moment")
        with self._lock:
            lock, held = self._links.setdefault(address, (threading.Lock(), []))
        with lock:
            try:
                if not held:
                    name = f"headwater-broker-{self._broker_id}-keyed"
                    held.append(PeerClient(address, name=name, request_timeout_s=KEYED_PEER_TIMEOUT_S))
                return call(held[0])
            except PeerError as e:
                for peer in held:
                    peer.close()
                held.clear()
                raise UnavailableError(f"{who} (broker {broker_id}) did not answer: {e}; ask again") from e
            except (NotCoordinatorError, NotLeaderError) as e:  # it moved: the view here is behind
                raise UnavailableError(f"{who} (broker {broker_id}) refused: {e}; ask again in a moment") from e
