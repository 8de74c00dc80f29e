"""The consumer's side of a push, without a broker: the fetch streams' waits and the
waiter a push settles (the hand-off ``poll()`` waits on), and the poll argument checks
every poll makes."""

from __future__ import annotations

import asyncio
import concurrent.futures
import enum
import time

import pytest

from headwater.client.common.positions import ConsumerPositions
from headwater.client.core.reads import check_poll
from headwater.client.transport.fetch_stream import FetchStreams
from headwater.errors import InvalidArgumentError


class _Service:
    """Opens streams by handing out the futures of their answers, for the test to settle."""

    def __init__(self) -> None:
        self.answers: list[concurrent.futures.Future] = []

    def open_fetch_stream(self, queue, offsets, handler, **kwargs):
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self.answers.append(fut)
        return len(self.answers), fut


def test_openings_are_the_answers_still_awaited_and_wait_s_the_time_to_wait():
    service = _Service()
    streams = FetchStreams(service)
    assert streams.openings() == [] and streams.wait_s(0.5) == 0.5
    streams.open_missing({("a", 0): 0, ("b", 0): 3})
    assert streams.openings() == service.answers
    service.answers[0].set_result(None)
    assert streams.openings() == [service.answers[1]]
    # a stream that failed to open is tried again at retry_at: the wait ends by then
    s = streams._streams["b"]
    s.sid, s.opening, s.retry_at = None, None, time.monotonic() + 0.1
    assert 0 < streams.wait_s(5.0) <= 0.1
    assert streams.wait_s(0.01) == 0.01


class _Waiting(ConsumerPositions):
    """Only what ``_push_arrived`` reads."""

    def __init__(self, waiter) -> None:  # (no consumer state: the test needs none)
        self._push_waiter = waiter


def test_a_push_settles_the_waiter_once_and_none_waiting_is_fine():
    waiter: concurrent.futures.Future = concurrent.futures.Future()
    w = _Waiting(waiter)
    w._push_arrived()
    assert waiter.done() and waiter.result() is None
    w._push_arrived()  # already settled: nothing happens
    _Waiting(None)._push_arrived()  # nobody waits


def test_check_poll_takes_positive_ints_and_refuses_bools_and_the_rest():
    class Count(enum.IntEnum):
        TEN = 10

    assert check_poll(5, 0, 500) == 5
    assert check_poll(None, 10, 500) == 500
    assert check_poll(Count.TEN, 1.5, 500) == 10
    for bad in (True, 0, -1, 2.0, "3"):
        with pytest.raises(InvalidArgumentError, match="max_messages"):
            check_poll(bad, 0, 500)
    with pytest.raises(InvalidArgumentError, match="timeout_ms"):
        check_poll(5, -1, 500)


def _polling(waiter):
    """An asyncio consumer with nothing but what ``AsyncConsumer._wait_any`` reads: the poll's
    push waiter, and the push timer (its attributes' defaults and methods, the class's)."""
    from headwater.client.aio.consumer import AsyncConsumer

    polling = AsyncConsumer.__new__(AsyncConsumer)
    polling._push_waiter = waiter
    return polling


def test_the_asyncio_wait_for_a_push_ends_with_the_push_or_its_time():
    from headwater.client.aio.consumer import AsyncConsumer

    async def main():
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()  # no push: the wait's time settles it
        await asyncio.wait_for(AsyncConsumer._wait_any(_polling(waiter), [waiter], 0.01), 10)
        assert waiter.done()
        waiter = loop.create_future()  # a push comes first
        loop.call_soon(waiter.set_result, None)
        await asyncio.wait_for(AsyncConsumer._wait_any(_polling(waiter), [waiter], 30.0), 10)
        waiter = loop.create_future()  # the poll is cancelled: so is its wait
        task = asyncio.ensure_future(AsyncConsumer._wait_any(_polling(waiter), [waiter], 30.0))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        other = loop.create_future()  # not the poll's waiter: waited on, never settled by the wait
        await AsyncConsumer._wait_any(_polling(waiter), [other], 0.01)
        assert not other.done()

    asyncio.run(main())
