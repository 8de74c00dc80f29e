"""Dead letters of shared groups on a cluster (docs/shared-groups.md, "On a cluster").

``<queue>.dlq`` is a cluster queue like any other: made through the controller (the first
broker to need it asks; a broker that loses the race takes the one made), and the dead
letters of partition *p* go to its partition ``p % dlq partitions``: appended here when this
broker leads that partition, else sent to its leader with a PRODUCE over
:class:`~headwater.broker.peer.PeerClient`. Either way they are durable before the change
record that marks them dead is written (the order a broker alone keeps too).

Thread-safety: :func:`append_dead_letters` runs under the shared groups' lock, so it never
waits for a dead-letter queue to be made: the broker applies a new cluster queue on a thread
that may need that lock (it adopts partitions' shared state), and a wait there held both
until the wait timed out. A missing dlq is made on a thread of its own instead, and the dead
letters are tried again (``DEAD_LETTER_RETRY_MS``); a nack makes sure of the dlq before it
takes the lock (:func:`ensure_dead_letter_queue`), so its dead letters go at once.
"""

from __future__ import annotations

import logging
import threading
import time
from contextlib import AbstractContextManager
from typing import Protocol

from headwater.broker.peer import PeerClient, PeerError
from headwater.errors import NotLeaderError, QueueExistsError, QueueNotFoundError, UnavailableError
from headwater.model.config import QueueConfig, QueueInfo
from headwater.storage.api import Store

log = logging.getLogger("headwater.shared")

__all__ = ["SharedCluster", "append_dead_letters", "ensure_dead_letter_queue"]

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
    info = _dead_letter_queue_here(store, cluster, dlq, like)
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


_making: set[str] = set()  # the dlqs a thread of their own is making now
_making_lock = threading.Lock()


def _dead_letter_queue_here(store: Store, cluster: SharedCluster, dlq: str, like: QueueConfig) -> QueueInfo:
    """``dlq`` if this broker has it; else start making it (once at a time) and raise a
    retriable error, without waiting (see the module's thread-safety)."""
    try:
        return store.describe_queue(dlq)
    except QueueNotFoundError:
        pass
    with _making_lock:
        start = dlq not in _making
        _making.add(dlq)
    if start:

        def make() -> None:
            try:
                ensure_dead_letter_queue(store, cluster, dlq, like)
            except Exception as e:  # noqa: BLE001 - logged by the retry that follows; this thread must end
                log.info("making dead-letter queue %s: %s; tried again with its dead letters", dlq, e)
            finally:
                with _making_lock:
                    _making.discard(dlq)

        threading.Thread(target=make, name=f"headwater-dlq-{dlq}", daemon=True).start()
    raise UnavailableError(f"dead-letter queue {dlq} is being made on the cluster")


def ensure_dead_letter_queue(store: Store, cluster: SharedCluster, dlq: str, like: QueueConfig) -> QueueInfo:
    """``dlq`` made on the cluster (settings ``like``) if it is not yet, once it has reached
    this broker. It waits: never call it under the shared groups' lock."""
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
