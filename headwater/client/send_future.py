"""SendFuture: the future ``Producer.send()`` returns.

Thread-safety: as ``concurrent.futures.Future``; its lazy parts are made under one module
lock, which also orders a first waiter against the result being set.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from collections.abc import Callable
from concurrent.futures._base import FINISHED as _FINISHED, PENDING as _PENDING

__all__ = ["SendFuture"]

log = logging.getLogger("headwater.producer")

_LAZY_LOCK = threading.Lock()  # guards the lazy parts of every SendFuture


class SendFuture(concurrent.futures.Future):
    """The future of a send: a ``concurrent.futures.Future`` that cannot be cancelled (a
    queued message cannot be taken back, as in Kafka) and that makes its condition and lists
    only when a thread first waits on it or adds a done-callback.

    Why: most sends are never waited on one by one (a flush, a callback, or nothing), and the
    five objects ``Future.__init__`` makes cost more than the rest of ``send()``, in
    allocation and in garbage-collector passes over the batches being filled. This relies on
    Future's internal names (``_condition``, ``_waiters``, ``_done_callbacks``, ``_state``,
    ``_result``, ``_exception``), unchanged since Python 3.2; tests/test_producer.py runs
    ``result``, ``exception``, ``wait``, ``as_completed`` and ``add_done_callback`` on it.
    """

    def __init__(self) -> None:  # not Future.__init__: that is what this class avoids
        self._state = _PENDING
        self._result = None
        self._exception: BaseException | None = None
        self._lazy: tuple[threading.Condition, list, list] | None = None

    def _materialize(self) -> tuple[threading.Condition, list, list]:
        lazy = self._lazy
        if lazy is None:
            with _LAZY_LOCK:
                lazy = self._lazy
                if lazy is None:
                    lazy = self._lazy = (threading.Condition(), [], [])
        return lazy

    # Future's own methods and concurrent.futures.wait() reach these by name.
    _condition = property(lambda self: self._materialize()[0])
    _waiters = property(lambda self: self._materialize()[1])
    _done_callbacks = property(lambda self: self._materialize()[2])

    def has_done_callbacks(self) -> bool:
        """Whether anyone added a done-callback (without making the lazy parts)."""
        lazy = self._lazy
        return lazy is not None and bool(lazy[2])

    def cancel(self) -> bool:
        return False

    def cancelled(self) -> bool:
        return False

    def running(self) -> bool:
        return False

    def done(self) -> bool:
        return self._state == _FINISHED

    def result(self, timeout: float | None = None):  # type: ignore[no-untyped-def]
        if self._state == _FINISHED:  # set once, result before state: no lock needed
            exc = self._exception
            if exc is None:
                return self._result
            try:
                raise exc
            finally:
                exc = None  # no cycle through the traceback
        return super().result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        if self._state == _FINISHED:
            return self._exception
        return super().exception(timeout)

    def add_done_callback(self, fn: Callable[[concurrent.futures.Future], object]) -> None:
        if self._state != _FINISHED:
            with self._condition:
                if self._state != _FINISHED:
                    self._done_callbacks.append(fn)
                    return
        try:
            fn(self)
        except Exception:  # noqa: BLE001 - as Future does
            log.exception("exception calling callback for %r", self)

    def set_result(self, result: object) -> None:
        with _LAZY_LOCK:
            if self._lazy is None:  # nobody waits or listens: no condition to notify
                if self._state == _FINISHED:
                    raise concurrent.futures.InvalidStateError(f"{self!r} is already done")
                self._result = result
                self._state = _FINISHED
                return
        super().set_result(result)

    def set_exception(self, exception: BaseException | None) -> None:
        with _LAZY_LOCK:
            if self._lazy is None:
                if self._state == _FINISHED:
                    raise concurrent.futures.InvalidStateError(f"{self!r} is already done")
                self._exception = exception
                self._state = _FINISHED
                return
        super().set_exception(exception)
