"""AsyncConsumer: the :class:`~headwater.client.sync.consumer.Consumer` for asyncio (the
reads and commits, written once: :mod:`headwater.client.common.consumer`).

What is this kind's own: a fetch is a task, ``poll`` awaits the first of them, a fetch a
seek made stale is cancelled, and ``close`` awaits what it cancelled, so no task outlives
the consumer. ``commit_async`` hands its commits to a task (made when there are some to
send), which sends them in order, one request at a time.
"""

from __future__ import annotations

import asyncio
from typing import Any

from headwater.client.common.closing import AsyncClosesOnExit
from headwater.client.common.consumer import ConsumerBase
from headwater.client.common.positions import TP
from headwater.client.common.twins import ASYNCIO
from headwater.client.common.waking import settle_on_loop
from headwater.client.core.commits import CommitCallback
from headwater.client.transport.polling import retrieve
from headwater.model.message import Record
from headwater.model.service import FetchResult

__all__ = ["AsyncConsumer"]

#: A loop's timer may fire this early (its clock's resolution, and epoll's whole ms): a wait
#: for a push with no more than this left is over.
_TIMER_SLACK_S = 0.001


class AsyncConsumer(ConsumerBase, AsyncClosesOnExit, driver=ASYNCIO):
    """Poll records from assigned partitions. Use from one task at a time. The settings are
    :class:`~headwater.client.common.positions.ConsumerPositions`'."""

    _inflight: dict[TP, tuple[int, asyncio.Task[FetchResult]]]
    _commit_sender: asyncio.Task[None] | None = None
    # the wait for a push (see _wait_any): the waiter, when its time is up, and the timer
    _push_wait: asyncio.Future[None] | None = None
    _push_wait_until = 0.0
    _push_timer: asyncio.TimerHandle | None = None
    _push_timer_at = 0.0

    def _fetch(self, tp: TP, pos: int, wait_ms: int) -> asyncio.Future[FetchResult]:
        return asyncio.ensure_future(
            self._service.fetch(
                tp[0], tp[1], pos, max_bytes=self._fetch_bytes, tag_mask=self._mask, max_wait_ms=wait_ms
            )
        )

    async def _wait_any(self, futures: list[Any], timeout_s: float, *, lead: bool = True) -> None:
        if timeout_s <= 0 or not futures:
            return
        waiter = self._push_waiter
        if len(futures) == 1 and futures[0] is waiter and waiter is not None:
            # the common wait of a streaming poll: for the next push alone. asyncio.wait
            # would make a future, a timer and callbacks of its own (about 20 Python calls a
            # push); the waiter is this poll's own and dropped after it, so the timer may
            # settle it itself. One timer serves the polls one after another: a poll that
            # ends before its time leaves it armed, and the next poll's later deadline is
            # looked at when it fires (a timer armed and cancelled per push: 10 calls more)
            loop = asyncio.get_running_loop()
            until = loop.time() + timeout_s
            self._push_wait, self._push_wait_until = waiter, until
            if self._push_timer is None or self._push_timer_at > until:
                self._arm_push_timer(loop, until)
            try:
                await waiter
            finally:
                self._push_wait = None
            return
        await asyncio.wait(futures, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)

    def _arm_push_timer(self, loop: asyncio.AbstractEventLoop, at: float) -> None:
        if self._push_timer is not None:
            self._push_timer.cancel()
        self._push_timer, self._push_timer_at = loop.call_at(at, self._push_time_up), at

    def _push_time_up(self) -> None:
        """The timer of the waits for a push fired: end the wait whose time is up, or look
        again at the deadline of the one waiting now."""
        self._push_timer = None
        waiter = self._push_wait
        if waiter is None or waiter.done():
            return  # nobody waits: the next wait arms it again
        loop = asyncio.get_running_loop()
        if self._push_wait_until - loop.time() > _TIMER_SLACK_S:
            self._arm_push_timer(loop, self._push_wait_until)
        else:
            waiter.set_result(None)

    def _new_waiter(self) -> asyncio.Future[None]:
        return asyncio.get_running_loop().create_future()

    def wakeup(self) -> None:
        """End the poll that awaits now with :class:`~headwater.errors.WakeupError`, or the
        next poll if none awaits (``Consumer.wakeup``'s twin): from another task, or from
        another thread (a plain call: it hands the wake to the consumer's loop). Cancelling
        the polling task ends it too, with CancelledError. Each call raises once."""
        self._woken = True
        settle_on_loop(self._wakeup)

    def _drop_fetch(self, tp: TP) -> None:
        got = self._inflight.pop(tp, None)
        if got is not None:
            task = got[1]
            if task.done():
                retrieve(task)
            else:
                task.cancel()
                self._dropped.add(task)
                task.add_done_callback(self._dropped_ended)

    def _dropped_ended(self, task: asyncio.Task[FetchResult]) -> None:
        self._dropped.discard(task)
        retrieve(task)

    async def _cancel_reads(self, reads: list[Any]) -> None:
        if self._push_timer is not None:  # closing: nothing waits for a push any more
            self._push_timer.cancel()
            self._push_timer = None
        for t in reads:
            t.cancel()
        await asyncio.gather(*reads, return_exceptions=True)

    def _enqueue_commit(self, chosen: dict[TP, int], callback: CommitCallback | None) -> None:
        assert self._commits is not None
        self._commits.add(chosen, callback)
        if self._commit_sender is None or self._commit_sender.done():
            self._commit_sender = asyncio.get_running_loop().create_task(
                self._send_commits(), name=f"headwater-commits-{self.group}"
            )

    async def _send_commits(self) -> None:
        """The sender: one request at a time, in order (core.commits), until none is queued."""
        commits = self._commits
        assert commits is not None
        while (chosen := commits.next_send()) is not None:
            try:
                await self._commit_now(chosen)
            except Exception as e:  # noqa: BLE001 - any failure is the callback's to hear
                commits.ended(e)
            except BaseException as e:  # cancelled: nothing more is sent
                commits.ended(e)
                commits.fail_queued(e)
                raise
            else:
                commits.ended(None)

    async def _wait_commits(self, stop: bool = False) -> None:
        # shielded: a cancelled commit() or close() does not cancel the commits it waited for
        while (sender := self._commit_sender) is not None and not sender.done():
            await asyncio.shield(sender)
        self._run_commit_callbacks()

    def __aiter__(self) -> AsyncConsumer:
        """Records one at a time, forever (until :meth:`close`): ``async for r in consumer``.

        Each record counts as consumed when it is handed out, so ``commit`` stores exactly
        what the loop has seen."""
        return self

    async def __anext__(self) -> Record:
        while not self._closed:
            got = self._ready() or await self.poll(max_messages=1)
            if got:
                return got[0]
        raise StopAsyncIteration
