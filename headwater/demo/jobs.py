"""The demo's Spark side: parse access-log lines, count page views and visitors per minute
as a Structured Streaming query (queue ``access-log`` -> queue ``page-stats``), and count
them again as a batch job over a time range of ``access-log``.

Both read and write through ``format("headwater")`` (:mod:`headwater.spark`), and both
apply the page-view rule of :mod:`headwater.demo.stats` with the same regular expressions.
They count differently on purpose, so that the cross-check means something: the streaming
query keeps running sets of visitors per window in Spark's state store and emits each
window once, when the watermark has passed it; the batch job filters the page views and
uses ``count(DISTINCT visitor)`` over all of them at once.
"""

from __future__ import annotations

import functools
import operator
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from headwater.demo.stats import (
    ASSET_PATTERN,
    HEALTH_PATH,
    LINE_PATTERN,
    ROBOT_WORDS,
    TIME_FORMAT_SPARK,
    Stats,
)

__all__ = ["start_spark", "parse", "start_streaming", "batch_stats", "SOURCE", "SINK", "WATERMARK", "SPARK_CONF"]

SOURCE = "access-log"
SINK = "page-stats"
WINDOW = "1 minute"
# How late a line may be (its timestamp behind the latest seen) and still be counted. The
# log is at most 8 s out of order and a micro-batch takes the same share of every
# partition's backlog, so a minute is ample; a line later than this would be dropped.
WATERMARK = "1 minute"

SPARK_CONF = {
    "spark.master": "local[2]",
    "spark.sql.shuffle.partitions": "2",  # also the state store's partitions
    "spark.default.parallelism": "2",
    "spark.sql.session.timeZone": "UTC",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.streaming.stopTimeout": "10s",
    "spark.driver.memory": "1g",
}


@contextmanager
def _stderr_to(path: Path) -> Iterator[None]:
    """Send file descriptor 2 to ``path`` while the JVM starts: the JVM (and the Python
    workers it starts later) keep that stderr for good, so Spark's console chatter goes to
    the log file and the terminal shows only the demo's own output."""
    sys.stderr.flush()
    saved = os.dup(2)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(fd, 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(fd)


def start_spark(log_path: Path, app: str = "headwater-demo"):
    """A local SparkSession (``local[2]``, loopback, UTC) that knows ``format("headwater")``.

    Spark's Python workers must run this interpreter, where headwater is installed, and
    Spark must bind to loopback: both are set before the JVM starts."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    import headwater.spark

    builder = SparkSession.builder.appName(app)
    for k, v in SPARK_CONF.items():
        builder = builder.config(k, v)
    with _stderr_to(log_path):
        spark = builder.getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
    headwater.spark.register(spark)
    return spark


def parse(lines):
    """Access-log messages (the connector's rows) -> ``time``, ``visitor``, ``page``
    (``page`` is null unless the line is a page view; see :mod:`headwater.demo.stats`)."""
    from pyspark.sql import functions as F

    # One regular expression match per line says whether it is a combined-log line at all;
    # the fields are then cut out at the quotes and spaces, and robots are found by
    # substring: about half the CPU time of a match per field and a case-insensitive
    # regular expression for the agent (300,000 lines: ~1.2 s instead of ~2.3 s here). On a
    # line that matches LINE_PATTERN the cuts give exactly its groups: the request, the
    # referer and the agent contain no quotes.
    text = F.col("value").cast("string")
    cut = lines.select(text.rlike(LINE_PATTERN).alias("ok"), F.split(text, '"').alias("q"))
    head, request = F.col("q")[0], F.split(F.col("q")[1], " ")
    fields = cut.where("ok").select(
        F.substring_index(head, " ", 1).alias("visitor"),
        F.substring_index(F.substring_index(head, "]", 1), "[", -1).alias("time"),
        request[0].alias("method"),
        F.substring_index(request[1], "?", 1).alias("path"),
        F.substring_index(F.ltrim(F.col("q")[2]), " ", 1).alias("status"),
        F.col("q")[5].alias("agent"),
    )
    path, agent = F.col("path"), F.lower("agent")
    robot = functools.reduce(operator.or_, [agent.contains(w) for w in ROBOT_WORDS])
    view = (
        (F.col("method") == "GET")
        & (F.col("status") == "200")
        & (path != HEALTH_PATH)
        & ~path.rlike(ASSET_PATTERN)
        & ~robot
    )
    return fields.select(
        F.try_to_timestamp("time", F.lit(TIME_FORMAT_SPARK)).alias("time"), "visitor", F.when(view, path).alias("page")
    )


def start_streaming(spark, servers: str, checkpoint: str, *, max_offsets_per_trigger: int, trigger_s: float = 1.0):
    """Start the streaming query ``access-log`` -> ``page-stats`` and return it.

    Results per (minute, page) and per minute are computed in one stateful aggregation
    (grouping sets) and written in append mode: each exactly once, when the watermark
    closes its window. Lines that are not page views are kept until the aggregation (their
    ``page`` is null and they count nothing): filtered out earlier, they could not move
    event time, because Spark pushes filters below the watermark."""
    from pyspark.sql import functions as F

    lines = (
        spark.readStream.format("headwater")
        .option("servers", servers)
        .option("queue", SOURCE)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(max_offsets_per_trigger))
        .load()
    )
    events = (
        parse(lines)
        .withWatermark("time", WATERMARK)
        .select(F.window("time", WINDOW).alias("window"), "visitor", "page")
    )
    results = (
        events.groupingSets([["window", "page"], ["window"]], "window", "page")
        .agg(
            F.count("page").alias("views"),
            F.size(F.collect_set(F.when(F.col("page").isNotNull(), F.col("visitor")))).alias("users"),
        )
        .where("views > 0")
    )
    messages = results.select(
        F.col("page").alias("key"),
        F.to_json(
            F.struct(
                F.date_format("window.start", "yyyy-MM-dd'T'HH:mm:ss'Z'").alias("window_start"),
                "page",
                "views",
                "users",
            )
        )
        .cast("binary")
        .alias("value"),
        F.when(F.col("page").isNull(), "window").otherwise("page").alias("tag"),
    )
    return (
        messages.writeStream.format("headwater")
        .option("servers", servers)
        .option("queue", SINK)
        .option("checkpointLocation", checkpoint)
        .outputMode("append")
        .trigger(processingTime=f"{int(trigger_s * 1000)} milliseconds")
        .start()
    )


def batch_stats(spark, servers: str, start_ms: int, end_ms: int) -> tuple[Stats, int]:
    """Count again, as a batch job over the lines appended in ``[start_ms, end_ms)``;
    returns the results and the number of lines read."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    lines = (
        spark.read.format("headwater")
        .option("servers", servers)
        .option("queue", SOURCE)
        .option("startingTimestamp", str(start_ms))
        .option("endingTimestamp", str(end_ms))
        .load()
    )
    parsed = parse(lines).persist(StorageLevel.MEMORY_ONLY)
    try:
        read = parsed.count()
        views = parsed.where(F.col("page").isNotNull()).select(
            F.unix_timestamp(F.window("time", WINDOW).start).alias("window_s"), "page", "visitor"
        )
        per_page = views.groupBy("window_s", "page").agg(
            F.count("*").alias("views"), F.countDistinct("visitor").alias("users")
        )
        per_window = views.groupBy("window_s").agg(
            F.count("*").alias("views"), F.countDistinct("visitor").alias("users")
        )
        rows = per_page.unionByName(per_window.withColumn("page", F.lit(None).cast("string"))).collect()
    finally:
        parsed.unpersist()
    return {(r.window_s, r.page): (r.views, r.users) for r in rows}, read
