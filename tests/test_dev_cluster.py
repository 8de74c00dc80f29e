"""``headwater dev-cluster``: ZooKeeper and three brokers from one command, as a user runs it
(a real process, real children), stopped with Ctrl-C (SIGINT) as a user stops it."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import headwater
from headwater.cluster.records import BrokerRecord, ClusterRecord, decode, paths
from tests.support import zookeeper
from tests.support.broker_process import HEADWATER

STOP_S = 40.0  # the command's own grace is 20 s per broker stop (all at once), then ZooKeeper's 10


def eventually(check: Callable[[], object], timeout_s: float = 20.0, what: str = "the condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"{what} did not come about within {timeout_s} s"
        time.sleep(0.05)


class DevCluster:
    """One ``headwater dev-cluster`` process; its stdout and stderr in files (never a pipe
    nobody reads)."""

    def __init__(self, data: Path, *args: str, name: str = "run") -> None:
        self.data = data
        self.out = data.parent / f"{name}.out"
        self.err = data.parent / f"{name}.err"
        with open(self.out, "wb") as out_f, open(self.err, "wb") as err_f:
            self.proc = subprocess.Popen(
                [HEADWATER, "dev-cluster", "--brokers", "3", "--data", str(data), "--port", "0", *args],
                stdin=subprocess.DEVNULL,
                stdout=out_f,
                stderr=err_f,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        self.addresses: list[str] = []

    def stderr(self) -> str:
        return self.err.read_text()

    def wait_ready(self, timeout_s: float = 60.0) -> DevCluster:
        def ready() -> bool:
            found = re.search(r"^ready (\S+)$", self.out.read_text(), re.M)
            assert found or self.proc.poll() is None, f"dev-cluster exited: {self.stderr()[-4000:]}"
            if found:
                self.addresses = found.group(1).split(",")
            return bool(found)

        eventually(ready, timeout_s, "the 'ready' line")
        return self

    @property
    def zookeeper(self) -> str:
        found = re.search(r"^ZooKeeper (\S+) \(pid \d+", self.stderr(), re.M)
        assert found, self.stderr()
        return found.group(1)

    def interrupt(self) -> int:
        """Ctrl-C, and its exit status."""
        self.proc.send_signal(signal.SIGINT)
        return self.proc.wait(STOP_S)

    def finish(self) -> int:
        """Its exit status, once it ends by itself."""
        return self.proc.wait(STOP_S)


def _children_of(data: Path) -> list[int]:
    """The processes (brokers, ZooKeeper) whose command line names a path under ``data``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if str(data).encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
    return found


def _listening(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=1):
            return True
    except OSError:
        return False


@pytest.fixture
def data(tmp_path) -> Iterator[Path]:
    if not zookeeper.installed():
        pytest.fail("ZooKeeper is not installed: `make test` installs Debian's zookeeper package")
    yield tmp_path / "cluster"
    for pid in _children_of(tmp_path):  # whatever a failed test left running
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _session(hosts: str, chroot: str = "/headwater"):
    from headwater.cluster.zookeeper import ZooKeeperCoordination

    return ZooKeeperCoordination(f"{hosts}{chroot}", session_timeout_s=10.0, connect_timeout_s=10.0)


def _cluster_id(hosts: str) -> str:
    zk = _session(hosts)
    try:
        return decode(zk.get(paths.CLUSTER)[0], ClusterRecord, paths.CLUSTER).cluster_id
    finally:
        zk.close()


def test_three_brokers_join_one_cluster_and_ctrl_c_stops_everything(data):
    run = DevCluster(data, "--zookeeper-port", "0").wait_ready()
    hosts = run.zookeeper
    zk = _session(hosts)
    try:
        assert sorted(zk.children(paths.BROKERS)) == ["1", "2", "3"]
        for broker_id, address in enumerate(run.addresses, start=1):
            record = decode(zk.get(paths.broker(broker_id))[0], BrokerRecord, "")
            assert record.address == address
            with headwater.connect(address) as hw:
                cluster = hw.status()["cluster"]
            assert cluster["active"] and cluster["broker_id"] == broker_id
            assert (data / f"broker-{broker_id}").is_dir() and (data / f"broker-{broker_id}.log").exists()
        cluster_id = decode(zk.get(paths.CLUSTER)[0], ClusterRecord, paths.CLUSTER).cluster_id
    finally:
        zk.close()
    err = run.stderr()
    assert f"clients: --server {','.join(run.addresses)}" in err
    assert all(f"broker-{i}.log" in err for i in (1, 2, 3))

    assert run.interrupt() == 0
    assert "dev-cluster stopped" in run.stderr()
    assert _children_of(data) == [], "a broker or ZooKeeper outlived the command"
    assert not any(_listening(a) for a in [*run.addresses, hosts])

    again = DevCluster(data, "--zookeeper-port", "0", name="again").wait_ready()
    try:
        assert _cluster_id(again.zookeeper) == cluster_id  # the same cluster, from DATA/zookeeper
    finally:
        assert again.interrupt() == 0


def _get(url: str) -> tuple[int, str]:
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as answer:
        return answer.status, answer.read().decode()


def test_http_port_serves_the_http_api_on_each_broker(data):
    # a dev cluster had no HTTP API: docs/http.md and docs/metrics.md's scrape of each
    # broker needed a 'python -m headwater.http' of one's own beside it
    run = DevCluster(data, "--zookeeper-port", "0", "--http-port", "0").wait_ready()
    try:
        found = re.search(r"^http (\S+)$", run.out.read_text(), re.M)
        assert found, run.out.read_text()
        apis = found.group(1).split(",")
        assert len(apis) == 3 and not set(apis) & set(run.addresses)
        err = run.stderr()
        for broker_id, (address, api) in enumerate(zip(run.addresses, apis), start=1):
            assert f"broker {broker_id} {address} http {api} data " in err
        assert f"HTTP API (docs/http.md; Prometheus scrapes /metrics on each): {' '.join(apis)}" in err
        with headwater.connect(",".join(run.addresses)) as hw:
            hw.admin.create_queue("seen-over-http", partitions=3)
        for api in apis:  # each broker's own API and metrics
            status, text = _get(f"http://{api}/metrics")
            assert status == 200 and 'headwater_partitions_led{queue="seen-over-http"}' in text
            status, text = _get(f"http://{api}/v1/queues")
            assert status == 200 and "seen-over-http" in text
    finally:
        assert run.interrupt() == 0
    assert _children_of(data) == [] and not any(_listening(a) for a in apis)


def test_http_ports_follow_the_first_one_and_a_taken_one_fails_before_anything_starts(data):
    while True:  # a port taken, with the one below it free: broker 1's HTTP API there, broker 2's taken
        taken = socket.socket()
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        if port > 1024 and not _listening(f"127.0.0.1:{port - 1}"):
            break
        taken.close()
    with taken:
        run = DevCluster(data, "--zookeeper-port", "0", "--http-port", str(port - 1), name="taken")
        assert run.finish() == 1
    err = " ".join(run.stderr().split())
    assert f"broker 2's HTTP API cannot listen on 127.0.0.1:{port}" in err and "with --http-port" in err, err
    assert "starting" not in err and not (data / "zookeeper").exists()
    run = DevCluster(data, "--port", "17071", "--http-port", "17072", name="overlap")
    assert run.finish() == 1
    err = " ".join(run.stderr().split())
    assert "--http-port 17072 and --port 17071 with --brokers 3 give port 17072 to both a broker and an HTTP API" in err
    assert "starting" not in err


def test_with_zookeeper_given_it_uses_that_one_and_leaves_it_running(data, tmp_path):
    server = zookeeper.ZooKeeperProcess(tmp_path / "zk").start()
    try:
        run = DevCluster(data, "--zookeeper", f"{server.hosts}/trial").wait_ready()
        try:
            assert f"starting 3 brokers in {server.hosts}/trial" in run.stderr() and "ZooKeeper" not in run.stderr()
            assert not (data / "zookeeper").exists()
            zk = _session(server.hosts, "/trial")
            try:
                assert sorted(zk.children(paths.BROKERS)) == ["1", "2", "3"]
            finally:
                zk.close()
        finally:
            assert run.interrupt() == 0
        assert server.server.answers()  # not ours to stop
    finally:
        server.stop()


def test_a_second_dev_cluster_on_a_running_directory_is_refused(data):
    run = DevCluster(data, "--zookeeper-port", "0").wait_ready()
    try:
        second = DevCluster(data, "--zookeeper-port", "0", name="second")
        assert second.finish() == 1
        error = second.stderr()
        assert f"is in use by another dev-cluster (pid {run.proc.pid})" in error and "another --data" in error
        assert "starting" not in error  # refused before anything started
        assert run.proc.poll() is None and all(_listening(a) for a in run.addresses)
    finally:
        assert run.interrupt() == 0


def test_the_children_of_a_killed_dev_cluster_are_named_by_the_next_run(data):
    run = DevCluster(data, "--zookeeper-port", "0").wait_ready()
    run.proc.kill()  # SIGKILL: it cannot stop its children, which run on
    run.proc.wait()
    left = sorted(_children_of(data))
    assert len(left) == 4
    again = DevCluster(data, "--zookeeper-port", "0", name="again")
    assert again.finish() == 1
    error = again.stderr()
    assert f"a dev-cluster over {data} was killed and left zookeeper (pid " in error
    assert sorted(int(p) for p in re.search(r"'kill ([\d ]+)'", error).group(1).split()) == left
    assert sorted(_children_of(data)) == left  # nothing more started, nothing stopped


def test_a_broker_killed_while_the_cluster_runs_is_reported_and_the_others_keep_running(data):
    run = DevCluster(data, "--zookeeper-port", "0").wait_ready()
    try:
        [pid] = [
            p for p in _children_of(data / "broker-2") if b"--broker-id" in Path(f"/proc/{p}/cmdline").read_bytes()
        ]
        os.kill(pid, signal.SIGKILL)
        eventually(lambda: "exited (killed by SIGKILL)" in run.stderr(), what="the killed broker being reported")
        err = run.stderr()  # the report is one print: its log's tail comes with it
        assert f"broker 2 ({run.addresses[1]}) exited (killed by SIGKILL); the others keep running" in err
        assert "listening 127.0.0.1:" in err.split("broker 2 (", 1)[1]  # the tail of its log
        assert run.proc.poll() is None
        for address in (run.addresses[0], run.addresses[2]):
            with headwater.connect(address) as hw:
                assert hw.status()["cluster"]["active"]
    finally:
        run.proc.send_signal(signal.SIGTERM)  # as a supervisor stops it
        assert run.finish() == 0
    assert "dev-cluster stopped" in run.stderr() and _children_of(data) == []


def test_a_broker_that_cannot_start_stops_everything_and_shows_its_log(data):
    data.mkdir()
    headwater.open(data / "broker-2").close()  # a data directory that joined another cluster
    (data / "broker-2" / "cluster.json").write_text('{"cluster_id": "0000elsewhere", "broker_id": 2}')
    run = DevCluster(data, "--zookeeper-port", "0")
    assert run.finish() == 1
    err = run.stderr()
    assert "broker 2 exited at start (exit status 1); everything started was stopped" in err
    assert "belongs to cluster 0000elsewhere" in err  # the tail of broker 2's log
    assert _children_of(data) == []


def test_bad_settings_and_a_taken_port_fail_before_anything_starts(data):
    for args, says in [
        (["--set", "no_such_setting=1"], "unknown setting 'no_such_setting'"),
        (["--set", "flush=sometimes"], "bad setting"),
        (["--set", "broker_id=7"], "dev-cluster sets it for each broker itself"),
        (["--zookeeper", "http://zk:2181"], "has a scheme"),
    ]:
        run = DevCluster(data, "--zookeeper-port", "0", *args, name="bad")
        assert run.finish() == 1
        assert says in run.stderr() and "starting" not in run.stderr()
        assert not (data / "zookeeper").exists()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        run = DevCluster(data, "--zookeeper-port", str(port), name="taken")
        assert run.finish() == 1
        err = run.stderr()
        assert f"ZooKeeper cannot listen on 127.0.0.1:{port}: the address is in use" in err
        assert "--zookeeper-port" in err and f"--zookeeper 127.0.0.1:{port}" in err


def test_the_help_has_examples():
    out = subprocess.run([sys.executable, "-m", "headwater", "dev-cluster", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "headwater dev-cluster --brokers 5" in out.stdout
