"""Structured Streaming: queue -> transform -> queue, exactly once, restartable.

A query reads queue ``events``, upper-cases each body and writes it to ``events-upper``,
keeping its position in a checkpoint. It runs twice with Trigger.AvailableNow: the second
run reads only what arrived since the first (no message lost, none repeated).

    python examples/spark_streaming.py [--servers HOST:PORT]
"""

from __future__ import annotations

import tempfile

from pyspark.sql.functions import col, upper
from spark_common import arguments, broker, spark_session

import headwater


def run_once(spark, servers: str, checkpoint: str) -> None:
    query = (
        spark.readStream.format("headwater")
        .option("servers", servers)
        .option("queue", "events")
        .option("startingOffsets", "earliest")  # for the first run; then the checkpoint
        .option("maxOffsetsPerTrigger", "500")  # at most 500 messages a micro-batch
        .load()
        .select("key", upper(col("value").cast("string")).cast("binary").alias("value"), "tag")
        .writeStream.format("headwater")
        .option("servers", servers)
        .option("queue", "events-upper")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)  # process what is there, then stop
        .start()
    )
    query.awaitTermination()
    print("micro-batches:", [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]])


def main() -> None:
    args = arguments(__doc__)
    with broker(args.servers) as servers:
        hw = headwater.connect(servers)
        existing = {q.name for q in hw.admin.list_queues()}
        for name in ("events", "events-upper"):
            if name not in existing:
                hw.admin.create_queue(name, partitions=4)
        producer = hw.producer()
        producer.send_batch("events", [b"event %d" % i for i in range(1200)])

        spark = spark_session("headwater-streaming")
        checkpoint = tempfile.mkdtemp(prefix="headwater-checkpoint-")
        run_once(spark, servers, checkpoint)
        print("events-upper holds", hw.admin.describe_queue("events-upper").message_count)

        producer.send_batch("events", [b"late event %d" % i for i in range(300)])
        run_once(spark, servers, checkpoint)  # resumes where the checkpoint says
        print("events-upper holds", hw.admin.describe_queue("events-upper").message_count)
        print("a sample:", [r.body for r in hw.scanner("events-upper", partitions=0)][:3])
        spark.stop()
        hw.close()


if __name__ == "__main__":
    main()
