"""Batch write: a dataframe into a queue (value required; key, tag, properties, partition
optional), then read back.

    python examples/spark_batch_write.py [--servers HOST:PORT]
"""

from __future__ import annotations

from pyspark.sql.functions import col, concat, create_map, lit, struct, to_json
from spark_common import arguments, broker, spark_session

import headwater


def main() -> None:
    args = arguments(__doc__)
    with broker(args.servers) as servers:
        hw = headwater.connect(servers)
        if "clicks" not in {q.name for q in hw.admin.list_queues()}:
            hw.admin.create_queue("clicks", partitions=4)

        spark = spark_session("headwater-batch-write")
        clicks = spark.range(10_000).select(
            concat(lit("user-"), (col("id") % 97).cast("string")).alias("user"),
            concat(lit("/page/"), (col("id") % 13).cast("string")).alias("page"),
        )
        (
            clicks.select(
                to_json(struct("user", "page")).cast("binary").alias("value"),  # value must be binary
                col("user").cast("binary").alias("key"),  # same user, same partition
                lit("click").alias("tag"),
                create_map(lit("source"), lit("example")).alias("properties"),
            )
            .write.format("headwater")
            .mode("append")
            .option("servers", servers)
            .option("queue", "clicks")
            .save()
        )

        back = spark.read.format("headwater").option("servers", servers).option("queue", "clicks").load()
        back.groupBy("partition").count().orderBy("partition").show()
        back.selectExpr("cast(key as string) as key", "cast(value as string) as value", "tag", "properties").show(
            3, truncate=False
        )
        print("messages in clicks:", hw.admin.describe_queue("clicks").message_count)
        spark.stop()
        hw.close()


if __name__ == "__main__":
    main()
