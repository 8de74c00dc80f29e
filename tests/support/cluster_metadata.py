"""Cluster metadata built by hand, for the unit tests of the client's routing (no brokers)."""

from __future__ import annotations

from headwater.model.cluster import BrokerAddress, ClusterMetadata, PartitionLocation, QueueLocations


def cluster_metadata(
    leaders: dict[str, list[int]],
    brokers: tuple[int, ...] = (1, 2, 3),
    coordinators: list[int] | tuple[int, ...] = (),
    *,
    host: str = "127.0.0.1",
    port_base: int = 7070,
) -> ClusterMetadata:
    """A cluster of ``brokers`` (broker ``b`` at ``host:port_base + b``) whose queues are
    ``leaders`` (queue -> each partition's leader, in order; ids 1000, 1001, ...) and whose
    coordinator queue's partitions are led by ``coordinators``."""
    return ClusterMetadata(
        cluster_id="c1",
        controller=1,
        brokers=[BrokerAddress(broker_id=b, host=host, port=port_base + b, epoch=b) for b in brokers],
        coordinators=list(coordinators),
        queues=[
            QueueLocations(
                name=name,
                queue_id=1000 + i,
                partitions=[
                    PartitionLocation(partition=p, leader=b, leader_epoch=0, replicas=[b]) for p, b in enumerate(ls)
                ],
            )
            for i, (name, ls) in enumerate(leaders.items())
        ],
    )
