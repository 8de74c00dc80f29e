"""The coordination contract (``headwater.cluster.coordination``), on a real ZooKeeper (Debian's
package, started here) and on the in-memory ensemble of ``headwater.testing``: the same tests,
so that what the cluster's simulation tests learn on the fake holds on ZooKeeper."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from headwater.cluster.coordination import (
    BadVersionError,
    Check,
    CoordinationUnavailableError,
    Create,
    Delete,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    SessionState,
    Set,
    TransactionFailedError,
)
from tests.support.broker_process import free_port


def eventually(check: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "the condition did not come about in time"
        time.sleep(0.02)


def test_create_get_set_delete_with_versions(service):
    c = service.connect()
    path = f"{service.root}/a"
    assert c.create(path, b"one") == path
    data, stat = c.get(path)
    assert data == b"one" and stat.version == 0 and stat.ephemeral_owner == 0
    with pytest.raises(NodeExistsError):
        c.create(path, b"again")
    assert c.set(path, b"two", version=0).version == 1
    with pytest.raises(BadVersionError):  # someone wrote it since version 0 was read
        c.set(path, b"stale", version=0)
    assert c.get(path)[0] == b"two"
    with pytest.raises(BadVersionError):
        c.delete(path, version=0)
    c.delete(path, version=1)
    assert c.exists(path) is None
    with pytest.raises(NoNodeError):
        c.get(path)
    with pytest.raises(NoNodeError):  # no parent
        c.create(f"{service.root}/x/y")
    assert c.create(f"{service.root}/x/y", makepath=True) == f"{service.root}/x/y"
    with pytest.raises(NotEmptyError):
        c.delete(f"{service.root}/x")


def test_creation_zxids_order_creations_and_children_are_sorted(service):
    c = service.connect()
    for name in ("b", "c", "a"):
        c.create(f"{service.root}/{name}")
    zxids = [c.get(f"{service.root}/{n}")[1].created_zxid for n in ("b", "c", "a")]
    assert zxids == sorted(zxids) and len(set(zxids)) == 3
    assert c.children(service.root) == ["a", "b", "c"]
    seq = [c.create(f"{service.root}/s-", sequential=True) for _ in range(3)]
    assert seq == sorted(seq) and all(p.startswith(f"{service.root}/s-") for p in seq)


def test_ephemeral_nodes_go_with_their_session_and_the_session_comes_back(service):
    a, b = service.connect(), service.connect()
    states: list[SessionState] = []
    a.on_session(states.append)
    path = f"{service.root}/member"
    a.create(path, b"a", ephemeral=True)
    assert b.get(path)[1].ephemeral_owner == a.session_id
    with pytest.raises(NodeExistsError):  # held by a live session
        b.create(path, b"b", ephemeral=True)
    old_id = a.session_id
    service.expire(a)
    eventually(lambda: b.exists(path) is None)
    eventually(lambda: SessionState.LOST in states and states[-1] is SessionState.CONNECTED)
    eventually(lambda: a.session_id not in (0, old_id))  # a new session, as kazoo makes
    b.create(path, b"b", ephemeral=True)  # now free to take
    b.close()
    eventually(lambda: a.exists(path) is None)


def test_a_transaction_applies_all_or_nothing(service):
    c = service.connect()
    epoch = f"{service.root}/epoch"
    c.create(epoch, b"1")
    c.commit([Check(epoch, 0), Create(f"{service.root}/q", b"x"), Set(epoch, b"2", 0)])
    assert c.get(epoch) == (b"2", c.get(epoch)[1]) and c.get(epoch)[1].version == 1
    # a stale writer (it read version 0) changes nothing, however many ops it tried
    with pytest.raises(TransactionFailedError) as failed:
        c.commit([Check(epoch, 0), Set(f"{service.root}/q", b"stale"), Delete(f"{service.root}/q")])
    assert failed.value.index == 0 and isinstance(failed.value.cause, BadVersionError)
    assert c.get(f"{service.root}/q")[0] == b"x"
    # the failing op may come last: the ones before it are undone too
    with pytest.raises(TransactionFailedError) as failed:
        c.commit([Create(f"{service.root}/r"), Set(epoch, b"3"), Create(f"{service.root}/q")])
    assert failed.value.index == 2 and isinstance(failed.value.cause, NodeExistsError)
    assert c.exists(f"{service.root}/r") is None and c.get(epoch)[0] == b"2"


def test_watches_follow_data_and_children(service):
    c, writer = service.connect(), service.connect()
    path = f"{service.root}/w"
    seen_data: list[bytes | None] = []
    seen_children: list[list[str]] = []
    lock = threading.Lock()

    def on_data(data, stat):
        with lock:
            seen_data.append(data)

    def on_children(names):
        with lock:
            seen_children.append(names)

    c.watch_data(path, on_data)
    c.watch_children(path, on_children)
    eventually(lambda: seen_data == [None] and seen_children == [[]])
    writer.create(path, b"v1")
    eventually(lambda: seen_data[-1] == b"v1")
    writer.set(path, b"v2")
    eventually(lambda: seen_data[-1] == b"v2")
    writer.create(f"{path}/k1")
    writer.create(f"{path}/k2")
    eventually(lambda: seen_children[-1] == ["k1", "k2"])
    writer.delete(f"{path}/k1")
    eventually(lambda: seen_children[-1] == ["k2"])
    writer.delete(f"{path}/k2")
    writer.delete(path)
    eventually(lambda: seen_data[-1] is None and seen_children[-1] == [])
    writer.create(path, b"again")  # a new life of the node: followed as well
    writer.create(f"{path}/k3")
    eventually(lambda: seen_data[-1] == b"again" and seen_children[-1] == ["k3"])


def test_an_unreachable_service_is_a_clear_error_not_a_hang():
    from headwater.cluster.zookeeper import ZooKeeperCoordination

    hosts = f"127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    with pytest.raises(CoordinationUnavailableError, match=rf"no ZooKeeper session with {hosts} within 1 s"):
        ZooKeeperCoordination(hosts, connect_timeout_s=1.0)
    assert time.monotonic() - t0 < 5
