"""RoutedService: the BrokerService of a cluster, for synchronous code (docs/cluster.md,
"Clients"; docs/design/cluster.md, step 5).

One :class:`~headwater.client.transport.remote.RemoteService` per broker, opened when first
needed at the address METADATA gives; each request goes where
:mod:`headwater.client.core.routing` says:

- a partition's (produce, fetch, offset_for_time, lookup_id) to its leader. On a
  :class:`~headwater.errors.NotLeaderError` (the broker refused it: never applied, so it may
  always go again), on an unknown queue or partition the table did not know yet, or on a
  broker out of reach, the table is asked for again (METADATA, at most every
  ``REFRESH_INTERVAL_S``) and a blocking call is sent again within its deadline, if its
  operation's ``Resend`` allows. ``produce_async`` and ``fetch_async`` do not wait: a
  refusal marks the table stale, starts a refresh without waiting, and is their answer; the
  producer's retries (and the consumer's next read) go by the new table.
- a queue-wide read (describe_queue, list_queues, lookup_key) to every leader of the queue,
  the answers merged; admin changes to the bootstrap broker, the table refreshed after each.
- a consumer group's (join, heartbeat, leave, describe, commit_offsets, fetch_offsets) to
  the group's coordinator, sent again after a NotCoordinatorError; list_groups to every
  broker, the answers merged (:mod:`~headwater.client.transport.routed_groups`).
- a delayed id's (lookup_id, cancel_delayed) to its partition's leader, which keeps its
  delayed messages; delay_stats to every broker, the answers added up.
- shared groups to each partition's leader (:mod:`headwater.client.transport.shared_routing`).
- a keyed group's (keyed_group, keyed_commit, keyed_resize) to its coordinator, keyed_fetch
  to the partition's leader (:mod:`~headwater.client.transport.routed_keyed`).
- the rest (subscriptions, status) to the bootstrap broker.

Thread-safe. Its threads are its connections' (one ``headwater-client`` thread each).
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from headwater.client.core.routing import (
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
)
from headwater.client.transport.remote import RemoteService, check_arguments, takes_request
from headwater.client.transport.routed_groups import RoutedGroupCalls
from headwater.client.transport.routed_keyed import RoutedKeyedCalls
from headwater.client.transport.routed_subscribers import RoutedSubscriberCalls
from headwater.client.transport.send_future import LazyFuture
from headwater.client.transport.shared_routing import SharedRouter
from headwater.errors import (
    ClosedError,
    HeadwaterError,
    OutcomeUnknownError,
    UnavailableError,
)
from headwater.model.cluster import ClusterMetadata
from headwater.model.config import QueueConfig, QueueInfo, QueuePage
from headwater.model.delay import DelayStats
from headwater.model.service import BrokerService, FetchResult, ProduceResult
from headwater.model.shared import LeaseRefusal, SharedDeliveries, SharedGroupInfo
from headwater.protocol import messages as m

__all__ = ["RoutedService"]

log = logging.getLogger(__name__)
T = TypeVar("T")


class _Links:
    """What a routed service knows of its cluster's connections, for the consumers' rule on
    riding out an outage (``headwater.client.transport.polling.Outage``): it has the members
    of ``Reconnects``."""

    def __init__(self, service: RoutedService) -> None:
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


class RoutedService(RoutedGroupCalls, RoutedKeyedCalls, RoutedSubscriberCalls, BrokerService):
    """A BrokerService over the brokers of a cluster (see the module's docstring).
    ``home``: the bootstrap broker's connection, which answered ``metadata``."""

    def __init__(
        self,
        home: RemoteService,
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
        self._lock = threading.Lock()
        self._refresh_lock = threading.Lock()  # one blocking refresh at a time; the others use its answer
        self._links: dict[str, RemoteService] = {home.address: home}
        self._down: dict[str, tuple[float, UnavailableError]] = {}  # address -> when opening it failed, why
        self._table = RoutingTable(metadata)
        self._gate = RefreshGate()
        self._gate.refreshed(time.monotonic())
        self._asking: concurrent.futures.Future[Any] | None = None  # a refresh that does not wait
        self._closed = False
        self.transport = _Links(self)
        self._shared = SharedRouter(self)

    # -- connections and the table ---------------------------------------------------------

    def links(self) -> list[RemoteService]:
        with self._lock:
            return list(self._links.values())

    @property
    def table(self) -> RoutingTable:
        """The routing table in use (the last METADATA answer)."""
        return self._table

    def _link(self, address: str) -> RemoteService:
        """The connection to the broker at ``address``, opened if none is."""
        with self._lock:
            if self._closed:
                raise ClosedError(f"the client of {','.join(self.bootstrap)} is closed")
            link = self._links.get(address)
            down = self._down.get(address)
        if link is not None:
            return link
        if down is not None and time.monotonic() - down[0] < self.connect_timeout_s:
            raise down[1]  # do not wait a connect_timeout_s again for each call
        try:
            link = RemoteService(
                address,
                connect_timeout_s=self.connect_timeout_s,
                request_timeout_s=self.request_timeout_s,
                retries=self._retries,
            )
        except UnavailableError as e:
            with self._lock:
                self._down[address] = (time.monotonic(), e)
            self._gate.mark_stale()
            raise
        with self._lock:
            kept = self._links.setdefault(address, link)
            self._down.pop(address, None)
            closed = self._closed
        if kept is not link or closed:
            link.close()  # another thread opened one first, or the client closed meanwhile
        if closed:
            raise ClosedError(f"the client of {','.join(self.bootstrap)} is closed")
        return kept

    def _install(self, md: ClusterMetadata, asked_at: float) -> None:
        with self._lock:
            self._table = RoutingTable(md)
            self._gate.refreshed(asked_at)

    def _metadata_sources(self) -> list[RemoteService]:
        """Open connections to ask METADATA of: the live ones first (those whose broker was
        last seen out of reach at the end)."""
        links = self.links()
        return sorted(links, key=lambda link: link.transport.connect_failure is not None)

    def refresh(self, deadline: float | None = None) -> RoutingTable:
        """Ask METADATA again now (waiting out the rate limit, within ``deadline``), of any
        live broker: the open connections first, then the bootstrap list."""
        with self._refresh_lock:
            if not self._gate.stale and deadline is not None:
                return self._table  # another thread refreshed while this one waited
            wait_s = self._gate.wait_s(time.monotonic())
            if deadline is not None:
                wait_s = min(wait_s, max(0.0, deadline - time.monotonic()))
            if wait_s > 0:
                time.sleep(wait_s)
            asked_at = time.monotonic()
            md = self._ask_metadata()
            self._install(md, asked_at)
            return self._table

    def _ask_metadata(self) -> ClusterMetadata:
        errors: list[str] = []
        for link in self._metadata_sources():
            try:
                return link.metadata()
            except UnavailableError as e:
                errors.append(f"{link.address}: {e}")
        tried = {link.address for link in self.links()}
        for address in [b.address for b in self._table.brokers.values()] + self.bootstrap:
            if address in tried:
                continue
            tried.add(address)
            try:
                return self._link(address).metadata()
            except UnavailableError as e:
                errors.append(f"{address}: {e}")
        raise UnavailableError(f"no broker of the cluster answered METADATA: {'; '.join(errors)}")

    def _refresh_soon(self) -> None:
        """Start a refresh that nobody waits for, if one is due and none is on its way."""
        now = time.monotonic()
        source = self._metadata_sources()[0]
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
            self._gate.mark_stale()
            self._refresh_soon()

    # -- partition-scoped calls -------------------------------------------------------------

    def _routed(
        self, api: m.ApiKey, queue: str, partition: int, call: Callable[[RemoteService], T], wait_s: float = 0.0
    ) -> T:
        """``call`` on the connection of ``queue[partition]``'s leader, sent again (within
        the call's deadline) as :class:`~headwater.client.core.routing.RoutedCall` says."""
        deadline = time.monotonic() + self.request_timeout_s + wait_s
        decide = RoutedCall(m.API_SPECS[api].resend is m.Resend.SAFE)
        while True:
            where = decide.leader(self._table, self._gate.stale, queue, partition)
            if where is REFRESH:
                self._gate.mark_stale()
                self.refresh(deadline)
                continue
            if where is HOME:
                return call(self._home)  # QueueNotFoundError or PartitionOutOfRangeError, in its words
            try:
                return call(self._link(where))
            except HeadwaterError as e:
                if decide.stales(e):
                    self._gate.mark_stale()
                if not decide.again(e, where, late=time.monotonic() >= deadline):
                    raise

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
        return self._routed(m.ApiKey.PRODUCE, queue, partition, lambda s: s.produce(queue, partition, batch))

    def produce_async(self, queue: str, partition: int, batch: bytes) -> concurrent.futures.Future[ProduceResult]:
        """Send a batch to its partition's leader without waiting (the producer keeps
        several in flight, and sends again after a refusal, by the table then)."""
        fut = self.leader_link_nowait(queue, partition).produce_async(queue, partition, batch)
        fut.add_done_callback(self._watch)
        return fut

    def fetch(
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
        return self._routed(
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

    def fetch_async(
        self,
        queue: str,
        partition: int,
        offset: int,
        *,
        max_bytes: int,
        tag_mask: int = 0,
        end_offset: int | None = None,
        max_wait_ms: int = 0,
        lead: bool = False,
    ) -> concurrent.futures.Future[FetchResult]:
        """Fetch from the partition's leader without waiting (never ``lead``: its answer
        may come on any of several connections, so the connection's thread reads it)."""
        try:
            link = self.leader_link_nowait(queue, partition)
        except UnavailableError as e:
            failed: concurrent.futures.Future[FetchResult] = LazyFuture()
            failed.set_exception(e)  # a read's error, ridden out as a lost connection's
            return failed
        fut = link.fetch_async(
            queue,
            partition,
            offset,
            max_bytes=max_bytes,
            tag_mask=tag_mask,
            end_offset=end_offset,
            max_wait_ms=max_wait_ms,
        )
        fut.add_done_callback(self._watch)
        return fut

    def offset_for_time(self, queue: str, partition: int, timestamp_ms: int) -> int:
        return self._routed(
            m.ApiKey.OFFSET_FOR_TIME, queue, partition, lambda s: s.offset_for_time(queue, partition, timestamp_ms)
        )

    def _queue_named(self, queue_id: int) -> str | None:
        """The name of the queue of ``queue_id`` (a message id's), the table refreshed once
        when it does not know it."""
        name = self._table.queue_of(queue_id)
        if name is None:
            self._gate.mark_stale()
            name = self.refresh(time.monotonic() + self.request_timeout_s).queue_of(queue_id)
        return name

    def _by_id(self, api: m.ApiKey, queue_id: int, partition: int, call: Callable[[RemoteService], T]) -> T:
        """``call`` at the leader of a message id's partition (a delayed id's too: the leader
        keeps its schedule), or at the bootstrap broker, for its MessageNotFoundError, when no
        table knows the queue."""
        name = self._queue_named(queue_id)
        if name is None:
            return call(self._home)
        return self._routed(api, name, partition & ~DELAYED_BIT, call)

    def lookup_id(self, queue_id: int, partition: int, offset: int) -> tuple[str, bytes]:
        """The message of an id, from its partition's leader."""
        return self._by_id(m.ApiKey.LOOKUP_ID, queue_id, partition, lambda s: s.lookup_id(queue_id, partition, offset))

    def cancel_delayed(self, queue_id: int, partition: int, offset: int) -> None:
        """Cancel a delayed message at its partition's leader, which keeps its schedule."""
        return self._by_id(
            m.ApiKey.CANCEL_DELAYED, queue_id, partition, lambda s: s.cancel_delayed(queue_id, partition, offset)
        )

    # -- queue-wide calls -----------------------------------------------------------------

    def _leaders(self, queue: str) -> dict[int, list[int]]:
        """``{broker id: partitions}`` of ``queue``'s leaders, the table refreshed once when
        it does not know the queue."""
        if self._gate.stale or not self._table.knows(queue):
            self._gate.mark_stale()
            self.refresh(time.monotonic() + self.request_timeout_s)
        return self._table.leaders_of(queue)

    def _ask_leaders(self, brokers: list[int], body: m.RequestBody) -> dict[int, concurrent.futures.Future[Any]]:
        """Send ``body`` to each of ``brokers`` at once, without waiting: their futures."""
        check_arguments(body)
        asked: dict[int, concurrent.futures.Future[Any]] = {}
        for broker_id in brokers:
            fut: concurrent.futures.Future[Any] = LazyFuture()
            try:
                self._link(self._table.brokers[broker_id].address).transport.submit(body, fut)
            except UnavailableError as e:
                fut.set_exception(e)
            asked[broker_id] = fut
        return asked

    def _answers(self, asked: dict[int, concurrent.futures.Future[Any]], *, strict: bool) -> dict[int, Any]:
        """The answers of :meth:`_ask_leaders`; a broker out of reach left out (``strict``:
        its error raised), any other error raised."""
        out: dict[int, Any] = {}
        for broker_id, fut in asked.items():
            try:
                out[broker_id] = fut.result(timeout=self.request_timeout_s + 1)
            except UnavailableError as e:
                self._gate.mark_stale()
                if strict:
                    raise
                log.warning("broker %d did not answer (%s): its partitions' offsets are another broker's", broker_id, e)
            except concurrent.futures.TimeoutError:
                if strict:
                    raise UnavailableError(f"broker {broker_id} got no answer in {self.request_timeout_s} s") from None
        return out

    def describe_queue(self, name: str) -> QueueInfo:
        """The queue (its config from any broker), each partition's offsets from its leader."""
        leaders = self._leaders(name)
        if not leaders:
            return self._home.describe_queue(name)  # unknown, or no leader now: one broker's answer
        answers = self._answers(self._ask_leaders(sorted(leaders), m.DescribeQueueRequest(name)), strict=False)
        if not answers:
            return self._home.describe_queue(name)
        base = answers[min(answers)]
        return merge_describe(base, answers, self._table.partition_leaders(name))

    def describe_queue_async(self, name: str) -> concurrent.futures.Future[QueueInfo]:
        """:meth:`describe_queue` without waiting (the producer refreshes its copy of a
        queue's partition count with it). A queue the table does not know yet: the
        bootstrap broker's answer, the table refreshed meanwhile."""
        leaders = self._table.leaders_of(name)
        if not leaders:
            self._gate.mark_stale()
            self._refresh_soon()
            return self._home.describe_queue_async(name)
        asked = self._ask_leaders(sorted(leaders), m.DescribeQueueRequest(name))
        partition_leaders = self._table.partition_leaders(name)
        out: concurrent.futures.Future[QueueInfo] = LazyFuture()
        left = [len(asked)]
        lock = threading.Lock()

        def answered(_: concurrent.futures.Future[Any]) -> None:
            with lock:
                left[0] -= 1
                if left[0]:
                    return
            answers: dict[int, QueueInfo] = {}
            failure: BaseException | None = None
            for broker_id, fut in asked.items():
                error = fut.exception()
                if error is None:
                    answers[broker_id] = fut.result()
                elif failure is None or not isinstance(error, UnavailableError):
                    failure = error  # a broker's refusal (the queue is gone) before one out of reach
            if failure is not None and (not answers or not isinstance(failure, UnavailableError)):
                out.set_exception(failure)
            else:
                out.set_result(merge_describe(answers[min(answers)], answers, partition_leaders))

        for fut in asked.values():
            fut.add_done_callback(answered)
        return out

    def list_queues(self, after: str | None = None, partitions_max: int = 0) -> QueuePage:
        page = self._home.list_queues(after, partitions_max)
        if any(not self._table.knows(q.name) for q in page.queues):
            self._gate.mark_stale()
        if self._gate.stale:
            self.refresh(time.monotonic() + self.request_timeout_s)
        table = self._table
        leaders = {q.name: table.partition_leaders(q.name) for q in page.queues}
        brokers = sorted({b for parts in leaders.values() for b in parts.values()})
        pages = self._answers(self._ask_leaders(brokers, m.ListQueuesRequest(after, partitions_max)), strict=False)
        return merge_pages(page, pages, leaders)

    def lookup_key(self, queue: str, key: bytes, start_ms: int | None, end_ms: int | None, limit: int) -> list[bytes]:
        leaders = self._leaders(queue)
        if not leaders:
            return self._home.lookup_key(queue, key, start_ms, end_ms, limit)
        body = m.LookupKeyRequest(queue, key, start_ms, end_ms, limit)
        answers = self._answers(self._ask_leaders(sorted(leaders), body), strict=True)
        return merge_key_lookups(answers, self._table.partition_leaders(queue), limit)

    # -- admin: any broker; the table refreshed after each change ---------------------------

    def delay_stats(self) -> DelayStats:
        """Every broker's schedule of delayed messages, added up (``merge_delay_stats``): each
        keeps those of the partitions it leads. A broker out of reach is left out."""
        self._gate.mark_stale()  # a broker that joined since the last table has a schedule too
        brokers = sorted(self.refresh(time.monotonic() + self.request_timeout_s).brokers)
        if len(brokers) <= 1:
            return self._home.delay_stats()
        answers = self._answers(self._ask_leaders(brokers, m.DelayStatsRequest()), strict=False)
        return merge_delay_stats(answers) if answers else self._home.delay_stats()

    def _changed(self, result: T) -> T:
        self._gate.mark_stale()
        return result

    def create_queue(self, name: str, config: QueueConfig) -> QueueInfo:
        return self._changed(self._home.create_queue(name, config))

    def delete_queue(self, name: str) -> None:
        try:
            self._home.delete_queue(name)
        finally:
            self._gate.mark_stale()

    def add_partitions(self, name: str, partitions: int) -> QueueInfo:
        return self._changed(self._home.add_partitions(name, partitions))

    def truncate_queue(self, name: str) -> QueueInfo:
        """Every broker drops its copies of the queue's messages; a broker out of reach
        raises (truncate again once it is back: it is safe to repeat)."""
        if not self._leaders(name):
            return self._home.truncate_queue(name)  # unknown, in the broker's words
        answers = self._answers(
            self._ask_leaders(sorted(self._table.brokers), m.TruncateQueueRequest(name)), strict=True
        )
        return merge_describe(answers[min(answers)], answers, self._table.partition_leaders(name))

    def alter_queue(self, name: str, changes: dict[str, Any]) -> QueueInfo:
        """Through the controller; answered once every broker that answers has it."""
        info = self._changed(self._home.alter_queue(name, changes))
        deadline = time.monotonic() + self.request_timeout_s
        while True:
            asked = self._ask_leaders(sorted(self._table.brokers), m.DescribeQueueRequest(name))
            if all(q.config == info.config for q in self._answers(asked, strict=False).values()):
                return info
            if time.monotonic() >= deadline:
                raise UnavailableError(f"the queue {name!r} was changed, but not every broker follows it yet")
            time.sleep(ENABLED_POLL_S)

    def set_queue_enabled(self, name: str, enabled: bool) -> QueueInfo:
        """Through the controller; answered once every broker that answers has it (each
        follows the cluster's record of the queue within moments)."""
        info = self._changed(self._home.set_queue_enabled(name, enabled))
        deadline = time.monotonic() + self.request_timeout_s
        while True:
            asked = self._ask_leaders(sorted(self._table.brokers), m.DescribeQueueRequest(name))
            if all(q.enabled == bool(enabled) for q in self._answers(asked, strict=False).values()):
                return info
            if time.monotonic() >= deadline:
                raise UnavailableError(f"the queue {name!r} was changed, but not every broker follows it yet")
            time.sleep(ENABLED_POLL_S)

    def metadata(self, queues: list[str] | None = None) -> ClusterMetadata:
        """Any live broker's answer (the open connections first)."""
        error: UnavailableError | None = None
        for link in self._metadata_sources():
            try:
                return link.metadata(queues)
            except UnavailableError as e:
                error = e
        assert error is not None  # there is always one connection: the bootstrap broker's
        raise error

    def ping(self) -> None:
        self._home.ping()

    # -- shared groups: each partition's state on its leader (SharedRouter) ---------------

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

    def shared_ack(self, group: str, queue: str, member: str, lease_ids: list[str]) -> list[LeaseRefusal]:
        return self._shared.lease_call(queue, lease_ids, lambda ids: m.SharedAckRequest(group, queue, member, ids))

    def shared_nack(
        self, group: str, queue: str, member: str, lease_ids: list[str], reason: str = "", delay_ms: int | None = None
    ) -> list[LeaseRefusal]:
        return self._shared.lease_call(
            queue, lease_ids, lambda ids: m.SharedNackRequest(group, queue, member, ids, reason, delay_ms)
        )

    def shared_extend(
        self, group: str, queue: str, member: str, lease_ids: list[str], visibility_timeout_ms: int
    ) -> list[LeaseRefusal]:
        return self._shared.lease_call(
            queue, lease_ids, lambda ids: m.SharedExtendRequest(group, queue, member, ids, visibility_timeout_ms)
        )

    def shared_describe(self, group: str, queue: str) -> SharedGroupInfo:
        return self._shared.describe(group, queue)

    def close(self) -> None:
        """Give back the shared deliveries kept for receives that will not come, then
        close every connection (the bootstrap broker's too)."""
        if not self._closed:
            self._shared.release_held()
        with self._lock:
            if self._closed:
                return
            self._closed = True
            links = list(self._links.values())
        for link in links:
            link.close()


def _on_home(name: str) -> Callable[..., Any]:
    def call(self: RoutedService, *args: Any, **kwargs: Any) -> Any:
        return getattr(self._home, name)(*args, **kwargs)

    call.__name__ = call.__qualname__ = name
    call.__doc__ = getattr(BrokerService, name).__doc__
    return call


# what stays on the bootstrap broker for now (docs/cluster.md, "Clients"): every other
# BrokerService operation, sent as its RemoteService sends it
for _spec in m.API_SPECS.values():
    if _spec.method is not None and _spec.method not in {
        **RoutedGroupCalls.__dict__,
        **RoutedKeyedCalls.__dict__,
        **RoutedSubscriberCalls.__dict__,
        **RoutedService.__dict__,
    }:
        setattr(RoutedService, _spec.method, _on_home(_spec.method))
