"""Batch read: offsets, a time range and tags, from a queue into a Spark dataframe.

python examples/spark_batch_read.py [--servers HOST:PORT]
"""

from __future__ import annotations

import time

from spark_common import arguments, broker, spark_session

import headwater
from headwater import Message


def main() -> None:
    args = arguments(__doc__)
    with broker(args.servers) as servers:
        hw = headwater.connect(servers)
        if "orders" not in {q.name for q in hw.admin.list_queues()}:
            hw.admin.create_queue("orders", partitions=4)
        producer = hw.producer()
        producer.send_batch(
            "orders",
            [
                Message(
                    b'{"id": %d, "total": %d}' % (i, i * 10),
                    key=b"customer-%d" % (i % 20),
                    tag="paid" if i % 3 else "refund",
                )
                for i in range(1000)
            ],
        )
        middle = int(time.time() * 1000)
        producer.send_batch(
            "orders", [Message(b'{"id": %d}' % i, tag="paid") for i in range(1000, 1200)], partition=0
        )  # (unkeyed: else a random partition)

        spark = spark_session("headwater-batch-read")
        orders = (
            spark.read.format("headwater").option("servers", servers).option("queue", "orders").load()
        )  # earliest to latest, every partition
        print("all rows:", orders.count())
        orders.groupBy("partition").count().orderBy("partition").show()

        first_ten = (
            spark.read.format("headwater")
            .option("servers", servers)
            .option("queue", "orders")
            .option("startingOffsets", '{"0": 0, "1": 0}')
            .option("endingOffsets", '{"0": 5, "1": 5}')
            .option("partitions", "0,1")
            .load()
        )
        first_ten.selectExpr("partition", "offset", "cast(value as string) as value", "message_id").show(truncate=False)

        recent_paid = (
            spark.read.format("headwater")
            .option("servers", servers)
            .option("queue", "orders")
            .option("startingTimestamp", str(middle))
            .option("tags", "paid")
            .load()
        )
        print("paid since", middle, ":", recent_paid.count())
        spark.stop()
        hw.close()


if __name__ == "__main__":
    main()
