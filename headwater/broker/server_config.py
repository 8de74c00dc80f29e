"""ServerConfig: the settings of the network server (flags, environment HEADWATER_*, or a TOML
file), each checked against its range before the server starts."""

from __future__ import annotations

import socket

import msgspec

from headwater.broker.idle_spin import IDLE_SPIN_US_DEFAULT, IDLE_SPIN_US_MAX
from headwater.cluster.membership import BROKER_ID_MAX, ZooKeeperAddress
from headwater.errors import InvalidArgumentError
from headwater.model.config import DEFAULT_PORT
from headwater.protocol import FRAME_BYTES_MIN

__all__ = ["ServerConfig"]


class ServerConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Settings of the network server (flags, environment HEADWATER_*, or a TOML file)."""

    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    connections_max: int = 20_000
    requests_in_flight_max: int = 256  # per connection
    connection_bytes_in_flight_max: int = 64 * 1024 * 1024  # requests + responses, per connection
    bytes_in_flight_max: int = 512 * 1024 * 1024  # the same, for the whole server
    fetch_bytes_max: int = 16 * 1024 * 1024  # one fetch response
    fetch_wait_ms_max: int = 30_000
    frame_bytes_max: int = 64 * 1024 * 1024 + 64 * 1024
    handshake_timeout_s: float = 10.0
    idle_timeout_s: float = 600.0
    worker_threads: int = 32
    write_buffer_bytes_max: int = 256 * 1024  # answers a peer has not taken: past this, stop reading it
    shutdown_grace_s: float = 10.0
    push_bytes_max: int = 1024 * 1024  # one PUSH frame of a subscription or fetch stream
    push_streams_max: int = 64  # subscription streams per connection; fetch streams likewise
    allocator_cache_bytes: int = 128 * 1024 * 1024  # freed memory kept for reuse (headwater.broker.allocator); 0: off
    send_timeout_s: float = 30.0  # a peer that takes none of its waiting answers for this long is cut off
    frame_timeout_s: float = 30.0  # a frame begun must be whole this long after its first byte
    # a cluster (docs/cluster.md): without zookeeper the broker runs alone
    zookeeper: str = ""  # HOST:PORT[,HOST:PORT...][/chroot]
    broker_id: int = -1  # this broker's id in the cluster; -1: none (alone)
    advertised_host: str = ""  # the host other brokers and clients reach this one by; "": host
    zookeeper_session_timeout_s: float = 10.0
    zookeeper_connect_timeout_s: float = 30.0
    moves_running_max: int = 4  # partition moves running at once while this broker is the controller
    auto_rebalance_after_s: float = 0.0  # rebalance by itself once the brokers are unchanged this long; 0: off
    coordinator_partitions: int = 16  # the coordinator queue's partitions, if this broker is the one to make it
    idle_spin_us: int = IDLE_SPIN_US_DEFAULT  # poll the clients' sockets this long before the loop blocks; 0: off
    metrics: bool = True  # keep Prometheus metrics (headwater.broker.metrics; needs prometheus-client)

    def validated(self) -> ServerConfig:
        """This config, or :class:`InvalidArgumentError` naming the first setting out of range."""
        for name, lo, hi in _WHOLE_RANGES:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
                raise InvalidArgumentError(f"{name} must be a whole number from {lo:,} to {hi:,}, got {value!r}")
        for name, lo, hi in _SECONDS_RANGES:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo <= value <= hi:
                raise InvalidArgumentError(f"{name} must be a number of seconds from {lo:g} to {hi:g}, got {value!r}")
        if self.fetch_bytes_max > self.frame_bytes_max - 4096:
            raise InvalidArgumentError(
                f"fetch_bytes_max ({self.fetch_bytes_max:,}) must leave room in a frame: at most "
                f"frame_bytes_max - 4096 ({self.frame_bytes_max - 4096:,})"
            )
        self._validate_cluster()
        if self.push_bytes_max > self.frame_bytes_max - 4096:
            raise InvalidArgumentError(
                f"push_bytes_max ({self.push_bytes_max:,}) must leave room in a frame: at most "
                f"frame_bytes_max - 4096 ({self.frame_bytes_max - 4096:,})"
            )
        return self

    def _validate_cluster(self) -> None:
        if not self.zookeeper:
            if self.broker_id != -1:
                raise InvalidArgumentError(
                    f"broker_id {self.broker_id!r} is given without zookeeper: a broker id names a broker of "
                    f"a cluster; give --zookeeper HOST:PORT too, or no broker id to run alone"
                )
            return
        ZooKeeperAddress.parse(self.zookeeper)
        b = self.broker_id
        if b == -1:
            raise InvalidArgumentError(
                "zookeeper is given, so this broker needs an id, unique in the cluster: --broker-id N "
                "(or broker_id in the config, HEADWATER_BROKER_ID)"
            )
        if isinstance(b, bool) or not isinstance(b, int) or not 0 <= b <= BROKER_ID_MAX:
            raise InvalidArgumentError(
                f"broker_id must be a whole number from 0 to {BROKER_ID_MAX:,}, unique in the cluster, when "
                f"zookeeper is given (--broker-id N), got {b!r}"
            )

    @property
    def advertised_address(self) -> str:
        """The host others reach this broker by: ``advertised_host``, else ``host`` unless that
        is a wildcard (every address), which names no one: then this machine's name."""
        if self.advertised_host:
            return self.advertised_host
        return socket.getfqdn() if self.host in ("", "0.0.0.0", "::") else self.host


_U32 = 2**32 - 1
# (setting, lowest, highest) of the whole-number settings; the frame and in-flight bounds are
# the protocol's own (headwater.protocol.Connection checks them again)
_WHOLE_RANGES = (
    ("port", 0, 65535),
    ("connections_max", 1, 1_000_000),
    ("requests_in_flight_max", 1, _U32),
    ("connection_bytes_in_flight_max", 1, 2**40),
    ("bytes_in_flight_max", 1, 2**40),
    ("fetch_bytes_max", 1, _U32),
    ("fetch_wait_ms_max", 0, 24 * 3600 * 1000),
    ("frame_bytes_max", FRAME_BYTES_MIN, _U32),
    ("worker_threads", 1, 1024),
    ("write_buffer_bytes_max", 1, 2**40),
    ("push_bytes_max", 1024, _U32),
    ("push_streams_max", 1, 1_000_000),
    ("allocator_cache_bytes", 0, 2**31 - 1),
    ("moves_running_max", 1, 1000),
    ("coordinator_partitions", 1, 1000),
    ("idle_spin_us", 0, IDLE_SPIN_US_MAX),
)
_SECONDS_RANGES = (
    ("handshake_timeout_s", 0.001, 86400.0),
    ("idle_timeout_s", 0.001, 365 * 86400.0),
    ("shutdown_grace_s", 0.0, 86400.0),
    ("send_timeout_s", 0.001, 86400.0),
    ("frame_timeout_s", 0.001, 86400.0),
    ("zookeeper_session_timeout_s", 0.4, 600.0),
    ("zookeeper_connect_timeout_s", 0.1, 86400.0),
    ("auto_rebalance_after_s", 0.0, 7 * 86400.0),
)
