"""FetchStreams: the client side of fetch streams, for the consumers that read over the network.

Instead of a FETCH per answer, a consumer opens one stream per queue over the partitions it
reads, at its positions, and the broker pushes each partition's new batches as they are
appended (docs/protocol.md, 7.5.5). This class keeps a consumer's streams and what they
pushed, for the blocking consumer and the asyncio one alike. It waits for nothing: opening a
stream (:meth:`open_missing`) registers its handler and sends the request, and the answer is a
future that :meth:`take` settles on a later turn (the consumer waits on it with its pushes:
:meth:`openings`). Credit grants and closes need no answer. So a ``poll(timeout_ms)`` keeps
its timeout while the broker is away, as Kafka's ``poll(Duration)`` does.

Pushes arrive on whichever thread reads the connection: the blocking consumer's own while
its ``poll()`` waits (it leads, see ``RemoteService.lead``), the asyncio consumer's event
loop. They are queued here as they come (``notify`` is called after each) and decoded by
the consumer's ``poll()`` through :meth:`take`.

Flow control is by byte credit: a stream is opened with ``window_bytes`` of credit, and
:meth:`take` grants back the bytes of the pushes it decoded once they add up to half the
window. Positions stay the consumer's: a seek, an assignment change or a lost connection ends
the queue's stream (:meth:`close`), and the next poll opens another where the consumer is. A
stream the broker refuses or ends for good (the queue was deleted) raises its reason from
:meth:`take`. One it ends with a retriable error (the broker is stopping for a restart), or
whose connection is lost, is opened again, after a backoff, while the broker cannot be
reached (:class:`~headwater.client.transport.polling.Outage`: within the client's
``connect_timeout_s``, like any call), so a consumer goes on across a broker's restart.

A stream's life (opening it, its handler, its pushes taken and its credit granted, closing
it, a lost connection) is :class:`FetchStreamsBase`'s, written once for one broker and for a
cluster (:class:`~headwater.client.transport.cluster_fetch.ClusterFetchStreams`, a stream per
queue and leader); the two differ in how partitions are planned onto streams and in what a
refusal means.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from headwater.client.transport.polling import Outage, take_batches
from headwater.errors import HeadwaterError, UnavailableError, error_for_code
from headwater.model.cluster import ALONE

__all__ = ["FetchStreams", "FetchStreamsBase", "STREAM_WINDOW_BYTES"]

log = logging.getLogger("headwater.client")

#: Batch bytes a stream may have pushed and not yet decoded, by default.
STREAM_WINDOW_BYTES = 4 << 20

TP = tuple[str, int]
Handler = Callable[[Any], None]
# (tp, start_offset, end_offset, batches) of a read: True when its position moved (past the end, or
# the batches are of the queue created again), so the read is not taken
ReadCheck = Callable[[TP, int, int, Sequence[Any]], bool]


class _Stream:
    """The fetch stream of ``partitions`` of ``queue`` at broker ``broker_id`` (``ALONE``
    over one broker), over ``link``, kept under ``key`` (the queue, or (queue, broker id))."""

    __slots__ = (
        "key",
        "queue",
        "broker_id",
        "link",
        "partitions",
        "sid",
        "pushes",
        "lost",
        "undecoded",
        "opening",
        "retry_at",
    )

    def __init__(self, key: Any, queue: str, broker_id: int, link: Any, partitions: list[int]) -> None:
        self.key = key
        self.queue = queue
        self.broker_id = broker_id
        self.link = link
        self.partitions = partitions
        self.sid: int | None = None  # None: opening it failed, and it is tried again at retry_at
        self.pushes: deque[Any] = deque()  # StreamPush bodies as they came (any thread appends)
        self.lost = False  # the connection went: open again
        self.undecoded = 0  # bytes decoded since the last credit grant
        self.opening: Any = None  # the future of the broker's answer, until take() settles it
        self.retry_at = 0.0  # when sid is None: time.monotonic() to open it again at


class FetchStreamsBase:
    """A consumer's fetch streams, over one broker or a cluster: each stream's life (opening
    it, its handler, decoding its pushes and granting their credit back, closing it,
    forgetting it when its connection is lost or the broker ends it). A subclass plans the
    partitions onto streams (:meth:`open_missing`, opening each with :meth:`_open`) and says
    what a refusal means (:meth:`_refused`). Used from the consumer's thread (or task); only
    the handlers run elsewhere, and call ``notify`` after each push."""

    _on_loop = False  # handle the pushes on the client's event loop always (open_fetch_stream)
    _end_is_outage = True  # a retriable end starts an outage (over one broker: the broker is stopping)

    def __init__(
        self,
        service: Any,
        *,
        window_bytes: int = STREAM_WINDOW_BYTES,
        tag_mask: int = 0,
        push_bytes_max: int = 1 << 20,
        notify: Callable[[], None] = lambda: None,
        outage: Outage | None = None,
    ) -> None:
        self._service = service
        self.window_bytes = window_bytes
        self._tag_mask = tag_mask
        self._push_bytes_max = push_bytes_max
        self._notify = notify
        self._streams: dict[Any, _Stream] = {}
        self._outage = outage or Outage(service)  # the consumer's: opening again after the broker went away

    @property
    def streams(self) -> dict[str, dict[int, list[int]]]:
        """The streams open or opening now: queue -> {broker id (-1, ``ALONE``, over one
        broker, as METADATA names it): the partitions it carries}."""
        out: dict[str, dict[int, list[int]]] = {}
        for s in sorted(self._streams.values(), key=lambda s: (s.queue, s.broker_id)):
            if s.sid is not None:
                out.setdefault(s.queue, {})[s.broker_id] = list(s.partitions)
        return out

    def open_missing(self, positions: dict[TP, int]) -> None:
        """Start opening the streams missing for ``positions`` (``{(queue, partition):
        offset}``), without waiting: :meth:`take` settles the answers."""
        raise NotImplementedError

    def _open(self, key: Any, queue: str, broker_id: int, link: Any, offsets: dict[int, int]) -> None:
        """Start opening a stream of ``offsets`` (``{partition: offset}``) of ``queue`` over
        ``link``; the link sends the request without waiting (sync and asyncio alike)."""
        s = self._streams[key] = _Stream(key, queue, broker_id, link, sorted(offsets))
        s.sid, s.opening = link.open_fetch_stream(
            queue,
            offsets,
            self._handler(s),
            credit_bytes=self.window_bytes,
            tag_mask=self._tag_mask,
            push_bytes_max=self._push_bytes_max,
            on_loop=self._on_loop,
        )

    def _handler(self, s: _Stream) -> Handler:
        def handle(push: Any) -> None:  # any thread: a push, or None when the connection is lost
            if push is None:
                s.lost = True
            else:
                s.pushes.append(push)
            self._notify()

        return handle

    def openings(self) -> list[Any]:
        """The futures of the answers still awaited (to wait on with the pushes)."""
        # a loop, not a comprehension: it runs before every wait, and a comprehension is a call
        waiting = []
        for s in self._streams.values():
            if s.opening is not None and not s.opening.done():
                waiting.append(s.opening)
        return waiting

    def wait_s(self, remaining: float) -> float:
        """How long the consumer may wait for a push: ``remaining``, or less when a stream
        that failed to open is due to be tried again sooner."""
        wait = remaining
        for s in self._streams.values():  # (no comprehension: this runs before every wait)
            if s.sid is None:
                wait = min(wait, s.retry_at - time.monotonic())
        return wait

    def pending(self) -> bool:
        """Whether something waits to be taken: a push, the news of a lost connection, the
        broker's answer to an opening."""
        for s in self._streams.values():
            if (s.pushes and s.sid is not None) or (s.lost and s.opening is None):
                return True
            if s.opening is not None and s.opening.done():
                return True
        return False

    def _settle(self, s: _Stream) -> None:
        """The broker answered the opening of ``s``: it is open, or failed."""
        fut, s.opening = s.opening, None
        error = fut.exception() if not fut.cancelled() else UnavailableError("opening the stream was cancelled")
        if error is None:
            self._outage.over()
            if s.lost:  # its connection went between the handler's registration and the request
                s.link.close_fetch_stream(s.sid)
            return
        if not self._outage.rides_out(error):
            self._drop(s)
            raise error
        self._refused(s, error)

    def _refused(self, s: _Stream, error: HeadwaterError) -> None:
        """Opening ``s`` failed for ``error``, to be ridden out: open it again after a backoff."""
        s.sid, s.lost, s.retry_at = None, False, time.monotonic() + self._outage.backoff_s()
        s.pushes.clear()

    def _gone(self, s: _Stream, *, outage: bool) -> None:
        """Forget ``s``, whose connection was lost (``outage``: opening it again is tried
        until a connect attempt from now gives up) or which the broker ended for a passing
        reason: the next :meth:`open_missing` opens it again."""
        self._drop(s)
        if outage:
            self._outage.began()

    def _drop(self, s: _Stream, *, close: bool = False) -> None:
        """Forget ``s`` and what it pushed (``close``: tell its broker)."""
        if self._streams.get(s.key) is s:
            del self._streams[s.key]
        if close and not s.lost and s.sid is not None:
            s.link.close_fetch_stream(s.sid)

    def take(
        self,
        fetch_pos: dict[TP, int],
        consumed: dict[TP, int],
        buffers: dict[Any, Any],
        tags: frozenset[str] | None,
        check: ReadCheck | None = None,
    ) -> int:
        """Settle the answers to openings, decode each waiting push into the consumer's
        ``buffers`` (``polling.take_batches``) and grant its bytes back as they add up; the
        records taken. Raises why a stream could not be opened, or the reason of a stream the
        broker ended; forgets a stream whose connection was lost. Each push goes to
        ``check(tp, start_offset, end_offset, batches)`` first, which moves the position
        (closing the stream: the rest of its pushes are dropped) and says so when the push
        shows it past the partition's end (the broker sends one, empty, when it finds that)
        or in the queue created again; without it, a push past the end is ignored."""
        got = 0
        streams = self._streams
        for s in list(streams.values()):
            if s.opening is not None and s.opening.done():
                self._settle(s)
            if s.sid is None or streams.get(s.key) is not s:
                continue  # opening it is tried again later
            while s.pushes:
                push = s.pushes.popleft()
                if push.stream_id != s.sid:
                    continue  # of an earlier stream: that one is closed
                if push.ended:
                    self._ended(s, push)
                    break
                taken, moved = take_push(s.queue, push, fetch_pos, consumed, buffers, tags, check)
                got += taken
                if moved and streams.get(s.key) is not s:
                    break  # it moved the position: the stream was closed, the next poll opens another
                s.undecoded += sum(map(len, push.batches))
            if streams.get(s.key) is not s:
                continue
            if s.lost:
                if s.opening is None:  # else its answer (a failure) is settled when it comes
                    self._gone(s, outage=True)
            elif s.undecoded >= self.window_bytes // 2:
                s.link.credit_fetch_stream(s.sid, s.undecoded).add_done_callback(log_grant_failure)
                s.undecoded = 0
        return got

    def _ended(self, s: _Stream, push: Any) -> None:
        """The broker ended ``s``: raise its reason, or (a retriable one: the broker is
        stopping, a partition moved) forget it, to open it again."""
        error = error_for_code(push.ended_code)
        if not error.retriable:
            self._drop(s)
            raise error(f"reading {s.queue!r}: {push.ended}")
        log.info("the fetch stream of %r at broker %d ended (%s); opening it again", s.queue, s.broker_id, push.ended)
        self._gone(s, outage=self._end_is_outage)

    def close(self, queue: str | None = None) -> None:
        """End the streams of ``queue`` (of every queue when None) and drop what they pushed;
        the next poll opens them again from the consumer's positions. (A stream still being
        opened is closed too: requests are written in the order they are sent.)"""
        for s in list(self._streams.values()):
            if queue is None or s.queue == queue:
                self._drop(s, close=True)


class FetchStreams(FetchStreamsBase):
    """The fetch streams of one consumer over one broker, one per queue it reads (see the
    module's docstring)."""

    def open_missing(self, positions: dict[TP, int]) -> None:
        """Start opening a stream for each queue of ``positions`` (``{(queue, partition):
        offset}``) that has none: never opened, lost, or due to be tried again. The service
        sends the request without waiting (``open_fetch_stream``, sync and asyncio alike);
        :meth:`take` settles its answer."""
        now = time.monotonic()
        want: dict[str, dict[int, int]] = {}
        for (queue, partition), offset in positions.items():
            s = self._streams.get(queue)
            if s is None or (s.opening is None and (s.lost or (s.sid is None and s.retry_at <= now))):
                want.setdefault(queue, {})[partition] = offset
        for queue, offsets in want.items():
            self._open(queue, queue, ALONE, self._service, offsets)


def take_push(
    queue: str,
    push: Any,
    fetch_pos: dict,
    consumed: dict,
    buffers: dict,
    tags: frozenset[str] | None,
    check: ReadCheck | None,
) -> tuple[int, bool]:
    """Decode one push of ``queue``'s stream into the consumer's ``buffers`` from its
    position (``polling.take_batches``): the records taken, and whether ``check`` moved the
    position (and may have closed the stream: the caller checks). A push of a partition no
    longer assigned is skipped."""
    tp = (queue, push.partition)
    pos = fetch_pos.get(tp)
    if pos is None:
        return 0, False
    if check is not None and check(tp, push.start_offset, push.end_offset, push.batches):
        return 0, True
    if pos > push.end_offset:
        return 0, False
    start = max(pos, push.start_offset)
    return take_batches(tp, push.batches, start, push.next_offset, fetch_pos, consumed, buffers, tags), False


def log_grant_failure(fut: Any) -> None:
    """Done-callback of a credit grant sent without waiting."""
    if fut.cancelled():
        return
    e = fut.exception()
    if e is not None and not isinstance(e, UnavailableError):  # a lost connection ends the stream anyway
        log.warning("granting a fetch stream more credit failed: %s", e)
