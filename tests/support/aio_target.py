"""Running an asyncio test against a client of each kind, and failing it on anything left
unclean: tasks still running, sockets or loops left open, errors the loop only logged.

A test is ``async def test(hw)``; the ``aio_target`` fixture (tests/conftest.py) gives the
``Target`` and ``run(target, test)`` runs it in a fresh event loop.
"""

from __future__ import annotations

import asyncio
import gc
import warnings
from collections.abc import Awaitable, Callable

import headwater
import headwater.aio
from tests.support.server_thread import ServerThread

Test = Callable[[headwater.aio.AsyncClient], Awaitable[None]]


class Target:
    """Where a test's client connects: a real server in a thread, an embedded broker, the
    in-memory one, or the three brokers of a cluster (``addresses``: their bootstrap list)."""

    def __init__(self, kind: str, tmp_path, clock, addresses: str = "") -> None:
        self.kind, self.clock, self.addresses = kind, clock, addresses
        self.server = (
            ServerThread(tmp_path / "data", clock, segment_bytes_max=256 * 1024) if kind == "network" else None
        )
        self.path = tmp_path / "data"

    async def open(self) -> headwater.aio.AsyncClient:
        if self.kind == "cluster":
            return await headwater.aio.connect(self.addresses)
        if self.server is not None:
            return await headwater.aio.connect(self.server.address)
        if self.kind == "memory":
            from headwater.testing import open_memory_async

            return open_memory_async(clock=self.clock)
        return await headwater.aio.open(self.path, clock=self.clock, segment_bytes_max=256 * 1024)


def run(target: Target, test: Test) -> None:
    """Run ``test(client)`` in a fresh event loop; fail on anything left unclean."""
    problems: list[str] = []

    async def main() -> None:
        hw = await target.open()
        try:
            await test(hw)
        finally:
            link = getattr(getattr(hw.service, "transport", None), "_link", None)
            await hw.close()
        assert link is None or link.sock.fileno() == -1  # the socket is closed
        left = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        assert not left, f"tasks still running after close: {left}"

    def on_error(loop, ctx) -> None:
        problems.append(f"{ctx['message']}: {ctx.get('future') or ctx.get('exception')!r}")

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()  # earlier tests' garbage is not this test's problem
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        with asyncio.Runner() as runner:
            loop = runner.get_loop()
            loop.set_exception_handler(on_error)
            runner.run(main())
        gc.collect()
    # ours: the loop, its transports, and client sockets (the test server's own leaks are not)
    client_ports = {target.server.server.port} if target.server is not None else set()
    for w in caught:
        if issubclass(w.category, ResourceWarning) and (
            w.source is loop
            or getattr(w.source, "_loop", None) is loop
            or str(w.message).startswith("unclosed <StreamWriter")
            or any(f", {port})>" in str(w.message) for port in client_ports)  # raddr=(host, port)
        ):
            problems.append(str(w.message))
    assert not problems


async def scan(hw, queue: str, **kw) -> list:
    return [r async for r in hw.scanner(queue, **kw)]
