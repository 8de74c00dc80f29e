"""Run the HTTP API: in a thread of its own, with its own event loop, beside a broker
(``headwater serve --http-port``), or in the foreground (``python -m headwater.http``).

The gateway's work (JSON, HTTP parsing) never runs on the broker's event loop: it is a
client of the broker like any other, over TCP to the broker's own address.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import uvicorn

from headwater.http.app import GatewaySettings, create_app

__all__ = ["HttpServer"]

log = logging.getLogger("headwater.http")


class HttpServer:
    """The HTTP API of the broker at ``broker_address``, served on ``host:port`` (0: any
    free port; :attr:`port` is the bound one once :meth:`wait_started` returned): ``start()``,
    then ``wait_started()`` (the port), and ``stop()`` at the end.
    """

    def __init__(
        self,
        broker_address: str,
        *,
        host: str = "127.0.0.1",
        port: int = 8080,
        settings: GatewaySettings | None = None,
        on_ready: Any = None,
    ) -> None:
        self.broker_address = broker_address
        self.host = host
        self.port = port
        self.app = create_app(broker_address, settings, listen_host=host)
        self._on_ready = on_ready
        config = uvicorn.Config(
            self.app,
            host=host,
            port=port,
            log_level="warning",
            access_log=False,
            lifespan="on",
            loop="asyncio",
            timeout_graceful_shutdown=5,
        )
        self._server = uvicorn.Server(config)
        self._server.install_signal_handlers = lambda: None  # type: ignore[method-assign]  # the broker's loop owns signals
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self.error: BaseException | None = None

    async def serve(self) -> None:
        """Serve until :meth:`stop` (in the running event loop)."""
        task = asyncio.create_task(self._server.serve())
        while not self._server.started and not task.done():
            await asyncio.sleep(0.01)
        if self._server.started:
            self.port = self._server.servers[0].sockets[0].getsockname()[1]
            self._started.set()
            if self._on_ready is not None:
                self._on_ready(self.port)
        await task
        if not self._server.started:
            raise RuntimeError(f"the HTTP API could not start on {self.host}:{self.port} (see the log above)")

    def _run(self) -> None:
        try:
            try:
                import uvloop

                runner = uvloop.run
            except ImportError:
                runner = asyncio.run
            runner(self.serve())
        except BaseException as e:  # reported by wait_started and in the log
            self.error = e
            log.error("the HTTP API stopped: %s", e)
        finally:
            self._started.set()

    def start(self) -> None:
        """Start serving in a daemon thread; returns at once (the gateway connects to the
        broker from that thread, so this may be called from the broker's own loop)."""
        self._thread = threading.Thread(target=self._run, name="headwater-http", daemon=True)
        self._thread.start()

    def wait_started(self, timeout_s: float = 20.0) -> int:
        """Wait until it listens (or failed: the error is raised); the bound port."""
        if not self._started.wait(timeout_s):
            raise TimeoutError(f"the HTTP API did not start within {timeout_s} s")
        if self.error is not None:
            raise self.error
        return self.port

    def stop_soon(self) -> None:
        """Ask the server to stop (from any thread or a signal handler); it finishes the
        requests in flight and closes the sessions first."""
        self._server.should_exit = True

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop serving (finishing requests in flight, closing sessions) and join the thread."""
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout_s)
