"""SharedConsumer: a member of a shared group, taking messages from any partition, on the
caller's thread (what it does: :mod:`headwater.client.common.shared_consumer`)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any, cast

from headwater.client.common.closing import ClosesOnExit
from headwater.client.common.shared_consumer import Delivery, SharedConsumerBase
from headwater.client.common.twins import BLOCKING
from headwater.client.transport.polling import wait_any
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
    _sleep = staticmethod(time.sleep)

    def _written_answer(self, args: tuple, timeout_s: float) -> Any:
        service = cast(StartsSharedReceive, self._service)
        fut = service.start_shared_receive(*args)
        lead = service.lead
        wait_any([fut], timeout_s, lead=lead)  # this thread reads its answer, if nobody else reads
        if not fut.done():
            if service.withdraw(fut):
                return None
            lead([fut], None)  # written: the broker answers by its long poll's end
        return fut.result()

    def __iter__(self) -> Iterator[Delivery]:
        """Deliveries forever (until :meth:`close`), receiving as needed."""
        while not self._closed:
            yield from self.receive()
