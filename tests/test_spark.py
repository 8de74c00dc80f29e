"""The PySpark connector against a real SparkSession (local[2]) and a real broker process.

One SparkSession and one broker serve the module; each test works in queues of its own.
The crash test runs a streaming job in a subprocess and SIGKILLs it mid-batch.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import headwater
from headwater import Message
from headwater.errors import InvalidArgumentError
from headwater.spark.options import parse_offsets, parse_read_options, parse_timestamp_ms, parse_write_options
from headwater.spark.planning import OffsetRange, StreamOffset, rate_limit, split_ranges
from tests.support.broker_process import BrokerProcess
from tests.support.spark_fixtures import fresh, reader, run_available_now, scan, stream_reader

# make test runs these alone, after the rest: Spark's JVM takes both cores
pytestmark = pytest.mark.serial

ROOT = Path(__file__).resolve().parent.parent
# -- options and planning: no Spark needed ------------------------------------------


def test_unknown_option_is_named_with_the_valid_ones():
    with pytest.raises(InvalidArgumentError) as e:
        parse_read_options({"servers": "h:1", "queue": "q", "startingoffset": "earliest"}, streaming=False)
    msg = str(e.value)
    assert "'startingoffset'" in msg and "did you mean 'startingOffsets'" in msg
    for name in (
        "servers",
        "queue",
        "startingOffsets",
        "endingOffsets",
        "maxOffsetsPerTrigger",
        "failOnDataLoss",
        "minPartitions",
        "tags",
    ):
        assert name in msg
    with pytest.raises(InvalidArgumentError, match="partitioner"):
        parse_write_options({"servers": "h:1", "queue": "q", "partitionr": "key"}, streaming=False)


def test_option_values_are_checked():
    base = {"servers": "127.0.0.1:7070", "queue": "q"}
    with pytest.raises(InvalidArgumentError, match="servers"):
        parse_read_options({**base, "servers": "nohostport"}, streaming=False)
    with pytest.raises(InvalidArgumentError, match="endingOffsets.*batch"):
        parse_read_options({**base, "endingOffsets": "latest"}, streaming=True)
    with pytest.raises(InvalidArgumentError, match="maxOffsetsPerTrigger.*streaming"):
        parse_read_options({**base, "maxOffsetsPerTrigger": "10"}, streaming=False)
    with pytest.raises(InvalidArgumentError, match="whole number"):
        parse_read_options({**base, "minPartitions": "many"}, streaming=False)
    with pytest.raises(InvalidArgumentError, match="true' or 'false"):
        parse_read_options({**base, "failOnDataLoss": "yes"}, streaming=False)
    with pytest.raises(InvalidArgumentError, match="named twice"):
        parse_read_options({**base, "path": "other"}, streaming=False)
    opts = parse_read_options(
        {"servers": "127.0.0.1:7070", "path": "q", "startingtimestamp": "2024-05-01T00:00:00Z", "tags": "b, a"},
        streaming=False,
    )
    assert opts.queue == "q" and opts.starting_timestamp_ms == 1714521600000 and opts.tags == ("a", "b")


def test_timestamps_in_ms_or_iso_8601_a_fraction_of_a_ms_rounded_up():
    assert parse_timestamp_ms("1795255200000", "startingTimestamp") == 1795255200000
    assert parse_timestamp_ms("2026-11-21T10:00:00Z", "startingTimestamp") == 1795255200000
    assert parse_timestamp_ms("2026-11-21T10:00:00", "startingTimestamp") == 1795255200000  # naive: UTC
    assert parse_timestamp_ms("2026-11-21T11:00:00.000500+01:00", "endingTimestamp") == 1795255200001
    with pytest.raises(InvalidArgumentError, match="'endingTimestamp' is milliseconds since the epoch or an ISO"):
        parse_timestamp_ms("yesterday", "endingTimestamp")


def test_offsets_json_in_every_accepted_form():
    assert parse_offsets('{"0": 5, "1": -2}', "startingOffsets", "q").offsets == {0: 5, 1: -2}
    assert parse_offsets('{"q": {"3": 7}}', "startingOffsets", "q").offsets == {3: 7}
    cp = json.dumps(StreamOffset("q", 4, {0: 9, 1: 2}).to_json())
    assert parse_offsets(cp, "startingOffsets", "q").offsets == {0: 9, 1: 2}
    with pytest.raises(InvalidArgumentError, match="not 'q'"):
        parse_offsets('{"other": {"0": 1}}', "startingOffsets", "q")
    with pytest.raises(InvalidArgumentError, match="earliest"):
        parse_offsets('{"0": -2}', "endingOffsets", "q", allow_earliest=False)
    with pytest.raises(InvalidArgumentError, match="JSON"):
        parse_offsets("{0: 1}", "startingOffsets", "q")


def test_rate_limit_never_takes_more_than_the_limit():
    starts = {0: 0, 1: 100, 2: 5, 3: 0}
    ends = {0: 1000, 1: 101, 2: 5, 3: 37}
    for limit in (1, 2, 3, 7, 50, 999, 1038, 5000):
        out = rate_limit(starts, ends, limit)
        taken = sum(out[p] - starts[p] for p in starts)
        assert taken == min(limit, 1038)
        assert all(starts[p] <= out[p] <= ends[p] for p in starts)
    assert rate_limit(starts, ends, 100)[0] > rate_limit(starts, ends, 100)[3]  # in proportion


def test_split_ranges_covers_every_offset_once():
    ranges = [OffsetRange(0, 0, 1000), OffsetRange(1, 50, 53), OffsetRange(2, 7, 8)]
    for want in (None, 1, 3, 4, 10, 100, 5000):
        pieces = split_ranges(ranges, want)
        assert len(pieces) >= min(want or 0, sum(r.size for r in ranges))
        for r in ranges:
            covered = sorted(o for x in pieces if x.partition == r.partition for o in range(x.start, x.end))
            assert covered == list(range(r.start, r.end))


def test_docstring_examples_of_the_pure_modules():
    import doctest

    import headwater.spark.options
    import headwater.spark.planning

    for module in (headwater.spark.options, headwater.spark.planning):
        result = doctest.testmod(module)
        assert result.failed == 0 and result.attempted > 0, module.__name__


# -- fixtures (the shared ones are in tests/support/spark_fixtures.py) -------------------


@pytest.fixture(scope="module")
def broker(spark_broker):
    """The module's broker process (one for every Spark test of the module)."""
    return spark_broker


@pytest.fixture(scope="module")
def hw(spark_client):
    """A network client of the module's broker; not conftest's ``hw``, as Spark needs a broker it can reach."""
    return spark_client


# -- batch read ---------------------------------------------------------------------


def test_batch_read_of_an_offset_range_returns_exactly_those_rows(spark, broker, hw):
    q = fresh("offsets")
    hw.admin.create_queue(q, partitions=3)
    p = hw.producer()
    for part in range(3):
        for chunk in range(4):  # several stored batches per partition
            p.send_batch(q, [f"{part}:{chunk * 5 + i}".encode() for i in range(5)], partition=part)
    df = reader(
        spark,
        broker,
        q,
        startingOffsets='{"0": 3, "1": 0, "2": 19}',
        endingOffsets='{"0": 11, "1": -1}',
        partitions="0,1",
    )
    got = sorted((r.partition, r.offset, bytes(r.value)) for r in df.collect())
    want = [(0, o, f"0:{o}".encode()) for o in range(3, 11)] + [(1, o, f"1:{o}".encode()) for o in range(20)]
    assert got == want
    assert df.rdd.getNumPartitions() == 2  # one Spark partition per queue partition read

    everything = reader(spark, broker, q).collect()
    assert len(everything) == 60
    r = next(x for x in everything if x.partition == 2 and x.offset == 7)
    assert r.queue == q and r.message_id == str(headwater.MessageId(hw.admin.describe_queue(q).queue_id, 2, 7))
    assert hw.get(r.message_id).body == bytes(r.value) == b"2:7"


def test_batch_read_of_a_time_range_returns_exactly_those_rows(spark, broker, hw):
    q = fresh("times")
    hw.admin.create_queue(q, partitions=2)
    p = hw.producer()
    for phase in "abc":
        for part in range(2):
            p.send_batch(q, [f"{phase}{i}".encode() for i in range(10)], partition=part)
        time.sleep(0.03)
    recs = scan(hw, q)
    t_b = min(r.timestamp_ms for r in recs if r.body.startswith(b"b"))
    t_c = min(r.timestamp_ms for r in recs if r.body.startswith(b"c"))
    df = reader(spark, broker, q, startingTimestamp=str(t_b), endingTimestamp=str(t_c))
    rows = df.collect()
    assert sorted(bytes(r.value) for r in rows) == sorted(f"b{i}".encode() for i in range(10) for _ in range(2))
    by_offset = {(r.partition, r.offset): r.timestamp_ms for r in recs}
    for row in rows:  # timestamps arrive exactly (millisecond precision, UTC)
        assert int(row.timestamp.timestamp() * 1000) == by_offset[(row.partition, row.offset)]
    # times and offsets bound the range together
    df2 = reader(spark, broker, q, startingTimestamp=str(t_b), endingOffsets='{"0": 15, "1": 15}')
    assert sorted(bytes(r.value) for r in df2.collect()) == sorted(f"b{i}".encode() for i in range(5) for _ in range(2))


def test_batch_read_filters_by_tags_and_splits_for_min_partitions(spark, broker, hw):
    q = fresh("tags")
    hw.admin.create_queue(q, partitions=2)
    p = hw.producer()
    p.send_batch(q, [Message(f"x{i}".encode(), tag=["paid", "refund", None][i % 3]) for i in range(300)], partition=0)
    p.send_batch(q, [Message(b"only-untagged") for _ in range(50)], partition=1)  # skipped by mask
    paid = reader(spark, broker, q, tags="paid").collect()
    assert sorted(bytes(r.value) for r in paid) == sorted(f"x{i}".encode() for i in range(0, 300, 3))
    assert {r.tag for r in paid} == {"paid"}
    both = reader(spark, broker, q, tags="paid,refund")
    assert both.count() == 200
    split = reader(spark, broker, q, minPartitions="7")
    assert split.rdd.getNumPartitions() >= 7
    assert sorted((r.partition, r.offset) for r in split.select("partition", "offset").collect()) == sorted(
        [(0, o) for o in range(300)] + [(1, o) for o in range(50)]
    )


# -- batch write --------------------------------------------------------------------


def test_batch_write_then_read_back_round_trips_bytes_keys_tags_and_properties(spark, broker, hw):
    from pyspark.sql.types import BinaryType, MapType, StringType, StructField, StructType

    q = fresh("roundtrip")
    hw.admin.create_queue(q, partitions=4)
    rows = [
        (bytes(range(256)), b"\x00key\xff", "t1", {"a": "1", "ünï": "cödé"}),
        (b"", None, None, None),
        (b"\x00" * 1000, b"k2", None, {}),
        (b"plain", None, "t2", None),
    ] + [(f"v{i}".encode(), f"key{i % 7}".encode(), None, {"i": str(i)}) for i in range(200)]
    schema = StructType(
        [
            StructField("value", BinaryType()),
            StructField("key", BinaryType()),
            StructField("tag", StringType()),
            StructField("properties", MapType(StringType(), StringType())),
        ]
    )
    df = spark.createDataFrame(rows, schema).repartition(3)
    df.write.format("headwater").mode("append").option("servers", broker.address).option("queue", q).save()

    back = reader(spark, broker, q).collect()

    def norm(value, key, tag, props):
        return (bytes(value), None if key is None else bytes(key), tag, tuple(sorted((props or {}).items())))

    assert sorted(norm(r.value, r.key, r.tag, r.properties) for r in back) == sorted(norm(*r) for r in rows)
    from headwater.client import key_partition

    for r in back:  # keyed rows land where the producer would put them
        if r.key is not None:
            assert r.partition == key_partition(bytes(r.key), 4)


def test_batch_write_takes_partition_and_queue_columns_and_string_keys(spark, broker, hw):
    a, b = fresh("multi-a"), fresh("multi-b")
    hw.admin.create_queue(a, partitions=2)
    hw.admin.create_queue(b, partitions=3)
    data = [(a if i % 2 else b, i % 2, f"k{i}", f"body{i}".encode()) for i in range(40)]
    df = spark.createDataFrame(data, "queue string, partition int, key string, value binary")
    df.write.format("headwater").mode("append").option("servers", broker.address).save()
    for name, part in ((a, 1), (b, 0)):
        recs = scan(hw, name)
        assert len(recs) == 20 and {r.partition for r in recs} == {part}
        assert all(r.key == b"k" + r.body[4:] for r in recs)
    # a tag without a key: sticky partitions, tags kept
    t = fresh("tagged")
    hw.admin.create_queue(t, partitions=2)
    spark.createDataFrame(
        [(f"t{i}".encode(), "even" if i % 2 == 0 else None) for i in range(30)], "value binary, tag string"
    ).write.format("headwater").mode("append").option("servers", broker.address).option("queue", t).save()
    assert sorted((r.body, r.tag) for r in scan(hw, t)) == sorted(
        (f"t{i}".encode(), "even" if i % 2 == 0 else None) for i in range(30)
    )
    # the option wins over the queue column: rows read from one queue go to another as they
    # are, but for their partition number (a source partition the sink queue may not have)
    c = fresh("copy")
    hw.admin.create_queue(c, partitions=1)
    reader(spark, broker, a).drop("partition").write.format("headwater").mode("append").option(
        "servers", broker.address
    ).option("queue", c).option("partitioner", "round_robin").save()
    assert sorted(r.body for r in scan(hw, c)) == sorted(r.body for r in scan(hw, a))


def test_a_task_written_twice_is_not_duplicated(broker, hw):
    """The exactly-once mechanism itself: a task run again under the same write id, epoch
    (micro-batch) and task number is dropped by the broker batch by batch, also when the
    first run stopped half way; the next micro-batch reuses the producer ids."""
    pa = pytest.importorskip("pyarrow")
    pytest.importorskip("pyspark")
    from headwater.spark.schema import WriteColumns
    from headwater.spark.writing import TaskWriter

    q = fresh("idem")
    hw.admin.create_queue(q, partitions=3)
    opts = parse_write_options({"servers": broker.address, "queue": q, "maxBatchBytes": "1024"}, streaming=True)
    cols = WriteColumns({"value": "value", "key": "key"}, key_is_string=False)
    batch = pa.record_batch(
        [
            pa.array([f"m{i:04d}".encode() * 10 for i in range(500)]),
            pa.array([f"k{i % 9}".encode() if i % 4 else None for i in range(500)]),
        ],
        names=["value", "key"],
    )

    def task(rows, *, epoch=7, number=0):
        w = TaskWriter(opts, cols, "query-1/0", task=number, epoch=epoch)
        w.write_batch(rows)
        return w

    first = task(batch.slice(0, 300))  # dies after some of its batches went out (> 5 per partition)
    first.close()
    partial = len(scan(hw, q))
    assert 0 < partial < 300
    assert task(batch).finish().total == 500  # the replay appends only what is missing
    assert sorted(r.body for r in scan(hw, q)) == sorted(batch.column(0).to_pylist())
    task(batch).finish()  # and a replay of a finished task appends nothing
    assert len(scan(hw, q)) == 500
    task(batch.slice(0, 10), number=1).finish()  # another task's rows are its own
    assert len(scan(hw, q)) == 510
    task(batch.slice(0, 20), epoch=8).finish()  # the next micro-batch: same ids, a new epoch
    assert len(scan(hw, q)) == 530
    with pytest.raises(InvalidArgumentError, match="not deterministic"):
        task(batch.slice(0, 3), epoch=8).finish()  # a replay that differs is refused
    with pytest.raises(InvalidArgumentError, match="checkpoint is older"):
        task(batch.slice(0, 20), epoch=6).finish()  # an older micro-batch than one written


# -- bad input ----------------------------------------------------------------------


def test_bad_options_fail_with_the_option_named_and_the_valid_ones_listed(spark, broker, hw):
    with pytest.raises(Exception) as e:
        reader(spark, broker, "anything", startingOffset="earliest").collect()
    assert "unknown option 'startingoffset'" in str(e.value) and "valid options: servers, queue" in str(e.value)
    q = fresh("badwrite")
    hw.admin.create_queue(q)
    df = spark.createDataFrame([(b"x",)], "value binary")
    with pytest.raises(Exception, match="unknown option 'partitionr'.*valid options"):
        df.write.format("headwater").mode("append").option("servers", broker.address).option("queue", q).option(
            "partitionr", "key"
        ).save()
    with pytest.raises(Exception, match="append-only"):
        df.write.format("headwater").mode("overwrite").option("servers", broker.address).option("queue", q).save()


def test_unknown_queue_is_a_clear_error_when_reading_and_writing(spark, broker):
    with pytest.raises(Exception, match="queue 'no-such-queue' does not exist.*queue create no-such-queue"):
        reader(spark, broker, "no-such-queue").collect()
    df = spark.createDataFrame([(b"x",)], "value binary")
    with pytest.raises(Exception, match="queue 'no-such-queue' does not exist"):
        df.write.format("headwater").mode("append").option("servers", broker.address).option(
            "queue", "no-such-queue"
        ).save()
    by_column = spark.createDataFrame([(b"x", "no-such-queue")], "value binary, queue string")
    with pytest.raises(Exception, match="queue 'no-such-queue' does not exist"):  # found in a worker
        by_column.write.format("headwater").mode("append").option("servers", broker.address).save()


def test_dataframes_without_a_binary_value_are_refused(spark, broker, hw):
    q = fresh("values")
    hw.admin.create_queue(q)

    def write(df):
        df.write.format("headwater").mode("append").option("servers", broker.address).option("queue", q).save()

    with pytest.raises(Exception, match="no 'value' column.*payload"):
        write(spark.createDataFrame([(b"x",)], "body binary"))
    with pytest.raises(Exception, match=r"column 'value' is string.*cast\('binary'\)"):
        write(spark.createDataFrame([("x",)], "value string"))
    with pytest.raises(Exception, match="column 'payload'.*does not write"):
        write(spark.createDataFrame([(b"x", 1)], "value binary, payload int"))
    with pytest.raises(Exception, match="null 'value'"):
        write(spark.createDataFrame([(None,)], "value binary"))
    write(spark.sql("select cast('x' as binary) as value, cast(null as timestamp) as deliver_at"))
    assert [r.body for r in scan(hw, q)] == [b"x"]


def test_deliver_at_column_schedules_messages(spark, broker, hw):
    q = fresh("later")
    hw.admin.create_queue(q, partitions=2)
    df = spark.sql(
        "select cast(concat('m', id) as binary) as value, cast(id % 2 as int) as partition, "
        "case when id < 4 then current_timestamp() "
        "when id < 8 then current_timestamp() + interval 3 seconds end as deliver_at "
        "from range(10)"
    )
    t0 = time.time()
    df.write.format("headwater").mode("append").option("servers", broker.address).option("queue", q).save()
    deadline = time.time() + 30
    while len(scan(hw, q)) < 10 and time.time() < deadline:
        time.sleep(0.2)
    got = {r.body: r for r in scan(hw, q)}
    assert sorted(got) == sorted(b"m%d" % i for i in range(10))  # each row once
    assert all(got[b"m%d" % i].partition == i % 2 for i in range(10))
    assert all(got[b"m%d" % i].scheduled_ms is None for i in (8, 9))  # no deliver_at: plain
    later = [got[b"m%d" % i] for i in range(4, 8)]
    assert all(r.scheduled_ms is not None and r.timestamp_ms >= r.scheduled_ms for r in later)
    assert min(r.timestamp_ms for r in later) >= (t0 + 2) * 1000  # not delivered early


def test_offsets_outside_the_retained_range(spark, broker, hw):
    q = fresh("retained")
    hw.admin.create_queue(q, partitions=1)
    hw.producer().send_batch(q, [b"old"] * 10, partition=0)
    hw.admin.truncate_queue(q)  # offsets 0..9 are gone; offsets keep counting
    hw.producer().send_batch(q, [b"new"] * 5, partition=0)
    with pytest.raises(Exception, match=r"offsets 0..9 of partition 0 .* no longer retained.*failOnDataLoss=false"):
        reader(spark, broker, q, startingOffsets='{"0": 0}').collect()
    rows = reader(spark, broker, q, startingOffsets='{"0": 0}', failOnDataLoss="false").collect()
    assert [(r.offset, bytes(r.value)) for r in rows] == [(o, b"new") for o in range(10, 15)]
    with pytest.raises(Exception, match="offset 99 of partition 0 .* past its end"):
        reader(spark, broker, q, endingOffsets='{"0": 99}').collect()
    with pytest.raises(Exception, match="queue .* has partitions 0..0"):
        reader(spark, broker, q, partitions="0,3").collect()


def test_an_unreachable_broker_is_a_clear_error(spark):
    with pytest.raises(Exception, match="cannot reach the Headwater broker at servers='127.0.0.1:9'.*reachable"):
        spark.read.format("headwater").option("servers", "127.0.0.1:9").option("queue", "q").option(
            "connectTimeoutMs", "300"
        ).load().collect()


# -- streaming ----------------------------------------------------------------------


def test_max_offsets_per_trigger_bounds_every_micro_batch(spark, broker, hw, tmp_path):
    q = fresh("limit")
    hw.admin.create_queue(q, partitions=3)
    p = hw.producer()
    for part, n in ((0, 70), (1, 23), (2, 4)):
        p.send_batch(q, [f"{part}-{i}".encode() for i in range(n)], partition=part)
    table = q.replace("-", "_")
    query = (
        stream_reader(spark, broker, q, startingOffsets="earliest", maxOffsetsPerTrigger="20")
        .writeStream.format("memory")
        .queryName(table)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    sizes = [pr["numInputRows"] for pr in query.recentProgress if pr["numInputRows"]]
    assert sizes and max(sizes) <= 20 and sum(sizes) == 97, sizes
    assert len(sizes) == 5  # 97 offsets, 20 a trigger
    got = spark.table(table).collect()
    assert sorted(bytes(r.value) for r in got) == sorted(
        f"{part}-{i}".encode() for part, n in ((0, 70), (1, 23), (2, 4)) for i in range(n)
    )


def test_streaming_restart_from_the_checkpoint_resumes_exactly(spark, broker, hw, tmp_path):
    src, dst = fresh("stream-in"), fresh("stream-out")
    hw.admin.create_queue(src, partitions=2)
    hw.admin.create_queue(dst, partitions=3)
    p = hw.producer()
    p.send_batch(
        src, [Message(f"a{i}".encode(), key=f"k{i}".encode(), tag="t", properties={"n": str(i)}) for i in range(50)]
    )
    ck = tmp_path / "ck"
    run_available_now(spark, broker, src, dst, ck, maxOffsetsPerTrigger="15")
    assert len(scan(hw, dst)) == 50
    run_available_now(spark, broker, src, dst, ck)  # nothing new: nothing written
    assert len(scan(hw, dst)) == 50
    p.send_batch(src, [Message(f"b{i}".encode()) for i in range(30)])
    hw.admin.add_partitions(src, 3)  # a partition that appears later is read from its start
    p.send_batch(src, [Message(f"c{i}".encode()) for i in range(5)], partition=2)
    run_available_now(spark, broker, src, dst, ck)
    out = scan(hw, dst)
    want = (
        [f"a{i}".encode() for i in range(50)]
        + [f"b{i}".encode() for i in range(30)]
        + [f"c{i}".encode() for i in range(5)]
    )
    assert sorted(r.body for r in out) == sorted(want)
    first = {r.body: r for r in out if r.body.startswith(b"a")}
    assert first[b"a7"].key == b"k7" and first[b"a7"].tag == "t" and first[b"a7"].properties == {"n": "7"}


def test_streaming_data_loss_fails_or_skips_as_asked(spark, broker, hw, tmp_path):
    src, dst = fresh("loss-in"), fresh("loss-out")
    hw.admin.create_queue(src, partitions=1)
    hw.admin.create_queue(dst, partitions=1)
    p = hw.producer()
    p.send_batch(src, [b"first"] * 5, partition=0)
    ck = tmp_path / "ck"
    run_available_now(spark, broker, src, dst, ck)
    p.send_batch(src, [b"lost"] * 5, partition=0)
    hw.admin.truncate_queue(src)  # removes what the query had not read yet
    p.send_batch(src, [b"after"] * 3, partition=0)
    with pytest.raises(Exception, match=r"offsets 5..9 of partition 0 .* no longer retained.*failOnDataLoss=false"):
        run_available_now(spark, broker, src, dst, ck)
    run_available_now(spark, broker, src, dst, ck, failOnDataLoss="false")
    assert [r.body for r in scan(hw, dst)] == [b"first"] * 5 + [b"after"] * 3


def _committed_input(checkpoint: Path) -> int:
    """Input offsets consumed by the micro-batches the checkpoint marks as committed."""
    commits = (
        [int(f.name) for f in (checkpoint / "commits").iterdir() if f.name.isdigit()]
        if (checkpoint / "commits").exists()
        else []
    )
    if not commits:
        return 0
    last = (checkpoint / "offsets" / str(max(commits))).read_text().splitlines()[-1]
    return sum(json.loads(last)["offsets"].values())


@pytest.mark.slow  # a crash test of ~25 s; the checkpoint restart test runs by default
def test_streaming_query_killed_mid_batch_restarts_exactly_once(spark, broker, hw, tmp_path):
    """SIGKILL the process group running a streaming query (driver, JVM, Python workers)
    while a micro-batch is half written, then restart from the checkpoint: every input
    message is in the output queue exactly once."""
    from tests.support.spark_stream_job import start_query

    src, dst = fresh("crash-in"), fresh("crash-out")
    hw.admin.create_queue(src, partitions=4)
    hw.admin.create_queue(dst, partitions=3)
    p = hw.producer()
    bodies = [f"msg-{i:05d}".encode() for i in range(1200)]
    p.send_batch(src, [Message(b, key=b[-2:]) for b in bodies])
    ck = tmp_path / "ck"
    job = subprocess.Popen(
        [sys.executable, "-m", "tests.support.spark_stream_job", broker.address, src, dst, str(ck)],
        cwd=ROOT,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=open(tmp_path / "job.log", "wb"),
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        deadline = time.monotonic() + 150
        while True:  # kill once the output runs ahead of what the checkpoint has committed
            assert job.poll() is None, (tmp_path / "job.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the job made no progress"
            written = len(scan(hw, dst))
            if written >= 300 and written > _committed_input(ck):
                os.killpg(job.pid, signal.SIGKILL)
                break
            time.sleep(0.05)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
        job.wait(30)
    at_kill = len(scan(hw, dst))
    assert _committed_input(ck) < at_kill < len(bodies), "the kill did not land inside a micro-batch"

    query = start_query(spark, broker.address, src, dst, str(ck), row_sleep_s=0, available_now=True)
    query.awaitTermination(120)
    assert query.exception() is None
    out = sorted(r.body for r in scan(hw, dst))
    assert out == sorted(bodies)  # each exactly once


def test_broker_gone_mid_query_fails_clearly_and_restarts_from_the_checkpoint(spark, tmp_path):
    b = BrokerProcess(tmp_path / "data").start()
    client = headwater.connect(b.address)
    try:
        client.admin.create_queue("gone-in", partitions=2)
        client.admin.create_queue("gone-out", partitions=2)
        client.producer().send_batch("gone-in", [f"m{i}".encode() for i in range(100)])
        ck = tmp_path / "ck"
        query = (
            spark.readStream.format("headwater")
            .option("servers", b.address)
            .option("queue", "gone-in")
            .option("startingOffsets", "earliest")
            .option("connectTimeoutMs", "500")
            .load()
            .select("value")
            .writeStream.format("headwater")
            .option("servers", b.address)
            .option("queue", "gone-out")
            .option("connectTimeoutMs", "500")
            .option("checkpointLocation", str(ck))
            .trigger(processingTime="200 milliseconds")
            .start()
        )
        deadline = time.monotonic() + 60
        while len(list(client.scanner("gone-out"))) < 100:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        b.kill()
        with pytest.raises(Exception, match="cannot reach the broker|unavailable") as e:
            query.awaitTermination(90)
            raise AssertionError("the query did not fail")
        assert "checkpoint" in str(e.value)
        client.close()

        b.start()  # the same data directory and port
        client = headwater.connect(b.address)
        client.producer().send_batch("gone-in", [f"n{i}".encode() for i in range(40)])
        query = (
            spark.readStream.format("headwater")
            .option("servers", b.address)
            .option("queue", "gone-in")
            .option("startingOffsets", "earliest")
            .load()
            .select("value")
            .writeStream.format("headwater")
            .option("servers", b.address)
            .option("queue", "gone-out")
            .option("checkpointLocation", str(ck))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(120)
        assert query.exception() is None
        got = sorted(r.body for r in client.scanner("gone-out"))
        assert got == sorted([f"m{i}".encode() for i in range(100)] + [f"n{i}".encode() for i in range(40)])
    finally:
        client.close()
        if b.alive():
            b.terminate()
