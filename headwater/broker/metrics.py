"""BrokerMetrics: a broker's Prometheus metrics, served by the METRICS request.

Every broker has its own :class:`prometheus_client.CollectorRegistry` (never the global one:
a test or an application may run several brokers in one process). Two kinds of figure live
in it:

- counted as things happen, on the hot path: messages and bytes in and out per queue,
  request latency and errors per operation, storage flush (fsync) time. Each is counted
  once per batch or request, not per message (a produce of 500 messages is one ``inc`` of
  each counter by 500), and the per-queue and per-operation children are cached, so a call
  costs a dict lookup and a locked add, never a label lookup;
- computed when scraped, from the broker's own state (:class:`_ScrapeCollector`): consumer
  lag per group and partition (with :func:`headwater.model.groups.partition_lag`, the rule
  ``headwater group describe`` and ``headwater queue lag`` use), shared groups' leases and
  dead letters, delayed messages, open connections, and on a cluster the partitions this
  broker leads, offline and under-replicated partitions.

prometheus-client is an optional dependency (the ``server`` extra): this module imports it,
and :func:`metrics_unavailable` says why a broker has no metrics. docs/metrics.md lists
every metric.
"""

from __future__ import annotations

import logging
import threading
from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence
from time import perf_counter
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from headwater._version import __version__
from headwater.errors import HeadwaterError
from headwater.model.config import is_internal_queue
from headwater.model.filtering import count_messages
from headwater.model.groups import partition_lag
from headwater.model.service import MetricsExposition
from headwater.protocol import ApiKey

if TYPE_CHECKING:
    from headwater.broker.broker import Broker

__all__ = ["BrokerMetrics", "CONTENT_TYPE", "REQUEST_BUCKETS_S", "FLUSH_BUCKETS_S"]

log = logging.getLogger("headwater.metrics")

#: The exposition's content type: the classic text format every Prometheus reads.
CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
#: Request latency buckets, seconds: a loopback produce answers in ~100 us, a long poll in
#: up to its max_wait_ms (30 s by default).
REQUEST_BUCKETS_S = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
)
#: fsync buckets, seconds: ~50 us on a disk with a write cache, ~10 ms on a spinning one.
FLUSH_BUCKETS_S = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5)

_UNSEEN: Any = object()


class _Histogram:
    """One histogram series the hot path observes into: a bucket search outside the lock,
    one add under it (prometheus-client's takes a lock per bucket, sum and count)."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last: above every bound (+Inf)
        self.sum = 0.0

    def buckets(self) -> list[tuple[str, float]]:
        """Cumulative ``(le, count)`` pairs, +Inf last, as a histogram family takes them."""
        out, total = [], 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts):
            total += n
            out.append((floatToGoString(bound), total))
        return out


class BrokerMetrics:
    """The metrics of one :class:`~headwater.broker.broker.Broker` (thread-safe).

    The broker counts produces and reads into it; its server adds request latency, errors
    and connections (:meth:`watch_connections`); :meth:`exposition` renders everything in
    the Prometheus text format.

    What the request path counts (messages and bytes per queue, latency per operation) is
    kept in plain lists under one lock and exported by :class:`_ScrapeCollector`: a produce
    pays two list adds and a bucket search, about a third of prometheus-client's own
    counters and histogram, which lock every field. The rarer figures (errors, fsyncs) use
    prometheus-client's types."""

    def __init__(self, broker: Broker) -> None:
        self._broker = broker
        self._lock = threading.Lock()
        # [messages, bytes] by queue, made on first use; None for the broker's own queues
        self._in: dict[str, list[int] | None] = {}
        self._out: dict[str, list[int] | None] = {}
        self._latency: dict[int, _Histogram] = {}  # by api key
        self.connections: Callable[[], tuple[int, int]] | None = None
        self.idle_spins: Callable[[], tuple[int, int]] | None = None
        r = self.registry = CollectorRegistry(auto_describe=False)
        self._errors = Counter(
            "headwater_request_errors",
            "Requests answered with an error, per operation and error code (docs/protocol.md).",
            ["api", "code"],
            registry=r,
        )
        self._flush = Histogram(
            "headwater_storage_flush_duration_seconds",
            "Time of one fsync of the commit log (a group commit or the async flusher's tick).",
            buckets=FLUSH_BUCKETS_S,
            registry=r,
        )
        r.register(_ScrapeCollector(self))

    # -- counted as it happens ----------------------------------------------------------------

    def _tally(self, table: dict[str, list[int] | None], queue: str) -> list[int] | None:
        with self._lock:
            return table.setdefault(queue, None if is_internal_queue(queue) else [0, 0])

    def produced(self, queue: str, messages: int, size: int) -> None:
        """A batch of ``messages`` (``size`` bytes) was appended to ``queue``."""
        tally = self._in.get(queue, _UNSEEN)
        if tally is _UNSEEN:
            tally = self._tally(self._in, queue)
        if tally is not None:
            with self._lock:
                tally[0] += messages
                tally[1] += size

    def sent(self, queue: str, messages: int, size: int) -> None:
        """``messages`` of ``queue`` (``size`` bytes of batches) went to a reader."""
        tally = self._out.get(queue, _UNSEEN)
        if tally is _UNSEEN:
            tally = self._tally(self._out, queue)
        if tally is not None and messages:
            with self._lock:
                tally[0] += messages
                tally[1] += size

    def sent_batches(
        self, queue: str, batches: Sequence[bytes], lo: int, hi: int, selections: Sequence[Sequence[int]] = ()
    ) -> None:
        """``batches`` of ``queue`` went to a reader that reads their messages in ``[lo, hi)``
        (a batch may begin before ``lo``; ``selections`` as in a keyed fetch): counted from
        the batches' headers, as a push stream counts its credit."""
        if batches:
            self.sent(queue, *count_messages(batches, selections, lo, hi))

    def queue_deleted(self, queue: str) -> None:
        """``queue`` was deleted here: drop its series, as Kafka drops a deleted topic's, so
        that scrapes stop naming it and a queue made again under its name counts from zero."""
        with self._lock:
            self._in.pop(queue, None)
            self._out.pop(queue, None)

    def request_done(self, api: int, started_s: float) -> None:
        """A request of operation ``api`` read at ``started_s`` (``time.perf_counter``) is answered."""
        took = perf_counter() - started_s
        h = self._latency.get(api)
        if h is None:
            with self._lock:
                h = self._latency.setdefault(api, _Histogram(REQUEST_BUCKETS_S))
        i = bisect_left(h.bounds, took)  # le: the first bound at or above it
        with self._lock:
            h.counts[i] += 1
            h.sum += took

    def request_failed(self, api: int, code: int) -> None:
        """A request of operation ``api`` was answered with error ``code``."""
        self._errors.labels(_api_name(api), str(code)).inc()

    def snapshot(self) -> tuple[dict[str, list[int]], dict[str, list[int]], dict[int, tuple[list[int], float]]]:
        """Copies of what the request path counted: in and out per queue, latency per api."""
        with self._lock:
            return (
                {q: list(t) for q, t in self._in.items() if t is not None},
                {q: list(t) for q, t in self._out.items() if t is not None},
                {api: (list(h.counts), h.sum) for api, h in self._latency.items()},
            )

    def flushed(self, seconds: float) -> None:
        """The store fsynced its log in ``seconds`` (the store's flush listener)."""
        self._flush.observe(seconds)

    def watch_connections(self, counts: Callable[[], tuple[int, int]]) -> None:
        """Report ``counts()`` -> (open now, accepted since start) when scraped (the server)."""
        self.connections = counts

    def watch_idle_spin(self, counts: Callable[[], tuple[int, int]]) -> None:
        """Report ``counts()`` -> (spins, spins that found a request) when scraped (the server)."""
        self.idle_spins = counts

    # -- scraped -------------------------------------------------------------------------------

    def exposition(self) -> MetricsExposition:
        """Every metric, in the Prometheus text format."""
        return MetricsExposition(generate_latest(self.registry).decode(), CONTENT_TYPE)


def _api_name(api: int) -> str:
    try:
        return ApiKey(api).name.lower()
    except ValueError:
        return str(api)


class _ScrapeCollector(Collector):
    """The figures computed from the broker's state at each scrape."""

    def __init__(self, metrics: BrokerMetrics) -> None:
        self._m = metrics

    def collect(self) -> Iterator[Metric]:
        broker = self._m._broker
        info = GaugeMetricFamily("headwater_build_info", "Always 1; the broker's version.", labels=["version"])
        info.add_metric([__version__], 1)
        yield info
        if self._m.connections is not None:
            open_now, accepted = self._m.connections()
            yield GaugeMetricFamily("headwater_connections", "Client connections open now.", value=open_now)
            yield CounterMetricFamily(
                "headwater_connections_accepted", "Client connections accepted since the broker started.", accepted
            )
        if self._m.idle_spins is not None:
            spins, hits = self._m.idle_spins()
            yield CounterMetricFamily(
                "headwater_idle_spins", "Spins of the broker's loop before it waits (idle_spin_us).", spins
            )
            yield CounterMetricFamily("headwater_idle_spin_hits", "Spins that found a request before they ended.", hits)
        yield from _request_path(self._m)
        try:  # described once per scrape: for their lag and for their leases
            shared = list(_shared_infos(broker))
        except Exception:  # a scrape reports what it can
            log.exception("metrics: listing the shared groups failed")
            shared = []
        parts: dict[str, Callable[[], Iterator[Metric]]] = {
            "consumer lag": lambda: _group_lag(broker, shared),
            "shared groups": lambda: _shared_groups(shared),
            "delayed messages": lambda: _delayed(broker),
            "partitions": lambda: _cluster(broker),
        }
        for what, part in parts.items():
            try:
                yield from part()
            except Exception:  # a scrape reports what it can; one broken part must not hide the rest
                log.exception("metrics: %s failed", what)


def _request_path(m: BrokerMetrics) -> Iterator[Metric]:
    """What the request path counted: messages and bytes per queue, latency per operation."""
    into, out, latency = m.snapshot()
    for direction, table, what in (("in", into, "appended (produced)"), ("out", out, "sent to readers")):
        messages = CounterMetricFamily(
            f"headwater_messages_{direction}",
            f"Messages {what} per queue"
            + (
                ": fetched, streamed, pushed to subscribers, leased by shared groups, read by keyed members."
                if direction == "out"
                else "."
            ),
            labels=["queue"],
        )
        size = CounterMetricFamily(
            f"headwater_bytes_{direction}", f"Bytes of record batches {what} per queue.", labels=["queue"]
        )
        for queue, (n, b) in sorted(table.items()):
            messages.add_metric([queue], n)
            size.add_metric([queue], b)
        yield from (messages, size)
    hist = HistogramMetricFamily(
        "headwater_request_duration_seconds",
        "Time from a request read to its answer written, per operation (long polls included).",
        labels=["api"],
    )
    for api, (counts, total) in sorted(latency.items()):
        h = _Histogram(REQUEST_BUCKETS_S)
        h.counts = counts
        hist.add_metric([_api_name(api)], h.buckets(), total)
    yield hist


def _log_ranges(broker: Broker, queue: str) -> dict[int, tuple[int, int]]:
    """Each partition's (start, end) offsets as its leader has them: alone, the store's; on a
    cluster, the ones this broker leads from its store and the others asked of their leaders
    (one DESCRIBE_QUEUE each), so a coordinator reports its groups' lag on every partition.
    When a leader cannot answer, the partitions this broker leads only (logged)."""
    info = broker.store.describe_queue(queue)
    cluster = broker.cluster
    if cluster is None:
        return {p.partition: (p.start_offset, p.end_offset) for p in info.partitions}
    try:
        return cluster.log_ranges(info, ask_leaders=True)
    except HeadwaterError as e:
        log.info("metrics: the lag of %s on its other leaders' partitions is left out this scrape: %s", queue, e)
        return {
            p.partition: (p.start_offset, p.end_offset) for p in info.partitions if cluster.leads(queue, p.partition)
        }


def _group_lag(broker: Broker, shared: list[tuple[str, str, Any]]) -> Iterator[Metric]:
    """Lag of the clustering and keyed groups this broker coordinates (on every partition of
    their queues), and of the shared groups on the partitions it leads."""
    lag = GaugeMetricFamily(
        "headwater_consumer_lag",
        "Messages a consumer group has not consumed: end offset minus committed offset (as headwater group "
        "describe shows it), per group, queue and partition; kind is clustering, shared or keyed (a keyed "
        "group's slowest member).",
        labels=["group", "queue", "partition", "kind"],
    )
    ranges: dict[str, dict[int, tuple[int, int]]] = {}
    for group in sorted(broker.offsets.group_queues()):
        try:
            committed = broker.offsets.fetch_group(group)
        except HeadwaterError:  # stopped coordinating it since: its new coordinator reports it
            continue
        for queue, offsets in committed.items():
            if is_internal_queue(queue):
                continue
            if queue not in ranges:
                ranges[queue] = _log_ranges(broker, queue)
            for partition, (start, end) in sorted(ranges[queue].items()):
                n = partition_lag(offsets.get(partition), start, end)
                if n is not None:
                    lag.add_metric([group, queue, str(partition), "clustering"], n)
    for group, queue, info in shared:
        for sp in info.partitions:
            lag.add_metric([group, queue, str(sp.partition), "shared"], sp.lag)
    for keyed in sorted(broker.keyed.infos(broker.store.list_queues()), key=lambda k: (k.group, k.queue)):
        if keyed.queue not in ranges:
            ranges[keyed.queue] = _log_ranges(broker, keyed.queue)
        for partition, (start, end) in sorted(ranges[keyed.queue].items()):
            lag.add_metric([keyed.group, keyed.queue, str(partition), "keyed"], keyed.behind(partition, start, end))
    yield lag


def _shared_infos(broker: Broker) -> Iterator[tuple[str, str, Any]]:
    for s in broker.shared.summaries(broker.store.list_queues()):
        for queue in s.queues:
            try:
                yield s.group, queue, broker.shared.describe(s.group, queue)
            except HeadwaterError:  # deleted, or moved, since it was listed
                continue


def _shared_groups(shared: list[tuple[str, str, Any]]) -> Iterator[Metric]:
    leased = GaugeMetricFamily(
        "headwater_shared_leased_messages",
        "Messages of a shared group leased now (in flight: delivered, not yet acked), per group and queue.",
        labels=["group", "queue"],
    )
    retry = GaugeMetricFamily(
        "headwater_shared_awaiting_retry_messages",
        "Messages of a shared group nacked or expired, waiting to be delivered again.",
        labels=["group", "queue"],
    )
    dead = CounterMetricFamily(
        "headwater_shared_dead_lettered",
        "Messages of a shared group moved to its dead-letter queue since the group began.",
        labels=["group", "queue"],
    )
    for group, queue, info in shared:
        leased.add_metric([group, queue], info.leased)
        retry.add_metric([group, queue], sum(p.awaiting_retry for p in info.partitions))
        dead.add_metric([group, queue], sum(p.dead_lettered for p in info.partitions))
    yield from (leased, retry, dead)


def _delayed(broker: Broker) -> Iterator[Metric]:
    s = broker.delay.stats()
    yield GaugeMetricFamily(
        "headwater_delayed_pending_messages", "Delayed messages accepted, not yet due.", value=s.pending_messages
    )
    for name, value, doc in (
        ("accepted", s.accepted_total, "Delayed messages accepted."),
        ("delivered", s.delivered_total, "Delayed messages delivered to their partition."),
        ("cancelled", s.cancelled_total, "Delayed messages cancelled before their time."),
        ("dropped", s.dropped_total, "Delayed messages due when their queue no longer existed."),
    ):
        yield CounterMetricFamily(f"headwater_delayed_{name}", doc, value)
    late = GaugeMetricFamily(
        "headwater_delayed_lateness_seconds",
        "Delivery time minus scheduled time over the last deliveries (up to 10,000 batches): stat is p50, p99 "
        "or max; absent before the first delivery.",
        labels=["stat"],
    )
    for stat, ms in (("p50", s.lateness_p50_ms), ("p99", s.lateness_p99_ms), ("max", s.lateness_max_ms)):
        if ms is not None:
            late.add_metric([stat], ms / 1000)
    yield late


def _cluster(broker: Broker) -> Iterator[Metric]:
    """Partitions led, offline (the controller's count) and under-replicated, per queue."""
    md = broker.metadata(None)
    cluster = broker.cluster
    me = getattr(cluster, "broker_id", md.controller) if cluster is not None else md.controller
    live = {b.broker_id for b in md.brokers}
    led = GaugeMetricFamily(
        "headwater_partitions_led", "Partitions this broker leads (takes produces for), per queue.", labels=["queue"]
    )
    offline = GaugeMetricFamily(
        "headwater_partitions_offline",
        "Partitions with no live leader, per queue, as the metadata sees them; reported by the controller only "
        "(0 on the other brokers), so a sum over brokers counts each once.",
        labels=["queue"],
    )
    under = GaugeMetricFamily(
        "headwater_partitions_under_replicated",
        "Partitions this broker leads with a replica not live (always 0 with one replica per partition).",
        labels=["queue"],
    )
    controller = md.controller == me
    for q in md.queues:
        mine = [p for p in q.partitions if p.leader == me]
        led.add_metric([q.name], len(mine))
        down = sum(1 for p in q.partitions if p.leader not in live) if controller else 0
        offline.add_metric([q.name], down)
        under.add_metric([q.name], sum(1 for p in mine if any(r not in live for r in p.replicas)))
    yield from (led, offline, under)
