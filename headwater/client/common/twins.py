"""One body for a blocking method and its asyncio twin.

A client method that asks the broker something is written once, as a generator marked
:func:`waits`. Where it needs an answer it yields the service call and gets the answer
back as the yield's value::

    @waits
    def seek_to_end(self, queue):
        info = yield self._service.describe_queue(queue)
        ...

A class says which kind it is when it is defined (``class Consumer(ConsumerBase,
driver=BLOCKING)``) and every ``@waits`` method it has, its own or inherited, becomes a
plain method or a coroutine:

- **blocking**: the service answers when called, so the yielded value *is* the answer
  and is sent straight back; an error is raised at the call inside the generator;
- **asyncio**: the service returns an awaitable; the coroutine awaits it and sends the
  answer back, or throws the error in at the yield, so ``try``/``finally`` in the body
  behave as in an ``async def``. Cancellation is thrown in the same way.

A helper that waits is a plain generator, unmarked, called with ``yield from`` (a
``@waits`` method is driven, so it cannot be). What differs by kind (how to wait with a
timeout, threads against tasks) stays in each class. The pattern is sans-I/O's: the body
says what to ask, the driver how to wait.
"""

from __future__ import annotations

import enum
import functools
import inspect
import re
from collections.abc import Callable, Generator
from typing import Any, TypeVar

__all__ = ["ASYNCIO", "BLOCKING", "Driver", "Twins", "Waits", "waits"]

F = TypeVar("F", bound=Callable[..., Generator[Any, Any, Any]])
T = TypeVar("T")

#: What a ``@waits`` body returns: ``Waits[QueueInfo]`` is a body whose driven method
#: returns (or, asyncio, resolves to) a ``QueueInfo``; that is what ``help()`` shows.
Waits = Generator[Any, Any, T]

_BODY_RESULT = re.compile(r"^(?:Waits\[|Generator\[Any, Any, )(.*)\]$")


def _present(method: Callable[..., Any], body: Callable[..., Any]) -> Callable[..., Any]:
    """Give the driven method the body's signature with the body's result as its own
    (``Waits[QueueInfo]`` is shown as ``QueueInfo``)."""
    result = body.__annotations__.get("return")
    if isinstance(result, str) and (m := _BODY_RESULT.match(result)):
        method.__annotations__ = {**body.__annotations__, "return": m.group(1)}
        method.__signature__ = inspect.signature(body).replace(  # type: ignore[attr-defined]  # read by inspect
            return_annotation=m.group(1)
        )
    return method


class Driver(enum.Enum):
    """How a class's ``@waits`` methods wait for the broker."""

    BLOCKING = "blocking"
    ASYNCIO = "asyncio"


BLOCKING = Driver.BLOCKING
ASYNCIO = Driver.ASYNCIO


def waits(fn: F) -> F:
    """Mark a generator method as a body that a :class:`Twins` class drives."""
    fn.__headwater_waits__ = True  # type: ignore[attr-defined]  # a marker the class reads
    return fn


def _blocking(body: Callable[..., Generator[Any, Any, Any]]) -> Callable[..., Any]:
    @functools.wraps(body, updated=())
    def method(*args: Any, **kwargs: Any) -> Any:
        steps = body(*args, **kwargs)
        try:
            answer = next(steps)
            while True:  # each yield already holds its answer
                answer = steps.send(answer)
        except StopIteration as done:
            return done.value

    return _present(method, body)


def _asyncio(body: Callable[..., Generator[Any, Any, Any]]) -> Callable[..., Any]:
    @functools.wraps(body, updated=())
    async def method(*args: Any, **kwargs: Any) -> Any:
        steps = body(*args, **kwargs)
        try:
            pending = next(steps)
            while True:
                try:
                    answer = await pending
                except BaseException as error:  # noqa: B036  # cancellation too: the body's finally must run
                    pending = steps.throw(error)
                else:
                    pending = steps.send(answer)
        except StopIteration as done:
            return done.value

    return _present(method, body)


class Twins:
    """A base whose subclasses name a :class:`Driver`; their ``@waits`` methods are made
    blocking methods or coroutines to match. A class without a driver stays abstract:
    its ``@waits`` methods are still generators, for its subclasses to drive."""

    _driver: Driver | None = None

    def __init_subclass__(cls, driver: Driver | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        driver = driver or cls._driver  # a subclass of a driven class is driven alike
        if driver is None:
            return
        cls._driver = driver
        make = _blocking if driver is BLOCKING else _asyncio
        for name in dir(cls):
            body = getattr(cls, name, None)
            # a body not yet driven: wraps(updated=()) does not copy the mark onto the driver
            if inspect.isgeneratorfunction(body) and getattr(body, "__headwater_waits__", False):
                setattr(cls, name, make(body))
