"""Reading a queue into Spark: batch (``spark.read``) and Structured Streaming
(``spark.readStream``).

The driver plans, the workers read. Planning asks the broker for the queue's partitions and
retained offsets and turns the options into one :class:`~headwater.spark.reading.ReadTask`
per queue partition (or more, when ``minPartitions`` asks for it). Each task travels to a
worker inside a :class:`HeadwaterPartition` and is read there by
:func:`~headwater.spark.reading.read_arrow`, as Arrow record batches.

Streaming: the position of a query is a :class:`~headwater.spark.planning.StreamOffset`
(the next offset of every partition), which Spark writes to the query's checkpoint before
a micro-batch runs and which bounds exactly what the micro-batch reads, so a restarted
query reads each offset exactly once. ``maxOffsetsPerTrigger`` reaches Spark as the
default read limit (``ReadMaxRows``); ``Trigger.AvailableNow`` fixes the end offsets when
the query starts and still honours the limit, batch after batch.

Locality: Spark's Python data source API has no way to name preferred hosts for an input
partition, so every task reads over the network from wherever Spark runs it. Once
partitions live on several brokers (the cluster issue), ``queue locations`` will name the
broker of each partition; the plan is to put that host into the partition (for a future
API or a Scala shim to use) and, until then, to run Spark executors on the broker hosts.
"""

from __future__ import annotations

from collections.abc import Iterator

from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from headwater.client import Client
from headwater.errors import InvalidArgumentError, MessageNotFoundError
from headwater.model.config import QueueInfo
from headwater.spark.connection import connect, describe, unavailable_means
from headwater.spark.options import ReadOptions
from headwater.spark.planning import (
    OffsetRange,
    StreamOffset,
    batch_ranges,
    choose_partitions,
    data_loss_message,
    lost_tail_message,
    rate_limit,
    split_ranges,
    start_offsets,
)
from headwater.spark.reading import ReadTask, read_arrow
from headwater.spark.schema import READ_SCHEMA, arrow_schema

__all__ = ["HeadwaterBatchReader", "HeadwaterPartition", "HeadwaterStreamReader"]


class HeadwaterPartition(InputPartition):
    """One Spark input partition: a :class:`ReadTask` (picklable, self-sufficient)."""

    def __init__(self, task: ReadTask) -> None:
        super().__init__(task)
        self.task = task

    def __repr__(self) -> str:
        t = self.task
        return f"HeadwaterPartition({t.queue}[{t.partition}] {t.start}..{t.end})"


def _check_schema(schema: StructType) -> None:
    if schema != READ_SCHEMA:
        raise InvalidArgumentError(
            "format('headwater') has a fixed schema; do not pass .schema(...) when reading "
            f"(it is {READ_SCHEMA.simpleString()}); select or cast columns after loading"
        )


def _brokers(client: Client, queue: str) -> dict[int, str]:
    """Each partition's leader (host:port), for the tasks to ask first; on a broker running
    alone there is nothing to prefer (and an embedded or unknown address is left out)."""
    md = client.admin.cluster_metadata([queue])
    if not md.cluster_id:
        return {}
    out = {}
    for p in md.queue(queue).partitions:
        b = md.broker(p.leader)
        if b is not None and b.host:
            out[p.partition] = b.address
    return out


def _tasks(
    opts: ReadOptions,
    queue: str,
    queue_id: int,
    ranges: list[OffsetRange],
    *,
    streaming: bool = False,
    brokers: dict[int, str] | None = None,
) -> list[HeadwaterPartition]:
    return [
        HeadwaterPartition(
            ReadTask(
                servers=opts.servers,
                queue=queue,
                queue_id=queue_id,
                partition=r.partition,
                start=r.start,
                end=r.end,
                tags=opts.tags,
                fail_on_data_loss=opts.fail_on_data_loss,
                fetch_bytes=opts.fetch_bytes,
                connect_timeout_s=opts.connect_timeout_s,
                request_timeout_s=opts.request_timeout_s,
                # a batch read's ranges start at the time already; a stream's may not (a future time)
                not_before_ms=opts.starting_timestamp_ms if streaming else None,
                broker=(brokers or {}).get(r.partition),
            )
        )
        for r in split_ranges(ranges, opts.min_partitions)
    ]


def _read(partition: InputPartition, schema: StructType) -> Iterator:
    if not isinstance(partition, HeadwaterPartition):
        # Spark reads a batch with no ranges (an empty queue, startingOffsets='latest') as
        # one placeholder partition of its own: there is nothing to read in it
        assert getattr(partition, "value", None) is None, f"not a Headwater partition: {partition!r}"
        return iter(())
    return read_arrow(partition.task, arrow_schema(schema))


class HeadwaterBatchReader(DataSourceReader):
    """``spark.read.format("headwater")``: the ranges are fixed on the driver when the
    query is planned ("latest" means the end offsets at that moment)."""

    def __init__(self, opts: ReadOptions, schema: StructType) -> None:
        _check_schema(schema)
        self.opts = opts
        self.schema = schema

    def partitions(self) -> list[InputPartition]:
        opts = self.opts
        client = connect(
            opts.servers,
            connect_timeout_s=opts.connect_timeout_s,
            request_timeout_s=opts.request_timeout_s,
            where="the Spark driver",
        )
        try:
            info = describe(client, opts.queue, opts.servers)
            ranges = batch_ranges(opts, info, lambda p, ms: client.offset_for_time(opts.queue, p, ms))
            brokers = _brokers(client, info.name)
        finally:
            client.close()
        return list(_tasks(opts, info.name, info.queue_id, ranges, brokers=brokers))

    def read(self, partition: InputPartition) -> Iterator:
        return _read(partition, self.schema)


class HeadwaterStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("headwater")``.

    One instance lives in a Python process beside the driver for the life of the query
    (Spark calls ``initialOffset``, ``latestOffset``, ``partitions`` and ``commit`` on it);
    ``read`` runs on copies of it in the workers and uses only its partition.
    """

    def __init__(self, opts: ReadOptions, schema: StructType) -> None:
        _check_schema(schema)
        self.opts = opts
        self.schema = schema
        self._client = None
        self._target: dict[int, int] | None = None  # Trigger.AvailableNow: where to stop

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_client"] = None  # the driver's connection stays on the driver
        return state

    # -- driver side ------------------------------------------------------------------

    def _info(self) -> QueueInfo:
        opts = self.opts
        if self._client is None:
            self._client = connect(
                opts.servers,
                connect_timeout_s=opts.connect_timeout_s,
                request_timeout_s=opts.request_timeout_s,
                where="the Spark driver",
            )
        with unavailable_means(f"the Spark driver asking {opts.servers} about queue {opts.queue!r}"):
            return describe(self._client, opts.queue, opts.servers)

    def _position(self, info: QueueInfo, offsets: dict[int, int]) -> dict:
        return StreamOffset(info.name, info.queue_id, offsets).to_json()

    def initialOffset(self) -> dict:
        info = self._info()
        parts = choose_partitions(info, self.opts.partitions)
        starts = start_offsets(self.opts, info, lambda p, ms: self._client.offset_for_time(info.name, p, ms), parts)
        return self._position(info, starts)

    def _start_of(self, start: StreamOffset, info: QueueInfo) -> dict[int, int]:
        """The start of every partition followed now; partitions added to the queue since the
        checkpoint start at 0 (they began empty), so replays plan the same ranges."""
        parts = choose_partitions(info, self.opts.partitions)
        return {p: start.offsets.get(p, 0) for p in parts}

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        info = self._info()
        pos = StreamOffset.from_json(start)
        pos.check_queue(info)
        starts = self._start_of(pos, info)
        ends: dict[int, int] = {}
        effective: dict[int, int] = {}
        moved_back: set[int] = set()
        for p, s in starts.items():
            pi = info.partitions[p]
            if not pi.online:  # its offsets are not known: nothing new until its leader is back
                effective[p] = ends[p] = s
                continue
            if s > pi.end_offset:  # the broker lost what the query read (Kafka: "offset was changed")
                if self.opts.fail_on_data_loss:
                    raise MessageNotFoundError(lost_tail_message(info.name, p, s, pi.end_offset))
                s = pi.end_offset
                moved_back.add(p)
            if s < pi.start_offset:
                if self.opts.fail_on_data_loss:
                    raise MessageNotFoundError(
                        data_loss_message(info.name, p, s, pi.start_offset, (pi.start_offset, pi.end_offset - 1))
                    )
                s = pi.start_offset
            effective[p] = s
            end = pi.end_offset
            if self._target is not None:
                end = min(end, self._target.get(p, s))
            ends[p] = max(s, end)
        if isinstance(limit, ReadMaxRows):
            ends = rate_limit(effective, ends, limit.max_rows)
        elif not isinstance(limit, ReadAllAvailable):
            raise InvalidArgumentError(f"format('headwater') does not support the read limit {limit!r}")
        # A partition with nothing new keeps its offset as it was (not the skipped-to one),
        # and a new partition appears only once it has data: "no new data" must compare
        # equal to the start, or Spark runs empty micro-batches. One whose end went back
        # below the position moves back with it, or what is appended there would be skipped.
        out = {
            p: (ends[p] if ends[p] > effective[p] or p in moved_back else starts[p])
            for p in starts
            if p in pos.offsets or ends[p] > effective[p]
        }
        return self._position(info, out)

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.opts.max_offsets_per_trigger
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        info = self._info()
        self._target = {p: info.partitions[p].end_offset for p in choose_partitions(info, self.opts.partitions)}

    def reportLatestOffset(self) -> dict | None:
        info = self._info()
        parts = choose_partitions(info, self.opts.partitions)
        return self._position(info, {p: info.partitions[p].end_offset for p in parts})

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        s, e = StreamOffset.from_json(start), StreamOffset.from_json(end)
        if s.queue_id != e.queue_id:
            raise InvalidArgumentError(
                f"queue {e.queue!r} was deleted and created again during the query; start it "
                f"with a new checkpointLocation"
            )
        # a micro-batch replayed after a restart comes here without latestOffset: the queue
        # may have been deleted and created again since it was planned
        e.check_queue(self._info())
        ranges = [OffsetRange(p, s.offsets.get(p, 0), hi) for p, hi in e.offsets.items() if hi > s.offsets.get(p, 0)]
        brokers = _brokers(self._client, e.queue) if self._client is not None else {}
        return list(_tasks(self.opts, e.queue, e.queue_id, ranges, streaming=True, brokers=brokers))

    def commit(self, end: dict) -> None:
        pass  # nothing to release: the broker keeps no state for a scan

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    # -- worker side ------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator:
        return _read(partition, self.schema)
