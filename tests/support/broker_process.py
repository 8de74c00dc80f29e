"""A real broker process (``headwater serve``) for tests: start, address, SIGKILL, SIGTERM."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import headwater

HEADWATER = str(Path(sys.executable).with_name("headwater"))


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now (to restart a broker on the same one)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class BrokerProcess:
    def __init__(self, data: Path, *args: str, port: int = 0) -> None:
        self.data = data
        self.args = args
        self.port = port
        self.proc: subprocess.Popen | None = None
        self.log = data.parent / f"{data.name}-broker.log"

    def start(self, timeout_s: float = 20.0, ready: bool = True) -> BrokerProcess:
        """Start it and wait until it says it is ready (``listening``, printed once a broker of
        a cluster has joined it); ``ready=False`` (a port given): until it takes connections."""
        with open(self.log, "ab") as logf:  # the child keeps its own copy of the descriptor
            self.proc = subprocess.Popen(
                [
                    HEADWATER,
                    "serve",
                    "--data",
                    str(self.data),
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(self.port),
                    *self.args,
                ],
                stdout=subprocess.PIPE,
                stderr=logf,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        deadline = time.monotonic() + timeout_s
        if not ready:
            assert self.port, "give the port to wait for"
            while time.monotonic() < deadline and self.proc.poll() is None:
                try:
                    socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                    return self
                except OSError:
                    time.sleep(0.05)
            raise RuntimeError(f"broker did not listen; log:\n{self.log.read_text()[-3000:]}")
        assert self.proc.stdout is not None
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline().decode()
            if line.startswith("listening "):
                self.port = int(line.rsplit(":", 1)[1])
                return self
            if not line and self.proc.poll() is not None:
                break
        raise RuntimeError(f"broker did not start; log:\n{self.log.read_text()[-3000:]}")

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def rss_bytes(self) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0

    def kill(self) -> None:
        """SIGKILL: no flush, no goodbye."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        self._close_pipe()

    def terminate(self, timeout_s: float = 20.0) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        finally:
            self._close_pipe()

    def _close_pipe(self) -> None:
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()

    def pause(self) -> None:
        """SIGSTOP: the broker neither answers nor heartbeats until :meth:`resume`."""
        os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.pid, signal.SIGCONT)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def kill_all(procs, broker: BrokerProcess | None = None) -> None:
    """Tear down a multi-process test: SIGKILL every helper process still running, then the
    broker."""
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
    if broker is not None:
        broker.kill()


class Restart(threading.Thread):
    """Stop a broker (``terminate``: SIGTERM, it ends its streams with "the broker is
    stopping"; ``kill``: SIGKILL), wait a second, start it again on its port, then send one
    message, ``b"after"`` to partition 0 of queue ``q`` (by default), while the test's
    consumer goes on reading. ``broker`` is the running one once ``done`` is set."""

    def __init__(self, broker: BrokerProcess, stop: str, queue: str = "q", key: bytes | None = None) -> None:
        super().__init__(daemon=True)
        self.broker, self.stop = broker, stop
        self.queue, self.key = queue, key
        self.error: BaseException | None = None
        self.done = threading.Event()

    def run(self) -> None:
        try:
            getattr(self.broker, self.stop)()
            time.sleep(1.0)
            self.broker = BrokerProcess(self.broker.data, *self.broker.args, port=self.broker.port).start()
            with headwater.connect(self.broker.address) as hw:
                hw.send_batch(self.queue, [headwater.Message(b"after", key=self.key)], partition=0)
        except BaseException as e:  # noqa: BLE001 - the test reports it
            self.error = e
        finally:
            self.done.set()
