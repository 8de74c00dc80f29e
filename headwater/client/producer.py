"""Producer: turns messages into record batches and sends them to a partition.

Encoding happens here, in the caller's process, so a broker only validates and appends.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence

from headwater.errors import InvalidArgumentError, PartitionOutOfRangeError
from headwater.model.batch import encode_batch
from headwater.model.config import QueueInfo
from headwater.model.message import Message, MessageId
from headwater.model.service import BrokerService, ProduceResult
from headwater.client.partitioner import Partitioner, PartitionFn

__all__ = ["Producer", "BatchReceipt"]


class BatchReceipt(Sequence[MessageId]):
    """The ids of one appended batch, made on demand (a batch of 500 makes no 500 objects)."""

    __slots__ = ("result",)

    def __init__(self, result: ProduceResult) -> None:
        self.result = result

    def __len__(self) -> int:
        return self.result.count

    def __getitem__(self, i):  # type: ignore[override]
        r = self.result
        if isinstance(i, slice):
            return [MessageId(r.queue_id, r.partition, r.base_offset + j) for j in range(r.count)[i]]
        if i < 0:
            i += r.count
        if not 0 <= i < r.count:
            raise IndexError(i)
        return MessageId(r.queue_id, r.partition, r.base_offset + i)

    def __iter__(self) -> Iterator[MessageId]:
        r = self.result
        for j in range(r.count):
            yield MessageId(r.queue_id, r.partition, r.base_offset + j)

    def __repr__(self) -> str:
        r = self.result
        return f"<BatchReceipt partition={r.partition} offsets={r.base_offset}..{r.base_offset + r.count - 1}>"


class Producer:
    """Sends messages to queues. Thread-safe; one producer can serve a whole application.

    >>> import headwater, tempfile
    >>> hw = headwater.open(tempfile.mkdtemp())
    >>> _ = hw.admin.create_queue("orders", partitions=4)
    >>> p = hw.producer(partitioner="key")
    >>> mid = p.send("orders", b"paid", key=b"order-17", tag="paid")
    >>> hw.get(mid).body
    b'paid'
    >>> hw.close()
    """

    def __init__(self, service: BrokerService, *, partitioner: str | PartitionFn = "default",
                 compression: str | None = None, metadata_max_age_ms: int = 5000) -> None:
        self._service = service
        self._partitioner = Partitioner(partitioner)
        if compression not in (None, "zstd", "lz4"):
            raise InvalidArgumentError(f"compression must be None, 'zstd' or 'lz4', got {compression!r}")
        self.compression = compression
        self._metadata: dict[str, tuple[float, QueueInfo]] = {}
        self._metadata_max_age_s = metadata_max_age_ms / 1000
        self._lock = threading.Lock()

    def _queue_info(self, queue: str, *, refresh: bool = False) -> QueueInfo:
        now = time.monotonic()
        got = self._metadata.get(queue)
        if refresh or got is None or now - got[0] > self._metadata_max_age_s:
            info = self._service.describe_queue(queue)
            with self._lock:
                self._metadata[queue] = (now, info)
            return info
        return got[1]

    def send(self, queue: str, body: bytes | Message, *, key: bytes | None = None,
             tag: str | None = None, properties: dict[str, str] | None = None,
             partition: int | None = None) -> MessageId:
        """Send one message; return its id once it is stored."""
        if isinstance(body, Message):
            if key is not None or tag is not None or properties is not None:
                raise InvalidArgumentError("pass key, tag and properties inside the Message, not beside it")
            msg: Message | bytes = body
        elif key is None and tag is None and not properties:
            msg = body
        else:
            msg = Message(body, key, tag, properties)
        return self.send_batch(queue, [msg], partition=partition)[0]

    def send_batch(self, queue: str, messages: Sequence[Message | bytes], *,
                   partition: int | None = None) -> Sequence[MessageId]:
        """Send messages as one batch per partition; return their ids in the given order.

        With ``partition`` every message goes there; otherwise the producer's partitioner
        decides (see :mod:`headwater.client.partitioner`).
        """
        if isinstance(messages, (bytes, Message)):
            raise InvalidArgumentError("send_batch takes a list of messages; use send() for one")
        if len(messages) == 0:
            raise InvalidArgumentError("send_batch needs at least one message")
        info = self._queue_info(queue)
        n = len(info.partitions)
        cap = info.config.message_bytes_max
        if partition is not None:
            if isinstance(partition, bool) or not isinstance(partition, int):
                raise InvalidArgumentError(f"a partition is an int, got {type(partition).__name__}")
            if not 0 <= partition < n:
                info = self._queue_info(queue, refresh=True)  # it may have grown
                n = len(info.partitions)
                if not 0 <= partition < n:
                    raise PartitionOutOfRangeError(
                        f"queue {queue!r} has partitions 0..{n - 1}; there is no partition {partition}"
                    )
            return self._send_one(queue, partition, messages, cap)
        part = self._partitioner
        keyed = part.per_message and any(isinstance(m, Message) and m.key is not None for m in messages)
        if not keyed and not callable(part.strategy):
            if part.strategy == "key":
                part.for_message(messages[0], n)  # raises: a key is required
            return self._send_one(queue, part.for_batch(n), messages, cap)
        sticky = part.for_batch(n)
        groups: dict[int, list[int]] = {}
        for i, m in enumerate(messages):
            has_key = isinstance(m, Message) and m.key is not None
            p = part.for_message(m, n) if has_key or callable(part.strategy) or part.strategy == "key" else sticky
            groups.setdefault(p, []).append(i)
        if len(groups) == 1:
            return self._send_one(queue, next(iter(groups)), messages, cap)
        ids: list[MessageId | None] = [None] * len(messages)
        for p, idxs in groups.items():
            receipt = self._send_one(queue, p, [messages[i] for i in idxs], cap)
            for i, mid in zip(idxs, receipt):
                ids[i] = mid
        return ids  # type: ignore[return-value]

    def _send_one(self, queue: str, partition: int, messages: Sequence[Message | bytes], cap: int) -> BatchReceipt:
        batch = encode_batch(messages, compression=self.compression, message_bytes_max=cap)
        return BatchReceipt(self._service.produce(queue, partition, batch))
