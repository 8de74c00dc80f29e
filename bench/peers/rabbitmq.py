"""RabbitMQ: ``rabbitmq-server`` from Debian (3.10.x on Erlang 25), driven by pika.

One node, started from ``/usr/lib/rabbitmq/bin/rabbitmq-server`` as the current user with every
path (Mnesia, logs, config, enabled plugins, Erlang cookie via HOME) under the run's /tmp
directory and no plugins; its own ``epmd`` on a free port. AMQP, the Erlang distribution port
and epmd listen on 127.0.0.1 only.

Modes (the queue type is chosen when ``reset`` declares the queues; one server for both):

- ``classic``: durable classic queue, persistent messages (delivery mode 2), publisher confirms.
  A persistent message routed to a durable queue is confirmed once it is persisted to disk; the
  message store and queue index fsync in batches (group commit), so the confirm comes after an
  fsync, possibly delayed by a batch interval.
- ``quorum``: quorum queue (Raft log, one member here); a message is confirmed after the log
  entry is fsynced.

Both confirm after fsync, so both count as "fsync before ack" in the tables.

Client: pika. Publishing uses its ``SelectConnection`` with publisher confirms: a batch is 500
``basic_publish`` calls, then the I/O loop runs until all 500 are confirmed (pika's
``BlockingConnection`` would wait for each confirm in turn; aio-pika reached half of this rate
or less in a trial). Reading is ``basic.consume`` with auto-ack on a
``BlockingConnection`` (the broker forgets a message once sent: the cheapest way it offers to
read a queue). Stream i is the queue
``bench-i``; ``reset`` deletes and re-declares them.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Iterator, Sequence

from bench.peers.base import (
    HOST,
    Driver,
    Mode,
    Unavailable,
    dist_version,
    ensure_debian_packages,
    free_port,
    package_version,
    port_open,
    wait_until,
)

__all__ = ["RabbitMQ"]

SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"


class RabbitMQ(Driver):
    system = "rabbitmq"
    modes = (
        Mode(
            "rabbitmq classic",
            "classic",
            True,
            "durable queue, persistent msg: confirm after the store's batched fsync",
        ),
        Mode("rabbitmq quorum", "quorum", True, "confirm after the Raft log entry is fsynced"),
    )

    def setup(self) -> None:
        ensure_debian_packages({"rabbitmq-server": "rabbitmq-server", "epmd": "erlang-base"}, self.log)
        try:
            import pika  # noqa: F401
        except ImportError as e:
            raise Unavailable("Python client missing: pip install -r bench/requirements.txt") from e
        base = self.workdir / "rabbitmq"
        base.mkdir()
        self.port = free_port()
        dist_port, epmd_port = free_port(), free_port()
        (base / "rabbitmq.conf").write_text(
            f"listeners.tcp.1 = {HOST}:{self.port}\nlog.console = false\nlog.file.level = warning\n"
        )
        (base / "enabled_plugins").write_text("[].\n")
        (base / "rabbitmq-env.conf").write_text("")  # instead of /etc/rabbitmq/rabbitmq-env.conf
        epmd = self.start_server("epmd", ["epmd", "-address", HOST, "-port", str(epmd_port)])
        wait_until(lambda: port_open(epmd_port), timeout_s=10, what="epmd", alive=epmd.alive)
        env = {
            "HOME": str(base),  # the Erlang cookie is created here
            "ERL_EPMD_PORT": str(epmd_port),
            "ERL_EPMD_ADDRESS": HOST,
            "RABBITMQ_NODENAME": f"hwbench{self.port}@localhost",
            "RABBITMQ_DIST_PORT": str(dist_port),
            "RABBITMQ_MNESIA_BASE": str(base / "mnesia"),
            "RABBITMQ_LOG_BASE": str(base / "log"),
            "RABBITMQ_CONFIG_FILE": str(base / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(base / "advanced.config"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(base / "enabled_plugins"),
            "RABBITMQ_CONF_ENV_FILE": str(base / "rabbitmq-env.conf"),
            "RABBITMQ_PID_FILE": str(base / "rabbitmq.pid"),
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
        }
        server = self.start_server("rabbitmq", [SERVER], env=env, stop_timeout_s=30)
        wait_until(lambda: port_open(self.port), timeout_s=90, what="rabbitmq-server", alive=server.alive, every_s=0.5)
        wait_until(self._ping, timeout_s=30, what="rabbitmq-server (AMQP)", alive=server.alive, every_s=0.5)

    def _params(self):
        import pika

        return pika.ConnectionParameters(
            host=HOST,
            port=self.port,
            credentials=pika.PlainCredentials("guest", "guest"),
            connection_attempts=1,
            socket_timeout=10,
            blocked_connection_timeout=60,
        )

    def _ping(self) -> bool:
        import pika

        pika.BlockingConnection(self._params()).close()
        return True

    def version(self) -> str:
        return (
            f"rabbitmq-server {package_version('rabbitmq-server')} (Debian), Erlang "
            f"{package_version('erlang-base')}, pika {dist_version('pika')}"
        )

    def reset(self, mode: Mode, streams: int) -> None:
        import pika

        conn = pika.BlockingConnection(self._params())
        try:
            channel = conn.channel()
            for i in range(8):  # every queue a previous workload may have left
                channel.queue_delete(f"bench-{i}")
            for i in range(streams):
                channel.queue_declare(f"bench-{i}", durable=True, arguments={"x-queue-type": mode.key})
        finally:
            conn.close()

    @contextlib.contextmanager
    def producer(self, mode: Mode, stream: int) -> Iterator:
        publisher = _Publisher(self._params(), f"bench-{stream}")
        try:
            yield publisher.send_batch
        finally:
            publisher.close()

    @contextlib.contextmanager
    def sender(self, mode: Mode, stream: int) -> Iterator:
        publisher = _Publisher(self._params(), f"bench-{stream}")
        publisher.run_in_background()
        try:
            yield publisher
        finally:
            publisher.close()

    @contextlib.contextmanager
    def consumer(self, mode: Mode, stream: int) -> Iterator:
        import pika

        conn = pika.BlockingConnection(self._params())
        buffer: list[bytes] = []
        channel = conn.channel()
        channel.basic_consume(f"bench-{stream}", lambda _ch, _method, _props, body: buffer.append(body), auto_ack=True)

        def poll(timeout_s: float) -> list[bytes]:
            conn.process_data_events(time_limit=0 if buffer else timeout_s)
            got = buffer[:]
            buffer.clear()
            return got

        try:
            yield poll
        finally:
            conn.close()


class _Publisher:
    """pika's SelectConnection with publisher confirms: publishes go out without waiting and
    confirms (single or ``multiple``) are counted as they arrive.

    ``send_batch`` publishes a batch and runs the I/O loop in the caller's thread until every
    message is confirmed. After ``run_in_background`` the loop runs in a thread instead and
    ``send`` hands each publish to it (the latency run).
    """

    def __init__(self, params, queue: str) -> None:
        import pika

        self._spec = pika.spec
        self._queue = queue
        self._props = pika.BasicProperties(delivery_mode=2)  # persistent
        self._unacked: set[int] = set()
        self._next_tag = 1
        self._floor = 1  # every tag below this is confirmed
        self._requested = 0  # sends handed to the background loop
        self._waiting = False
        self._closing = False
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._channel = None
        self._conn = pika.SelectConnection(
            params,
            on_open_callback=self._on_open,
            on_open_error_callback=self._on_failed,
            on_close_callback=self._on_closed,
        )
        self._ioloop = self._conn.ioloop
        self._ioloop.start()  # until confirm mode is on (or it failed)
        self._raise()

    def _on_open(self, conn) -> None:
        conn.channel(on_open_callback=self._on_channel)

    def _on_channel(self, channel) -> None:
        self._channel = channel
        channel.confirm_delivery(self._on_confirm, callback=lambda _frame: self._ioloop.stop())

    def _on_failed(self, _conn, error) -> None:
        self._error = RuntimeError(f"cannot connect: {error}")
        self._ioloop.stop()

    def _on_closed(self, _conn, reason) -> None:
        if not self._closing:
            self._error = RuntimeError(f"connection closed: {reason}")
        self._ioloop.stop()

    def _on_confirm(self, frame) -> None:
        method = frame.method
        if isinstance(method, self._spec.Basic.Nack):
            self._error = RuntimeError(f"broker refused message {method.delivery_tag}")
        tag = method.delivery_tag
        if method.multiple:
            for t in range(self._floor, tag + 1):
                self._unacked.discard(t)
            self._floor = max(self._floor, tag + 1)
        else:
            self._unacked.discard(tag)
        if self._waiting and (not self._unacked or self._error):
            self._ioloop.stop()

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def _publish(self, body: bytes) -> None:
        self._channel.basic_publish("", self._queue, body, self._props)
        self._unacked.add(self._next_tag)
        self._next_tag += 1

    def send_batch(self, bodies: Sequence[bytes]) -> None:
        for body in bodies:
            self._publish(body)
        self._waiting = True
        try:
            self._ioloop.start()
        finally:
            self._waiting = False
        self._raise()

    def run_in_background(self) -> None:
        self._thread = threading.Thread(target=self._ioloop.start, name="pika-ioloop", daemon=True)
        self._thread.start()

    def send(self, body: bytes) -> None:
        self._raise()
        self._requested += 1
        self._ioloop.add_callback_threadsafe(functools.partial(self._publish, body))

    def wait_acked(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while self._next_tag - 1 < self._requested or self._unacked:
            self._raise()
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(self._unacked)} publishes unconfirmed")
            time.sleep(0.005)
        self._raise()

    def close(self) -> None:
        self._closing = True
        if self._thread is not None:
            self._ioloop.add_callback_threadsafe(self._conn.close)
            self._thread.join(timeout=10)
        elif self._conn.is_open:
            self._conn.close()
            self._ioloop.start()  # until the close completes
