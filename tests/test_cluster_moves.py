"""Moving partitions between brokers (docs/design/cluster.md, step 6): real brokers and a
real ZooKeeper. A rebalance moves partitions onto a new broker while an idempotent producer
keeps sending (resending after NotLeaderError to the new leader, with the same producer id
and sequences): nothing acknowledged is lost, nothing is stored twice, the new leader serves
every message at the same offset, and the old one has dropped its copy. A decommission
empties a broker; the controller or the target SIGKILLed mid-move, the move finishes or rolls
back and the partition always has one leader."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator

import pytest

import headwater
import headwater.aio
from headwater.errors import HeadwaterError, InvalidArgumentError, NotLeaderError, UnavailableError
from headwater.model.batch import encode_batch
from headwater.model.cluster import PartitionMove
from tests.support.broker_process import HEADWATER
from tests.support.cluster import Cluster, eventually, move_phases, moves_left, recorded_leaders

QUEUE = "orders"
PRODUCER_ID = 7001


@pytest.fixture
def cluster(zk_server, tmp_path) -> Iterator[Cluster]:
    c = Cluster(zk_server, tmp_path, 2, "--set", "moves_running_max=2")  # a bad setting fails the start
    try:
        yield c
    finally:
        c.stop()


def plan(cluster: Cluster, op: str, *, broker_id: int = 0, dry_run: bool = False) -> list[PartitionMove]:
    with cluster.connect(1) as hw:
        if op == "rebalance":
            return hw.admin.rebalance(dry_run=dry_run)
        return hw.admin.decommission(broker_id, dry_run=dry_run)


def cli(cluster: Cluster, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [HEADWATER, "--server", cluster.address(2), "cluster", *args], capture_output=True, text=True, timeout=120
    )
    assert (done.returncode == 0) == ok, done.stderr
    return done


def connect(cluster: Cluster, broker_id: int) -> headwater.Client:
    """A client that gives up soon on a broker that does not answer (a paused one)."""
    return headwater.connect(cluster.address(broker_id), connect_timeout_s=3, request_timeout_s=3)


def ended_moves(cluster: Cluster) -> list[str]:
    """How the latest moves ended, for an assertion's message."""
    with connect(cluster, 1) as hw:
        return [
            f"{m.partition}: {m.source}->{m.target} {m.outcome} {m.why}"
            for m in hw.admin.cluster_metadata().ended_moves
        ]


def leaders(cluster: Cluster, via: int) -> dict[int, int]:
    with connect(cluster, via) as hw:
        return {p.partition: p.leader for p in hw.admin.cluster_metadata([QUEUE]).queue(QUEUE).partitions}


class Sender:
    """An idempotent producer of its own making: per partition, batches of ``batch`` bodies
    with the next sequence, sent to the partition's leader; on a retriable refusal it reads
    the metadata again and resends the same batch (same producer id and sequence)."""

    def __init__(self, cluster: Cluster, partitions: int, batch: int = 10) -> None:
        self.cluster, self.batch = cluster, batch
        self.next_seq = dict.fromkeys(range(partitions), 0)
        self.acked: dict[int, dict[int, bytes]] = {p: {} for p in range(partitions)}  # offset -> body
        self.resends = 0
        self._leaders: dict[int, int] = {}
        self.stop = threading.Event()

    def _leader(self, p: int, refresh: bool) -> int:
        if refresh or p not in self._leaders:
            live = [i for i, b in self.cluster.brokers.items() if b.alive()]
            for via in live:
                try:
                    self._leaders = leaders(self.cluster, via)
                    break
                except (HeadwaterError, OSError):
                    continue
        return self._leaders[p]

    def send_one(self, p: int) -> None:
        seq = self.next_seq[p]
        bodies = [b"%d:%d" % (p, seq + i) for i in range(self.batch)]
        raw = bytes(encode_batch(bodies, producer_id=PRODUCER_ID, producer_epoch=0, base_sequence=seq))
        refresh = False
        for _ in range(600):
            try:
                with connect(self.cluster, self._leader(p, refresh)) as hw:
                    res = hw.service.produce(QUEUE, p, raw)
                break
            except (NotLeaderError, UnavailableError, OSError, ConnectionError):
                self.resends += 1
                refresh = True
                time.sleep(0.05)
        else:
            raise AssertionError(f"partition {p}: no leader took sequence {seq}")
        for i, body in enumerate(bodies):
            self.acked[p][res.base_offset + i] = body
        self.next_seq[p] = seq + self.batch

    def run_until_stopped(self) -> None:
        n = 0
        while not self.stop.is_set():
            self.send_one(n % len(self.next_seq))
            n += 1

    def check(self) -> None:
        """Each partition on its final leader holds exactly the bodies sent, once each, in
        order, every acknowledged one at the offset it was acknowledged at."""
        final = leaders(self.cluster, next(i for i, b in self.cluster.brokers.items() if b.alive()))
        for p, acked in self.acked.items():
            with self.cluster.connect(final[p]) as hw:
                got = {r.offset: r.body for r in hw.scanner(QUEUE, partitions=[p])}
            bodies = list(got.values())
            assert len(bodies) == len(set(bodies)), f"partition {p} holds duplicates"
            assert bodies == [b"%d:%d" % (p, i) for i in range(self.next_seq[p])], f"partition {p} lost or reordered"
            assert all(got.get(o) == b for o, b in acked.items()), f"partition {p}: acknowledged offsets moved"


def start_queue(cluster: Cluster, messages: int = 2000) -> Sender:
    cluster.controller()
    with cluster.connect(1) as hw:
        hw.admin.create_queue(QUEUE, partitions=4)
    sender = Sender(cluster, 4)
    for i in range(messages // sender.batch):
        sender.send_one(i % 4)
    return sender


def dropped(cluster: Cluster, broker_id: int, partition: int) -> bool:
    with cluster.connect(broker_id) as hw:
        p = hw.admin.describe_queue(QUEUE).partitions[partition]
        return p.start_offset == p.end_offset


def test_a_rebalance_moves_partitions_to_a_new_broker_while_a_producer_sends(cluster):
    sender = start_queue(cluster)
    before = leaders(cluster, 1)
    cluster.start(3)
    eventually(lambda: cluster.status(1)["brokers"] == [1, 2, 3], what="broker 3 joining")

    dry = plan(cluster, "rebalance", dry_run=True)
    assert dry and {m.target for m in dry} == {3}
    assert moves_left(cluster) == 0 and leaders(cluster, 1) == before  # a dry run changes nothing

    background = threading.Thread(target=sender.run_until_stopped)
    background.start()
    try:
        done = plan(cluster, "rebalance")
        assert [(m.queue, m.partition, m.source, m.target) for m in done] == [
            (m.queue, m.partition, m.source, m.target) for m in dry
        ]
        eventually(lambda: moves_left(cluster) == 0, timeout_s=60, what="the moves finishing")
        time.sleep(0.5)  # the producer sends to the new leaders for a while
    finally:
        sender.stop.set()
        background.join(60)
    after = recorded_leaders(cluster, QUEUE)
    moved = {m.partition: m for m in done}
    for p, m in moved.items():
        assert after[p] == m.target == 3
        eventually(lambda p=p, m=m: dropped(cluster, m.source, p), what=f"broker {m.source} dropping {p}")
        with cluster.connect(m.source) as hw, pytest.raises(NotLeaderError):
            hw.service.fetch(QUEUE, p, 0, max_bytes=1024)
    sender.check()
    assert plan(cluster, "rebalance") == []  # balanced now
    assert json.loads(cli(cluster, "rebalance", "--json").stdout) == {"dry_run": False, "moves": []}
    assert "rebalance: nothing to move" in cli(cluster, "rebalance", "--dry-run").stdout

    with pytest.raises(InvalidArgumentError, match="broker 9 is not a broker of this cluster"):
        plan(cluster, "decommission", broker_id=9)
    assert "broker 9 is not a broker of this cluster" in cli(cluster, "decommission", "9", ok=False).stderr
    on_1 = list(leaders(cluster, 2).values()).count(1)
    shown = cli(cluster, "decommission", "1", "--dry-run").stdout
    assert f"decommission: would move {on_1} partition(s)" in shown and moves_left(cluster) == 0
    doc = json.loads(cli(cluster, "decommission", "1", "--json").stdout)  # waits for the moves
    assert len(doc["moves"]) == on_1 > 0 and all(o["outcome"] == "moved" for o in doc["outcome"]), (
        doc,
        {i: b.log.read_text()[-3000:] for i, b in cluster.brokers.items()},  # why a move rolled back
    )
    assert moves_left(cluster) == 0
    # broker 2's view learns the switch by its own watch, maybe a moment after the CLI's broker
    eventually(lambda: 1 not in leaders(cluster, 2).values(), what="broker 2 seeing broker 1 lead nothing")
    sender.check()


def one_server_each(cluster: Cluster) -> None:
    """Every partition is served by exactly one live broker: the one ZooKeeper records as
    its leader, which every broker's view shows once its watch has fired."""
    live = [i for i, b in cluster.brokers.items() if b.alive()]
    agreed = recorded_leaders(cluster, QUEUE)
    for via in live:
        eventually(lambda via=via: leaders(cluster, via) == agreed, what=f"broker {via}'s view agreeing with ZooKeeper")
    for p, leader in agreed.items():
        serving = []
        for i in live:
            with cluster.connect(i) as hw:
                try:
                    hw.service.fetch(QUEUE, p, 0, max_bytes=64)
                    serving.append(i)
                except NotLeaderError:
                    pass
        assert serving == [leader], f"partition {p} is served by {serving}, led by {leader}"


def test_the_controller_killed_mid_move_each_move_finishes_or_rolls_back(cluster):
    sender = start_queue(cluster, messages=400)
    cluster.start(3)
    eventually(lambda: cluster.status(1)["brokers"] == [1, 2, 3], what="broker 3 joining")
    ctrl = cluster.controller()
    assert ctrl in (1, 2)
    other = 3 - ctrl
    cluster.brokers[3].pause()  # its copies wait: the moves to it are mid-copy when the controller dies
    background = threading.Thread(target=sender.run_until_stopped)
    background.start()
    try:
        planned = plan(cluster, "decommission", broker_id=other)
        assert planned and {m.source for m in planned} == {other}
        eventually(lambda: ("copy", 3) in move_phases(cluster, QUEUE).values(), what="a copy to broker 3")
        cluster.brokers[ctrl].kill()
        cluster.brokers[3].resume()
        eventually(lambda: moves_left(cluster) == 0, timeout_s=60, what="every move finished or rolled back")
        cluster.start(ctrl)
        eventually(lambda: cluster.status(3)["brokers"] == [1, 2, 3], what=f"broker {ctrl} back")
        time.sleep(0.5)
    finally:
        sender.stop.set()
        background.join(120)
    final = recorded_leaders(cluster, QUEUE)
    assert any(final[m.partition] == 3 for m in planned if m.target == 3)  # continued by the new controller
    one_server_each(cluster)
    sender.check()


def test_the_target_killed_mid_copy_the_move_rolls_back_and_the_source_serves(cluster):
    sender = start_queue(cluster, messages=400)
    # paused, broker 3 holds its copy until its session ends (then the move rolls back): the
    # longest session the test ZooKeeper gives leaves the status commands time to see it
    cluster.start(3, "--set", "zookeeper_session_timeout_s=4")
    eventually(lambda: cluster.status(1)["brokers"] == [1, 2, 3], what="broker 3 joining")
    cluster.brokers[3].pause()
    (move,) = plan(cluster, "rebalance")
    eventually(lambda: move_phases(cluster, QUEUE).get(move.partition) == ("copy", 3), what="the copy starting")
    moving = {"queue": QUEUE, "partition": move.partition, "source": move.source, "target": 3, "phase": "copy"}

    def statuses() -> str | None:  # both at once: the window is a few seconds
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            text, as_json = pool.map(lambda args: cli(cluster, *args).stdout, [("status",), ("status", "--json")])
        return text if json.loads(as_json)["moves"] == [moving] else None

    assert "1 partition move(s) not finished" in eventually(statuses, what="status")
    cluster.brokers[3].kill()
    eventually(lambda: moves_left(cluster) == 0, timeout_s=30, what="the rollback")
    assert leaders(cluster, 1)[move.partition] == move.source
    for _ in range(5):
        sender.send_one(move.partition)  # the source takes sends again
    cluster.start(3)
    eventually(lambda: cluster.status(1)["brokers"] == [1, 2, 3], what="broker 3 back")

    async def rebalance_async() -> list[PartitionMove]:  # the asyncio client's twin
        async with await headwater.aio.connect(cluster.address(2)) as hw:
            assert await hw.admin.rebalance(dry_run=True) == [move]
            return await hw.admin.rebalance()

    (again,) = asyncio.run(rebalance_async())
    eventually(lambda: moves_left(cluster) == 0, timeout_s=30, what="the move done")
    assert recorded_leaders(cluster, QUEUE)[again.partition] == 3, ended_moves(cluster)
    one_server_each(cluster)
    sender.check()


def test_the_controller_paused_past_its_session_mid_move_changes_nothing_when_it_wakes(cluster):
    sender = start_queue(cluster, messages=400)
    cluster.start(3)
    eventually(lambda: cluster.status(1)["brokers"] == [1, 2, 3], what="broker 3 joining")
    ctrl = cluster.controller()
    epoch = cluster.status(ctrl)["controller_epoch"]
    other = 3 - ctrl
    cluster.brokers[3].pause()
    background = threading.Thread(target=sender.run_until_stopped)
    background.start()
    try:
        planned = plan(cluster, "decommission", broker_id=other)
        eventually(lambda: ("copy", 3) in move_phases(cluster, QUEUE).values(), what="a copy to broker 3")
        cluster.brokers[ctrl].pause()  # SIGSTOP: its session expires while it sleeps
        cluster.brokers[3].resume()
        eventually(lambda: (c := cluster.status(other)["controller"]) not in (-1, ctrl) and c, what="a new controller")
        eventually(lambda: moves_left(cluster) == 0, timeout_s=60, what="every move finished or rolled back")
        cluster.brokers[ctrl].resume()  # it wakes believing it controls: its writes are fenced
        eventually(lambda: cluster.status(ctrl)["brokers"] == [1, 2, 3], what=f"broker {ctrl} registered again")
        time.sleep(1)
    finally:
        sender.stop.set()
        background.join(120)
    assert cluster.status(other)["controller_epoch"] > epoch
    final = recorded_leaders(cluster, QUEUE)
    assert any(final[m.partition] == 3 for m in planned if m.target == 3)
    assert moves_left(cluster) == 0
    one_server_each(cluster)
    sender.check()


def test_a_partition_moves_back_to_a_broker_that_held_it_before(cluster):
    """Broker 1 held partitions and dropped them when they moved to 2; broker 2 took more
    messages. Moved back (`cluster decommission 2`), broker 1 serves again what it kept,
    which broker 2's log agrees with, and copies only what is new: every move switches,
    the CLI exits 0, and every message is served by broker 1."""
    sender = start_queue(cluster, messages=400)
    on_1 = [p for p, b in leaders(cluster, 2).items() if b == 1]
    assert on_1 and plan(cluster, "decommission", broker_id=1)
    eventually(lambda: moves_left(cluster) == 0, timeout_s=60, what="the moves to broker 2")
    for via in (1, 2):  # each broker's view follows ZooKeeper a moment later
        eventually(lambda via=via: set(leaders(cluster, via).values()) == {2}, what=f"broker {via} seeing the moves")
    for p in on_1:
        eventually(lambda p=p: dropped(cluster, 1, p), what=f"broker 1 dropping {p}")
    with cluster.connect(1) as hw:
        held = {p: hw.admin.describe_queue(QUEUE).partitions[p].end_offset for p in on_1}
    for i in range(40):  # broker 2's logs grow past what broker 1 held
        sender.send_one(i % 4)
    # everything back to broker 1, through the CLI, which waits and says what became of each
    done = subprocess.run(
        [HEADWATER, "--server", cluster.address(2), "cluster", "decommission", "2", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, (done.stdout, done.stderr)
    ended = {o["partition"]: o for o in json.loads(done.stdout)["outcome"]}
    assert set(ended) == {0, 1, 2, 3}
    assert all(o["outcome"] == "moved" and o["leader"] == 1 for o in ended.values()), ended
    eventually(lambda: moves_left(cluster) == 0, timeout_s=60, what="the moves back ending")
    for via in (1, 2):
        eventually(lambda via=via: set(leaders(cluster, via).values()) == {1}, what=f"broker {via} seeing them back")
    with cluster.connect(1) as hw:
        parts = hw.admin.describe_queue(QUEUE).partitions
    for p in on_1:
        assert parts[p].start_offset == 0 and parts[p].end_offset > held[p]  # its own, then the new ones
    assert "serving again from offset 0 what this broker kept" in cluster.brokers[1].log.read_text()
    sender.check()  # nothing acknowledged was lost, nothing served twice


def test_with_auto_rebalance_a_joining_broker_gets_partitions_by_itself(zk_server, tmp_path):
    """auto_rebalance_after_s (off by default): once the live brokers have been the same that
    long, the controller plans the rebalance itself."""
    auto = Cluster(zk_server, tmp_path, 2, "--set", "auto_rebalance_after_s=1")
    try:
        auto.controller()
        with auto.connect(1) as hw:
            hw.admin.create_queue(QUEUE, partitions=4)
        auto.start(3)
        eventually(lambda: 3 in _leaders_of(auto).values(), timeout_s=60, what="partitions moving to broker 3")
        eventually(lambda: moves_left(auto) == 0, timeout_s=60, what="the moves finishing")
        assert sorted(Counter(_leaders_of(auto).values()).values()) == [1, 1, 2]  # balanced over three
    finally:
        auto.stop()


def _leaders_of(c: Cluster) -> dict[int, int]:
    with c.connect(1) as hw:
        return {p.partition: p.leader for p in hw.admin.cluster_metadata([QUEUE]).queue(QUEUE).partitions}
