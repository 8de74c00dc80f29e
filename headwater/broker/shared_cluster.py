"""Dead letters of shared groups on a cluster (docs/shared-groups.md, "On a cluster").

``<queue>.dlq`` is a cluster queue like any other: made through the controller (the first
broker to need it asks; a broker that loses the race takes the one made), and the dead
letters of partition *p* go to its partition ``p % dlq partitions``: appended here when this
broker leads that partition, else sent to its leader with a PRODUCE over
:class:`~headwater.broker.peer.PeerClient`. Either way they are durable before the change
record that marks them dead is written (the order a broker alone keeps too).

Thread-safety: the callers' (the shared groups' lock).
"""

from __future__ import annotations

import time
from contextlib import AbstractContextManager
from typing import Protocol

from headwater.broker.peer import PeerClient, PeerError
from headwater.errors import NotLeaderError, QueueExistsError, QueueNotFoundError, UnavailableError
from headwater.model.config import QueueConfig, QueueInfo
from headwater.storage.api import Store

__all__ = ["SharedCluster", "append_dead_letters"]

DLQ_APPEAR_S = 30.0  # how long a dlq made by another broker may take to reach this one
PEER_TIMEOUT_S = 10.0  # connect and answer, for one remote dead-letter batch


class SharedCluster(Protocol):
    """What shared groups ask of the broker's part in a cluster (``ClusterNode``)."""

    def leads(self, queue: str, partition: int) -> bool: ...
    def check_leader(self, queue: str, partition: int) -> None: ...
    def leader_address(self, queue: str, partition: int) -> str | None: ...
    def create_queue(self, name: str, config: QueueConfig) -> QueueInfo: ...
    def producing(self, queue: str, partition: int) -> AbstractContextManager[None]: ...


def append_dead_letters(
    store: Store, cluster: SharedCluster, dlq: str, like: QueueConfig, partition: int, batch: bytes
) -> None:
    """Write the dead letters of ``partition`` (one batch) to ``dlq`` on the cluster,
    creating it (settings ``like``) if needed. Raises a retriable error when the dlq
    partition's leader cannot take them now (the caller tries again later)."""
    info = _dead_letter_queue(store, cluster, dlq, like)
    target = partition % len(info.partitions)
    if cluster.leads(dlq, target):
        with cluster.producing(dlq, target):
            store.append_nowait(dlq, target, batch)  # durable with the change record that follows
        return
    address = cluster.leader_address(dlq, target)
    if address is None:
        raise NotLeaderError(f"{dlq}[{target}] has no live leader now (moving, or its broker is down)")
    try:
        with PeerClient(
            address, name="headwater-dead-letters", connect_timeout_s=PEER_TIMEOUT_S, request_timeout_s=PEER_TIMEOUT_S
        ) as peer:
            peer.produce(dlq, target, batch)
    except PeerError as e:
        raise UnavailableError(f"the leader of {dlq}[{target}] at {address} did not take the dead letters: {e}") from e


def _dead_letter_queue(store: Store, cluster: SharedCluster, dlq: str, like: QueueConfig) -> QueueInfo:
    try:
        return store.describe_queue(dlq)
    except QueueNotFoundError:
        pass
    try:
        return cluster.create_queue(dlq, like)  # through the controller; waits until it is here
    except QueueExistsError:
        pass  # another broker made it first: one queue, made once
    deadline = time.monotonic() + DLQ_APPEAR_S
    while True:
        try:
            return store.describe_queue(dlq)
        except QueueNotFoundError:
            if time.monotonic() >= deadline:
                raise UnavailableError(
                    f"dead-letter queue {dlq} exists on the cluster but has not reached this broker yet"
                ) from None
            time.sleep(0.05)
