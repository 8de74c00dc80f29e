"""Membership of a cluster (docs/design/cluster.md, step 2): the cluster's identity, the broker's
registration and its epoch, and the refusals. The rules run on the in-memory ensemble; then
real brokers (``headwater serve --zookeeper``) run against a real ZooKeeper, killed with
SIGKILL and paused with SIGSTOP, as an operator's would be."""

from __future__ import annotations

import asyncio
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import headwater
from headwater.cluster.coordination import Coordination
from headwater.cluster.membership import (
    CLUSTER_FILE,
    BrokerIdTakenError,
    ClusterIdentityError,
    DataIdentity,
    Membership,
    ZooKeeperAddress,
)
from headwater.cluster.records import BrokerRecord, ClusterRecord, decode, encode, paths
from headwater.errors import InvalidArgumentError
from headwater.testing.coordination import MemoryEnsemble
from tests.support.broker_process import HEADWATER, BrokerProcess, free_port


def eventually(check: Callable[[], object], timeout_s: float = 15.0, what: str = "the condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"{what} did not come about within {timeout_s} s"
        time.sleep(0.02)


# -- the rules, on the in-memory ensemble -------------------------------------------------


def test_a_zookeeper_address_is_servers_and_a_chroot():
    assert ZooKeeperAddress.parse("127.0.0.1:2181") == ZooKeeperAddress("127.0.0.1:2181", "/headwater")
    assert ZooKeeperAddress.parse("a:1,b:2/prod/hw/") == ZooKeeperAddress("a:1,b:2", "/prod/hw")
    assert str(ZooKeeperAddress.parse("zk:2181")) == "zk:2181/headwater"
    for bad, says in [
        ("", "names no server"),
        ("/x", "names no server"),
        ("zk", "is not HOST:PORT"),
        ("zk:0", "is not HOST:PORT"),
        ("zk:2181,:1", "is not HOST:PORT"),
        ("http://zk:2181", "has a scheme"),
        ("zk:2181/", "must be a path"),
        ("zk:2181/a/../b", "must be a path"),
    ]:
        with pytest.raises(InvalidArgumentError, match=says):
            ZooKeeperAddress.parse(bad)


def _member(
    coord: Coordination, data: Path, broker_id: int = 1, store_id: str = "s1", port: int = 7071, stale_wait_s=5.0
) -> Membership:
    data.mkdir(parents=True, exist_ok=True)
    record = BrokerRecord(
        broker_id=broker_id, host="127.0.0.1", port=port, version="test", started_ms=0, store_id=store_id
    )
    return Membership(
        coord, where="memory/headwater", record=record, data_dir=data, session_timeout_s=1.0, stale_wait_s=stale_wait_s
    )


def test_the_first_broker_makes_the_cluster_and_registers_at_an_epoch(tmp_path):
    ensemble = MemoryEnsemble()
    coord = ensemble.connect()
    m = _member(coord, tmp_path / "b1")
    m.join()
    cluster = decode(coord.get(paths.CLUSTER)[0], ClusterRecord, paths.CLUSTER)
    raw, stat = coord.get(paths.broker(1))
    assert decode(raw, BrokerRecord, "") == m.record and stat.ephemeral_owner == coord.session_id
    assert m.active and m.epoch == stat.created_zxid > 0 and m.cluster_id == cluster.cluster_id
    assert DataIdentity.read(tmp_path / "b1") == DataIdentity(cluster_id=cluster.cluster_id, broker_id=1)
    assert m.status() == {
        "cluster_id": cluster.cluster_id,
        "broker_id": 1,
        "broker_epoch": stat.created_zxid,
        "zookeeper": "memory/headwater",
        "active": True,
    }
    # a second broker joins the same cluster, at a later epoch
    m2 = _member(ensemble.connect(), tmp_path / "b2", broker_id=2, store_id="s2")
    m2.join()
    assert m2.cluster_id == m.cluster_id and m2.epoch > m.epoch
    m.leave()
    assert coord.exists(paths.broker(1)) is None and not m.active  # gone at once, not after a timeout


def test_a_second_broker_with_the_same_id_is_refused_and_the_directory_is_left_as_it_was(tmp_path):
    ensemble = MemoryEnsemble()
    _member(ensemble.connect(), tmp_path / "b1").join()
    other = _member(ensemble.connect(), tmp_path / "other", store_id="s2", port=7072)
    with pytest.raises(BrokerIdTakenError, match=r"broker id 1 is already registered .* by 127\.0\.0\.1:7071"):
        other.join()
    assert not (tmp_path / "other" / CLUSTER_FILE).exists() and not other.active


def test_a_restarted_broker_waits_for_its_previous_registration_to_expire(tmp_path):
    ensemble = MemoryEnsemble()
    old = ensemble.connect()
    first = _member(old, tmp_path / "b1")
    first.join()
    first._closed = True  # the process is SIGKILLed: it hears nothing more, its session lingers
    again = _member(ensemble.connect(), tmp_path / "b1")  # the same directory, a new process
    joined = threading.Event()
    threading.Thread(target=lambda: (again.join(), joined.set()), daemon=True).start()
    assert not joined.wait(0.5)  # the old session still holds the registration: wait
    ensemble.expire(old.session_id)  # as ZooKeeper does a session timeout after the SIGKILL
    assert joined.wait(5)
    assert again.active and again.epoch > first.epoch


def test_a_restart_gives_up_when_the_old_registration_never_goes(tmp_path):
    ensemble = MemoryEnsemble()
    _member(ensemble.connect(), tmp_path / "b1").join()
    again = _member(ensemble.connect(), tmp_path / "b1", stale_wait_s=0.3)
    with pytest.raises(BrokerIdTakenError, match="still registered by this data directory's previous process"):
        again.join()


def test_a_directory_of_another_cluster_or_broker_is_refused(tmp_path):
    data = tmp_path / "b1"
    data.mkdir()
    DataIdentity(cluster_id="aaaa", broker_id=1).write(data)
    empty = MemoryEnsemble()  # a wrong chroot: no cluster there at all
    with pytest.raises(ClusterIdentityError, match="belongs to cluster aaaa, but ZooKeeper at .* holds no cluster"):
        _member(empty.connect(), data).join()
    assert empty.connect().exists(paths.CLUSTER) is None  # refused before making anything
    other = MemoryEnsemble()
    other.connect().create(paths.CLUSTER, encode(ClusterRecord(cluster_id="bbbb")))
    with pytest.raises(ClusterIdentityError, match="belongs to cluster aaaa, but ZooKeeper at .* holds cluster bbbb"):
        _member(other.connect(), data).join()
    with pytest.raises(ClusterIdentityError, match="belongs to broker 1, not broker 2: start it with --broker-id 1"):
        _member(other.connect(), data, broker_id=2).join()
    (data / CLUSTER_FILE).write_bytes(b"{not json")
    with pytest.raises(ClusterIdentityError, match="cluster.json is damaged"):
        _member(other.connect(), data).join()


def test_a_cluster_of_a_newer_format_is_refused(tmp_path):
    ensemble = MemoryEnsemble()
    ensemble.connect().create(paths.CLUSTER, encode(ClusterRecord(cluster_id="cccc", format_version=99)))
    with pytest.raises(ClusterIdentityError, match="has format 99, newer than this broker knows"):
        _member(ensemble.connect(), tmp_path / "b1").join()


def test_a_lost_session_stops_the_broker_acting_until_it_registers_again(tmp_path):
    ensemble = MemoryEnsemble()
    coord = ensemble.connect()
    m = _member(coord, tmp_path / "b1")
    changes: list[tuple[bool, int]] = []
    m.on_change(lambda active, epoch: changes.append((active, epoch)))
    m.join()
    first = m.epoch
    ensemble.expire(coord.session_id)
    eventually(lambda: m.active and m.epoch != first, what="registering again")
    assert changes[0] == (True, first) and (False, 0) in changes and changes[-1] == (True, m.epoch)
    assert m.epoch > first and coord.get(paths.broker(1))[1].ephemeral_owner == coord.session_id


# -- real brokers, real ZooKeeper ---------------------------------------------------------


_chroots = iter(range(1_000_000))


@pytest.fixture
def zk(zk_server) -> str:
    """A chroot of its own for each test: a cluster of its own."""
    return f"{zk_server.hosts}/membership{next(_chroots)}"


@pytest.fixture
def zk_session(zk) -> Iterator[Coordination]:
    from headwater.cluster.zookeeper import ZooKeeperCoordination

    c = ZooKeeperCoordination(zk)
    yield c
    c.close()


def _broker(tmp_path: Path, zk: str, broker_id: int, name: str | None = None, *extra: str) -> BrokerProcess:
    return BrokerProcess(
        tmp_path / (name or f"b{broker_id}"),
        "--zookeeper",
        zk,
        "--broker-id",
        str(broker_id),
        "--set",
        "zookeeper_session_timeout_s=1",
        *extra,
    )


def _cluster_status(b: BrokerProcess) -> dict:
    with headwater.connect(b.address) as hw:
        return hw.status()["cluster"]  # type: ignore[return-value]  # status() is a dict of plain values


def _serve_fails(tmp_path: Path, *args: str, timeout_s: float = 30.0) -> str:
    """Run ``headwater serve`` expecting it to refuse to start: its error line."""
    done = subprocess.run(
        [HEADWATER, "serve", "--host", "127.0.0.1", "--port", "0", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=tmp_path,
    )
    assert done.returncode == 1, done.stderr[-2000:]
    return [line for line in done.stderr.splitlines() if line.startswith("error:")][-1]


def test_a_broker_registers_its_address_and_leaves_at_once_when_stopped(tmp_path, zk, zk_session):
    b = _broker(tmp_path, zk, 1).start()
    try:
        raw, stat = zk_session.get(paths.broker(1))
        record = decode(raw, BrokerRecord, paths.broker(1))
        assert record.address == b.address and record.version == headwater.__version__
        status = _cluster_status(b)
        assert status["active"] and status["broker_epoch"] == stat.created_zxid and status["broker_id"] == 1
        assert status["zookeeper"] == zk
        cluster = decode(zk_session.get(paths.CLUSTER)[0], ClusterRecord, paths.CLUSTER)
        assert DataIdentity.read(b.data) == DataIdentity(cluster_id=cluster.cluster_id, broker_id=1)
        shown = subprocess.run(
            [HEADWATER, "--server", b.address, "status"], capture_output=True, text=True, timeout=30, check=True
        ).stdout
        assert f"broker 1 of cluster {cluster.cluster_id[:12]}, epoch {stat.created_zxid}" in shown
        # a broker serves as before: membership changes nothing of the single-broker API
        with headwater.connect(b.address) as hw:
            hw.admin.create_queue("q", partitions=2)
            hw.send("q", b"hello", partition=0)
            assert [r.body for r in hw.scanner("q", partitions=[0])] == [b"hello"]
    finally:
        assert b.terminate() == 0
    assert zk_session.exists(paths.broker(1)) is None  # removed on the way out, not a session timeout later


def test_two_brokers_with_one_id_the_second_is_refused_naming_the_first(tmp_path, zk):
    b = _broker(tmp_path, zk, 7).start()
    try:
        error = _serve_fails(tmp_path, "--data", str(tmp_path / "other"), "--zookeeper", zk, "--broker-id", "7")
        assert f"broker id 7 is already registered in {zk} by {b.address}" in error
        assert not (tmp_path / "other").exists()  # a directory made for a refused start is removed
        assert _cluster_status(b)["active"]  # the first is untouched
    finally:
        b.terminate()


def test_a_broker_pointed_at_a_wrong_chroot_is_refused_naming_its_cluster(tmp_path, zk, zk_server):
    b = _broker(tmp_path, zk, 1).start()
    cluster_id = _cluster_status(b)["cluster_id"]
    b.terminate()
    before = (b.data / CLUSTER_FILE).read_bytes()
    error = _serve_fails(
        tmp_path, "--data", str(b.data), "--zookeeper", f"{zk_server.hosts}/elsewhere", "--broker-id", "1"
    )
    assert f"belongs to cluster {cluster_id}, but ZooKeeper at {zk_server.hosts}/elsewhere holds no cluster" in error
    assert (b.data / CLUSTER_FILE).read_bytes() == before
    # and with its own chroot it starts again, in its cluster
    b = _broker(tmp_path, zk, 1).start()
    assert _cluster_status(b)["cluster_id"] == cluster_id
    b.terminate()


def test_unreachable_zookeeper_at_start_is_a_clear_error_not_a_hang(tmp_path):
    nowhere = f"127.0.0.1:{free_port()}"
    started = time.monotonic()
    error = _serve_fails(
        tmp_path,
        "--data",
        str(tmp_path / "b1"),
        "--zookeeper",
        nowhere,
        "--broker-id",
        "1",
        "--set",
        "zookeeper_connect_timeout_s=2",
    )
    assert time.monotonic() - started < 20
    assert f"ZooKeeper at {nowhere}/headwater did not answer for 2 s" in error and "--zookeeper" in error


def test_a_broker_not_yet_in_its_cluster_serves_nothing_but_its_health(tmp_path):
    """While a broker started with --zookeeper has not joined (ZooKeeper out of reach, or
    slow), it answered as a broker alone: it made queues of its own and acknowledged sends
    to partitions it may not lead, and a client listing it first took it for a broker
    alone. Now it refuses all but PING, STATUS and METRICS, retriably, and a bootstrap list
    moves past it to the next broker."""
    from headwater.errors import UnavailableError

    nowhere = f"127.0.0.1:{free_port()}"
    joining = BrokerProcess(
        tmp_path / "joining",
        "--zookeeper",
        nowhere,
        "--broker-id",
        "1",
        "--set",
        "zookeeper_connect_timeout_s=120",
        port=free_port(),
    ).start(ready=False)
    alone = BrokerProcess(tmp_path / "alone").start()
    try:
        from headwater.client.transport.remote import RemoteService

        svc = RemoteService(joining.address, connect_timeout_s=5, request_timeout_s=5, retries=0)
        try:
            svc.ping()
            assert svc.status()
            for call in (
                lambda: svc.metadata(),
                lambda: svc.list_queues(),
                lambda: svc.create_queue("q", headwater.QueueConfig(partitions=1)),
            ):
                with pytest.raises(UnavailableError, match="joining its cluster"):
                    call()
        finally:
            svc.close()
        with pytest.raises(UnavailableError, match="joining its cluster"):
            headwater.connect(joining.address, connect_timeout_s=5)
        out = subprocess.run(
            [HEADWATER, "--server", joining.address, "queue", "create", "q"], capture_output=True, text=True, timeout=60
        )
        assert out.returncode != 0 and "joining its cluster" in out.stderr, out.stderr
        with headwater.connect(f"{joining.address},{alone.address}", connect_timeout_s=10) as hw:
            hw.admin.create_queue("q", partitions=1)
            hw.producer().send_and_wait("q", b"to the broker alone")

        async def asyncio_client() -> int:
            import headwater.aio

            async with await headwater.aio.connect(f"{joining.address},{alone.address}", connect_timeout_s=10) as ahw:
                return (await ahw.admin.describe_queue("q")).partitions[0].end_offset

        assert asyncio.run(asyncio_client()) == 1
    finally:
        joining.kill()
        alone.kill()


def test_cluster_settings_without_their_partner_are_refused(tmp_path, zk):
    data = str(tmp_path / "b1")
    assert "needs an id" in _serve_fails(tmp_path, "--data", data, "--zookeeper", zk)
    assert "without zookeeper" in _serve_fails(tmp_path, "--data", data, "--broker-id", "3")
    assert "has a scheme" in _serve_fails(tmp_path, "--data", data, "--zookeeper", "http://x:1", "--broker-id", "3")


def test_a_broker_killed_and_restarted_at_once_registers_when_its_old_session_ends(tmp_path, zk, zk_session):
    # the test ZooKeeper's longest session: a restart on a loaded machine takes more than 1 s
    b = _broker(tmp_path, zk, 1, None, "--set", "zookeeper_session_timeout_s=4").start()
    first = zk_session.get(paths.broker(1))[1].created_zxid
    b.kill()  # its registration stays until ZooKeeper expires the session
    assert zk_session.exists(paths.broker(1)) is not None
    b = BrokerProcess(b.data, *b.args).start(timeout_s=30)
    try:
        stat = zk_session.get(paths.broker(1))[1]
        assert stat.created_zxid > first and _cluster_status(b)["broker_epoch"] == stat.created_zxid
        assert "waiting for the previous process's registration" in b.log.read_text()
    finally:
        b.terminate()


def test_a_broker_paused_past_its_session_registers_again_at_a_new_epoch(tmp_path, zk, zk_session):
    b = _broker(tmp_path, zk, 1).start()
    try:
        first = zk_session.get(paths.broker(1))[1].created_zxid
        b.pause()  # SIGSTOP: no heartbeats; ZooKeeper expires the session after 1 s
        eventually(lambda: zk_session.exists(paths.broker(1)) is None, what="the paused broker's registration going")
        b.resume()
        eventually(lambda: _cluster_status(b)["broker_epoch"] > first, what="registering again")
        status = _cluster_status(b)
        assert status["active"] and status["broker_epoch"] == zk_session.get(paths.broker(1))[1].created_zxid
        assert "ZooKeeper session lost; not acting on cluster state" in b.log.read_text()
    finally:
        b.terminate()


def test_a_broker_cut_off_from_zookeeper_stops_acting_and_comes_back(tmp_path, zk, zk_server):
    b = _broker(tmp_path, zk, 1).start()
    try:
        assert _cluster_status(b)["active"]
        zk_server.pause()  # SIGSTOP ZooKeeper: the broker hears nothing for longer than its session
        try:
            eventually(lambda: not _cluster_status(b)["active"], what="the cut-off broker standing down")
        finally:
            zk_server.resume()
        eventually(lambda: _cluster_status(b)["active"], what="the broker acting again")
    finally:
        b.terminate()
