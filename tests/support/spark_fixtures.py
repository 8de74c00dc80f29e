"""Fixtures and helpers of the Spark connector tests (tests/test_spark*.py), registered as a
plugin in tests/conftest.py's ``pytest_plugins``.

Every fixture is module-scoped: a test module gets one SparkSession (the JVM starts once per
run, see ``spark_session``) and one broker process, shared by its tests, which is why queue
names come from ``fresh``. The client is ``spark_client``, not ``hw``: conftest's ``hw`` is
the three-way client of the queue tests, and a Spark job needs a broker it can reach over
the network; a Spark test module names it ``hw`` with a fixture of its own.
"""

from __future__ import annotations

import itertools

import pytest

import headwater
from tests.support.broker_process import BrokerProcess

_names = itertools.count()


def fresh(prefix: str) -> str:
    """A queue name no other test of the run has used."""
    return f"{prefix}-{next(_names)}"


@pytest.fixture(scope="module")
def spark():
    """The run's SparkSession (``local[2]``), with format('headwater') registered."""
    pytest.importorskip("pyspark", reason="the Spark connector tests need pyspark: pip install 'headwater[spark]'")
    pytest.importorskip("pyarrow", reason="the Spark connector tests need pyarrow: pip install 'headwater[spark]'")
    from tests.support.spark_session import shared_spark

    session = shared_spark()
    yield session
    session.stop()


@pytest.fixture(scope="module")
def spark_broker(tmp_path_factory):
    """A ``headwater serve`` process for the module's Spark tests."""
    b = BrokerProcess(tmp_path_factory.mktemp("spark-broker") / "data").start()
    yield b
    if b.alive():
        b.terminate()


@pytest.fixture(scope="module")
def spark_client(spark_broker):
    """A network client of ``spark_broker``."""
    client = headwater.connect(spark_broker.address)
    yield client
    client.close()


def reader(spark, broker, queue, **options):
    """A batch read of ``queue`` with these options, loaded."""
    r = spark.read.format("headwater").option("servers", broker.address).option("queue", queue)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def scan(hw, queue):
    """Every record of ``queue``, read with the client (not Spark)."""
    return list(hw.scanner(queue))


def stream_reader(spark, broker, queue, **options):
    """A streaming read of ``queue`` with these options, loaded."""
    r = spark.readStream.format("headwater").option("servers", broker.address).option("queue", queue)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def run_available_now(spark, broker, source, sink, checkpoint, **options):
    """Stream ``source`` into ``sink`` through the connector until caught up (availableNow)."""
    query = (
        stream_reader(spark, broker, source, startingOffsets="earliest", **options)
        .select("key", "value", "tag", "properties")
        .writeStream.format("headwater")
        .option("servers", broker.address)
        .option("queue", sink)
        .queryName(f"to_{sink}".replace("-", "_"))  # Spark passes the name to the sink too
    )
    return finish_available_now(query, checkpoint)


def finish_available_now(writer, checkpoint):
    """Start the stream ``writer`` (a DataStreamWriter) with ``checkpoint``, until caught up
    (availableNow); the query, or what failed it, raised."""
    query = writer.option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start()
    query.awaitTermination(120)
    if query.exception() is not None:
        raise query.exception()
    return query
