"""RoutedService: the BrokerService of a cluster, for synchronous code (docs/cluster.md,
"Clients"; docs/design/cluster.md, step 5).

One :class:`~headwater.client.transport.remote.RemoteService` per broker, opened when first
needed at the address METADATA gives. Where each request goes, when the table is asked for
again and what is sent again is written once, for this service and its asyncio twin, in
:mod:`headwater.client.core.routed_plans` (plans that do no I/O; the table, its refresh's
rate limit and the merges are :mod:`headwater.client.core.routing`'s). This class runs
them (:meth:`RoutedService._run`: each effect a blocking call) and keeps what is its own:
the connections, a refresh nobody waits for, and the calls that do not wait.

- A partition's call goes to its leader directly when the table is fresh and the leader's
  connection open (``produce``, ``fetch``: no plan in between); after an error, or
  otherwise, its plan decides. ``produce_async``, ``fetch_async`` and
  ``keyed_fetch_async`` do not wait: a refusal marks the table stale, starts a refresh
  without waiting, and is their answer; the producer's retries (and the consumer's next
  read) go by the new table.
- Shared groups' receives go to every leader of the queue at once
  (:mod:`headwater.client.transport.shared_routing`).

Thread-safe. Its threads are its connections' (one ``headwater-client`` thread each).
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any, TypeVar

from headwater.client.core.effects import HOME, Call, Fanout, Plan, Refresh, RoutedState, drive
from headwater.client.core.routed_plans import give_back, install, refresh, routed
from headwater.client.core.routing import RoutingTable, merge_describe
from headwater.client.core.subscribers import StreamPlan, plan_partitions
from headwater.client.transport.remote import RemoteService, answer_timeout_s, check_arguments, takes_request
from headwater.client.transport.send_future import LazyFuture
from headwater.client.transport.shared_routing import SharedRouter
from headwater.errors import HeadwaterError, OutcomeUnknownError, UnavailableError
from headwater.model.cluster import ClusterMetadata
from headwater.model.config import QueueInfo
from headwater.model.keyed import KeyedFetchResult
from headwater.model.service import BrokerService, FetchResult, ProduceResult
from headwater.model.shared import SharedDeliveries
from headwater.protocol import messages as m

__all__ = ["Links", "RoutedService"]

log = logging.getLogger(__name__)
T = TypeVar("T")


class Links:
    """What a routed service knows of its cluster's connections, for the consumers' rule on
    riding out an outage (``headwater.client.transport.polling.Outage``): it has the members
    of ``Reconnects``. ``service``: a routed service, blocking or asyncio (its ``links()``)."""

    def __init__(self, service: Any) -> None:
        self._service = service
        self.address = ",".join(service.bootstrap)
        self.connect_timeout_s = service.connect_timeout_s

    @property
    def connect_failure(self) -> BaseException | None:
        return next(
            (link.transport.connect_failure for link in self._service.links() if link.transport.connect_failure), None
        )

    def gave_up_connecting_since(self, t: float) -> bool:
        return any(link.transport.gave_up_connecting_since(t) for link in self._service.links())


class RoutedService(RoutedState, BrokerService):
    """A BrokerService over the brokers of a cluster (see the module's docstring).
    ``home``: the bootstrap broker's connection, which answered ``metadata``. Every
    operation not defined below runs its plan (:func:`~headwater.client.core.routed_plans.
    install`)."""

    def __init__(self, home: RemoteService, metadata: ClusterMetadata, **settings: Any) -> None:
        """``settings``: ``bootstrap`` (the address list), ``connect_timeout_s``,
        ``request_timeout_s``, ``retries``, as :class:`RoutedState` takes them."""
        super().__init__(home, metadata, **settings)
        self._lock = threading.Lock()
        self._refresh_lock = threading.Lock()  # one blocking refresh at a time; the others use its answer
        self._asking: concurrent.futures.Future[Any] | None = None  # a refresh that does not wait
        self.transport = Links(self)
        self._shared = SharedRouter(self)

    # -- running plans ---------------------------------------------------------------------

    def _run(self, plan: Plan[T]) -> T:
        """Run ``plan`` to its end, each effect a blocking call (:meth:`_perform`)."""
        return drive(plan, self._perform)

    def _perform(self, effect: Any) -> Any:
        kind = type(effect)
        if kind is Call:
            link = self._home if effect.at == HOME else self._link(effect.at)
            return getattr(link, effect.method)(*effect.args, **effect.kwargs)
        if kind is Fanout:
            return self._fanout(effect.asks)
        if kind is Refresh:
            return self.refresh(effect.deadline)
        time.sleep(effect.seconds)
        return None

    def _submit(self, address: str, body: m.RequestBody) -> concurrent.futures.Future[Any]:
        """``body`` to the broker at ``address`` without waiting (its connection's thread
        reads the answer); a broker out of reach: a future holding its error."""
        fut: concurrent.futures.Future[Any] = LazyFuture()
        try:
            link = self._link(address)
            link.transport.submit(body, fut, answer_timeout_s(link.transport, body))
        except UnavailableError as e:
            fut.set_exception(e)
        return fut

    def _fanout(self, asks: Mapping[Hashable, tuple[str, m.RequestBody]]) -> dict[Hashable, Any]:
        for _, body in asks.values():
            check_arguments(body)
        sent = {key: (self._submit(address, body), body) for key, (address, body) in asks.items()}
        out: dict[Hashable, Any] = {}
        for key, (fut, body) in sent.items():
            try:
                out[key] = fut.result(timeout=self.request_timeout_s + m.API_SPECS[body.api].wait_s(body) + 1)
            except concurrent.futures.TimeoutError:
                out[key] = UnavailableError(f"broker {key} got no answer in {self.request_timeout_s} s")
            except Exception as e:  # noqa: BLE001 - an answer of the fan-out: the plan decides
                out[key] = e
        return out

    # -- connections and the table ---------------------------------------------------------

    def links(self) -> list[RemoteService]:
        with self._lock:
            return list(self._links.values())

    def _link(self, address: str) -> RemoteService:
        """The connection to the broker at ``address``, opened if none is."""
        with self._lock:
            link = self._link_now(address)
        if link is not None:
            return link
        try:
            link = RemoteService(
                address,
                connect_timeout_s=self.connect_timeout_s,
                request_timeout_s=self.request_timeout_s,
                retries=self._retries,
            )
        except UnavailableError as e:
            with self._lock:
                self._opened(address, None, e)
        with self._lock:
            kept = self._opened(address, link)
            closed = self._closed
        if kept is not link or closed:
            link.close()  # another thread opened one first, or the client closed meanwhile
        self._check_open()
        return kept

    def _install(self, md: ClusterMetadata, asked_at: float) -> None:
        with self._lock:
            super()._install(md, asked_at)

    def _live_first(self) -> list[RemoteService]:
        """The open connections, those whose broker was last seen out of reach at the end."""
        return sorted(self.links(), key=lambda link: link.transport.connect_failure is not None)

    def _sources(self) -> list[str]:
        return [link.address for link in self._live_first()]

    def refresh(self, deadline: float | None = None) -> RoutingTable:
        """Ask METADATA again now (waiting out the rate limit, within ``deadline``), of any
        live broker: the open connections first, then the bootstrap list."""
        with self._refresh_lock:
            return self._run(refresh(self, deadline))

    def _refresh_soon(self) -> None:
        """Start a refresh that nobody waits for, if one is due and none is on its way."""
        now = time.monotonic()
        source = self._live_first()[0]
        with self._lock:
            if self._asking is not None or not self._gate.due(now) or self._closed:
                return
            fut: concurrent.futures.Future[Any] = LazyFuture()
            self._asking = fut

        def done(f: concurrent.futures.Future[Any]) -> None:
            with self._lock:
                self._asking = None
            try:
                self._install(f.result(), now)
            except Exception as e:  # noqa: BLE001 - a blocking call will ask again, and raise
                log.debug("refreshing the cluster's metadata from %s failed: %s", source.address, e)

        fut.add_done_callback(done)
        source.transport.submit(m.MetadataRequest(None), fut)

    def _watch(self, fut: concurrent.futures.Future[Any]) -> None:
        """A done-callback of a request sent without waiting: a refusal or a lost broker
        makes the table stale, and a refresh starts."""
        error = fut.exception()
        if isinstance(error, UnavailableError) and not isinstance(error, OutcomeUnknownError):
            self._unreachable(error)
            self._refresh_soon()

    # -- partition-scoped calls: the first try direct, the plan after ---------------------------

    def _routed(self, api: m.ApiKey, queue: str, partition: int, call: Call, wait_s: float = 0.0) -> Any:
        found = self._leader_now(queue, partition)
        if found is None:
            return self._run(routed(self, api, queue, partition, call, wait_s))
        address, link = found
        try:
            return getattr(link, call.method)(*call.args, **call.kwargs)
        except HeadwaterError as e:
            return self._run(routed(self, api, queue, partition, call, wait_s, (address, e)))

    def leader_link_nowait(self, queue: str, partition: int) -> RemoteService:
        """The connection of ``queue[partition]``'s leader by the table as it is (a stale
        table starts a refresh nobody waits for), for a call that does not wait; a leader
        the table does not name, or out of reach, raises UnavailableError and starts one."""
        if self._gate.stale:
            self._refresh_soon()
        try:
            return self._link(self._table.leader(queue, partition).address)
        except UnavailableError:
            self._gate.mark_stale()
            self._refresh_soon()
            raise

    def produce(self, queue: str, partition: int, batch: bytes) -> ProduceResult:
        return self._routed(m.ApiKey.PRODUCE, queue, partition, Call(HOME, "produce", (queue, partition, batch)))

    @takes_request("keyed_fetch")
    def keyed_fetch(self, request: m.KeyedFetchRequest) -> KeyedFetchResult:
        call = Call(HOME, "_call", (request,))
        return self._routed(m.ApiKey.KEYED_FETCH, request.queue, request.partition, call, request.max_wait_ms / 1000)

    def produce_async(self, queue: str, partition: int, batch: bytes) -> concurrent.futures.Future[ProduceResult]:
        """Send a batch to its partition's leader without waiting (the producer keeps
        several in flight, and sends again after a refusal, by the table then)."""
        fut = self.leader_link_nowait(queue, partition).produce_async(queue, partition, batch)
        fut.add_done_callback(self._watch)
        return fut

    @takes_request("fetch")
    def fetch(self, request: m.FetchRequest) -> FetchResult:
        call = Call(HOME, "_call", (request,))
        return self._routed(m.ApiKey.FETCH, request.queue, request.partition, call, request.max_wait_ms / 1000)

    def _nowait(self, request: m.FetchRequest | m.KeyedFetchRequest) -> concurrent.futures.Future[Any]:
        """A long poll at the partition's leader without waiting (never ``lead``: its
        answer may come on any of several connections, so the connection's thread reads
        it); a refusal marks the table stale and is the answer."""
        try:
            link = self.leader_link_nowait(request.queue, request.partition)
        except UnavailableError as e:
            failed: concurrent.futures.Future[Any] = LazyFuture()
            failed.set_exception(e)  # a read's error, ridden out as a lost connection's
            return failed
        fut = link._submit(request, link.transport.request_timeout_s + request.max_wait_ms / 1000)
        fut.add_done_callback(self._watch)
        return fut

    @takes_request("fetch", lead=False)
    def fetch_async(self, request: m.FetchRequest, lead: bool) -> concurrent.futures.Future[FetchResult]:
        """Fetch from the partition's leader without waiting (see :meth:`_nowait`)."""
        return self._nowait(request)

    @takes_request("keyed_fetch", lead=False)
    def keyed_fetch_async(
        self, request: m.KeyedFetchRequest, lead: bool
    ) -> concurrent.futures.Future[KeyedFetchResult]:
        """A keyed fetch from the partition's leader without waiting (see :meth:`_nowait`)."""
        return self._nowait(request)

    # -- queue-wide calls that do not wait; push streams -------------------------------------

    def describe_queue_async(self, name: str) -> concurrent.futures.Future[QueueInfo]:
        """``describe_queue`` without waiting (the producer refreshes its copy of a
        queue's partition count with it). A queue the table does not know yet: the
        bootstrap broker's answer, the table refreshed meanwhile."""
        leaders = self._table.leaders_of(name)
        if not leaders:
            self._gate.mark_stale()
            self._refresh_soon()
            return self._home.describe_queue_async(name)
        body = m.DescribeQueueRequest(name)
        asked = {b: self._submit(self._table.brokers[b].address, body) for b in sorted(leaders)}
        partition_leaders = self._table.partition_leaders(name)
        out: concurrent.futures.Future[QueueInfo] = LazyFuture()
        left = [len(asked)]
        lock = threading.Lock()

        def answered(_: concurrent.futures.Future[Any]) -> None:
            with lock:
                left[0] -= 1
                if left[0]:
                    return
            answers = {b: fut.result() for b, fut in asked.items() if fut.exception() is None}
            errors = [fut.exception() for fut in asked.values() if fut.exception() is not None]
            # a broker's refusal (the queue is gone) before one out of reach; one out of reach only if none answered
            refusals = [e for e in errors if not isinstance(e, UnavailableError)]
            if refusals or not answers:
                out.set_exception((refusals or errors)[0])
            else:
                out.set_result(merge_describe(answers[min(answers)], answers, partition_leaders))

        for fut in asked.values():
            fut.add_done_callback(answered)
        return out

    def fetch_stream_plan(self, queue: str, partitions: Iterable[int], fresh: bool = False) -> StreamPlan:
        """Which broker is to stream which of ``partitions`` of ``queue`` (each by its
        leader), and those no live broker leads now, by the table as it is: without waiting
        (a consumer's poll keeps its timeout), a refresh nobody waits for is started when
        ``fresh`` (a stream was refused or lost), when the table is stale, or when it does
        not know ``queue``; the consumer plans again after it."""
        if fresh or self._gate.stale or not self._table.knows(queue):
            self._gate.mark_stale()
            self._refresh_soon()
        return plan_partitions(self._table, queue, partitions)

    def broker_link(self, broker_id: int) -> RemoteService:
        """The connection to broker ``broker_id`` of the table (opened if none is), for a
        push stream of the partitions it leads; UnavailableError if it is out of reach."""
        return self._link(self._broker_address(broker_id))

    stream_link = broker_link  # a fetch stream's (PlansFetchStreams): the blocking consumer may wait for it

    def ping(self) -> None:
        self._home.ping()

    # -- shared groups: receives at every leader at once (SharedRouter) ---------------------

    @takes_request("shared_receive")
    def start_shared_receive(self, request: m.SharedReceiveRequest) -> concurrent.futures.Future[Any]:
        """A shared receive sent to every leader of the queue, without waiting (see
        ``StartsSharedReceive``); :meth:`withdraw` takes it back while unanswered."""
        return self._shared.start_receive(request)

    def withdraw(self, fut: concurrent.futures.Future[Any]) -> bool:
        return self._shared.withdraw(fut)

    def lead(
        self, futures: list[Any], timeout_s: float | None, *, interrupt: concurrent.futures.Future[Any] | None = None
    ) -> concurrent.futures.Future[Any] | None:
        """Nobody leads here: each connection's thread reads its answers (the caller waits)."""
        return None

    @takes_request("shared_receive")
    def shared_receive(self, request: m.SharedReceiveRequest) -> SharedDeliveries:
        return self._shared.receive(request)

    def close(self) -> None:
        """Give back the shared deliveries kept for receives that will not come, then
        close every connection (the bootstrap broker's too)."""
        if not self._closed:
            self._run(give_back(self, self._shared.drain()))
        with self._lock:
            if self._closed:
                return
            self._closed = True
            links = list(self._links.values())
        for link in links:
            link.close()


def _blocking(plan: Callable[..., Plan[Any]]) -> Callable[..., Any]:
    def method(self: RoutedService, *args: Any, **kwargs: Any) -> Any:
        return self._run(plan(self, *args, **kwargs))

    return method


install(RoutedService, _blocking)
