"""``wakeup()`` for every consumer (plain, group member, keyed, shared), written once; the
asyncio hand-off is :func:`settle_on_loop`, and ending any wait on a future :func:`settle`.

Another thread (or task) calls ``wakeup()``: it sets ``_woken`` and settles ``_wakeup``, a
future the waiting call waits on beside its answers, so the wait ends at once. The call
then raises :class:`~headwater.errors.WakeupError` (:meth:`Wakes._check_woken`), once per
``wakeup()``; a call that waits arms a fresh future first (:meth:`Wakes._arm_wakeup`), so a
``wakeup()`` before the call is seen by it and one during it settles what it waits on.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Any

from headwater.errors import WakeupError

__all__ = ["Wakes", "settle", "settle_on_loop"]


class Wakes:
    """``wakeup()``'s state and steps; each kind makes the future (``_new_waiter``) and
    says how a ``wakeup()`` from another thread reaches it (:meth:`_wake_blocking` or
    :meth:`_wake_asyncio`)."""

    _woken = False  # wakeup() was called: the waiting call (or the next) raises WakeupError
    _wakeup: Any = None  # the future the waiting call waits on beside its answers
    _woken_call = "poll"  # what WakeupError says wakeup() ended

    def _new_waiter(self) -> Any:
        raise NotImplementedError  # each kind's: a concurrent or an asyncio future

    def _arm_wakeup(self) -> Any:
        """Before a call may wait: a fresh future for ``wakeup()`` to settle (fresh each
        call: a wait over the network adds a done-callback to it, which would pile up on
        one kept for good); the future. Call :meth:`_check_woken` after it: ``wakeup()``
        sets ``_woken`` before it looks for the future, so one in between is seen there."""
        wakeup = self._wakeup = self._new_waiter()
        return wakeup

    def _check_woken(self) -> None:
        """Raise :class:`WakeupError` once for each ``wakeup()``."""
        if self._woken:
            self._woken = False
            call = self._woken_call
            raise WakeupError(f"wakeup() ended this {call}: {call} again to go on, or close() the consumer")

    def _gives_up(self, remaining: float) -> bool:
        """Whether a call whose wait brought nothing ends now: its time is up, or it raises
        because ``wakeup()`` ended the wait."""
        wakeup = self._wakeup
        if wakeup is not None and wakeup.done():
            self._check_woken()
            return True  # settled with no wakeup() to raise for (one raised already): return
        return remaining <= 0

    def _wake_blocking(self) -> None:
        """``wakeup()`` of a blocking consumer: any thread."""
        self._woken = True
        settle(self._wakeup)

    def _wake_asyncio(self) -> None:
        """``wakeup()`` of an asyncio consumer: a task of its loop, or any thread."""
        self._woken = True
        settle_on_loop(self._wakeup)


def settle_on_loop(waiter: asyncio.Future[Any] | None) -> None:
    """Settle ``waiter`` (None: nobody waits), from its loop's thread or from any other (a
    plain call there: the loop settles it)."""
    if waiter is None:
        return
    loop = waiter.get_loop()
    try:
        here = asyncio.get_running_loop() is loop
    except RuntimeError:  # no loop runs in this thread
        here = False
    if here:
        settle(waiter)
    elif not loop.is_closed():
        loop.call_soon_threadsafe(settle, waiter)


def settle(waiter: Any) -> None:
    """End a wait on ``waiter``, a concurrent or an asyncio future (None: nobody waits),
    unless another thread or task did."""
    if waiter is not None and not waiter.done():
        try:  # (not contextlib.suppress: three Python calls more)
            waiter.set_result(None)
        except concurrent.futures.InvalidStateError:  # done meanwhile, on another thread
            pass
