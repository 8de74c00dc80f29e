"""Subscriber calls on a cluster, without I/O (docs/design/cluster.md, "Subscriptions
(built)"): a subscriber's add, delete, describe and checkpoint go to its coordinator
(:meth:`~headwater.client.core.routing.RoutingTable.subscriber_coordinator`), sent again
after a NotCoordinatorError as :class:`~headwater.client.core.routing.RoutedCall` says;
LIST_SUBSCRIBERS goes to every broker and the answers are merged here; a subscriber process
opens one push stream per broker that leads some of its partitions, planned here
(:func:`plan_streams`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from headwater.client.core.routing import RoutingTable
from headwater.model.subscription import SubscriberInfo, subscribed_partitions

__all__ = ["StreamPlan", "merge_subscribers", "plan_partitions", "plan_streams"]

#: ``({broker id: [partitions it is to stream]}, [partitions no live broker leads now])``
StreamPlan = tuple[dict[int, list[int]], list[int]]


def plan_streams(table: RoutingTable, info: SubscriberInfo) -> StreamPlan:
    """Which broker is to push which of the subscriber's partitions (each by its leader,
    so each partition by exactly one stream), and the partitions no live broker leads now
    (moving, or their broker is down: planned again later). A queue the table does not know
    has no partitions to plan.

    >>> from headwater.model.cluster import BrokerAddress, ClusterMetadata, PartitionLocation, QueueLocations
    >>> parts = [PartitionLocation(partition=p, leader=b, leader_epoch=0, replicas=[b])
    ...          for p, b in enumerate([1, 2, 1, 9])]
    >>> md = ClusterMetadata(cluster_id="c", controller=1,
    ...     queues=[QueueLocations(name="q", queue_id=1, partitions=parts)],
    ...     brokers=[BrokerAddress(broker_id=i, host="h", port=i, epoch=0) for i in (1, 2)])
    >>> plan_streams(RoutingTable(md), SubscriberInfo(queue="q", name="s"))
    ({1: [0, 2], 2: [1]}, [3])
    """
    count = table.partition_count(info.queue)
    if count is None:
        return {}, []
    return plan_partitions(table, info.queue, subscribed_partitions(info, count))


def plan_partitions(table: RoutingTable, queue: str, partitions: Iterable[int]) -> StreamPlan:
    """Which broker is to stream which of ``partitions`` of ``queue``: each by its leader,
    in order, and those no live broker leads now (a consumer's fetch streams and a
    subscriber's push streams alike). A queue the table does not know has no leaders.

    >>> from headwater.model.cluster import BrokerAddress, ClusterMetadata, PartitionLocation, QueueLocations
    >>> parts = [PartitionLocation(partition=p, leader=b, leader_epoch=0, replicas=[b])
    ...          for p, b in enumerate([1, 2, 1, 9])]
    >>> md = ClusterMetadata(cluster_id="c", controller=1,
    ...     queues=[QueueLocations(name="q", queue_id=1, partitions=parts)],
    ...     brokers=[BrokerAddress(broker_id=i, host="h", port=i, epoch=0) for i in (1, 2)])
    >>> plan_partitions(RoutingTable(md), "q", [3, 2, 1])
    ({2: [1], 1: [2]}, [3])
    """
    leaders = table.partition_leaders(queue)
    plan: dict[int, list[int]] = {}
    leaderless: list[int] = []
    for p in sorted(partitions):
        broker = leaders.get(p)
        if broker is None:
            leaderless.append(p)
        else:
            plan.setdefault(broker, []).append(p)
    return plan, leaderless


def merge_subscribers(
    answers: Mapping[int, list[SubscriberInfo]], coordinator_of: Callable[[str, str], int | None]
) -> list[SubscriberInfo]:
    """Every broker's LIST_SUBSCRIBERS answer (broker id -> its subscribers) as one: each
    subscriber once, by queue and name, taken from its coordinator's answer
    (``coordinator_of(queue, name)``) when it has one, since a broker that just gave it up
    may still list it with an older checkpoint; else from the lowest broker id listing it.

    >>> old = SubscriberInfo(queue="q", name="s", partitions=None, tags=[], created_ms=0, checkpoints={0: 1})
    >>> new = SubscriberInfo(queue="q", name="s", partitions=None, tags=[], created_ms=0, checkpoints={0: 9})
    >>> [s.checkpoints for s in merge_subscribers({1: [old], 2: [new]}, lambda q, n: 2)]
    [{0: 9}]
    """
    chosen: dict[tuple[str, str], tuple[bool, int, SubscriberInfo]] = {}
    for broker_id, infos in sorted(answers.items()):
        for info in infos:
            key = (info.queue, info.name)
            ours = coordinator_of(info.queue, info.name) == broker_id
            held = chosen.get(key)
            if held is None or (ours and not held[0]):
                chosen[key] = (ours, broker_id, info)
    return [info for _, _, info in sorted(chosen.values(), key=lambda c: (c[2].queue, c[2].name))]
