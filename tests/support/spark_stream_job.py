"""A streaming job for crash tests: queue IN -> a slow map -> queue OUT, exactly once.

    python -m tests.support.spark_stream_job SERVERS IN OUT CHECKPOINT

It runs until killed; the test SIGKILLs its process group (the Python driver, the JVM and
Spark's Python workers at once) in the middle of a micro-batch, then restarts the same query
from CHECKPOINT with :func:`start_query` in its own session. The map sleeps per row and the
sink sends small record batches, so a micro-batch writes its output bit by bit over about a
second: a kill at a random moment lands between the first and the last of those writes.
"""

from __future__ import annotations

import sys
import time

ROWS_PER_TRIGGER = 120
ROW_SLEEP_S = 0.012
SINK_BATCH_BYTES = 1024


def start_query(
    spark, servers: str, source: str, sink: str, checkpoint: str, *, row_sleep_s: float, available_now: bool
):
    from pyspark.sql.functions import col, udf

    @udf(returnType="binary", useArrow=False)
    def slow(value):
        if row_sleep_s:
            time.sleep(row_sleep_s)
        return value

    df = (
        spark.readStream.format("headwater")
        .option("servers", servers)
        .option("queue", source)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(ROWS_PER_TRIGGER))
        .load()
    )
    writer = (
        df.select(col("key"), slow(col("value")).alias("value"), col("tag"), col("properties"))
        .writeStream.format("headwater")
        .option("servers", servers)
        .option("queue", sink)
        .option("maxBatchBytes", str(SINK_BATCH_BYTES))
        .option("checkpointLocation", checkpoint)
    )
    writer = writer.trigger(availableNow=True) if available_now else writer.trigger(processingTime="0 seconds")
    return writer.start()


def main() -> None:
    servers, source, sink, checkpoint = sys.argv[1:5]
    from tests.support.spark_session import shared_spark

    # Arrow batches of a few rows, so the sink gets (and sends) rows as the map makes them
    spark = shared_spark(
        "headwater-crash-job",
        **{
            "spark.sql.execution.arrow.maxRecordsPerBatch": "8",
            "spark.sql.execution.python.udf.maxRecordsPerBatch": "8",
        },
    )
    query = start_query(spark, servers, source, sink, checkpoint, row_sleep_s=ROW_SLEEP_S, available_now=False)
    print("started", query.id, flush=True)
    query.awaitTermination()


if __name__ == "__main__":
    main()
