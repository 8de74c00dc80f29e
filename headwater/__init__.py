"""Headwater: a persistent, partitioned message queue for Python, embedded or served.

>>> import headwater, tempfile
>>> with headwater.open(tempfile.mkdtemp()) as hw:
...     _ = hw.admin.create_queue("events", partitions=2)
...     mid = hw.send("events", b"hello", key=b"user-1", tag="greeting")
...     [r.body for r in hw.scanner("events", tags="greeting")]
[b'hello']
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from headwater._version import __version__
from headwater.errors import *  # noqa: F403 - the error tree is public API
from headwater.errors import InvalidArgumentError
from headwater.errors import __all__ as _errors_all

if TYPE_CHECKING:
    from headwater.client import (
        Admin,
        BatchReceipt,
        Client,
        Consumer,
        Delivery,
        GroupConsumer,
        KeyedConsumer,
        Producer,
        Scanner,
        SharedConsumer,
        Subscriber,
    )
    from headwater.model import Message, MessageId, PartitionInfo, QueueConfig, QueueInfo, Record
    from headwater.storage import StoreConfig

#: Where each lazily loaded public name lives: ``import headwater`` stays cheap (the CLI's
#: start time, issue 33) and the client, the model and the storage load on first use
#: (PEP 562).
_LAZY: dict[str, str] = {
    **dict.fromkeys(
        [
            "Admin",
            "BatchReceipt",
            "Client",
            "Consumer",
            "Delivery",
            "GroupConsumer",
            "KeyedConsumer",
            "Producer",
            "Scanner",
            "SharedConsumer",
            "Subscriber",
        ],
        "headwater.client",
    ),
    **dict.fromkeys(["Message", "MessageId", "PartitionInfo", "QueueConfig", "QueueInfo", "Record"], "headwater.model"),
    "StoreConfig": "headwater.storage",
}

__all__ = [
    "open",
    "connect",
    "Admin",
    "BatchReceipt",
    "Client",
    "Consumer",
    "Delivery",
    "GroupConsumer",
    "KeyedConsumer",
    "SharedConsumer",
    "Subscriber",
    "Message",
    "MessageId",
    "PartitionInfo",
    "Producer",
    "QueueConfig",
    "QueueInfo",
    "Record",
    "Scanner",
    "StoreConfig",
    "__version__",
    *_errors_all,
]


def __getattr__(name: str) -> Any:
    """Load a public name's module on first use and keep the name here (PEP 562)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'headwater' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


def connect(address: str, *, connect_timeout_s: float = 10.0, request_timeout_s: float = 60.0) -> Client:
    """Connect to a broker (``headwater serve``) at ``"host:port"``, or to a cluster through
    a bootstrap list ``"host1:port1,host2:port2,..."``; the same Client as :func:`open`
    returns, over the network.

    The first address that answers says where things are (METADATA; the next is tried when
    one cannot be reached). A broker running alone gives a client of that one connection; a
    broker of a cluster gives a client that sends each partition's requests to its leader
    (docs/cluster.md, "Clients").

    Raises :class:`UnavailableError` if nothing answers within ``connect_timeout_s`` (each
    address in turn). ``request_timeout_s`` bounds each call, the tries after a lost
    connection included; a call is sent again only if that is safe (docs/design/client.md,
    "What a blocking call sends again").
    """
    from headwater.client import Client
    from headwater.client.transport.bootstrap import open_service

    return Client(open_service(address, connect_timeout_s=connect_timeout_s, request_timeout_s=request_timeout_s))


def open(
    path: str | Path,
    config: StoreConfig | None = None,
    *,  # noqa: A001 - like io.open
    clock: Callable[[], float] = time.time,
    **settings,
) -> Client:
    """Open (or create) a data directory and return a client bound to an in-process broker.

    ``settings`` are :class:`StoreConfig` fields, e.g. ``flush="sync"``. With
    ``read_only=True`` the directory must hold a store already (an empty one reads as a
    store with no queues), and nothing in it changes: no recovery cut, no index or file
    rewritten, no delayed message delivered; what a repair would do is in
    ``status()["recovery"]`` (``headwater check --repair`` does it), and every write
    raises :class:`~headwater.errors.ReadOnlyStoreError`.
    """
    from headwater.broker import Broker
    from headwater.client import Client
    from headwater.storage import StoreConfig

    if settings:
        if config is not None:
            raise TypeError("pass either config or keyword settings, not both")
        try:
            config = StoreConfig(**settings)
        except TypeError as e:
            raise InvalidArgumentError(f"{e}; valid settings: {', '.join(StoreConfig.__struct_fields__)}") from None
    return Client(Broker.open(path, config, clock=clock))
