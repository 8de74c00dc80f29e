"""Every setting of ``headwater serve``: what it means, its default, its variable.

One line per field of :class:`~headwater.broker.server.ServerConfig` (the ``[server]`` table)
and :class:`~headwater.storage.StoreConfig` (``[store]``); a test checks none is missing.
``headwater serve --settings`` prints them as a table.

>>> row = next(r for r in settings_rows() if r.name == "flush_bytes")
>>> row.table, row.default, row.variable
('store', '8,388,608', 'HEADWATER_FLUSH_BYTES')
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["MEANINGS", "Row", "settings_rows"]

MEANINGS: dict[str, str] = {
    # [server]
    "host": "address to listen on",
    "port": "port to listen on (0: any free port)",
    "connections_max": "open connections; more are refused",
    "requests_in_flight_max": "unanswered requests per connection (announced in the handshake)",
    "connection_bytes_in_flight_max": "bytes of requests and answers in flight per connection; past it, "
    "stop reading it",
    "bytes_in_flight_max": "the same for the whole server",
    "fetch_bytes_max": "bytes of one fetch answer",
    "fetch_wait_ms_max": "longest a long-polling fetch may wait, whatever the client asks",
    "frame_bytes_max": "largest frame accepted (announced in the handshake)",
    "handshake_timeout_s": "a connection that has not completed its handshake by then is closed",
    "idle_timeout_s": "a connection that sent nothing for this long is closed",
    "worker_threads": "threads for blocking work (sync-flush acknowledgements, scans, lookups)",
    "write_buffer_bytes_max": "answers a client has not read; past it, stop reading its requests",
    "shutdown_grace_s": "on SIGTERM, how long requests in flight may take to finish",
    "push_bytes_max": "bytes of one PUSH frame of a subscription or fetch stream",
    "push_streams_max": "subscription streams per connection, and fetch streams likewise",
    "allocator_cache_bytes": "freed memory glibc's allocator keeps for reuse instead of giving it back "
    "(0: its defaults)",
    "send_timeout_s": "a client that takes none of the answers waiting for it for this long is cut off "
    "(it holds the server's memory)",
    "frame_timeout_s": "a frame must arrive whole within this long of its first byte; a client that "
    "trickles one is cut off (it holds the server's memory and byte budget)",
    "zookeeper": "join a cluster: ZooKeeper's HOST:PORT[,HOST:PORT...][/chroot] (chroot /headwater when none); "
    "empty: run alone",
    "broker_id": "this broker's id in the cluster, unique, 0 or more (with zookeeper); -1: none",
    "advertised_host": "the host other brokers and clients reach this broker by (empty: host, or this "
    "machine's name when host is a wildcard)",
    "zookeeper_session_timeout_s": "a broker ZooKeeper has not heard from for this long leaves the cluster "
    "(its registration and what it led go to others)",
    "zookeeper_connect_timeout_s": "at start, how long to keep trying to reach ZooKeeper before giving up",
    "auto_rebalance_after_s": "while this broker is the controller: rebalance by itself (cluster rebalance) once "
    "the live brokers have been the same this long, e.g. after one joined; 0: off, rebalance by hand",
    "moves_running_max": "while this broker is the controller: the partition moves that run at once "
    "(the others of a rebalance or decommission wait their turn)",
    "coordinator_partitions": "the partitions of a cluster's consumer-group coordinator queue, fixed by the "
    "broker whose group call makes it (the cluster's first): each is a unit of coordinators that moves",
    "idle_spin_us": "after serving, poll the clients' sockets without blocking this long (µs) before waiting, "
    "so that a request coming soon finds the CPU awake; paused while spins find nothing; 0: off",
    "metrics": "keep Prometheus metrics, served by the METRICS request (headwater metrics, docs/metrics.md); "
    "false: none, and the request path pays nothing for them",
    # [store]
    "flush": "default flush policy of queues that name none: sync (fsync before acknowledging) or async",
    "flush_interval_ms": "async: the longest a write waits for its fsync",
    "flush_bytes": "async: fsync sooner once this many bytes were written since the last fsync",
    "offsets_flush": "consumer groups' offset commits: async (answered once written; a power loss may "
    "redeliver the last flush_interval_ms of commits) or sync (answered after the fsync)",
    "page_cache_keep_bytes": "the newest fsynced log left in the OS page cache; older is dropped "
    "(0: leave it to the kernel)",
    "segment_bytes_max": "size of a commit log segment file",
    "open_segments_max": "sealed segments kept open for reading",
    "index_cache_segments": "sealed segments whose index is kept in memory",
    "retention_interval_ms": "how often TTL and retention are enforced",
    "verify": "on open, check the last segment (tail) or every segment (all)",
    "read_only": "serve reads only: no recovery cut, no file changed, every write refused "
    "(to inspect a copy or a backup)",
    "producer_expiry_ms": "idempotence state of a producer idle this long is dropped",
    "delay_max_s": "a delayed message may be due at most this far ahead",
    "delay_bucket_s": "span of one schedule file of delayed messages (whole minutes)",
    "queue_partitions_max": "partitions of one queue; creating or growing one past it is refused",
    "partitions_max": "partitions of all queues together (the broker's own included); past it, creating "
    "or growing a queue is refused",
}


class Row(NamedTuple):
    table: str
    name: str
    default: str
    variable: str
    meaning: str


def settings_rows() -> list[Row]:
    """One row per setting, the server's first, each table in declaration order."""
    from headwater import StoreConfig  # lazy (headwater.__getattr__): the storage loads here
    from headwater.broker.server import ServerConfig  # here: only serve --settings needs the broker

    rows = []
    for table, cls in (("server", ServerConfig), ("store", StoreConfig)):
        defaults = cls()
        for name in cls.__struct_fields__:
            value = getattr(defaults, name)
            counted = isinstance(value, int) and not isinstance(value, bool) and name != "port"  # 7070, not 7,070
            shown = f"{value:,}" if counted else str(value)
            rows.append(Row(table, name, shown, f"HEADWATER_{name.upper()}", MEANINGS.get(name, "")))
    return rows
