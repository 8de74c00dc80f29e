"""Client: the handle a user holds, the same whether the broker is embedded or remote."""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Sequence
from datetime import datetime

from headwater.client.common.client import AdminBase
from headwater.client.common.twins import BLOCKING
from headwater.client.core.lookups import find_bounds, record_for_id, records_with_key
from headwater.client.core.partitioner import PartitionFn
from headwater.client.core.reads import POLL_MESSAGES_DEFAULT, Bound
from headwater.client.sync.consumer import Consumer
from headwater.client.sync.group_consumer import GroupConsumer
from headwater.client.sync.keyed_consumer import KeyedConsumer
from headwater.client.sync.producer import Producer
from headwater.client.sync.scanner import Scanner
from headwater.client.sync.shared_consumer import SharedConsumer
from headwater.client.sync.subscriber import Listener, Subscriber
from headwater.errors import InvalidArgumentError
from headwater.model.delay import DelayStats
from headwater.model.message import Message, MessageId, Record, required_epoch_ms
from headwater.model.service import BrokerService

__all__ = ["Admin", "Client"]

_UNSET = object()


class Admin(AdminBase, driver=BLOCKING):
    """Create, inspect and change queues."""


class Client:
    """Admin, producing, scanning and lookups over one broker.

    Get one with ``headwater.open(path)`` (embedded) or, once the network client lands,
    ``headwater.connect("host:port")``: both return this shape.
    """

    def __init__(self, service: BrokerService) -> None:
        self._service = service
        self.admin = Admin(service)
        self._default_producer: Producer | None = None
        self._producers: weakref.WeakSet[Producer] = weakref.WeakSet()  # flushed by close()
        self._members: weakref.WeakSet[GroupConsumer] = weakref.WeakSet()  # leave their groups on close()
        self._subscribers: weakref.WeakSet[Subscriber] = weakref.WeakSet()  # stopped by close()

    @property
    def service(self) -> BrokerService:
        return self._service

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
        **settings,
    ) -> Producer:
        """A producer; see :class:`~headwater.client.sync.producer.Producer` for every setting
        (``settings`` takes the rest: ``buffer_bytes_max``, ``max_block_ms``, ...).

        Closing the client closes its producers first, which sends what they hold.
        """
        p = Producer(
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
        self._producers.add(p)
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
        **group_settings,
    ) -> Consumer:
        """A consumer.

        Without ``subscribe``: the simple form, reading the partitions you ``assign()``
        (:class:`~headwater.client.sync.consumer.Consumer`); ``group`` only names where ``commit``
        stores positions. ``stream`` (True, for both forms; over the network): the broker
        pushes the partitions' new batches as they are appended (a fetch stream) instead of
        answering a FETCH per batch: less work per message on both sides and the lowest
        latency; ``stream=False`` fetches. See docs/design/client.md. Embedded, it changes
        nothing.

        With ``subscribe`` (a queue or a list): a member of consumer group ``group``
        (:class:`~headwater.client.sync.group_consumer.GroupConsumer`) whose partitions come from
        the group. ``group_settings``: ``mode`` (``"clustering"``, the default, or
        ``"broadcast"``), ``strategy`` (``"average"`` or ``"sticky"``),
        ``session_timeout_ms`` (10000), ``heartbeat_interval_ms``, ``max_poll_interval_ms``,
        ``on_assign``, ``on_revoke``, ``commit_on_revoke``, ``offsets_path`` (broadcast),
        ``client_id``. See docs/consumer-groups.md.
        """
        if subscribe is None:
            if group_settings:
                raise InvalidArgumentError(
                    f"{', '.join(sorted(group_settings))} need subscribe=[queues]: they configure a "
                    f"group member, not a consumer of assigned partitions"
                )
            return Consumer(
                self._service,
                group=group,
                auto_offset_reset=auto_offset_reset,
                fetch_bytes=fetch_bytes,
                max_poll_messages=max_poll_messages,
                tags=tags,
                stream=stream,
            )
        if group is None:
            raise InvalidArgumentError("subscribe= makes a group member: name its group with group='name'")
        member = GroupConsumer(
            self._service,
            group=group,
            subscribe=subscribe,
            auto_offset_reset=auto_offset_reset,
            fetch_bytes=fetch_bytes,
            max_poll_messages=max_poll_messages,
            tags=tags,
            stream=stream,
            **group_settings,
        )
        self._members.add(member)
        return member

    def shared_consumer(
        self,
        group: str,
        queue: str,
        *,
        visibility_timeout_ms: int = 30_000,
        max_attempts: int = 5,
        backoff_ms: int = 1_000,
        at_most_once: bool = False,
        **settings,
    ) -> SharedConsumer:
        """A member of shared group ``group`` on ``queue``: messages from any partition,
        each leased for ``visibility_timeout_ms``, acked or nacked one by one, dead-lettered
        to ``<queue>.dlq`` after ``max_attempts``; see
        :class:`~headwater.client.sync.shared_consumer.SharedConsumer` (``settings`` takes
        ``backoff_multiplier``, ``backoff_max_ms``, ``in_flight_max``, ``member``)."""
        return SharedConsumer(
            self._service,
            group,
            queue,
            visibility_timeout_ms=visibility_timeout_ms,
            max_attempts=max_attempts,
            backoff_ms=backoff_ms,
            at_most_once=at_most_once,
            **settings,
        )

    def keyed_consumer(
        self, group: str, queue: str, *, member: int, size: int, key: str = "key", start: str = "earliest", **settings
    ) -> KeyedConsumer:
        """Member ``member`` of keyed group ``group`` of ``size`` members on ``queue``: it
        receives exactly the messages whose ``key`` (``"key"``, or ``"property:NAME"``)
        hashes to it, in order per key; see :class:`~headwater.client.sync.keyed_consumer.KeyedConsumer`
        (``settings``: ``fetch_bytes``, ``max_poll_messages``, ``refresh_ms``) and
        docs/keyed-groups.md."""
        return KeyedConsumer(self._service, group, queue, member=member, size=size, key=key, start=start, **settings)

    def subscribe(self, queue: str, name: str, listeners: Iterable[Listener] = (), **settings) -> Subscriber:
        """Attach to subscriber ``name`` of ``queue`` (added with ``admin.add_subscriber`` or
        ``headwater subscriber add``) and start calling ``listeners``, in order, for each
        record; the broker pushes new messages as they arrive. See
        :class:`~headwater.client.sync.subscriber.Subscriber` (``settings``: ``credit_messages``,
        ``credit_bytes``, ``checkpoint_interval_ms``, ``on_error``, ``start``) and
        docs/subscriptions.md."""
        sub = Subscriber(self._service, queue, name, listeners, **settings)
        self._subscribers.add(sub)
        return sub

    def _producer(self) -> Producer:
        if self._default_producer is None:
            self._default_producer = self.producer()
        return self._default_producer

    def send(self, queue: str, body: bytes | Message, **kw) -> MessageId:
        """Send one message with the default producer (key hash, else round robin) and
        return its id once stored: :meth:`Producer.send_and_wait`. For many messages,
        ``send_batch`` or a producer's ``send()`` is much faster.

        ``deliver_at=`` (datetime or epoch ms) or ``delay=`` (timedelta or seconds) delay
        the message; the id returned is then its delayed id, good for :meth:`cancel` and
        :meth:`get` (docs/producing.md, "Delayed messages")."""
        return self._producer().send_and_wait(queue, body, **kw)

    def send_batch(self, queue: str, messages: Sequence[Message | bytes], **kw) -> Sequence[MessageId]:
        return self._producer().send_batch(queue, messages, **kw)

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
    ) -> Scanner:
        """Scan a queue, one partition or several; see :class:`~headwater.client.sync.scanner.Scanner`.

        ``start`` is inclusive and ``stop`` exclusive; each is an offset for every partition,
        ``{partition: offset}``, or a message id (which pins the scan to its partition).
        ``start_time``/``end_time`` bound by append time, ``end_time`` exclusive.
        """
        return Scanner(
            self._service,
            queue,
            partitions=partitions,
            start=start,
            stop=stop,
            start_time=start_time,
            end_time=end_time,
            tags=tags,
        )

    def get(self, message_id: MessageId | str) -> Record:
        """The message with this id; :class:`MessageNotFoundError` if it is not retained.

        For a delayed id: the message while it waits (its ``partition`` has the delayed
        bit, ``timestamp_ms`` is when it was accepted), and once delivered, the message as
        stored in its partition (with its own id there), while the broker keeps its
        schedule (until the bucket of its deliver time is reclaimed)."""
        mid = MessageId.parse(message_id)
        name, batch = self._service.lookup_id(mid.queue_id, mid.partition, mid.offset)
        return record_for_id(mid, name, batch)

    def find(
        self,
        queue: str,
        key: bytes,
        *,
        start_time: datetime | int | None = None,
        end_time: datetime | int | None = None,
        limit: int = 1000,
    ) -> list[Record]:
        """Messages of ``queue`` whose key is ``key``, appended in [start_time, end_time),
        oldest first."""
        lo, hi = find_bounds(key, limit, start_time, end_time)
        return records_with_key(self._service.lookup_key(queue, key, lo, hi, limit), queue, key, limit)

    def offset_for_time(self, queue: str, partition: int, when: datetime | int) -> int:
        """The first offset of ``partition`` appended at or after ``when``."""
        return self._service.offset_for_time(queue, partition, required_epoch_ms(when, "when"))

    def cancel(self, message_id: MessageId | str) -> None:
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
        self._service.cancel_delayed(mid.queue_id, mid.partition, mid.offset)

    def delay_stats(self) -> DelayStats:
        """The broker's schedule of delayed messages: pending per bucket, next due time,
        deliveries per second and their lateness (``headwater delay stats``)."""
        return self._service.delay_stats()

    def status(self) -> dict[str, object]:
        """Facts about the broker: version, uptime, storage figures, recovery repairs."""
        return self._service.status()

    def close(self) -> None:
        for c in list(self._members):
            c.close()  # commits (commit_on_revoke) and leaves while the connection is up
        for s in list(self._subscribers):
            s.stop()  # their last checkpoints go out before the connection closes
        for p in list(self._producers):
            p.close()
        self._service.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
