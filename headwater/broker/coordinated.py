"""CoordinatedTables: where a coordinator kind keeps its records (keyed groups, subscribers).

A broker alone keeps them in one table of its own internal queue. In a cluster they live in
the partitions of the kind's coordinator queue (``__cluster_keyed``, ``__cluster_subscribers``:
docs/design/cluster.md, "Coordinators follow partitions"): this broker keeps a table for each
partition it leads, loaded when the cluster node says it came to lead it and dropped when it
stops. A name's table is the one of its coordinator partition (NotCoordinatorError while
that partition is not loaded here), and a write to it runs inside the node's
``producing(queue, partition)``, so a move's fence waits for it and refuses the next: a
broker that stopped coordinating cannot write.

Thread-safety: one lock guards the set of tables; the tables guard themselves.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Generic, Protocol, TypeVar

from headwater.errors import NotCoordinatorError, NotLeaderError

__all__ = ["CoordinatedTables", "CoordinatorPlace"]

P = TypeVar("P")


class CoordinatorPlace(Protocol):
    """What coordinated tables ask of the cluster node."""

    def coordinator_partition(self, group: str, of: str = ...) -> int: ...
    def producing(self, queue: str, partition: int) -> AbstractContextManager[None]: ...


class CoordinatedTables(Generic[P]):
    """The tables of one coordinator kind: ``alone`` while the broker runs alone, and after
    :meth:`join_cluster` one ``make(partition)`` per loaded partition of ``queue``; ``what``
    names a record's owner in messages ("keyed group", "subscriber")."""

    def __init__(self, alone: P, make: Callable[[int], P], queue: str, what: str) -> None:
        self._alone = alone
        self._make = make
        self._queue = queue
        self._what = what
        self._lock = threading.Lock()
        self.place: CoordinatorPlace | None = None  # None: a broker alone
        self._parts: dict[int, P] = {}

    def join_cluster(self, place: CoordinatorPlace) -> None:
        """From now on keep the cluster's coordinator queue, none of its partitions loaded
        until :meth:`load`; the broker's own table stays on disk, unused."""
        with self._lock:
            self.place = place
            self._parts = {}

    def load(self, partition: int) -> None:
        """Read ``partition``'s records back from the local log (again, if loaded)."""
        part = self._make(partition)
        with self._lock:
            if self.place is not None:
                self._parts[partition] = part

    def unload(self, partition: int) -> None:
        """Forget ``partition``'s records: another broker coordinates them now."""
        with self._lock:
            self._parts.pop(partition, None)

    def loaded(self) -> set[int]:
        with self._lock:
            return set(self._parts)

    def all(self) -> list[P]:
        """Every table kept here: the broker's own, or the loaded partitions'."""
        with self._lock:
            return [self._alone] if self.place is None else list(self._parts.values())

    def of(self, name: str, about: str) -> tuple[int, P]:
        """The partition and table of ``name`` (``about``: how messages name it); on a
        cluster NotCoordinatorError unless this broker coordinates it and has it loaded."""
        place = self.place
        if place is None:
            return 0, self._alone
        k = place.coordinator_partition(name, of=self._queue)
        part = self._parts.get(k)
        if part is None:
            raise NotCoordinatorError(
                f"this broker is taking over as coordinator of {self._what} {about} (partition {k} of "
                f"{self._queue} is being loaded): ask again in a moment"
            )
        return k, part

    @contextmanager
    def writing(self, k: int, part: P, about: str) -> Iterator[None]:
        """Around a write to ``part`` (partition ``k``): refused as NotCoordinatorError once
        this broker no longer coordinates it, or while a move fences it."""
        place = self.place
        try:
            with place.producing(self._queue, k) if place is not None else nullcontext():
                if place is not None and self._parts.get(k) is not part:
                    raise NotCoordinatorError(f"this broker stopped coordinating {self._what} {about}: ask again")
                yield
        except NotLeaderError as e:  # the partition moved, or is fenced for its move
            raise NotCoordinatorError(f"this broker does not coordinate {self._what} {about} now: {e}") from None
