"""A Spark job against a Headwater cluster, in Spark's ``local-cluster[2,1,1024]`` mode (two
executor processes of their own), run as a script by tests/test_spark_cluster.py, since one
process holds one SparkContext and the other Spark tests share a ``local[2]`` one.

``python -m tests.support.spark_cluster_job SERVERS QUEUE ROWS`` writes ROWS keyed rows to
QUEUE through ``format("headwater")``, reads the queue back, and prints one JSON line: the
rows read per partition, the distinct keys read, and the process ids that ran the read
tasks (so the test sees the executors were processes other than the driver).
"""

from __future__ import annotations

import json
import os
import sys


def main(servers: str, queue: str, rows: int) -> None:
    from tests.support.spark_session import spark_env

    spark_env()
    from pyspark.sql import SparkSession
    from pyspark.sql.functions import col, concat, lit, spark_partition_id

    import headwater.spark

    spark = (
        SparkSession.builder.master("local-cluster[2,1,1024]")
        .appName("headwater-cluster-job")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.default.parallelism", "4")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    headwater.spark.register(spark)
    try:
        (
            spark.range(rows, numPartitions=4)
            .select(
                concat(lit("key-"), col("id").cast("string")).cast("binary").alias("key"),
                col("id").cast("string").cast("binary").alias("value"),
            )
            .write.format("headwater")
            .mode("append")
            .option("servers", servers)
            .option("queue", queue)
            .save()
        )
        read = spark.read.format("headwater").option("servers", servers).option("queue", queue).load()
        per_partition = {str(r["partition"]): r["count"] for r in read.groupBy("partition").count().collect()}
        keys = read.select("key").distinct().count()
        pids = sorted(set(read.rdd.mapPartitions(lambda _: [os.getpid()]).collect()))
        tasks = read.select(spark_partition_id().alias("task")).distinct().count()
        print(
            json.dumps(
                {"per_partition": per_partition, "keys": keys, "pids": pids, "driver": os.getpid(), "tasks": tasks}
            )
        )
    finally:
        spark.stop()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
