"""Writing a dataframe into Headwater: batch (``df.write``) and Structured Streaming
(``df.writeStream``), exactly once.

Both writers take Arrow record batches from Spark (``DataSourceArrowWriter``,
``DataSourceStreamArrowWriter``) and hand them to a :class:`~headwater.spark.writing.TaskWriter`
per task, which sends idempotent record batches whose producer ids are derived from the
write, the task and the partition (see :mod:`headwater.spark.writing`). A task's messages are
acknowledged by the broker before the task reports success, so ``commit`` has nothing left
to do; there is no ``abort`` either: what finished tasks wrote stays written (a batch write
that fails half way leaves its finished tasks' messages; running it again does not repeat
them only if it is the same Spark job retrying its tasks).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from headwater.errors import InvalidArgumentError
from headwater.spark.options import WriteOptions
from headwater.spark.schema import WriteColumns
from headwater.spark.writing import EPOCHS, TaskWriter, WriteSummary

__all__ = ["HeadwaterBatchWriter", "HeadwaterCommitMessage", "HeadwaterStreamWriter"]

QUERY_ID_PROPERTY = "sql.streaming.queryId"  # set by Spark on every task of a streaming query
BATCH_ID_PROPERTY = "streaming.sql.batchId"


class HeadwaterCommitMessage(WriterCommitMessage):
    """What one task wrote, sent back to the driver."""

    def __init__(self, summary: WriteSummary) -> None:
        self.summary = summary


def _write(
    opts: WriteOptions, columns: WriteColumns, write_id: str, epoch: int, batches: Iterator
) -> HeadwaterCommitMessage:
    ctx = TaskContext.get()
    task = ctx.partitionId() if ctx is not None else 0
    writer = TaskWriter(opts, columns, write_id, task, epoch)
    try:
        for batch in batches:
            writer.write_batch(batch)
    except BaseException:
        writer.close()
        raise
    return HeadwaterCommitMessage(writer.finish())


class HeadwaterBatchWriter(DataSourceArrowWriter):
    """``df.write.format("headwater")``. Its id is drawn once, on the driver, so a task Spark
    retries within the same job writes under the same producer ids and is not repeated."""

    def __init__(self, opts: WriteOptions, columns: WriteColumns) -> None:
        self.opts = opts
        self.columns = columns
        self.write_id = f"batch-{uuid.uuid4().hex}"

    def write(self, iterator: Iterator) -> HeadwaterCommitMessage:
        return _write(self.opts, self.columns, self.write_id, 0, iterator)

    def commit(self, messages: list) -> None:
        pass  # every message was acknowledged before its task finished

    def abort(self, messages: list) -> None:
        pass  # acknowledged messages cannot be taken back; see the module docstring


class HeadwaterStreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("headwater")``: a micro-batch writes under ids made of the
    query id and its batch id, both stable across restarts from the same checkpoint."""

    def __init__(self, opts: WriteOptions, columns: WriteColumns) -> None:
        self.opts = opts
        self.columns = columns

    def write(self, iterator: Iterator) -> HeadwaterCommitMessage:
        ctx = TaskContext.get()
        query = ctx.getLocalProperty(QUERY_ID_PROPERTY) if ctx is not None else None
        batch = ctx.getLocalProperty(BATCH_ID_PROPERTY) if ctx is not None else None
        if not query or batch is None:
            raise InvalidArgumentError(
                "the Headwater streaming sink runs only in a micro-batch streaming query (Spark "
                "did not say which query and micro-batch this task belongs to); continuous "
                "processing is not supported"
            )
        # the same producer ids serve 32768 micro-batches, one epoch each (see writing.py)
        generation, epoch = divmod(int(batch), EPOCHS)
        return _write(self.opts, self.columns, f"{query}/{generation}", epoch, iterator)

    def commit(self, messages: list, batchId: int) -> None:
        pass  # every message was acknowledged before its task finished

    def abort(self, messages: list, batchId: int) -> None:
        pass  # a replay of this micro-batch will not repeat what was written
