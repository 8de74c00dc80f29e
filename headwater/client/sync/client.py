"""Client and Admin: the handle a user holds, the same whether the broker is embedded or remote.

Their methods are written once in :mod:`headwater.client.common.client`; here they block
until the broker answers, and ``close()`` closes what must act while the connection is up.
"""

from __future__ import annotations

import weakref
from typing import Any

from headwater.client.common.client import AdminBase, ClientBase
from headwater.client.common.closing import ClosesOnExit
from headwater.client.common.twins import BLOCKING
from headwater.client.sync.consumer import Consumer
from headwater.client.sync.group_consumer import GroupConsumer
from headwater.client.sync.keyed_consumer import KeyedConsumer
from headwater.client.sync.producer import Producer
from headwater.client.sync.scanner import Scanner
from headwater.client.sync.shared_consumer import SharedConsumer
from headwater.client.sync.subscriber import Subscriber
from headwater.model.service import BrokerService

__all__ = ["Admin", "Client"]


class Admin(AdminBase, driver=BLOCKING):
    """Create, inspect and change queues."""


class Client(ClientBase, ClosesOnExit, driver=BLOCKING):
    """Admin, producing, scanning and lookups over one broker.

    Get one with ``headwater.open(path)`` (embedded) or ``headwater.connect("host:port")``:
    both return this shape.
    """

    _admin_class = Admin
    _producer_class = Producer
    _consumer_class = Consumer
    _group_consumer_class = GroupConsumer
    _shared_consumer_class = SharedConsumer
    _keyed_consumer_class = KeyedConsumer
    _subscriber_class = Subscriber
    _scanner_class = Scanner
    _send_and_wait = staticmethod(Producer.send_and_wait)  # Producer.send only returns a future

    def __init__(self, service: BrokerService) -> None:
        super().__init__(service)
        self._producers: weakref.WeakSet[Producer] = weakref.WeakSet()  # flushed by close()
        self._members: weakref.WeakSet[GroupConsumer] = weakref.WeakSet()  # leave their groups on close()
        self._subscribers: weakref.WeakSet[Subscriber] = weakref.WeakSet()  # stopped by close()

    def _adopt(self, child: Any) -> None:
        # only what close() must finish while the connection is up; a plain, shared or
        # keyed consumer is not held (the client never closed them)
        if isinstance(child, Producer):
            self._producers.add(child)
        elif isinstance(child, GroupConsumer):
            self._members.add(child)
        elif isinstance(child, Subscriber):
            self._subscribers.add(child)

    def close(self) -> None:
        """Close the group members, subscribers and producers made here, then the service."""
        for c in list(self._members):
            c.close()  # commits (commit_on_revoke) and leaves while the connection is up
        for s in list(self._subscribers):
            s.stop()  # their last checkpoints go out before the connection closes
        for p in list(self._producers):
            p.close()
        self._service.close()
