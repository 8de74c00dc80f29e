"""The facades a user holds, written once: :class:`AdminBase` and :class:`ClientBase`.

``Admin``/``Client`` and ``AsyncAdmin``/``AsyncClient`` are these bases with a driver
(:mod:`.twins`): a method that asks the broker blocks in one and is a coroutine in the other;
what only builds an object (``producer()``, ``scanner()``, ...) is a plain call in both, of
the classes each kind names (``_producer_class``, ...). ``close()`` stays in the subclasses.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any

from headwater.client.common.twins import Twins, Waits, waits
from headwater.client.core.lookups import find_bounds, record_for_id, records_with_key
from headwater.client.core.partitioner import PartitionFn
from headwater.client.core.reads import POLL_MESSAGES_DEFAULT, Bound
from headwater.client.transport.fetch_stream import STREAM_WINDOW_BYTES
from headwater.errors import InvalidArgumentError, QueueExistsError, QueueNotFoundError
from headwater.model.checks import check_int_arg, mapping_copy
from headwater.model.cluster import BrokerAddress, ClusterMetadata, PartitionMove
from headwater.model.config import QueueConfig, QueueInfo, is_internal_queue, validate_queue_name
from headwater.model.delay import DelayStats
from headwater.model.keyed import KeyedGroupInfo
from headwater.model.message import Message, MessageId, Record, required_epoch_ms
from headwater.model.service import MetricsExposition
from headwater.model.subscription import SubscriberInfo, subscriber_settings

__all__ = ["AdminBase", "ClientBase"]

_UNSET = object()


class AdminBase(Twins):
    """Create, inspect and change queues; each method is one broker call (a coroutine in
    :class:`~headwater.client.aio.client.AsyncAdmin`)."""

    def __init__(self, service: Any) -> None:
        self._service = service

    @waits
    def create_queue(
        self,
        name: str,
        *,
        partitions: int = 1,
        ttl_s: int | None | object = _UNSET,
        flush: str | None = None,
        message_bytes_max: int = 1024 * 1024,
        settings: dict[str, str] | None = None,
        exist_ok: bool = False,
    ) -> Waits[QueueInfo]:
        """Create a queue.

        ``ttl_s``: seconds a message is kept (default 7 days; ``None`` keeps forever).
        ``flush``: ``"sync"`` or ``"async"`` (default: the broker's policy).
        ``exist_ok``: if a queue of that name is there already, return it as it is (its
        partitions and settings may differ from these) instead of raising
        :class:`~headwater.errors.QueueExistsError`; Kafka's ``--if-not-exists``.
        """
        validate_queue_name(name)
        kw = {} if ttl_s is _UNSET else {"ttl_s": ttl_s}
        config = QueueConfig(
            partitions=partitions,
            flush=flush,
            message_bytes_max=message_bytes_max,
            settings=mapping_copy(settings or {}),
            **kw,
        ).validated()
        try:
            return (yield self._service.create_queue(name, config))
        except QueueExistsError:
            if not exist_ok:
                raise
            return (yield self._service.describe_queue(name))

    @waits
    def describe_queue(self, name: str) -> Waits[QueueInfo]:
        """The queue's settings, partitions and their offsets."""
        return (yield self._service.describe_queue(name))

    @waits
    def list_queues(self) -> Waits[list[QueueInfo]]:
        """Every queue, described, in name order (asked for a page at a time: a broker of
        many partitions answers in several requests)."""
        queues: list[QueueInfo] = []
        after = None
        while True:
            page = yield self._service.list_queues(after)
            queues += page.queues
            if page.next_after is None:
                return queues
            after = page.next_after

    @waits
    def delete_queue(self, name: str, *, missing_ok: bool = False) -> Waits[None]:
        """Delete a queue and all its messages. ``missing_ok``: a queue that is not there is
        not an error (:class:`~headwater.errors.QueueNotFoundError` otherwise)."""
        try:
            yield self._service.delete_queue(name)
        except QueueNotFoundError:
            if not missing_ok:
                raise

    @waits
    def truncate_queue(self, name: str) -> Waits[QueueInfo]:
        """Drop every message, keep the queue and its settings. Offsets keep counting up."""
        return (yield self._service.truncate_queue(name))

    @waits
    def disable_queue(self, name: str) -> Waits[QueueInfo]:
        """Refuse reads and writes (with QueueDisabledError) until enabled again."""
        return (yield self._service.set_queue_enabled(name, False))

    @waits
    def enable_queue(self, name: str) -> Waits[QueueInfo]:
        """Accept reads and writes again after ``disable_queue``."""
        return (yield self._service.set_queue_enabled(name, True))

    @waits
    def alter_queue(
        self,
        name: str,
        *,
        ttl_s: int | None | object = _UNSET,
        message_bytes_max: int | object = _UNSET,
        flush: str | None | object = _UNSET,
    ) -> Waits[QueueInfo]:
        """Change a queue's settings after creation (``kafka-configs --alter``): only those
        given change. ``ttl_s`` None keeps messages forever; ``flush`` None follows the
        store's default. Each value is checked as :meth:`create_queue` checks it, and the
        change is durable (and, on a cluster, made by the controller and followed by every
        broker). Retention applies a shorter ``ttl_s`` at its next pass; a smaller
        ``message_bytes_max`` refuses bigger messages from now on, keeping those stored.

        >>> import headwater, tempfile
        >>> with headwater.open(tempfile.mkdtemp()) as hw:
        ...     _ = hw.admin.create_queue("events")
        ...     hw.admin.alter_queue("events", ttl_s=3600).config.ttl_s
        3600
        """
        given = {"ttl_s": ttl_s, "message_bytes_max": message_bytes_max, "flush": flush}
        changes = {k: v for k, v in given.items() if v is not _UNSET}
        if not changes:
            raise InvalidArgumentError("nothing to alter: give ttl_s, message_bytes_max or flush")
        return (yield self._service.alter_queue(name, changes))

    @waits
    def add_partitions(self, name: str, partitions: int) -> Waits[QueueInfo]:
        """Grow the queue to ``partitions`` partitions in total."""
        check_int_arg(partitions, "a partition count")
        return (yield self._service.add_partitions(name, partitions))

    # where things are (a broker alone is a cluster of one, naming itself)
    @waits
    def cluster_metadata(self, queues: Sequence[str] | None = None) -> Waits[ClusterMetadata]:
        """The cluster's brokers, its controller, and each partition's leader of ``queues``
        (default: every queue). A broker running alone answers naming itself (broker id -1)."""
        if queues is not None:
            if isinstance(queues, str):
                raise InvalidArgumentError(f"queues must be a list of queue names, not one name: [{queues!r}]")
            for name in queues:
                if not is_internal_queue(name):  # the broker's own queues may be asked about too
                    validate_queue_name(name)
        return (yield self._service.metadata(None if queues is None else list(queues)))

    @waits
    def queue_locations(self, name: str) -> Waits[dict[int, BrokerAddress | None]]:
        """Each partition of the queue and the broker that leads it (``None`` while it has
        no leader), as HQueue's ``getQueueLocations``: to run work near the data."""
        validate_queue_name(name)
        md = yield self._service.metadata([name])
        return {p.partition: md.broker(p.leader) for p in md.queue(name).partitions}

    # metrics (docs/metrics.md)
    @waits
    def metrics(self) -> Waits[str]:
        """The broker's Prometheus metrics, in the text exposition format (what a scrape of
        ``/metrics`` returns; ``headwater metrics``). On a cluster: the broker this client
        was started with; scrape each broker for all of them. A broker whose metrics are off
        raises :class:`~headwater.errors.UsageError` saying how to turn them on."""
        return (yield self._service.metrics()).text

    @waits
    def metrics_exposition(self) -> Waits[MetricsExposition]:
        """:meth:`metrics` with the HTTP content type to serve it with (an HTTP gateway's
        ``/metrics``)."""
        return (yield self._service.metrics())

    # moving partitions between a cluster's brokers (docs/cluster.md)
    @waits
    def rebalance(self, dry_run: bool = False) -> Waits[list[PartitionMove]]:
        """Plan the fewest partition moves that balance the cluster's live brokers and, unless
        ``dry_run``, start them (they run in the background: ``cluster_metadata().moves``
        shows those not finished); the moves planned. Not sent again once it may have
        reached the broker (a second would plan over the first's moves)."""
        return (yield self._service.rebalance(bool(dry_run)))

    @waits
    def decommission(self, broker_id: int, dry_run: bool = False) -> Waits[list[PartitionMove]]:
        """Plan the moves of every partition off broker ``broker_id`` and, unless
        ``dry_run``, start them; the moves planned. An unknown broker is
        :class:`~headwater.errors.InvalidArgumentError`."""
        check_int_arg(broker_id, "a broker id")
        return (yield self._service.decommission(broker_id, bool(dry_run)))

    # consumer groups
    @waits
    def delete_group(self, group: str, *, queue: str | None = None) -> Waits[None]:
        """Delete a consumer group's committed offsets (on ``queue`` alone, if given), as
        ``kafka-consumer-groups --delete`` does: afterwards a new member starts from its reset
        policy, and ``list_groups`` no longer shows the group. Durable (survives restarts).

        Raises :class:`~headwater.errors.GroupNotEmptyError` while the group has live
        members and :class:`~headwater.errors.GroupNotFoundError` if it has no committed
        offsets (on ``queue``)."""
        return (yield self._service.delete_group(group, queue))

    # keyed groups (headwater.client.sync.keyed_consumer, headwater.client.aio.keyed_consumer)
    @waits
    def describe_keyed_group(self, group: str, queue: str) -> Waits[KeyedGroupInfo]:
        """A keyed group's size, key, generation, positions and any resize under way."""
        return (yield self._service.keyed_group(queue, group))

    @waits
    def resize_keyed_group(self, group: str, queue: str, size: int) -> Waits[KeyedGroupInfo]:
        """Change a keyed group's number of members, safely for per-key order: members of
        the current size drain up to a barrier (the end offsets now), then the new size
        applies from it. Returns at once; ``describe_keyed_group`` shows the progress.
        Resizing to 0 is an error; to the current size, nothing."""
        return (yield self._service.keyed_resize(queue, group, size))

    # push subscribers (attach to one with the client's ``subscribe``)
    @waits
    def add_subscriber(
        self,
        queue: str,
        name: str,
        *,
        partitions: int | Iterable[int] | None = None,
        tags: str | Iterable[str] | None = None,
        start: str | datetime | int = "latest",
    ) -> Waits[SubscriberInfo]:
        """Register subscriber ``name`` on ``queue``; processes attach with ``client.subscribe``.

        ``partitions``: the ones followed (all, and those added later, by default).
        ``tags``: the ones delivered (every message by default, or ``"*"``).
        ``start``: ``"latest"`` (what is appended from now on), ``"earliest"``, a time
        (datetime or epoch ms: the first message appended at or after it), or
        ``"offset:N"`` (that offset in each partition, kept within what it holds).
        :class:`SubscriberExistsError` if the name is taken.
        """
        return (yield self._service.add_subscriber(queue, name, *subscriber_settings(partitions, tags, start)))

    @waits
    def delete_subscriber(self, queue: str, name: str) -> Waits[None]:
        """Remove a subscriber and its checkpoint; a process attached to it stops."""
        yield self._service.delete_subscriber(queue, name)

    @waits
    def list_subscribers(self, queue: str | None = None) -> Waits[list[SubscriberInfo]]:
        """The subscribers of ``queue``, or of every queue."""
        return (yield self._service.list_subscribers(queue))

    @waits
    def describe_subscriber(self, queue: str, name: str) -> Waits[SubscriberInfo]:
        """A subscriber's settings, checkpoint and attached process, if any."""
        return (yield self._service.describe_subscriber(queue, name))


class ClientBase(Twins):
    """Admin, producing, consuming, scanning and lookups over one broker service.

    A subclass names its admin and the classes its factories build, keeps track of what
    it must close with :meth:`_adopt`, and says which method of its producer sends one
    message and waits for its id (``_send_and_wait``).
    """

    _admin_class: type[AdminBase]
    _producer_class: type
    _consumer_class: type
    _group_consumer_class: type
    _shared_consumer_class: type
    _keyed_consumer_class: type
    _subscriber_class: type
    _scanner_class: type
    # a function of (producer, queue, body, **kw): the id once stored, or an awaitable of it
    _send_and_wait: Callable[..., Any]

    def __init__(self, service: Any) -> None:
        self._service = service
        self.admin = self._admin_class(service)
        self._default_producer: Any = None

    @property
    def service(self) -> Any:
        """The broker service this client calls (embedded or over the network)."""
        return self._service

    def _adopt(self, child: Any) -> None:
        """Hold ``child`` (a producer, consumer or subscriber just made) if ``close()`` must
        close it."""
        raise NotImplementedError

    def producer(
        self,
        *,
        partitioner: str | PartitionFn = "default",
        compression: str | None = None,
        linger_ms: int = 0,
        batch_bytes_max: int = 1 << 20,
        retries: int = 5,
        retry_backoff_ms: int = 100,
        delivery_timeout_ms: int = 120_000,
        idempotent: bool = True,
        **settings: Any,
    ) -> Any:
        """A producer; see :class:`~headwater.client.sync.producer.Producer` or
        :class:`~headwater.client.aio.producer.AsyncProducer` for every setting (``settings``
        takes the rest: ``buffer_bytes_max``, ``max_block_ms``, ``metadata_max_age_ms``, ...).

        Closing the client closes its producers first, which sends what they hold.
        """
        p = self._producer_class(
            self._service,
            partitioner=partitioner,
            compression=compression,
            linger_ms=linger_ms,
            batch_bytes_max=batch_bytes_max,
            retries=retries,
            retry_backoff_ms=retry_backoff_ms,
            delivery_timeout_ms=delivery_timeout_ms,
            idempotent=idempotent,
            **settings,
        )
        self._adopt(p)
        return p

    def consumer(
        self,
        *,
        group: str | None = None,
        subscribe: str | Iterable[str] | None = None,
        auto_offset_reset: str = "earliest",
        fetch_bytes: int = 1024 * 1024,
        max_poll_messages: int = POLL_MESSAGES_DEFAULT,
        tags: str | Iterable[str] | None = None,
        stream: bool = True,
        stream_window_bytes: int = STREAM_WINDOW_BYTES,
        **group_settings: Any,
    ) -> Any:
        """A consumer.

        Without ``subscribe``: the simple form, reading the partitions you ``assign()``
        (:class:`~headwater.client.sync.consumer.Consumer`,
        :class:`~headwater.client.aio.consumer.AsyncConsumer`); ``group`` only names where
        ``commit`` stores positions. ``stream`` (True, for both forms; over the network): the
        broker pushes the partitions' new batches as they are appended (a fetch stream)
        instead of answering a FETCH per batch: less work per message on both sides and the
        lowest latency; ``stream=False`` fetches. See docs/design/client.md. Embedded, it
        changes nothing. ``stream_window_bytes`` (4 MiB): the bytes of pushes a stream may
        have unread before the broker waits for the consumer (about twice that is held at
        most); more keeps the broker ahead of a consumer reading many small batches.

        With ``subscribe`` (a queue or a list): a member of consumer group ``group``
        (:class:`~headwater.client.sync.group_consumer.GroupConsumer`,
        :class:`~headwater.client.aio.group_consumer.AsyncGroupConsumer`) whose partitions
        come from the group; the asyncio member joins on its first ``poll``, ``start()`` or
        ``async with``. ``group_settings``: ``mode`` (``"clustering"``, the default, or
        ``"broadcast"``), ``strategy`` (``"average"`` or ``"sticky"``),
        ``session_timeout_ms`` (10000), ``heartbeat_interval_ms``, ``max_poll_interval_ms``,
        ``on_assign``, ``on_revoke``, ``commit_on_revoke``, ``offsets_path`` (broadcast),
        ``client_id``. See docs/consumer-groups.md.
        """
        reading = {
            "auto_offset_reset": auto_offset_reset,
            "fetch_bytes": fetch_bytes,
            "max_poll_messages": max_poll_messages,
            "tags": tags,
            "stream": stream,
            "stream_window_bytes": stream_window_bytes,
        }
        if subscribe is None:
            if group_settings:
                raise InvalidArgumentError(
                    f"{', '.join(sorted(group_settings))} need subscribe=[queues]: they configure a "
                    f"group member, not a consumer of assigned partitions"
                )
            c = self._consumer_class(self._service, group=group, **reading)
        else:
            if group is None:
                raise InvalidArgumentError("subscribe= makes a group member: name its group with group='name'")
            c = self._group_consumer_class(self._service, group=group, subscribe=subscribe, **reading, **group_settings)
        self._adopt(c)
        return c

    def shared_consumer(
        self,
        group: str,
        queue: str,
        *,
        visibility_timeout_ms: int = 30_000,
        max_attempts: int = 5,
        backoff_ms: int = 1_000,
        at_most_once: bool = False,
        **settings: Any,
    ) -> Any:
        """A member of shared group ``group`` on ``queue``: messages from any partition,
        each leased for ``visibility_timeout_ms``, acked or nacked one by one, dead-lettered
        to ``<queue>.dlq`` after ``max_attempts``; see
        :class:`~headwater.client.sync.shared_consumer.SharedConsumer` or
        :class:`~headwater.client.aio.shared_consumer.AsyncSharedConsumer` (``settings`` takes
        ``backoff_multiplier``, ``backoff_max_ms``, ``in_flight_max``, ``member``)."""
        c = self._shared_consumer_class(
            self._service,
            group,
            queue,
            visibility_timeout_ms=visibility_timeout_ms,
            max_attempts=max_attempts,
            backoff_ms=backoff_ms,
            at_most_once=at_most_once,
            **settings,
        )
        self._adopt(c)
        return c

    def keyed_consumer(
        self, group: str, queue: str, *, member: int, size: int, key: str = "key", start: str = "earliest", **settings
    ) -> Any:
        """Member ``member`` of keyed group ``group`` of ``size`` members on ``queue``: it
        receives exactly the messages whose ``key`` (``"key"``, or ``"property:NAME"``)
        hashes to it, in order per key; see :class:`~headwater.client.sync.keyed_consumer.KeyedConsumer`
        or :class:`~headwater.client.aio.keyed_consumer.AsyncKeyedConsumer` (which joins on
        its first ``poll``, ``start()`` or ``async with``); ``settings``: ``fetch_bytes``,
        ``max_poll_messages``, ``refresh_ms``. See docs/keyed-groups.md."""
        c = self._keyed_consumer_class(
            self._service, group, queue, member=member, size=size, key=key, start=start, **settings
        )
        self._adopt(c)
        return c

    def subscribe(
        self, queue: str, name: str, listeners: Iterable[Callable[[Record], Any]] = (), **settings: Any
    ) -> Any:
        """Attach to subscriber ``name`` of ``queue`` (added with ``admin.add_subscriber`` or
        ``headwater subscriber add``) and start calling ``listeners``, in order, for each
        record; the broker pushes new messages as they arrive. See
        :class:`~headwater.client.sync.subscriber.Subscriber` (``settings``: ``credit_messages``,
        ``credit_bytes``, ``checkpoint_interval_ms``, ``on_error``, ``start``) and
        docs/subscriptions.md. The asyncio one
        (:class:`~headwater.client.aio.subscriber.AsyncSubscriber`) takes plain functions or
        coroutine functions (awaited) and runs in a task on the running loop. Closing the
        client stops it, storing its checkpoint."""
        sub = self._subscriber_class(self._service, queue, name, listeners, **settings)
        self._adopt(sub)
        return sub

    def scanner(
        self,
        queue: str,
        *,
        partitions: int | Iterable[int] | None = None,
        start: Bound = None,
        stop: Bound = None,
        start_time: datetime | int | None = None,
        end_time: datetime | int | None = None,
        tags: str | Iterable[str] | None = None,
    ) -> Any:
        """Scan a queue, one partition or several: ``for r in hw.scanner("q")``, or
        ``async for`` with the asyncio client; see :class:`~headwater.client.sync.scanner.Scanner`.

        ``start`` is inclusive and ``stop`` exclusive; each is an offset for every partition,
        ``{partition: offset}``, or a message id (which pins the scan to its partition).
        ``start_time``/``end_time`` bound by append time, ``end_time`` exclusive.
        """
        return self._scanner_class(
            self._service,
            queue,
            partitions=partitions,
            start=start,
            stop=stop,
            start_time=start_time,
            end_time=end_time,
            tags=tags,
        )

    def _producer(self) -> Any:
        if self._default_producer is None:
            self._default_producer = self.producer()
        return self._default_producer

    @waits
    def send(self, queue: str, body: bytes | Message, **kw: Any) -> Waits[MessageId]:
        """Send one message with the default producer (key hash, else round robin) and
        return its id once stored (the blocking producer's ``send_and_wait``). For many
        messages, ``send_batch`` or a producer's ``send()`` is much faster.

        ``deliver_at=`` (datetime or epoch ms) or ``delay=`` (timedelta or seconds) delay
        the message; the id returned is then its delayed id, good for :meth:`cancel` and
        :meth:`get` (docs/producing.md, "Delayed messages")."""
        return (yield self._send_and_wait(self._producer(), queue, body, **kw))

    @waits
    def send_batch(self, queue: str, messages: Sequence[Message | bytes], **kw: Any) -> Waits[Sequence[MessageId]]:
        """Send messages with the default producer; their ids in the given order."""
        return (yield self._producer().send_batch(queue, messages, **kw))

    @waits
    def get(self, message_id: MessageId | str) -> Waits[Record]:
        """The message with this id; :class:`MessageNotFoundError` if it is not retained.

        For a delayed id: the message while it waits (its ``partition`` has the delayed
        bit, ``timestamp_ms`` is when it was accepted), and once delivered, the message as
        stored in its partition (with its own id there), while the broker keeps its
        schedule (until the bucket of its deliver time is reclaimed)."""
        mid = MessageId.parse(message_id)
        name, batch = yield self._service.lookup_id(mid.queue_id, mid.partition, mid.offset)
        return record_for_id(mid, name, batch)

    @waits
    def find(
        self,
        queue: str,
        key: bytes,
        *,
        start_time: datetime | int | None = None,
        end_time: datetime | int | None = None,
        limit: int = 1000,
    ) -> Waits[list[Record]]:
        """Messages of ``queue`` whose key is ``key``, appended in [start_time, end_time),
        oldest first."""
        lo, hi = find_bounds(key, limit, start_time, end_time)
        found = yield self._service.lookup_key(queue, key, lo, hi, limit)
        return records_with_key(found, queue, key, limit)

    @waits
    def offset_for_time(self, queue: str, partition: int, when: datetime | int) -> Waits[int]:
        """The first offset of ``partition`` appended at or after ``when``."""
        return (yield self._service.offset_for_time(queue, partition, required_epoch_ms(when, "when")))

    @waits
    def cancel(self, message_id: MessageId | str) -> Waits[None]:
        """Cancel a delayed message that is not delivered yet, by the id its send returned.

        Cancelling it again is fine. Raises :class:`MessageNotFoundError` if no delayed
        message has that id or it was already delivered (the error names its id in the
        queue); an id of a message in a partition's log cannot be cancelled.

        >>> import headwater, tempfile
        >>> hw = headwater.open(tempfile.mkdtemp())
        >>> _ = hw.admin.create_queue("reminders")
        >>> mid = hw.send("reminders", b"call back", delay=3600)
        >>> mid.is_delayed
        True
        >>> hw.cancel(mid)
        >>> hw.delay_stats().pending_messages
        0
        >>> hw.close()
        """
        mid = MessageId.parse(message_id)
        yield self._service.cancel_delayed(mid.queue_id, mid.partition, mid.offset)

    @waits
    def delay_stats(self) -> Waits[DelayStats]:
        """The broker's schedule of delayed messages: pending per bucket, next due time,
        deliveries per second and their lateness (``headwater delay stats``)."""
        return (yield self._service.delay_stats())

    @waits
    def status(self) -> Waits[dict[str, object]]:
        """Facts about the broker: version, uptime, storage figures, recovery repairs."""
        return (yield self._service.status())
