"""SharedConsumer: a member of a shared group, taking messages from any partition, on the
caller's thread (what it does: :mod:`headwater.client.common.shared_consumer`)."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator
from typing import Any, cast

from headwater.client.common.closing import ClosesOnExit
from headwater.client.common.shared_consumer import Delivery, SharedConsumerBase
from headwater.client.common.twins import BLOCKING
from headwater.client.transport.polling import wait_any
from headwater.client.transport.send_future import LazyFuture
from headwater.model.service import BrokerService, StartsSharedReceive

__all__ = ["Delivery", "SharedConsumer"]


class SharedConsumer(SharedConsumerBase, ClosesOnExit, driver=BLOCKING):
    """A member of shared group ``group`` on ``queue``. Use from one thread. The settings
    are :class:`~headwater.client.common.shared_consumer.SharedConsumerBase`'s.

    >>> import headwater, tempfile
    >>> hw = headwater.open(tempfile.mkdtemp())
    >>> _ = hw.admin.create_queue("jobs", partitions=2)
    >>> _ = hw.send_batch("jobs", [b"a", b"b"], partition=1)
    >>> c = hw.shared_consumer("workers", "jobs", visibility_timeout_ms=10_000)
    >>> msgs = c.receive(max_messages=10, timeout_ms=100)
    >>> [(m.body, m.attempt) for m in msgs]
    [(b'a', 1), (b'b', 1)]
    >>> c.ack(msgs); c.close(); hw.close()
    """

    _service: BrokerService

    def wakeup(self) -> None:
        """End the receive that waits now with :class:`~headwater.errors.WakeupError`, or
        the next receive if none waits (Kafka's ``wakeup()``, as ``Consumer.wakeup``): the
        one method another thread may call, to stop a receive loop from outside (a signal
        handler, a supervisor). Each call raises once. Nothing leased is lost: what the
        broker answered, or answers later to a receive already sent (its long poll runs
        on), is handed out by a later receive, or given back by ``close()``, which waits
        for such an answer up to the end of that long poll. Embedded, the receive ends
        within ``LOCAL_SLICE_MS`` (0.1 s)."""
        self._wake_blocking()

    def _new_waiter(self) -> LazyFuture:
        return LazyFuture()

    def _wait_receive(self, futures: list[Any], timeout_s: float | None) -> None:
        """Wait until one of ``futures`` is done or ``timeout_s`` passes (None: no limit),
        reading the answers on this thread if nobody else reads; a wakeup ends it at once."""
        lead = cast(StartsSharedReceive, self._service).lead
        wakeup = self._wakeup
        interrupt = wakeup if any(f is wakeup for f in futures) else None
        if timeout_s is not None:
            wait_any(futures, timeout_s, lead=lead, interrupt=interrupt)
            return
        lead(futures, None, interrupt=interrupt)  # this thread reads, if nobody else reads
        concurrent.futures.wait(futures, return_when=concurrent.futures.FIRST_COMPLETED)

    def __iter__(self) -> Iterator[Delivery]:
        """Deliveries forever (until :meth:`close`), receiving as needed."""
        while not self._closed:
            yield from self.receive()
