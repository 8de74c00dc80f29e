"""One SparkSession for every Spark test in a pytest run (``local[2]``, loopback, quiet).

Spark's Python workers must run this interpreter (PYSPARK_PYTHON), and Spark must bind to
loopback (SPARK_LOCAL_IP); both are set before the JVM starts. ``getOrCreate`` hands every
caller the same session, so a test module asks for it in a module-scoped fixture and the
JVM starts once per run.
"""

from __future__ import annotations

import os
import sys

SPARK_CONF = {
    "spark.master": "local[2]",
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.streaming.stopTimeout": "10s",
    "spark.driver.memory": "1g",
}


def spark_env() -> None:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable


def shared_spark(app: str = "headwater-tests", **conf: str):
    """The process's SparkSession, created on first call, with format('headwater') registered."""
    spark_env()
    from pyspark.sql import SparkSession

    import headwater.spark

    builder = SparkSession.builder.appName(app)
    for k, v in {**SPARK_CONF, **conf}.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    headwater.spark.register(spark)
    return spark
