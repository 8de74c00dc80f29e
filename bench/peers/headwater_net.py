"""Headwater over the network: ``headwater serve`` as a subprocess, driven by ``headwater.connect``.

Modes (``headwater --data DIR serve --host 127.0.0.1 --port PORT --flush MODE``, restarted on a
fresh data directory for each mode):

- ``async``: acknowledged once in the log (page cache); the flusher fsyncs on an interval, so
  the loss window on power failure is that interval (see docs/design).
- ``sync``: acknowledged after the fsync that covers the batch (group commit).

Client: ``headwater.connect("127.0.0.1:PORT")``. A batch is ``Producer.send_batch(queue,
bodies, partition=i)`` (returns when acknowledged); the latency run uses ``Producer.send``
(a future per message, ``linger_ms=0``); reading is the simple consumer
(``Client.consumer().assign(queue, partitions=[i])`` then ``poll``), which over the network
reads through a fetch stream (the broker pushes new batches; docs/design/client.md). Stream i is partition i of
the queue ``bench``; ``reset`` deletes and re-creates the queue with as many partitions.
"""

from __future__ import annotations

import contextlib
import shutil
import sys
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from bench.peers.base import (
    HOST,
    Driver,
    FutureSender,
    Mode,
    Unavailable,
    dist_version,
    free_port,
    port_open,
    wait_until,
)
from bench.peers.latency_run import AsyncFutureSender

__all__ = ["HeadwaterAio", "HeadwaterNet", "HeadwaterOneInFlight"]

QUEUE = "bench"
LINGER_MS = 5
BATCH_BYTES_MAX = 1 << 20
POLL_MESSAGES_MAX = 500


class HeadwaterNet(Driver):
    system = "headwater"
    modes = (
        Mode("headwater async", "async", False, "after write to the log; fsync on an interval"),
        Mode("headwater sync", "sync", True, "after the fsync covering the batch (group commit)"),
    )
    max_in_flight: int | None = None  # the latency producer's: None, the producer's default (5)

    def setup(self) -> None:
        pass  # the broker is started per mode (use_mode)

    def version(self) -> str:
        from headwater import __version__

        return f"headwater {__version__} (this checkout), msgspec {dist_version('msgspec')}"

    def use_mode(self, mode: Mode) -> None:
        self.teardown()
        for old in self.workdir.glob("headwater-data-*"):
            shutil.rmtree(old, ignore_errors=True)
        self.port = free_port()
        data = self.workdir / f"headwater-data-{mode.key}"
        data.mkdir()
        server = self.start_server(
            f"headwater-{mode.key}",
            [
                sys.executable,
                "-m",
                "headwater.cli.main",
                "--data",
                str(data),
                "serve",
                "--host",
                HOST,
                "--port",
                str(self.port),
                "--flush",
                mode.key,
                "--log-level",
                "warning",
            ],
        )
        try:
            wait_until(lambda: port_open(self.port), timeout_s=30, what="headwater serve", alive=server.alive)
            wait_until(self._ping, timeout_s=15, what="headwater serve (client)", alive=server.alive)
        except Unavailable as e:
            raise Unavailable(f"{e}; log: {server.log_tail(5)}") from None

    def _connect(self):
        import headwater

        return headwater.connect(f"{HOST}:{self.port}")

    def _ping(self) -> bool:
        hw = self._connect()
        try:
            hw.admin.list_queues()
            return True
        finally:
            hw.close()

    def reset(self, mode: Mode, streams: int) -> None:
        hw = self._connect()
        try:
            if any(q.name == QUEUE for q in hw.admin.list_queues()):
                hw.admin.delete_queue(QUEUE)
            hw.admin.create_queue(QUEUE, partitions=streams, ttl_s=None)
        finally:
            hw.close()

    @contextlib.contextmanager
    def producer(self, mode: Mode, stream: int) -> Iterator:
        hw = self._connect()
        p = _producer(hw, linger_ms=LINGER_MS)

        def send_batch(bodies: Sequence[bytes]) -> None:
            p.send_batch(QUEUE, bodies, partition=stream)

        try:
            yield send_batch
        finally:
            hw.close()

    def latency_producer(self, hw):
        """The blocking producer the latency run sends through: no linger, ``max_in_flight``."""
        return _producer(hw, linger_ms=0, max_in_flight=self.max_in_flight)

    @contextlib.contextmanager
    def sender(self, mode: Mode, stream: int) -> Iterator:
        hw = self._connect()
        p = self.latency_producer(hw)
        try:
            yield FutureSender(lambda body: p.send(QUEUE, body))  # the latency queue has 1 partition
        finally:
            with contextlib.suppress(Exception):
                p.flush()
            hw.close()

    @contextlib.contextmanager
    def consumer(self, mode: Mode, stream: int) -> Iterator:
        hw = self._connect()
        c = hw.consumer()
        c.assign(QUEUE, partitions=[stream])

        def poll(timeout_s: float) -> list[bytes]:
            return [r.body for r in c.poll(max_messages=POLL_MESSAGES_MAX, timeout_ms=int(timeout_s * 1000))]

        try:
            yield poll
        finally:
            hw.close()


def _producer(hw, *, linger_ms: int, max_in_flight: int | None = None):
    try:
        return hw.producer(linger_ms=linger_ms, batch_bytes_max=BATCH_BYTES_MAX, max_in_flight=max_in_flight)
    except TypeError:  # a Client.producer that does not take the settings yet: its defaults
        return hw.producer()


class HeadwaterOneInFlight(HeadwaterNet):
    """The same broker and blocking client, the latency producer with ``max_in_flight=1``: one
    batch of the partition awaits its acknowledgement at a time, and what is sent meanwhile
    leaves as one batch when the answer comes, rather than as up to five requests of a message
    each (docs/producing.md, ``max_in_flight``). Latency only: it shows what the setting trades
    at a given rate, beside the default, in the same rounds."""

    system = "headwater-1inflight"
    modes = tuple(
        Mode(m.label.replace("headwater", "headwater-1inflight", 1), m.key, m.fsync_before_ack, m.ack_means)
        for m in HeadwaterNet.modes
    )
    max_in_flight = 1


class HeadwaterAio(HeadwaterNet):
    """The same broker, measured through the asyncio client (``headwater.aio``): the latency
    run's producer calls ``AsyncProducer.send_nowait`` and its consumer awaits
    ``AsyncConsumer.poll``, each on its own event loop. Latency only."""

    system = "headwater-aio"
    modes = tuple(
        Mode(m.label.replace("headwater", "headwater-aio", 1), m.key, m.fsync_before_ack, m.ack_means)
        for m in HeadwaterNet.modes
    )
    async_client = True

    async def _connect_aio(self):
        import headwater.aio

        return await headwater.aio.connect(f"{HOST}:{self.port}")

    @contextlib.asynccontextmanager
    async def async_sender(self, mode: Mode, stream: int) -> AsyncIterator[AsyncFutureSender]:
        hw = await self._connect_aio()
        p = hw.producer(linger_ms=0, batch_bytes_max=BATCH_BYTES_MAX)
        try:
            yield AsyncFutureSender(lambda body: p.send_nowait(QUEUE, body, partition=stream))
        finally:
            with contextlib.suppress(Exception):
                await p.flush()
            await hw.close()

    @contextlib.asynccontextmanager
    async def async_consumer(self, mode: Mode, stream: int) -> AsyncIterator[Any]:
        hw = await self._connect_aio()
        c = hw.consumer()
        await c.assign(QUEUE, partitions=[stream])

        async def poll(timeout_s: float) -> list[bytes]:
            return [r.body for r in await c.poll(max_messages=POLL_MESSAGES_MAX, timeout_ms=int(timeout_s * 1000))]

        try:
            yield poll
        finally:
            await hw.close()

    def produce(self, mode: Mode, **kw: Any) -> dict[str, Any]:
        return {"error": "headwater-aio measures latency only (python -m bench.latency)"}

    def consume(self, mode: Mode, **kw: Any) -> dict[str, Any]:
        return {"error": "headwater-aio measures latency only (python -m bench.latency)"}
