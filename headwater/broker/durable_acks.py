"""DurableAcks: the answers of sync-flush produces, sent once their fsync is done.

The server appends a produce on its event loop and, under sync flush, may answer only once
the bytes are on disk. Instead of a task and a worker thread per produce, each waiting
answer joins one list (ordered by log position), and one thread ("headwater-sync-acks")
fsyncs through the store's group commit, then hands the position it covered back to the
loop, which sends every answer that position covers. One fsync and two thread hand-offs
serve all the produces that arrived during the previous fsync, whatever the number of
connections; a parked long poll on the loop is not held up behind worker threads.

Thread-safety: ``add``, ``pending`` and ``drain`` run on the loop; only ``_run`` runs on
the thread.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import threading
from collections import deque
from collections.abc import Callable

__all__ = ["DurableAcks"]

log = logging.getLogger("headwater.server")

Answer = Callable[[BaseException | None], None]


class DurableAcks:
    """Answers waiting for an fsync, released in position order by one syncing thread.

    ``wait_durable(position)`` blocks until everything up to ``position`` is durable (it
    raises if the fsync fails: those answers then carry the error, and later ones wait for
    the next fsync)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, wait_durable: Callable[[int], None]) -> None:
        self._loop = loop
        self._wait_durable = wait_durable
        self._waiting: deque[tuple[int, int, Answer]] = deque()  # (position, arrival, answer)
        self._arrivals = 0
        self._wanted = 0  # the highest position waited for (read by the thread)
        self._kick = threading.Event()
        self._stopped = False
        self._idle: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="headwater-sync-acks", daemon=True)
        self._thread.start()

    @property
    def pending(self) -> int:
        return len(self._waiting)

    def add(self, position: int, answer: Answer) -> None:
        """Call ``answer(None)`` on the loop once ``position`` is durable (``answer(error)``
        if its fsync fails)."""
        self._arrivals += 1
        item = (position, self._arrivals, answer)
        if self._waiting and position < self._waiting[-1][0]:  # appends come in order; be safe
            bisect.insort(self._waiting, item)
        else:
            self._waiting.append(item)
        if position > self._wanted:
            self._wanted = position
        self._kick.set()

    async def drain(self, timeout_s: float) -> None:
        """Wait (up to ``timeout_s``) until every answer waiting now is sent."""
        if not self._waiting:
            return
        self._idle = asyncio.Event()
        try:
            async with asyncio.timeout(timeout_s):
                await self._idle.wait()
        except TimeoutError:
            log.warning("stopping with %d produce answers still waiting for their fsync", len(self._waiting))
        finally:
            self._idle = None

    def stop(self) -> None:
        """End the thread (after ``drain``); answers still waiting are never sent."""
        self._stopped = True
        self._kick.set()
        self._thread.join(timeout=10)

    # -- the syncing thread ----------------------------------------------------------

    def _run(self) -> None:
        while True:
            self._kick.wait()
            if self._stopped:
                return
            self._kick.clear()
            target = self._wanted
            try:
                self._wait_durable(target)
                error: BaseException | None = None
            except BaseException as e:  # noqa: BLE001 - the waiting produces get it
                error = e
            try:
                self._loop.call_soon_threadsafe(self._covered, target, error)
            except RuntimeError:  # the loop is closed: nobody is left to answer
                return

    # -- back on the loop ------------------------------------------------------------

    def _covered(self, position: int, error: BaseException | None) -> None:
        waiting = self._waiting
        while waiting and waiting[0][0] <= position:
            answer = waiting.popleft()[2]
            try:
                answer(error)
            except Exception:  # noqa: BLE001 - one connection's trouble is not the others'
                log.exception("sending a produce answer failed")
        if error is not None and waiting:
            self._kick.set()  # the rest were written after: try their fsync again
        if not waiting and self._idle is not None:
            self._idle.set()
