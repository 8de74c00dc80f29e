"""Group commit and the background flusher.

``sync`` flush: an append is acknowledged once ``wait_durable(end_position)`` returns. The
first waiter that finds no fsync under way becomes the leader: it fsyncs everything written
so far and wakes every waiter that fsync covered; the others wait for it. Under load one
fsync serves every append that arrived during the previous one, so the rate of
acknowledged appends grows with concurrency instead of being one fsync per append.

``async`` flush: ``Flusher`` calls the same fsync every ``interval_ms`` from a thread, and
sooner when the store kicks it (``flush_bytes`` written since its last kick), so the bytes at
risk of a power loss are those written in the last interval, at most about ``flush_bytes``
(plus the fsync under way). Bounding them also bounds each fsync, which keeps a fast
producer's appends from slowing while one writes back a large backlog (docs/design/storage.md
has the measurement). Bytes are written to the file with ``pwritev`` before the append
returns, so a killed *process* loses nothing either way.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from headwater.errors import StorageError

__all__ = ["GroupCommit", "Flusher"]

log = logging.getLogger("headwater.storage")


class GroupCommit:
    """Acknowledge-after-fsync with one fsync shared by every concurrent waiter.

    ``sync_fn`` fsyncs what has been written and returns the position it covered.

    A failed fsync is final (:attr:`failed`): Linux reports a write-back error once and marks
    the pages clean, so a second fsync can succeed without the bytes ever reaching the disk
    (PostgreSQL's "fsyncgate"). Trusting it would acknowledge what a power loss takes, so every
    wait after the failure raises instead, until the store is opened again. ``on_fail`` is
    told once.
    """

    def __init__(
        self, sync_fn: Callable[[], int], durable: int = 0, on_fail: Callable[[StorageError], None] | None = None
    ) -> None:
        self._sync_fn = sync_fn
        self._on_fail = on_fail
        self._cond = threading.Condition()
        self._syncing = False
        self.durable = durable
        self.fsyncs = 0
        self.failed: StorageError | None = None

    def wait_durable(self, position: int) -> None:
        with self._cond:
            while self.durable < position:
                if self.failed is not None:
                    raise self.refusal()
                if self._syncing:
                    self._cond.wait()
                    continue
                self._sync_locked()

    def sync_now(self) -> None:
        """Fsync whatever is written (the async flusher's tick); share an fsync under way.
        Nothing after a failed fsync (it was logged once)."""
        with self._cond:
            if self.failed is not None:
                return
            if self._syncing:
                while self._syncing:
                    self._cond.wait()
                return
            self._sync_locked()

    def fail(self, error: StorageError) -> None:
        """Record an fsync that failed outside :meth:`wait_durable` (a segment's seal)."""
        with self._cond:
            self._failed_locked(error)

    def refusal(self) -> StorageError:
        """The error for everything that would need an fsync after :attr:`failed`."""
        return StorageError(
            f"this store acknowledges nothing more since an fsync failed ({self.failed}): what was "
            f"written after the last good fsync may not be on the disk, and the kernel will not write "
            f"it again. Check the disk (dmesg, free space), then close the store and open it again "
            f"(a broker: restart it); opening reads the log's tail from the disk"
        )

    def _failed_locked(self, error: StorageError) -> None:
        if self.failed is None:
            self.failed = error
            log.error("an fsync failed: %s; the store acknowledges nothing more until it is opened again", error)
            if self._on_fail is not None:
                self._on_fail(error)
        self._cond.notify_all()

    def _sync_locked(self) -> None:
        self._syncing = True
        self._cond.release()
        error = None
        try:
            covered = self._sync_fn()
        except StorageError as e:
            error = e
            raise
        finally:
            self._cond.acquire()
            self._syncing = False
            if error is not None:
                self._failed_locked(error)
            self._cond.notify_all()
        if covered > self.durable:  # (sync_fn fsyncs nothing when nothing new was written)
            self.fsyncs += 1
            self.durable = covered


class Flusher:
    """A daemon thread calling ``tick()`` every ``interval_ms``, and at once when kicked,
    until stopped."""

    def __init__(self, name: str, interval_ms: int, tick: Callable[[], object]) -> None:
        self._interval_s = interval_ms / 1000
        self._tick = tick
        self._wake = threading.Event()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def kick(self) -> None:
        """Tick now (or as soon as the tick under way ends), then on the interval again."""
        self._wake.set()

    def _run(self) -> None:
        while True:
            self._wake.wait(self._interval_s)
            self._wake.clear()
            if self._stopped:
                return
            try:
                self._tick()
            except Exception:  # noqa: BLE001 - keep ticking; the next tick retries
                log.exception("background task %s failed", self._thread.name)

    def stop(self) -> None:
        self._stopped = True
        self._wake.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
