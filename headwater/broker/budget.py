"""Byte budgets: the bytes of batches and answers the server holds, per connection and in all.

A connection holds bytes from the moment a request's batch or a fetch's answer is counted
until the batch is appended or the answer is out of the socket. Each byte counts twice: in
the connection's own :class:`ByteBudget` (one peer cannot take everything) and in the
server's (all peers together stay under ``bytes_in_flight_max``). :class:`ServerBudget`
keeps the two in step, so no caller takes or gives back one without the other. Everything
here runs on the server's event loop thread; nothing is locked.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

__all__ = ["BudgetHolder", "ByteBudget", "ServerBudget"]


class ByteBudget:
    """Bytes in flight, bounded. ``take`` takes them when they fit (one oversized request is
    let through alone, so nothing waits forever); otherwise the caller waits for a release:
    a connection with a callback (``wait``), a task with ``await acquire``."""

    __slots__ = ("limit", "used", "_waiters")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._waiters: list[Callable[[], None]] = []

    def fits(self, n: int) -> bool:
        return self.used + n <= self.limit or self.used == 0

    def take(self, n: int, held: int = 0) -> bool:
        """Take ``n`` bytes if they fit, or if nothing but the caller's own ``held`` bytes
        is taken (one oversized request goes through alone)."""
        used = self.used
        if used + n <= self.limit or used == held:  # fits(n), inline: twice per produce
            self.used = used + n
            return True
        return False

    def charge(self, n: int) -> None:
        """Count bytes already held, even past the limit (takers then wait for releases)."""
        self.used += n

    def untake(self, n: int) -> None:
        """Give back bytes just taken, before anyone could have waited for them."""
        self.used -= n

    def release(self, n: int) -> None:
        self.used -= n
        if self._waiters:  # everyone retries (they may fit now); who still does not waits again
            waiters, self._waiters = self._waiters, []
            for wake in waiters:
                wake()

    def wait(self, wake: Callable[[], None]) -> None:
        """Call ``wake`` (once) at the next release; it must not take bytes itself."""
        self._waiters.append(wake)

    def forget(self, wake: Callable[[], None]) -> None:
        if wake in self._waiters:
            self._waiters = [w for w in self._waiters if w != wake]

    async def acquire(self, n: int) -> None:
        while not self.take(n):
            fut = asyncio.get_running_loop().create_future()

            def wake(fut: asyncio.Future[None] = fut) -> None:
                if not fut.done():
                    fut.set_result(None)

            self.wait(wake)
            try:
                await fut
            finally:
                self.forget(wake)


class BudgetHolder(Protocol):
    """A connection, as the server's budget sees it: its own budget, and how to wake it
    when bytes it waits for are released."""

    budget: ByteBudget

    def wake(self) -> None: ...


class ServerBudget:
    """The server's byte budget over its connections' own.

    Requests (a produce's batch) and answers (a fetch's batches, until they are out of the
    socket) take from it alike, with two shares bounded so neither kind can starve the
    other. ``answers`` holds what answers take, at most half the budget: answers a peer
    never reads stay in the server until ``send_timeout_s`` cuts it off, and without the
    bound a few such peers filled the budget and every produce waited for them. ``receiving``
    is the part reserved for big frames whose length is read but whose body is not yet, at
    most half too, so that a few peers sending huge frames slowly cannot starve the
    requests already read. A frame reserves as its bytes arrive, a step ahead of them, so a
    peer trickling a huge frame holds about one step; the frame that began receiving first
    may always take its next step, so frames that each hold part of the share never wait
    on each other for good.
    """

    __slots__ = ("total", "answers", "receiving", "_receivers")

    def __init__(self, limit: int) -> None:
        self.total = ByteBudget(limit)
        self.answers = ByteBudget(max(1, limit // 2))
        self.receiving = 0
        self._receivers: dict[BudgetHolder, None] = {}  # holders of a frame's reservation, oldest first

    # -- answers: each method takes from the holder's budget, the answers' share and the total

    def answer_fits(self, holder: BudgetHolder, n: int) -> bool:
        """Whether an answer of ``n`` bytes fits now."""
        return holder.budget.fits(n) and self.answers.fits(n) and self.total.fits(n)

    def answer_room(self, holder: BudgetHolder) -> int:
        """The bytes an answer for ``holder`` could take now (not counting the oversized rule)."""
        own, answers, total = holder.budget, self.answers, self.total
        return min(own.limit - own.used, answers.limit - answers.used, total.limit - total.used)

    def take_answer(self, holder: BudgetHolder, n: int) -> bool:
        """Take ``n`` bytes for an answer, or nothing (then the holder is woken at a release)."""
        if not self.answers.take(n):
            self.answers.wait(holder.wake)
            return False
        if not self.take(holder, n):
            self.answers.untake(n)
            return False
        return True

    async def acquire_answer(self, holder: BudgetHolder, n: int) -> None:
        """Wait until an answer of ``n`` bytes fits, and take them."""
        await self.answers.acquire(n)
        try:
            await self.acquire(holder, n)
        except BaseException:
            self.answers.release(n)
            raise

    def release_answer(self, holder: BudgetHolder, n: int) -> None:
        self.answers.release(n)
        self.release(holder, n)

    def charge_answer(self, holder: BudgetHolder, n: int) -> None:
        """Count answer bytes read past what was taken, even above the limits."""
        self.answers.charge(n)
        self.charge(holder, n)

    # -- requests, and the parts answers share with them

    def take(self, holder: BudgetHolder, n: int) -> bool:
        """Take ``n`` bytes of the holder's budget and the server's, or neither (then the
        holder is woken when bytes are released)."""
        own = holder.budget
        if not own.take(n):
            own.wait(holder.wake)
            return False
        if not self.total.take(n):
            own.untake(n)
            self.total.wait(holder.wake)
            return False
        return True

    def fits(self, holder: BudgetHolder, n: int) -> bool:
        """Whether ``n`` bytes would fit both budgets now (as :meth:`take` would take them);
        if not, the holder is woken when bytes are released. For bytes held only while the
        caller runs, on the loop (an inline append): taking and releasing them would change
        nothing but cost four calls more per produce."""
        own, total = holder.budget, self.total
        if own.used + n > own.limit and own.used:  # not own.fits(n), inline: once per produce
            own.wait(holder.wake)
            return False
        if total.used + n > total.limit and total.used:
            total.wait(holder.wake)
            return False
        return True

    async def acquire(self, holder: BudgetHolder, n: int) -> None:
        """Wait until ``n`` bytes fit both budgets, and take them."""
        await holder.budget.acquire(n)
        try:
            await self.total.acquire(n)
        except BaseException:
            holder.budget.release(n)
            raise

    def release(self, holder: BudgetHolder, n: int) -> None:
        holder.budget.release(n)
        self.total.release(n)

    def charge(self, holder: BudgetHolder, n: int) -> None:
        """Count bytes already read past what was taken, even above the limits."""
        holder.budget.charge(n)
        self.total.charge(n)

    def reserve_frame(self, holder: BudgetHolder, n: int, held: int = 0) -> bool:
        """Reserve ``n`` more bytes for the big frame being received, which holds ``held``
        already: a step ahead of its bytes as they arrive, so a peer trickling a huge frame
        holds about one step, not the size it announced. False (the caller then stops
        reading) when it does not fit now; the holder is woken at the next release. A frame
        alone in the receiving share, or in the budgets, may grow past their bounds, as one
        oversized request may."""
        oldest = next(iter(self._receivers), holder)
        if oldest is not holder and self.receiving + n > self.total.limit // 2:
            self.total.wait(holder.wake)
            return False
        own = holder.budget
        if not own.take(n, held):
            own.wait(holder.wake)
            return False
        if not self.total.take(n, held):
            own.untake(n)
            self.total.wait(holder.wake)
            return False
        self.receiving += n
        self._receivers.setdefault(holder, None)  # a frame keeps its place as it grows
        return True

    def frame_arrived(self, holder: BudgetHolder, n: int) -> None:
        """A reserved frame is whole: its bytes are a request's now, no longer being received
        (the next oldest frame may now grow past the share: it retries)."""
        self.receiving -= n
        self._receivers.pop(holder, None)
        self.total.release(0)

    def drop_frame(self, holder: BudgetHolder, n: int) -> None:
        """A reserved frame will never be whole (its connection went)."""
        self.receiving -= n
        self._receivers.pop(holder, None)
        self.release(holder, n)

    def forget(self, holder: BudgetHolder) -> None:
        """The holder is gone: it waits for nothing any more."""
        holder.budget.forget(holder.wake)
        self.answers.forget(holder.wake)
        self.total.forget(holder.wake)
