"""AsyncClient and AsyncAdmin: the :class:`~headwater.client.sync.client.Client` shape for asyncio.

Every name of the sync client is here with the same arguments; what waits for the broker is
a coroutine, what only builds an object (``producer()``, ``consumer()``, ``scanner()``) is a
plain call. Get one with ``await headwater.aio.connect("host:port")`` or
``await headwater.aio.open(path)``; the errors are the sync client's classes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from datetime import datetime

from headwater.client.aio.consumer import AsyncConsumer
from headwater.client.aio.group_consumer import AsyncGroupConsumer
from headwater.client.aio.keyed_consumer import AsyncKeyedConsumer
from headwater.client.aio.producer import AsyncProducer
from headwater.client.aio.scanner import AsyncScanner
from headwater.client.aio.service import AsyncBrokerService
from headwater.client.aio.shared_consumer import AsyncSharedConsumer
from headwater.client.aio.subscriber import AsyncSubscriber
from headwater.client.common.client import AdminBase
from headwater.client.common.twins import ASYNCIO
from headwater.client.core.lookups import find_bounds, record_for_id, records_with_key
from headwater.client.core.partitioner import PartitionFn
from headwater.client.core.reads import POLL_MESSAGES_DEFAULT, Bound
from headwater.client.sync.subscriber import Listener
from headwater.errors import InvalidArgumentError
from headwater.model.delay import DelayStats
from headwater.model.message import Message, MessageId, Record, required_epoch_ms

__all__ = ["AsyncAdmin", "AsyncClient"]

_UNSET = object()


class AsyncAdmin(AdminBase, driver=ASYNCIO):
    """Create, inspect and change queues; the methods of :class:`~headwater.Admin`, awaitable."""


class AsyncClient:
    """Admin, producing, consuming, scanning and lookups over one broker, for asyncio.

    ``async with`` (or ``await close()``) closes the producers and consumers it made, then
    the connection or the embedded broker.
    """

    def __init__(self, service: AsyncBrokerService) -> None:
        self._service = service
        self.admin = AsyncAdmin(service)
        self._default_producer: AsyncProducer | None = None
        # open producers and consumers, held until closed: one the application dropped may
        # still have work in flight, which close() must finish
        self._children: set[AsyncProducer | AsyncConsumer] = set()
        self._closed = False

    @property
    def service(self) -> AsyncBrokerService:
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
    ) -> AsyncProducer:
        """A producer; see :class:`~headwater.client.aio.producer.AsyncProducer` for every
        setting (``settings`` takes the rest: ``buffer_bytes_max``, ``metadata_max_age_ms``, ...).

        Closing the client closes its producers first, which sends what they hold.
        """
        p = AsyncProducer(
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
        **group_settings,
    ) -> AsyncConsumer:
        """A consumer of partitions you assign (:class:`~headwater.client.aio.consumer.AsyncConsumer`),
        or with ``subscribe`` a member of consumer group ``group``
        (:class:`~headwater.client.aio.group_consumer.AsyncGroupConsumer`, joining on its first
        ``poll``, ``start()`` or ``async with``); ``stream`` and ``group_settings`` as for the
        sync client."""
        if subscribe is None:
            if group_settings:
                raise InvalidArgumentError(
                    f"{', '.join(sorted(group_settings))} need subscribe=[queues]: they configure a "
                    f"group member, not a consumer of assigned partitions"
                )
            c = AsyncConsumer(
                self._service,
                group=group,
                auto_offset_reset=auto_offset_reset,
                fetch_bytes=fetch_bytes,
                max_poll_messages=max_poll_messages,
                tags=tags,
                stream=stream,
            )
        else:
            if group is None:
                raise InvalidArgumentError("subscribe= makes a group member: name its group with group='name'")
            c = AsyncGroupConsumer(
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
        **settings,
    ) -> AsyncSharedConsumer:
        """A member of shared group ``group`` on ``queue``
        (:class:`~headwater.client.aio.shared_consumer.AsyncSharedConsumer`); the arguments
        are the sync client's ``shared_consumer``."""
        c = AsyncSharedConsumer(
            self._service,
            group,
            queue,
            visibility_timeout_ms=visibility_timeout_ms,
            max_attempts=max_attempts,
            backoff_ms=backoff_ms,
            at_most_once=at_most_once,
            **settings,
        )
        self._adopt(c)  # type: ignore[arg-type]  # _adopt takes anything the client closes with it
        return c

    def keyed_consumer(
        self, group: str, queue: str, *, member: int, size: int, key: str = "key", start: str = "earliest", **settings
    ) -> AsyncKeyedConsumer:
        """Member ``member`` of keyed group ``group`` of ``size`` members on ``queue``
        (:class:`~headwater.client.aio.keyed_consumer.AsyncKeyedConsumer`, joining on its first
        ``poll``, ``start()`` or ``async with``); the arguments are the sync client's
        ``keyed_consumer``."""
        c = AsyncKeyedConsumer(self._service, group, queue, member=member, size=size, key=key, start=start, **settings)
        self._adopt(c)  # type: ignore[arg-type]  # _adopt takes anything the client closes with it
        return c

    def subscribe(self, queue: str, name: str, listeners: Iterable[Listener] = (), **settings) -> AsyncSubscriber:
        """Attach to subscriber ``name`` of ``queue`` (added with ``admin.add_subscriber`` or
        ``headwater subscriber add``) and start calling ``listeners`` (plain functions or
        coroutine functions, awaited), in order, for each record, in a task on the running
        loop. See :class:`~headwater.client.aio.subscriber.AsyncSubscriber` (``settings`` as
        for the sync client's ``subscribe``) and docs/subscriptions.md. Closing the client
        stops it, storing its checkpoint."""
        sub = AsyncSubscriber(self._service, queue, name, listeners, **settings)
        self._adopt(sub)  # type: ignore[arg-type]  # _adopt takes anything the client closes with it
        return sub

    def _adopt(self, child: AsyncProducer | AsyncConsumer) -> None:
        self._children = {c for c in self._children if not c.closed}
        self._children.add(child)

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
    ) -> AsyncScanner:
        """Scan a queue, one partition or several: ``async for r in hw.scanner("q")``.

        ``start`` is inclusive and ``stop`` exclusive; each is an offset for every partition,
        ``{partition: offset}``, or a message id (which pins the scan to its partition).
        ``start_time``/``end_time`` bound by append time, ``end_time`` exclusive.
        """
        return AsyncScanner(
            self._service,
            queue,
            partitions=partitions,
            start=start,
            stop=stop,
            start_time=start_time,
            end_time=end_time,
            tags=tags,
        )

    def _producer(self) -> AsyncProducer:
        if self._default_producer is None:
            self._default_producer = self.producer()
        return self._default_producer

    async def send(self, queue: str, body: bytes | Message, **kw) -> MessageId:
        """Send one message with the default producer and return its id once stored."""
        return await self._producer().send(queue, body, **kw)

    async def send_batch(self, queue: str, messages: Sequence[Message | bytes], **kw) -> Sequence[MessageId]:
        """Send messages with the default producer; their ids in the given order."""
        return await self._producer().send_batch(queue, messages, **kw)

    async def get(self, message_id: MessageId | str) -> Record:
        """The message with this id; :class:`MessageNotFoundError` if it is not retained."""
        mid = MessageId.parse(message_id)
        name, batch = await self._service.lookup_id(mid.queue_id, mid.partition, mid.offset)
        return record_for_id(mid, name, batch)

    async def find(
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
        return records_with_key(await self._service.lookup_key(queue, key, lo, hi, limit), queue, key, limit)

    async def offset_for_time(self, queue: str, partition: int, when: datetime | int) -> int:
        """The first offset of ``partition`` appended at or after ``when``."""
        return await self._service.offset_for_time(queue, partition, required_epoch_ms(when, "when"))  # type: ignore[arg-type]  # required_epoch_ms checks what it is given

    async def cancel(self, message_id: MessageId | str) -> None:
        """Cancel a delayed message not delivered yet (see :meth:`Client.cancel`)."""
        mid = MessageId.parse(message_id)
        await self._service.cancel_delayed(mid.queue_id, mid.partition, mid.offset)

    async def delay_stats(self) -> DelayStats:
        """The broker's schedule of delayed messages (see :meth:`Client.delay_stats`)."""
        return await self._service.delay_stats()

    async def status(self) -> dict[str, object]:
        """Facts about the broker: version, uptime, storage figures, recovery repairs."""
        return await self._service.status()

    async def close(self) -> None:
        """Close the producers (flushing them) and consumers made here, then the service."""
        if self._closed:
            return
        self._closed = True
        outcomes = await asyncio.gather(*(c.close() for c in list(self._children)), return_exceptions=True)
        await self._service.close()
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
