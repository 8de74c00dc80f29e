"""Shared fixtures: a controllable clock, and a client that every queue test gets three ways:
the embedded broker, the same broker over a store in memory (``headwater.testing``), and the
network client over loopback TCP.

What tests share besides fixtures lives in ``tests/support`` (no test module imports another);
fixtures that only some modules use are plugins there, registered in ``pytest_plugins``."""

from __future__ import annotations

import signal

import pytest

import headwater
from headwater.testing import FakeClock
from tests.support import cluster_contract, zookeeper
from tests.support.aio_target import Target
from tests.support.cluster import Cluster
from tests.support.cluster_contract import WallClock
from tests.support.coordination import Service, service_of
from tests.support.server_thread import ServerThread

pytest_plugins = ["tests.support.spark_fixtures", "tests.support.fake_broker"]

# A suite started as a background job (`make test &`) inherits SIGINT ignored, and so would
# every process it starts; the tests that press Ctrl-C on a child (the shell, `status
# --watch`, the demo) need it to reach them, as it does on a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture
def clock(request) -> FakeClock | WallClock:
    """The clock of the broker under test, moved by hand (``clock.advance(seconds)``); on the
    cluster, the brokers' wall clock, and a test that moves it is skipped there."""
    callspec = getattr(request.node, "callspec", None)
    if callspec is not None and "cluster" in (callspec.params.get("hw"), callspec.params.get("aio_target")):
        return WallClock()
    return FakeClock()


@pytest.fixture
def server(tmp_path, clock):
    """A broker serving on a free port of 127.0.0.1 from a thread of this process."""
    s = ServerThread(tmp_path / "data", clock)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def cluster(zk_server, tmp_path_factory):
    """Three brokers on the run's ZooKeeper, with a controller elected, one set per test
    module (tests/support/cluster.py); a module that needs another shape defines its own."""
    c = Cluster(zk_server, tmp_path_factory.mktemp("cluster"), 3)
    try:
        c.controller()
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="session")
def contract_cluster(zk_server, tmp_path_factory):
    """Three brokers on the run's ZooKeeper, shared by every contract test that runs on the
    cluster (tests/support/cluster_contract.py)."""
    cluster = Cluster(zk_server, tmp_path_factory.mktemp("contract-cluster"), cluster_contract.BROKERS)
    cluster.controller()
    yield cluster
    cluster.stop()


@pytest.fixture(params=["embedded", "memory", "network", "cluster"])
def hw(request, tmp_path, clock):
    """A client; every test using it runs against the store, the fake, the network, and a
    cluster of three brokers."""
    server = None
    if request.param == "cluster":
        alone = request.node.get_closest_marker("alone")
        if alone is not None:
            pytest.skip(f"a broker running alone: {alone.args[0]}")
        cluster = request.getfixturevalue("contract_cluster")
        client = cluster_contract.cluster_client(cluster)
        yield client
        client.close()
        cluster_contract.empty_cluster(cluster)
        return
    if request.param == "memory":
        from headwater.testing import open_memory

        client = open_memory(clock=clock)
    elif request.param == "network":
        server = ServerThread(tmp_path / "data", clock, segment_bytes_max=256 * 1024)
        client = headwater.connect(server.address)
    else:
        client = headwater.open(tmp_path / "data", clock=clock, segment_bytes_max=256 * 1024)
    yield client
    client.close()
    if server is not None:
        server.stop()


@pytest.fixture(params=["network", "embedded", "memory", "cluster"])
def aio_target(request, tmp_path, clock):
    """Where an asyncio test's client connects (``tests.support.aio_target.Target``): a real
    server in a thread, an embedded broker, the in-memory one (``headwater.testing``), or a
    cluster of three brokers; run the test with ``tests.support.aio_target.run``."""
    if request.param == "cluster":
        alone = request.node.get_closest_marker("alone")
        if alone is not None:
            pytest.skip(f"a broker running alone: {alone.args[0]}")
        cluster = request.getfixturevalue("contract_cluster")
        yield Target("cluster", tmp_path, clock, ",".join(cluster.address(i) for i in sorted(cluster.brokers)))
        cluster_contract.empty_cluster(cluster)
        return
    t = Target(request.param, tmp_path, clock)
    yield t
    if t.server is not None:
        t.server.stop()
        if not t.server.thread.is_alive():
            t.server.loop.close()


@pytest.fixture(scope="session")
def zk_server(tmp_path_factory):
    """One real ZooKeeper (Debian's package) for the whole run; each test works under a chroot
    of its own. A test that pauses it resumes it before it ends."""
    if not zookeeper.installed():
        pytest.fail("ZooKeeper is not installed: `make test` installs Debian's zookeeper package")
    server = zookeeper.ZooKeeperProcess(tmp_path_factory.mktemp("zk")).start()
    yield server
    server.stop()


@pytest.fixture(params=["zookeeper", "memory"])
def service(request) -> Service:
    """Sessions with a coordination service, on a real ZooKeeper and on the in-memory
    ensemble: a test using it runs on both (tests/support/coordination.py)."""
    zk = request.getfixturevalue("zk_server") if request.param == "zookeeper" else None
    with service_of(request.param, zk) as s:
        yield s


@pytest.fixture(scope="module")
def http_broker(tmp_path_factory):
    """A ``headwater serve --http-port`` process for a module of HTTP tests."""
    from tests.support.http_gateway import HttpBroker  # imports httpx: only where HTTP is tested

    b = HttpBroker(tmp_path_factory.mktemp("http") / "data")
    yield b
    b.stop()


@pytest.fixture(scope="module")
def http_api(http_broker):
    """An httpx client on ``http_broker``."""
    with http_broker.client() as c:
        yield c
