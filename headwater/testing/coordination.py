"""An in-memory coordination ensemble: ZooKeeper's semantics in one process, for tests.

``MemoryEnsemble()`` is the service; ``ensemble.connect()`` opens a session
(:class:`~headwater.cluster.coordination.Coordination`). It keeps what the cluster relies
on: versions and conditional writes, all-or-nothing transactions, creation zxids, sequential
and ephemeral nodes (gone when their session closes or ``ensemble.expire(session_id)``
ends it), persistent watches delivered in order on each session's own thread. It runs the
same contract suite as ZooKeeper (``tests/test_coordination_contract.py``), so a seeded
simulation of the controller can run against it in milliseconds, with sessions expired and
paused at chosen moments (``session.hold_events()`` holds back what a session hears).
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from headwater.cluster.coordination import (
    ANY_VERSION,
    BadVersionError,
    Check,
    CoordinationError,
    Create,
    Delete,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    Op,
    SessionLostError,
    SessionState,
    Set,
    Stat,
    TransactionFailedError,
)

__all__ = ["MemoryCoordination", "MemoryEnsemble"]


@dataclass
class _Node:
    data: bytes
    created_zxid: int
    ephemeral_owner: int = 0
    version: int = 0
    children_version: int = 0
    sequence: int = 0  # the next sequential child's number
    children: set[str] = field(default_factory=set)

    def stat(self) -> Stat:
        return Stat(self.version, self.created_zxid, self.ephemeral_owner, self.children_version)


def _parent(path: str) -> str:
    return path.rsplit("/", 1)[0] or "/"


def _check_path(path: str) -> None:
    if not path.startswith("/") or (path != "/" and path.endswith("/")) or "//" in path:
        raise CoordinationError(f"not a node path: {path!r}", path)


class MemoryEnsemble:
    """The service: one tree, shared by every session connected to it."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._nodes: dict[str, _Node] = {"/": _Node(b"", 0)}
        self._zxid = itertools.count(1)
        self._session_ids = itertools.count(0x1000)
        self._sessions: dict[int, MemoryCoordination] = {}

    def connect(self) -> MemoryCoordination:
        with self._lock:
            s = MemoryCoordination(self, next(self._session_ids))
            self._sessions[s.session_id] = s
        return s

    def expire(self, session_id: int) -> None:
        """End a session as ZooKeeper does when it hears nothing from it within its timeout:
        its ephemeral nodes go and it hears LOST; then, as kazoo does, the client gets a new
        session (a new id) and hears CONNECTED, unless it was closed."""
        with self._lock:
            s = self._sessions.pop(session_id, None)
            if s is None:
                return
            for path, node in sorted(self._nodes.items(), reverse=True):
                if node.ephemeral_owner == session_id:
                    self._remove(path)
            s._deliver_state(SessionState.LOST)
            if s._closed:
                return
            s._id = next(self._session_ids)
            self._sessions[s._id] = s
            s._deliver_state(SessionState.CONNECTED)

    # -- the tree, under the lock -----------------------------------------------------------

    def _node(self, path: str) -> _Node:
        _check_path(path)
        node = self._nodes.get(path)
        if node is None:
            raise NoNodeError(f"no node {path}", path)
        return node

    def _apply(self, op: Op, session: MemoryCoordination, *, sequential: bool = False, dry: bool = False) -> str:
        """Check ``op`` against the tree, and unless ``dry``, apply it; the path created."""
        if type(op) is Check:
            node = self._node(op.path)
            if op.version != node.version:
                raise BadVersionError(f"node {op.path} is at version {node.version}, not {op.version}", op.path)
            return op.path
        if type(op) is Create:
            _check_path(op.path)
            parent = self._node(_parent(op.path))
            if parent.ephemeral_owner:
                raise CoordinationError(f"ephemeral node {_parent(op.path)} cannot have children", op.path)
            path = f"{op.path}{parent.sequence:010d}" if sequential else op.path
            if path in self._nodes:
                raise NodeExistsError(f"node {path} exists", path)
            if not dry:
                parent.sequence += sequential
                self._nodes[path] = _Node(bytes(op.data), next(self._zxid), session.session_id if op.ephemeral else 0)
                parent.children.add(path.rsplit("/", 1)[1])
                parent.children_version += 1
                self._changed(path, children_of=_parent(path))
            return path
        if type(op) is Set:
            node = self._node(op.path)
            if op.version not in (ANY_VERSION, node.version):
                raise BadVersionError(f"node {op.path} is at version {node.version}, not {op.version}", op.path)
            if not dry:
                node.data, node.version = bytes(op.data), node.version + 1
                self._changed(op.path)
            return op.path
        if type(op) is Delete:
            node = self._node(op.path)
            if op.path == "/":
                raise CoordinationError("the root cannot be deleted", op.path)
            if op.version not in (ANY_VERSION, node.version):
                raise BadVersionError(f"node {op.path} is at version {node.version}, not {op.version}", op.path)
            if node.children:
                raise NotEmptyError(f"node {op.path} has children", op.path)
            if not dry:
                self._remove(op.path)
            return op.path
        raise TypeError(f"not a coordination operation: {op!r}")

    def _remove(self, path: str) -> None:
        del self._nodes[path]
        parent = self._nodes[_parent(path)]
        parent.children.discard(path.rsplit("/", 1)[1])
        parent.children_version += 1
        self._changed(path, children_of=_parent(path))

    def _changed(self, path: str, children_of: str | None = None) -> None:
        for s in list(self._sessions.values()):
            s._node_changed(path, children_of)

    def _commit(self, ops: Sequence[Op], session: MemoryCoordination) -> None:
        """All or nothing: every op is checked against the tree as the earlier ones leave
        it (on a copy), then all are applied."""
        with self._lock:
            saved = {p: _Node(n.data, n.created_zxid, n.ephemeral_owner, n.version, n.children_version,
                              n.sequence, set(n.children)) for p, n in self._nodes.items()}  # fmt: skip
            sessions, self._sessions = self._sessions, {}  # no watch fires for a trial run
            try:
                for i, op in enumerate(ops):
                    try:
                        self._apply(op, session)
                    except CoordinationError as e:
                        raise TransactionFailedError(i, e) from e
            finally:
                self._nodes, self._sessions = saved, sessions
            for op in ops:
                self._apply(op, session)


class MemoryCoordination:
    """A session with a :class:`MemoryEnsemble`."""

    def __init__(self, ensemble: MemoryEnsemble, session_id: int) -> None:
        self._ensemble = ensemble
        self._id = session_id
        self._closed = False
        self._data_watches: dict[str, list[Callable[[bytes | None, Stat | None], None]]] = {}
        self._children_watches: dict[str, list[Callable[[list[str]], None]]] = {}
        self._session_callbacks: list[Callable[[SessionState], None]] = []
        self._events: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._delivering = threading.Event()  # cleared while events are held back
        self._delivering.set()
        self._thread = threading.Thread(target=self._run, name=f"memory-coordination-{session_id:x}", daemon=True)
        self._thread.start()

    @property
    def session_id(self) -> int:
        return self._id

    def _run(self) -> None:
        while (event := self._events.get()) is not None:
            self._delivering.wait()
            event()

    def hold_events(self) -> None:
        """Deliver no watch or session event until :meth:`release_events`, as a client
        whose process is paused: the service goes on without it (its session may expire, its
        nodes change), and it learns what happened only when it resumes. Its operations still
        work meanwhile, as those of a process that woke and wrote before reading its events."""
        self._delivering.clear()

    def release_events(self) -> None:
        """Deliver the events held back, in order, and those that follow."""
        self._delivering.set()

    def _live(self) -> MemoryEnsemble:
        if self._closed:
            raise SessionLostError(f"session {self._id:#x} is closed")
        return self._ensemble

    def create(
        self, path: str, data: bytes = b"", *, ephemeral: bool = False, sequential: bool = False, makepath: bool = False
    ) -> str:
        e = self._live()
        with e._lock:
            if makepath:
                parts = path.strip("/").split("/")[:-1]
                for i in range(1, len(parts) + 1):
                    p = "/" + "/".join(parts[:i])
                    if p not in e._nodes:
                        e._apply(Create(p), self)
            return e._apply(Create(path, data, ephemeral), self, sequential=sequential)

    def get(self, path: str) -> tuple[bytes, Stat]:
        e = self._live()
        with e._lock:
            node = e._node(path)
            return node.data, node.stat()

    def exists(self, path: str) -> Stat | None:
        e = self._live()
        with e._lock:
            _check_path(path)
            node = e._nodes.get(path)
            return None if node is None else node.stat()

    def children(self, path: str) -> list[str]:
        e = self._live()
        with e._lock:
            return sorted(e._node(path).children)

    def set(self, path: str, data: bytes, version: int = ANY_VERSION) -> Stat:
        e = self._live()
        with e._lock:
            e._apply(Set(path, data, version), self)
            return e._nodes[path].stat()

    def delete(self, path: str, version: int = ANY_VERSION) -> None:
        e = self._live()
        with e._lock:
            e._apply(Delete(path, version), self)

    def commit(self, ops: Sequence[Op]) -> None:
        self._live()._commit(ops, self)

    def watch_data(self, path: str, callback: Callable[[bytes | None, Stat | None], None]) -> None:
        e = self._live()
        with e._lock:
            self._data_watches.setdefault(path, []).append(callback)
            self._events.put(self._data_event(path, callback))

    def watch_children(self, path: str, callback: Callable[[list[str]], None]) -> None:
        e = self._live()
        with e._lock:
            self._children_watches.setdefault(path, []).append(callback)
            self._events.put(self._children_event(path, callback))

    def on_session(self, callback: Callable[[SessionState], None]) -> None:
        self._session_callbacks.append(callback)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._ensemble.expire(self._id)
            self._events.put(None)
            self._delivering.set()  # a held session's thread ends too

    # -- events, queued under the ensemble's lock, run on this session's thread -----------

    def _data_event(self, path: str, callback: Callable[[bytes | None, Stat | None], None]) -> Callable[[], None]:
        node = self._ensemble._nodes.get(path)  # read now, as the change left it
        data, stat = (None, None) if node is None else (node.data, node.stat())
        return lambda: callback(data, stat)

    def _children_event(self, path: str, callback: Callable[[list[str]], None]) -> Callable[[], None]:
        node = self._ensemble._nodes.get(path)
        names = [] if node is None else sorted(node.children)
        return lambda: callback(names)

    def _node_changed(self, path: str, children_of: str | None) -> None:
        for cb in self._data_watches.get(path, ()):
            self._events.put(self._data_event(path, cb))
        for watched in (path, children_of):
            if watched is not None:
                for ccb in self._children_watches.get(watched, ()):
                    self._events.put(self._children_event(watched, ccb))

    def _deliver_state(self, state: SessionState) -> None:
        for cb in list(self._session_callbacks):
            self._events.put(lambda cb=cb: cb(state))  # type: ignore[misc]  # bound now, run later
