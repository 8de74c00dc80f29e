"""The Spark connector at its edges: empty reads, offsets that name partitions the read does
not cover, option values checked at load(), task retries whose input was cut short, and
batches of rows whose size is not in their bodies.

One SparkSession and one broker serve the module (the fixtures of tests/support/spark_fixtures.py). The
slow test runs Spark with task retries (``local[2,3]``) in a process of its own.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import headwater
from headwater.errors import InvalidArgumentError
from headwater.spark.options import parse_read_options, parse_write_options
from tests.support.broker_process import BrokerProcess
from tests.support.spark_fixtures import finish_available_now, fresh, reader, run_available_now, scan, stream_reader

# make test runs these alone, after the rest: Spark's JVM takes both cores
pytestmark = pytest.mark.serial

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def broker(spark_broker):
    """The module's broker process (one for every Spark test of the module)."""
    return spark_broker


@pytest.fixture(scope="module")
def hw(spark_client):
    """A network client of the module's broker; not conftest's ``hw``, as Spark needs a broker it can reach."""
    return spark_client


# -- options: no Spark needed -------------------------------------------------------


def test_partitions_option_stops_at_the_last_partition_a_queue_can_have():
    base = {"servers": "127.0.0.1:7070", "queue": "q"}
    assert parse_read_options({**base, "partitions": "0-3,99999"}, streaming=False).partitions == (0, 1, 2, 3, 99999)
    # a typo such as 0-1000000000 used to build a set of a billion numbers in the planner
    with pytest.raises(InvalidArgumentError, match="'partitions'.*past the last partition a queue can have"):
        parse_read_options({**base, "partitions": "0-100000"}, streaming=False)


def test_a_negative_partition_in_offsets_json_is_named_as_such():
    base = {"servers": "127.0.0.1:7070", "queue": "q"}
    with pytest.raises(InvalidArgumentError, match="'-1' is not a partition number"):
        parse_read_options({**base, "startingOffsets": '{"-1": 3}'}, streaming=False)


def test_the_kafka_connectors_option_names_point_to_headwaters():
    """A job moved from format("kafka") keeps its kafka.bootstrap.servers and subscribe:
    the error listed the valid names without saying which one was meant."""
    with pytest.raises(InvalidArgumentError, match=r"'kafka.bootstrap.servers' \(Kafka's; here: 'servers'\)"):
        parse_read_options({"kafka.bootstrap.servers": "h:1", "queue": "q"}, streaming=True)
    with pytest.raises(InvalidArgumentError, match=r"'subscribe' \(Kafka's; here: 'queue'\)"):
        parse_read_options({"servers": "h:1", "subscribe": "q"}, streaming=False)
    with pytest.raises(InvalidArgumentError, match=r"'topic' \(Kafka's; here: 'queue'\)"):
        parse_write_options({"servers": "h:1", "topic": "q"}, streaming=False)
    with pytest.raises(InvalidArgumentError, match=r"'kafka.acks' \(Kafka's; Headwater takes no kafka.\* options\)"):
        parse_write_options({"servers": "h:1", "queue": "q", "kafka.acks": "all"}, streaming=False)


def _offline_queue():
    from headwater.model.config import PartitionInfo, QueueConfig, QueueInfo

    parts = [PartitionInfo(0, 0, 10), PartitionInfo(1, 0, 0, online=False), PartitionInfo(2, 3, 8)]
    config = QueueConfig(partitions=3)
    return QueueInfo(name="q", queue_id=7, config=config, enabled=True, created_ms=0, partitions=parts)


def test_a_batch_read_over_a_partition_whose_leader_is_down_says_so_rather_than_reading_nothing():
    from headwater.errors import UnavailableError
    from headwater.spark.planning import batch_ranges, start_offsets

    base = {"servers": "127.0.0.1:7070", "queue": "q"}
    info = _offline_queue()
    with pytest.raises(UnavailableError, match=r"plan a batch read of 'q'.*q\[1\].*down or out of reach"):
        batch_ranges(parse_read_options(base, streaming=False), info, lambda p, t: 0)
    only = parse_read_options({**base, "partitions": "0,2"}, streaming=False)
    assert [(r.partition, r.start, r.end) for r in batch_ranges(only, info, lambda p, t: 0)] == [(0, 0, 10), (2, 3, 8)]
    # a stream starts the offline partition at 0 or at the offset given (read once it is back);
    # latest needs its end
    stream = parse_read_options({**base, "startingOffsets": '{"1": 5}'}, streaming=True)
    assert start_offsets(stream, info, lambda p, t: 0, [0, 1, 2])[1] == 5
    earliest = parse_read_options({**base, "startingOffsets": "earliest"}, streaming=True)
    assert start_offsets(earliest, info, lambda p, t: 0, [0, 1, 2]) == {0: 0, 1: 0, 2: 3}
    latest = parse_read_options({**base, "startingOffsets": "latest"}, streaming=True)
    with pytest.raises(UnavailableError, match=r"q\[1\]"):
        start_offsets(latest, info, lambda p, t: 0, [0, 1, 2])


def test_servers_with_a_broker_down_goes_to_the_next_without_waiting_out_the_timeout(broker):
    """The connector split ``servers`` and gave each address the whole connectTimeoutMs, so
    a first broker that refuses connections cost the driver and every task that long before
    the next was tried; the client's bootstrap list moves on at once."""
    from headwater.spark.connection import connect

    with socket.socket() as s:  # a port of 127.0.0.1 that nothing listens on: refused
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    began = time.monotonic()
    client = connect(f"127.0.0.1:{closed},{broker.address}", connect_timeout_s=60.0, request_timeout_s=60.0)
    try:
        assert client.admin.list_queues() is not None
    finally:
        client.close()
    assert time.monotonic() - began < 30  # not the 60 s of connectTimeoutMs spent on the refused address


# -- reading ------------------------------------------------------------------------


def test_a_batch_read_with_nothing_to_read_is_empty(spark, broker, hw):
    q = fresh("empty")
    hw.admin.create_queue(q, partitions=2)
    assert reader(spark, broker, q).collect() == []  # an empty queue
    hw.send_batch(q, [b"m%d" % i for i in range(10)])
    assert reader(spark, broker, q, startingOffsets="latest").count() == 0
    later = str(int(time.time() * 1000) + 3_600_000)
    assert reader(spark, broker, q, startingTimestamp=later).count() == 0
    assert reader(spark, broker, q).count() == 10


def test_offsets_json_naming_a_partition_outside_the_read_is_refused(spark, broker, hw):
    q = fresh("named")
    hw.admin.create_queue(q, partitions=2)
    for partition in range(2):
        hw.send_batch(q, [b"m%d" % i for i in range(10)], partition=partition)
    with pytest.raises(
        Exception, match=r"option 'startingOffsets' names partition 7, but queue .* has partitions 0..1"
    ):
        reader(spark, broker, q, startingOffsets='{"0": 1, "7": 3}').collect()
    with pytest.raises(
        Exception, match=r"option 'endingOffsets' names partitions 2, 5, but queue .* has partitions 0..1"
    ):
        reader(spark, broker, q, endingOffsets='{"0": 1, "5": 3, "2": 1}').collect()
    # a partition that option 'partitions' leaves out is not read, whatever its offset
    assert reader(spark, broker, q, partitions="0", startingOffsets='{"1": 3}').count() == 10
    with pytest.raises(Exception, match=r"option 'startingOffsets' names partition 3, but queue"):
        (
            spark.readStream.format("headwater")
            .option("servers", broker.address)
            .option("queue", q)
            .option("startingOffsets", '{"3": 0}')
            .load()
            .writeStream.format("noop")
            .trigger(availableNow=True)
            .start()
            .awaitTermination(60)
        )
    assert reader(spark, broker, q, startingOffsets='{"1": 4}', partitions="1").count() == 6


def test_bad_option_values_fail_at_load_for_batch_and_streaming(spark, broker, hw):
    q = fresh("atload")
    hw.admin.create_queue(q, partitions=1)
    bad = {
        "startingOffsets": '{"0":',
        "minPartitions": "many",
        "startingTimestamp": "yesterday",
        "partitions": "0-x",
        "failOnDataLoss": "yes",
    }
    for name, value in bad.items():
        for read in (spark.read, spark.readStream):
            r = read.format("headwater").option("servers", broker.address).option("queue", q).option(name, value)
            with pytest.raises(Exception, match=f"option '{name}'"):
                r.load()  # not later, at collect() or in the background of a running stream


# -- writing ------------------------------------------------------------------------


def _task_writer(broker, queue: str, **options: str):
    pytest.importorskip("pyarrow")
    from headwater.spark.schema import WriteColumns
    from headwater.spark.writing import TaskWriter

    opts = parse_write_options({"servers": broker.address, "queue": queue, **options}, streaming=False)

    def task(cols: dict[str, str]) -> TaskWriter:
        return TaskWriter(opts, WriteColumns(cols, key_is_string=False), "batch-edges", task=3, epoch=0)

    return task


def test_a_task_retried_after_its_input_was_cut_short_writes_each_row_once(broker, hw):
    """When a stage feeding a write task fails, Spark ends the task's input as if it were
    complete: the task flushes the rows it holds (a last batch smaller than a full one) and
    Spark runs it again. The retry's batch at that sequence is longer; it used to be refused
    as "not deterministic", failing the job (and a streaming query at every restart)."""
    import pyarrow as pa

    q = fresh("cutshort")
    hw.admin.create_queue(q, partitions=3)
    task = _task_writer(broker, q, maxBatchBytes="1024")
    rows = pa.record_batch([pa.array([b"row-%05d-" % i + b"x" * 40 for i in range(2000)])], names=["value"])
    for cut in (700, 1300):  # two attempts cut short, at different places
        w = task({"value": "value"})
        w.write_batch(rows.slice(0, cut))
        w.finish()  # what Spark's worker does when the input ends early
    w = task({"value": "value"})
    w.write_batch(rows)
    assert w.finish().total == 2000
    bodies = [r.body for r in scan(hw, q)]
    assert sorted(bodies) == sorted(rows.column(0).to_pylist())  # each exactly once
    again = task({"value": "value"})  # and one more retry of the whole task adds nothing
    again.write_batch(rows)
    again.finish()
    assert len(scan(hw, q)) == 2000


def test_rows_whose_size_is_not_in_the_body_still_make_batches_under_the_limit(broker, hw):
    """Rows with empty bodies and large properties, keys or tags used to count as 0 bytes:
    a task gathered them all into one batch, which the broker refused past 64 MiB."""
    import pyarrow as pa

    q = fresh("propsize")
    hw.admin.create_queue(q, partitions=1)
    task = _task_writer(broker, q)
    n = 36_000
    props = pa.array([[("blob", "p" * 2000)]] * n, pa.map_(pa.string(), pa.string()))
    rows = pa.record_batch([pa.array([b""] * n), props], names=["value", "properties"])
    w = task({"value": "value", "properties": "properties"})
    w.write_batch(rows)
    assert w.finish().total == n
    assert len(scan(hw, q)) == n


def test_a_replay_after_partitions_were_added_to_its_queue_says_so(broker, hw):
    """Rows go to ``key_hash(key) % partitions``: partitions added to the output queue between
    a micro-batch's first run and its replay send the replay's rows elsewhere. The broker
    refuses the smaller batches, and the error blamed only a query that is not
    deterministic, sending the user after rand() in a query that has none."""
    import pyarrow as pa

    q = fresh("grown")
    hw.admin.create_queue(q, partitions=3)
    task = _task_writer(broker, q)
    rows = pa.record_batch(
        [pa.array([b"v%d" % i for i in range(100)]), pa.array([b"k%d" % i for i in range(100)])], names=["value", "key"]
    )
    w = task({"value": "value", "key": "key"})
    w.write_batch(rows)
    w.finish()
    hw.admin.add_partitions(q, 4)
    w = task({"value": "value", "key": "key"})
    w.write_batch(rows)
    with pytest.raises(InvalidArgumentError, match=r"not deterministic .*, or queue .* has more partitions than"):
        w.finish()


# -- retries in real Spark (own process: local mode retries only with local[N,F]) --------


_JOB = r"""
import sys
from tests.support.spark_session import shared_spark
import headwater
from pyspark import TaskContext
from pyspark.sql.functions import udf

servers, out, src, sink, ck = sys.argv[1:6]
spark = shared_spark(**{"spark.master": "local[2,3]", "spark.sql.execution.arrow.maxRecordsPerBatch": "100"})

@udf("binary")
def flaky(i):  # the first attempt of task 1 fails part way, after it wrote some batches
    ctx = TaskContext.get()
    if ctx.attemptNumber() == 0 and ctx.partitionId() == 1 and i == 8000:
        raise RuntimeError("boom on the first attempt")
    return b"row-%07d-" % i + b"x" * 50

(spark.range(0, 10000, 1, 2).select(flaky("id").alias("value"))
 .write.format("headwater").mode("append").option("servers", servers).option("queue", out)
 .option("maxBatchBytes", "2048").save())

@udf("binary")
def flaky_stream(v):
    ctx = TaskContext.get()
    if ctx.attemptNumber() == 0 and ctx.partitionId() == 0 and int(v) > 1500 and v.endswith(b"00"):
        raise RuntimeError("boom on the first attempt")
    return v

query = (spark.readStream.format("headwater").option("servers", servers).option("queue", src)
         .option("startingOffsets", "earliest").load()
         .select(flaky_stream("value").alias("value"))
         .writeStream.format("headwater").option("servers", servers).option("queue", sink)
         .option("maxBatchBytes", "1024").option("checkpointLocation", ck)
         .trigger(availableNow=True).start())
query.awaitTermination(120)
if query.exception() is not None:
    raise query.exception()
spark.stop()
"""


@pytest.mark.slow
def test_spark_task_retries_write_each_row_once(tmp_path):
    b = BrokerProcess(tmp_path / "data").start()
    client = headwater.connect(b.address)
    try:
        client.admin.create_queue("out", partitions=3)
        client.admin.create_queue("src", partitions=2)
        client.admin.create_queue("sink", partitions=3)
        client.send_batch("src", [b"%06d" % i for i in range(6000)])
        job = subprocess.run(
            [sys.executable, "-c", _JOB, b.address, "out", "src", "sink", str(tmp_path / "ck")],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            capture_output=True,
            timeout=300,
        )
        assert job.returncode == 0, job.stderr.decode()[-4000:]
        out = [r.body for r in client.scanner("out")]
        assert len(out) == 10_000 and len(set(out)) == 10_000
        sink = [r.body for r in client.scanner("sink")]
        assert sorted(sink) == [b"%06d" % i for i in range(6000)]
    finally:
        client.close()
        b.terminate()


def test_a_value_over_the_queue_limit_says_how_to_write_it(spark, broker, hw):
    q = fresh("toolarge")
    hw.admin.create_queue(q, partitions=1, message_bytes_max=1024)
    df = spark.sql("select cast(repeat('x', 2000) as binary) as value")
    with pytest.raises(
        Exception, match=r"a row's value is too large for queue .*length\('value'\) <= 1024.*--message-bytes-max"
    ):
        df.write.format("headwater").mode("append").option("servers", broker.address).option("queue", q).save()


@pytest.mark.slow  # ~11 s of streaming; the time-range batch reads run by default
def test_a_stream_starting_at_a_future_time_leaves_out_what_comes_before_it(spark, broker, hw, tmp_path):
    """A startingTimestamp past the last message put the stream's start at the end of the
    partition, and what was appended there before that time was read."""
    src, dst = fresh("future-in"), fresh("future-out")
    hw.admin.create_queue(src, partitions=1)
    hw.admin.create_queue(dst, partitions=1)
    hw.send_batch(src, [b"before"] * 3, partition=0)
    start_ms = int(time.time() * 1000) + 10_000
    ck = tmp_path / "ck"
    run_available_now(spark, broker, src, dst, ck, startingTimestamp=str(start_ms))
    hw.send_batch(src, [b"early"] * 2, partition=0)
    assert max(r.timestamp_ms for r in scan(hw, src)) < start_ms  # appended before the start time
    run_available_now(spark, broker, src, dst, ck, startingTimestamp=str(start_ms))
    time.sleep(max(0.0, start_ms / 1000 - time.time()) + 0.05)
    hw.send_batch(src, [b"on time"] * 4, partition=0)
    run_available_now(spark, broker, src, dst, ck, startingTimestamp=str(start_ms))
    assert [r.body for r in scan(hw, dst)] == [b"on time"] * 4


def test_a_start_moved_past_the_end_by_a_time_or_lost_offsets_reads_nothing(spark, broker, hw):
    """startingTimestamp after endingOffsets, or failOnDataLoss=false skipping to a retained
    start past endingOffsets, used to fail as "endingOffsets ... is before its start"."""
    q = fresh("moved")
    hw.admin.create_queue(q, partitions=1)
    hw.send_batch(q, [b"old"] * 10, partition=0)
    hw.admin.truncate_queue(q)
    hw.send_batch(q, [b"new"] * 5, partition=0)
    assert (
        reader(spark, broker, q, startingOffsets='{"0": 0}', endingOffsets='{"0": 5}', failOnDataLoss="false").count()
        == 0
    )
    later = str(max(r.timestamp_ms for r in scan(hw, q)) + 1)
    assert reader(spark, broker, q, startingTimestamp=later, endingOffsets='{"0": 12}').count() == 0
    with pytest.raises(Exception, match=r"endingOffsets: offset 11 of partition 0 is before its start 12"):
        reader(spark, broker, q, startingOffsets='{"0": 12}', endingOffsets='{"0": 11}').collect()


def test_an_empty_tag_says_how_to_write_no_tag(spark, broker, hw):
    q = fresh("emptytag")
    hw.admin.create_queue(q, partitions=1)
    df = spark.sql("select cast('x' as binary) as value, '' as tag")
    with pytest.raises(Exception, match=r"a row's tag is '' \(empty\).*nullif\(tag, ''\)"):
        df.write.format("headwater").mode("append").option("servers", broker.address).option("queue", q).save()
    df.selectExpr("value", "nullif(tag, '') as tag").write.format("headwater").mode("append").option(
        "servers", broker.address
    ).option("queue", q).save()
    assert [(r.body, r.tag) for r in scan(hw, q)] == [(b"x", None)]


@pytest.mark.parametrize("per_batch", [1, 40])
def test_a_read_task_keeps_each_rows_offset_time_and_columns(per_batch):
    """Batches of one message, each appended at its own time (a producer sending one at a
    time: a run of offsets and one time per row), and batches of several: every row comes
    out with its offset, time, body and key, keyed and compressed batches among them, from
    a start and to an end inside batches; a damaged batch is named as such."""
    import msgspec

    from headwater import Message
    from headwater.errors import CorruptDataError, QueueNotFoundError
    from headwater.model.batch import encode_batch
    from headwater.spark.reading import ReadTask, _read
    from headwater.spark.schema import READ_SCHEMA, arrow_schema
    from headwater.testing import FakeClock, open_memory

    clock = FakeClock()
    hw = open_memory(clock=clock)
    qi = hw.admin.create_queue("q", partitions=1, ttl_s=None)
    expect = []  # (offset, time in µs, body, key)
    for b in range(3000 // per_batch):
        keyed = b % 3 == 1
        msgs = [
            Message(b"%d" % len(expect) + b"-" + bytes(i), key=b"k%d" % b) if keyed else b"%d" % (len(expect) + i)
            for i in range(per_batch)
        ]
        hw.service.produce("q", 0, encode_batch(msgs, compression="zstd" if b % 7 == 5 else None))
        t_us = int(clock() * 1000) * 1000
        expect += [
            (len(expect) + i, t_us, m.body if keyed else m, m.key if keyed else None) for i, m in enumerate(msgs)
        ]
        clock.advance(0.001 if b % 4 else 0)  # some batches share an append time
    start, end = 5, len(expect) - 3
    task = ReadTask("", "q", qi.queue_id, 0, start, end, None, True, 64 << 10, 10.0, 60.0)
    schema = arrow_schema(READ_SCHEMA)
    rows = [r for batch in _read(hw.service, task, schema) for r in batch.to_pylist()]
    got = [(r["offset"], int(r["timestamp"].timestamp() * 1_000_000), r["value"], r["key"]) for r in rows]
    assert got == expect[start:end]

    class Damaging:  # a broker whose stored bytes were damaged: its last batch's last byte flipped
        def fetch(self, *args, **kwargs):
            res = hw.service.fetch(*args, **kwargs)
            batches = [bytearray(b) for b in res.batches]
            batches[-1][-1] ^= 0xFF
            return msgspec.structs.replace(res, batches=batches)

    with pytest.raises(CorruptDataError, match=r"a stored batch of queue 'q' failed its checks \(batch checksum"):
        list(_read(Damaging(), task, schema))

    # the queue deleted and created again between planning and reading: its batches carry
    # another queue id, and the planned offsets would name other messages
    hw.admin.delete_queue("q")
    hw.admin.create_queue("q", partitions=1, ttl_s=None)
    for compression in (None, "zstd"):  # a plain batch, and one decoded the long way
        hw.service.produce("q", 0, encode_batch([b"new"] * 5000, compression=compression))
    for start in (5, 5003):
        again = ReadTask("", "q", qi.queue_id, 0, start, 10_000, None, True, 64 << 10, 10.0, 60.0)
        with pytest.raises(QueueNotFoundError, match=r"queue 'q' was deleted and created again after this read was pl"):
            list(_read(hw.service, again, schema))


# -- a broker that lost messages a read had seen -------------------------------------


def test_a_read_task_past_the_end_of_its_partition_fails_or_stops_as_asked(broker, hw):
    """A task planned for offsets the partition no longer has (the broker lost its tail
    between planning and reading, or before a micro-batch was replayed) used to stop at
    the end as if the range were read, returning fewer rows without a word."""
    pytest.importorskip("pyarrow")
    from headwater.errors import MessageNotFoundError
    from headwater.spark.reading import ReadTask, read_arrow
    from headwater.spark.schema import READ_SCHEMA, arrow_schema

    q = fresh("pastend")
    info = hw.admin.create_queue(q, partitions=1)
    hw.send_batch(q, [b"m%d" % i for i in range(10)], partition=0)

    def rows(fail_on_data_loss: bool) -> int:
        task = ReadTask(broker.address, q, info.queue_id, 0, 4, 25, None, fail_on_data_loss, 1 << 20, 10.0, 60.0)
        return sum(batch.num_rows for batch in read_arrow(task, arrow_schema(READ_SCHEMA)))

    with pytest.raises(MessageNotFoundError, match=r"partition 0 of queue .* ends at offset 10, but offsets up to 24"):
        rows(True)
    assert rows(False) == 6  # what there is, 4..9


@pytest.mark.slow  # three broker starts and four streaming runs, ~25 s
def test_a_stream_whose_partition_ends_below_its_position_fails_or_reads_on_from_the_end(spark, broker, hw, tmp_path):
    """A broker that lost acknowledged messages (a power loss under the async flush policy,
    a data directory restored from a copy) ends a partition below the position in a query's
    checkpoint, and what is appended next takes those offsets again. The query kept its
    position and skipped those messages without a word, even with failOnDataLoss=true;
    Kafka's connector reports the offset that went back as data loss."""
    data, copy = tmp_path / "data", tmp_path / "copy"
    src, dst = "lost-in", fresh("lost-out")  # the output queue on the module's broker, which loses nothing
    hw.admin.create_queue(dst, partitions=1)
    b = BrokerProcess(data).start()
    try:
        with headwater.connect(b.address) as client:
            client.admin.create_queue(src, partitions=1)
            client.send_batch(src, [b"a%d" % i for i in range(5)], partition=0)
        b.terminate()
        shutil.copytree(data, copy)  # the state the broker will fall back to
        b.start()
        with headwater.connect(b.address) as client:
            client.send_batch(src, [b"b%d" % i for i in range(5)], partition=0)  # offsets 5..9

        def run(**options: str) -> None:
            writer = (
                stream_reader(spark, b, src, startingOffsets="earliest", **options)
                .select("value")
                .writeStream.format("headwater")
                .option("servers", broker.address)
                .option("queue", dst)
            )
            finish_available_now(writer, tmp_path / "ck")

        run()
        assert len(scan(hw, dst)) == 10
        b.terminate()
        shutil.rmtree(data)
        shutil.copytree(copy, data)  # offsets 5..9 are gone; the next message takes offset 5
        b.start()
        with pytest.raises(Exception, match=r"partition 0 of queue 'lost-in' ends at offset 5, but offsets up to 9"):
            run()
        run(failOnDataLoss="false")  # goes back to the partition's end
        with headwater.connect(b.address) as client:
            client.send_batch(src, [b"c%d" % i for i in range(3)], partition=0)  # offsets 5..7 again
        run()
        want = [b"a%d" % i for i in range(5)] + [b"b%d" % i for i in range(5)] + [b"c%d" % i for i in range(3)]
        assert [r.body for r in scan(hw, dst)] == want
    finally:
        if b.alive():
            b.terminate()


def test_a_micro_batch_replayed_on_a_queue_created_again_fails_rather_than_reads_it(spark, broker, hw, tmp_path):
    """A micro-batch planned but not committed before a crash is replayed with its offsets
    when the query restarts. If the queue was deleted and created again meanwhile, the
    replay used to read the new queue's messages at the old queue's offsets (the queue id
    was checked only when the next micro-batch was planned)."""
    src = fresh("again")
    hw.admin.create_queue(src, partitions=1)
    seen: list[bytes] = []
    ck = tmp_path / "ck"

    def run() -> None:
        reader = stream_reader(spark, broker, src, startingOffsets="earliest", maxOffsetsPerTrigger="10")
        finish_available_now(
            reader.writeStream.foreachBatch(lambda df, _: seen.extend(bytes(r.value) for r in df.collect())), ck
        )

    hw.send_batch(src, [b"x%d" % i for i in range(10)] + [b"y%d" % i for i in range(5)], partition=0)
    run()  # two micro-batches: x, then y
    for name in ("1", ".1.crc"):  # micro-batch 1 planned, not committed: as after a crash
        (ck / "commits" / name).unlink()
    hw.admin.delete_queue(src)
    hw.admin.create_queue(src, partitions=1)
    hw.send_batch(src, [b"z%d" % i for i in range(20)], partition=0)
    with pytest.raises(Exception, match=r"queue '.*' was deleted and created again since this query's checkpoint"):
        run()
    assert seen == [b"x%d" % i for i in range(10)] + [b"y%d" % i for i in range(5)]  # nothing of the new queue
