"""Shared fixtures: a controllable clock, and a client that every queue test gets three ways:
the embedded broker, the same broker over a store in memory (``headwater.testing``), and the
network client over loopback TCP."""

from __future__ import annotations

import asyncio
import signal
import threading

import pytest

import headwater

# A suite started as a background job (`make test &`) inherits SIGINT ignored, and so would
# every process it starts; the tests that press Ctrl-C on a child (the shell, `status
# --watch`, the demo) need it to reach them, as it does on a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


class FakeClock:
    """Seconds since the epoch that tests move by hand (like Kafka's MockTime)."""

    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


class ServerThread:
    """A real BrokerServer on 127.0.0.1 in a thread of this process (so tests keep their clock)."""

    def __init__(self, path, clock=None, server_settings: dict | None = None, **store_settings) -> None:
        from headwater.broker import Broker
        from headwater.broker.server import BrokerServer, ServerConfig
        from headwater.storage import StoreConfig

        self.loop = asyncio.new_event_loop()
        self.broker = Broker.open(path, StoreConfig(**store_settings), **({} if clock is None else {"clock": clock}))
        self.server = BrokerServer(self.broker, ServerConfig(port=0, **(server_settings or {})))
        started = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            self.loop.run_until_complete(self.server.start())
            started.set()
            self.loop.run_until_complete(self.server.serve_until_stopped())

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        assert started.wait(10)
        self.port = self.server.port
        self.address = f"127.0.0.1:{self.port}"

    def call(self, fn):
        """Run ``fn()`` on the server's loop; its result."""
        done = threading.Event()
        out = []
        self.loop.call_soon_threadsafe(lambda: (out.append(fn()), done.set()))
        assert done.wait(5)
        return out[0]

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.server.request_stop)
        self.thread.join(15)
        self.loop.close()


@pytest.fixture
def server(tmp_path, clock):
    """A broker serving on a free port of 127.0.0.1 from a thread of this process."""
    s = ServerThread(tmp_path / "data", clock)
    yield s
    s.stop()


@pytest.fixture(params=["embedded", "memory", "network"])
def hw(request, tmp_path, clock):
    """A client; every test using it runs against the store, the fake and the network."""
    server = None
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


@pytest.fixture(params=["network", "embedded", "memory"])
def aio_target(request, tmp_path, clock):
    """Where an asyncio test's client connects (``test_aio.Target``): a real server in a
    thread, an embedded broker, or the in-memory one (``headwater.testing``); run the test
    with ``test_aio.run``."""
    from test_aio import Target

    t = Target(request.param, tmp_path, clock)
    yield t
    if t.server is not None:
        t.server.stop()
        if not t.server.thread.is_alive():
            t.server.loop.close()
