"""What the consumers' ``poll()`` loops share: waiting for reads, taking and handing out records.

A consumer keeps, per partition, a buffer of read records, the position its next read
starts from, and the position it has consumed up to (what a commit stores). ``poll()``
hands out buffered records first; when there are none it waits for the next read (an answer
to its fetches, or a fetch stream's push) and takes its records (:func:`take_batches`). Over
the network the waiting thread reads the connection itself (see ``RemoteService.lead``);
embedded, it waits on the futures. (The asyncio consumer awaits instead, and shares
:func:`take_batches` and :func:`drain_buffers`.) The buffers (:class:`RecordBuffers`) know
which of them hold records, so a poll costs the partitions it hands out, not the partitions
assigned (a consumer of 10,000 partitions polls as fast as one of ten).
"""

from __future__ import annotations

import concurrent.futures
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from headwater.client.core.lookups import stored_records
from headwater.errors import UnavailableError
from headwater.model.message import Record
from headwater.model.service import HasTransport

__all__ = ["Lead", "Outage", "RecordBuffers", "drain_buffers", "retrieve", "take_batches", "wait_any"]

K = TypeVar("K")

Lead = Callable[..., "concurrent.futures.Future | None"]  # RemoteService.lead(futures, timeout_s, *, interrupt=None)


class RecordBuffers(dict[K, "deque[Record]"], Generic[K]):
    """Each partition's records read and not handed out yet, and which partitions have any
    (``filled``, in the order they were filled): :func:`drain_buffers` walks those alone.
    Whoever adds records calls :meth:`filled_up` (``take_batches`` does); a buffer replaced
    or removed (a seek, a partition forgotten) leaves ``filled`` by itself at the next drain.

    >>> b = RecordBuffers(); b["p"] = deque(); b["p"].append(1); b.filled_up("p"); list(b.filled)
    ['p']
    """

    __slots__ = ("filled",)

    def __init__(self) -> None:
        super().__init__()
        self.filled: dict[K, None] = {}

    def filled_up(self, key: K) -> None:
        """``key``'s buffer may hold records now."""
        if self[key]:
            self.filled[key] = None

    def clear(self) -> None:
        super().clear()
        self.filled.clear()


class Outage:
    """A consumer's reads through a broker's restart. A read that failed with
    :class:`~headwater.errors.UnavailableError` (the connection was lost, or the broker is
    stopping) is tried again, like the consumer's next read, until an attempt to connect made
    since the first failure in a row gave up (the transport's own rule for calls:
    ``gave_up_connecting_since``, after ``connect_timeout_s``), or a broker that answers keeps
    failing it for ``connect_timeout_s``; then it is the poll's error. Embedded (no transport)
    nothing is tried again.

    >>> o = Outage(None); o.rides_out(UnavailableError("gone"))
    False
    """

    __slots__ = ("_transport", "since", "tries")

    def __init__(self, service: Any) -> None:
        self._transport = service.transport if isinstance(service, HasTransport) else None
        self.since: float | None = None  # the first failure in a row
        self.tries = 0  # failures in a row

    def rides_out(self, error: BaseException) -> bool:
        """Whether a read that failed with ``error`` is to be tried again (else: raise it)."""
        if self._transport is None or not isinstance(error, UnavailableError):
            return False
        self.began()
        self.tries += 1
        since = self.since
        assert since is not None
        return (
            not self._transport.gave_up_connecting_since(since)
            and time.monotonic() - since < self._transport.connect_timeout_s
        )

    def began(self) -> None:
        """The broker went away now (a stream's connection was lost, say), unless it had already."""
        if self.since is None:
            self.since = time.monotonic()

    def unsent(self, submitted_at: float) -> None:
        """A read submitted at ``submitted_at`` (``time.monotonic()``) waited its whole time
        without being written, and was taken back: the client is connecting again. Go on
        (the next read tries again), unless an attempt to connect made since the outage
        began gave up; then that is the read's error."""
        if self._transport is None:
            return
        if self.since is None:
            self.since = submitted_at
        self.tries += 1
        if self._transport.gave_up_connecting_since(self.since):
            failure = self._transport.connect_failure
            raise UnavailableError(
                str(failure) if failure is not None else f"cannot reach the broker at {self._transport.address}"
            )

    def backoff_s(self) -> float:
        """How long to wait before trying again: 0.05 s, doubling with each failure in a row,
        at most 1 s (for a retry that would otherwise be answered at once)."""
        return min(1.0, 0.05 * 2 ** max(0, self.tries - 1))

    def over(self) -> None:
        """A read succeeded: the broker is back."""
        self.since = None
        self.tries = 0

    def result(self, fut: Any) -> Any:
        """The result of a read's done future; None when it failed with an error to ride out
        (read again on the next turn). Any other error is raised."""
        try:
            res = fut.result()
        except UnavailableError as e:
            if not self.rides_out(e):
                raise
            return None
        self.over()
        return res


def wait_any(
    futures: list[concurrent.futures.Future],
    timeout_s: float,
    *,
    lead: Lead | None = None,
    interrupt: concurrent.futures.Future | None = None,
) -> None:
    """Wait until one of ``futures`` is done or ``timeout_s`` passes. With ``lead`` this
    thread reads the answers itself (once another thread that reads stops, if one does);
    with nothing to wait for (``timeout_s`` <= 0) it still takes what has come, without
    blocking. ``interrupt`` (one of ``futures``): a future
    another thread completes to end the wait at once."""
    deadline = time.monotonic() + timeout_s
    while lead is not None:
        free = lead(futures, max(0.0, deadline - time.monotonic()), interrupt=interrupt)
        if free is None:  # this thread read (or nobody reads: the loop does, for the futures)
            break
        remaining = deadline - time.monotonic()
        if remaining <= 0 or _any_done(futures):
            return
        # another thread reads the connection: wait for an answer, or for it to stop reading,
        # then read for ourselves (nobody else reads a fetch stream's pushes)
        concurrent.futures.wait([*futures, free], timeout=remaining, return_when=concurrent.futures.FIRST_COMPLETED)
        if _any_done(futures):
            return
    remaining = deadline - time.monotonic()
    if remaining > 0 and not _any_done(futures):
        concurrent.futures.wait(futures, timeout=remaining, return_when=concurrent.futures.FIRST_COMPLETED)


def _any_done(futures: list[concurrent.futures.Future]) -> bool:
    for f in futures:
        if f.done():
            return True
    return False


def take_batches(
    tp: Any,
    batches: list,
    start: int,
    next_offset: int,
    fetch_pos: dict[Any, int],
    consumed: dict[Any, int],
    buffers: RecordBuffers[Any],
    tags: frozenset[str] | None,
) -> int:
    """Stored ``batches`` read for partition ``tp`` (a fetch's answer, a push): their records
    from ``start`` on (and matching ``tags``) into its buffer, its read position moved to
    ``next_offset``; the records taken. ``tp`` is ``(queue, partition)``."""
    buf = buffers[tp]
    recs = stored_records(batches, tp[0], start_offset=start, tags=tags)
    got = len(recs)
    if got:
        buf.extend(recs)
        buffers.filled[tp] = None
    nxt = max(start, next_offset)
    fetch_pos[tp] = nxt
    if not buf:  # nothing to hand out: consumed up to where reading goes on
        consumed[tp] = nxt
    return got


def drain_buffers(
    buffers: RecordBuffers[Any],
    fetch_pos: dict[Any, int],
    consumed: dict[Any, int],
    limit: int,
    paused: set[Any] | frozenset[Any] = frozenset(),
) -> list[Record]:
    """Up to ``limit`` buffered records, partition after partition in the order their buffers
    filled, moving ``consumed`` past each; a partition whose buffer empties is consumed up to
    its fetch position (the records between were skipped: filtered out, or expired), and
    goes to the back of the order when it fills again. An empty buffer's partition is
    consumed up to its fetch position already (whoever moves one keeps it so). The
    ``paused`` partitions keep their records, and their place in the order."""
    out: list[Record] = []
    filled = buffers.filled
    for part in list(filled):
        room = limit - len(out)
        if room <= 0:
            break
        if paused and part in paused:
            continue
        buf = buffers.get(part)
        if not buf:  # replaced or removed since it filled (a seek, a partition forgotten)
            del filled[part]
        elif len(buf) <= room:  # all of it: no step per record
            out.extend(buf)
            buf.clear()
            del filled[part]
            consumed[part] = fetch_pos[part]
        else:
            taken = [buf.popleft() for _ in range(room)]
            out.extend(taken)
            consumed[part] = taken[-1].offset + 1
            break
    return out


def retrieve(task: Any) -> None:
    """Mark the outcome of a task nobody will await as seen (no "never retrieved" noise)."""
    if not task.cancelled():
        task.exception()
