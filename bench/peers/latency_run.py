"""The two processes of a latency run (:meth:`bench.peers.base.Driver.latency`), for a blocking
client and for an asyncio one.

The producer sends ``rate`` messages a second, one at a time, each stamped with its scheduled
send time, its sequence and when the send call began; the consumer stamps each as it arrives.
A blocking client is driven by :func:`latency_producer` and :func:`latency_consumer` through the
driver's ``sender`` and ``consumer``; an asyncio client (a driver whose ``async_client`` is True) by
:func:`latency_producer_aio` and :func:`latency_consumer_aio` through its ``async_sender`` and
``async_consumer``, each on one event loop (``asyncio.run``), the way an asyncio program runs
it: the pacing sleeps on the loop, so the client's reads run meanwhile, as a blocking producer's
sleep lets the client's threads run. Behind schedule, the asyncio producer sends what is due in
one turn of the loop (yielding at least every ``CATCH_UP_TURN_NS``), as a program with a backlog
of ready work does, rather than one turn of the loop per message: a turn per message made every
late message a batch of its own (a request, an append, an ack and a push each), so a producer
once behind stayed behind, where the blocking producer's sender thread batches what waits. Both
keep their figures in the same two classes, so the two kinds of client are measured alike.
"""

from __future__ import annotations

import asyncio
import collections
import os
import time
from typing import Any

from bench import machine
from bench.machine import sleep_until_ns
from bench.peers.base import INFLIGHT_MAX, LATENCY_WARMUP, SENT, STAMP, process_cpu_s

__all__ = [
    "AsyncFutureSender",
    "latency_consumer",
    "latency_consumer_aio",
    "latency_producer",
    "latency_producer_aio",
]


class Receipts:
    """What a latency consumer records: (scheduled, sequence, received, send began) in ns per
    message, and its CPU seconds from the first counted message to the last."""

    def __init__(self) -> None:
        self.stamps: list[tuple[int, int, int, int]] = []
        self._cpu_from: tuple[float, int] | None = None  # (CPU s, messages) at the first counted one
        self._cpu_to: tuple[float, int] | None = None

    def record(self, bodies: list[bytes], now_ns: int) -> None:
        stamps = self.stamps
        for body in bodies:
            sched, seq = STAMP.unpack_from(body)
            stamps.append((sched, seq, now_ns, SENT.unpack_from(body, STAMP.size)[0]))
        if self._cpu_from is None and stamps and stamps[-1][1] >= LATENCY_WARMUP:
            self._cpu_from = (process_cpu_s(), len(stamps))
        elif self._cpu_from is not None:
            self._cpu_to = (process_cpu_s(), len(stamps))

    def result(self) -> dict[str, Any]:
        cpu_us = None
        if self._cpu_from is not None and self._cpu_to is not None and self._cpu_to[1] > self._cpu_from[1]:
            cpu_us = (self._cpu_to[0] - self._cpu_from[0]) * 1e6 / (self._cpu_to[1] - self._cpu_from[1])
        return {"role": "consumer", "stamps": self.stamps, "cpu_us_per_msg": cpu_us}


class Pacing:
    """A latency producer's schedule and figures: the send times, the stamped bodies, the
    sends more than 1 ms late, the CPU spent spinning to the send times, and the producer's
    CPU over the counted sends (``window``: two events set when they begin and end)."""

    def __init__(self, total: int, rate: int, size: int, window) -> None:
        self.total = total
        self._pad = os.urandom(max(0, size - STAMP.size - SENT.size))
        self._interval_ns = 1_000_000_000 // rate
        self._window = window
        self.t0 = time.monotonic_ns() + 50_000_000  # the first send, 50 ms from now
        self._late = 0
        self._spun_ns = 0  # of the counted sends: CPU the loop burns waiting, not the client's
        self._cpu_from = self._cpu_to = 0.0
        self._end = 0

    def due_ns(self, seq: int) -> int:
        return self.t0 + seq * self._interval_ns

    def body(self, seq: int, sched_ns: int, spun_ns: int) -> bytes:
        """The body of send ``seq``, stamped now; counts the window, lateness and spin."""
        if seq == LATENCY_WARMUP:
            self._window[0].set()
            self._cpu_from = process_cpu_s()
        elif seq > LATENCY_WARMUP:
            self._spun_ns += spun_ns
        now = time.monotonic_ns()
        if now - sched_ns > 1_000_000:
            self._late += 1
        return STAMP.pack(sched_ns, seq) + SENT.pack(now) + self._pad

    def finished(self) -> None:
        """The last send was made: the counted window ends."""
        self._end = time.monotonic_ns()
        self._cpu_to = process_cpu_s()
        self._window[1].set()

    def result(self) -> dict[str, Any]:
        counted = self.total - LATENCY_WARMUP
        return {
            "role": "producer",
            "sent": self.total,
            "late_sends": self._late,
            "achieved_rate": self.total / ((self._end - self.t0) / 1e9),
            "cpu_us_per_msg": (self._cpu_to - self._cpu_from) * 1e6 / counted,
            "spin_us_per_msg": self._spun_ns / 1e3 / counted,
        }


def _failed(role: str, e: BaseException) -> dict[str, Any]:
    return {"role": role, "error": f"{type(e).__name__}: {e}"[:300]}


def latency_consumer(driver, mode, total: int, ready, timeout_s: float, results) -> None:
    try:
        got = Receipts()
        with driver.consumer(mode, 0) as poll:
            poll(0.05)  # subscribe before the producer starts
            ready.set()
            clock = time.monotonic_ns
            give_up = clock() + int(timeout_s * 1e9)
            while len(got.stamps) < total and clock() < give_up:
                bodies = poll(0.5)
                got.record(bodies, clock())
        results.put(got.result())
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which prints it
        ready.set()
        results.put(_failed("consumer", e))


def latency_producer(driver, mode, total: int, rate: int, size: int, ready, window, results, spin_ns: int) -> None:
    try:
        if not spin_ns:
            machine.exact_sleeps()
        with driver.sender(mode, 0) as sender:
            if not ready.wait(timeout=60):
                raise TimeoutError("consumer not ready within 60 s")
            pacing = Pacing(total, rate, size, window)
            for seq in range(total):
                sched = pacing.due_ns(seq)
                spun = sleep_until_ns(sched, spin_ns)  # sleeping lets the client's threads run
                sender.send(pacing.body(seq, sched, spun))
            pacing.finished()
            sender.wait_acked(timeout_s=60)
        results.put(pacing.result())
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which prints it
        results.put(_failed("producer", e))


# -- asyncio --------------------------------------------------------------------------------


LOOP_TIMER_NS = 1_200_000  # an event loop's timer ends up to 1 ms late (epoll waits in whole ms)
#: Behind schedule, the asyncio producer sends what is due without giving the loop a turn in
#: between, as an asyncio program with work ready does it in one turn; but it gives the loop
#: (its reads, the producer's pump) a turn at least this often.
CATCH_UP_TURN_NS = 1_000_000


async def asleep_until_ns(tick_ns: int, spin_ns: int) -> int:
    """:func:`bench.machine.sleep_until_ns` on an event loop: one turn of the loop (its reads
    and writes run), a sleep on the loop while the send time is further off than the loop's
    timers can miss it by, then the rest as the blocking producer waits (a precise sleep to
    ``spin_ns`` before ``tick_ns``, then a spin). The ns spun."""
    await asyncio.sleep(0)
    ahead = tick_ns - time.monotonic_ns()
    if ahead > spin_ns + LOOP_TIMER_NS:
        await asyncio.sleep((ahead - spin_ns - LOOP_TIMER_NS) / 1e9)
    return sleep_until_ns(tick_ns, spin_ns)


class AsyncFutureSender:
    """Keeps the asyncio futures of sends in flight (at most ``INFLIGHT_MAX``) and awaits them."""

    def __init__(self, submit) -> None:
        self._submit = submit
        self._pending: collections.deque = collections.deque()

    async def send(self, body: bytes) -> None:
        pending = self._pending
        if len(pending) >= INFLIGHT_MAX:
            await pending.popleft()
        while pending and pending[0].done():
            pending.popleft().result()  # raises if the send failed
        pending.append(self._submit(body))

    async def wait_acked(self, timeout_s: float) -> None:
        async with asyncio.timeout(timeout_s):
            while self._pending:
                await self._pending.popleft()


def latency_consumer_aio(driver, mode, total: int, ready, timeout_s: float, results) -> None:
    async def run() -> dict[str, Any]:
        got = Receipts()
        async with driver.async_consumer(mode, 0) as poll:
            await poll(0.05)  # subscribe before the producer starts
            ready.set()
            clock = time.monotonic_ns
            give_up = clock() + int(timeout_s * 1e9)
            while len(got.stamps) < total and clock() < give_up:
                bodies = await poll(0.5)
                got.record(bodies, clock())
        return got.result()

    try:
        results.put(asyncio.run(run()))
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which prints it
        ready.set()
        results.put(_failed("consumer", e))


def latency_producer_aio(driver, mode, total: int, rate: int, size: int, ready, window, results, spin_ns: int) -> None:
    async def run() -> dict[str, Any]:
        async with driver.async_sender(mode, 0) as sender:
            if not await asyncio.to_thread(ready.wait, 60):
                raise TimeoutError("consumer not ready within 60 s")
            pacing = Pacing(total, rate, size, window)
            clock = time.monotonic_ns
            turn_ns = 0  # when the loop last had a turn
            for seq in range(total):
                sched = pacing.due_ns(seq)
                now = clock()
                if now < sched or now - turn_ns >= CATCH_UP_TURN_NS:
                    spun = await asleep_until_ns(sched, spin_ns)
                    turn_ns = clock()
                else:  # due already: it joins the sends of this turn (one batch), as work ready would
                    spun = 0
                await sender.send(pacing.body(seq, sched, spun))
            pacing.finished()
            await sender.wait_acked(timeout_s=60)
        return pacing.result()

    try:
        if not spin_ns:
            machine.exact_sleeps()
        results.put(asyncio.run(run()))
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which prints it
        results.put(_failed("producer", e))
