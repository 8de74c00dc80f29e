"""A real ``headwater serve --http-port 0`` process for the HTTP API tests: its broker port,
its HTTP port, and an httpx client on it."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import httpx

from tests.support.broker_process import HEADWATER


class HttpBroker:
    """``headwater serve`` with the HTTP API, on free ports of 127.0.0.1."""

    def __init__(self, data: Path, *args: str) -> None:
        self.data = data
        self.log = data.parent / f"{data.name}-http-broker.log"
        with open(self.log, "ab") as logf:
            self.proc = subprocess.Popen(
                [HEADWATER, "serve", "--data", str(data), "--port", "0", "--http-port", "0", *args],
                stdout=subprocess.PIPE,
                stderr=logf,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        self.port = self.http_port = 0
        deadline = time.monotonic() + 30
        assert self.proc.stdout is not None
        while time.monotonic() < deadline and not self.http_port:
            line = self.proc.stdout.readline().decode()
            if not line and self.proc.poll() is not None:
                break
            if line.startswith("listening "):
                self.port = int(line.rsplit(":", 1)[1])
            elif line.startswith("http listening "):
                self.http_port = int(line.rsplit(":", 1)[1])
        if not self.http_port:
            self.stop()
            raise AssertionError(f"the broker did not serve HTTP; its log:\n{self.log.read_text()}")
        self.url = f"http://127.0.0.1:{self.http_port}"

    def client(self, timeout_s: float = 30.0) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=timeout_s)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
