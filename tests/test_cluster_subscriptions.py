"""Push subscribers on a cluster (docs/design/cluster.md, "Subscriptions (built)"): three
real brokers and a real ZooKeeper. Each subscriber has one coordinator, the leader of its
partition of the internal queue ``__cluster_subscribers``, which keeps its record and
checkpoints; a subscriber process claims the name there (its epoch) and opens one push
stream per partition leader. When the coordinator's partition moves, the record moves with
it; when a data partition moves, the stream moves to its new leader."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import defaultdict

import pytest

import headwater
import headwater.aio
from headwater import Message
from headwater.errors import InvalidArgumentError, NotCoordinatorError, NotLeaderError, UsageError
from headwater.model.cluster import SUBSCRIBER_COORDINATOR_QUEUE
from headwater.model.service import PushStreamSpec
from tests.support.cluster import Cluster, eventually

QUEUE, NAME, PARTITIONS = "payments", "ledger", 6


def _bootstrap(cluster: Cluster) -> str:
    return ",".join(cluster.address(i) for i in sorted(cluster.brokers))


def _send(hw: headwater.Client, queue: str, count: int, first: int = 0) -> int:
    """``count`` messages spread over every partition, bodies ``seq``."""
    msgs = [Message(b"%d" % i, key=b"k%d" % (i % 60)) for i in range(first, first + count)]
    for i in range(0, len(msgs), 100):
        hw.send_batch(queue, msgs[i : i + 100])
    return count


class Sending:
    """A producer thread sending batches of 30 (``_send``) to a queue until the block ends."""

    def __init__(self, hw: headwater.Client, queue: str) -> None:
        self.hw, self.queue, self.sent = hw, queue, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sent += _send(self.hw, self.queue, 30, first=self.sent)
            time.sleep(0.02)

    def __enter__(self) -> Sending:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)

    def more(self, count: int, what: str) -> None:
        """Wait until ``count`` more messages are sent from now."""
        start = self.sent
        eventually(lambda: self.sent > start + count, what=what)


class Seen:
    """What a subscriber's listeners were given, per partition, thread-safe."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_partition: dict[int, list[int]] = defaultdict(list)

    def __call__(self, r: headwater.Record) -> None:
        with self.lock:
            self.by_partition[r.partition].append(r.offset)

    def total(self) -> int:
        with self.lock:
            return sum(len(v) for v in self.by_partition.values())

    def positions(self) -> set[tuple[int, int]]:
        with self.lock:
            return {(p, o) for p, offs in self.by_partition.items() for o in offs}

    def check_in_order(self) -> None:
        with self.lock:
            for p, offs in self.by_partition.items():
                assert offs == sorted(offs), f"partition {p} out of order"


def test_the_subscriber_coordinator_queue_is_made_at_the_first_subscriber_call(cluster):
    with headwater.connect(_bootstrap(cluster)) as hw:
        hw.admin.create_queue(QUEUE, partitions=PARTITIONS)
        md = hw.admin.cluster_metadata([QUEUE])
        assert set(p.leader for p in md.queue(QUEUE).partitions) == {1, 2, 3}  # reads go to every broker
        assert md.subscriber_coordinators == []
        assert hw.admin.list_subscribers() == []
        _send(hw, QUEUE, 120)  # every partition holds some: "latest" is not 0 anywhere
        ends = {p.partition: p.end_offset for p in hw.admin.describe_queue(QUEUE).partitions}
        assert all(ends.values())
        info = hw.admin.add_subscriber(QUEUE, NAME, start="latest")
        assert info.checkpoints == ends  # resolved by each partition's leader, not the coordinator's copy
        coordinators = eventually(lambda: hw.admin.cluster_metadata().subscriber_coordinators, what="coordinators")
        assert len(coordinators) == 16 and set(coordinators) == {1, 2, 3}
        early = hw.admin.add_subscriber(QUEUE, "from-start", start="earliest")
        assert early.checkpoints == {p: 0 for p in range(PARTITIONS)}
        for i in (1, 2, 3):
            with cluster.connect(i) as one:
                assert SUBSCRIBER_COORDINATOR_QUEUE not in {q.name for q in one.admin.list_queues()}


def test_a_subscriber_gets_every_message_in_order_and_resumes_from_its_checkpoint(cluster):
    bootstrap = _bootstrap(cluster)
    with headwater.connect(bootstrap) as hw:
        start = {p: o for p, o in hw.admin.describe_subscriber(QUEUE, NAME).checkpoints.items()}
        seen = Seen()
        sub = hw.subscribe(QUEUE, NAME, listeners=[seen])
        assert sub.mode == "push"
        # one stream per leader, each pushing the partitions it leads: every partition once
        eventually(lambda: sorted(p for ps in sub.streams.values() for p in ps) == list(range(PARTITIONS)) or None)
        leaders = hw.admin.cluster_metadata([QUEUE]).queue(QUEUE).partitions
        assert sub.streams == {b: sorted(p.partition for p in leaders if p.leader == b) for b in sub.streams}
        assert set(sub.streams) == {1, 2, 3}
        sent = _send(hw, QUEUE, 300, first=1000)
        assert sub.wait_for(lambda: seen.total() >= sent, timeout_s=30), sub.error
        sub.stop()
        assert sub.error is None
        seen.check_in_order()
        assert all(o >= start[p] for p, o in seen.positions())  # nothing from before "latest"
        assert seen.total() == sent and len(seen.positions()) == sent  # each once
        ends = {p.partition: p.end_offset for p in hw.admin.describe_queue(QUEUE).partitions}
    for i in (1, 2, 3):  # the checkpoint through each bootstrap broker: routed to the coordinator
        with headwater.connect(cluster.address(i)) as other:
            assert other.admin.describe_subscriber(QUEUE, NAME).checkpoints == ends
            listed = [s for s in other.admin.list_subscribers(QUEUE) if s.name == NAME]
            assert len(listed) == 1 and listed[0].checkpoints == ends  # asked of all three, listed once
    with headwater.connect(cluster.address(1)) as hw:  # a restarted subscriber, from another broker
        more = _send(hw, QUEUE, 60, first=2000)
        again = Seen()
        sub = hw.subscribe(QUEUE, NAME, listeners=[again])
        assert sub.wait_for(lambda: again.total() >= more, timeout_s=30), sub.error
        sub.stop()
        assert again.total() == more and all(o >= ends[p] for p, o in again.positions())  # from the checkpoint


def test_a_broker_that_is_not_the_coordinator_refuses_naming_it(cluster):
    with headwater.connect(_bootstrap(cluster)) as hw:
        coordinator = hw.admin.cluster_metadata().subscriber_coordinator(QUEUE, NAME)
    assert coordinator in (1, 2, 3)
    for other in {1, 2, 3} - {coordinator}:
        with cluster.connect(other) as raw:  # no routing: that broker's own answer
            where = f"broker {coordinator} at {cluster.address(coordinator)} does"
            with pytest.raises(NotCoordinatorError, match=where):
                raw.admin.describe_subscriber(QUEUE, NAME)
            with pytest.raises(NotCoordinatorError, match=where):
                raw.service.checkpoint_subscriber(QUEUE, NAME, {0: 0})
            with pytest.raises(NotCoordinatorError, match=where):
                raw.admin.add_subscriber(QUEUE, NAME)
            with pytest.raises(NotCoordinatorError, match=where):
                raw.admin.delete_subscriber(QUEUE, NAME)
            assert NAME not in {s.name for s in raw.admin.list_subscribers(QUEUE)}  # only its coordinator lists it
    with cluster.connect(coordinator) as raw:
        assert raw.admin.describe_subscriber(QUEUE, NAME).name == NAME


def test_a_deleted_subscriber_is_gone_from_every_broker(cluster):
    with headwater.connect(_bootstrap(cluster)) as hw:
        hw.admin.add_subscriber(QUEUE, "short-lived", start="earliest")
        hw.admin.delete_subscriber(QUEUE, "short-lived")
        for i in (1, 2, 3):
            with headwater.connect(cluster.address(i)) as other:
                assert "short-lived" not in {s.name for s in other.admin.list_subscribers()}


def test_a_moved_coordinator_keeps_the_checkpoint_and_loses_nothing(zk_server, tmp_path):
    """The subscriber's coordinator broker is decommissioned while a producer sends and the
    subscriber delivers: ``__cluster_subscribers``'s partition moves with the rest, the
    checkpoint is at the new coordinator, and every message is delivered, in order."""
    cluster = Cluster(zk_server, tmp_path, 3)
    try:
        cluster.controller()
        with headwater.connect(_bootstrap(cluster)) as hw:
            hw.admin.create_queue("moving", partitions=PARTITIONS)
            hw.admin.add_subscriber("moving", "mover", start="earliest")
            seen = Seen()
            sub = hw.subscribe("moving", "mover", listeners=[seen])
            with Sending(hw, "moving") as sending:
                eventually(lambda: seen.total() > 300, what="delivery under way")
                coordinator = hw.admin.cluster_metadata().subscriber_coordinator("moving", "mover")
                before = eventually(lambda: hw.admin.describe_subscriber("moving", "mover").checkpoints or None)
                moves = hw.admin.decommission(coordinator)
                assert any(m.queue == SUBSCRIBER_COORDINATOR_QUEUE for m in moves)
                eventually(  # (a broker's metadata may show the planned moves a moment late)
                    lambda: (
                        not hw.admin.cluster_metadata([]).moves
                        and hw.admin.cluster_metadata().subscriber_coordinator("moving", "mover") != coordinator
                    ),
                    timeout_s=90,
                    what="the moves finishing",
                )
                now = hw.admin.cluster_metadata().subscriber_coordinator("moving", "mover")
                assert now != coordinator and now in (1, 2, 3)
                with cluster.connect(now) as raw:  # the new coordinator has the checkpoint from before
                    after = raw.admin.describe_subscriber("moving", "mover").checkpoints
                assert all(after[p] >= o for p, o in before.items()), (before, after)
                with cluster.connect(coordinator) as raw:  # the subscriber's checkpoints are refused there now
                    with pytest.raises(NotCoordinatorError):
                        raw.service.checkpoint_subscriber("moving", "mover", after)
                sending.more(300, "sends after the move")
            sent = sending.sent
            assert sub.wait_for(lambda: seen.total() >= sent, timeout_s=60), sub.error
            sub.stop()
            assert sub.error is None
            seen.check_in_order()
            assert len(seen.positions()) == sent == seen.total()  # each once
            ends = {p.partition: p.end_offset for p in hw.admin.describe_queue("moving").partitions}
            assert hw.admin.describe_subscriber("moving", "mover").checkpoints == ends
    finally:
        cluster.stop()


def test_a_broker_in_a_cluster_opens_no_push_stream(cluster):
    """A push stream of one broker would carry only the partitions it leads: refused, so
    no subscriber silently misses the others'."""
    with headwater.connect(_bootstrap(cluster)) as hw:
        coordinator = hw.admin.cluster_metadata().subscriber_coordinator(QUEUE, NAME)
    with cluster.connect(coordinator) as raw:  # no routing: its own push stream
        sub = raw.subscribe(QUEUE, NAME, listeners=[lambda r: None])
        assert sub.mode == "push"
        with pytest.raises(UsageError, match="opens no push stream"):
            sub.wait(timeout_s=20)
        assert raw.admin.describe_subscriber(QUEUE, NAME).name == NAME  # its coordinator, still


def test_an_asyncio_client_finds_the_subscriber_through_any_broker(cluster):
    async def check(address: str) -> None:
        async with await headwater.aio.connect(address) as hw:
            info = await hw.admin.describe_subscriber(QUEUE, NAME)
            listed = [s for s in await hw.admin.list_subscribers(QUEUE) if s.name == NAME]
            assert listed == [info]  # asked of all three, listed once
            await hw.service.checkpoint_subscriber(QUEUE, NAME, info.checkpoints)

    for i in (1, 2, 3):
        asyncio.run(check(cluster.address(i)))


def _leaders(hw: headwater.Client, queue: str) -> dict[int, list[int]]:
    """broker id -> the partitions of ``queue`` it leads, by the cluster's metadata."""
    out: dict[int, list[int]] = {}
    for p in hw.admin.cluster_metadata([queue]).queue(queue).partitions:
        out.setdefault(p.leader, []).append(p.partition)
    return out


def test_a_second_process_takes_the_subscriber_over_on_every_leader(cluster):
    """A second process claims the name at the coordinator: every leader ends the first
    one's stream with the single broker's "took the stream over", the first's checkpoints
    are refused from then on, and the second gets what is sent next."""
    queue, name = "takeover", "one-at-a-time"
    with headwater.connect(_bootstrap(cluster)) as hw:
        hw.admin.create_queue(queue, partitions=PARTITIONS)
        hw.admin.add_subscriber(queue, name, start="earliest")
        first_seen = Seen()
        first = hw.subscribe(queue, name, listeners=[first_seen])
        sent = _send(hw, queue, 120)
        assert first.wait_for(lambda: first_seen.total() >= sent, timeout_s=30), first.error
        assert set(first.streams) == {1, 2, 3}
        ends = {p.partition: p.end_offset for p in hw.admin.describe_queue(queue).partitions}
        # the first's checkpoint is stored: the second starts there (at least once, else)
        eventually(lambda: hw.admin.describe_subscriber(queue, name).checkpoints == ends, what="the checkpoint")
        epoch = hw.admin.describe_subscriber(queue, name).epoch
        with headwater.connect(cluster.address(3)) as other:  # another process, through another broker
            second_seen = Seen()
            second = other.subscribe(queue, name, listeners=[second_seen])
            with pytest.raises(UsageError, match="took the stream over"):
                first.wait(timeout_s=20)
            assert not first.running and first.streams == {}
            assert other.admin.describe_subscriber(queue, name).epoch == epoch + 1
            assert second.wait_for(lambda: set(second.streams) == {1, 2, 3}, timeout_s=20)
            more = _send(hw, queue, 60, first=sent)
            assert second.wait_for(lambda: second_seen.total() >= more, timeout_s=30), second.error
            with pytest.raises(UsageError, match="took the stream over"):  # the first's checkpoints are fenced
                hw.service.checkpoint_subscriber(queue, name, {0: 0}, epoch)
            second.stop()
            assert second.error is None
            assert first_seen.total() == sent and second_seen.total() == more  # nothing twice: the checkpoint held
            ends = {p.partition: p.end_offset for p in hw.admin.describe_queue(queue).partitions}
            assert hw.admin.describe_subscriber(queue, name).checkpoints == ends


def test_a_leader_pushes_only_the_partitions_it_leads(cluster):
    """A raw stream (no routing) naming a partition another broker leads is refused with
    NotLeaderError naming the leader; one of the partitions it leads pushes them from the
    positions given, and refuses a checkpoint (the coordinator keeps them)."""
    queue, name = "raw-streams", "raw"
    with headwater.connect(_bootstrap(cluster)) as hw:
        hw.admin.create_queue(queue, partitions=PARTITIONS)
        hw.admin.add_subscriber(queue, name, start="earliest")
        _send(hw, queue, 60)
        epoch = hw.service.claim_subscriber(queue, name).epoch
        leaders = _leaders(hw, queue)
    broker = min(leaders)
    mine, theirs = leaders[broker], next(p for b, ps in leaders.items() if b != broker for p in ps)
    with cluster.connect(broker) as raw:
        with pytest.raises(NotLeaderError, match=f"does not lead {queue}\\[{theirs}\\]"):
            raw.service.open_push_stream(
                PushStreamSpec(queue, name, 10, 1 << 20, epoch, {theirs: 0}), lambda body: None
            )
        pushed: list = []
        spec = PushStreamSpec(queue, name, 1000, 1 << 20, epoch, {p: 1 for p in mine})
        sid, started = raw.service.open_push_stream(spec, pushed.append)
        assert started.checkpoints == {p: 1 for p in mine} and started.epoch == epoch
        eventually(lambda: {b.partition for b in pushed if b is not None and b.batches} == set(mine) or None)
        assert all(b.partition in mine for b in pushed)
        with pytest.raises(InvalidArgumentError, match="coordinator"):
            raw.service.ack_push_stream(sid, {mine[0]: 2}, 1, 1).result(10)
        raw.service.close_push_stream(sid)


def test_partitions_moved_to_a_new_broker_while_pushing_lose_nothing(zk_server, tmp_path):
    """A fourth broker joins and a decommission moves partitions to it while a producer sends
    and the subscriber delivers: its streams follow the leaders (one at the new broker),
    every message is delivered once, in order per partition, and a leader restarted
    meanwhile is streamed from again once it is back."""
    cluster = Cluster(zk_server, tmp_path, 3)
    try:
        cluster.controller()
        with headwater.connect(_bootstrap(cluster)) as hw:
            hw.admin.create_queue("growing", partitions=PARTITIONS)
            hw.admin.add_subscriber("growing", "follower", start="earliest")
            seen = Seen()
            sub = hw.subscribe("growing", "follower", listeners=[seen])
            with Sending(hw, "growing") as sending:
                eventually(lambda: seen.total() > 200, what="delivery under way")
                assert set(sub.streams) == {1, 2, 3}
                cluster.start(4)
                eventually(lambda: 4 in {b.broker_id for b in hw.admin.cluster_metadata([]).brokers}, what="broker 4")
                leaving = min(_leaders(hw, "growing"))
                moves = hw.admin.decommission(leaving)  # its partitions go to the others, the new one first
                assert any(m.queue == "growing" and m.target == 4 for m in moves), moves
                eventually(
                    lambda: not hw.admin.cluster_metadata([]).moves and leaving not in _leaders(hw, "growing"),
                    timeout_s=90,
                    what="the moves finishing",
                )
                leaders = _leaders(hw, "growing")
                assert 4 in leaders and leaving not in leaders
                assert sub.wait_for(lambda: sub.streams == leaders, timeout_s=30), (sub.streams, leaders)
                sending.more(200, "sends after the moves")
            sent = sending.sent
            assert sub.wait_for(lambda: seen.total() >= sent, timeout_s=60), (sub.error, seen.total(), sent)
            seen.check_in_order()
            assert len(seen.positions()) == sent == seen.total()  # each once

            cluster.brokers[4].terminate()  # a leader stops: its stream is lost, the others go on
            cluster.start(4)
            more = _send(hw, "growing", 120, first=sent)
            total = sent + more
            assert sub.wait_for(lambda: seen.total() >= total, timeout_s=60), (sub.error, seen.total(), total)
            assert sub.wait_for(lambda: sub.streams == _leaders(hw, "growing"), timeout_s=30)
            sub.stop()
            assert sub.error is None
            seen.check_in_order()
            assert len(seen.positions()) == total == seen.total()
            ends = {p.partition: p.end_offset for p in hw.admin.describe_queue("growing").partitions}
            assert hw.admin.describe_subscriber("growing", "follower").checkpoints == ends
    finally:
        cluster.stop()
