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

Both this class and :class:`~headwater.client.transport.fetch_stream.FetchStreams` are a
:class:`~headwater.client.transport.fetch_stream.FetchStreamsBase`, which keeps each stream's
life, so the consumer drives both alike; this one plans by leader and replans on a refusal.
Pushes are handled on the client's event loop of each connection (nobody leads a cluster's
connections) and queued here; the consumer's thread (or task) decodes them in ``take``. The
blocking and the asyncio consumer stream alike: a stream's connection is the service's
``stream_link``, which the asyncio service never waits for (a broker not connected yet is
connected to in the background, and its streams planned again after a backoff).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any, Protocol, runtime_checkable

from headwater.client.transport.fetch_stream import FetchStreamsBase, _Stream
from headwater.errors import HeadwaterError, UnavailableError

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

    def stream_link(self, broker_id: int) -> Any:
        """The connection to broker ``broker_id``, to open a fetch stream on (without
        waiting, for the asyncio service: UnavailableError while it connects)."""
        ...


class ClusterFetchStreams(FetchStreamsBase):
    """The fetch streams of one consumer on a cluster, one per queue and leader (see the
    module's docstring). Used from the consumer's thread; only the handlers run on the
    connections' loops."""

    _on_loop = True  # nobody leads a cluster's connections
    _end_is_outage = False  # a stream ended for a retriable reason: a partition moved, say
    _service: PlansFetchStreams
    _fresh = False  # the table is to be asked for again before the next plan
    _plan_at = 0.0  # time.monotonic() before which no stream is opened (a backoff)
    _uncovered = False  # the last plan left partitions without a stream

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
            for s in list(self._streams.values()):
                if s.queue == queue and plan.get(s.broker_id) != s.partitions:
                    self._drop(s, close=True)
            for broker_id, parts in plan.items():
                if (queue, broker_id) in self._streams:
                    continue
                try:
                    link = self._service.stream_link(broker_id)
                except UnavailableError as e:
                    if not self._outage.rides_out(e):
                        raise
                    self._again()
                    continue
                self._open((queue, broker_id), queue, broker_id, link, {p: positions[(queue, p)] for p in parts})
            if leaderless:
                log.info("%s: no leader of partitions %s now; streaming them once there is one", queue, leaderless)
                self._again()

    def _again(self) -> None:
        """Plan again soon, with the table asked for again first."""
        self._fresh = self._uncovered = True
        self._plan_at = max(self._plan_at, time.monotonic() + min(self._outage.backoff_s(), _REPLAN_S_MAX))

    def _settle(self, s: _Stream) -> None:
        """As over one broker; an opening given up on (its broker stayed out of reach) also
        has the table asked for again before the next plan: the broker may be gone for good,
        its partitions then waiting for a leader rather than failing each poll."""
        try:
            super()._settle(s)
        except UnavailableError:
            self._again()
            raise

    def _refused(self, s: _Stream, error: HeadwaterError) -> None:
        """Not opened (NotLeaderError, the broker away): plan again after a backoff."""
        self._drop(s)
        log.info("no fetch stream of %s%s at broker %d yet (%s)", s.queue, s.partitions, s.broker_id, error)
        self._again()

    def _gone(self, s: _Stream, *, outage: bool) -> None:
        super()._gone(s, outage=outage)
        self._again()  # a partition moved away, say: the table names its new leader

    def wait_s(self, remaining: float) -> float:
        """How long the consumer may wait for a push: ``remaining``, or less when streams
        are to be planned again sooner."""
        if self._uncovered:
            return max(0.0, min(remaining, self._plan_at - time.monotonic()))
        return remaining
