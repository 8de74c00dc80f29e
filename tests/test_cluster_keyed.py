"""Keyed groups on a cluster (docs/design/cluster.md, "Keyed groups (built)"): three real
brokers and a real ZooKeeper. Each keyed group has one coordinator, the leader of its
partition of the internal queue ``__cluster_keyed``, which keeps the group's state; a
member's fetch goes to the partition's leader, which asks the coordinator for the state and
filters by key there. When the coordinator's partition moves, the state moves with it."""

from __future__ import annotations

import threading
import time
from collections import Counter, defaultdict

import pytest

import headwater
from headwater import Message
from headwater.errors import NotCoordinatorError, NotLeaderError
from headwater.model.cluster import KEYED_COORDINATOR_QUEUE
from headwater.model.keyed import member_of
from tests.support.cluster import Cluster, eventually

QUEUE, GROUP, PARTITIONS = "clicks", "counters", 6
KEYS = [b"user-%d" % i for i in range(30)]


def _bootstrap(cluster: Cluster) -> str:
    return ",".join(cluster.address(i) for i in sorted(cluster.brokers))


def _send(hw: headwater.Client, queue: str, rounds: int, first: int = 0) -> int:
    """``rounds`` messages of every key, bodies ``key:seq``, partitioned by key."""
    msgs = [Message(k + b":%d" % seq, key=k) for seq in range(first, first + rounds) for k in KEYS]
    for i in range(0, len(msgs), 100):
        hw.send_batch(queue, msgs[i : i + 100])
    return len(msgs)


def _seq(r: headwater.Record) -> tuple[bytes, int]:
    k, _, seq = r.body.rpartition(b":")
    return k, int(seq)


class Members:
    """Keyed members on threads of their own (a client each), committing after every poll
    that returned something; what each read."""

    def __init__(self, bootstrap: str, queue: str, group: str, size: int) -> None:
        self.read: dict[int, list[headwater.Record]] = defaultdict(list)
        self.errors: list[BaseException] = []
        self.stop = threading.Event()
        self._args = (bootstrap, queue, group, size)
        self.threads = [threading.Thread(target=self._run, args=(m,), daemon=True) for m in range(size)]

    def start(self) -> Members:
        for t in self.threads:
            t.start()
        return self

    def join(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(90)
        assert not self.errors, self.errors

    def total(self) -> int:
        return sum(len(v) for v in list(self.read.values()))

    def _run(self, member: int) -> None:
        bootstrap, queue, group, size = self._args
        try:
            with headwater.connect(bootstrap) as hw:
                c = hw.keyed_consumer(group, queue, member=member, size=size)
                while not self.stop.is_set():
                    recs = c.poll(timeout_ms=200)
                    self.read[member].extend(recs)
                    if recs:
                        c.commit()
                c.close()
        except BaseException as e:  # noqa: BLE001 - the test reports it
            self.errors.append(e)


def _check_keys_in_order(read: dict[int, list[headwater.Record]], size: int) -> None:
    for m, recs in read.items():
        assert {member_of(r.key, size) for r in recs} <= {m}, f"member {m} got another member's keys"
        last: dict[bytes, int] = {}
        for r in recs:
            k, seq = _seq(r)
            assert seq == last.get(k, -1) + 1, f"member {m}: {k!r} out of order ({seq} after {last.get(k)})"
            last[k] = seq


def test_the_keyed_coordinator_queue_is_made_at_the_first_keyed_call(cluster):
    with headwater.connect(_bootstrap(cluster)) as hw:
        hw.admin.create_queue(QUEUE, partitions=PARTITIONS)
        md = hw.admin.cluster_metadata([QUEUE])
        assert set(p.leader for p in md.queue(QUEUE).partitions) == {1, 2, 3}  # fetches go to every broker
        assert md.keyed_coordinators == []
        hw.service.keyed_group(QUEUE, GROUP, "key", 3)
        coordinators = eventually(lambda: hw.admin.cluster_metadata().keyed_coordinators, what="keyed coordinators")
        assert len(coordinators) == 16 and set(coordinators) == {1, 2, 3}
        for i in (1, 2, 3):
            with cluster.connect(i) as one:
                assert KEYED_COORDINATOR_QUEUE not in {q.name for q in one.admin.list_queues()}


def test_three_members_each_get_exactly_their_keys_in_order(cluster):
    bootstrap = _bootstrap(cluster)
    with headwater.connect(bootstrap) as hw:
        sent = _send(hw, QUEUE, 10)
        members = Members(bootstrap, QUEUE, GROUP, 3).start()
        try:
            eventually(lambda: members.total() >= sent, timeout_s=30, what="everything read")
        finally:
            members.join()
        _check_keys_in_order(members.read, 3)
        positions = Counter((r.partition, r.offset) for recs in members.read.values() for r in recs)
        assert len(positions) == sent and set(positions.values()) == {1}  # each once
        assert all(members.read[m] for m in range(3))
        info = hw.admin.describe_keyed_group(GROUP, QUEUE)
        ends = {p.partition: p.end_offset for p in hw.admin.describe_queue(QUEUE).partitions}
        for m in range(3):  # every member committed past its last record in each partition
            for r in members.read[m]:
                assert info.positions[m][r.partition] > r.offset
        listed = [g for g in hw.service.list_groups() if g.group == GROUP]
        assert len(listed) == 1 and listed[0].mode == "keyed"  # asked of all three, listed once
        assert sum(ends.values()) == sent


def test_a_broker_that_is_not_the_coordinator_refuses_naming_it(cluster):
    with headwater.connect(_bootstrap(cluster)) as hw:
        coordinator = hw.admin.cluster_metadata().keyed_coordinator(QUEUE, GROUP)
        leaders = {p.partition: p.leader for p in hw.admin.cluster_metadata([QUEUE]).queue(QUEUE).partitions}
    assert coordinator in (1, 2, 3)
    for other in {1, 2, 3} - {coordinator}:
        with cluster.connect(other) as raw:  # no routing: that broker's own answer
            where = f"broker {coordinator} at {cluster.address(coordinator)} does"
            with pytest.raises(NotCoordinatorError, match=where):
                raw.service.keyed_group(QUEUE, GROUP)
            with pytest.raises(NotCoordinatorError, match=where):
                raw.service.keyed_commit(QUEUE, GROUP, 0, 1, {0: 0})
            with pytest.raises(NotCoordinatorError, match=where):
                raw.service.keyed_resize(QUEUE, GROUP, 4)
            assert GROUP not in {g.group for g in raw.service.list_groups()}  # only its coordinator lists it
            partition = next(p for p, b in leaders.items() if b != other)
            with pytest.raises(NotLeaderError):
                raw.service.keyed_fetch(QUEUE, GROUP, 0, 1, partition, 0, max_bytes=1 << 20)
    with cluster.connect(coordinator) as raw:
        assert raw.service.keyed_group(QUEUE, GROUP).size == 3


def test_a_resize_completes_and_keeps_each_key_in_order(cluster):
    bootstrap = _bootstrap(cluster)
    with headwater.connect(bootstrap) as hw:
        hw.admin.create_queue("resized", partitions=PARTITIONS)
        hw.service.keyed_group("resized", "g", "key", 2)
        first = _send(hw, "resized", 5)
        info = hw.admin.resize_keyed_group("g", "resized", 3)  # the members have read nothing: it waits
        assert info.resizing_to == 3 and sum(info.barrier.values()) == first
        old = Members(bootstrap, "resized", "g", 2).start()
        try:
            eventually(
                lambda: hw.admin.describe_keyed_group("g", "resized").generation == 2,
                timeout_s=30,
                what="the resize completing once both members reached the barrier",
            )
        finally:
            old.join()  # members 0 and 1 may have gone on in generation 2 (of 3) by now
        more = _send(hw, "resized", 5, first=5)
        new = Members(bootstrap, "resized", "g", 3).start()
        try:
            eventually(
                lambda: old.total() + new.total() >= first + more, timeout_s=30, what="generation 2 reading the rest"
            )
        finally:
            new.join()
        before = {m: [r for r in recs if _seq(r)[1] < 5] for m, recs in old.read.items()}
        after = {m: [r for r in old.read.get(m, []) + new.read.get(m, []) if _seq(r)[1] >= 5] for m in range(3)}
        assert sum(map(len, before.values())) == first  # up to the barrier, by two members
        _check_keys_in_order(before, 2)
        for m, recs in after.items():  # then by three, each from where the barrier left its keys
            assert {member_of(r.key, 3) for r in recs} <= {m}
        everything = Counter((r.partition, r.offset) for recs in (*old.read.values(), *new.read.values()) for r in recs)
        assert len(everything) == first + more and set(everything.values()) == {1}


def test_a_moved_coordinator_keeps_the_state_and_loses_nothing(zk_server, tmp_path):
    """The keyed group's coordinator broker is decommissioned while a producer sends and
    three members read and commit: ``__cluster_keyed``'s partition moves with the rest, the
    state is at the new coordinator, and every message is read once, in order per key."""
    cluster = Cluster(zk_server, tmp_path, 3)
    try:
        cluster.controller()
        bootstrap = _bootstrap(cluster)
        with headwater.connect(bootstrap) as hw:
            hw.admin.create_queue("moving", partitions=PARTITIONS)
            hw.service.keyed_group("moving", "movers", "key", 3)
            members = Members(bootstrap, "moving", "movers", 3).start()
            sent = [0]
            stop_sending = threading.Event()

            def send() -> None:
                while not stop_sending.is_set():
                    sent[0] += _send(hw, "moving", 1, first=sent[0] // len(KEYS))
                    time.sleep(0.02)

            sender = threading.Thread(target=send, daemon=True)
            sender.start()
            try:
                eventually(lambda: members.total() > 600, what="reading under way")
                coordinator = hw.admin.cluster_metadata().keyed_coordinator("moving", "movers")
                before = hw.admin.describe_keyed_group("movers", "moving")
                assert before.positions
                moves = hw.admin.decommission(coordinator)
                assert any(m.queue == KEYED_COORDINATOR_QUEUE for m in moves)
                eventually(lambda: not hw.admin.cluster_metadata([]).moves, timeout_s=90, what="the moves finishing")
                now = hw.admin.cluster_metadata().keyed_coordinator("moving", "movers")
                assert now != coordinator and now in (1, 2, 3)
                with cluster.connect(now) as raw:  # the new coordinator has the state from before
                    after = raw.service.keyed_group("moving", "movers")
                assert after.generation == before.generation and after.size == 3
                for m, parts in before.positions.items():
                    assert all(after.positions[m][p] >= o for p, o in parts.items()), (before, after)
                count = sent[0]
                eventually(lambda: sent[0] > count + 300, what="sends after the move")
            finally:
                stop_sending.set()
                sender.join(60)
            eventually(lambda: members.total() >= sent[0], timeout_s=60, what="reading everything sent")
            members.join()
            _check_keys_in_order(members.read, 3)
            positions = Counter((r.partition, r.offset) for recs in members.read.values() for r in recs)
            assert len(positions) == sent[0] and set(positions.values()) == {1}
    finally:
        cluster.stop()
