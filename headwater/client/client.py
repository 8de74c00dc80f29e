"""Client: the handle a user holds, the same whether the broker is embedded or remote."""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Sequence
from datetime import datetime

from headwater.errors import InvalidArgumentError, MessageNotFoundError
from headwater.model.config import QueueConfig, QueueInfo, validate_queue_name
from headwater.model.message import Message, MessageId, Record, to_epoch_ms
from headwater.model.service import BrokerService
from headwater.client.partitioner import PartitionFn
from headwater.client.consumer import Consumer
from headwater.client.producer import Producer
from headwater.client.scanner import Bound, Scanner, decode_stored

__all__ = ["Admin", "Client"]

_UNSET = object()


class Admin:
    """Create, inspect and change queues."""

    def __init__(self, service: BrokerService) -> None:
        self._service = service

    def create_queue(self, name: str, *, partitions: int = 1, ttl_s: int | None | object = _UNSET,
                     flush: str | None = None, message_bytes_max: int = 1024 * 1024,
                     settings: dict[str, str] | None = None) -> QueueInfo:
        """Create a queue.

        ``ttl_s``: seconds a message is kept (default 7 days; ``None`` keeps forever).
        ``flush``: ``"sync"`` or ``"async"`` (default: the broker's policy).
        """
        validate_queue_name(name)
        kw = {} if ttl_s is _UNSET else {"ttl_s": ttl_s}
        config = QueueConfig(partitions=partitions, flush=flush, message_bytes_max=message_bytes_max,
                             settings=dict(settings or {}), **kw).validated()
        return self._service.create_queue(name, config)

    def describe_queue(self, name: str) -> QueueInfo:
        return self._service.describe_queue(name)

    def list_queues(self) -> list[QueueInfo]:
        return self._service.list_queues()

    def delete_queue(self, name: str) -> None:
        self._service.delete_queue(name)

    def truncate_queue(self, name: str) -> QueueInfo:
        """Drop every message, keep the queue and its settings. Offsets keep counting up."""
        return self._service.truncate_queue(name)

    def disable_queue(self, name: str) -> QueueInfo:
        """Refuse reads and writes (with QueueDisabledError) until enabled again."""
        return self._service.set_queue_enabled(name, False)

    def enable_queue(self, name: str) -> QueueInfo:
        return self._service.set_queue_enabled(name, True)

    def add_partitions(self, name: str, partitions: int) -> QueueInfo:
        """Grow the queue to ``partitions`` partitions in total."""
        return self._service.add_partitions(name, partitions)


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

    @property
    def service(self) -> BrokerService:
        return self._service

    def producer(self, *, partitioner: str | PartitionFn = "default", compression: str | None = None,
                 linger_ms: int = 0, batch_bytes_max: int = 1 << 20, retries: int = 5,
                 retry_backoff_ms: int = 100, delivery_timeout_ms: int = 120_000,
                 idempotent: bool = True, **settings) -> Producer:
        """A producer; see :class:`~headwater.client.producer.Producer` for every setting
        (``settings`` takes the rest: ``buffer_bytes_max``, ``max_block_ms``, ...).

        Closing the client closes its producers first, which sends what they hold.
        """
        p = Producer(self._service, partitioner=partitioner, compression=compression,
                     linger_ms=linger_ms, batch_bytes_max=batch_bytes_max, retries=retries,
                     retry_backoff_ms=retry_backoff_ms, delivery_timeout_ms=delivery_timeout_ms,
                     idempotent=idempotent, **settings)
        self._producers.add(p)
        return p

    def consumer(self, *, group: str | None = None, auto_offset_reset: str = "earliest",
                 fetch_bytes: int = 1024 * 1024, max_poll_messages: int = 500,
                 tags: str | Iterable[str] | None = None) -> Consumer:
        """A consumer of partitions you assign; see :class:`~headwater.client.consumer.Consumer`."""
        return Consumer(self._service, group=group, auto_offset_reset=auto_offset_reset,
                        fetch_bytes=fetch_bytes, max_poll_messages=max_poll_messages, tags=tags)

    def _producer(self) -> Producer:
        if self._default_producer is None:
            self._default_producer = self.producer()
        return self._default_producer

    def send(self, queue: str, body: bytes | Message, **kw) -> MessageId:
        """Send one message with the default producer (key hash, else round robin) and
        return its id once stored: :meth:`Producer.send_and_wait`. For many messages,
        ``send_batch`` or a producer's ``send()`` is much faster."""
        return self._producer().send_and_wait(queue, body, **kw)

    def send_batch(self, queue: str, messages: Sequence[Message | bytes], **kw) -> Sequence[MessageId]:
        return self._producer().send_batch(queue, messages, **kw)

    def scanner(self, queue: str, *, partitions: int | Iterable[int] | None = None,
                start: Bound = None, stop: Bound = None,
                start_time: datetime | int | None = None, end_time: datetime | int | None = None,
                tags: str | Iterable[str] | None = None) -> Scanner:
        """Scan a queue, one partition or several; see :class:`~headwater.client.scanner.Scanner`.

        ``start`` is inclusive and ``stop`` exclusive; each is an offset for every partition,
        ``{partition: offset}``, or a message id (which pins the scan to its partition).
        ``start_time``/``end_time`` bound by append time, ``end_time`` exclusive.
        """
        return Scanner(self._service, queue, partitions=partitions, start=start, stop=stop,
                       start_time=start_time, end_time=end_time, tags=tags)

    def get(self, message_id: MessageId | str) -> Record:
        """The message with this id; :class:`MessageNotFoundError` if it is not retained."""
        mid = MessageId.parse(message_id)
        name, batch = self._service.lookup_id(mid.queue_id, mid.partition, mid.offset)
        recs = decode_stored(batch, name, start_offset=mid.offset, end_offset=mid.offset + 1)
        if not recs:
            raise MessageNotFoundError(f"message {mid} is not retained")
        return recs[0]

    def find(self, queue: str, key: bytes, *, start_time: datetime | int | None = None,
             end_time: datetime | int | None = None, limit: int = 1000) -> list[Record]:
        """Messages of ``queue`` whose key is ``key``, appended in [start_time, end_time),
        oldest first."""
        if isinstance(key, str):
            raise InvalidArgumentError("a key is bytes; encode it first, e.g. key.encode()")
        if not isinstance(limit, int) or limit < 1:
            raise InvalidArgumentError(f"limit must be a positive int, got {limit!r}")
        lo, hi = to_epoch_ms(start_time, "start_time"), to_epoch_ms(end_time, "end_time")
        out: list[Record] = []
        for b in self._service.lookup_key(queue, key, lo, hi, limit):
            out.extend(r for r in decode_stored(b, queue) if r.key == key)
        out.sort(key=lambda r: (r.timestamp_ms, r.partition, r.offset))
        return out[:limit]

    def offset_for_time(self, queue: str, partition: int, when: datetime | int) -> int:
        """The first offset of ``partition`` appended at or after ``when``."""
        return self._service.offset_for_time(queue, partition, to_epoch_ms(when, "when"))

    def status(self) -> dict[str, object]:
        """Facts about the broker: version, uptime, storage figures, recovery repairs."""
        return self._service.status()

    def close(self) -> None:
        for p in list(self._producers):
            p.close()
        self._service.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
