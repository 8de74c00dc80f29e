"""``HeadwaterDataSource``: the class Spark knows as ``format("headwater")``.

Spark creates it on the driver (in a Python planning process) with the options of the
query, and asks it for the schema, a reader or a writer. Options are parsed and checked
here, on the driver, so a wrong name or value fails when the query is defined, not in a
task on some worker.
"""

from __future__ import annotations

from pyspark.sql.datasource import DataSource
from pyspark.sql.types import StructType

from headwater.errors import InvalidArgumentError
from headwater.spark.connection import connect, describe
from headwater.spark.options import check_read_options, parse_read_options, parse_write_options
from headwater.spark.schema import READ_SCHEMA, check_write_schema
from headwater.spark.sink import HeadwaterBatchWriter, HeadwaterStreamWriter
from headwater.spark.source import HeadwaterBatchReader, HeadwaterStreamReader

__all__ = ["HeadwaterDataSource"]


def _no_overwrite(overwrite: bool) -> None:
    if overwrite:
        raise InvalidArgumentError(
            "a queue is append-only: mode('overwrite') is not supported; use mode('append'), "
            "after 'headwater queue truncate NAME' if the old messages must go"
        )


class HeadwaterDataSource(DataSource):
    """Read and write Headwater queues from Spark; see docs/spark.md for every option.

    >>> import headwater.spark                                      # doctest: +SKIP
    >>> headwater.spark.register(spark)                             # doctest: +SKIP
    >>> df = (spark.read.format("headwater")                        # doctest: +SKIP
    ...       .option("servers", "127.0.0.1:7070").option("queue", "events").load())
    """

    @classmethod
    def name(cls) -> str:
        return "headwater"

    def schema(self) -> StructType:
        # load() calls this, for spark.read and spark.readStream alike: a wrong value fails
        # there, not when the query is planned or, for a stream, in the background later
        check_read_options(self.options)
        return READ_SCHEMA

    def reader(self, schema: StructType) -> HeadwaterBatchReader:
        return HeadwaterBatchReader(parse_read_options(self.options, streaming=False), schema)

    def streamReader(self, schema: StructType) -> HeadwaterStreamReader:
        return HeadwaterStreamReader(parse_read_options(self.options, streaming=True), schema)

    def writer(self, schema: StructType, overwrite: bool) -> HeadwaterBatchWriter:
        _no_overwrite(overwrite)
        opts = parse_write_options(self.options, streaming=False)
        columns = check_write_schema(schema, queue_option=opts.queue)
        if opts.queue is not None:  # fail now, on the driver, rather than in every task
            client = connect(
                opts.servers,
                connect_timeout_s=opts.connect_timeout_s,
                request_timeout_s=opts.request_timeout_s,
                where="the Spark driver",
            )
            try:
                describe(client, opts.queue, opts.servers)
            finally:
                client.close()
        return HeadwaterBatchWriter(opts, columns)

    def streamWriter(self, schema: StructType, overwrite: bool) -> HeadwaterStreamWriter:
        # Spark also calls this for every micro-batch's commit: no network here.
        _no_overwrite(overwrite)
        opts = parse_write_options(self.options, streaming=True)
        return HeadwaterStreamWriter(opts, check_write_schema(schema, queue_option=opts.queue))
