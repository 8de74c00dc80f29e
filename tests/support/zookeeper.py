"""A real ZooKeeper server for tests: the product's launcher
(:class:`headwater.cluster.local_zookeeper.LocalZooKeeper`, Debian's ``zookeeper`` package
run by Java 17), in standalone mode on a free port of 127.0.0.1, its data in a temporary
directory, with short ticks so that session expiry tests need not wait long."""

from __future__ import annotations

from pathlib import Path

from headwater.cluster import local_zookeeper
from tests.support.broker_process import free_port

TICK_MS = 200  # sessions may be as short as 2 ticks: expiry tests need not wait long


def installed() -> bool:
    return local_zookeeper.installed()


class ZooKeeperProcess:
    def __init__(self, data: Path) -> None:
        self.data = data
        self.port = free_port()
        self.server = local_zookeeper.LocalZooKeeper(data, self.port, tick_ms=TICK_MS)
        self.log = self.server.log

    @property
    def hosts(self) -> str:
        return self.server.hosts

    def start(self, timeout_s: float = 30.0) -> ZooKeeperProcess:
        self.server.start(timeout_s)
        return self

    def pause(self) -> None:
        """SIGSTOP: the server neither answers nor expires anyone until resumed."""
        self.server.pause()

    def resume(self) -> None:
        self.server.resume()

    def stop(self) -> None:
        self.server.stop(grace_s=5.0)
