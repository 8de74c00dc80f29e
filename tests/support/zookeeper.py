"""A real ZooKeeper server for tests: Debian's ``zookeeper`` package run by Java 17, in
standalone mode on a free port of 127.0.0.1, its data in a temporary directory."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from tests.support.broker_process import free_port

ZOOKEEPER_JAR = Path("/usr/share/java/zookeeper.jar")
CONF = Path("/etc/zookeeper/conf")  # log4j settings of the package
TICK_MS = 200  # sessions may be as short as 2 ticks: expiry tests need not wait long


def installed() -> bool:
    return ZOOKEEPER_JAR.exists()


class ZooKeeperProcess:
    def __init__(self, data: Path) -> None:
        self.data = data
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.log = data / "zookeeper.log"

    @property
    def hosts(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 30.0) -> ZooKeeperProcess:
        self.data.mkdir(parents=True, exist_ok=True)
        cfg = self.data / "zoo.cfg"
        cfg.write_text(
            f"tickTime={TICK_MS}\n"
            f"dataDir={self.data / 'state'}\n"
            f"clientPort={self.port}\n"
            "clientPortAddress=127.0.0.1\n"
            "admin.enableServer=false\n"
            "4lw.commands.whitelist=ruok,srvr\n"
            "maxClientCnxns=0\n"
        )
        with open(self.log, "ab") as logf:
            self.proc = subprocess.Popen(
                [
                    "java",
                    "-Xmx256m",
                    "-XX:+UseSerialGC",
                    "-cp",
                    f"{CONF}:{ZOOKEEPER_JAR}",
                    "org.apache.zookeeper.server.ZooKeeperServerMain",
                    str(cfg),
                ],
                stdout=logf,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            if self._answers():
                return self
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"ZooKeeper did not start on {self.hosts}; log:\n{self.log.read_text()[-3000:]}")

    def _answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                s.sendall(b"ruok")
                return s.recv(16) == b"imok"
        except OSError:
            return False

    def pause(self) -> None:
        """SIGSTOP: the server neither answers nor expires anyone until resumed."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
