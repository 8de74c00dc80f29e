"""The simple consumer: assignment, positions, long polling, committed offsets."""

from __future__ import annotations

import threading
import time

import pytest

from headwater import Message
from headwater.errors import InvalidArgumentError, PartitionOutOfRangeError, QueueNotFoundError


def drain(c, expect: int, timeout_s: float = 5.0) -> list:
    out: list = []
    deadline = time.monotonic() + timeout_s
    while len(out) < expect and time.monotonic() < deadline:
        out.extend(c.poll(timeout_ms=200))
    return out


def test_reads_every_partition_in_order(hw):
    hw.admin.create_queue("q", partitions=3)
    for p in range(3):
        hw.send_batch("q", [f"{p}-{i}".encode() for i in range(50)], partition=p)
    c = hw.consumer()
    c.assign("q")
    got = drain(c, 150)
    assert len(got) == 150
    for p in range(3):
        assert [r.body for r in got if r.partition == p] == [f"{p}-{i}".encode() for i in range(50)]
    assert c.poll(timeout_ms=50) == []
    assert c.position("q", 1) == 50
    c.close()


def test_max_messages_and_positions(hw):
    hw.admin.create_queue("q")
    hw.send_batch("q", [b"%d" % i for i in range(20)], partition=0)
    c = hw.consumer()
    c.assign("q")
    first = c.poll(max_messages=7, timeout_ms=1000)
    assert [r.offset for r in first] == list(range(7))
    assert c.position("q", 0) == 7
    rest = drain(c, 13)
    assert [r.offset for r in rest] == list(range(7, 20))


def test_long_poll_returns_as_soon_as_data_arrives(hw):
    hw.admin.create_queue("q", partitions=2)
    c = hw.consumer()
    c.assign("q")
    assert c.poll(timeout_ms=100) == []

    def later() -> None:
        time.sleep(0.3)
        hw.send("q", b"late", partition=1)

    threading.Thread(target=later).start()
    t0 = time.monotonic()
    got = c.poll(timeout_ms=5000)
    waited = time.monotonic() - t0
    assert [r.body for r in got] == [b"late"]
    assert 0.2 < waited < 3.0


def test_group_commit_and_resume(hw):
    hw.admin.create_queue("q", partitions=2)
    hw.send_batch("q", [b"a%d" % i for i in range(10)], partition=0)
    hw.send_batch("q", [b"b%d" % i for i in range(10)], partition=1)
    c1 = hw.consumer(group="billing")
    c1.assign("q")
    got = c1.poll(max_messages=6, timeout_ms=1000)
    c1.commit()
    assert c1.committed("q", got[0].partition) == got[-1].offset + 1
    c1.close()
    c2 = hw.consumer(group="billing")
    c2.assign("q")
    rest = drain(c2, 14)
    assert len(rest) == 14
    assert sorted(r.body for r in got + rest) == sorted(
        [b"a%d" % i for i in range(10)] + [b"b%d" % i for i in range(10)]
    )
    other = hw.consumer(group="audit")  # another group starts from the beginning
    other.assign("q")
    assert len(drain(other, 20)) == 20


def test_auto_offset_reset_latest_and_seeks(hw, clock):
    hw.admin.create_queue("q")
    ids = hw.send_batch("q", [b"old%d" % i for i in range(5)], partition=0)
    c = hw.consumer(auto_offset_reset="latest")
    c.assign("q")
    assert c.poll(timeout_ms=50) == []
    clock.advance(10)
    hw.send("q", b"new", partition=0)
    assert [r.body for r in drain(c, 1)] == [b"new"]
    c.seek("q", 0, 2)
    assert [r.body for r in drain(c, 4)] == [b"old2", b"old3", b"old4", b"new"]
    c.seek_to_id(ids[4])
    assert [r.body for r in drain(c, 2)] == [b"old4", b"new"]
    c.seek_to_beginning("q")
    assert len(drain(c, 6)) == 6
    c.seek_to_time("q", int((clock.now - 5) * 1000))
    assert [r.body for r in drain(c, 1)] == [b"new"]
    c.seek_to_end("q")
    assert c.poll(timeout_ms=50) == []


def test_tag_filter(hw):
    hw.admin.create_queue("q")
    hw.send_batch("q", [Message(b"x", tag="a"), Message(b"y", tag="b"), Message(b"z", tag="a")], partition=0)
    hw.send_batch("q", [Message(b"w", tag="b")], partition=0)
    c = hw.consumer(tags="a")
    c.assign("q")
    assert [r.body for r in drain(c, 2)] == [b"x", b"z"]
    assert c.poll(timeout_ms=50) == []
    assert c.position("q", 0) == 4  # skipped records count as consumed


def test_bad_input(hw, request):
    on_cluster = request.node.callspec.params["hw"] == "cluster"
    hw.admin.create_queue("q", partitions=2)
    hw.send("q", b"x", partition=0)
    with pytest.raises(InvalidArgumentError):
        hw.consumer(auto_offset_reset="middle")
    c = hw.consumer()
    with pytest.raises(QueueNotFoundError):
        c.assign("nope")
    with pytest.raises(PartitionOutOfRangeError):
        c.assign("q", [5])
    c.assign("q")
    with pytest.raises(InvalidArgumentError, match="group"):
        c.commit()
    with pytest.raises(InvalidArgumentError, match="not assigned"):
        c.seek("q", 7, 0)
    g = hw.consumer(group="g")
    g.assign("q")
    # a cluster's coordinator checks a commit against the log only for the partitions it
    # leads itself (Kafka checks none): which ones it leads depends on placement
    # (docs/consumer-groups.md, "Commits and generations"; docs/design/cluster.md)
    if not on_cluster:
        with pytest.raises(InvalidArgumentError, match="beyond the log end"):
            g.commit({("q", 0): 5})
    with pytest.raises(InvalidArgumentError):
        hw.consumer(group="bad name").assign("q")
    g.commit({("q", 0): 1})
    assert g.committed("q", 0) == 1 and g.committed("q", 1) is None


def test_the_sync_and_asyncio_consumers_refuse_the_same_arguments_alike(hw):
    """Both keep their positions in one ConsumerPositions, so they check alike: the sync
    consumer once took ``max_poll_messages=True`` for 1 and had no ``closed``, and asked the
    broker where a queue begins before finding the partitions were not assigned."""
    from headwater.client.aio.consumer import AsyncConsumer
    from headwater.client.sync.consumer import Consumer

    hw.admin.create_queue("q", partitions=2)
    for kind in (Consumer, AsyncConsumer):
        with pytest.raises(InvalidArgumentError, match="max_poll_messages"):
            kind(object(), max_poll_messages=True)
        with pytest.raises(InvalidArgumentError, match="auto_offset_reset"):
            kind(object(), auto_offset_reset="middle")
    c = hw.consumer()
    assert not c.closed
    with pytest.raises(InvalidArgumentError, match="no partition of 'q' is assigned"):
        c.seek_to_beginning("q")
    # the partitions are checked before the broker is asked: the old sync consumer said
    # QueueNotFoundError here, from asking first
    with pytest.raises(InvalidArgumentError, match="no partition of 'nope' is assigned"):
        c.seek_to_end("nope")
    c.assign("q", 1)
    with pytest.raises(InvalidArgumentError, match=r"q\[0\] is not assigned"):
        c.seek_to_end("q", 0)
    c.seek_to_end("q", 1)
    with pytest.raises(InvalidArgumentError, match="when must be a datetime or epoch milliseconds, got None"):
        c.seek_to_time("q", None)  # the sync consumer asked the broker with None, the asyncio one asserted
    with pytest.raises(InvalidArgumentError, match="message id .* is not of an assigned queue"):
        c.seek_to_id("0000002a-00000000-0000000000000000")
    c.close()
    assert c.closed


def test_commits_survive_restart_and_compaction(tmp_path):
    import headwater

    d = tmp_path / "d"
    with headwater.open(d) as hw:
        hw.admin.create_queue("q", partitions=4)
        for p in range(4):
            hw.send_batch("q", [b"x"] * 100, partition=p)
        hw.service.offsets._compact_min = 50  # compact often
        for i in range(300):
            hw.service.commit_offsets("g", "q", {i % 4: i % 100})
        assert hw.service.fetch_offsets("g", "q") == {0: 96, 1: 97, 2: 98, 3: 99}
        info = hw.service.store.describe_queue("__offsets")
        assert info.message_count < 300  # the log was compacted
    with headwater.open(d) as hw:
        assert hw.service.fetch_offsets("g", "q") == {0: 96, 1: 97, 2: 98, 3: 99}
        hw.admin.delete_queue("q")
        hw.admin.create_queue("q", partitions=4)
        assert hw.service.fetch_offsets("g", "q") == {}  # a new queue starts with no positions


def test_internal_queue_is_hidden_and_protected(tmp_path):
    import headwater

    with headwater.open(tmp_path / "d") as hw:
        assert hw.admin.list_queues() == []
        for call in (
            lambda: hw.admin.delete_queue("__offsets"),
            lambda: hw.admin.describe_queue("__offsets"),
            lambda: hw.send("__offsets", b"x"),
        ):
            with pytest.raises(InvalidArgumentError, match="belong to the broker"):
                call()
