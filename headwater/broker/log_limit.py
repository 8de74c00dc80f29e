"""Lines a misbehaving peer can cause, logged at most once per interval.

A client retrying in a loop, or a fuzzer sending thousands of broken frames, must not fill
the broker's log (2,000 malformed requests once wrote 1.7 MB of tracebacks). The first line
of a kind is written at once; later ones within ``every_s`` are counted, and the next line
written says how many were held back.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

__all__ = ["LogLimit", "limited"]


class LogLimit:
    """One kind of log line, limited. Not thread-safe: use it from one thread (the loop).

    >>> lines, now = [], [0.0]
    >>> limit = LogLimit(lambda fmt, *a: lines.append(fmt % a), 10.0, clock=lambda: now[0])
    >>> limit("bad peer %d", 1), limit("bad peer %d", 2), limit("bad peer %d", 3)
    (True, False, False)
    >>> now[0] = 10.0
    >>> limit("bad peer %d", 4)
    True
    >>> lines
    ['bad peer 1', 'bad peer 4 (and 2 more like it since the last such line)']
    """

    __slots__ = ("_log", "_every_s", "_held", "_logged_at", "_clock")

    def __init__(
        self, log: Callable[..., None], every_s: float, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._log = log  # e.g. logging.getLogger(...).warning
        self._every_s = every_s
        self._held = 0
        self._logged_at: float | None = None
        self._clock = clock

    def __call__(self, fmt: str, *args: object) -> bool:
        """Log ``fmt % args`` unless a line of this kind went out less than ``every_s`` ago;
        True if it was written."""
        now = self._clock()
        if self._logged_at is not None and now - self._logged_at < self._every_s:
            self._held += 1
            return False
        if self._held:
            fmt += " (and %d more like it since the last such line)"
            args = (*args, self._held)
        self._log(fmt, *args)
        self._logged_at, self._held = now, 0
        return True


def limited(logger: logging.Logger, level: int, every_s: float) -> LogLimit:
    """A :class:`LogLimit` writing to ``logger`` at ``level``."""
    return LogLimit(lambda fmt, *args: logger.log(level, fmt, *args), every_s)
