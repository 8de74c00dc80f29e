"""The broker's metadata cache (``headwater.cluster.metadata``) following the tree, on a real
ZooKeeper (Debian's package, started here) and on the in-memory ensemble, as the coordination
contract runs: brokers come and go, queues are created and deleted in one commit, leaders
change, bad records are left out, and a new session reads everything again."""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterator

import pytest

from headwater.cluster.coordination import Coordination, Create, Delete, SessionLostError
from headwater.cluster.metadata import ClusterView, MetadataCache
from headwater.cluster.records import (
    BrokerRecord,
    ControllerRecord,
    MoveRecord,
    PartitionRecord,
    QueueRecord,
    encode,
    paths,
)
from headwater.testing.coordination import MemoryEnsemble
from tests.support.waiting import wait_for as eventually

WAIT_S = 20.0  # generous: a slow machine is slow, not wrong


@pytest.fixture
def started() -> Iterator[Callable[[Coordination], MetadataCache]]:
    caches: list[MetadataCache] = []

    def start(coord: Coordination) -> MetadataCache:
        caches.append(MetadataCache(coord))
        caches[-1].start()
        return caches[-1]

    yield start
    for c in caches:
        c.close()


def broker_record(broker_id: int, record_id: int | None = None) -> bytes:
    return encode(
        BrokerRecord(
            broker_id=broker_id if record_id is None else record_id,
            host="127.0.0.1",
            port=9000 + broker_id,
            version="test",
            started_ms=0,
            store_id=f"store-{broker_id}",
        )
    )


def register(coord: Coordination, broker_id: int) -> None:
    coord.create(paths.broker(broker_id), broker_record(broker_id), ephemeral=True, makepath=True)


def partition_record(replicas: list[int], leader_epoch: int = 0) -> bytes:
    return encode(PartitionRecord(replicas=replicas, leader=replicas[0], leader_epoch=leader_epoch, controller_epoch=1))


def queue_ops(name: str, placement: list[list[int]]) -> list[Create]:
    """The ops that create a queue with its partitions, as the controller's one commit does."""
    record = QueueRecord(queue_id=7, config={"partitions": len(placement)}, created_ms=0, controller_epoch=1)
    return [
        Create(paths.queue(name), encode(record)),
        Create(paths.partitions(name)),
        *(Create(paths.partition(name, n), partition_record(r)) for n, r in enumerate(placement)),
    ]


def delete_queue_ops(name: str, partitions: int) -> list[Delete]:
    return [
        *(Delete(paths.partition(name, n)) for n in range(partitions)),
        Delete(paths.partitions(name)),
        Delete(paths.queue(name)),
    ]


def test_brokers_join_and_leave_with_their_epochs(service, started):
    cache = started(service.connect())
    assert cache.view == ClusterView()  # no /brokers yet: nothing, and no error
    a, b, writer = service.connect(), service.connect(), service.connect()
    register(a, 1)
    register(b, 2)
    view = cache.wait_for(lambda v: set(v.brokers) == {1, 2}, WAIT_S, "brokers 1 and 2")
    first_epoch = writer.get(paths.broker(1))[1].created_zxid
    assert view.brokers[1].epoch == first_epoch and view.brokers[1].record.store_id == "store-1"
    assert view.broker_address(2) == "127.0.0.1:9002" and view.broker_address(3) is None
    b.close()
    cache.wait_for(lambda v: set(v.brokers) == {1}, WAIT_S, "broker 2 gone with its session")
    service.expire(a)
    cache.wait_for(lambda v: not v.brokers, WAIT_S, "broker 1 gone with its expired session")
    register(writer, 1)  # registered again: a new broker epoch
    view = cache.wait_for(lambda v: 1 in v.brokers, WAIT_S, "broker 1 back")
    assert view.brokers[1].epoch > first_epoch


def test_a_queue_appears_whole_follows_its_leader_and_leaves_whole(service, started):
    cache = started(service.connect())
    views: list[ClusterView] = []
    cache.on_change(views.append)
    writer = service.connect()
    writer.create(paths.QUEUES)
    writer.commit(queue_ops("orders", [[1], [2], [1]]))
    view = cache.wait_for(lambda v: "orders" in v.queues, WAIT_S, "queue orders")
    assert sorted(view.queues["orders"].partitions) == [0, 1, 2]
    assert view.leader("orders", 1) == 2 and view.leader_epoch("orders", 1) == 0
    assert view.leader("orders", 3) is None and view.leader("nothing", 0) is None
    assert view.assignment() == {("orders", 0): [1], ("orders", 1): [2], ("orders", 2): [1]}
    assert view.partitions_of(1) == [("orders", 0), ("orders", 2)] and view.partitions_of(9) == []

    writer.set(paths.partition("orders", 1), partition_record([3], leader_epoch=1))
    view = cache.wait_for(lambda v: v.leader("orders", 1) == 3, WAIT_S, "orders/1 led by broker 3")
    assert view.leader_epoch("orders", 1) == 1

    writer.commit(delete_queue_ops("orders", 3))
    cache.wait_for(lambda v: "orders" not in v.queues, WAIT_S, "queue orders deleted")
    writer.commit(queue_ops("orders", [[4], [5], [4]]))  # a new life of the name, on watches set before
    view = cache.wait_for(lambda v: "orders" in v.queues, WAIT_S, "queue orders again")
    assert view.assignment() == {("orders", 0): [4], ("orders", 1): [5], ("orders", 2): [4]}
    with_orders = [v.queues["orders"] for v in views if "orders" in v.queues]
    assert {len(q.partitions) for q in with_orders} == {3}  # never part of a queue: one commit, one view


def test_a_controller_and_a_move_appear_and_go(service, started):
    cache = started(service.connect())
    writer = service.connect()
    writer.create(paths.CONTROLLER, encode(ControllerRecord(broker_id=2, epoch=5)), ephemeral=True)
    view = cache.wait_for(lambda v: v.controller is not None, WAIT_S, "a controller")
    assert view.controller == ControllerRecord(broker_id=2, epoch=5)
    move = MoveRecord(source=1, target=2, phase="copy", started_ms=0, controller_epoch=5)
    writer.create(paths.move("orders", 0), encode(move), makepath=True)
    view = cache.wait_for(lambda v: bool(v.moves), WAIT_S, "a move")
    assert dict(view.moves) == {("orders", 0): move}
    writer.delete(paths.move("orders", 0))
    cache.wait_for(lambda v: not v.moves, WAIT_S, "the move finished")
    writer.close()
    cache.wait_for(lambda v: v.controller is None, WAIT_S, "the controller gone with its session")


def test_a_bad_record_is_left_out_and_logged_once_with_its_path(service, started, caplog):
    caplog.set_level(logging.WARNING, logger="headwater.cluster.metadata")
    cache = started(service.connect())
    writer = service.connect()
    register(writer, 1)
    writer.create(paths.broker(2), b"not json", ephemeral=True)
    writer.create(paths.broker(3), broker_record(3, record_id=4), ephemeral=True)  # another broker's record
    writer.create(f"{paths.BROKERS}/x", broker_record(5))
    writer.create(paths.queue("bad"), b"{}", makepath=True)
    writer.commit(queue_ops("good", [[1], [1]]) + [Create(paths.partition("good", 2), b"[1]")])
    cache.wait_for(lambda v: "good" in v.queues, WAIT_S, "queue good")
    register(writer, 6)  # more changes: the bad nodes are looked at again, and not logged again
    writer.set(paths.partition("good", 0), partition_record([6]))
    view = cache.wait_for(lambda v: 6 in v.brokers and v.leader("good", 0) == 6, WAIT_S, "broker 6 leading good/0")
    assert set(view.brokers) == {1, 6} and set(view.queues) == {"good"}
    assert sorted(view.queues["good"].partitions) == [0, 1]
    for path in ("/brokers/2", "/brokers/3", "/brokers/x", "/queues/bad", "/queues/good/p/2"):
        logged = [r for r in caplog.records if path in r.getMessage()]
        assert len(logged) == 1, (path, [r.getMessage() for r in caplog.records])
    writer.set(paths.broker(2), broker_record(2))  # mended: it joins the view
    cache.wait_for(lambda v: 2 in v.brokers, WAIT_S, "broker 2 mended")


def test_waiting_in_vain_names_what_it_waited_for(service, started):
    cache = started(service.connect())

    def broker_seven_is_up(view: ClusterView) -> bool:
        return 7 in view.brokers

    with pytest.raises(
        TimeoutError, match=r"did not show broker 7 within 0.2 s; it shows brokers \[\], controller none"
    ):
        cache.wait_for(lambda v: 7 in v.brokers, 0.2, "broker 7")
    with pytest.raises(TimeoutError, match="did not show broker_seven_is_up within 0.1 s"):
        cache.wait_for(broker_seven_is_up, 0.1)


def test_changes_made_while_the_session_was_expired_are_seen(service, started):
    coord = service.connect()
    cache = started(coord)
    writer, member = service.connect(), service.connect()
    writer.create(paths.QUEUES)
    writer.commit(queue_ops("old", [[1]]))
    register(member, 1)
    cache.wait_for(lambda v: "old" in v.queues and 1 in v.brokers, WAIT_S, "queue old and broker 1")
    first = coord.session_id
    service.expire(coord)
    writer.commit(delete_queue_ops("old", 1))
    writer.commit(queue_ops("new", [[2], [1]]))
    member.close()
    register(writer, 2)
    view = cache.wait_for(
        lambda v: set(v.queues) == {"new"} and set(v.brokers) == {2}, WAIT_S, "queue new and broker 2 only"
    )
    assert view.leader("new", 0) == 2
    assert coord.session_id != first  # it was a new session that read them


class Deafened:
    """A session whose watch events can be lost, as they may be while a session is gone, and
    whose session events are held meanwhile: what is seen afterwards came from reading again.
    It counts the watches set on each node."""

    def __init__(self, inner: Coordination) -> None:
        self.inner, self.deaf, self.held, self.unreadable = inner, False, [], False
        self.watches: Counter[tuple[str, str]] = Counter()
        self.lock = threading.Lock()

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def get(self, path):
        if self.unreadable:
            raise SessionLostError("the connection dropped", path)
        return self.inner.get(path)

    def watch_data(self, path, callback):
        self.watches["data", path] += 1
        self.inner.watch_data(path, lambda data, stat: None if self.deaf else callback(data, stat))

    def watch_children(self, path, callback):
        self.watches["children", path] += 1
        self.inner.watch_children(path, lambda names: None if self.deaf else callback(names))

    def on_session(self, callback):
        def hear(state):
            with self.lock:
                if self.deaf:
                    self.held.append((callback, state))
                    return
            callback(state)

        self.inner.on_session(hear)

    def drain(self):
        """Wait until the session's thread has run the events queued so far (they run in
        order: a new watch's first call comes after them)."""
        done = threading.Event()
        self.inner.watch_data("/drained", lambda data, stat: done.set())
        assert done.wait(WAIT_S), "the session's events did not run"

    def hear_again(self):
        self.drain()  # what was missed stays missed
        with self.lock:
            self.deaf, held, self.held = False, self.held, []
        for callback, state in held:
            callback(state)


def test_a_new_session_reads_the_whole_tree_again_whatever_the_watches_missed(started):
    ensemble = MemoryEnsemble()
    inner = ensemble.connect()
    follower = Deafened(inner)
    cache = started(follower)
    writer = ensemble.connect()
    writer.create(paths.QUEUES)
    writer.commit(queue_ops("old", [[1]]))
    cache.wait_for(lambda v: "old" in v.queues, WAIT_S, "queue old")
    follower.deaf = True
    ensemble.expire(inner.session_id)
    writer.commit(delete_queue_ops("old", 1))
    writer.commit(queue_ops("new", [[2]]))
    register(writer, 2)
    follower.hear_again()  # LOST, then CONNECTED: the missed changes are read
    cache.wait_for(lambda v: set(v.queues) == {"new"} and set(v.brokers) == {2}, WAIT_S, "what the watches missed")
    writer.commit(delete_queue_ops("new", 1))  # and the watches go on as before
    writer.commit(queue_ops("new", [[3]]))
    cache.wait_for(lambda v: v.leader("new", 0) == 3, WAIT_S, "queue new again, on broker 3")
    assert max(follower.watches.values()) == 1  # one watch a node, however often it came and went


def test_a_read_that_failed_is_made_good_by_reading_everything_at_the_next_event(started, caplog):
    ensemble = MemoryEnsemble()
    follower = Deafened(ensemble.connect())
    cache = started(follower)
    writer = ensemble.connect()
    register(writer, 1)
    cache.wait_for(lambda v: 1 in v.brokers, WAIT_S, "broker 1")
    follower.unreadable = True
    writer.set(paths.broker(1), broker_record(1, record_id=1).replace(b"test", b"v2"))
    follower.drain()  # the change's event came, and its read failed
    assert cache.view.brokers[1].record.version == "test"
    follower.unreadable = False
    register(writer, 2)  # the next event reads the whole tree: the change missed is in it
    view = cache.wait_for(lambda v: 2 in v.brokers, WAIT_S, "broker 2")
    assert view.brokers[1].record.version == "v2"
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]  # a lost read is no error


def test_callbacks_see_views_in_order_after_the_view_shows_them(service, started, caplog):
    cache = started(service.connect())
    seen: list[tuple[ClusterView, ClusterView]] = []

    def broken(view: ClusterView) -> None:
        raise RuntimeError("a broken callback")

    cache.on_change(broken)  # logged; the next callback still runs
    cache.on_change(lambda view: seen.append((view, cache.view)))
    writer = service.connect()
    for broker_id in range(1, 6):
        register(writer, broker_id)
    cache.wait_for(lambda v: len(v.brokers) == 5, WAIT_S, "5 brokers")
    eventually(lambda: seen and len(seen[-1][0].brokers) == 5, WAIT_S, "the callback to hear of 5 brokers")
    counts = [len(given.brokers) for given, _ in seen]
    assert counts == sorted(counts)
    assert all(set(given.brokers) <= set(now.brokers) for given, now in seen)
    assert any("a change callback failed" in r.getMessage() for r in caplog.records)


def test_the_coordinator_partition_is_the_same_in_every_process():
    assert ClusterView.coordinator_partition("billing", 50) == 26  # crc32, not the salted hash()
    assert ClusterView.coordinator_partition("billing", 1) == 0
    spread = Counter(ClusterView.coordinator_partition(f"group-{i}", 10) for i in range(1000))
    assert set(spread) == set(range(10))
    with pytest.raises(ValueError, match="at least 1 partition"):
        ClusterView.coordinator_partition("billing", 0)
