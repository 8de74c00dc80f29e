"""Drivers for the network benchmark (``python -m bench.network``): Headwater and its peers.

One module per system, each a :class:`~bench.peers.base.Driver` with the same small interface:
``setup()`` installs the server from Debian's packages if missing and starts it on a free
127.0.0.1 port with its data under /tmp; ``use_mode`` / ``reset`` prepare a workload;
``produce`` / ``consume`` / ``latency`` measure it (all timed by the shared loops in
:mod:`bench.peers.base`); ``teardown()`` stops the server.
"""

from __future__ import annotations

import importlib

from bench.peers.base import Driver, Mode, Unavailable

__all__ = ["SYSTEMS", "LATENCY_ONLY", "REFERENCES", "Driver", "Mode", "Unavailable", "driver_class"]

# name on the command line -> (module, class)
SYSTEMS: dict[str, tuple[str, str]] = {
    "headwater": ("bench.peers.headwater_net", "HeadwaterNet"),
    "redis": ("bench.peers.redis_streams", "RedisStreams"),
    "nats": ("bench.peers.nats_jetstream", "NatsJetStream"),
    "rabbitmq": ("bench.peers.rabbitmq", "RabbitMQ"),
}

# systems that only the latency benchmark runs (bench.latency): Headwater through its asyncio
# client, and through its blocking client with one batch of a partition in flight at a time
LATENCY_ONLY: dict[str, tuple[str, str]] = {
    "headwater-aio": ("bench.peers.headwater_net", "HeadwaterAio"),
    "headwater-1inflight": ("bench.peers.headwater_net", "HeadwaterOneInFlight"),
}

# yardsticks, not systems: the latency benchmark runs them beside the systems to show what the
# machine itself allows (their modes are marked ``reference`` and are nobody's peer)
REFERENCES: dict[str, tuple[str, str]] = {
    "floor": ("bench.peers.floor", "PythonFloor"),
}


def driver_class(name: str) -> type[Driver]:
    module, cls = SYSTEMS.get(name) or LATENCY_ONLY.get(name) or REFERENCES[name]
    return getattr(importlib.import_module(module), cls)
