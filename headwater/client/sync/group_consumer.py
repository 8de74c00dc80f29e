"""GroupConsumer: a member of a consumer group, from one thread (the membership, written
once: :mod:`headwater.client.common.group_consumer`).

What is this kind's own: the member joins when it is made, and a background thread
heartbeats; it shares the member's view with the application's thread under a lock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

from headwater.client.common.group_consumer import GroupConsumerBase
from headwater.client.common.twins import BLOCKING
from headwater.client.sync.consumer import Consumer

__all__ = ["GroupConsumer"]

T = TypeVar("T")


class GroupConsumer(GroupConsumerBase, Consumer, driver=BLOCKING):
    """A member of consumer group ``group`` subscribed to ``subscribe``. Use from one thread.

    Get one with ``hw.consumer(group="billing", subscribe=["orders"])``:

    >>> import headwater, tempfile
    >>> hw = headwater.open(tempfile.mkdtemp())
    >>> _ = hw.admin.create_queue("orders", partitions=4)
    >>> _ = hw.send_batch("orders", [b"a", b"b"], partition=2)
    >>> with hw.consumer(group="billing", subscribe="orders", strategy="sticky") as c:
    ...     print(c.assignment())
    ...     print([r.body for r in c.poll(timeout_ms=500)])
    ...     c.commit()
    [('orders', 0), ('orders', 1), ('orders', 2), ('orders', 3)]
    [b'a', b'b']
    >>> hw.close()

    ``on_assign(partitions)`` and ``on_revoke(partitions)`` are called from ``poll`` (in the
    application's thread) with sorted ``(queue, partition)`` lists; ``close`` revokes
    everything. With ``commit_on_revoke`` (default) the positions of revoked partitions are
    committed first: what ``poll`` returned before is taken as processed, as in the loop
    ``for r in c: handle(r)``. Leaving a ``with`` block because of an exception does not
    commit.
    """

    def _begin(self) -> None:
        self._lock = threading.Lock()  # guards _view: the heartbeat thread and the application share it
        self._beat = threading.Event()  # heartbeat now
        self._stopping = threading.Event()
        self._join_group()
        self._thread = threading.Thread(
            target=self._heartbeat_loop, name=f"headwater-heartbeat-{self.group}", daemon=True
        )
        self._thread.start()

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.close(commit=exc_type is None)

    def _blocking_io(self, fn: Callable[..., T], *args: Any) -> T:
        return fn(*args)

    def _heartbeat_loop(self) -> None:
        while not self._stopping.is_set():
            self._beat.wait(self._beat_interval_s())
            self._beat.clear()
            if self._stopping.is_set():
                return
            self._beat_once()

    def _stop_heartbeats(self) -> None:
        self._stopping.set()
        self._beat.set()
        # An idle heartbeat thread ends at once. One with a heartbeat in flight is not waited
        # for: against a hung broker that cost close() the heartbeat's request timeout before
        # the closing commit's own. It ends after that call, applying nothing (_leaving).
        self._thread.join(timeout=0.1)
