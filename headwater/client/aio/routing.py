"""AsyncRoutedService: the asyncio service of a cluster, the twin of
:class:`~headwater.client.transport.routing.RoutedService` (read its module for the rules:
where each request goes, when the table is asked for again, what is sent again).

One :class:`~headwater.client.aio.service.AsyncService` per broker, opened when first needed.
The routed operations are :mod:`headwater.client.core.routed_plans`' plans, the same as the
blocking service's; this class runs them (:meth:`AsyncRoutedService._run`: each effect
awaited) and keeps its connections and the calls that do not wait. Used from one event loop.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any, TypeVar

from headwater.client.aio.service import AsyncBrokerService, AsyncService
from headwater.client.aio.shared_routing import AsyncSharedRouter
from headwater.client.core.effects import HOME, Call, Fanout, Open, Plan, Refresh, RoutedState, Sleep, adrive
from headwater.client.core.routed_plans import first_that_answers, give_back, install, refresh, routed
from headwater.client.core.routing import RoutingTable, parse_bootstrap
from headwater.client.core.subscribers import StreamPlan, plan_partitions
from headwater.client.transport.async_transport import AsyncTransport
from headwater.client.transport.link import Sink, parse_address, settle_from
from headwater.client.transport.remote import takes_request
from headwater.client.transport.routing import Links
from headwater.errors import HeadwaterError, UnavailableError
from headwater.model.cluster import ClusterMetadata
from headwater.model.keyed import KeyedFetchResult
from headwater.model.service import FetchResult, ProduceResult
from headwater.model.shared import SharedDeliveries
from headwater.protocol import messages as m

__all__ = ["AsyncRoutedService", "open_async_service"]

log = logging.getLogger(__name__)
T = TypeVar("T")


def _quietly(fut: asyncio.Future[Any]) -> None:
    """A done-callback that takes a background future's error (kept elsewhere), so that
    asyncio does not log it as never retrieved."""
    if not fut.cancelled():
        fut.exception()


class AsyncRoutedService(RoutedState, AsyncBrokerService):
    """An AsyncBrokerService over the brokers of a cluster; ``home``: the bootstrap
    broker's service, which answered ``metadata``. Every operation not defined below runs
    its plan (:func:`~headwater.client.core.routed_plans.install`)."""

    def __init__(self, home: AsyncService, metadata: ClusterMetadata, **settings: Any) -> None:
        """``settings``: as :class:`~headwater.client.transport.routing.RoutedService`'s."""
        super().__init__(home, metadata, **settings)
        self._opening: dict[str, asyncio.Future[AsyncService]] = {}
        self._refreshing: asyncio.Lock | None = None  # made on the loop, when first needed
        self._shared = AsyncSharedRouter(self)
        self._asking: asyncio.Future[None] | None = None  # a refresh nobody waits for
        self.transport = Links(self)  # for the consumers' rule on riding out an outage

    # -- running plans ---------------------------------------------------------------------

    async def _run(self, plan: Plan[T]) -> T:
        """Run ``plan`` to its end, each effect awaited (:meth:`_perform`)."""
        return await adrive(plan, self._perform)

    async def _perform(self, effect: Any) -> Any:
        kind = type(effect)
        if kind is Call:
            link = self._home if effect.at == HOME else await self._link(effect.at)
            return await getattr(link, effect.method)(*effect.args, **effect.kwargs)
        if kind is Fanout:
            return await self._fanout(effect.asks)
        if kind is Refresh:
            return await self.refresh(effect.deadline)
        await asyncio.sleep(effect.seconds)
        return None

    async def _fanout(self, asks: Mapping[Hashable, tuple[str, m.RequestBody]]) -> dict[Hashable, Any]:
        async def one(address: str, body: m.RequestBody) -> Any:
            return await (await self._link(address))._call(body)

        got = await asyncio.gather(*(one(a, body) for a, body in asks.values()), return_exceptions=True)
        return dict(zip(asks, got, strict=True))

    # -- connections and the table ---------------------------------------------------------

    async def _link(self, address: str) -> AsyncService:
        link = self._link_now(address)
        if link is not None:
            return link
        opening = self._opening.get(address)
        if opening is None:
            opening = asyncio.ensure_future(self._open(address))
            self._opening[address] = opening
        return await asyncio.shield(opening)

    async def _open(self, address: str) -> AsyncService:
        transport = AsyncTransport(
            address, connect_timeout_s=self.connect_timeout_s, request_timeout_s=self.request_timeout_s
        )
        link = AsyncService(transport, retries=self._retries)
        try:
            await link.ping()
        except UnavailableError as e:
            await link.close()
            self._opened(address, None, e)
        finally:
            self._opening.pop(address, None)
        if self._closed:
            await link.close()
            self._check_open()
        return self._opened(address, link)

    def links(self) -> list[AsyncService]:
        """The open connections (the bootstrap broker's first)."""
        return list(self._links.values())

    def _sources(self) -> list[str]:
        links = sorted(self._links.values(), key=lambda s: s.transport.connect_failure is not None)
        return [link.address for link in links]

    async def refresh(self, deadline: float | None = None) -> RoutingTable:
        """Ask METADATA again (waiting out the rate limit, within ``deadline``) of any live
        broker: the open connections first, then the bootstrap list."""
        if self._refreshing is None:
            self._refreshing = asyncio.Lock()
        async with self._refreshing:
            return await self._run(refresh(self, deadline))

    # -- partition-scoped calls: the first try direct, the plan after ---------------------------

    async def _routed(self, api: m.ApiKey, queue: str, partition: int, call: Call, wait_s: float = 0.0) -> Any:
        found = self._leader_now(queue, partition)
        if found is None:
            return await self._run(routed(self, api, queue, partition, call, wait_s))
        address, link = found
        try:
            return await getattr(link, call.method)(*call.args, **call.kwargs)
        except HeadwaterError as e:
            return await self._run(routed(self, api, queue, partition, call, wait_s, (address, e)))

    async def produce(self, queue: str, partition: int, batch: bytes) -> ProduceResult:
        return await self._routed(m.ApiKey.PRODUCE, queue, partition, Call(HOME, "produce", (queue, partition, batch)))

    def produce_into(self, queue: str, partition: int, batch: bytes, sink: Sink) -> None:
        """Send a batch to its partition's leader now (after everything submitted to that
        broker before it), without waiting, its outcome to ``sink`` (``ProducesInto``: the
        asyncio producer pipelines with it). A failure there marks the leader unreachable
        first, as a routed call's does. When the leader's connection is not open yet, or the
        table is stale, a task routes it."""
        found = self._leader_now(queue, partition)
        if found is None:
            task = asyncio.ensure_future(self.produce(queue, partition, batch))
            task.add_done_callback(functools.partial(settle_from, sink))
            return
        found[1].produce_into(queue, partition, batch, _Watched(sink, self._unreachable))

    @takes_request("fetch")
    async def fetch(self, request: m.FetchRequest) -> FetchResult:
        call = Call(HOME, "_call", (request,))
        return await self._routed(m.ApiKey.FETCH, request.queue, request.partition, call, request.max_wait_ms / 1000)

    @takes_request("keyed_fetch")
    async def keyed_fetch(self, request: m.KeyedFetchRequest) -> KeyedFetchResult:
        call = Call(HOME, "_call", (request,))
        return await self._routed(
            m.ApiKey.KEYED_FETCH, request.queue, request.partition, call, request.max_wait_ms / 1000
        )

    async def broker_link(self, broker_id: int) -> AsyncService:
        """The connection to broker ``broker_id`` of the table (opened if none is)."""
        return await self._link(self._broker_address(broker_id))

    # -- a consumer's fetch streams, one per leader (ClusterFetchStreams): nothing waits -------

    def fetch_stream_plan(self, queue: str, partitions: Iterable[int], fresh: bool = False) -> StreamPlan:
        """Which broker is to stream which of ``partitions`` of ``queue``, and those no live
        broker leads now, by the table as it is (``RoutedService.fetch_stream_plan``'s rule:
        a refresh nobody waits for starts when ``fresh``, stale or ``queue`` unknown)."""
        if fresh or self._gate.stale or not self._table.knows(queue):
            self._gate.mark_stale()
            self._refresh_soon()
        return plan_partitions(self._table, queue, partitions)

    def stream_link(self, broker_id: int) -> AsyncService:
        """The open connection to broker ``broker_id``, for a fetch stream; when none is open
        yet, one is opened in the background and UnavailableError raised meanwhile (the
        consumer plans its streams again after a backoff, within ``connect_timeout_s``)."""
        address = self._broker_address(broker_id)
        link = self._link_now(address)  # raises a recent failure to connect
        if link is not None:
            return link
        if address not in self._opening:
            opening = self._opening[address] = asyncio.ensure_future(self._open(address))
            opening.add_done_callback(_quietly)  # its failure is kept (_down) for the next plan
        raise UnavailableError(f"connecting to broker {broker_id} at {address}")

    def _refresh_soon(self) -> None:
        """Start a refresh nobody waits for, unless one is on its way or it is not due."""
        if self._closed or (self._asking is not None and not self._asking.done()):
            return
        if not self._gate.due(self._clock()):
            return

        async def ask() -> None:
            try:
                await self.refresh()
            except Exception as e:  # noqa: BLE001 - a call that waits asks again, and raises
                log.debug("refreshing the cluster's metadata failed: %s", e)

        self._asking = asyncio.ensure_future(ask())

    async def ping(self) -> None:
        await self._home.ping()

    # -- shared groups: receives at every leader at once (AsyncSharedRouter) ----------------

    @takes_request("shared_receive")
    def start_shared_receive(self, request: m.SharedReceiveRequest) -> asyncio.Future[Any]:
        """A shared receive sent to every leader of the queue, without waiting (see
        ``AsyncStartsSharedReceive``); :meth:`withdraw` takes it back while unanswered."""
        return self._shared.start_receive(request)

    def withdraw(self, fut: asyncio.Future[Any]) -> bool:
        return self._shared.withdraw(fut)

    @takes_request("shared_receive")
    async def shared_receive(self, request: m.SharedReceiveRequest) -> SharedDeliveries:
        return await self._shared.receive(request)

    async def close(self) -> None:
        """Give back the shared deliveries kept for receives that will not come, then
        close every connection (the bootstrap broker's too)."""
        if self._closed:
            return
        await self._run(give_back(self, self._shared.drain()))
        self._closed = True
        for opening in list(self._opening.values()):
            opening.cancel()
        for link in list(self._links.values()):
            await link.close()


def _coroutine(plan: Callable[..., Plan[Any]]) -> Callable[..., Any]:
    async def method(self: AsyncRoutedService, *args: Any, **kwargs: Any) -> Any:
        return await self._run(plan(self, *args, **kwargs))

    return method


install(AsyncRoutedService, _coroutine)


async def open_async_service(
    addresses: str | list[str], *, connect_timeout_s: float = 10.0, request_timeout_s: float = 60.0, retries: int = 3
) -> AsyncBrokerService:
    """:func:`headwater.client.transport.bootstrap.open_service` for asyncio: the plain
    :class:`AsyncService` of a broker running alone, an :class:`AsyncRoutedService` of a
    cluster."""
    bootstrap = parse_bootstrap(addresses)

    async def perform(effect: Open | Sleep) -> tuple[AsyncService, ClusterMetadata] | None:
        if isinstance(effect, Sleep):
            await asyncio.sleep(effect.seconds)
            return None
        if effect.probe_s is not None:  # does anybody take a connection there at all?
            async with asyncio.timeout(effect.probe_s):
                _, writer = await asyncio.open_connection(*parse_address(effect.address))
            writer.close()
        transport = AsyncTransport(
            effect.address, connect_timeout_s=effect.connect_timeout_s, request_timeout_s=request_timeout_s
        )
        service = AsyncService(transport, retries=retries)
        try:  # fails fast, with a clear error, if nobody is there; a broker still joining: the next
            return service, await service.metadata()
        except BaseException:
            await service.close()
            raise

    home, md = await adrive(first_that_answers(bootstrap, connect_timeout_s), perform)
    if not md.cluster_id:
        return home  # a broker alone: the plain client, no routing layer
    settings = {"connect_timeout_s": connect_timeout_s, "request_timeout_s": request_timeout_s, "retries": retries}
    return AsyncRoutedService(home, md, bootstrap=bootstrap, **settings)


class _Watched:
    """A produce's sink on a leader's connection: a failure goes to ``failed`` (the routed
    service's ``_unreachable``) before the sink hears it."""

    __slots__ = ("_sink", "_failed")

    def __init__(self, sink: Sink, failed: Callable[[BaseException], None]) -> None:
        self._sink = sink
        self._failed = failed

    def done(self) -> bool:
        return self._sink.done()

    def cancelled(self) -> bool:
        return self._sink.cancelled()

    def exception(self) -> BaseException | None:
        return self._sink.exception()

    def set_result(self, result: Any) -> None:
        self._sink.set_result(result)

    def set_exception(self, exception: BaseException) -> None:
        self._failed(exception)
        self._sink.set_exception(exception)

    def add_done_callback(self, fn: Callable[[Any], object]) -> None:
        self._sink.add_done_callback(fn)
