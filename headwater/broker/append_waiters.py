"""AppendWaiters: long polls waiting for a partition to grow past an offset.

One class serves every broker-side long poll: the embedded broker's fetches, which wait in
the caller's thread (:meth:`AppendWaiters.wait_blocking`), and the server's, which wait on
its event loop as a future (:meth:`AppendWaiters.wait`) or a parked object woken by a call
(:meth:`AppendWaiters.park`). Each waiter registers *before* it reads, so an append in
between wakes it rather than being missed.

:meth:`AppendWaiters.notify` is the store's append listener, called from the appending
thread. Appends nobody waits for cost an attribute read and a dict lookup: it takes a lock
only when a thread waits, and crosses into the event loop only when someone waits there on
that partition.

Thread-safety: ``notify`` and ``wait_blocking`` from any thread; the loop-side calls
(``wait``, ``park``, ``discard``, ``wake_all``) on the loop's thread only, the one the
object was created on when given a loop.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["AppendWaiters"]


class AppendWaiters:
    """Waiters for appends, in threads and (when given a loop) on an event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop
        self._loop_thread = threading.get_ident() if loop is not None else None  # created on the loop's thread
        self._waiting: dict[tuple[str, int], list[tuple[int, Any]]] = {}  # the loop's: futures and parked objects
        self._appended = threading.Condition()  # threads wait on it until an append wakes them
        self._threads_waiting = 0

    # -- any thread -----------------------------------------------------------------------

    def notify(self, queue: str, partition: int, end_offset: int) -> None:
        """The partition now ends at ``end_offset`` (an append listener: keep it quick)."""
        if self._threads_waiting:
            with self._appended:
                self._appended.notify_all()
        if self._waiting and (queue, partition) in self._waiting:  # (an empty dict: no tuple made)
            assert self._loop is not None
            if threading.get_ident() == self._loop_thread:  # appended on the loop: wake now
                self._wake(queue, partition, end_offset)
            else:
                self._loop.call_soon_threadsafe(self._wake, queue, partition, end_offset)

    def wait_blocking(self, offset: int, timeout_s: float, end_offset: Callable[[], int]) -> None:
        """Block the calling thread until ``end_offset()`` (the partition's end, read under
        the waiters' lock so no append slips in between) passes ``offset`` or ``timeout_s``
        passes. Any append wakes it; the caller reads again and decides."""
        deadline = time.monotonic() + timeout_s
        with self._appended:
            self._threads_waiting += 1
            try:
                if end_offset() <= offset:
                    self._appended.wait(max(deadline - time.monotonic(), 0.0))
            finally:
                self._threads_waiting -= 1

    # -- the loop's thread --------------------------------------------------------------

    def wait(self, queue: str, partition: int, offset: int) -> asyncio.Future[None]:
        """A future done when the partition grows past ``offset`` (or :meth:`wake_all`);
        :meth:`discard` it if the wait ends otherwise."""
        assert self._loop is not None, "waiting on a loop needs AppendWaiters(loop)"
        fut = self._loop.create_future()
        self._waiting.setdefault((queue, partition), []).append((offset, fut))
        return fut

    def park(self, queue: str, partition: int, offset: int, parked: Any) -> None:
        """Like :meth:`wait`, without a future: ``parked.wake()`` is called (a parked fetch,
        a fetch stream's partition)."""
        self._waiting.setdefault((queue, partition), []).append((offset, parked))

    def discard(self, queue: str, partition: int, waiter: Any) -> None:
        """Forget a future or parked object (its wait ended another way)."""
        lst = self._waiting.get((queue, partition))
        if lst:
            lst[:] = [(o, w) for o, w in lst if w is not waiter]
            if not lst:
                del self._waiting[(queue, partition)]

    def wake_all(self) -> None:
        """Answer every loop-side waiter now (the server is stopping)."""
        waiting, self._waiting = self._waiting, {}
        for lst in waiting.values():
            for _, w in lst:
                if not isinstance(w, asyncio.Future):  # a parked fetch, a fetch stream's partition
                    w.wake()
                elif not w.done():
                    w.set_result(None)

    def _wake(self, queue: str, partition: int, end_offset: int) -> None:
        lst = self._waiting.get((queue, partition))
        if not lst:
            return
        keep = []
        woken = []
        for offset, w in lst:
            if end_offset > offset:
                if not isinstance(w, asyncio.Future):  # a parked fetch, a fetch stream's partition
                    woken.append(w)
                elif not w.done():
                    w.set_result(None)
            else:
                keep.append((offset, w))
        if keep:
            lst[:] = keep
        else:
            del self._waiting[(queue, partition)]
        for w in woken:  # after the list is settled: a wake may park again
            w.wake()
