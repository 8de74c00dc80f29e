"""A real broker server on 127.0.0.1 in a thread of the test process, so that tests keep
control of its clock and can reach into the broker while it serves."""

from __future__ import annotations

import asyncio
import threading


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
