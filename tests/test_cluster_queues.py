"""Queues on a cluster (docs/design/cluster.md, steps 3-4): three real brokers and a real
ZooKeeper. A queue created on any broker is placed over the live brokers by the controller,
made on every broker under the cluster's queue id, and served by each partition's leader
alone; the controller SIGKILLed, another takes over; a broker that was down makes what
the cluster created meanwhile."""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from collections.abc import Iterator

import pytest

from headwater.errors import NotLeaderError, QueueExistsError, QueueNotFoundError
from headwater.model.batch import encode_batch
from tests.support.broker_process import HEADWATER
from tests.support.cluster import Cluster, eventually


@pytest.fixture
def cluster(zk_server, tmp_path) -> Iterator[Cluster]:
    c = Cluster(zk_server, tmp_path, 3)
    try:
        yield c
    finally:
        c.stop()


def _leaders(cluster: Cluster, queue: str, via: int = 1) -> dict[int, int]:
    with cluster.connect(via) as hw:
        return {p.partition: p.leader for p in hw.admin.cluster_metadata([queue]).queue(queue).partitions}


def _local_id(cluster: Cluster, broker_id: int, queue: str) -> int | None:
    with cluster.connect(broker_id) as hw:
        try:
            return hw.admin.describe_queue(queue).queue_id
        except QueueNotFoundError:
            return None


def test_a_queue_made_on_any_broker_is_placed_over_all_and_led_by_one_each(cluster):
    cluster.controller()
    with cluster.connect(2) as hw:
        info = hw.admin.create_queue("orders", partitions=6)
    assert info.queue_id >= 1000 and len(info.partitions) == 6
    leaders = _leaders(cluster, "orders")
    assert Counter(leaders.values()) == {1: 2, 2: 2, 3: 2}
    for i in (1, 2, 3):  # every broker answers the same (once its view has the queue), under the cluster's id
        eventually(lambda i=i: _local_id(cluster, i, "orders") == info.queue_id, what=f"orders on broker {i}")
        assert _leaders(cluster, "orders", via=i) == leaders
    shown = subprocess.run(
        [HEADWATER, "--server", cluster.address(1), "cluster", "status", "--json"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    doc = json.loads(shown)
    assert doc["controller"] in (1, 2, 3) and doc["partitions"] == 6 and doc["leaderless"] == 0
    assert [(b["broker_id"], b["address"], b["leads"]) for b in doc["brokers"]] == [
        (i, cluster.address(i), 2) for i in (1, 2, 3)
    ]
    table = subprocess.run(
        [HEADWATER, "--server", cluster.address(2), "cluster", "status"], capture_output=True, text=True, timeout=30
    ).stdout
    assert f"cluster {doc['cluster_id']}: 3 broker(s), controller broker {doc['controller']}" in table
    with cluster.connect(3) as hw:
        md = hw.admin.cluster_metadata()
        assert [b.broker_id for b in md.brokers] == [1, 2, 3] and md.cluster_id == cluster.status(1)["cluster_id"]
        assert {b.broker_id: b.address for b in md.brokers} == {i: cluster.address(i) for i in (1, 2, 3)}
        with pytest.raises(QueueExistsError, match="'orders' already exists"):
            hw.admin.create_queue("orders", partitions=2)

    for partition, leader in leaders.items():
        with cluster.connect(leader) as hw:
            mid = hw.send("orders", f"to {partition}".encode(), partition=partition)
            assert (mid.queue_id, mid.partition) == (info.queue_id, partition)
            assert [r.body for r in hw.scanner("orders", partitions=[partition])] == [f"to {partition}".encode()]
        other = next(i for i in (1, 2, 3) if i != leader)
        with cluster.connect(other) as hw:
            with pytest.raises(NotLeaderError, match=f"broker {leader} at {cluster.address(leader)} does"):
                hw.service.produce("orders", partition, _one_batch())
            with pytest.raises(NotLeaderError):
                hw.service.fetch("orders", partition, 0, max_bytes=1024)


def _one_batch() -> bytes:
    return bytes(encode_batch([b"x"]))


def test_a_queue_grows_and_is_deleted_on_every_broker(cluster):
    cluster.controller()
    with cluster.connect(1) as hw:
        hw.admin.create_queue("grow", partitions=3)
        grown = hw.admin.add_partitions("grow", 6)
    assert len(grown.partitions) == 6
    assert Counter(_leaders(cluster, "grow").values()) == {1: 2, 2: 2, 3: 2}
    for i in (1, 2, 3):
        eventually(lambda i=i: _partitions_here(cluster, i, "grow") == 6, what=f"6 partitions on broker {i}")
    with cluster.connect(3) as hw:
        hw.admin.delete_queue("grow")
        with pytest.raises(QueueNotFoundError):
            hw.admin.delete_queue("grow")
    for i in (1, 2, 3):
        eventually(lambda i=i: _local_id(cluster, i, "grow") is None, what=f"grow gone from broker {i}")


def _partitions_here(cluster: Cluster, broker_id: int, queue: str) -> int:
    with cluster.connect(broker_id) as hw:
        return len(hw.admin.describe_queue(queue).partitions)


def test_a_queue_made_while_a_broker_is_down_is_made_there_when_it_returns(cluster):
    cluster.controller()
    cluster.brokers[3].terminate()
    eventually(lambda: cluster.status(1)["brokers"] == [1, 2], what="broker 3 leaving")
    with cluster.connect(1) as hw:
        info = hw.admin.create_queue("late", partitions=4)
    assert set(_leaders(cluster, "late").values()) == {1, 2}  # only live brokers lead
    cluster.start(3)
    eventually(lambda: _local_id(cluster, 3, "late") == info.queue_id, what="late made on the returning broker")


def test_the_controller_killed_another_takes_over_and_changes_go_on(cluster):
    first = cluster.controller()
    epoch = cluster.status(first)["controller_epoch"]
    cluster.brokers[first].kill()
    survivor = next(i for i in (1, 2, 3) if i != first)
    new = eventually(
        lambda: (c := cluster.status(survivor)["controller"]) not in (-1, first) and c, what="a new controller"
    )
    assert cluster.status(new)["controller_epoch"] > epoch
    with cluster.connect(survivor) as hw:
        hw.admin.create_queue("after", partitions=2)
    assert first not in _leaders(cluster, "after", via=survivor).values()
