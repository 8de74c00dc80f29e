"""Running a broker process: event loop, signals, graceful stop (``headwater serve``)."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable
from pathlib import Path

from headwater.broker.allocator import keep_freed_memory
from headwater.broker.broker import Broker
from headwater.broker.server import BrokerServer, ServerConfig
from headwater.storage.store import StoreConfig

__all__ = ["run_server"]

log = logging.getLogger("headwater.server")


def run_server(
    data: str | Path, store: StoreConfig, server: ServerConfig, *, on_ready: Callable[[int], None] | None = None
) -> None:
    """Open the data directory and serve it until SIGTERM or SIGINT, then stop cleanly:
    stop accepting, finish requests in flight, flush, close."""
    keep_freed_memory(server.allocator_cache_bytes)
    try:
        import uvloop

        loop = uvloop.new_event_loop()
    except ImportError:
        loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    broker = Broker.open(data, store)

    async def main() -> None:
        srv = BrokerServer(broker, server)
        port = await srv.start()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, srv.request_stop)
        if on_ready is not None:
            on_ready(port)
        await srv.serve_until_stopped()

    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
