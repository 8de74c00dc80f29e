"""CommitPipeline: what ``commit_async`` sends, in which order, and whom it tells; no I/O.

A consumer's ``commit_async(offsets, callback)`` returns at once. The driver (a thread of
the blocking consumer, a task of the asyncio one) sends the queued commits one request at
a time, as Kafka's ``commitAsync`` pipelines them:

- **In order.** One commit request is in flight at a time. Commits queued while it is out
  go together in the next, merged so that a later offset of a partition replaces an
  earlier one: what the broker ends with is what applying them one by one would give, and
  an older position never lands after a newer one (two requests in flight could be applied
  in either order on a broker that serves requests on several threads).
- **Never retried out of order.** A failed request is not sent again by the pipeline: its
  error goes to the callbacks of the commits it carried, and the next queued commit (newer
  positions) goes next. (A group member's commit learns a new generation and retries
  *within* its own request, before anything queued behind it; that keeps the order.)
- **Callbacks** ``callback(offsets, error)`` get the offsets that commit named and None or
  the exception. They become due when the request ends and are run by the driver from the
  application's thread or task (``poll``, ``commit``, ``commit_async``, ``close``), never
  from a thread of the client's own, as Kafka runs them from ``poll``.
- **Waiting for them.** ``commit()`` and ``close()`` wait until the pipeline is idle, so a
  blocking commit lands after every asynchronous one made before it.
- **Bounded.** Commits without a callback merge into the last queued one; at most
  ``queued_max`` commits with callbacks wait, and one more is refused with
  :class:`~headwater.errors.UnavailableError` (the broker is not keeping up: wait with
  ``commit()``).

>>> p = CommitPipeline()
>>> p.add({("q", 0): 5}, None)
>>> p.add({("q", 0): 7, ("q", 1): 2}, lambda offsets, error: print(offsets, error))
>>> p.next_send()
{('q', 0): 7, ('q', 1): 2}
>>> p.next_send() is None  # one request at a time
True
>>> p.ended(None)
>>> for callback, offsets, error in p.take_due():
...     callback(offsets, error)
{('q', 0): 7, ('q', 1): 2} None
>>> p.idle
True
"""

from __future__ import annotations

from collections.abc import Callable

from headwater.errors import UnavailableError

__all__ = ["COMMITS_QUEUED_MAX", "CommitCallback", "CommitPipeline", "Offsets"]

#: A consumer's positions to commit: ``{(queue, partition): offset}``.
Offsets = dict[tuple[str, int], int]
#: ``callback(offsets, error)``: error is None when the commit was stored.
CommitCallback = Callable[[Offsets, "BaseException | None"], object]

COMMITS_QUEUED_MAX = 10_000  # commits with a callback waiting for the broker, per consumer


class _Entry:
    __slots__ = ("callback", "offsets")

    def __init__(self, offsets: Offsets, callback: CommitCallback | None) -> None:
        self.offsets = offsets
        self.callback = callback


class CommitPipeline:
    """The queued and in-flight asynchronous commits of one consumer (see the module's
    docstring). Not thread-safe: the blocking driver guards it with a lock."""

    def __init__(self, queued_max: int = COMMITS_QUEUED_MAX) -> None:
        self._queued: list[_Entry] = []
        self._with_callback = 0  # queued entries that have a callback
        self._in_flight: list[_Entry] | None = None
        self._due: list[tuple[CommitCallback, Offsets, BaseException | None]] = []
        self._queued_max = queued_max

    @property
    def idle(self) -> bool:
        """Nothing queued and nothing in flight (callbacks may still be due)."""
        return not self._queued and self._in_flight is None

    @property
    def sending(self) -> bool:
        """A request is in flight."""
        return self._in_flight is not None

    def add(self, offsets: Offsets, callback: CommitCallback | None) -> None:
        """Queue a commit of ``offsets`` (a copy is kept)."""
        last = self._queued[-1] if self._queued else None
        if callback is None and last is not None and last.callback is None:
            last.offsets.update(offsets)  # nobody waits on either: one entry
            return
        if callback is not None:
            if self._with_callback >= self._queued_max:
                raise UnavailableError(
                    f"{self._queued_max} asynchronous commits are waiting for the broker: it is not keeping "
                    f"up; wait for them with commit(), or commit_async() without a callback"
                )
            self._with_callback += 1
        self._queued.append(_Entry(dict(offsets), callback))

    def next_send(self) -> Offsets | None:
        """The offsets of the next request: every queued commit merged in order, now in
        flight; None while one is in flight or nothing is queued."""
        if self._in_flight is not None or not self._queued:
            return None
        entries, self._queued, self._with_callback = self._queued, [], 0
        merged: Offsets = {}
        for e in entries:
            merged.update(e.offsets)
        self._in_flight = entries
        return merged

    def ended(self, error: BaseException | None) -> None:
        """The request in flight ended (``error``: None when stored); its commits'
        callbacks are due."""
        entries, self._in_flight = self._in_flight, None
        assert entries is not None, "ended() without a request in flight"
        for e in entries:
            if e.callback is not None:
                self._due.append((e.callback, e.offsets, error))

    def fail_queued(self, error: BaseException) -> None:
        """Give up the queued commits (the consumer closes and cannot send them): their
        callbacks are due with ``error``."""
        entries, self._queued, self._with_callback = self._queued, [], 0
        for e in entries:
            if e.callback is not None:
                self._due.append((e.callback, e.offsets, error))

    def take_due(self) -> list[tuple[CommitCallback, Offsets, BaseException | None]]:
        """The callbacks to run now, in the order of their commits, with their arguments."""
        due, self._due = self._due, []
        return due
