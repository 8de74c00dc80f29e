"""NATS JetStream, file storage: ``nats-server`` from Debian (2.9.x), driven by nats-py.

One mode. JetStream acknowledges a publish once the message is written to its file store
(buffered in the OS); it does not fsync per message. The server syncs its files on a timer
(``sync_interval``, 2 minutes by default in later releases; 2.9 has no per-write sync option),
so on a single server a power loss can lose acknowledged messages; JetStream's answer is
replication (R3), which this single-machine benchmark does not run. It is compared with the
other systems' asynchronous modes only.

Client: nats-py (asyncio). A batch is ``publish_async`` of every message then one wait for all
the PubAcks; reading is an ordered push consumer (no acks, flow control) whose callback fills a
buffer that ``poll`` drains. Stream ``BENCH`` takes subjects ``bench.>``; stream i is subject
``bench.i``. ``reset`` deletes and re-creates the stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections.abc import Iterator, Sequence

from bench.peers.base import (
    HOST,
    Driver,
    FutureSender,
    LoopThread,
    Mode,
    Unavailable,
    close_loop,
    dist_version,
    ensure_debian_packages,
    free_port,
    package_version,
    port_open,
    wait_until,
)

__all__ = ["NatsJetStream"]

STREAM = "BENCH"


class NatsJetStream(Driver):
    system = "nats"
    modes = (
        Mode("nats jetstream file", "file", False, "after write to the file store (OS buffers); fsync on a timer"),
    )

    def setup(self) -> None:
        ensure_debian_packages({"nats-server": "nats-server"}, self.log)
        try:
            import nats  # noqa: F401
        except ImportError as e:
            raise Unavailable("Python client missing: pip install -r bench/requirements.txt") from e
        self.port = free_port()
        store = self.workdir / "jetstream"
        store.mkdir()
        binary = shutil.which("nats-server") or "/usr/sbin/nats-server"
        server = self.start_server("nats", [binary, "-a", HOST, "-p", str(self.port), "-js", "-sd", str(store)])
        wait_until(lambda: port_open(self.port), timeout_s=20, what="nats-server", alive=server.alive)
        wait_until(lambda: asyncio.run(self._jetstream_ready()), timeout_s=20, what="jetstream", alive=server.alive)

    async def _connect(self):
        import nats

        return await nats.connect(
            f"nats://{HOST}:{self.port}", connect_timeout=5, max_reconnect_attempts=0, pending_size=64 << 20
        )

    async def _jetstream_ready(self) -> bool:
        nc = await self._connect()
        try:
            await nc.jetstream().account_info()
            return True
        finally:
            await nc.close()

    def version(self) -> str:
        return f"nats-server {package_version('nats-server')} (Debian), nats-py {dist_version('nats-py')}"

    def reset(self, mode: Mode, streams: int) -> None:
        asyncio.run(self._reset())

    async def _reset(self) -> None:
        from nats.js.api import StorageType
        from nats.js.errors import NotFoundError

        nc = await self._connect()
        try:
            js = nc.jetstream()
            with contextlib.suppress(NotFoundError):
                await js.delete_stream(STREAM)
            await js.add_stream(name=STREAM, subjects=["bench.>"], storage=StorageType.FILE, num_replicas=1)
        finally:
            await nc.close()

    @contextlib.contextmanager
    def producer(self, mode: Mode, stream: int) -> Iterator:
        loop = asyncio.new_event_loop()
        nc = loop.run_until_complete(self._connect())
        js = nc.jetstream(publish_async_max_pending=100_000)
        subject = f"bench.{stream}"

        async def send(bodies: Sequence[bytes]) -> None:
            acks = [await js.publish_async(subject, body) for body in bodies]
            await asyncio.gather(*acks)  # raises if any publish was refused

        try:
            yield lambda bodies: loop.run_until_complete(send(bodies))
        finally:
            loop.run_until_complete(nc.close())
            close_loop(loop)

    @contextlib.contextmanager
    def sender(self, mode: Mode, stream: int) -> Iterator:
        lt = LoopThread()
        nc = lt.run(self._connect())
        js = nc.jetstream()
        subject = f"bench.{stream}"
        try:
            yield FutureSender(lambda body: lt.submit(js.publish(subject, body)))
        finally:
            lt.run(nc.close())
            lt.close()

    @contextlib.contextmanager
    def consumer(self, mode: Mode, stream: int) -> Iterator:
        loop = asyncio.new_event_loop()
        buffer: list[bytes] = []
        arrived = asyncio.Event()

        async def on_message(msg) -> None:
            buffer.append(msg.data)
            arrived.set()

        async def subscribe():
            nc = await self._connect()
            sub = await nc.jetstream().subscribe(
                f"bench.{stream}",
                cb=on_message,
                ordered_consumer=True,
                pending_msgs_limit=1_000_000,
                pending_bytes_limit=1 << 30,
            )
            return nc, sub

        async def wait(timeout_s: float) -> None:
            if not buffer:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(arrived.wait(), timeout_s)
            else:
                await asyncio.sleep(0)  # let the callback task take what the socket has
            arrived.clear()

        def poll(timeout_s: float) -> list[bytes]:
            loop.run_until_complete(wait(timeout_s))
            got = buffer[:]
            buffer.clear()
            return got

        nc, sub = loop.run_until_complete(subscribe())
        try:
            yield poll
        finally:
            loop.run_until_complete(sub.unsubscribe())
            loop.run_until_complete(nc.close())
            close_loop(loop)
