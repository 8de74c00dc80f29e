"""The broker's cache of the cluster's metadata, fed by watches (``docs/design/cluster.md``,
"Brokers follow ZooKeeper").

:class:`MetadataCache` follows the tree under the chroot with the coordination's persistent
watches: the brokers (``/brokers`` and each one's registration), the controller, the queues
(each one's record, its ``p`` children and each partition's record) and the moves (two
levels). Each change is published as a new :class:`ClusterView`, an immutable snapshot that
any thread may read without a lock and that answers METADATA requests and routing questions.

How it stays right:

- A watch's callback is a hint, not the value: the cache reads the node again, under its
  lock, so that every read of the tree follows the one before it (one session reads in
  order) and an old callback, run late on some thread, cannot undo a newer read. A read that
  finds a node gone reads the listing that named it too, so a queue deleted in one commit
  leaves the view in one step; a listing that names something new has all of it read at
  once, so a queue created in one commit appears whole.
- Watches cannot be removed (on kazoo nor on the fake): a path is watched once, for good,
  and a callback for a node no longer listed under the followed tree does nothing. When the
  node comes back its listing's change reads it again.
- After a new session (a LOST one, then CONNECTED) or a read that failed, the whole tree is
  read again once, since watches may have missed changes meanwhile, and a new view is
  published.
- A node holding a bad record is left out of the view, and logged once with its path.

Thread-safety: callbacks arrive on the coordination's threads (kazoo runs some on threads
of their own); one lock guards the cache's state, and ``on_change`` callbacks run in order,
one at a time, never under that lock, after the view they are given is visible in
:attr:`MetadataCache.view`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from types import MappingProxyType
from typing import Literal, TypeVar

import msgspec

from headwater.cluster.coordination import Coordination, NoNodeError, SessionLostError, SessionState, Stat
from headwater.cluster.records import (
    BrokerRecord,
    ControllerRecord,
    MoveOutcomes,
    MoveRecord,
    PartitionRecord,
    QueueRecord,
    RecordError,
    decode,
    paths,
)
from headwater.model.cluster import MoveOutcome, coordinator_partition

__all__ = ["BrokerInfo", "ClusterView", "MetadataCache", "QueueView"]

log = logging.getLogger("headwater.cluster.metadata")

_Target = tuple[Literal["data", "children"], str]  # a watched node: its data, or its children's names
_ROOTS: tuple[_Target, ...] = (
    ("children", paths.BROKERS),
    ("data", paths.CONTROLLER),
    ("children", paths.QUEUES),
    ("children", paths.MOVES),
    ("data", paths.MOVE_OUTCOMES),
)
R = TypeVar("R", bound=msgspec.Struct)
K = TypeVar("K")
V = TypeVar("V")


def _frozen(d: dict[K, V] | None = None) -> Mapping[K, V]:
    """A read-only view of ``d``: a snapshot's mappings cannot be changed by its readers."""
    return MappingProxyType(d or {})


@dataclass(frozen=True, slots=True)
class BrokerInfo:
    """A live broker: its registration and its broker epoch (the registration's creation
    zxid, new at every registration)."""

    record: BrokerRecord
    epoch: int


@dataclass(frozen=True, slots=True)
class QueueView:
    """A queue as the controller created it, and its partitions by number."""

    record: QueueRecord
    partitions: Mapping[int, PartitionRecord]


@dataclass(frozen=True, slots=True)
class ClusterView:
    """The cluster's metadata at one moment: live brokers by id, the controller (None while
    there is none), the queues by name, the unfinished moves by (queue, partition) and how
    the latest moves ended."""

    brokers: Mapping[int, BrokerInfo] = field(default_factory=_frozen)
    controller: ControllerRecord | None = None
    queues: Mapping[str, QueueView] = field(default_factory=_frozen)
    moves: Mapping[tuple[str, int], MoveRecord] = field(default_factory=_frozen)
    ended_moves: tuple[MoveOutcome, ...] = ()  # how the latest moves ended, oldest first

    def partition(self, queue: str, partition: int) -> PartitionRecord | None:
        """``queue``'s ``partition`` record, or None if the view has no such partition."""
        q = self.queues.get(queue)
        return None if q is None else q.partitions.get(partition)

    def leader(self, queue: str, partition: int) -> int | None:
        """The broker id that leads ``queue``'s ``partition``, or None if it is unknown."""
        p = self.partition(queue, partition)
        return None if p is None else p.leader

    def leader_epoch(self, queue: str, partition: int) -> int | None:
        p = self.partition(queue, partition)
        return None if p is None else p.leader_epoch

    def broker_address(self, broker_id: int) -> str | None:
        """``host:port`` of a live broker, or None if it is not registered."""
        b = self.brokers.get(broker_id)
        return None if b is None else b.record.address

    def partitions_of(self, broker_id: int) -> list[tuple[str, int]]:
        """The (queue, partition) pairs of which ``broker_id`` holds a replica, sorted."""
        return sorted(key for key, replicas in self.assignment().items() if broker_id in replicas)

    def assignment(self) -> dict[tuple[str, int], list[int]]:
        """Each partition's replicas as the controller wrote them (leader first when it
        placed them): what :func:`~headwater.cluster.placement.plan_rebalance` takes."""
        return {(q, n): list(p.replicas) for q, view in self.queues.items() for n, p in view.partitions.items()}

    @staticmethod
    def coordinator_partition(group: str, partitions: int) -> int:
        """:func:`headwater.model.cluster.coordinator_partition` (clients use the same)."""
        return coordinator_partition(group, partitions)

    def summary(self) -> str:
        """A line for messages and logs."""
        controller = "none" if self.controller is None else f"broker {self.controller.broker_id}"
        return (
            f"brokers {sorted(self.brokers)}, controller {controller}, {len(self.queues)} queues, "
            f"{len(self.moves)} moves"
        )


def _dependents(path: str, names: list[str]) -> list[_Target]:
    """What a listing of ``path`` with children ``names`` makes the cache follow."""
    if path == paths.QUEUES:
        return [t for q in names for t in (("data", paths.queue(q)), ("children", paths.partitions(q)))]
    if path == paths.MOVES:
        return [("children", f"{path}/{q}") for q in names]
    return [("data", f"{path}/{name}") for name in names]  # brokers, a queue's partitions, a queue's moves


class MetadataCache:
    """The latest :class:`ClusterView` of the cluster ``coord`` is a session with; ``start``
    reads the tree and follows it. The cache uses ``coord`` but does not own it: ``close``
    stops the cache, not the session."""

    def __init__(self, coord: Coordination) -> None:
        self._coord = coord
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._deliver_lock = threading.RLock()  # reentrant: a callback may cause a delivery on its thread
        self._data: dict[str, tuple[bytes, Stat] | None] = {}  # the last read of each followed node
        self._children: dict[str, list[str]] = {}  # the last read of each followed listing
        self._wanted: dict[_Target, _Target | None] = {}  # what the tree as read names, and its listing
        self._watched: set[_Target] = set()
        self._bad: dict[str, object] = {}  # path -> the bad content logged for it
        self._decoded: dict[str, tuple[tuple[bytes, Stat], msgspec.Struct]] = {}  # path -> a read, its record
        self._view = ClusterView()
        self._delivered: ClusterView | None = None
        self._callbacks: list[Callable[[ClusterView], None]] = []
        self._session_id = 0  # the session in which the tree was last read whole
        self._stale = True  # a read failed or a session ended: read the whole tree again
        self._closed = False

    @property
    def view(self) -> ClusterView:
        """The latest snapshot; reading it needs no lock."""
        return self._view

    def on_change(self, callback: Callable[[ClusterView], None]) -> None:
        """Call ``callback(view)`` after each change, with the latest view (changes that come
        together may come in one call), in order; it must not block."""
        with self._deliver_lock:
            self._callbacks.append(callback)

    def start(self) -> None:
        """Read the whole tree, publish the first view and follow the tree. If the session is
        not connected, the view stays empty until it is."""
        self._coord.on_session(self._on_session)
        self._reread()

    def close(self) -> None:
        """Stop following: later callbacks do nothing (watches cannot be removed)."""
        with self._lock:
            self._closed = True
            self._changed.notify_all()

    def wait_for(
        self, predicate: Callable[[ClusterView], bool], timeout_s: float, what: str | None = None
    ) -> ClusterView:
        """The first view (the current one included) for which ``predicate`` holds, or
        :class:`TimeoutError` after ``timeout_s``, naming ``what`` (the predicate's name by
        default). ``predicate`` runs under the cache's lock: it must only look at the view."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while not predicate(self._view):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"the cluster metadata did not show {what or getattr(predicate, '__name__', predicate)} "
                        f"within {timeout_s:g} s; it shows {self._view.summary()}"
                    )
                self._changed.wait(left)
            return self._view

    # -- events ------------------------------------------------------------------------------

    def _on_session(self, state: SessionState) -> None:
        if state is SessionState.LOST:
            with self._lock:
                self._stale = True
        elif state is SessionState.CONNECTED:
            with self._lock:
                # kazoo may run LOST's callback after CONNECTED's: a new session id tells too
                again = self._stale or self._coord.session_id != self._session_id
            if again:
                self._reread_logged()

    def _on_data(self, path: str, data: bytes | None, stat: Stat | None) -> None:
        self._on_event(("data", path), None if stat is None or data is None else (data, stat))

    def _on_children(self, path: str, names: list[str]) -> None:
        self._on_event(("children", path), names)

    def _on_event(self, target: _Target, seen: object) -> None:
        try:
            with self._lock:
                if self._closed or target not in self._wanted:
                    return  # a node the tree no longer names: its watch outlives it, harmlessly
                stale = self._stale
                kind, path = target
                if stale or seen == (self._data.get(path) if kind == "data" else self._children.get(path)):
                    follow = []  # nothing newer than what was read (a watch's first call, a repeat)
                else:
                    self._refresh(target)
                    follow = self._publish()
        except SessionLostError:
            with self._lock:
                self._stale = True  # read whole again at the next CONNECTED
            return
        except Exception:  # never let the coordination's thread die: read whole at the next event
            log.exception("cluster metadata: handling a change of %s failed", target[1])
            with self._lock:
                self._stale = True
            return
        if stale:
            self._reread_logged()  # a read failed before: this one may not be all that was missed
            return
        self._follow(follow)
        self._deliver()

    def _reread_logged(self) -> None:
        """:meth:`_reread` on the coordination's thread: a failure is logged, not raised, and
        the next event or connection reads again."""
        try:
            self._reread()
        except Exception:
            log.exception("cluster metadata: reading the whole tree failed")
            with self._lock:
                self._stale = True

    def _reread(self) -> None:
        """Read the whole tree, replace the cache's copy and publish; if the session is not
        connected, leave it to the next connection."""
        try:
            with self._lock:
                if self._closed:
                    return
                session_id = self._coord.session_id
                data: dict[str, tuple[bytes, Stat] | None] = {}
                children: dict[str, list[str]] = {}
                for root in _ROOTS:
                    self._read_tree(root, data, children)
                self._data, self._children = data, children
                self._session_id, self._stale = session_id, False
                follow = self._publish()
        except SessionLostError:
            with self._lock:
                self._stale = True
            return
        self._follow(follow)
        self._deliver()

    # -- reading, under the lock ---------------------------------------------------------------

    def _read(
        self, target: _Target, data: dict[str, tuple[bytes, Stat] | None], children: dict[str, list[str]]
    ) -> bool:
        """Read one node into ``data`` or ``children``; whether it exists."""
        kind, path = target
        try:
            if kind == "data":
                data[path] = self._coord.get(path)
            else:
                children[path] = self._coord.children(path)
            return True
        except NoNodeError:
            if kind == "data":
                data[path] = None
            else:
                children[path] = []
            return False

    def _read_tree(
        self, target: _Target, data: dict[str, tuple[bytes, Stat] | None], children: dict[str, list[str]]
    ) -> None:
        """Read ``target`` and all the cache follows below it."""
        self._read(target, data, children)
        if target[0] == "children":
            for dep in _dependents(target[1], children[target[1]]):
                self._read_tree(dep, data, children)

    def _refresh(self, target: _Target) -> None:
        """Read ``target`` again, and what is new below it; while what was read is gone, read
        the listing that named it as well, so a deletion leaves the view whole."""
        t: _Target | None = target
        while t is not None:
            exists = self._read(t, self._data, self._children)
            if t[0] == "children":
                for dep in _dependents(t[1], self._children[t[1]]):
                    if dep[1] not in (self._data if dep[0] == "data" else self._children):
                        self._read_tree(dep, self._data, self._children)
            if exists:
                return
            t = self._wanted.get(t)

    def _publish(self) -> list[_Target]:
        """Forget what the tree no longer names, make the view, and publish it if it changed;
        what to watch that is not watched yet."""
        wanted: dict[_Target, _Target | None] = dict.fromkeys(_ROOTS)
        listings = [t for t in _ROOTS if t[0] == "children"]
        while listings:
            listing = listings.pop()
            for dep in _dependents(listing[1], self._children.get(listing[1], [])):
                wanted[dep] = listing
                if dep[0] == "children":
                    listings.append(dep)
        self._wanted = wanted
        self._data = {p: v for p, v in self._data.items() if ("data", p) in wanted}
        self._children = {p: v for p, v in self._children.items() if ("children", p) in wanted}
        self._bad = {p: v for p, v in self._bad.items() if p in self._data or p in self._children}
        self._decoded = {p: v for p, v in self._decoded.items() if self._data.get(p) is v[0]}
        view = self._make_view()
        if view != self._view:
            self._view = view
            self._changed.notify_all()
        follow = [t for t in wanted if t not in self._watched]
        self._watched.update(follow)
        return follow

    # -- the view --------------------------------------------------------------------------------

    def _record_read(self, path: str, kind: type[R]) -> tuple[R, Stat] | None:
        """The record at ``path`` as last read and its node's stat, or None: absent, or bad
        (logged once)."""
        entry = self._data.get(path)
        if entry is None:
            return None
        known = self._decoded.get(path)
        if known is not None and known[0] is entry and isinstance(known[1], kind):
            return known[1], entry[1]  # a view is made at every change: decode each read once
        try:
            record = decode(entry[0], kind, path)
            self._decoded[path] = (entry, record)
            return record, entry[1]
        except RecordError as e:
            self._complain(path, entry, str(e))
            return None

    def _record(self, path: str, kind: type[R]) -> R | None:
        read = self._record_read(path, kind)
        return None if read is None else read[0]

    def _complain(self, path: str, content: object, problem: str) -> None:
        if self._bad.get(path) != content:
            self._bad[path] = content
            log.warning("cluster metadata: %s; it is left out until it is fixed", problem)

    def _numbered(self, listing: str) -> list[tuple[int, str]]:
        """The children of ``listing`` named by a number, with their paths; any other name is
        logged once and left out."""
        out = []
        for name in self._children.get(listing, []):
            path = f"{listing}/{name}"
            try:
                out.append((int(name), path))
            except ValueError:
                self._complain(path, "name", f"{path} is not named by a number")
        return out

    def _make_view(self) -> ClusterView:
        brokers: dict[int, BrokerInfo] = {}
        for broker_id, path in self._numbered(paths.BROKERS):
            read = self._record_read(path, BrokerRecord)
            if read is not None and read[0].broker_id != broker_id:
                self._complain(path, self._data.get(path), f"{path} holds broker {read[0].broker_id}'s registration")
            elif read is not None:
                brokers[broker_id] = BrokerInfo(read[0], read[1].created_zxid)
        queues: dict[str, QueueView] = {}
        for name in self._children.get(paths.QUEUES, []):
            q = self._record(paths.queue(name), QueueRecord)
            if q is not None:
                parts: dict[int, PartitionRecord] = {}
                for n, path in self._numbered(paths.partitions(name)):
                    if (p := self._record(path, PartitionRecord)) is not None:
                        parts[n] = p
                queues[name] = QueueView(q, _frozen(parts))
        moves: dict[tuple[str, int], MoveRecord] = {}
        for name in self._children.get(paths.MOVES, []):
            for n, path in self._numbered(f"{paths.MOVES}/{name}"):
                if (m := self._record(path, MoveRecord)) is not None:
                    moves[(name, n)] = m
        ended = self._record(paths.MOVE_OUTCOMES, MoveOutcomes)
        return ClusterView(
            _frozen(brokers),
            self._record(paths.CONTROLLER, ControllerRecord),
            _frozen(queues),
            _frozen(moves),
            () if ended is None else tuple(ended.outcomes),
        )

    # -- outside the lock ------------------------------------------------------------------------

    def _follow(self, targets: list[_Target]) -> None:
        """Watch each target; a watch's first call comes at once (on kazoo, on this thread)."""
        for i, (kind, path) in enumerate(targets):
            try:
                if kind == "data":
                    self._coord.watch_data(path, partial(self._on_data, path))
                else:
                    self._coord.watch_children(path, partial(self._on_children, path))
            except SessionLostError:
                with self._lock:  # watch them at the next whole read
                    self._watched.difference_update(targets[i:])
                    self._stale = True
                return

    def _deliver(self) -> None:
        """Run the callbacks with the latest view, unless they have had it: one delivery at a
        time, so that callbacks see views in order."""
        with self._deliver_lock:
            view = self._view
            if view is self._delivered:
                return
            self._delivered = view
            for callback in list(self._callbacks):
                try:
                    callback(view)
                except Exception:
                    log.exception("cluster metadata: a change callback failed")
