"""KeyedConsumer: one member of a keyed group, on the caller's thread (what it does:
:mod:`headwater.client.common.keyed_consumer`)."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator
from typing import Any

from headwater.client.common.closing import ClosesOnExit
from headwater.client.common.keyed_consumer import KeyedConsumerBase
from headwater.client.common.twins import BLOCKING
from headwater.client.transport.polling import wait_any
from headwater.client.transport.send_future import LazyFuture
from headwater.model.message import Record
from headwater.model.service import BrokerService, DescribesAsync, KeyedFetchesAsync, Leads

__all__ = ["KeyedConsumer"]

_FETCH_THREADS_MAX = 16  # threads fetching at once when the service has no asynchronous fetch


class KeyedConsumer(KeyedConsumerBase, ClosesOnExit, driver=BLOCKING):
    """Member ``member`` of keyed group ``group`` on ``queue``. Use from one thread. It
    joins the group when made; the settings are
    :class:`~headwater.client.common.keyed_consumer.KeyedConsumerBase`'s.

    >>> import headwater, tempfile
    >>> hw = headwater.open(tempfile.mkdtemp())
    >>> _ = hw.admin.create_queue("clicks")
    >>> _ = hw.send_batch("clicks", [headwater.Message(b"x", key=b"user-%d" % i) for i in range(9)])
    >>> m0 = hw.keyed_consumer("counters", "clicks", member=0, size=2)
    >>> m1 = hw.keyed_consumer("counters", "clicks", member=1, size=2)
    >>> got0, got1 = m0.poll(timeout_ms=200), m1.poll(timeout_ms=200)
    >>> len(got0) + len(got1), sorted({r.key for r in got0}) == sorted({r.key for r in got1})
    (9, False)
    >>> m0.commit(); m1.commit(); hw.close()
    """

    _service: BrokerService

    def __init__(self, service: BrokerService, group: str, queue: str, **settings: Any) -> None:
        super().__init__(service, group, queue, **settings)
        self._fetch_async = service.keyed_fetch_async if isinstance(service, KeyedFetchesAsync) else None
        # over the network: this thread reads the answers to its fetches (RemoteService.lead)
        self._lead = service.lead if self._fetch_async is not None and isinstance(service, Leads) else None
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        # over the network
        self._describe_async = service.describe_queue_async if isinstance(service, DescribesAsync) else None
        self.refresh()  # join

    def poll(self, max_messages: int | None = None, timeout_ms: int = 1000) -> list[Record]:
        return self._buffered(max_messages, timeout_ms) or self._poll(max_messages, timeout_ms)

    poll.__doc__ = KeyedConsumerBase._poll.__doc__  # one docstring, on the body

    def __iter__(self) -> Iterator[Record]:
        """This member's records forever (until :meth:`close`), polling as needed: ``for
        record in member``. A poll comes once the loop has taken every record of the one
        before, so those count as processed (as :meth:`poll` says)."""
        while not self._closed:
            yield from self.poll()

    def wakeup(self) -> None:
        """End the poll that waits now with :class:`~headwater.errors.WakeupError`, or the
        next poll if none waits (Kafka's ``wakeup()``, as ``Consumer.wakeup``): the one
        method another thread may call, to stop a poll loop from outside (a signal
        handler, a supervisor). Each call raises once. Records already fetched are not
        handed out past it: they stay buffered for the poll after, and the positions and
        the member's place in its group are unchanged, so poll again, or ``commit()`` and
        ``close()``."""
        self._wake_blocking()

    def _ask_partitions(self) -> None:
        if self._describe_async is None:
            self._add_partitions(self._service.describe_queue(self.queue))
        else:
            self._asked_partitions(self._describe_async(self.queue))

    def _start_fetch(self, args: tuple, wait_ms: int) -> Any:
        if self._fetch_async is not None:
            # over the network this thread reads the answer (polling.wait_any)
            lead = {"lead": True} if self._lead is not None else {}
            return self._fetch_async(*args, max_bytes=self._fetch_bytes, max_wait_ms=wait_ms, **lead)
        if len(self._fetch_pos) > _FETCH_THREADS_MAX:
            wait_ms = min(wait_ms, 50)  # let the threads cycle over many partitions
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(_FETCH_THREADS_MAX, thread_name_prefix="headwater-keyed")
        return self._pool.submit(self._service.keyed_fetch, *args, max_bytes=self._fetch_bytes, max_wait_ms=wait_ms)

    def _wait_fetches(self, timeout_s: float) -> None:
        futures = [f for _, f in self._inflight.values()]
        if futures:
            # over the network: reads on this thread; a wakeup() ends the wait at once
            wakeup = self._wakeup
            wait_any([*futures, wakeup], timeout_s, lead=self._lead, interrupt=wakeup)

    def _nap(self, timeout_s: float) -> None:
        wait_any([self._wakeup], timeout_s)

    def _new_waiter(self) -> LazyFuture:
        return LazyFuture()

    def close(self) -> None:
        """Stop (positions not committed are not stored)."""
        self._closed = True
        self._inflight.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
