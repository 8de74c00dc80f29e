"""Consumer groups on a cluster (docs/design/cluster.md, "Coordinators follow partitions"):
three real brokers and a real ZooKeeper. Each group has one coordinator, the leader of its
partition of the internal coordinator queue; clients send its calls there from any
bootstrap broker, other brokers refuse them with NotCoordinatorError naming it, and when
that partition moves its offsets and its members move with it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import threading
import time
from collections import Counter

import pytest

import headwater
import headwater.aio
from headwater.errors import GroupError, InvalidArgumentError, NotCoordinatorError
from headwater.model.cluster import COORDINATOR_QUEUE
from tests.support.broker_process import HEADWATER
from tests.support.cluster import Cluster, eventually

QUEUE, GROUP, PARTITIONS = "events", "eaters", 6


def _bootstrap(cluster: Cluster, *ids: int) -> str:
    return ",".join(cluster.address(i) for i in ids or sorted(cluster.brokers))


def _ends(hw: headwater.Client, queue: str) -> dict[int, int]:
    return {p.partition: p.end_offset for p in hw.admin.describe_queue(queue).partitions}


class Members:
    """Group members on threads of their own (one sync, one asyncio), each committing after
    every poll that returned something; what each read, as (partition, offset, body)."""

    def __init__(self, bootstrap: str, group: str, queue: str) -> None:
        self.bootstrap, self.group, self.queue = bootstrap, group, queue
        self.read: list[tuple[int, int, bytes]] = []
        self.held: dict[str, int] = {}  # member -> partitions it holds
        self.errors: list[BaseException] = []
        self.refused_commits = 0  # commits refused as the member was no longer known
        self.stop = threading.Event()
        self.threads = [
            threading.Thread(target=self._sync_member, daemon=True),
            threading.Thread(target=lambda: asyncio.run(self._async_member()), daemon=True),
        ]

    def start(self, members: int = 2) -> Members:
        for t in self.threads[:members]:
            t.start()
        return self

    def join(self) -> None:
        self.stop.set()
        for t in self.threads:
            if t.is_alive() or t.ident is not None:
                t.join(60)
        assert not self.errors, self.errors

    def _took(self, name: str, records: list[headwater.Record], held: int) -> bool:
        self.read.extend((r.partition, r.offset, r.body) for r in records)
        self.held[name] = held
        return bool(records)

    def _sync_member(self) -> None:
        try:
            with headwater.connect(self.bootstrap) as hw:
                c = hw.consumer(group=self.group, subscribe=self.queue, heartbeat_interval_ms=300)
                while not self.stop.is_set():
                    if self._took("sync", c.poll(timeout_ms=200), len(c.assignment())):
                        try:
                            c.commit()
                        except GroupError:  # no longer a member (a coordinator moved): poll joins again
                            self.refused_commits += 1
                c.close()
        except BaseException as e:  # noqa: BLE001 - the test reports it
            self.errors.append(e)

    async def _async_member(self) -> None:
        try:
            hw = await headwater.aio.connect(self.bootstrap)
            try:
                c = hw.consumer(group=self.group, subscribe=self.queue, heartbeat_interval_ms=300)
                while not self.stop.is_set():
                    if self._took("async", await c.poll(timeout_ms=200), len(c.assignment())):
                        try:
                            await c.commit()
                        except GroupError:
                            self.refused_commits += 1
                await c.close()
            finally:
                await hw.close()
        except BaseException as e:  # noqa: BLE001 - the test reports it
            self.errors.append(e)


def test_two_members_read_everything_once_committing_at_each_broker(cluster):
    bootstrap = _bootstrap(cluster)
    with headwater.connect(bootstrap) as hw:
        hw.admin.create_queue(QUEUE, partitions=PARTITIONS)
        leaders = {p.partition: p.leader for p in hw.admin.cluster_metadata([QUEUE]).queue(QUEUE).partitions}
        assert set(leaders.values()) == {1, 2, 3}  # so commits go for partitions of every broker
        members = Members(bootstrap, GROUP, QUEUE).start()
        try:
            eventually(
                lambda: (
                    sum(members.held.values()) == PARTITIONS and all(members.held.values()) and len(members.held) == 2
                ),
                what="both members holding partitions",
            )
            sent = [hw.send(QUEUE, b"m%d" % i, partition=i % PARTITIONS) for i in range(300)]
            eventually(lambda: len(members.read) >= len(sent), timeout_s=30, what="everything read")
            ends = _ends(hw, QUEUE)
            eventually(lambda: hw.service.fetch_offsets(GROUP, QUEUE) == ends, what="every position committed")
        finally:
            members.join()
    assert len(sent) == 300 and all(ends[p] == 50 for p in range(PARTITIONS))
    positions = [(p, o) for p, o, _ in members.read]
    assert Counter(positions) == Counter({(p, o) for p in range(PARTITIONS) for o in range(50)})  # each once
    assert members.refused_commits == 0


def test_any_bootstrap_broker_reaches_the_coordinator(cluster):
    for i in (1, 2, 3):
        with headwater.connect(cluster.address(i)) as hw:
            md = hw.admin.cluster_metadata()
            assert len(md.coordinators) == 16 and set(md.coordinators) <= {1, 2, 3}
            assert hw.service.fetch_offsets(GROUP, QUEUE) == {p: 50 for p in range(PARTITIONS)}
            described = hw.service.describe_group(GROUP)
            assert described.offsets == {QUEUE: {p: 50 for p in range(PARTITIONS)}}
            listed = [g for g in hw.service.list_groups() if g.group == GROUP]
            assert len(listed) == 1 and listed[0].queues == [QUEUE]  # asked of all three, listed once


def test_a_broker_that_is_not_the_coordinator_refuses_naming_it(cluster):
    with headwater.connect(_bootstrap(cluster)) as hw:
        coordinator = hw.admin.cluster_metadata().coordinator(GROUP)
    assert coordinator in (1, 2, 3)
    for other in {1, 2, 3} - {coordinator}:
        with cluster.connect(other) as raw:  # no routing: that broker's own answer
            where = f"broker {coordinator} at {cluster.address(coordinator)} does"
            with pytest.raises(NotCoordinatorError, match=where):
                raw.service.fetch_offsets(GROUP, QUEUE)
            with pytest.raises(NotCoordinatorError, match=where):
                raw.service.commit_offsets(GROUP, QUEUE, {0: 1})
            with pytest.raises(NotCoordinatorError, match=where):
                raw.service.join_group(GROUP, None, "c", [QUEUE], "clustering", "average", 10_000)
            assert GROUP not in {g.group for g in raw.service.list_groups()}  # only its coordinator lists it
    with cluster.connect(coordinator) as raw:
        assert raw.service.fetch_offsets(GROUP, QUEUE) == {p: 50 for p in range(PARTITIONS)}


def test_the_coordinator_queue_is_not_the_users(cluster):
    for i in (1, 2, 3):
        with cluster.connect(i) as hw:
            assert COORDINATOR_QUEUE not in {q.name for q in hw.admin.list_queues()}
            assert COORDINATOR_QUEUE not in {q.name for q in hw.admin.cluster_metadata().queues}
            with pytest.raises(InvalidArgumentError, match="belong to the broker"):
                hw.send(COORDINATOR_QUEUE, b"x", partition=0)


def test_the_cli_lists_and_describes_a_group_of_a_cluster(cluster):
    servers = _bootstrap(cluster)

    def cli(*args: str) -> str:
        done = subprocess.run([HEADWATER, "--server", servers, *args], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout

    listed = [g for g in json.loads(cli("group", "list", "--json")) if g["group"] == GROUP]
    assert len(listed) == 1 and listed[0]["queues"] == [QUEUE]
    described = json.loads(cli("group", "describe", GROUP, "--json").splitlines()[0])
    assert described["group"] == GROUP
    assert "committed" in json.dumps(described) and "50" in json.dumps(described)


def test_a_moved_coordinator_keeps_the_offsets_and_its_members_go_on(zk_server, tmp_path):
    """The group's coordinator broker is decommissioned while a producer sends and two
    members read and commit: the coordinator partition moves with the rest, nothing is lost,
    the committed offsets are there at the new coordinator, and so are the members, at the
    same generation: they go on without joining again, and no commit of theirs is refused."""
    cluster = Cluster(zk_server, tmp_path, 3)
    try:
        cluster.controller()
        bootstrap = _bootstrap(cluster)
        acked: list[bytes] = []
        stop_sending = threading.Event()
        errors: list[BaseException] = []
        with headwater.connect(bootstrap) as hw:
            hw.admin.create_queue("moving", partitions=PARTITIONS)
            members = Members(bootstrap, "movers", "moving").start()

            def send() -> None:
                try:
                    with hw.producer(linger_ms=2, delivery_timeout_ms=60_000) as producer:
                        n = 0
                        while not stop_sending.is_set():
                            body = b"m-%d" % n
                            f = producer.send("moving", body, key=b"k-%d" % (n % 31))
                            f.add_done_callback(lambda f, body=body: f.exception() or acked.append(body))
                            n += 1
                            if n % 20 == 0:
                                time.sleep(0.01)
                        producer.flush()
                except BaseException as e:  # noqa: BLE001 - the test reports it
                    errors.append(e)

            sender = threading.Thread(target=send)
            sender.start()
            try:
                eventually(lambda: len(members.held) == 2 and len(members.read) > 1000, what="reading under way")
                coordinator = hw.admin.cluster_metadata().coordinator("movers")
                with cluster.connect(coordinator) as raw:
                    before = raw.service.describe_group("movers")
                assert len(before.members) == 2 and before.offsets["moving"]
                moves = hw.admin.decommission(coordinator)
                assert any(m.queue == COORDINATOR_QUEUE for m in moves)
                eventually(lambda: not hw.admin.cluster_metadata([]).moves, timeout_s=60, what="the moves finishing")
                now = hw.admin.cluster_metadata().coordinator("movers")
                assert now != coordinator and now in (1, 2, 3)
                with cluster.connect(now) as raw:  # the new coordinator has the offsets from before
                    after = raw.service.fetch_offsets("movers", "moving")
                assert all(after.get(p, -1) >= o for p, o in before.offsets["moving"].items()), (before, after)

                with cluster.connect(now) as raw:
                    d = raw.service.describe_group("movers")
                assert {m.member_id for m in d.members} == {m.member_id for m in before.members}
                assert d.generation == before.generation  # no rebalance: nobody joined again
                assert sum(len(ps) for m in d.members for ps in m.assignment.values()) == PARTITIONS
                count = len(acked)
                eventually(lambda: len(acked) > count + 500, what="sends after the move")
            finally:
                stop_sending.set()
                sender.join(90)
            eventually(
                lambda: {b for _, _, b in members.read} >= set(acked), timeout_s=60, what="reading everything sent"
            )
            ends = _ends(hw, "moving")
            eventually(lambda: hw.service.fetch_offsets("movers", "moving") == ends, what="the last commits")
            members.join()
            assert not errors, errors
            assert members.refused_commits == 0
    finally:
        cluster.stop()


def test_the_coordinator_queue_is_made_at_the_first_group_call_with_the_set_partitions(zk_server, tmp_path):
    cluster = Cluster(zk_server, tmp_path, 2, "--set", "coordinator_partitions=4")
    try:
        cluster.controller()
        with headwater.connect(_bootstrap(cluster)) as hw:
            hw.admin.create_queue("few", partitions=2)
            assert hw.admin.cluster_metadata().coordinators == []  # not made before a group needs it
            assert hw.service.fetch_offsets("first", "few") == {}
            coordinators = eventually(lambda: hw.admin.cluster_metadata().coordinators, what="the coordinators")
            assert len(coordinators) == 4 and set(coordinators) == {1, 2}  # placed over both brokers
            hw.service.commit_offsets("first", "few", {0: 0, 1: 0})
            assert hw.service.fetch_offsets("first", "few") == {0: 0, 1: 0}
    finally:
        cluster.stop()


def test_members_go_on_when_their_coordinator_crashes_and_comes_back(zk_server, tmp_path):
    """The group's coordinator broker is killed (SIGKILL) and started again: it reads the
    members back from its partition of the coordinator queue with the offsets, so the member
    goes on with the same id and generation, reads what was sent meanwhile and commits."""
    cluster = Cluster(zk_server, tmp_path, 3)
    try:
        cluster.controller()
        with headwater.connect(_bootstrap(cluster), request_timeout_s=5) as hw:
            hw.admin.create_queue("crashing", partitions=3)
            c = hw.consumer(group="stayers", subscribe="crashing", session_timeout_ms=30_000, heartbeat_interval_ms=200)
            eventually(lambda: c.poll(timeout_ms=50) is not None and len(c.assignment()) == 3, what="the assignment")
            before, generation = c.member_id, c.generation
            coordinator = hw.admin.cluster_metadata().coordinator("stayers")
            cluster.brokers[coordinator].kill()
            cluster.start(coordinator)
            sent = [b"after-%d" % p for p in range(3)]
            for p, body in enumerate(sent):
                eventually(lambda p=p, body=body: hw.send("crashing", body, partition=p) is not None, what="a send")
            got: list[bytes] = []

            def polled() -> bool:
                with contextlib.suppress(headwater.UnavailableError, NotCoordinatorError):
                    got.extend(r.body for r in c.poll(timeout_ms=200))
                return len(got) >= len(sent)

            eventually(polled, timeout_s=60, what="the records sent after the restart")
            assert sorted(got) == sorted(sent)
            assert (c.member_id, c.generation) == (before, generation)  # nobody joined again
            eventually(lambda: c.commit() is None, what="a commit")
            assert hw.service.fetch_offsets("stayers", "crashing") == {0: 1, 1: 1, 2: 1}
            c.close()
    finally:
        cluster.stop()
