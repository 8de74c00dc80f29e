"""The write path of a Spark task: Arrow record batches in, idempotent record batches out.

Rows are routed to a partition (the ``partition`` column, else the key's hash, else a
sticky partition per batch, as the producer does), gathered per partition, and sent as
record batches of up to ``maxBatchBytes``, through the client's producer
(:meth:`~headwater.client.sync.producer.Producer.send_identified`: each batch under an identity
this module derives, retried by the producer while the broker is unavailable).

Exactly once. Every record batch a task sends is an idempotent batch whose producer id,
epoch and sequence are derived from what identifies that piece of output::

    producer id = blake2b(write id, task's partition id, queue id, partition, chunk)
    epoch       = the micro-batch id modulo 32768 (0 for a batch write)
    sequence    = 0 (a producer id sends one batch per micro-batch, see below for a second)

where ``chunk`` counts the batches the task sent to the partition before. The write id is
``<query id>/<micro-batch id // 32768>`` for a streaming query (the query id is kept in the
checkpoint; the micro-batch id is the number Spark replays a batch under) and a random id
drawn once on the driver for a batch write. The broker keeps, per producer id and
partition, its epoch and its last 5 batches (:mod:`headwater.model.producer_state`):

- a batch it already holds (same epoch, sequence and count) is answered with its original
  placement and not appended again: a retried task or a replayed micro-batch writes only
  what its first run did not;
- a higher epoch starts the id afresh: the next micro-batch reuses the same producer ids,
  so the broker holds one entry per (query, task, partition, chunk) rather than one per
  micro-batch; a lower epoch is refused (a checkpoint older than what was written);
- a task cut short (Spark ends a task's input as if it were complete when a stage feeding
  it fails, and the task flushes what it holds before Spark fails it) leaves a last batch
  smaller than the retry's under the same id: the broker refuses the retry's batch and
  names the sequence after the rows it holds, and the retry sends only the rest, as a
  second batch of the id (:meth:`TaskWriter._continue`). A later replay of the whole batch
  is refused the same way, naming its own size: the batch is there, in two pieces.

The guarantee rests on the replay producing the same rows per task. Within one record
batch the order does not matter (the broker compares sequences and counts, not contents);
when a task sends more than ``maxBatchBytes`` to one partition, the split into batches
follows row order, so that order must repeat too, which holds for deterministic queries
over a replayable source (Headwater's own source replays the same offsets in the same
order). A replay whose batch is smaller than the one written is refused rather than
written twice (a larger one is taken for the retry of a task cut short). The broker
forgets a producer id after its producer expiry (7 days by default) and remembers a batch
exactly as durably as it keeps it: see docs/spark.md for the limits.

Thread-safety: one :class:`TaskWriter` per Spark task, used by one thread.
"""

from __future__ import annotations

import hashlib
import re
from bisect import bisect_left
from collections.abc import Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from itertools import accumulate, repeat
from operator import add
from typing import NamedTuple

import pyarrow as pa

from headwater.client.sync.producer import Producer
from headwater.errors import (
    InvalidArgumentError,
    MessageTooLargeError,
    OutOfOrderSequenceError,
    PartitionOutOfRangeError,
    ProducerFencedError,
)
from headwater.model.batch import crc32c
from headwater.model.config import QueueInfo
from headwater.model.delay import DELAYED_PARTITION_BIT
from headwater.model.hashing import key_hash
from headwater.model.message import Message, to_epoch_ms
from headwater.model.service import ProduceResult
from headwater.spark.connection import connect, describe, unavailable_means
from headwater.spark.options import WriteOptions
from headwater.spark.schema import WriteColumns

__all__ = ["TaskWriter", "WriteSummary", "producer_id_for", "EPOCHS", "PENDING_BYTES_MAX"]

PENDING_BYTES_MAX = 64 * 1024 * 1024  # all partitions' unsent rows of one task, together
MESSAGE_OVERHEAD = 8  # bytes a message costs in a batch besides its contents (msgpack headers)
IN_FLIGHT_MAX = 4  # batches of one task sent and not yet answered
SEND_RETRIES = 3  # a batch is sent again this often while the broker is unavailable (a restart)
SEND_BACKOFF_MS = 200  # before the first of them; doubling
EPOCHS = 2**15  # a producer epoch is a signed 16-bit number
_PID_MASK = (1 << 62) - 1  # producer ids are 62-bit, like the producer's random ones


def producer_id_for(write_id: str, task: int, queue_id: int, partition: int, chunk: int) -> int:
    """The producer id of a task's output to one partition; the same inputs, the same id."""
    digest = hashlib.blake2b(
        f"headwater-spark/{write_id}/{task}/{queue_id}/{partition}/{chunk}".encode(), digest_size=8
    ).digest()
    return int.from_bytes(digest, "big") & _PID_MASK


@dataclass
class WriteSummary:
    """What one task wrote: messages per (queue, partition). Travels back to the driver."""

    messages: dict[tuple[str, int], int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.messages.values())


class _Pending:
    __slots__ = ("messages", "bytes", "chunks", "deliver_ms")

    def __init__(self) -> None:
        self.messages: list[Message | bytes] = []
        self.bytes = 0
        self.chunks = 0  # batches sent so far to this partition by this task
        self.deliver_ms = 0  # delayed streams: the deliver time of the rows pending


class _Sent(NamedTuple):
    """A batch on its way to the broker, with what it takes to send a part of it again."""

    key: tuple[str, int]
    count: int
    chunk: int
    future: Future[ProduceResult]
    messages: list
    producer_id: int
    deliver_ms: int


_EXPECTED = re.compile(r"; expected (\d+) \(")  # the broker's OutOfOrderSequenceError text


def _expected_sequence(error: OutOfOrderSequenceError) -> int | None:
    """The next sequence the broker wants from the producer id, as its refusal says."""
    found = _EXPECTED.search(str(error))
    return int(found.group(1)) if found else None


class _Queue:
    """What a task knows of one destination queue."""

    def __init__(self, info: QueueInfo, sticky_seed: int) -> None:
        self.info = info
        self.partitions = len(info.partitions)
        self.sticky = sticky_seed % self.partitions
        self.turns = 0


class TaskWriter:
    """Writes one Spark task's rows; ``write_id``, ``epoch`` and ``task`` make its batches' ids."""

    def __init__(self, opts: WriteOptions, columns: WriteColumns, write_id: str, task: int, epoch: int = 0) -> None:
        assert 0 <= epoch < EPOCHS, epoch
        self.opts = opts
        self.columns = columns
        self.write_id = write_id
        self.epoch = epoch
        self.task = task
        self.summary = WriteSummary()
        self._client = connect(
            opts.servers, connect_timeout_s=opts.connect_timeout_s, request_timeout_s=opts.request_timeout_s
        )
        self._producer: Producer = self._client.producer(
            compression=opts.compression,
            retries=SEND_RETRIES,
            retry_backoff_ms=SEND_BACKOFF_MS,
            retry_backoff_max_ms=SEND_BACKOFF_MS << SEND_RETRIES,
        )
        self._queues: dict[str, _Queue] = {}
        self._pending: dict[tuple[str, int], _Pending] = {}
        self._pending_bytes = 0
        self._in_flight: dict[tuple[str, int], _Sent] = {}  # oldest first

    def close(self) -> None:
        self._client.close()

    # -- routing ----------------------------------------------------------------------

    def _queue(self, name: str) -> _Queue:
        q = self._queues.get(name)
        if q is None:
            with unavailable_means(f"asking {self.opts.servers} about queue {name!r}"):
                info = describe(self._client, name, self.opts.servers)
            seed = f"{self.write_id}/{self.epoch}/{self.task}/{name}".encode()
            q = self._queues[name] = _Queue(info, crc32c(seed))
        return q

    def _sticky_moved(self, q: _Queue) -> None:
        """The sticky partition's batch was sent: unkeyed rows go elsewhere next."""
        q.turns += 1
        if self.opts.partitioner == "random":
            seed = f"{self.write_id}/{self.epoch}/{self.task}/{q.info.name}/{q.turns}".encode()
            q.sticky = crc32c(seed) % q.partitions
        else:
            q.sticky = (q.sticky + 1) % q.partitions

    def write_batch(self, batch: pa.RecordBatch) -> None:
        n = batch.num_rows
        if n == 0:
            return
        cols = self.columns

        def column(name: str) -> list | None:
            """The column's values, or None when it is absent or null in every row."""
            if name not in cols:
                return None
            arr = batch.column(cols.names[name])
            return None if arr.null_count == n else arr.to_pylist()

        delays = column("deliver_at")
        values = batch.column(cols.names["value"])
        if values.null_count:
            raise InvalidArgumentError(
                "a row has a null 'value'; every message needs a body (use b'' for an empty one, "
                "or filter the rows out)"
            )
        bodies = values.to_pylist()
        keys = column("key")
        if keys is not None and cols.key_is_string:
            keys = [k.encode() if k is not None else None for k in keys]
        tags = column("tag")
        if tags is not None and "" in tags:
            raise InvalidArgumentError(
                "a row's tag is '' (empty); a tag is a non-empty string, and null means none: "
                "turn empty tags into nulls first, e.g. nullif(tag, '') as tag"
            )
        props = column("properties")
        parts = column("partition")
        queues = None
        if self.opts.queue is None:
            queues = column("queue")
            if queues is None or None in queues:
                raise InvalidArgumentError("a row has a null 'queue'; name a queue in every row or set option queue")
        if self.opts.partitioner == "key" and (keys is None or None in keys):
            raise InvalidArgumentError(
                "partitioner 'key' needs a key in every row; a row has none (use "
                "partitioner 'default' to send keyless rows round robin)"
            )
        if queues is None and keys is None and tags is None and props is None and parts is None and delays is None:
            self._add_bodies(self.opts.queue, bodies)  # type: ignore[arg-type]  # opts.queue is set when no row names a queue (checked at load)
            return
        messages = _messages(bodies, keys, tags, props)
        sizes = _sizes(bodies, keys, tags, props)
        times = None if delays is None else [None if d is None else to_epoch_ms(d) for d in delays]
        if queues is None and times is None:
            q = self._queue(self.opts.queue)  # type: ignore[arg-type]  # opts.queue is set when no row names a queue (checked at load)
            self._add_rows(q, messages, sizes, self._destinations(q, n, keys, parts))
            return
        for i in range(n):  # rows for several queues, or delayed rows: one at a time
            q = self._queue(self.opts.queue if queues is None else queues[i])  # type: ignore[arg-type]  # opts.queue is set when no row names a queue (checked at load)
            dest = self._destinations(
                q, 1, None if keys is None else keys[i : i + 1], None if parts is None else parts[i : i + 1]
            )
            if times is None or times[i] is None:
                self._add_rows(q, messages[i : i + 1], sizes[i : i + 1], dest)
            else:
                self._add_delayed(q, messages[i], sizes[i], dest[0], times[i])

    def _add_delayed(self, q: _Queue, message: Message | bytes, size: int, partition: int, deliver_ms: int) -> None:
        """A row with a deliver time: it goes to the partition's delayed stream (the broker
        counts its sequences apart, under the partition's delayed bit). A batch holds rows of
        one deliver time, so a replayed task sends the very same batches."""
        p = q.sticky if partition < 0 else partition
        key = (q.info.name, p | DELAYED_PARTITION_BIT)
        pending = self._pending_of(*key)
        if pending.messages and pending.deliver_ms != deliver_ms:
            self._send(key, pending)
        pending.deliver_ms = deliver_ms
        pending.messages.append(message)
        self._grew(key[0], key[1], pending, size)

    def _destinations(self, q: _Queue, rows: int, keys: list | None, parts: list | None) -> list[int]:
        """Each row's partition: its ``partition``, else its key's hash, else -1 (sticky)."""
        n = q.partitions
        if parts is not None:
            bad = [p for p in parts if p is not None and not 0 <= p < n]
            if bad:
                raise PartitionOutOfRangeError(
                    f"a row's partition is {bad[0]}, but queue {q.info.name!r} has partitions 0..{n - 1}"
                )
        if keys is not None and self.opts.partitioner in ("default", "key"):
            dest = [key_hash(k) % n if k is not None else -1 for k in keys]
        else:
            dest = [-1] * rows
        if parts is not None:
            dest = [d if p is None else p for p, d in zip(parts, dest)]
        return dest

    def _add_rows(self, q: _Queue, messages: list, sizes: list[int], dest: list[int]) -> None:
        name, pendings, limit = q.info.name, self._pending, self.opts.batch_bytes_max
        for message, size, p in zip(messages, sizes, dest):
            if p < 0:
                p = q.sticky
            pending = pendings.get((name, p)) or self._pending_of(name, p)
            pending.messages.append(message)
            pending.bytes += size
            self._pending_bytes += size
            if pending.bytes >= limit or self._pending_bytes >= PENDING_BYTES_MAX:
                self._flush_some(name, p, pending)

    def _add_bodies(self, name: str, bodies: list[bytes]) -> None:
        """Unkeyed plain bodies go to the sticky partition in runs: the same batches as
        adding them one by one (:meth:`_add_rows`), without a Python call per row."""
        q = self._queue(name)
        ends = list(accumulate(map(add, map(len, bodies), repeat(MESSAGE_OVERHEAD))))  # rows 0..j
        i, n = 0, len(bodies)
        while i < n:
            pending = self._pending_of(q.info.name, q.sticky)
            before = ends[i - 1] if i else 0
            # the first row at which the batch reaches its size, as _add would find it
            j = min(bisect_left(ends, before + self.opts.batch_bytes_max - pending.bytes, lo=i) + 1, n)
            pending.messages += bodies[i:j]
            self._grew(q.info.name, q.sticky, pending, ends[j - 1] - before)
            i = j

    def _pending_of(self, name: str, partition: int) -> _Pending:
        pending = self._pending.get((name, partition))
        if pending is None:
            pending = self._pending[(name, partition)] = _Pending()
        return pending

    def _grew(self, name: str, partition: int, pending: _Pending, size: int) -> None:
        pending.bytes += size
        self._pending_bytes += size
        self._flush_some(name, partition, pending)

    def _flush_some(self, name: str, partition: int, pending: _Pending) -> None:
        """Send the partition's batch once it is full, or the biggest one when the task
        holds too much altogether."""
        if pending.bytes >= self.opts.batch_bytes_max:
            self._send((name, partition), pending)
        elif self._pending_bytes >= PENDING_BYTES_MAX:
            biggest = max(self._pending, key=lambda k: (self._pending[k].bytes, k))
            self._send(biggest, self._pending[biggest])

    # -- sending ----------------------------------------------------------------------

    def _send(self, key: tuple[str, int], pending: _Pending) -> None:
        """Encode the partition's pending rows as the next batch and send it without waiting;
        its answer is awaited before the partition's next batch goes out (the broker wants a
        partition's rows in order), or when too many are in flight."""
        name, partition = key
        if not pending.messages:
            return
        q = self._queues[name]
        deliver_ms = pending.deliver_ms if partition & DELAYED_PARTITION_BIT else 0
        pid = producer_id_for(self.write_id, self.task, q.info.queue_id, partition, pending.chunks)
        earlier = self._in_flight.pop(key, None)
        if earlier is not None:
            self._settle(earlier)
        while len(self._in_flight) >= IN_FLIGHT_MAX:
            self._settle(self._in_flight.pop(next(iter(self._in_flight))))
        future = self._send_part(name, partition, pending.messages, pid, 0, deliver_ms)
        self._in_flight[key] = _Sent(
            key, len(pending.messages), pending.chunks, future, pending.messages, pid, deliver_ms
        )
        self._pending_bytes -= pending.bytes
        pending.messages = []
        pending.bytes = 0
        pending.chunks += 1
        if q.sticky == partition:
            self._sticky_moved(q)

    def _send_part(
        self, name: str, partition: int, messages: list, pid: int, base_sequence: int, deliver_ms: int
    ) -> Future[ProduceResult]:
        """Send ``messages`` as one batch of producer id ``pid`` from ``base_sequence``,
        without waiting; ``partition`` may carry the delayed bit (it names the stream)."""
        target = partition & ~DELAYED_PARTITION_BIT
        try:
            with unavailable_means(f"asking {self.opts.servers} about queue {name!r}"):
                return self._producer.send_identified(
                    name,
                    target,
                    messages,
                    identity=(pid, self.epoch),
                    base_sequence=base_sequence,
                    deliver_at_ms=deliver_ms,
                )
        except MessageTooLargeError as e:
            limit = self._queues[name].info.config.message_bytes_max
            if max(len(m if type(m) is bytes else m.body) for m in messages) <= limit:
                raise MessageTooLargeError(f"{e}; lower the option maxBatchBytes") from e
            raise MessageTooLargeError(
                f"a row's value is too large for queue {name!r} ({e}); rows before it may be "
                f"written already. Filter such rows out first, e.g. df.where(length('value') <= "
                f"{limit}), or write to a queue created with a larger message_bytes_max "
                f"('headwater queue create NAME --message-bytes-max BYTES', up to 64 MiB)"
            ) from e

    def _wait(self, name: str, partition: int, future: Future[ProduceResult]) -> None:
        """Wait for a batch's answer; the producer sent it again while the broker was
        unavailable (an idempotent batch lands once however often it is sent)."""
        with unavailable_means(f"writing to partition {partition} of queue {name!r} at {self.opts.servers}"):
            future.result()

    def _settle(self, sent: _Sent) -> None:
        """Wait for a sent batch's answer and count its rows; say what a refusal means."""
        name, partition = sent.key
        partition &= ~DELAYED_PARTITION_BIT
        try:
            try:
                self._wait(name, partition, sent.future)
            except OutOfOrderSequenceError as e:
                if not self._continue(name, sent, e):
                    raise
        except OutOfOrderSequenceError as e:
            raise InvalidArgumentError(
                f"this task's output for partition {partition} of queue {name!r} differs from "
                f"what an earlier attempt of the same task wrote (write {self.write_id}, epoch "
                f"{self.epoch}, task {self.task}, batch {sent.chunk} of that partition), so "
                f"exactly-once cannot hold: the query is not deterministic (e.g. it uses rand(), "
                f"now() or a source that does not replay the same rows), or queue {name!r} has more "
                f"partitions than when that attempt ran (it has {self._queues[name].partitions} now; "
                f"rows without a 'partition' column go by key hash or turn, so they land elsewhere). "
                f"Broker said: {e}"
            ) from e
        except ProducerFencedError as e:
            raise InvalidArgumentError(
                f"partition {partition} of queue {name!r} already holds output of a later "
                f"micro-batch of this query than the one running now (epoch {self.epoch}): the "
                f"checkpoint is older than what the query wrote (restored from a copy?). Start "
                f"the query with a new checkpointLocation. Broker said: {e}"
            ) from e
        self.summary.messages[sent.key] = self.summary.messages.get(sent.key, 0) + sent.count

    def _continue(self, name: str, sent: _Sent, refusal: OutOfOrderSequenceError) -> bool:
        """Whether the refused batch was written, in part or whole, by an attempt of this task
        that was cut short; if so, send what the broker lacks and say True.

        When a stage that feeds a task fails, Spark ends the task's input as if it were
        complete: the task flushes what it holds, its last batch to a partition smaller than
        a full one, and Spark then fails it and runs it again. The retry's batch under that
        producer id holds those rows and more; the broker holds the smaller batch and wants
        the sequence after it. The rows are the same (the guarantee rests on that), so the
        rest of the batch goes out on its own, and a later replay, which finds the batch in
        two pieces, learns that the broker holds all of it. Any other refusal stays an
        error: the replay differs from what was written."""
        held = _expected_sequence(refusal)
        if held is None or not 0 < held <= sent.count:
            return False
        if held < sent.count:
            partition = sent.key[1]
            rest = self._send_part(name, partition, sent.messages[held:], sent.producer_id, held, sent.deliver_ms)
            self._wait(name, partition & ~DELAYED_PARTITION_BIT, rest)
        return True

    def finish(self) -> WriteSummary:
        """Send everything still pending (in partition order, so replays match), wait for
        every answer, and close."""
        try:
            for key in sorted(self._pending):
                self._send(key, self._pending[key])
            while self._in_flight:
                self._settle(self._in_flight.pop(next(iter(self._in_flight))))
        finally:
            self.close()
        return self.summary


def _sizes(bodies: list[bytes], keys: list | None, tags: list | None, props: list | None) -> list[int]:
    """What each row adds to a batch: its body, key, tag and properties, and the encoding's
    bytes per message (rows with empty bodies and large properties still fill a batch)."""
    sizes = list(map(add, map(len, bodies), repeat(MESSAGE_OVERHEAD)))
    for column in (keys, tags):
        if column is not None:
            sizes = [s if v is None else s + len(v) for s, v in zip(sizes, column)]
    if props is not None:
        sizes = [s if p is None else s + sum(len(k) + len(v or "") + 2 for k, v in p) for s, p in zip(sizes, props)]
    return sizes


def _messages(bodies: list[bytes], keys: list | None, tags: list | None, props: list | None) -> list[Message | bytes]:
    """Plain bodies where a row has nothing else (the batch encoder's fast path), else
    Messages."""
    if tags is None and props is None:
        if keys is None:
            return bodies
        return [b if k is None else Message(b, k) for b, k in zip(bodies, keys)]
    n = len(bodies)
    keys = keys if keys is not None else [None] * n
    tags = tags if tags is not None else [None] * n
    props = props if props is not None else [None] * n
    return [
        b if k is None and t is None and not p else Message(b, k, t, _as_dict(p))
        for b, k, t, p in zip(bodies, keys, tags, props)
    ]


def _as_dict(prop: Iterable | None) -> dict[str, str] | None:
    if not prop:
        return None
    out = dict(prop)
    if any(v is None for v in out.values()):
        raise InvalidArgumentError("a row's properties map a key to null; property values are strings")
    return out
