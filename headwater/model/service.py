"""The one small interface between the client and a broker.

The client (``headwater.client``) speaks only to a :class:`BrokerService`. The embedded
broker implements it in-process; the network transport implements it over the wire. Every
argument and result is a plain value (numbers, strings, bytes, model structs), so the same
calls cross a socket unchanged, and record batches travel as the bytes they are stored as.

Some services can do more than BrokerService asks, and the client uses it when they can:
the network services send without waiting and let a caller read its own answers, stream
partitions and subscriptions; the embedded broker shares its clock. Each such capability is
a small Protocol below (``runtime_checkable``: the client asks ``isinstance(service,
FetchesAsync)`` once, when it is made), not an attribute looked up by name.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:  # (asyncio's futures are named Awaitable here: model imports no asyncio)
    import concurrent.futures

import msgspec

from headwater.model.cluster import ClusterMetadata, PartitionMove
from headwater.model.config import QueueConfig, QueueInfo, QueuePage
from headwater.model.delay import DelayStats
from headwater.model.groups import GroupAssignment, GroupDescription, GroupSummary
from headwater.model.keyed import KeyedFetchResult, KeyedGroupInfo
from headwater.model.shared import LeaseRefusal, SharedDeliveries, SharedGroupInfo
from headwater.model.subscription import SubscriberInfo

__all__ = [
    "AsyncOpensPushStreams",
    "AsyncStartsSharedReceive",
    "BrokerService",
    "DescribesAsync",
    "FetchResult",
    "FetchesAsync",
    "HasClock",
    "HasTransport",
    "KeyedFetchesAsync",
    "Leads",
    "MetricsExposition",
    "OpensFetchStreams",
    "OpensPushStreams",
    "RoutesPushStreams",
    "AsyncRoutesPushStreams",
    "ProduceResult",
    "ProducesAsync",
    "ProducesInto",
    "PushHandler",
    "PushStreamSpec",
    "Reconnects",
    "StartsSharedReceive",
]


class ProduceResult(msgspec.Struct, frozen=True, array_like=True):
    """Where an appended batch landed."""

    queue_id: int
    partition: int
    base_offset: int
    count: int
    timestamp_ms: int


class FetchResult(msgspec.Struct, frozen=True, array_like=True):
    """Stored batches of one partition from some offset on.

    ``batches`` are whole stored batches; the first may begin before the offset asked for
    and the last may run past ``end`` of the request (the reader trims). ``next_offset`` is
    where to continue (past batches the broker skipped because of filters or expiry);
    ``start_offset`` and ``end_offset`` are the partition's retained range at fetch time.
    """

    batches: list[bytes]
    next_offset: int
    start_offset: int
    end_offset: int

    def settles(self, offset: int, end_offset: int | None = None) -> bool:
        """Whether a fetch at ``offset`` (up to ``end_offset``) that read this answers now
        rather than wait for an append (long polling): it found batches or moved on, reached
        its ``end_offset``, or its position is past the partition's end (the queue was
        created again, say: waiting there would skip what comes before it; the reader
        decides).

        >>> FetchResult([], 5, 0, 5).settles(5), FetchResult([], 9, 0, 5).settles(9)
        (False, True)
        """
        return (
            bool(self.batches)
            or self.next_offset != offset
            or offset > self.end_offset
            or (end_offset is not None and offset >= end_offset)
        )


class MetricsExposition(msgspec.Struct, frozen=True, array_like=True):
    """A broker's metrics as a scrape returns them: ``text`` in the Prometheus text
    exposition format, and the HTTP ``content_type`` to serve it with."""

    text: str
    content_type: str


class BrokerService(Protocol):
    # admin
    def create_queue(self, name: str, config: QueueConfig) -> QueueInfo: ...
    def describe_queue(self, name: str) -> QueueInfo: ...
    def list_queues(self, after: str | None = None, partitions_max: int = 0) -> QueuePage:
        """The queues named after ``after``, in name order, up to ``partitions_max``
        partitions (0: LIST_PAGE_PARTITIONS); a queue bigger than that comes alone."""
        ...

    def delete_queue(self, name: str) -> None: ...
    def truncate_queue(self, name: str) -> QueueInfo: ...
    def set_queue_enabled(self, name: str, enabled: bool) -> QueueInfo: ...
    def add_partitions(self, name: str, partitions: int) -> QueueInfo: ...
    def alter_queue(self, name: str, changes: dict[str, Any]) -> QueueInfo:
        """Change a queue's ``ttl_s``, ``message_bytes_max`` or ``flush`` (the keys of
        ``changes``; the others keep their values), checked as creation checks them, and
        durably (the queue's catalog entry)."""
        ...

    # data
    def produce(self, queue: str, partition: int, batch: bytes) -> ProduceResult: ...
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
        """Batches from ``offset`` on; when there are none yet, wait up to ``max_wait_ms``
        for some to arrive (long polling)."""
        ...

    def lookup_id(self, queue_id: int, partition: int, offset: int) -> tuple[str, bytes]: ...
    def lookup_key(
        self, queue: str, key: bytes, start_ms: int | None, end_ms: int | None, limit: int
    ) -> list[bytes]: ...
    def offset_for_time(self, queue: str, partition: int, timestamp_ms: int) -> int: ...
    # consumer offsets
    def commit_offsets(
        self,
        group: str,
        queue: str,
        offsets: dict[int, int],
        member_id: str | None = None,
        generation: int | None = None,
    ) -> None:
        """Store ``{partition: offset}`` for ``group`` (durably; survives restarts).

        A member of a clustering group passes its ``member_id`` and ``generation``: the commit
        is refused unless both are current and it holds the partitions. Without them the
        commit is refused while the group has members (see ``headwater.model.groups``)."""
        ...

    def delete_group(self, group: str, queue: str | None = None) -> None:
        """Remove ``group``'s committed offsets (on ``queue`` alone, if given) for good: a
        tombstone per offset, kept across restarts and compaction. Refused with
        :class:`GroupNotEmptyError` while the group has live members; GroupNotFoundError if
        it has no committed offsets (on ``queue``)."""
        ...

    def fetch_offsets(self, group: str, queue: str) -> dict[int, int]:
        """The offsets ``group`` committed on ``queue`` (partitions without one are absent)."""
        ...

    # consumer groups (membership; the rules are headwater.model.groups)
    def join_group(
        self,
        group: str,
        member_id: str | None,
        client_id: str,
        queues: list[str],
        mode: str,
        strategy: str,
        session_timeout_ms: int,
    ) -> GroupAssignment:
        """Join ``group`` (``member_id`` None: as a new member) subscribed to ``queues``; the
        group rebalances and the answer carries the member's id, generation and partitions."""
        ...

    def heartbeat_group(self, group: str, member_id: str, generation: int) -> GroupAssignment:
        """Stay a member; ``generation`` is the newest one whose assignment the member applied."""
        ...

    def leave_group(self, group: str, member_id: str) -> None: ...
    def describe_group(self, group: str) -> GroupDescription: ...
    def list_groups(self) -> list[GroupSummary]: ...

    # keyed groups (headwater.model.keyed)
    def keyed_group(
        self, queue: str, group: str, key: str | None = None, size: int | None = None, start: str = "earliest"
    ) -> KeyedGroupInfo:
        """The keyed group; with ``key`` and ``size``, create it if absent (its members
        starting at the ``start``, ``"earliest"`` or ``"latest"``, offsets) or check that
        it agrees. Without them, :class:`GroupNotFoundError` if absent."""
        ...

    def keyed_fetch(
        self,
        queue: str,
        group: str,
        member: int,
        generation: int,
        partition: int,
        offset: int,
        *,
        max_bytes: int,
        max_wait_ms: int = 0,
    ) -> KeyedFetchResult:
        """Like :meth:`fetch`, only ``member``'s messages, stopping at a resize's barrier."""
        ...

    def keyed_commit(
        self, queue: str, group: str, member: int, generation: int, offsets: dict[int, int]
    ) -> KeyedGroupInfo:
        """Store ``member``'s positions; a resize completes when its last member commits."""
        ...

    def keyed_resize(self, queue: str, group: str, size: int) -> KeyedGroupInfo:
        """Begin changing the group's size (pause, drain up to a barrier, resume)."""
        ...

    # push subscriptions (headwater.model.subscription)
    def add_subscriber(
        self,
        queue: str,
        name: str,
        partitions: list[int] | None = None,
        tags: list[str] | None = None,
        start: str = "latest",
    ) -> SubscriberInfo:
        """Register a subscriber; :class:`SubscriberExistsError` if the name is taken."""
        ...

    def delete_subscriber(self, queue: str, name: str) -> None: ...
    def list_subscribers(self, queue: str | None = None) -> list[SubscriberInfo]: ...
    def describe_subscriber(self, queue: str, name: str) -> SubscriberInfo: ...
    def checkpoint_subscriber(self, queue: str, name: str, offsets: dict[int, int], epoch: int = 0) -> None:
        """Store ``{partition: next offset to deliver}`` (durably); with an ``epoch``, refused
        (UsageError) once a newer process claimed the subscriber."""
        ...

    def claim_subscriber(self, queue: str, name: str) -> SubscriberInfo:
        """Bump the subscriber's epoch (durably, at its coordinator) and return it: the
        process that claims last owns the name; the streams of older epochs are ended."""
        ...

    # shared groups (the state machine is headwater.broker.shared_state)
    def shared_receive(
        self,
        group: str,
        queue: str,
        member: str,
        max_messages: int = 32,
        visibility_timeout_ms: int = 30_000,
        at_most_once: bool = False,
        settings: dict[str, int | float] | None = None,
        max_wait_ms: int = 0,
    ) -> SharedDeliveries:
        """Lease up to ``max_messages`` from any partition to ``member`` of the shared
        ``group`` for ``visibility_timeout_ms`` (``at_most_once``: finished on delivery, no
        lease); ``settings`` become the group's. Waits up to ``max_wait_ms`` for some."""
        ...

    def shared_ack(self, group: str, queue: str, member: str, lease_ids: list[str]) -> list[LeaseRefusal]:
        """Finish leased messages (durably); returns the leases refused (expired, another
        member's), whose messages are unchanged."""
        ...

    def shared_nack(
        self, group: str, queue: str, member: str, lease_ids: list[str], reason: str = "", delay_ms: int | None = None
    ) -> list[LeaseRefusal]:
        """Give leased messages back for redelivery after ``delay_ms`` (None: the group's
        backoff), or to the dead-letter queue once their attempts are used up."""
        ...

    def shared_extend(
        self, group: str, queue: str, member: str, lease_ids: list[str], visibility_timeout_ms: int
    ) -> list[LeaseRefusal]:
        """Make leases run ``visibility_timeout_ms`` from now."""
        ...

    def shared_describe(self, group: str, queue: str) -> SharedGroupInfo:
        """The group's settings and each partition's window and leases."""
        ...

    # delayed messages (headwater.model.delay; a delayed send is a produce whose batch has
    # a deliver_at_ms in the future: its answer holds the delayed id)
    def cancel_delayed(self, queue_id: int, partition: int, offset: int) -> None:
        """Cancel a delayed message not delivered yet (by its delayed id); cancelling twice
        is fine, an unknown or already delivered one is :class:`MessageNotFoundError`."""
        ...

    def delay_stats(self) -> DelayStats:
        """The schedule: pending per bucket, next due, delivery rate and lateness."""
        ...

    def status(self) -> dict[str, object]:
        """Broker facts for operators: version, uptime, storage figures, what recovery repaired."""
        ...

    def metrics(self) -> MetricsExposition:
        """The broker's metrics in the Prometheus text format (docs/metrics.md); a broker
        whose metrics are off, or without prometheus-client, raises
        :class:`~headwater.errors.UsageError` saying how to turn them on."""
        ...

    def metadata(self, queues: list[str] | None = None) -> ClusterMetadata:
        """The brokers, the controller and where each partition of ``queues`` is (``None``:
        every user queue); a broker alone names itself (:mod:`headwater.model.cluster`)."""
        ...

    def rebalance(self, dry_run: bool = False) -> list[PartitionMove]:
        """Plan (and unless ``dry_run``, start) the moves that balance the cluster's live
        brokers; the moves planned, in the order they run."""
        ...

    def decommission(self, broker_id: int, dry_run: bool = False) -> list[PartitionMove]:
        """Plan (and unless ``dry_run``, start) the moves of every partition off broker
        ``broker_id``; the moves planned."""
        ...

    def close(self) -> None: ...


# -- optional capabilities ----------------------------------------------------------------
# A service has one when it has these members; the client checks with isinstance (members'
# names only: the signatures are for type checkers). The sync ones return
# concurrent.futures.Future; the asyncio ones asyncio.Future, typed as Awaitable.


@runtime_checkable
class Leads(Protocol):
    """The caller may read the connection on its own thread while it waits for its
    answers (the network client; ``AsyncTransport.lead``)."""

    def lead(
        self,
        futures: list[Any],
        timeout_s: float | None,
        *,
        interrupt: concurrent.futures.Future[Any] | None = None,
    ) -> concurrent.futures.Future[Any] | None: ...


@runtime_checkable
class DescribesAsync(Protocol):
    """Asks for a queue's metadata without waiting."""

    def describe_queue_async(self, name: str) -> concurrent.futures.Future[QueueInfo]: ...


@runtime_checkable
class ProducesAsync(Protocol):
    """Sends a batch without waiting (the sync producer keeps several in flight with it)."""

    def produce_async(self, queue: str, partition: int, batch: bytes) -> concurrent.futures.Future[ProduceResult]: ...


@runtime_checkable
class ProducesInto(Protocol):
    """Sends a batch now, after everything submitted before it, without waiting, and hands
    its outcome to ``sink`` (``set_result(ProduceResult)`` or ``set_exception``) on the event
    loop as the answer is read: the asyncio producer pipelines with it, with no future and
    no turn of the loop a batch. The asyncio services over the network have it (one
    connection's, and a cluster's routed one, which watches each answer for a moved leader)."""

    def produce_into(self, queue: str, partition: int, batch: bytes, sink: Any) -> None: ...


@runtime_checkable
class FetchesAsync(Protocol):
    """Fetches without waiting; ``lead=True``: the caller will :meth:`Leads.lead` for it."""

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
    ) -> concurrent.futures.Future[FetchResult]: ...


@runtime_checkable
class KeyedFetchesAsync(Protocol):
    """A keyed fetch without waiting; ``lead=True``: the caller will lead for it."""

    def keyed_fetch_async(
        self,
        queue: str,
        group: str,
        member: int,
        generation: int,
        partition: int,
        offset: int,
        *,
        max_bytes: int,
        max_wait_ms: int = 0,
        lead: bool = False,
    ) -> concurrent.futures.Future[KeyedFetchResult]: ...


@runtime_checkable
class StartsSharedReceive(Leads, Protocol):
    """Sends a shared receive without waiting, and takes it back while it is not written
    (so a receive keeps its own timeout while the client connects again)."""

    def start_shared_receive(
        self,
        group: str,
        queue: str,
        member: str,
        max_messages: int,
        visibility_timeout_ms: int,
        at_most_once: bool,
        settings: dict[str, int | float],
        max_wait_ms: int,
    ) -> concurrent.futures.Future[SharedDeliveries]: ...

    def withdraw(self, fut: concurrent.futures.Future[Any]) -> bool: ...


@runtime_checkable
class AsyncStartsSharedReceive(Protocol):
    """:class:`StartsSharedReceive`, for asyncio."""

    def start_shared_receive(
        self,
        group: str,
        queue: str,
        member: str,
        max_messages: int,
        visibility_timeout_ms: int,
        at_most_once: bool,
        settings: dict[str, int | float],
        max_wait_ms: int,
    ) -> Awaitable[SharedDeliveries]: ...

    def withdraw(self, fut: Awaitable[Any]) -> bool: ...


#: What a stream's handler gets: each PUSH body (a ``headwater.protocol.messages.PushBody``),
#: then None once if the connection is lost.
PushHandler = Callable[[Any], None]


class PushStreamSpec(msgspec.Struct, frozen=True):
    """What a push stream opens (SUBSCRIBE's fields but the stream's id): subscriber ``name``
    of ``queue`` with ``credit_messages`` and ``credit_bytes`` to begin with. On a cluster,
    ``epoch`` (CLAIM_SUBSCRIBER's), ``positions`` (the partitions this broker leads, and where
    each starts) and ``tags`` make it a stream of those partitions only; a broker alone
    pushes the subscriber's own partitions from its stored checkpoints."""

    queue: str
    name: str
    credit_messages: int
    credit_bytes: int
    epoch: int = 0
    positions: dict[int, int] | None = None
    tags: list[str] | None = None


@runtime_checkable
class OpensPushStreams(Protocol):
    """Pushes a subscriber's messages as they come (push subscriptions over the network)."""

    def open_push_stream(self, spec: PushStreamSpec, handler: PushHandler) -> tuple[int, SubscriberInfo]: ...

    def ack_push_stream(
        self, stream_id: int, offsets: dict[int, int], credit_messages: int, credit_bytes: int
    ) -> concurrent.futures.Future[None]: ...

    def close_push_stream(self, stream_id: int) -> None: ...


@runtime_checkable
class AsyncOpensPushStreams(Protocol):
    """:class:`OpensPushStreams`, for asyncio."""

    def open_push_stream(self, spec: PushStreamSpec, handler: PushHandler) -> Awaitable[tuple[int, SubscriberInfo]]: ...

    def ack_push_stream(
        self, stream_id: int, offsets: dict[int, int], credit_messages: int, credit_bytes: int
    ) -> Awaitable[None]: ...

    def close_push_stream(self, stream_id: int) -> Awaitable[None]: ...


@runtime_checkable
class RoutesPushStreams(Protocol):
    """A cluster's service, on which a subscriber opens one push stream per partition leader
    (docs/design/cluster.md, "Subscriptions (built)"): the routing table to plan them by
    (a ``headwater.client.core.routing.RoutingTable``; asked for again when ``fresh``), and
    the connection to one broker, which :class:`OpensPushStreams`."""

    def stream_table(self, queue: str, fresh: bool = False) -> Any: ...

    def broker_link(self, broker_id: int) -> OpensPushStreams: ...


@runtime_checkable
class AsyncRoutesPushStreams(Protocol):
    """:class:`RoutesPushStreams`, for asyncio."""

    def stream_table(self, queue: str, fresh: bool = False) -> Awaitable[Any]: ...

    def broker_link(self, broker_id: int) -> Awaitable[AsyncOpensPushStreams]: ...


@runtime_checkable
class OpensFetchStreams(Protocol):
    """Pushes partitions' batches as they grow (fetch streams), sync and asyncio alike: the
    futures are concurrent.futures' for the sync client, asyncio's for the asyncio one."""

    def open_fetch_stream(
        self,
        queue: str,
        positions: dict[int, int],
        handler: PushHandler,
        *,
        credit_bytes: int,
        tag_mask: int = 0,
        push_bytes_max: int = 1 << 20,
    ) -> tuple[int, concurrent.futures.Future[None] | Awaitable[None]]: ...

    def credit_fetch_stream(
        self, stream_id: int, credit_bytes: int
    ) -> concurrent.futures.Future[None] | Awaitable[None]: ...

    def close_fetch_stream(self, stream_id: int) -> None: ...


class Reconnects(Protocol):
    """A connection that is made again after it is lost, for ``connect_timeout_s``;
    ``connect_failure``: why the last attempt gave up (None if none did)."""

    address: str
    connect_timeout_s: float
    connect_failure: BaseException | None

    def gave_up_connecting_since(self, t: float) -> bool:
        """Whether an attempt to connect begun after ``t`` (``time.monotonic()``) gave up."""
        ...


@runtime_checkable
class HasTransport(Protocol):
    """A service over a connection that comes back (reads ride out a broker's restart)."""

    transport: Reconnects


@runtime_checkable
class HasClock(Protocol):
    """A service whose clock producers in its process share (the embedded broker's: a
    producer turns ``delay=`` into times with it, so a test's movable clock moves both)."""

    clock: Callable[[], float]
