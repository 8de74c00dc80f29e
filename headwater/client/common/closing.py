"""What the handles a user closes have alike, written once: ``closed``, the check that
refuses a call after ``close()``, and closing at the end of a ``with`` (or ``async with``)
block. A handle whose block does more (joins first, commits only without an error) says so
in its own ``__enter__``/``__exit__``."""

from __future__ import annotations

from typing import Any, Self

from headwater.errors import ClosedError

__all__ = ["AsyncClosesOnExit", "Closable", "ClosesOnExit"]


class Closable:
    """``closed``, and :meth:`_check_open`, which raises :class:`~headwater.errors.ClosedError`
    once ``close()`` set ``_closed``; ``_kind`` names the handle in the error."""

    _closed = False
    _kind: str  # "consumer", "shared consumer", ...

    @property
    def closed(self) -> bool:
        """Whether ``close()`` was called."""
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError(f"this {self._kind} is closed")


class ClosesOnExit:
    """``with handle:`` closes it at the end of the block."""

    close: Any  # the handle's own

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncClosesOnExit:
    """``async with handle:`` awaits its ``close()`` at the end of the block."""

    close: Any  # the handle's own, a coroutine function

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
