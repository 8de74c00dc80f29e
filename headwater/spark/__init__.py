"""The PySpark connector: ``spark.read / readStream / write / writeStream .format("headwater")``.

Install with ``pip install 'headwater[spark]'`` (pyspark 4.2 or later, pyarrow), then::

    import headwater.spark
    headwater.spark.register(spark)

    df = (spark.read.format("headwater")
          .option("servers", "127.0.0.1:7070")
          .option("queue", "events")
          .load())

Every option, the schema and the exactly-once guarantees are in ``docs/spark.md``. The
connector talks to the broker only through the public network client, from the driver and
from every Spark worker.
"""

from __future__ import annotations

from typing import Any

__all__ = ["register", "HeadwaterDataSource", "READ_SCHEMA"]

PYSPARK_MIN = (4, 2)


def _check_pyspark() -> None:
    try:
        import pyarrow  # noqa: F401 - imported only to check that it is installed
        import pyspark
    except ImportError as e:
        raise ImportError(
            f"the Headwater Spark connector needs pyspark and pyarrow ({e}); install them with "
            f"pip install 'headwater[spark]'"
        ) from e
    version = tuple(int(x) for x in pyspark.__version__.split(".")[:2] if x.isdigit())
    if version < PYSPARK_MIN:
        raise ImportError(
            f"the Headwater Spark connector needs pyspark {'.'.join(map(str, PYSPARK_MIN))} or later "
            f"(read limits for maxOffsetsPerTrigger came in 4.2); this is pyspark {pyspark.__version__}"
        )


def register(spark: Any) -> None:
    """Make ``format("headwater")`` known to ``spark`` (a SparkSession); safe to call twice."""
    _check_pyspark()
    from headwater.spark.datasource import HeadwaterDataSource

    spark.dataSource.register(HeadwaterDataSource)


def __getattr__(name: str) -> Any:
    # pyspark is imported on first use, so the options and planning modules work without it
    if name == "HeadwaterDataSource":
        _check_pyspark()
        from headwater.spark.datasource import HeadwaterDataSource

        return HeadwaterDataSource
    if name == "READ_SCHEMA":
        _check_pyspark()
        from headwater.spark.schema import READ_SCHEMA

        return READ_SCHEMA
    raise AttributeError(f"module 'headwater.spark' has no attribute {name!r}")
