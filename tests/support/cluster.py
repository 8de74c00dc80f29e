"""A real cluster for tests: one ZooKeeper and N ``headwater serve --zookeeper`` processes on
free ports of 127.0.0.1, each broker its own data directory; stop, SIGKILL, SIGSTOP and
restart any of them, and read the cluster's tree with a session of the test's own."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import headwater
from headwater.cluster.coordination import Coordination, NoNodeError
from headwater.cluster.records import MoveRecord, PartitionRecord, decode, paths
from tests.support.broker_process import BrokerProcess
from tests.support.zookeeper import ZooKeeperProcess

_chroots = itertools.count()


def eventually(check: Callable[[], Any], timeout_s: float = 20.0, what: str = "the condition") -> Any:
    """Poll ``check`` until it returns something true; return that."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"{what} did not come about within {timeout_s} s"
        time.sleep(0.05)


class Cluster:
    def __init__(self, zk: ZooKeeperProcess, root: Path, size: int, *extra: str) -> None:
        self.zk = zk
        self.root = root
        self.chroot = f"/cluster{next(_chroots)}"
        self.extra = extra
        self.brokers: dict[int, BrokerProcess] = {}
        self._session: Coordination | None = None
        for broker_id in range(1, size + 1):
            self.start(broker_id)

    @property
    def zookeeper(self) -> str:
        return f"{self.zk.hosts}{self.chroot}"

    def start(self, broker_id: int, *extra: str) -> BrokerProcess:
        """Start broker ``broker_id`` (again: on its data directory and port); ``extra``
        arguments of ``headwater serve`` for this start only (a later ``--set`` wins)."""
        old = self.brokers.get(broker_id)
        b = BrokerProcess(
            self.root / f"b{broker_id}",
            "--zookeeper",
            self.zookeeper,
            "--broker-id",
            str(broker_id),
            "--set",
            "zookeeper_session_timeout_s=2",
            *self.extra,
            *extra,
            port=old.port if old is not None else 0,
        ).start(timeout_s=40)
        self.brokers[broker_id] = b
        return b

    def address(self, broker_id: int) -> str:
        return self.brokers[broker_id].address

    def connect(self, broker_id: int) -> headwater.Client:
        """A client of broker ``broker_id`` alone (no routing: it sees what that broker
        answers, refusals included)."""
        from headwater.client.transport.remote import RemoteService

        return headwater.Client(RemoteService(self.address(broker_id)))

    def status(self, broker_id: int) -> dict:
        with self.connect(broker_id) as hw:
            return hw.status()["cluster"]  # type: ignore[return-value]  # a dict of plain values

    def controller(self) -> int:
        """The controller's broker id, once one is elected and every running broker knows it."""

        def agreed() -> int | None:
            seen = {self.status(i)["controller"] for i, b in self.brokers.items() if b.alive()}
            return seen.pop() if len(seen) == 1 and -1 not in seen else None

        return eventually(agreed, what="an agreed controller")

    @property
    def session(self) -> Coordination:
        if self._session is None:
            from headwater.cluster.zookeeper import ZooKeeperCoordination

            self._session = ZooKeeperCoordination(self.zookeeper)
        return self._session

    def stop(self) -> None:
        for b in self.brokers.values():
            if b.alive():
                b.terminate()
        if self._session is not None:
            self._session.close()


def moves_left(cluster: Cluster) -> int:
    """The partition moves in ZooKeeper's tree now, of every queue (a queue's node goes only
    once it has no move left)."""
    try:
        return sum(len(cluster.session.children(paths.moves_of(q))) for q in cluster.session.children(paths.MOVES))
    except NoNodeError:
        return 0


def recorded_leaders(cluster: Cluster, queue: str) -> dict[int, int]:
    """Each partition's leader as ZooKeeper records it: what the brokers' views learn from
    their watches, a moment later."""
    out = {}
    for name in cluster.session.children(paths.partitions(queue)):
        raw = cluster.session.get(paths.partition(queue, int(name)))[0]
        out[int(name)] = decode(raw, PartitionRecord, "partition").leader
    return out


def move_phases(cluster: Cluster, queue: str) -> dict[int, tuple[str, int]]:
    """The moves of ``queue`` now: partition -> (phase, target broker)."""
    out = {}
    try:
        names = cluster.session.children(paths.moves_of(queue))
    except NoNodeError:
        return {}
    for name in names:
        try:
            rec = decode(cluster.session.get(paths.move(queue, int(name)))[0], MoveRecord, "move")
        except NoNodeError:
            continue  # finished meanwhile
        out[int(name)] = (rec.phase, rec.target)
    return out
