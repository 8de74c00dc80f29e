"""FetchStreams: the client side of fetch streams, for the consumers that read over the network.

Instead of a FETCH per answer, a consumer opens one stream per queue over the partitions it
reads, at its positions, and the broker pushes each partition's new batches as they are
appended (docs/protocol.md, 7.5.5). This class keeps a consumer's streams and what they
pushed, for the blocking consumer and the asyncio one alike: it only sends what needs no
answer (credit grants, closes; ``service.credit_fetch_stream`` and ``close_fetch_stream``
return at once on both), and leaves opening a stream, which waits, to the consumer
(:meth:`to_open`, :meth:`handler_for`, then :meth:`opened`).

Pushes arrive on whichever thread reads the connection: the blocking consumer's own while
its ``poll()`` waits (it leads, see ``RemoteService.lead``), the asyncio consumer's event
loop. They are queued here as they come (``notify`` is called after each) and decoded by
the consumer's ``poll()`` through :meth:`take`.

Flow control is by byte credit: a stream is opened with ``window_bytes`` of credit, and
:meth:`take` grants back the bytes of the pushes it decoded once they add up to half the
window. Positions stay the consumer's: a seek, an assignment change or a lost connection ends
the queue's stream (:meth:`close`), and the next poll opens another where the consumer is. A
stream the broker ends for good (the queue was deleted, the stream was refused) raises its
reason from :meth:`take`; one it ends with a retriable error (the broker is stopping for a
restart) is opened again by the next poll, as after a lost connection, so a consumer goes on
across a broker's restart (within the client's ``connect_timeout_s``, like any call).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from typing import Any

from headwater.client.polling import Outage, take_batches
from headwater.errors import UnavailableError, error_for_code

__all__ = ["FetchStreams", "STREAM_WINDOW_BYTES"]

log = logging.getLogger("headwater.client")

#: Batch bytes a stream may have pushed and not yet decoded, by default.
STREAM_WINDOW_BYTES = 4 << 20

TP = tuple[str, int]
Handler = Callable[[Any], None]


class _Stream:
    __slots__ = ("queue", "sid", "pushes", "lost", "undecoded")

    def __init__(self, queue: str) -> None:
        self.queue = queue
        self.sid: int | None = None  # known once opened
        self.pushes: deque = deque()  # StreamPush bodies as they came (any thread appends)
        self.lost = False  # the connection went: open again
        self.undecoded = 0  # bytes decoded since the last credit grant


class FetchStreams:
    """The fetch streams of one consumer, one per queue it reads. Used from the consumer's
    thread (or task); only the handlers run elsewhere, and call ``notify`` after each push."""

    def __init__(self, service: Any, *, window_bytes: int = STREAM_WINDOW_BYTES,
                 notify: Callable[[], None] = lambda: None) -> None:
        self._service = service
        self.window_bytes = window_bytes
        self._notify = notify
        self._streams: dict[str, _Stream] = {}
        self._outage = Outage(service)  # opening again after the broker went away

    def to_open(self, positions: dict[TP, int]) -> dict[str, dict[int, int]]:
        """``{queue: {partition: offset}}`` for each queue in ``positions`` without a live
        stream; call :meth:`handler_for`, open it, then :meth:`opened` (or :meth:`failed`)."""
        want: dict[str, dict[int, int]] = {}
        for (queue, partition), offset in positions.items():
            s = self._streams.get(queue)
            if s is None or s.lost:
                want.setdefault(queue, {})[partition] = offset
        return want

    def handler_for(self, queue: str) -> Handler:
        """The push handler of the stream about to be opened for ``queue``."""
        s = self._streams[queue] = _Stream(queue)

        def handle(push: Any, s: _Stream = s) -> None:  # any thread: a push, or None when the connection is lost
            if push is None:
                s.lost = True
            else:
                s.pushes.append(push)
            self._notify()

        return handle

    def opened(self, queue: str, sid: int) -> None:
        self._streams[queue].sid = sid
        self._outage.over()

    def failed(self, queue: str, error: BaseException | None = None) -> float | None:
        """Opening the stream of ``queue`` failed: forget it (the next poll tries again).

        When ``error`` is to be ridden out (:class:`~headwater.client.polling.Outage`: the
        broker is stopping for a restart, or cannot be reached yet): how many seconds to wait
        before opening it again. Otherwise None: the caller raises ``error``."""
        self._streams.pop(queue, None)
        if error is None or not self._outage.rides_out(error):
            return None
        return self._outage.backoff_s()

    def pending(self) -> bool:
        """Whether a push (or the news of a lost connection) is waiting to be taken."""
        for s in self._streams.values():
            if s.pushes or s.lost:
                return True
        return False

    def take(self, fetch_pos: dict, consumed: dict, buffers: dict, tags: frozenset[str] | None) -> int:
        """Decode each waiting push into the consumer's ``buffers`` (``polling.take_batches``)
        and grant its bytes back as they add up; the records taken. Raises the reason of a
        stream the broker ended; forgets a stream whose connection was lost."""
        got = 0
        for queue, s in list(self._streams.items()):
            while s.pushes:
                push = s.pushes.popleft()
                if push.stream_id != s.sid:
                    continue  # of an earlier stream: that one is closed
                if push.ended:
                    error = error_for_code(push.ended_code)
                    if error.retriable:  # the broker is stopping, say: open it again, as after a lost connection
                        log.info("the fetch stream of %r ended (%s); opening it again", queue, push.ended)
                        s.lost = True
                        s.pushes.clear()
                        break
                    self._streams.pop(queue, None)
                    raise error(f"reading {queue!r}: {push.ended}")
                tp = (queue, push.partition)
                pos = fetch_pos.get(tp)
                if pos is not None:  # else no longer assigned (its stream is being closed)
                    got += take_batches(tp, push.batches, max(pos, push.start_offset), push.next_offset, fetch_pos,
                                        consumed, buffers, tags)
                s.undecoded += sum(map(len, push.batches))
            if s.lost:
                self._streams.pop(queue, None)
                self._outage.began()  # opening it again is tried until a connect attempt from now gives up
                continue
            if s.undecoded >= self.window_bytes // 2 and s.sid is not None:
                self._service.credit_fetch_stream(s.sid, s.undecoded).add_done_callback(_log_grant_failure)
                s.undecoded = 0
        return got

    def close(self, queue: str | None = None) -> None:
        """End the stream of ``queue`` (of every queue when None) and drop what it pushed;
        the next poll opens it again from the consumer's positions."""
        for q in [queue] if queue is not None else list(self._streams):
            s = self._streams.pop(q, None)
            if s is not None and not s.lost and s.sid is not None:
                self._service.close_fetch_stream(s.sid)


def _log_grant_failure(fut: Any) -> None:
    """Done-callback of a credit grant sent without waiting."""
    if fut.cancelled():
        return
    e = fut.exception()
    if e is not None and not isinstance(e, UnavailableError):  # a lost connection ends the stream anyway
        log.warning("granting a fetch stream more credit failed: %s", e)
