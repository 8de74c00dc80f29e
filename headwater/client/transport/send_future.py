"""SendFuture, the future ``Producer.send()`` returns, AsyncSendFuture, the one
``AsyncProducer.send_nowait()`` returns, LazyFuture, the client's future of a produce
request, and how the sync producer settles the futures of a batch.

Thread-safety: as ``concurrent.futures.Future``; its lazy parts are made under one module
lock, which also orders a first waiter against the result being set. AsyncSendFuture: as
``asyncio.Future``, one event loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures._base import CANCELLED as _CANCELLED
from concurrent.futures._base import CANCELLED_AND_NOTIFIED as _CANCELLED_AND_NOTIFIED
from concurrent.futures._base import FINISHED as _FINISHED
from concurrent.futures._base import PENDING as _PENDING

from headwater.client.transport.link import settle_from
from headwater.model.message import MessageId
from headwater.model.service import ProduceResult

__all__ = ["AsyncSendFuture", "BatchOutcome", "LazyFuture", "SendFuture", "settle_sends", "fail_sends"]

log = logging.getLogger("headwater.producer")

_LAZY_LOCK = threading.Lock()  # guards the lazy parts of every LazyFuture
_DONE = frozenset((_FINISHED, _CANCELLED, _CANCELLED_AND_NOTIFIED))


class LazyFuture(concurrent.futures.Future):
    """A ``concurrent.futures.Future`` that makes its condition only when a thread first
    waits on it, and its list of done-callbacks only when one is added. Until a thread waits,
    settling it calls the done-callbacks without a condition.

    Why: most futures of a busy client are never waited on one by one (a flush, a callback, or
    nothing), and the five objects ``Future.__init__`` makes cost more than the rest of
    ``send()``, in allocation and in garbage-collector passes over the batches being filled;
    settling a plain Future runs a round of notifying nobody besides. The client's requests
    sent without waiting use it (the producer adds one done-callback to each produce), the
    consumer's wait for a push, and :class:`SendFuture`.
    This relies on Future's internal names (``_condition``, ``_waiters``, ``_done_callbacks``,
    ``_state``, ``_result``, ``_exception``), unchanged since Python 3.2;
    tests/test_producer.py runs ``result``, ``exception``, ``wait``, ``as_completed`` and
    ``add_done_callback`` on it.
    """

    def __init__(self) -> None:  # not Future.__init__: that is what this class avoids
        self._state = _PENDING
        self._result = None
        self._exception: BaseException | None = None
        self._lazy: tuple[threading.Condition, list] | None = None  # made for the first waiter
        self._callbacks: list | None = None  # made for the first done-callback

    def _materialize(self) -> tuple[threading.Condition, list]:
        lazy = self._lazy
        if lazy is None:
            with _LAZY_LOCK:
                lazy = self._lazy
                if lazy is None:
                    lazy = self._lazy = (threading.Condition(), [])
        return lazy

    def _callback_list(self) -> list:
        cbs = self._callbacks
        if cbs is None:
            with _LAZY_LOCK:
                cbs = self._callbacks
                if cbs is None:
                    cbs = self._callbacks = []
        return cbs

    # Future's own methods and concurrent.futures.wait() reach these by name.
    _condition = property(lambda self: self._materialize()[0])
    _waiters = property(lambda self: self._materialize()[1])
    _done_callbacks = property(lambda self: self._callback_list())

    def has_done_callbacks(self) -> bool:
        """Whether anyone added a done-callback (without making the lazy parts)."""
        return bool(self._callbacks)

    def done(self) -> bool:
        return self._state in _DONE

    def result(self, timeout: float | None = None):  # type: ignore[no-untyped-def]  # concurrent.futures.Future's own signature
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
        # Until a thread waits there is no condition: the module lock orders this against
        # settling, which then calls what it finds. After, Future's own way, on the condition.
        if self._state not in _DONE:
            if self._lazy is None:
                with _LAZY_LOCK:
                    if self._lazy is None and self._state not in _DONE:
                        cbs = self._callbacks
                        if cbs is None:
                            self._callbacks = [fn]
                        else:
                            cbs.append(fn)
                        return
            with self._condition:
                if self._state not in _DONE:
                    self._done_callbacks.append(fn)
                    return
        self._call(fn)

    def _call(self, fn: Callable[[concurrent.futures.Future], object]) -> None:
        try:
            fn(self)
        except Exception:  # noqa: BLE001 - as Future does
            log.exception("exception calling callback for %r", self)

    def cancel(self) -> bool:
        if not self._settle(_CANCELLED, None, None):
            return super().cancel()
        return self._state in (_CANCELLED, _CANCELLED_AND_NOTIFIED)

    def set_result(self, result: object) -> None:
        if not self._settle(_FINISHED, result, None):
            super().set_result(result)

    def set_exception(self, exception: BaseException | None) -> None:
        if not self._settle(_FINISHED, None, exception):
            super().set_exception(exception)

    def _settle(self, state: str, result: object, exception: BaseException | None) -> bool:
        """Settle it here if no thread waits (there is no condition to notify), then call
        its done-callbacks; False if a thread waits: Future's own way does it then. A
        cancel of a future already done changes nothing; settling one raises."""
        with _LAZY_LOCK:
            if self._lazy is not None:
                return False
            already = self._state in _DONE
            if not already:
                self._result = result
                self._exception = exception
                self._state = state
                cbs = self._callbacks
        if already:
            if state == _CANCELLED:
                return True
            # raised out of the lock: the message's repr takes it, to make the condition
            raise concurrent.futures.InvalidStateError(f"{self!r} is already done")
        for fn in cbs or ():
            self._call(fn)
        return True


class SendFuture(LazyFuture):
    """The future of a send: a :class:`LazyFuture` that cannot be cancelled (a queued
    message cannot be taken back, as in Kafka).

    Made with a :class:`BatchOutcome` and its message's index in the batch, it is *detached*:
    the batch keeps no reference to it, only the future to the outcome, so a message waiting
    in a batch costs no object the cyclic garbage collector walks unless its caller keeps the
    future (``docs/design/delay.md``, "Performance"). It reads its state from the outcome
    until it needs one of its own: a thread waits on it or a done-callback is added (then the
    outcome settles it as it settles the batch), or it is read once the batch is settled
    (then it copies its id from the outcome).
    """

    def __init__(self, outcome: BatchOutcome | None = None, index: int = 0) -> None:
        # LazyFuture.__init__'s fields, set here: one call less, and no property setter, per send
        self._own_state = _PENDING
        self._result = None
        self._exception: BaseException | None = None
        self._lazy: tuple[threading.Condition, list] | None = None
        self._callbacks: list | None = None
        self._outcome = outcome  # None once attached: its state is its own
        self._index = index  # the message's index in its batch when it was sent

    # Every read of the state goes through here (Future's own methods, wait(), as_completed()):
    # a detached future whose batch is settled takes its outcome first.
    @property  # type: ignore[override]  # Future's _state is a plain attribute: a property here, read and written alike
    def _state(self) -> str:
        o = self._outcome
        if o is not None and o.settled:
            self._attach()
        return self._own_state

    @_state.setter
    def _state(self, state: str) -> None:
        self._own_state = state

    def _attach(self) -> None:
        """Take a state of its own: the outcome's if it is settled, else PENDING, settled by
        the outcome with the batch (it is one of its listeners)."""
        with _LAZY_LOCK:
            o = self._outcome
            if o is None:
                return
            self._outcome = None
            if not o.settled:
                if o.listeners is None:
                    o.listeners = [self]
                else:
                    o.listeners.append(self)
                return
            if o.error is not None:
                self._exception = o.error
            else:
                self._result = o.message_id(self._index)
            self._own_state = _FINISHED  # last: readers without the lock see a result first

    def _materialize(self) -> tuple[threading.Condition, list]:
        if self._outcome is not None:
            self._attach()
        return super()._materialize()

    def _callback_list(self) -> list:
        if self._outcome is not None:
            self._attach()
        return super()._callback_list()

    def add_done_callback(self, fn: Callable[[concurrent.futures.Future], object]) -> None:
        if self._outcome is not None:  # before the module lock: _attach takes it
            self._attach()
        super().add_done_callback(fn)

    def has_done_callbacks(self) -> bool:
        return self._outcome is None and super().has_done_callbacks()

    def _settle(self, state: str, result: object, exception: BaseException | None) -> bool:
        if self._outcome is not None:
            self._attach()
        return super()._settle(state, result, exception)

    def cancel(self) -> bool:
        return False

    def cancelled(self) -> bool:
        return False

    def running(self) -> bool:
        return False


class BatchOutcome:
    """What the detached :class:`SendFuture` s of one batch share: the batch's answer (a
    ProduceResult or an error), where its messages went when it was put in due order, and
    the futures that asked for a state of their own (a waiter, a done-callback): one object
    per batch, none per message. :meth:`settle` settles it once.

    >>> o = BatchOutcome()
    >>> futs = [SendFuture(o, i) for i in range(3)]
    >>> o.reordered([2, 0, 1])  # the message sent third is now first
    >>> o.settle(ProduceResult(queue_id=1, partition=0, base_offset=10, count=3, timestamp_ms=0), None)
    >>> [f.result().offset for f in futs]
    [11, 12, 10]
    """

    __slots__ = ("settled", "result", "error", "order", "at", "listeners")

    def __init__(self) -> None:
        self.settled = False
        self.result: ProduceResult | None = None
        self.error: BaseException | None = None
        self.order: list[int] | None = None  # the batch's order: the message now at j was sent at order[j]
        self.at: list[int] | None = None  # its inverse, made when a future first needs it
        self.listeners: list[SendFuture] | None = None  # made for the first

    def reordered(self, order: list[int]) -> None:
        """The batch's messages were put in ``order`` (``order[j]``: the index, before, of the
        message now at ``j``), after any order before."""
        self.order = order if self.order is None else [self.order[i] for i in order]
        self.at = None

    def message_id(self, index: int) -> MessageId:
        """The id of the message sent at ``index`` of the settled, stored batch."""
        r = self.result
        assert r is not None
        return _new_tuple(MessageId, (r.queue_id, r.partition, r.base_offset + self.position(index)))

    def position(self, index: int) -> int:
        """Where the message sent at ``index`` is in the batch now."""
        if self.order is None:
            return index
        at = self.at
        if at is None:  # two threads may both make it: the same list
            at = self.at = sorted(range(len(self.order)), key=self.order.__getitem__)  # the inverse, in C
        return at[index]

    def settle(self, result: ProduceResult | None, error: BaseException | None) -> None:
        """The batch was stored as ``result``, or failed with ``error``: every future of it
        is settled (the detached ones read it when asked; the listeners now)."""
        with _LAZY_LOCK:
            if self.settled:
                return
            self.result, self.error = result, error
            self.settled = True
            listeners, self.listeners = self.listeners, None
        for fut in listeners or ():
            if error is None:
                fut.set_result(self.message_id(fut._index))
            else:
                fut.set_exception(error)

    def listened(self) -> bool:
        """Whether anyone added a done-callback to one of the batch's futures."""
        return any(fut.has_done_callbacks() for fut in self.listeners or ())


class AsyncSendFuture(asyncio.Future):
    """The future of an asyncio send: an ``asyncio.Future`` that, like :class:`SendFuture`,
    cannot be cancelled: ``cancel()`` returns False and the future still gets the message's
    id (or its error). Kafka's producer futures refuse too; aiokafka's accept a cancel but
    send the message anyway, and the id is lost.

    Waiting for it can be given up without touching it: ``await fut`` waits on a future of
    its own (a *waiter*), so cancelling the awaiting task (``asyncio.timeout``, a task group,
    Python 3.12's ``asyncio.wait_for``) cancels only the waiter and ends that wait at once.
    Python 3.11's ``wait_for`` cancels the future itself, which refuses, so it waits for the
    outcome instead. The first waiter is settled together with the future (``set_result``
    sets both), not by a done-callback as ``asyncio.shield`` would: the awaiting task wakes
    a turn of the loop sooner, and some 25 Python calls a message fewer. Further tasks
    awaiting the same future at once get theirs by a done-callback.
    """

    __slots__ = ("_waiter",)

    def __init__(self, *, loop: asyncio.AbstractEventLoop | None = None) -> None:
        super().__init__(loop=loop)
        self._waiter: asyncio.Future[MessageId] | None = None

    def cancel(self, msg: object = None) -> bool:
        return False

    def set_result(self, result: MessageId) -> None:  # type: ignore[override]  # the id a send has
        super().set_result(result)
        waiter = self._waiter
        if waiter is not None and not waiter.done():  # done: its task gave up waiting
            waiter.set_result(result)

    def set_exception(self, exception: type | BaseException) -> None:
        super().set_exception(exception)
        waiter = self._waiter
        if waiter is not None:  # awaited: retrieved, as asyncio.shield has it, even if the wait ended
            error = super().exception()
            if not waiter.done():
                waiter.set_exception(error)  # type: ignore[arg-type]  # just set

    def __await__(self):  # type: ignore[no-untyped-def]  # asyncio.Future's own signature
        if self.done():
            return super().__await__()
        waiter: asyncio.Future[MessageId] = self.get_loop().create_future()
        if self._waiter is None or self._waiter.done():
            self._waiter = waiter  # settled with this future (set_result)
        else:  # another task waits already: this one hears by a callback
            self.add_done_callback(functools.partial(settle_from, waiter))
        return waiter.__await__()

    __iter__ = __await__


_new_tuple = tuple.__new__  # a namedtuple from a tuple, without its Python-level call


def settle_sends(outcome: BatchOutcome | None, groups: Sequence[tuple[int, int, SendFuture]], r: ProduceResult) -> None:
    """A batch was stored as ``r``: its single sends' futures read their ids from
    ``outcome`` (None: it has none), each group ``(index, count, future)`` gets the
    ProduceResult of its range."""
    if outcome is not None:
        outcome.settle(r, None)
    qid, part, base = r.queue_id, r.partition, r.base_offset
    for i, count, fut in groups:
        fut.set_result(ProduceResult(qid, part, base + i, count, r.timestamp_ms))


def fail_sends(outcome: BatchOutcome | None, groups: Sequence[tuple[int, int, SendFuture]], exc: BaseException) -> None:
    """A batch failed with ``exc``: so do its futures."""
    if outcome is not None:
        outcome.settle(None, exc)
    for _, _, fut in groups:
        fut.set_exception(exc)
