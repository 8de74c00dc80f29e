"""Redis Streams with an append-only file: ``redis-server`` from Debian, driven by redis-py.

Modes (one server; ``CONFIG SET appendfsync`` switches between them):

- ``everysec``: a reply follows the write(2) to the AOF; fsync once a second in the background,
  so a power loss can lose about a second of acknowledged messages.
- ``always``: Redis fsyncs the AOF before it sends the replies of an event-loop iteration
  (one fsync covers a whole pipeline), so an acknowledged message is on disk.

Client: redis-py with the hiredis parser. A batch is a non-transactional pipeline of XADDs
(one round trip); reading is XREAD COUNT 500 from the last id seen (BLOCK for the latency run).
Stream i is the key ``bench-i``; ``reset`` deletes them. Snapshots (RDB) are off.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator, Sequence

from bench.peers.base import (
    HOST,
    Driver,
    Mode,
    PipelinedSender,
    Unavailable,
    dist_version,
    ensure_debian_packages,
    free_port,
    package_version,
    wait_until,
)

__all__ = ["RedisStreams"]

READ_COUNT = 500


class RedisStreams(Driver):
    system = "redis"
    modes = (
        Mode("redis everysec", "everysec", False, "after write(2) to the AOF; fsync every 1 s"),
        Mode("redis always", "always", True, "after fsync of the AOF (one per event-loop pass)"),
    )

    def setup(self) -> None:
        ensure_debian_packages({"redis-server": "redis-server"}, self.log)
        try:
            import redis  # noqa: F401
        except ImportError as e:
            raise Unavailable("Python client missing: pip install -r bench/requirements.txt") from e
        self.port = free_port()
        data = self.workdir / "redis-data"
        data.mkdir()
        server = self.start_server(
            "redis",
            [
                shutil.which("redis-server") or "redis-server",
                "--bind",
                HOST,
                "--port",
                str(self.port),
                "--dir",
                str(data),
                "--appendonly",
                "yes",
                "--appendfsync",
                "everysec",
                "--save",
                "",
                "--protected-mode",
                "yes",
                "--daemonize",
                "no",
                "--logfile",
                "",
            ],
        )
        wait_until(lambda: self._client().ping(), timeout_s=20, what="redis-server", alive=server.alive)

    def version(self) -> str:
        return f"redis-server {package_version('redis-server')} (Debian), redis-py {dist_version('redis')}"

    def _client(self):
        import redis

        return redis.Redis(host=HOST, port=self.port, socket_timeout=30)

    def use_mode(self, mode: Mode) -> None:
        self._client().config_set("appendfsync", mode.key)

    def reset(self, mode: Mode, streams: int) -> None:
        r = self._client()
        keys = r.keys("bench-*")
        if keys:
            r.delete(*keys)
        r.config_set("appendfsync", mode.key)

    @contextlib.contextmanager
    def producer(self, mode: Mode, stream: int) -> Iterator:
        r = self._client()
        key = f"bench-{stream}"

        def send_batch(bodies: Sequence[bytes]) -> None:
            pipe = r.pipeline(transaction=False)
            for body in bodies:
                pipe.xadd(key, {"d": body})
            pipe.execute()

        try:
            yield send_batch
        finally:
            r.close()

    def sender(self, mode: Mode, stream: int) -> contextlib.closing:
        return contextlib.closing(_PipelinedSender(self.port, f"bench-{stream}"))

    @contextlib.contextmanager
    def consumer(self, mode: Mode, stream: int) -> Iterator:
        r = self._client()
        key = f"bench-{stream}"
        last = ["0-0"]

        def poll(timeout_s: float) -> list[bytes]:
            got = r.xread({key: last[0]}, count=READ_COUNT, block=max(1, int(timeout_s * 1000)))
            if not got:
                return []
            entries = got[0][1]
            last[0] = entries[-1][0]
            return [fields[b"d"] for _id, fields in entries]

        try:
            yield poll
        finally:
            r.close()


class _PipelinedSender(PipelinedSender):
    """XADDs written on one connection as they come, replies read by a second thread.

    redis-py has no asynchronous send on one connection; this is what its pipeline does,
    spread over time: commands go out without waiting, replies are matched in order.
    """

    what = "XADDs"

    def __init__(self, port: int, key: str) -> None:
        from redis.connection import Connection

        self._conn = Connection(host=HOST, port=port, socket_timeout=60)
        self._conn.connect()
        self._key = key
        super().__init__("redis-replies")

    def _read_acks(self) -> int:
        reply = self._conn.read_response()
        if isinstance(reply, Exception):
            raise reply
        return 1

    def _write(self, body: bytes) -> None:
        self._conn.send_command("XADD", self._key, "*", "d", body)

    def _disconnect(self) -> None:
        self._conn.disconnect()
