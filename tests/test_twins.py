"""One body, two drivers: the blocking and asyncio methods made from a ``@waits`` generator."""

from __future__ import annotations

import asyncio
import inspect

import pytest

from headwater.client.common.twins import ASYNCIO, BLOCKING, Twins, waits


class Blocking:
    def double(self, x: int) -> int:
        if x < 0:
            raise ValueError(f"negative: {x}")
        return 2 * x


class Awaitable:
    async def double(self, x: int) -> int:
        await asyncio.sleep(0)
        return Blocking().double(x)

    async def forever(self) -> None:
        await asyncio.Event().wait()


class Body(Twins):
    def __init__(self, service: object) -> None:
        self.service = service
        self.cleaned = False

    def _plus_one(self, x):  # a helper body: a plain generator
        return (yield self.service.double(x)) + 1

    @waits
    def run(self, x):
        """Double, double plus one, and survive one refusal."""
        a = yield self.service.double(x)
        b = yield from self._plus_one(a)
        try:
            yield self.service.double(-1)
        except ValueError as error:
            return b, str(error)
        return b, None

    @waits
    def hang(self):
        try:
            yield self.service.forever()
        finally:
            self.cleaned = True


class BlockingBody(Body, driver=BLOCKING):
    pass


class AsyncBody(Body, driver=ASYNCIO):
    pass


class AsyncChild(AsyncBody):
    @waits
    def more(self):
        return (yield self.service.double(5))


def test_a_blocking_driver_returns_the_answer_and_raises_into_the_body() -> None:
    assert BlockingBody(Blocking()).run(3) == (13, "negative: -1")
    assert not inspect.iscoroutinefunction(BlockingBody.run)
    assert BlockingBody.run.__doc__ == Body.run.__doc__


def test_an_asyncio_driver_awaits_each_step_and_throws_errors_in() -> None:
    assert inspect.iscoroutinefunction(AsyncBody.run)
    assert inspect.signature(AsyncBody.run) == inspect.signature(Body.run)
    assert asyncio.run(AsyncBody(Awaitable()).run(3)) == (13, "negative: -1")


def test_a_subclass_of_a_driven_class_drives_its_own_bodies_once() -> None:
    assert inspect.iscoroutinefunction(AsyncChild.more)
    assert AsyncChild.run is AsyncBody.run  # inherited driven methods are not wrapped again
    assert asyncio.run(AsyncChild(Awaitable()).more()) == 10


def test_cancelling_an_asyncio_twin_runs_the_bodys_finally() -> None:
    async def main() -> bool:
        body = AsyncBody(Awaitable())
        task = asyncio.ensure_future(body.hang())
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return body.cleaned

    assert asyncio.run(main())


def test_a_class_without_a_driver_keeps_generators() -> None:
    assert inspect.isgeneratorfunction(Body.run)
