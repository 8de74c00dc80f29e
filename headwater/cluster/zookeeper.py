""":class:`~headwater.cluster.coordination.Coordination` on Apache ZooKeeper, through kazoo.

kazoo is an optional dependency (``pip install 'headwater[cluster]'``); a broker started
without ``--zookeeper`` never imports it.
"""

from __future__ import annotations

import queue
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from headwater.cluster.coordination import (
    ANY_VERSION,
    BadVersionError,
    Check,
    CoordinationError,
    CoordinationUnavailableError,
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

__all__ = ["ZooKeeperCoordination"]


def _kazoo() -> Any:
    try:
        import kazoo.client
        import kazoo.exceptions
        import kazoo.protocol.states
    except ImportError as e:
        raise CoordinationUnavailableError("a cluster needs the kazoo package: pip install 'headwater[cluster]'") from e
    return kazoo


class ZooKeeperCoordination:
    """A session with a ZooKeeper ensemble: ``hosts`` as kazoo takes them
    (``"host:port[,host:port...][/chroot]"``). Starting waits up to ``connect_timeout_s``
    for a session, then raises :class:`CoordinationUnavailableError` naming the hosts."""

    def __init__(self, hosts: str, *, session_timeout_s: float = 10.0, connect_timeout_s: float = 10.0) -> None:
        kazoo = _kazoo()
        self._k = kazoo
        self.hosts = hosts
        self._client = kazoo.client.KazooClient(hosts=hosts, timeout=session_timeout_s)
        self._session_callbacks: list[Callable[[SessionState], None]] = []
        # session states reach the callbacks in the order they happened, on one thread of
        # ours (kazoo's spawn would start a thread each, and LOST could overtake CONNECTED)
        self._states: queue.SimpleQueue[SessionState | None] = queue.SimpleQueue()
        self._state_thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._client.add_listener(self._on_state)
        try:
            with warnings.catch_warnings():  # kazoo warns of a missing chroot, which we make below
                warnings.simplefilter("ignore")
                self._client.start(timeout=connect_timeout_s)
            if self._client.chroot and self._client.exists("/") is None:
                self._make_chroot(connect_timeout_s)
        except kazoo.handlers.threading.KazooTimeoutError as e:
            self._client.close()
            raise CoordinationUnavailableError(
                f"no ZooKeeper session with {hosts} within {connect_timeout_s:g} s: is ZooKeeper running "
                f"there, and is the address (--zookeeper) right?"
            ) from e

    def _make_chroot(self, connect_timeout_s: float) -> None:
        """Create the chroot, through a short session without it (a session inside a chroot
        cannot reach the chroot's parents)."""
        servers = ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in self._client.hosts)
        root = self._k.client.KazooClient(hosts=servers)
        root.start(timeout=connect_timeout_s)
        try:
            root.ensure_path(self._client.chroot)
        finally:
            root.stop()
            root.close()

    @property
    def session_id(self) -> int:
        sid = self._client.client_id
        return int(sid[0]) if sid else 0

    def _on_state(self, state: Any) -> None:
        states = self._k.protocol.states.KazooState
        mapped = {
            states.CONNECTED: SessionState.CONNECTED,
            states.SUSPENDED: SessionState.SUSPENDED,
            states.LOST: SessionState.LOST,
        }[state]
        self._states.put(mapped)  # kazoo's listener must not block: hand the state over

    def _deliver_states(self) -> None:
        while (state := self._states.get()) is not None:
            with self._lock:
                callbacks = list(self._session_callbacks)
            for fn in callbacks:
                fn(state)

    @contextmanager
    def _mapped(self, path: str | None) -> Iterator[None]:
        """kazoo's errors as ours, naming the node."""
        ex = self._k.exceptions
        try:
            yield
        except ex.NoNodeError as e:
            raise NoNodeError(f"no node {path}", path) from e
        except ex.NodeExistsError as e:
            raise NodeExistsError(f"node {path} exists", path) from e
        except ex.BadVersionError as e:
            raise BadVersionError(f"node {path} is not at the expected version", path) from e
        except ex.NotEmptyError as e:
            raise NotEmptyError(f"node {path} has children", path) from e
        except (ex.ConnectionLoss, ex.SessionExpiredError, ex.ConnectionClosedError) as e:
            raise SessionLostError(f"the ZooKeeper session with {self.hosts} is not connected ({e!r})", path) from e

    @staticmethod
    def _stat(zstat: Any) -> Stat:
        return Stat(zstat.version, zstat.czxid, zstat.ephemeralOwner, zstat.cversion)

    def create(
        self, path: str, data: bytes = b"", *, ephemeral: bool = False, sequential: bool = False, makepath: bool = False
    ) -> str:
        with self._mapped(path):
            return str(
                self._client.create(path, bytes(data), ephemeral=ephemeral, sequence=sequential, makepath=makepath)
            )

    def get(self, path: str) -> tuple[bytes, Stat]:
        with self._mapped(path):
            data, zstat = self._client.get(path)
        return bytes(data or b""), self._stat(zstat)

    def exists(self, path: str) -> Stat | None:
        with self._mapped(path):
            zstat = self._client.exists(path)
        return None if zstat is None else self._stat(zstat)

    def children(self, path: str) -> list[str]:
        with self._mapped(path):
            return sorted(self._client.get_children(path))

    def set(self, path: str, data: bytes, version: int = ANY_VERSION) -> Stat:
        with self._mapped(path):
            return self._stat(self._client.set(path, bytes(data), version=version))

    def delete(self, path: str, version: int = ANY_VERSION) -> None:
        with self._mapped(path):
            self._client.delete(path, version=version)

    def commit(self, ops: Sequence[Op]) -> None:
        t = self._client.transaction()
        for op in ops:
            if type(op) is Check:
                t.check(op.path, op.version)
            elif type(op) is Create:
                t.create(op.path, bytes(op.data), ephemeral=op.ephemeral)
            elif type(op) is Set:
                t.set_data(op.path, bytes(op.data), version=op.version)
            elif type(op) is Delete:
                t.delete(op.path, version=op.version)
            else:
                raise TypeError(f"not a coordination operation: {op!r}")
        with self._mapped(None):
            results = t.commit()
        rolled_back = self._k.exceptions.RolledBackError
        for i, (op, r) in enumerate(zip(ops, results)):
            if isinstance(r, Exception) and not isinstance(r, rolled_back):
                try:
                    with self._mapped(op.path):
                        raise r
                except CoordinationError as e:
                    raise TransactionFailedError(i, e) from r

    def watch_data(self, path: str, callback: Callable[[bytes | None, Stat | None], None]) -> None:
        def fire(data: bytes | None, zstat: Any) -> None:
            callback(None if zstat is None else bytes(data or b""), None if zstat is None else self._stat(zstat))

        self._client.DataWatch(path, fire)

    def watch_children(self, path: str, callback: Callable[[list[str]], None]) -> None:
        _ChildrenFollower(self, path, callback)

    def on_session(self, callback: Callable[[SessionState], None]) -> None:
        with self._lock:
            self._session_callbacks.append(callback)
            if self._state_thread is None:
                self._state_thread = threading.Thread(
                    target=self._deliver_states, name="headwater-zookeeper-session", daemon=True
                )
                self._state_thread.start()

    def close(self) -> None:
        self._client.stop()
        self._client.close()
        self._states.put(None)


class _ChildrenFollower:
    """kazoo's ChildrenWatch needs the node, and stops without a word when it is deleted. A
    data watch on the node follows its lives (each with its creation zxid) and gives each
    life a children watch of its own; while there is no node the callback hears ``[]``."""

    def __init__(self, coord: ZooKeeperCoordination, path: str, callback: Callable[[list[str]], None]) -> None:
        self._coord, self._path, self._callback = coord, path, callback
        self._lock = threading.Lock()
        self._life: int | None = None  # the creation zxid of the node a children watch follows
        self._told_absent = False
        coord._client.DataWatch(path, self._on_node)

    def _on_node(self, data: bytes | None, zstat: Any) -> None:
        with self._lock:
            if zstat is None:
                self._life = None
                if not self._told_absent:
                    self._told_absent = True
                    self._callback([])
                return
            if self._life == zstat.czxid:
                return  # its data changed, not its life
            self._life, self._told_absent = zstat.czxid, False
            try:
                self._coord._client.ChildrenWatch(self._path, self._on_children)
            except self._coord._k.exceptions.NoNodeError:
                self._life = None  # gone again already: the data watch sees what comes next

    def _on_children(self, names: list[str]) -> None:
        self._callback(sorted(names))
