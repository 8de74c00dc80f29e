"""ClusterFetchStreams: a consumer's fetch streams on a cluster, one per partition leader.

Over one broker a consumer opens a fetch stream per queue (:mod:`.fetch_stream`). On a
cluster it opens one per queue and **leader**: the partitions of a queue it reads are
grouped by the broker that leads each (:func:`~headwater.client.core.subscribers.plan_partitions`,
by the routing table), and each leader pushes the partitions it leads, with its own credit,
over the client's connection to it. A member refuses a partition it does not lead
(NotLeaderError) and ends a stream once one of its partitions moved away
(``headwater.broker.streams``).

**Moves and failures.** A stream refused, ended for a passing reason (NotLeaderError, the
broker stopping) or whose connection was lost is dropped with what it pushed and not yet
decoded; the table is then asked for again (without waiting: the poll keeps its timeout)
and the streams planned again after a backoff, from the consumer's positions. Each
partition is carried by one stream at a time and a push is decoded only from the stream
open now, at the consumer's position, so across a move nothing is skipped and no record
is given twice. A stream whose partitions changed (a partition moved to or from its
leader) is closed and opened again. Failures in a row are given up on as over one broker
(:class:`~headwater.client.transport.polling.Outage`, within ``connect_timeout_s``);
a partition with no leader for now (moving, its broker down) waits for one meanwhile.

The interface is :class:`~headwater.client.transport.fetch_stream.FetchStreams`', so the
consumer drives both alike. Pushes are handled on the client's event loop of each
connection (nobody leads a cluster's connections) and queued here; the consumer's thread
decodes them in ``take``. Only the blocking consumer streams on a cluster for now: the
asyncio one fetches (``AsyncRoutedService`` has no ``fetch_stream_plan``).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, Protocol, runtime_checkable

from headwater.client.transport.fetch_stream import STREAM_WINDOW_BYTES, PastEnd, log_grant_failure, take_push
from headwater.client.transport.polling import Outage
from headwater.errors import HeadwaterError, UnavailableError, error_for_code

__all__ = ["ClusterFetchStreams", "PlansFetchStreams"]

log = logging.getLogger("headwater.client")

_REPLAN_S_MAX = 1.0  # the longest wait before partitions without a stream are planned again


@runtime_checkable
class PlansFetchStreams(Protocol):
    """A cluster's service, on which a consumer opens a fetch stream per partition leader
    (``RoutedService``): the plan by its table, and the connection to one broker."""

    def fetch_stream_plan(
        self, queue: str, partitions: Iterable[int], fresh: bool = False
    ) -> tuple[dict[int, list[int]], list[int]]: ...

    def broker_link(self, broker_id: int) -> Any: ...


class _Leg:
    """The stream of ``partitions`` of ``queue`` at broker ``broker_id``."""

    __slots__ = ("queue", "broker_id", "link", "partitions", "sid", "pushes", "lost", "undecoded", "opening")

    def __init__(self, queue: str, broker_id: int, link: Any, partitions: list[int]) -> None:
        self.queue = queue
        self.broker_id = broker_id
        self.link = link
        self.partitions = partitions
        self.sid = 0
        self.pushes: deque[Any] = deque()  # StreamPush bodies as they came (the loop appends)
        self.lost = False  # its connection went
        self.undecoded = 0  # bytes decoded since the last credit grant
        self.opening: Any = None  # the future of the broker's answer, until take() settles it


class ClusterFetchStreams:
    """The fetch streams of one consumer on a cluster (see the module's docstring). Used from
    the consumer's thread; only the handlers run on the connections' loops."""

    def __init__(
        self,
        service: PlansFetchStreams,
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
        self._outage = outage or Outage(service)
        self._legs: dict[tuple[str, int], _Leg] = {}
        self._fresh = False  # the table is to be asked for again before the next plan
        self._plan_at = 0.0  # time.monotonic() before which no stream is opened (a backoff)
        self._uncovered = False  # the last plan left partitions without a stream

    @property
    def streams(self) -> dict[str, dict[int, list[int]]]:
        """The streams open or opening now: queue -> {broker id: the partitions it carries}."""
        out: dict[str, dict[int, list[int]]] = {}
        for (queue, broker_id), leg in sorted(self._legs.items()):
            out.setdefault(queue, {})[broker_id] = list(leg.partitions)
        return out

    def open_missing(self, positions: dict[tuple[str, int], int]) -> None:
        """Plan the streams of ``positions`` (``{(queue, partition): offset}``) by the table:
        close those whose partitions changed, start opening the missing ones (without
        waiting; :meth:`take` settles the answers). Nothing during a backoff."""
        if time.monotonic() < self._plan_at:
            return
        by_queue: dict[str, list[int]] = {}
        for queue, partition in positions:
            by_queue.setdefault(queue, []).append(partition)
        fresh, self._fresh, self._uncovered = self._fresh, False, False
        for queue, partitions in by_queue.items():
            plan, leaderless = self._service.fetch_stream_plan(queue, partitions, fresh)
            for (q, broker_id), leg in list(self._legs.items()):
                if q == queue and plan.get(broker_id) != leg.partitions:
                    self._drop(leg, close=True)
            for broker_id, parts in plan.items():
                if (queue, broker_id) not in self._legs:
                    self._open(queue, broker_id, {p: positions[(queue, p)] for p in parts})
            if leaderless:
                log.info("%s: no leader of partitions %s now; streaming them once there is one", queue, leaderless)
                self._again()

    def _open(self, queue: str, broker_id: int, offsets: dict[int, int]) -> None:
        try:
            link = self._service.broker_link(broker_id)
        except UnavailableError as e:
            self._failed(e)
            return
        leg = _Leg(queue, broker_id, link, sorted(offsets))
        self._legs[(queue, broker_id)] = leg
        leg.sid, leg.opening = link.open_fetch_stream(
            queue,
            offsets,
            self._handler(leg),
            credit_bytes=self.window_bytes,
            tag_mask=self._tag_mask,
            push_bytes_max=self._push_bytes_max,
            on_loop=True,
        )

    def _handler(self, leg: _Leg) -> Callable[[Any], None]:
        def handle(push: Any) -> None:  # the connection's loop: a push, or None when it is lost
            if push is None:
                leg.lost = True
            else:
                leg.pushes.append(push)
            self._notify()

        return handle

    def _again(self) -> None:
        """Plan again soon, with the table asked for again first."""
        self._fresh = self._uncovered = True
        self._plan_at = max(self._plan_at, time.monotonic() + min(self._outage.backoff_s(), _REPLAN_S_MAX))

    def _failed(self, error: HeadwaterError) -> None:
        """A stream could not be opened or ended for ``error``: plan again after a backoff
        while that rides out an outage (raise it once it does not)."""
        if not self._outage.rides_out(error):
            raise error
        self._again()

    def _drop(self, leg: _Leg, *, close: bool) -> None:
        """Forget ``leg`` and what it pushed (``close``: tell its broker)."""
        if self._legs.get((leg.queue, leg.broker_id)) is leg:
            del self._legs[(leg.queue, leg.broker_id)]
        if close and not leg.lost:
            leg.link.close_fetch_stream(leg.sid)

    def openings(self) -> list[Any]:
        """The futures of the answers still awaited (to wait on with the pushes)."""
        return [g.opening for g in self._legs.values() if g.opening is not None and not g.opening.done()]

    def wait_s(self, remaining: float) -> float:
        """How long the consumer may wait for a push: ``remaining``, or less when streams
        are to be planned again sooner."""
        if self._uncovered:
            return max(0.0, min(remaining, self._plan_at - time.monotonic()))
        return remaining

    def pending(self) -> bool:
        """Whether something waits to be taken: a push, a lost connection, an answer."""
        return any(g.opening.done() if g.opening is not None else bool(g.pushes or g.lost) for g in self._legs.values())

    def _settle(self, leg: _Leg) -> None:
        fut, leg.opening = leg.opening, None
        error = fut.exception() if not fut.cancelled() else UnavailableError("opening the stream was cancelled")
        if error is None:
            self._outage.over()
            return
        self._drop(leg, close=False)
        log.info("no fetch stream of %s%s at broker %d yet (%s)", leg.queue, leg.partitions, leg.broker_id, error)
        self._failed(error)

    def take(
        self,
        fetch_pos: dict[tuple[str, int], int],
        consumed: dict[tuple[str, int], int],
        buffers: dict[Any, Any],
        tags: frozenset[str] | None,
        past_end: PastEnd | None = None,
    ) -> int:
        """As :meth:`FetchStreams.take <headwater.client.transport.fetch_stream.FetchStreams.take>`,
        over every leader's stream: the records taken."""
        got = 0
        for leg in list(self._legs.values()):
            if leg.opening is not None:
                if not leg.opening.done():
                    continue  # pushes follow the answer; a refusal drops them
                self._settle(leg)
                if self._legs.get((leg.queue, leg.broker_id)) is not leg:
                    continue
            got += self._decode(leg, fetch_pos, consumed, buffers, tags, past_end)
            if self._legs.get((leg.queue, leg.broker_id)) is not leg:
                continue
            if leg.lost:
                self._drop(leg, close=False)
                self._outage.began()
                self._again()
            elif leg.undecoded >= self.window_bytes // 2:
                leg.link.credit_fetch_stream(leg.sid, leg.undecoded).add_done_callback(log_grant_failure)
                leg.undecoded = 0
        return got

    def _decode(
        self,
        leg: _Leg,
        fetch_pos: dict[tuple[str, int], int],
        consumed: dict[tuple[str, int], int],
        buffers: dict[Any, Any],
        tags: frozenset[str] | None,
        past_end: PastEnd | None,
    ) -> int:
        """Decode ``leg``'s pushes into the consumer's buffers, until it ends or is dropped."""
        got = 0
        while leg.pushes:
            push = leg.pushes.popleft()
            if push.stream_id != leg.sid:
                continue  # of an earlier stream on that connection: that one is closed
            if push.ended:
                error = error_for_code(push.ended_code)
                self._drop(leg, close=False)
                if not error.retriable:
                    raise error(f"reading {leg.queue!r}: {push.ended}")
                log.info("the fetch stream of %s at broker %d ended (%s)", leg.queue, leg.broker_id, push.ended)
                self._again()  # a partition moved away: the table names its new leader
                return got
            taken, moved = take_push(leg.queue, push, fetch_pos, consumed, buffers, tags, past_end)
            got += taken
            if moved and self._legs.get((leg.queue, leg.broker_id)) is not leg:
                return got  # it moved the position: the queue's streams were closed
            leg.undecoded += sum(map(len, push.batches))
        return got

    def close(self, queue: str | None = None) -> None:
        """End the streams of ``queue`` (of every queue when None) and drop what they pushed;
        the next poll opens them again from the consumer's positions."""
        for leg in list(self._legs.values()):
            if queue is None or leg.queue == queue:
                self._drop(leg, close=True)
