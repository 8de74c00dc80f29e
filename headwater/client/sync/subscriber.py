"""Subscriber: a push subscription's process, on a thread (the subscription and its
delivery: :mod:`headwater.client.common.subscriber`)."""

from __future__ import annotations

import queue as queue_mod
import threading
import time
from typing import Any

from headwater.client.common.closing import ClosesOnExit
from headwater.client.common.subscriber import Listener, SubscriberBase
from headwater.client.common.twins import BLOCKING
from headwater.client.sync.consumer import Consumer
from headwater.model.service import OpensPushStreams, RoutesPushStreams

__all__ = ["Subscriber", "SubscriberBase", "Listener"]


class Subscriber(SubscriberBase, ClosesOnExit, driver=BLOCKING):
    """One process attached to a registered subscriber. Thread-safe; listeners run on the
    subscriber's thread.

    >>> import headwater, tempfile
    >>> hw = headwater.open(tempfile.mkdtemp())
    >>> _ = hw.admin.create_queue("orders")
    >>> _ = hw.admin.add_subscriber("orders", "audit", start="earliest")
    >>> _ = hw.send("orders", b"paid")
    >>> seen = []
    >>> sub = hw.subscribe("orders", "audit", listeners=[lambda r: seen.append(r.body)])
    >>> sub.wait_for(lambda: seen, timeout_s=5)
    True
    >>> sub.stop(); seen, sub.positions
    ([b'paid'], {0: 1})
    >>> hw.close()
    """

    _Inbox = queue_mod.SimpleQueue  # bounded by the credit
    _Event = threading.Event
    _Consumer = Consumer
    _push_streams = OpensPushStreams
    _routes_push = RoutesPushStreams
    _sleep = staticmethod(time.sleep)

    def _launch(self) -> None:
        self._runner = threading.Thread(target=self._run, name=f"headwater-subscriber-{self.name}", daemon=True)
        self._runner.start()

    def _joined(self, timeout_s: float) -> None:
        t = self._runner
        if t is not None and t is not threading.current_thread():
            t.join(timeout_s)

    def _until_stopped(self, timeout_s: float | None) -> bool:
        return self._stopped.wait(timeout_s)

    def _next_push(self, timeout_s: float) -> Any:
        try:
            return self._inbox.get(timeout=timeout_s)
        except queue_mod.Empty:
            return None

    def _settled(self, fut: Any, timeout_s: float) -> Any:
        return fut.result(timeout=timeout_s)
