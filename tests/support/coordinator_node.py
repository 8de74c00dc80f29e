"""A cluster node as a broker's offsets and group coordinator see it, without a cluster: which
coordinator partitions and user partitions it leads, and which are fenced for a move."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from headwater.errors import NotCoordinatorError, NotLeaderError
from headwater.model.cluster import COORDINATOR_QUEUE, coordinator_partition

PARTITIONS = 4


class FakeNode:
    """A cluster node as the offsets see it: which coordinator partitions and which user
    partitions this broker leads, and which are fenced for a move."""

    def __init__(self) -> None:
        self.leading: set[int] = set()  # coordinator partitions
        self.leads_user: set[tuple[str, int]] = set()
        self.fenced: set[int] = set()

    def coordinator_partition(self, group: str) -> int:
        k = coordinator_partition(group, PARTITIONS)
        if k not in self.leading:
            raise NotCoordinatorError(f"not the coordinator of {group!r}")
        return k

    def leads(self, queue: str, partition: int) -> bool:
        return (queue, partition) in self.leads_user

    @contextmanager
    def producing(self, queue: str, partition: int) -> Iterator[None]:
        assert queue == COORDINATOR_QUEUE
        if partition in self.fenced or partition not in self.leading:
            raise NotLeaderError(f"{queue}[{partition}] is moving")
        yield


def group_of(partition: int, avoid: tuple[str, ...] = ()) -> str:
    """A group name whose coordinator partition is ``partition`` (none of ``avoid``)."""
    return next(
        g for i in range(1000) if coordinator_partition(g := f"g{i}", PARTITIONS) == partition and g not in avoid
    )
