"""FetchStreams: the client side of fetch streams, for a consumer that reads over the network.

Instead of a FETCH per answer, the consumer opens one stream per queue over the partitions
it reads, at its positions, and the broker pushes each partition's new batches as they are
appended (docs/protocol.md, 7.5.5). Pushes arrive on whichever thread reads the connection:
the consumer's own while its ``poll()`` waits (it leads, see ``RemoteService.lead``), the
client's event loop otherwise. They are queued here as they come and decoded by ``poll()``.

Flow control is by byte credit: a stream is opened with ``window_bytes`` of credit, and the
consumer grants back the bytes of the pushes it has decoded once they add up to half the
window, so at most about one window is buffered (plus one push of at most ``fetch_bytes``).

Positions stay the consumer's: a seek, an assignment change or a lost connection ends the
queue's stream (``reset``), and the next ``poll()`` opens another where the consumer is.
A stream the broker ends (the queue was deleted, the broker stops) raises its reason from
that ``poll()``.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
from collections import deque
from collections.abc import Callable
from typing import Any

from headwater.errors import UnavailableError, error_for_code

__all__ = ["FetchStreams", "STREAM_WINDOW_BYTES"]

log = logging.getLogger("headwater.client")

#: Batch bytes a stream may have pushed and not yet decoded, by default.
STREAM_WINDOW_BYTES = 4 << 20

TP = tuple[str, int]


class _Stream:
    __slots__ = ("queue", "sid", "pushes", "lost", "undecoded")

    def __init__(self, queue: str) -> None:
        self.queue = queue
        self.sid = 0  # known once opened
        self.pushes: deque = deque()  # StreamPush bodies as they came (any thread appends)
        self.lost = False  # the connection went: open again
        self.undecoded = 0  # bytes decoded since the last credit grant


class FetchStreams:
    """The fetch streams of one consumer (one per queue it reads). Use from the consumer's
    thread; only :meth:`_on_push` runs on others."""

    def __init__(self, service: Any, *, window_bytes: int = STREAM_WINDOW_BYTES, push_bytes: int = 1 << 20,
                 tag_mask: int = 0) -> None:
        self._service = service
        self.window_bytes = window_bytes
        self._push_bytes = push_bytes
        self._tag_mask = tag_mask
        self._streams: dict[str, _Stream] = {}
        self.arrived: concurrent.futures.Future | None = None  # set by the next push

    def ensure_open(self, positions: dict[TP, int]) -> None:
        """Open a stream for each queue in ``positions`` that has none (or lost its own)."""
        by_queue: dict[str, dict[int, int]] = {}
        for (queue, partition), offset in positions.items():
            by_queue.setdefault(queue, {})[partition] = offset
        for queue, offsets in by_queue.items():
            s = self._streams.get(queue)
            if s is not None and not s.lost:
                continue
            if s is not None:
                self.reset(queue)
            s = _Stream(queue)
            s.sid = self._service.open_fetch_stream(
                queue, offsets, lambda push, s=s: self._on_push(s, push), credit_bytes=self.window_bytes,
                tag_mask=self._tag_mask, push_bytes_max=self._push_bytes)
            self._streams[queue] = s

    def _on_push(self, s: _Stream, push: Any) -> None:
        """A push (None: the connection was lost), on the thread that read it."""
        if push is None:
            s.lost = True
        else:
            s.pushes.append(push)
        waiter = self.arrived
        if waiter is not None:
            with contextlib.suppress(concurrent.futures.InvalidStateError):
                waiter.set_result(None)

    def pending(self) -> bool:
        """Whether a push (or the news of a lost connection) is waiting to be taken."""
        return any(s.pushes or s.lost for s in self._streams.values())

    def take(self, decode: Callable[[TP, Any], int]) -> int:
        """Hand each waiting push to ``decode(tp, push)`` (which returns its records
        counted), grant credit back as it adds up; the records counted. Raises the reason
        of a stream the broker ended; forgets a stream whose connection was lost."""
        got = 0
        for queue, s in list(self._streams.items()):
            while s.pushes:
                push = s.pushes.popleft()
                if push.stream_id != s.sid:
                    continue  # of an earlier stream: that one is closed
                if push.ended:
                    self._streams.pop(queue, None)
                    raise error_for_code(push.ended_code)(f"reading {queue!r}: {push.ended}")
                got += decode((queue, push.partition), push)
                s.undecoded += sum(len(b) for b in push.batches)
            if s.lost:
                self._streams.pop(queue, None)
                continue
            if s.undecoded >= self.window_bytes // 2:
                n, s.undecoded = s.undecoded, 0
                fut = self._service.credit_fetch_stream(s.sid, n)
                fut.add_done_callback(_log_failure)
        return got

    def reset(self, queue: str | None = None) -> None:
        """End the stream of ``queue`` (of every queue when None) and drop what it pushed;
        the next :meth:`ensure_open` opens it again from the consumer's positions."""
        for q in [queue] if queue is not None else list(self._streams):
            s = self._streams.pop(q, None)
            if s is not None and not s.lost:
                self._service.close_fetch_stream(s.sid)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.reset()


def _log_failure(fut: concurrent.futures.Future) -> None:
    e = fut.exception()
    if e is not None and not isinstance(e, UnavailableError):  # a lost connection ends the stream anyway
        log.warning("granting a fetch stream more credit failed: %s", e)
