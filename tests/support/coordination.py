"""Sessions with a coordination service for tests, on a real ZooKeeper or on the in-memory
ensemble of ``headwater.testing``, behind one shape, so a suite runs on both (the contract,
the controller's election, the metadata cache). Each ZooKeeper-backed service works under a
chroot of its own: a cluster of its own on the shared server."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from headwater.cluster.coordination import Coordination
from headwater.testing.coordination import MemoryEnsemble
from tests.support.zookeeper import ZooKeeperProcess

__all__ = ["Service", "service_of"]

_chroots = itertools.count()


@dataclass
class Service:
    connect: Callable[[], Coordination]
    expire: Callable[[Coordination], None]  # end a session as the service does when it times out
    root: str  # a node made for the test to work under


@contextmanager
def service_of(kind: str, zk: ZooKeeperProcess | None, session_timeout_s: float = 2.0) -> Iterator[Service]:
    """``kind`` is "memory" or "zookeeper" (then ``zk`` is the server); every session the
    test opens is closed at the end."""
    sessions: list[Coordination] = []
    if kind == "memory":
        ensemble = MemoryEnsemble()

        def connect() -> Coordination:
            sessions.append(ensemble.connect())
            return sessions[-1]

        def expire(c: Coordination) -> None:
            ensemble.expire(c.session_id)

    else:
        from kazoo.client import KazooClient

        from headwater.cluster.zookeeper import ZooKeeperCoordination

        assert zk is not None
        server = zk
        hosts = f"{server.hosts}/test{next(_chroots)}"  # made by the first session

        def connect() -> Coordination:
            sessions.append(ZooKeeperCoordination(hosts, session_timeout_s=session_timeout_s))
            return sessions[-1]

        def expire(c: Coordination) -> None:
            # ZooKeeper's own way to end a session from outside: another client takes it over
            # with its id and password, then closes it
            other = KazooClient(hosts=server.hosts, client_id=c._client.client_id)  # type: ignore[attr-defined]  # the kazoo client inside ZooKeeperCoordination
            other.start(timeout=10)
            other.stop()
            other.close()

    root = "/root"
    connect().create(root)
    try:
        yield Service(connect, expire, root)
    finally:
        for s in sessions:
            s.close()
