"""The few ZooKeeper operations the cluster is built on, behind one small interface.

Every cluster decision is a conditional write (``docs/design/cluster.md``): a create that
fails when the node exists, a set or delete that fails unless the node is at the version its
writer read, and a transaction (``commit``) of such operations that applies all or nothing.
Members announce themselves with ephemeral nodes, which go when their session goes; brokers
follow the cluster with watches. :class:`Coordination` names exactly that; ZooKeeper (through
kazoo, :class:`~headwater.cluster.zookeeper.ZooKeeperCoordination`) and an in-memory ensemble
for tests (:mod:`headwater.testing.coordination`) implement it, and one contract suite runs
on both (``tests/test_coordination_contract.py``).

Watches are persistent, as kazoo's DataWatch and ChildrenWatch: the callback runs once at
once with the current value, then after every change, on a thread of the implementation's,
in order. A callback must not block; it may read the tree again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from enum import Enum
from typing import NamedTuple, Protocol

from headwater.errors import UnavailableError

__all__ = [
    "ANY_VERSION",
    "BadVersionError",
    "Check",
    "Coordination",
    "CoordinationError",
    "CoordinationUnavailableError",
    "Create",
    "Delete",
    "NodeExistsError",
    "NoNodeError",
    "NotEmptyError",
    "Op",
    "SessionLostError",
    "SessionState",
    "Set",
    "Stat",
    "TransactionFailedError",
]

ANY_VERSION = -1  # a set or delete that does not check the version


class CoordinationError(Exception):
    """A coordination operation failed; ``path`` names the node when there is one. These are
    the cluster's own workings, handled inside the broker; what reaches a user is a
    :class:`~headwater.errors.ClusterError` or :class:`CoordinationUnavailableError`."""

    def __init__(self, message: str, path: str | None = None) -> None:
        super().__init__(message)
        self.path = path


class NoNodeError(CoordinationError):
    """The node (or, for a create, its parent) does not exist."""


class NodeExistsError(CoordinationError):
    """A create found the node there already."""


class BadVersionError(CoordinationError):
    """The node is not at the version the write expected: someone else wrote it since."""


class NotEmptyError(CoordinationError):
    """A delete of a node that has children."""


class SessionLostError(CoordinationError):
    """The session is gone or not connected now: nothing may be assumed about what holds."""


class CoordinationUnavailableError(CoordinationError, UnavailableError):
    """The coordination service could not be reached (at start, within its timeout)."""

    code = 81


class TransactionFailedError(CoordinationError):
    """A :meth:`Coordination.commit` applied nothing: operation ``index`` failed with ``cause``."""

    def __init__(self, index: int, cause: CoordinationError) -> None:
        super().__init__(f"transaction operation {index} failed: {cause}", cause.path)
        self.index = index
        self.cause = cause


class Stat(NamedTuple):
    """What a node's metadata tells: ``version`` counts its data's changes; ``created_zxid``
    orders every creation in the ensemble (a broker's epoch is its registration's);
    ``ephemeral_owner`` is the session that holds an ephemeral node (0 otherwise);
    ``children_version`` counts changes to its children."""

    version: int
    created_zxid: int
    ephemeral_owner: int
    children_version: int


class Check(NamedTuple):
    """In a transaction: fail unless ``path`` is at ``version``."""

    path: str
    version: int


class Create(NamedTuple):
    path: str
    data: bytes = b""
    ephemeral: bool = False


class Set(NamedTuple):
    path: str
    data: bytes
    version: int = ANY_VERSION


class Delete(NamedTuple):
    path: str
    version: int = ANY_VERSION


Op = Check | Create | Set | Delete


class SessionState(Enum):
    CONNECTED = "connected"  # the session lives and the connection is up
    SUSPENDED = "suspended"  # the connection dropped; the session may still live
    LOST = "lost"  # the session expired: its ephemeral nodes are gone


class Coordination(Protocol):
    """One session with the coordination service."""

    @property
    def session_id(self) -> int: ...

    def create(
        self, path: str, data: bytes = b"", *, ephemeral: bool = False, sequential: bool = False, makepath: bool = False
    ) -> str:
        """Create ``path`` and return it (with the sequence number a sequential node gets);
        ``makepath`` creates missing parents (persistent, empty)."""
        ...

    def get(self, path: str) -> tuple[bytes, Stat]: ...

    def exists(self, path: str) -> Stat | None: ...

    def children(self, path: str) -> list[str]:
        """The names of ``path``'s children, sorted."""
        ...

    def set(self, path: str, data: bytes, version: int = ANY_VERSION) -> Stat: ...

    def delete(self, path: str, version: int = ANY_VERSION) -> None: ...

    def commit(self, ops: Sequence[Op]) -> None:
        """Apply every operation or none (:class:`TransactionFailedError` names the first
        that failed)."""
        ...

    def watch_data(self, path: str, callback: Callable[[bytes | None, Stat | None], None]) -> None:
        """Call ``callback(data, stat)`` now and after every change of ``path``; ``(None,
        None)`` while it does not exist."""
        ...

    def watch_children(self, path: str, callback: Callable[[list[str]], None]) -> None:
        """Call ``callback(sorted names)`` now and after every change of ``path``'s children
        (``[]`` while it does not exist)."""
        ...

    def on_session(self, callback: Callable[[SessionState], None]) -> None:
        """Call ``callback(state)`` at every change of the session's state."""
        ...

    def close(self) -> None:
        """End the session: its ephemeral nodes go at once."""
        ...
