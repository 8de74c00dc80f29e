"""Where things are: the brokers of a cluster and the broker that leads each partition.

What a METADATA request answers (``docs/protocol.md``), ``admin.cluster_metadata()`` returns
and ``headwater queue locations`` shows. A broker running alone is a cluster of one: it
answers naming itself (broker id ``-1``, no cluster id) for every partition, so a client has
one way to find where to send, whichever it talks to. Pure values; no I/O.

>>> me = BrokerAddress(broker_id=-1, host="127.0.0.1", port=7070, epoch=0)
>>> md = ClusterMetadata(cluster_id="", controller=-1, brokers=[me], queues=[
...     QueueLocations(name="orders", queue_id=5, partitions=[
...         PartitionLocation(partition=0, leader=-1, leader_epoch=0, replicas=[-1])])])
>>> md.broker(md.queue("orders").partitions[0].leader).address
'127.0.0.1:7070'
"""

from __future__ import annotations

import zlib

import msgspec

from headwater.errors import QueueNotFoundError

__all__ = [
    "ALONE",
    "CLUSTER_INTERNAL_QUEUES",
    "COORDINATOR_PARTITIONS",
    "COORDINATOR_QUEUE",
    "KEYED_COORDINATOR_QUEUE",
    "SUBSCRIBER_COORDINATOR_QUEUE",
    "BrokerAddress",
    "ClusterMetadata",
    "MoveOutcome",
    "PartitionLocation",
    "PartitionMove",
    "QueueLocations",
    "coordinator_partition",
    "keyed_coordinator_name",
]

ALONE = -1  # the broker id of a broker that is in no cluster

#: The cluster's internal queue of consumer groups' committed offsets: the leader of its
#: partition ``coordinator_partition(group, n)`` coordinates the group (a broker alone
#: keeps its own ``__offsets`` instead). Internal: users neither name nor see it.
COORDINATOR_QUEUE = "__cluster_offsets"
#: Its partition count when the controller creates it (fixed for the cluster's life:
#: changing it would move every group's coordinator).
COORDINATOR_PARTITIONS = 16

#: The cluster's internal queue of keyed groups' state (a broker alone keeps its own
#: ``__keyed``): the leader of its partition ``coordinator_partition(
#: keyed_coordinator_name(queue, group), n)`` coordinates keyed group (queue, group). Made,
#: placed and moved as :data:`COORDINATOR_QUEUE` is, with the same partition count setting.
KEYED_COORDINATOR_QUEUE = "__cluster_keyed"

#: The cluster's internal queue of push subscribers and their checkpoints (a broker alone
#: keeps its own ``__subscribers``): the leader of its partition ``coordinator_partition(
#: keyed_coordinator_name(queue, name), n)`` coordinates subscriber (queue, name). Made,
#: placed and moved as :data:`COORDINATOR_QUEUE` is, with the same partition count setting.
SUBSCRIBER_COORDINATOR_QUEUE = "__cluster_subscribers"

#: The internal queues of the cluster (not of one broker): placed, led and moved like a
#: user's queue, their partitions copied between brokers.
CLUSTER_INTERNAL_QUEUES = frozenset({COORDINATOR_QUEUE, KEYED_COORDINATOR_QUEUE, SUBSCRIBER_COORDINATOR_QUEUE})


def keyed_coordinator_name(queue: str, group: str) -> str:
    """The name a keyed group (or a subscriber) is placed by: a keyed group belongs to one
    queue, and two queues' groups of one name are two groups, coordinated apart.

    >>> keyed_coordinator_name("orders", "billing")
    'orders/billing'
    """
    return f"{queue}/{group}"


def coordinator_partition(group: str, partitions: int) -> int:
    """The coordinator queue's partition whose leader coordinates ``group``: its name's
    CRC-32 modulo the partition count, the same in every process (unlike ``hash``).

    >>> coordinator_partition("billing", 50)
    26
    """
    if partitions < 1:
        raise ValueError(f"the coordinator queue needs at least 1 partition, not {partitions}")
    return zlib.crc32(group.encode("utf-8")) % partitions


class BrokerAddress(msgspec.Struct, frozen=True, kw_only=True):
    """A broker: its id, the address clients reach it by, and its broker epoch (the
    creation id of its registration in ZooKeeper; 0 for a broker running alone)."""

    broker_id: int
    host: str
    port: int
    epoch: int

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


class PartitionLocation(msgspec.Struct, frozen=True, kw_only=True):
    """A partition's leader (the broker that takes its produces and serves its reads; -1
    when it has none now), the leader epoch (one more at every change of leader), and the
    brokers holding a copy, the leader first."""

    partition: int
    leader: int
    leader_epoch: int
    replicas: list[int]


class QueueLocations(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    queue_id: int
    partitions: list[PartitionLocation]


class PartitionMove(msgspec.Struct, frozen=True, kw_only=True):
    """A partition on its way from broker ``source`` to broker ``target``. ``phase`` is
    ``planned`` in a plan's answer; in the metadata, ``queued`` (waiting for a free slot),
    ``copy`` (the target copies) or ``fence`` (the source refuses sends until the switch)."""

    queue: str
    partition: int
    source: int
    target: int
    phase: str = "planned"


class MoveOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """How a partition move ended: ``moved`` (its target leads the partition now) or
    ``rolled back`` (the partition stays on its source), ``why`` (a rollback's reason, as
    the controller judged it: the target's own words when it could not take the partition),
    and when (``ended_ms``, epoch ms on the controller's clock)."""

    queue: str
    partition: int
    source: int
    target: int
    outcome: str
    why: str = ""
    ended_ms: int = 0


class ClusterMetadata(msgspec.Struct, frozen=True, kw_only=True):
    """The brokers, the controller (-1: none now, or a broker alone), the locations of the
    queues asked for, the partition moves not finished yet (of every queue), and the
    leader of each partition of the coordinator queue (``coordinators``: a broker alone
    answers ``[ALONE]``; empty from a broker that predates it), and of the keyed
    coordinator queue (``keyed_coordinators``: likewise; empty also before the cluster's
    first keyed call made it), and of the subscriber coordinator queue
    (``subscriber_coordinators``: likewise, made by the first subscriber call)."""

    cluster_id: str
    controller: int
    brokers: list[BrokerAddress]
    queues: list[QueueLocations]
    moves: list[PartitionMove] = msgspec.field(default_factory=list)
    coordinators: list[int] = msgspec.field(default_factory=list)
    keyed_coordinators: list[int] = msgspec.field(default_factory=list)
    subscriber_coordinators: list[int] = msgspec.field(default_factory=list)
    # the latest moves that ended, oldest first (the controller keeps a few dozen): how each
    # ended, and why a rolled back one did; empty from a broker alone or one that predates it
    ended_moves: list[MoveOutcome] = msgspec.field(default_factory=list)

    def coordinator(self, group: str) -> int | None:
        """The broker id of ``group``'s coordinator (it may have none now: not in
        :attr:`brokers`), or None when the answer names no coordinators (an older broker:
        any broker coordinates every group it is asked about)."""
        if not self.coordinators:
            return None
        return self.coordinators[coordinator_partition(group, len(self.coordinators))]

    def keyed_coordinator(self, queue: str, group: str) -> int | None:
        """The broker id of keyed group (``queue``, ``group``)'s coordinator, or None when
        the answer names none (an older broker, or no keyed call made the queue yet: send
        to the bootstrap broker, which makes it)."""
        if not self.keyed_coordinators:
            return None
        k = coordinator_partition(keyed_coordinator_name(queue, group), len(self.keyed_coordinators))
        return self.keyed_coordinators[k]

    def subscriber_coordinator(self, queue: str, name: str) -> int | None:
        """The broker id of subscriber (``queue``, ``name``)'s coordinator, or None when the
        answer names none (as :meth:`keyed_coordinator`)."""
        if not self.subscriber_coordinators:
            return None
        k = coordinator_partition(keyed_coordinator_name(queue, name), len(self.subscriber_coordinators))
        return self.subscriber_coordinators[k]

    def broker(self, broker_id: int) -> BrokerAddress | None:
        return next((b for b in self.brokers if b.broker_id == broker_id), None)

    def queue(self, name: str) -> QueueLocations:
        found = next((q for q in self.queues if q.name == name), None)
        if found is None:
            raise QueueNotFoundError(f"queue {name!r} does not exist")
        return found
