"""The read path of a Spark task: fetch a partition's offset range, yield Arrow record batches.

This is the connector's fast path. A stored batch already holds its messages as columns
(bodies, keys, tags, properties: see :mod:`headwater.model.batch`), so a task decodes each
fetched batch with one msgspec call and appends whole columns; Arrow arrays are built once
per output batch of up to :data:`ROWS_PER_BATCH` rows, never message by message. The
columns Headwater knows without looking at messages are built without Python loops:
``queue`` and ``partition`` are repeated scalars, ``offset`` and ``timestamp`` are packed
machine integers, ``message_id`` is hex text made in one ``bytes.hex`` call. While a task
turns one response into Arrow, the next fetch is already on its way (when the client
offers ``fetch_async``, as the network client does).

Everything a task needs travels in its :class:`ReadTask` (Spark pickles the reader to the
workers, so nothing may come from the driver's memory at read time).
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import repeat

import pyarrow as pa
import pyarrow.compute as pc

from headwater.errors import (
    CorruptDataError,
    InvalidBatchError,
    MessageNotFoundError,
    QueueNotFoundError,
    UnavailableError,
)
from headwater.model.batch import check_batch, decode_header, decode_payload, tags_mask
from headwater.model.batch_reads import plain_batch
from headwater.model.service import FetchesAsync, FetchResult
from headwater.spark.connection import connect, unavailable_means
from headwater.spark.planning import data_loss_message, lost_tail_message

__all__ = ["ReadTask", "read_arrow", "ROWS_PER_BATCH", "BODY_BYTES_PER_BATCH"]

ROWS_PER_BATCH = 65_536  # rows of one Arrow batch handed to Spark
BODY_BYTES_PER_BATCH = 16 * 1024 * 1024  # or fewer rows when the bodies are large
_BIG_ENDIAN = sys.byteorder == "big"


@dataclass(frozen=True)
class ReadTask:
    """One Spark input partition: ``[start, end)`` of one queue partition, and how to read it."""

    servers: str
    queue: str
    queue_id: int
    partition: int
    start: int
    end: int
    tags: tuple[str, ...] | None
    fail_on_data_loss: bool
    fetch_bytes: int
    connect_timeout_s: float
    request_timeout_s: float
    # streaming with startingTimestamp: leave out messages appended before it (a time still
    # in the future when the query started puts its start at the end of every partition,
    # and what is appended there before that time must not be read)
    not_before_ms: int | None = None
    # the broker that leads the partition (host:port), when the driver knew it: the task asks
    # it first, and it is what a preferred location would name (see docs/spark.md, Locality)
    broker: str | None = None


class _Columns:
    """Columns of the rows gathered for the next Arrow batch. Optional columns stay None
    until some message has a value there; offsets and times are kept as runs (one per piece
    of a stored batch), since a stored batch has consecutive offsets and one append time."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.keys: list[bytes | None] | None = None
        self.tags: list[str | None] | None = None
        self.props: list[dict[str, str] | None] | None = None
        self.runs: list[tuple[int, int, int]] = []  # (first offset, count, timestamp in us)
        self.body_bytes = 0

    def __len__(self) -> int:
        return len(self.bodies)

    def add(self, base: int, ts_ms: int, payload, lo: int, hi: int, payload_bytes: int) -> None:
        """Messages ``lo..hi-1`` (indexes into the batch) of a stored batch."""
        n = hi - lo
        runs = self.runs
        if n == 1 and self.keys is None and self.tags is None and self.props is None:
            bodies = payload.bodies
            if len(bodies) == 1 and payload.keys is None and payload.tags is None and payload.properties is None:
                # a batch of one message, as a producer sending one at a time leaves them
                self.bodies.append(bodies[0])
                self.body_bytes += payload_bytes
                last = runs[-1] if runs else None
                if last is not None and last[0] + last[1] == base and last[2] == ts_ms * 1000:
                    runs[-1] = (last[0], last[1] + 1, last[2])
                else:
                    runs.append((base, 1, ts_ms * 1000))
                return
        whole = lo == 0 and hi == len(payload.bodies)
        before = len(self.bodies)
        self.bodies += payload.bodies if whole else payload.bodies[lo:hi]
        self.body_bytes += payload_bytes * n // len(payload.bodies)
        for name, col in (("keys", payload.keys), ("tags", payload.tags), ("props", payload.properties)):
            have = getattr(self, name)
            if col is not None:
                if have is None:
                    have = [None] * before
                    setattr(self, name, have)
                have += col if whole else col[lo:hi]
            elif have is not None:
                have += repeat(None, n)
        if runs and runs[-1][0] + runs[-1][1] == base + lo and runs[-1][2] == ts_ms * 1000:
            first, count, ts = runs[-1]
            runs[-1] = (first, count + n, ts)
        else:
            runs.append((base + lo, n, ts_ms * 1000))

    def build(self, task: ReadTask, schema: pa.Schema, id_prefix: str) -> pa.RecordBatch:
        n = len(self.bodies)
        types = [f.type for f in schema]
        offsets, times = _offsets_and_times(self.runs, n)
        times = times.view(types[5])
        arrays = [
            pa.nulls(n, types[0]) if self.keys is None else pa.array(self.keys, types[0]),
            pa.array(self.bodies, types[1]),
            pa.repeat(pa.scalar(task.queue, types[2]), n),
            pa.repeat(pa.scalar(task.partition, types[3]), n),
            offsets,
            times,
            pa.nulls(n, types[6]) if self.tags is None else pa.array(self.tags, types[6]),
            pa.nulls(n, types[7]) if self.props is None else pa.array(self.props, types[7]),
            _message_ids(offsets, id_prefix, types[8]),
        ]
        return pa.RecordBatch.from_arrays(arrays, schema=schema)


_iotas: list[pa.Array] = []
_positions: dict[int, array] = {}


def _iota(n: int) -> pa.Array:
    """0, 1, ..., n-1 as int64 (a slice of one array kept for the worker's life)."""
    if not _iotas or len(_iotas[0]) < n:
        _iotas[:] = [pa.array(range(max(n, ROWS_PER_BATCH)), pa.int64())]
    return _iotas[0].slice(0, n)


def _concat(arrays: list[pa.Array]) -> pa.Array:
    return arrays[0] if len(arrays) == 1 else pa.concat_arrays(arrays)


#: Runs shorter than this on average are expanded in Python arrays rather than one pair of
#: Arrow calls each: batches of one message, each with its own append time, make a run apiece.
SHORT_RUN_ROWS = 16


def _offsets_and_times(runs: list[tuple[int, int, int]], n: int) -> tuple[pa.Array, pa.Array]:
    """The offset and time (µs, int64) of each of ``n`` rows kept as ``runs``."""
    if len(runs) * SHORT_RUN_ROWS <= n:
        offsets = _concat([pc.add(_iota(count), pa.scalar(first, pa.int64())) for first, count, _ in runs])
        return offsets, _concat([pa.repeat(pa.scalar(ts, pa.int64()), count) for _, count, ts in runs])
    offs, tms = array("q"), array("q")
    for first, count, ts in runs:
        if count == 1:
            offs.append(first)
            tms.append(ts)
        else:
            offs.extend(range(first, first + count))
            tms.extend(repeat(ts, count))
    return (
        pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(offs)]),
        pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(tms)]),
    )


def _message_ids(offsets: pa.Array, prefix: str, string_type: pa.DataType) -> pa.Array:
    """``prefix + '%016x' % offset`` for every offset, without a Python loop per row:
    the offsets as big-endian bytes turn into hex in one call, a separator marks where
    each row's prefix goes, and the row boundaries are a fixed stride."""
    n = len(offsets)
    width = len(prefix) + 16
    be = array("q")
    be.frombytes(offsets.buffers()[1].to_pybytes()[offsets.offset * 8 : (offsets.offset + n) * 8])
    if not _BIG_ENDIAN:
        be.byteswap()
    text = prefix + be.tobytes().hex("|", 8).replace("|", prefix) if n else ""
    positions = _positions.get(width)
    if positions is None or len(positions) < n + 1:
        positions = _positions[width] = array("i", range(0, width * (max(n, ROWS_PER_BATCH) + 1), width))
    return pa.Array.from_buffers(
        string_type, n, [None, pa.py_buffer(positions)[: 4 * (n + 1)], pa.py_buffer(text.encode("ascii"))]
    )


def _recreated(task: ReadTask, queue_id: int) -> str:
    """Why a read found the batches of another queue of the same name (every stored batch
    carries its queue's id): its planned offsets would name other messages."""
    return (
        f"queue {task.queue!r} was deleted and created again after this read was planned (queue id "
        f"{task.queue_id}, now {queue_id}): its planned offsets mean nothing in the new queue; read it again"
    )


def _check(batch: bytes, queue: str):
    try:
        return check_batch(batch)
    except InvalidBatchError as e:
        raise CorruptDataError(
            f"a stored batch of queue {queue!r} failed its checks ({e}); run "
            f"'headwater check --data DIR' on the broker to cut the damaged part"
        ) from e


class _Fetcher:
    """Fetches of one partition, the next one sent before the current one is decoded."""

    def __init__(self, service, task: ReadTask) -> None:
        self._service = service
        self._task = task
        self._mask = tags_mask(task.tags) if task.tags else 0
        self._async = service.fetch_async if isinstance(service, FetchesAsync) else None
        self._pending = None  # (offset, future)

    def _sync(self, offset: int) -> FetchResult:
        t = self._task
        with unavailable_means(f"reading partition {t.partition} of queue {t.queue!r} from {t.servers}"):
            return self._service.fetch(
                t.queue, t.partition, offset, max_bytes=t.fetch_bytes, tag_mask=self._mask, end_offset=t.end
            )

    def prefetch(self, offset: int) -> None:
        if self._async is not None:
            t = self._task
            self._pending = (
                offset,
                self._async(
                    t.queue, t.partition, offset, max_bytes=t.fetch_bytes, tag_mask=self._mask, end_offset=t.end
                ),
            )

    def get(self, offset: int) -> FetchResult:
        pending, self._pending = self._pending, None
        if pending is not None and pending[0] == offset:
            try:
                return pending[1].result()
            except UnavailableError:
                pass  # the connection dropped: the client's retrying call below takes over
        return self._sync(offset)


def read_arrow(task: ReadTask, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """The rows of ``task`` as Arrow record batches matching ``schema`` (the read schema)."""
    servers = task.servers if task.broker is None else f"{task.broker},{task.servers}"
    client = connect(servers, connect_timeout_s=task.connect_timeout_s, request_timeout_s=task.request_timeout_s)
    try:
        yield from _read(client.service, task, schema)
    finally:
        client.close()


def _read(service, task: ReadTask, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    id_prefix = f"{task.queue_id:08x}-{task.partition:08x}-"
    wanted = pa.array(task.tags, pa.string()) if task.tags else None
    fetcher = _Fetcher(service, task)
    cols = _Columns()
    cur, end = task.start, task.end
    while cur < end:
        res = fetcher.get(cur)
        if res.start_offset > cur:
            if task.fail_on_data_loss:
                raise MessageNotFoundError(
                    data_loss_message(
                        task.queue,
                        task.partition,
                        cur,
                        min(res.start_offset, end),
                        (res.start_offset, res.end_offset - 1),
                    )
                )
            cur = min(res.start_offset, end)
        if cur >= res.end_offset:  # the partition ends before the range planned: offsets were lost
            if task.fail_on_data_loss:
                raise MessageNotFoundError(lost_tail_message(task.queue, task.partition, end, res.end_offset))
            break
        nxt = max(cur, res.next_offset)
        if nxt < end and (res.batches or nxt > cur):
            fetcher.prefetch(nxt)
        if res.batches and (queue_id := decode_header(res.batches[0]).queue_id) != task.queue_id:
            raise QueueNotFoundError(_recreated(task, queue_id))  # one answer holds one queue's batches
        for raw in res.batches:
            got = plain_batch(raw)  # checked and decoded in one call (batches of one message: most of the time)
            if got is not None:
                _, _, base, ts, _, payload_size, payload = got
                count = len(payload.bodies)
                if base + count <= cur or base >= end:
                    continue
            else:  # compressed, with deliver times, or damaged (_check says how)
                h = _check(raw, task.queue)
                base, ts, count, payload_size = h.base_offset, h.timestamp_ms, h.count, h.payload_size
                if base + count <= cur or base >= end:
                    continue
                payload = decode_payload(raw, h)
            lo = cur - base if cur > base else 0
            hi = end - base if end - base < count else count
            cols.add(base, ts, payload, lo, hi, payload_size)
            if len(cols.bodies) >= ROWS_PER_BATCH or cols.body_bytes >= BODY_BYTES_PER_BATCH:
                yield from _emit(cols, task, schema, id_prefix, wanted)
                cols = _Columns()
        if not res.batches and res.next_offset <= cur:
            break  # nothing at cur although the range says so: a gap left by damage
        cur = nxt
    if len(cols):
        yield from _emit(cols, task, schema, id_prefix, wanted)


def _emit(
    cols: _Columns, task: ReadTask, schema: pa.Schema, id_prefix: str, wanted: pa.Array | None
) -> Iterator[pa.RecordBatch]:
    batch = cols.build(task, schema, id_prefix)
    if task.not_before_ms is not None and cols.runs[0][2] < task.not_before_ms * 1000:
        # append times never decrease along a partition: only a first part can be early
        batch = batch.filter(
            pc.greater_equal(batch.column(5), pa.scalar(task.not_before_ms * 1000, batch.schema.field(5).type))
        )
    if wanted is not None:  # the broker skipped whole batches by tag mask; now message by message
        batch = batch.filter(pc.fill_null(pc.is_in(batch.column(6), value_set=wanted), False))
    if batch.num_rows:
        yield batch
