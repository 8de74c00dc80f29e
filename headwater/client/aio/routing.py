"""AsyncRoutedService: the asyncio service of a cluster, the twin of
:class:`~headwater.client.transport.routing.RoutedService` (read its module for the rules:
where each request goes, when the table is asked for again, what is sent again).

One :class:`~headwater.client.aio.service.AsyncService` per broker, opened when first needed;
the table and the merging are :mod:`headwater.client.core.routing`'s. Used from one event loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from headwater.client.aio.routed_groups import AsyncRoutedGroupCalls
from headwater.client.aio.routed_keyed import AsyncRoutedKeyedCalls
from headwater.client.aio.routed_subscribers import AsyncRoutedSubscriberCalls
from headwater.client.aio.service import AsyncBrokerService, AsyncService
from headwater.client.aio.shared_routing import AsyncSharedRouter
from headwater.client.core.routing import (
    BOOTSTRAP_PROBE_S,
    DELAYED_BIT,
    ENABLED_POLL_S,
    HOME,
    REFRESH,
    RefreshGate,
    RoutedCall,
    RoutingTable,
    merge_delay_stats,
    merge_describe,
    merge_key_lookups,
    merge_pages,
    parse_bootstrap,
)
from headwater.client.transport.async_transport import AsyncTransport
from headwater.client.transport.link import parse_address
from headwater.client.transport.remote import takes_request
from headwater.errors import (
    ClosedError,
    HeadwaterError,
    InvalidArgumentError,
    NotLeaderError,
    UnavailableError,
)
from headwater.model.cluster import ClusterMetadata
from headwater.model.config import QueueConfig, QueueInfo, QueuePage
from headwater.model.delay import DelayStats
from headwater.model.service import BrokerService, FetchResult, ProduceResult
from headwater.model.shared import LeaseRefusal, SharedDeliveries, SharedGroupInfo
from headwater.protocol import messages as m

__all__ = ["AsyncRoutedService", "open_async_service"]

T = TypeVar("T")


class AsyncRoutedService(AsyncRoutedGroupCalls, AsyncRoutedKeyedCalls, AsyncRoutedSubscriberCalls, AsyncBrokerService):
    """An AsyncBrokerService over the brokers of a cluster; ``home``: the bootstrap
    broker's service, which answered ``metadata``."""

    def __init__(
        self,
        home: AsyncService,
        metadata: ClusterMetadata,
        *,
        bootstrap: list[str],
        connect_timeout_s: float = 10.0,
        request_timeout_s: float = 60.0,
        retries: int = 3,
    ) -> None:
        self.bootstrap = bootstrap
        self.address = home.address
        self.connect_timeout_s = connect_timeout_s
        self.request_timeout_s = request_timeout_s
        self._retries = retries
        self._home = home
        self._links: dict[str, AsyncService] = {home.address: home}
        self._opening: dict[str, asyncio.Future[AsyncService]] = {}
        self._down: dict[str, tuple[float, UnavailableError]] = {}
        self._table = RoutingTable(metadata)
        self._gate = RefreshGate()
        self._gate.refreshed(time.monotonic())
        self._refreshing: asyncio.Lock | None = None  # made on the loop, when first needed
        self._closed = False
        self._shared = AsyncSharedRouter(self)

    @property
    def table(self) -> RoutingTable:
        return self._table

    # -- connections and the table ---------------------------------------------------------

    async def _link(self, address: str) -> AsyncService:
        if self._closed:
            raise ClosedError(f"the client of {','.join(self.bootstrap)} is closed")
        link = self._links.get(address)
        if link is not None:
            return link
        down = self._down.get(address)
        if down is not None and time.monotonic() - down[0] < self.connect_timeout_s:
            raise down[1]
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
            self._down[address] = (time.monotonic(), e)
            self._gate.mark_stale()
            await link.close()
            raise
        finally:
            self._opening.pop(address, None)
        if self._closed:
            await link.close()
            raise ClosedError(f"the client of {','.join(self.bootstrap)} is closed")
        self._down.pop(address, None)
        self._links[address] = link
        return link

    async def refresh(self, deadline: float | None = None) -> RoutingTable:
        """Ask METADATA again (waiting out the rate limit, within ``deadline``) of any live
        broker: the open connections first, then the bootstrap list."""
        if self._refreshing is None:
            self._refreshing = asyncio.Lock()
        async with self._refreshing:
            if not self._gate.stale and deadline is not None:
                return self._table  # refreshed while this call waited
            wait_s = self._gate.wait_s(time.monotonic())
            if deadline is not None:
                wait_s = min(wait_s, max(0.0, deadline - time.monotonic()))
            if wait_s > 0:
                await asyncio.sleep(wait_s)
            asked_at = time.monotonic()
            md = await self._ask_metadata()
            self._table = RoutingTable(md)
            self._gate.refreshed(asked_at)
            return self._table

    async def _ask_metadata(self, queues: list[str] | None = None) -> ClusterMetadata:
        errors: list[str] = []
        links = sorted(self._links.values(), key=lambda s: s.transport.connect_failure is not None)
        for link in links:
            try:
                return await link.metadata(queues)
            except UnavailableError as e:
                errors.append(f"{link.address}: {e}")
        tried = set(self._links)
        for address in [b.address for b in self._table.brokers.values()] + self.bootstrap:
            if address in tried:
                continue
            tried.add(address)
            try:
                return await (await self._link(address)).metadata(queues)
            except UnavailableError as e:
                errors.append(f"{address}: {e}")
        raise UnavailableError(f"no broker of the cluster answered METADATA: {'; '.join(errors)}")

    def _watch(self, fut: asyncio.Future[Any]) -> None:
        if not fut.cancelled() and isinstance(fut.exception(), UnavailableError):
            self._gate.mark_stale()

    # -- partition-scoped calls -------------------------------------------------------------

    async def _routed(
        self,
        api: m.ApiKey,
        queue: str,
        partition: int,
        call: Callable[[AsyncService], Awaitable[T]],
        wait_s: float = 0.0,
    ) -> T:
        """``call`` on the service of ``queue[partition]``'s leader, sent again (within the
        call's deadline) as :class:`~headwater.client.core.routing.RoutedCall` says."""
        deadline = time.monotonic() + self.request_timeout_s + wait_s
        decide = RoutedCall(m.API_SPECS[api].resend is m.Resend.SAFE)
        while True:
            where = decide.leader(self._table, self._gate.stale, queue, partition)
            if where is REFRESH:
                self._gate.mark_stale()
                await self.refresh(deadline)
                continue
            if where is HOME:
                return await call(self._home)  # the broker's own error, in its words
            try:
                return await call(await self._link(where))
            except HeadwaterError as e:
                if decide.stales(e):
                    self._gate.mark_stale()
                if not decide.again(e, where, late=time.monotonic() >= deadline):
                    raise

    async def produce(self, queue: str, partition: int, batch: bytes) -> ProduceResult:
        return await self._routed(m.ApiKey.PRODUCE, queue, partition, lambda s: s.produce(queue, partition, batch))

    def produce_nowait(self, queue: str, partition: int, batch: bytes) -> asyncio.Future[ProduceResult]:
        """Send a batch to its partition's leader now (after everything submitted to that
        broker before it), without waiting; the asyncio producer pipelines with it. When the
        leader's connection is not open yet, or the table is stale, a task routes it."""
        link = None
        if not self._gate.stale:
            try:
                link = self._links.get(self._table.leader(queue, partition).address)
            except NotLeaderError:
                link = None
        if link is None:
            return asyncio.ensure_future(self.produce(queue, partition, batch))
        fut = link.produce_nowait(queue, partition, batch)
        fut.add_done_callback(self._watch)
        return fut

    async def fetch(
        self,
        queue: str,
        partition: int,
        offset: int,
        *,
        max_bytes: int,
        tag_mask: int = 0,
        end_offset: int | None = None,
        max_wait_ms: int = 0,
    ) -> FetchResult:
        return await self._routed(
            m.ApiKey.FETCH,
            queue,
            partition,
            lambda s: s.fetch(
                queue,
                partition,
                offset,
                max_bytes=max_bytes,
                tag_mask=tag_mask,
                end_offset=end_offset,
                max_wait_ms=max_wait_ms,
            ),
            max_wait_ms / 1000,
        )

    async def offset_for_time(self, queue: str, partition: int, timestamp_ms: int) -> int:
        return await self._routed(
            m.ApiKey.OFFSET_FOR_TIME, queue, partition, lambda s: s.offset_for_time(queue, partition, timestamp_ms)
        )

    async def _queue_named(self, queue_id: int) -> str | None:
        """The name of the queue of ``queue_id`` (a message id's), the table refreshed once
        when it does not know it."""
        name = self._table.queue_of(queue_id)
        if name is None:
            self._gate.mark_stale()
            name = (await self.refresh(time.monotonic() + self.request_timeout_s)).queue_of(queue_id)
        return name

    async def _by_id(
        self, api: m.ApiKey, queue_id: int, partition: int, call: Callable[[AsyncService], Awaitable[T]]
    ) -> T:
        """``call`` at the leader of a message id's partition (a delayed id's too: the leader
        keeps its schedule), or at the bootstrap broker, for its MessageNotFoundError, when no
        table knows the queue."""
        name = await self._queue_named(queue_id)
        if name is None:
            return await call(self._home)
        return await self._routed(api, name, partition & ~DELAYED_BIT, call)

    async def lookup_id(self, queue_id: int, partition: int, offset: int) -> tuple[str, bytes]:
        """The message of an id, from its partition's leader."""
        return await self._by_id(
            m.ApiKey.LOOKUP_ID, queue_id, partition, lambda s: s.lookup_id(queue_id, partition, offset)
        )

    async def cancel_delayed(self, queue_id: int, partition: int, offset: int) -> None:
        """Cancel a delayed message at its partition's leader, which keeps its schedule."""
        return await self._by_id(
            m.ApiKey.CANCEL_DELAYED, queue_id, partition, lambda s: s.cancel_delayed(queue_id, partition, offset)
        )

    # -- queue-wide calls -------------------------------------------------------------------

    async def _leaders(self, queue: str) -> dict[int, list[int]]:
        if self._gate.stale or not self._table.knows(queue):
            self._gate.mark_stale()
            await self.refresh(time.monotonic() + self.request_timeout_s)
        return self._table.leaders_of(queue)

    async def _ask_leaders(
        self, brokers: list[int], ask: Callable[[AsyncService], Awaitable[Any]], *, strict: bool
    ) -> dict[int, Any]:
        """``ask`` of each of ``brokers`` at once: their answers (a broker out of reach left
        out, unless ``strict``)."""

        async def one(broker_id: int) -> Any:
            return await ask(await self._link(self._table.brokers[broker_id].address))

        got = await asyncio.gather(*(one(b) for b in brokers), return_exceptions=True)
        out: dict[int, Any] = {}
        for broker_id, answer in zip(brokers, got, strict=True):
            if isinstance(answer, UnavailableError):
                self._gate.mark_stale()
                if strict:
                    raise answer
            elif isinstance(answer, BaseException):
                raise answer
            else:
                out[broker_id] = answer
        return out

    async def describe_queue(self, name: str) -> QueueInfo:
        leaders = await self._leaders(name)
        if not leaders:
            return await self._home.describe_queue(name)
        answers = await self._ask_leaders(sorted(leaders), lambda s: s.describe_queue(name), strict=False)
        if not answers:
            return await self._home.describe_queue(name)
        return merge_describe(answers[min(answers)], answers, self._table.partition_leaders(name))

    async def list_queues(self, after: str | None = None, partitions_max: int = 0) -> QueuePage:
        page = await self._home.list_queues(after, partitions_max)
        if any(not self._table.knows(q.name) for q in page.queues):
            self._gate.mark_stale()
        if self._gate.stale:
            await self.refresh(time.monotonic() + self.request_timeout_s)
        table = self._table
        leaders = {q.name: table.partition_leaders(q.name) for q in page.queues}
        brokers = sorted({b for parts in leaders.values() for b in parts.values()})
        pages = await self._ask_leaders(brokers, lambda s: s.list_queues(after, partitions_max), strict=False)
        return merge_pages(page, pages, leaders)

    async def lookup_key(
        self, queue: str, key: bytes, start_ms: int | None, end_ms: int | None, limit: int
    ) -> list[bytes]:
        leaders = await self._leaders(queue)
        if not leaders:
            return await self._home.lookup_key(queue, key, start_ms, end_ms, limit)
        answers = await self._ask_leaders(
            sorted(leaders), lambda s: s.lookup_key(queue, key, start_ms, end_ms, limit), strict=True
        )
        return merge_key_lookups(answers, self._table.partition_leaders(queue), limit)

    async def delay_stats(self) -> DelayStats:
        """Every broker's schedule of delayed messages, added up (``merge_delay_stats``)."""
        self._gate.mark_stale()  # a broker that joined since the last table has a schedule too
        await self.refresh(time.monotonic() + self.request_timeout_s)
        brokers = sorted(self._table.brokers)
        if len(brokers) <= 1:
            return await self._home.delay_stats()
        answers = await self._ask_leaders(brokers, lambda s: s.delay_stats(), strict=False)
        return merge_delay_stats(answers) if answers else await self._home.delay_stats()

    # -- admin and the rest -----------------------------------------------------------------

    async def create_queue(self, name: str, config: QueueConfig) -> QueueInfo:
        try:
            return await self._home.create_queue(name, config)
        finally:
            self._gate.mark_stale()

    async def delete_queue(self, name: str) -> None:
        try:
            await self._home.delete_queue(name)
        finally:
            self._gate.mark_stale()

    async def add_partitions(self, name: str, partitions: int) -> QueueInfo:
        try:
            return await self._home.add_partitions(name, partitions)
        finally:
            self._gate.mark_stale()

    async def truncate_queue(self, name: str) -> QueueInfo:
        """Every broker drops its copies of the queue's messages; a broker out of reach
        raises (truncate again once it is back: it is safe to repeat)."""
        if not await self._leaders(name):
            return await self._home.truncate_queue(name)  # unknown, in the broker's words
        brokers = sorted(self._table.brokers)
        answers = await self._ask_leaders(brokers, lambda s: s.truncate_queue(name), strict=True)
        return merge_describe(answers[min(answers)], answers, self._table.partition_leaders(name))

    async def alter_queue(self, name: str, changes: dict[str, Any]) -> QueueInfo:
        """Through the controller; answered once every broker that answers has it."""
        try:
            info = await self._home.alter_queue(name, changes)
        finally:
            self._gate.mark_stale()
        deadline = time.monotonic() + self.request_timeout_s
        while True:
            answers = await self._ask_leaders(
                sorted(self._table.brokers), lambda s: s.describe_queue(name), strict=False
            )
            if all(q.config == info.config for q in answers.values()):
                return info
            if time.monotonic() >= deadline:
                raise UnavailableError(f"the queue {name!r} was changed, but not every broker follows it yet")
            await asyncio.sleep(ENABLED_POLL_S)

    async def set_queue_enabled(self, name: str, enabled: bool) -> QueueInfo:
        """Through the controller; answered once every broker that answers has it."""
        try:
            info = await self._home.set_queue_enabled(name, enabled)
        finally:
            self._gate.mark_stale()
        deadline = time.monotonic() + self.request_timeout_s
        while True:
            answers = await self._ask_leaders(
                sorted(self._table.brokers), lambda s: s.describe_queue(name), strict=False
            )
            if all(q.enabled == bool(enabled) for q in answers.values()):
                return info
            if time.monotonic() >= deadline:
                raise UnavailableError(f"the queue {name!r} was changed, but not every broker follows it yet")
            await asyncio.sleep(ENABLED_POLL_S)

    async def metadata(self, queues: list[str] | None = None) -> ClusterMetadata:
        return await self._ask_metadata(queues)

    async def ping(self) -> None:
        await self._home.ping()

    # -- shared groups: each partition's state on its leader (AsyncSharedRouter) ----------

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

    async def shared_ack(self, group: str, queue: str, member: str, lease_ids: list[str]) -> list[LeaseRefusal]:
        return await self._shared.lease_call(queue, lease_ids, lambda s, ids: s.shared_ack(group, queue, member, ids))

    async def shared_nack(
        self, group: str, queue: str, member: str, lease_ids: list[str], reason: str = "", delay_ms: int | None = None
    ) -> list[LeaseRefusal]:
        return await self._shared.lease_call(
            queue, lease_ids, lambda s, ids: s.shared_nack(group, queue, member, ids, reason, delay_ms)
        )

    async def shared_extend(
        self, group: str, queue: str, member: str, lease_ids: list[str], visibility_timeout_ms: int
    ) -> list[LeaseRefusal]:
        return await self._shared.lease_call(
            queue, lease_ids, lambda s, ids: s.shared_extend(group, queue, member, ids, visibility_timeout_ms)
        )

    async def shared_describe(self, group: str, queue: str) -> SharedGroupInfo:
        return await self._shared.describe(group, queue)

    async def close(self) -> None:
        """Give back the shared deliveries kept for receives that will not come, then
        close every connection (the bootstrap broker's too)."""
        if self._closed:
            return
        await self._shared.release_held()
        self._closed = True
        for opening in list(self._opening.values()):
            opening.cancel()
        for link in list(self._links.values()):
            await link.close()


def _on_home(name: str) -> Callable[..., Any]:
    async def call(self: AsyncRoutedService, *args: Any, **kwargs: Any) -> Any:
        return await getattr(self._home, name)(*args, **kwargs)

    call.__name__ = call.__qualname__ = name
    call.__doc__ = getattr(BrokerService, name).__doc__
    return call


# what stays on the bootstrap broker for now (docs/cluster.md, "Clients")
for _spec in m.API_SPECS.values():
    if _spec.method is not None and _spec.method not in {
        **AsyncRoutedGroupCalls.__dict__,
        **AsyncRoutedKeyedCalls.__dict__,
        **AsyncRoutedSubscriberCalls.__dict__,
        **AsyncRoutedService.__dict__,
    }:
        setattr(AsyncRoutedService, _spec.method, _on_home(_spec.method))


async def open_async_service(
    addresses: str | list[str], *, connect_timeout_s: float = 10.0, request_timeout_s: float = 60.0, retries: int = 3
) -> AsyncBrokerService:
    """:func:`headwater.client.transport.bootstrap.open_service` for asyncio: the plain
    :class:`AsyncService` of a broker running alone, an :class:`AsyncRoutedService` of a
    cluster."""
    bootstrap = parse_bootstrap(addresses)
    home = await _first_that_answers(bootstrap, connect_timeout_s, request_timeout_s, retries)
    try:
        md = await home.metadata()
    except BaseException:
        await home.close()
        raise
    if not md.cluster_id:
        return home
    return AsyncRoutedService(
        home,
        md,
        bootstrap=bootstrap,
        connect_timeout_s=connect_timeout_s,
        request_timeout_s=request_timeout_s,
        retries=retries,
    )


async def _connected(address: str, connect_timeout_s: float, request_timeout_s: float, retries: int) -> AsyncService:
    transport = AsyncTransport(address, connect_timeout_s=connect_timeout_s, request_timeout_s=request_timeout_s)
    service = AsyncService(transport, retries=retries)
    try:
        await service.ping()  # fail fast, with a clear error, if nobody is there
    except BaseException:
        await service.close()
        raise
    return service


async def _first_that_answers(
    bootstrap: list[str], connect_timeout_s: float, request_timeout_s: float, retries: int
) -> AsyncService:
    if len(bootstrap) == 1:  # as before: the one address gets the whole connect_timeout_s
        return await _connected(bootstrap[0], connect_timeout_s, request_timeout_s, retries)
    deadline = time.monotonic() + connect_timeout_s
    errors: dict[str, str] = {}
    while True:
        for address in bootstrap:
            left_s = deadline - time.monotonic()
            try:
                host, port = parse_address(address)
                async with asyncio.timeout(max(0.05, min(left_s, BOOTSTRAP_PROBE_S))):
                    _, writer = await asyncio.open_connection(host, port)
                writer.close()
            except (OSError, TimeoutError, InvalidArgumentError) as e:
                errors[address] = str(e) or type(e).__name__
                continue
            try:
                return await _connected(address, max(0.1, left_s), request_timeout_s, retries)
            except UnavailableError as e:
                errors[address] = str(e)
        if time.monotonic() >= deadline:
            tried = "; ".join(f"{a}: {why}" for a, why in errors.items())
            raise UnavailableError(
                f"cannot reach any broker of {','.join(bootstrap)} within {connect_timeout_s} s ({tried}); "
                f"are they running, and are the addresses right?"
            )
        await asyncio.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
