"""Queues through the embedded API: admin, producing, scanning, lookups, TTL, bad input."""

from __future__ import annotations

import os
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import headwater
from headwater import Message, MessageId
from headwater.errors import (
    ClosedError,
    DataDirectoryLockedError,
    InvalidArgumentError,
    InvalidBatchError,
    InvalidMessageIdError,
    InvalidQueueNameError,
    MessageNotFoundError,
    MessageTooLargeError,
    NotADataDirectoryError,
    PartitionOutOfRangeError,
    QueueDisabledError,
    QueueExistsError,
    QueueNotFoundError,
)
from headwater.testing import FakeClock


def bodies(n: int, prefix: str = "m") -> list[bytes]:
    return [f"{prefix}{i}".encode() for i in range(n)]


# -- admin --------------------------------------------------------------------------------


def test_create_describe_list(hw):
    info = hw.admin.create_queue("orders", partitions=3, ttl_s=3600, flush="sync", settings={"owner": "billing"})
    assert info.name == "orders" and len(info.partitions) == 3
    assert info.config.ttl_s == 3600 and info.config.flush == "sync"
    assert info.config.settings == {"owner": "billing"}
    hw.admin.create_queue("audit")
    assert [q.name for q in hw.admin.list_queues()] == ["audit", "orders"]
    assert hw.admin.describe_queue("audit").config.ttl_s == 7 * 86400


@pytest.mark.alone("a cluster names its brokers and controller; tests/test_cluster_queues.py checks its METADATA")
def test_a_broker_alone_leads_every_partition_itself(hw, request):
    """METADATA of a broker that is in no cluster: a cluster of one, broker -1, at the address
    it listens on (an embedded broker has none), leading every partition at epoch 0."""
    hw.admin.create_queue("orders", partitions=3)
    hw.admin.create_queue("audit")
    md = hw.admin.cluster_metadata()
    assert (md.cluster_id, md.controller) == ("", -1) and [b.broker_id for b in md.brokers] == [-1]
    me = md.brokers[0]
    if request.node.callspec.params["hw"] == "network":
        assert me.host == "127.0.0.1" and me.port > 0
    else:
        assert (me.host, me.port) == ("", 0)
    assert [q.name for q in md.queues] == ["audit", "orders"]  # internal queues only when named
    orders = md.queue("orders")
    assert orders.queue_id == hw.admin.describe_queue("orders").queue_id
    assert [(p.partition, p.leader, p.leader_epoch, p.replicas) for p in orders.partitions] == [
        (n, -1, 0, [-1]) for n in range(3)
    ]
    assert hw.admin.queue_locations("orders") == {0: me, 1: me, 2: me}
    assert [q.name for q in hw.admin.cluster_metadata(["orders", "__offsets", "orders"]).queues] == [
        "orders",
        "__offsets",
    ]
    with pytest.raises(QueueNotFoundError, match="nope"):
        hw.admin.queue_locations("nope")
    with pytest.raises(QueueNotFoundError, match="nope"):
        hw.admin.cluster_metadata(["orders", "nope"])
    with pytest.raises(InvalidArgumentError, match="not one name"):
        hw.admin.cluster_metadata("orders")  # type: ignore[arg-type]  # the wrong type is what the test checks
    with pytest.raises(InvalidQueueNameError):
        hw.admin.queue_locations("a b")


def test_queue_names_and_settings_are_checked(hw):
    for bad in ["", "-x", "a b", "x/y", "é", "a" * 201]:
        with pytest.raises(InvalidQueueNameError):
            hw.admin.create_queue(bad)
    with pytest.raises(InvalidQueueNameError):
        hw.admin.create_queue(42)  # type: ignore[arg-type]  # the wrong type is what the test checks
    for kw in [
        {"partitions": 0},
        {"partitions": "2"},
        {"ttl_s": -1},
        {"flush": "sometimes"},
        {"message_bytes_max": 0},
        {"settings": {"a": 1}},
    ]:
        with pytest.raises(InvalidArgumentError):
            hw.admin.create_queue("ok", **kw)
    # a TTL past what a 64-bit millisecond time holds was once taken embedded, and then no
    # broker could list or describe the queue ("cannot encode Response")
    with pytest.raises(InvalidArgumentError, match="ttl_s must be a whole number of seconds from 1 to 3,155,760,000"):
        hw.admin.create_queue("ok", ttl_s=60_479_999_999_999_999_999_395_200)
    hw.admin.create_queue("ok")
    with pytest.raises(QueueExistsError):
        hw.admin.create_queue("ok")
    assert [q.name for q in hw.admin.list_queues()] == ["ok"]


def test_delete_queue_missing_ok(hw):
    with pytest.raises(QueueNotFoundError):
        hw.admin.delete_queue("nope")
    hw.admin.delete_queue("nope", missing_ok=True)
    hw.admin.create_queue("gone")
    hw.admin.delete_queue("gone", missing_ok=True)  # there: deleted all the same
    assert hw.admin.list_queues() == []


def test_create_queue_exist_ok_returns_the_queue_there_as_it_is(hw):
    made = hw.admin.create_queue("orders", partitions=2, ttl_s=60)
    hw.send("orders", b"kept")
    again = hw.admin.create_queue("orders", partitions=8, ttl_s=None, exist_ok=True)
    assert again.queue_id == made.queue_id and len(again.partitions) == 2 and again.config.ttl_s == 60
    assert [r.body for r in hw.scanner("orders")] == [b"kept"]
    fresh = hw.admin.create_queue("audit", partitions=3, exist_ok=True)  # not there: created
    assert len(fresh.partitions) == 3
    with pytest.raises(InvalidArgumentError):  # the arguments are checked all the same
        hw.admin.create_queue("orders", partitions=0, exist_ok=True)


def test_unknown_queue_everywhere(hw):
    for call in (
        lambda: hw.admin.describe_queue("nope"),
        lambda: hw.admin.delete_queue("nope"),
        lambda: hw.admin.truncate_queue("nope"),
        lambda: hw.admin.disable_queue("nope"),
        lambda: hw.send("nope", b"x"),
        lambda: hw.scanner("nope"),
        lambda: hw.find("nope", b"k"),
    ):
        with pytest.raises(QueueNotFoundError, match="nope"):
            call()


def test_truncate_keeps_settings_and_offsets_move_on(hw):
    hw.admin.create_queue("q", partitions=2, ttl_s=None, settings={"k": "v"})
    ids = hw.send_batch("q", bodies(10), partition=0)
    info = hw.admin.truncate_queue("q")
    assert info.message_count == 0 and info.config.settings == {"k": "v"}
    assert list(hw.scanner("q")) == []
    with pytest.raises(MessageNotFoundError):
        hw.get(ids[3])
    new = hw.send_batch("q", [b"after"], partition=0)
    assert new[0].offset == 10  # offsets never go back: old ids never name new messages
    assert [r.body for r in hw.scanner("q")] == [b"after"]


def test_disable_rejects_reads_and_writes_then_enable(hw):
    hw.admin.create_queue("q")
    mid = hw.send("q", b"before")
    hw.admin.disable_queue("q")
    assert hw.admin.describe_queue("q").enabled is False
    for call in (lambda: hw.send("q", b"x"), lambda: list(hw.scanner("q")), lambda: hw.get(mid)):
        with pytest.raises(QueueDisabledError, match="enable"):
            call()
    hw.admin.enable_queue("q")
    hw.send("q", b"after")
    assert [r.body for r in hw.scanner("q")] == [b"before", b"after"]


def test_delete_then_recreate_gets_a_new_id(hw):
    hw.admin.create_queue("q")
    old = hw.send("q", b"old")
    hw.admin.delete_queue("q")
    with pytest.raises(MessageNotFoundError):
        hw.get(old)
    hw.admin.create_queue("q")
    new = hw.send("q", b"new")
    assert new.queue_id != old.queue_id
    assert [r.body for r in hw.scanner("q")] == [b"new"]


def test_add_partitions(hw):
    hw.admin.create_queue("q", partitions=2)
    hw.send_batch("q", [b"a"], partition=1)
    info = hw.admin.add_partitions("q", 5)
    assert len(info.partitions) == 5
    hw.send_batch("q", [b"b"], partition=4)  # the producer refreshes its metadata
    assert [(r.partition, r.body) for r in hw.scanner("q")] == [(1, b"a"), (4, b"b")]
    for bad in (5, 3, 0, "7"):
        with pytest.raises(InvalidArgumentError):
            hw.admin.add_partitions("q", bad)


def test_state_survives_reopen(tmp_path, clock):
    d = tmp_path / "d"
    with headwater.open(d, clock=clock) as hw:
        hw.admin.create_queue("q", partitions=2, ttl_s=None)
        hw.admin.create_queue("gone")
        hw.send_batch("q", bodies(100), partition=1)
        hw.admin.disable_queue("gone")
    with headwater.open(d, clock=clock) as hw:
        info = hw.admin.describe_queue("q")
        assert info.partitions[1].end_offset == 100
        assert hw.admin.describe_queue("gone").enabled is False
        assert [r.body for r in hw.scanner("q")] == bodies(100)
        hw.send_batch("q", [b"more"], partition=1)
        assert hw.admin.describe_queue("q").partitions[1].end_offset == 101


# -- producing ----------------------------------------------------------------------------


def test_messages_round_trip_exactly(hw):
    hw.admin.create_queue("q", partitions=4)
    msgs = [
        Message(b"\x00\xff" * 10, key=b"k1", tag="a", properties={"x": "1", "\u00e9": "\u2603"}),
        Message(b"", key=None, tag=None, properties=None),
        Message(b"plain"),
        Message(os.urandom(5000), key=b"", tag="b"),
    ]
    ids = hw.send_batch("q", msgs, partition=2)
    got = list(hw.scanner("q"))
    assert [(r.body, r.key, r.tag, r.properties) for r in got] == [(m.body, m.key, m.tag, m.properties) for m in msgs]
    assert [r.message_id for r in got] == list(ids)
    assert all(r.partition == 2 and r.queue == "q" for r in got)


def test_partitioners(tmp_path, clock):
    with headwater.open(tmp_path / "d", clock=clock) as hw:
        hw.admin.create_queue("q", partitions=4)
        by_key = hw.producer(partitioner="key")
        ids = by_key.send_batch("q", [Message(b"x", key=f"user-{i % 7}".encode()) for i in range(70)])
        seen: dict[bytes, set[int]] = {}
        for r in hw.scanner("q"):
            seen.setdefault(r.key, set()).add(r.partition)
        assert all(len(p) == 1 for p in seen.values())  # one key, one partition
        assert [hw.get(i).key for i in ids] == [f"user-{i % 7}".encode() for i in range(70)]
        with pytest.raises(InvalidArgumentError, match="key"):
            by_key.send("q", b"no key")

        rr = hw.producer(partitioner="round_robin")
        parts = [rr.send_and_wait("q", b"x").partition for _ in range(8)]
        assert parts[4:] == parts[:4] and sorted(parts[:4]) == [0, 1, 2, 3]

        rnd = hw.producer(partitioner="random")
        assert {rnd.send_and_wait("q", b"x").partition for _ in range(60)} == {0, 1, 2, 3}

        custom = hw.producer(partitioner=lambda m, n: len(m.body) % n)
        assert custom.send_and_wait("q", b"abc").partition == 3
        bad = hw.producer(partitioner=lambda m, n: 99)
        with pytest.raises(InvalidArgumentError, match="partitioner returned 99"):
            bad.send("q", b"x")
        with pytest.raises(InvalidArgumentError, match="unknown partitioner"):
            hw.producer(partitioner="nope")


def test_bad_messages_are_refused_and_nothing_is_stored(hw):
    hw.admin.create_queue("q", partitions=2, message_bytes_max=100)
    hw.send("q", b"good")
    with pytest.raises(MessageTooLargeError, match="100"):
        hw.send("q", b"x" * 101)
    with pytest.raises(InvalidArgumentError, match="encode"):
        hw.send("q", "text")  # type: ignore[arg-type]  # the wrong type is what the test checks
    with pytest.raises(InvalidArgumentError):
        hw.send_batch("q", [b"a", 3])  # type: ignore[list-item]  # the wrong type is what the test checks
    with pytest.raises(InvalidArgumentError):
        hw.send("q", b"x", properties={"a": 1})  # type: ignore[dict-item]  # the wrong type is what the test checks
    with pytest.raises(InvalidArgumentError):
        hw.send("q", b"x", key="str-key")  # type: ignore[arg-type]  # the wrong type is what the test checks
    with pytest.raises(InvalidArgumentError):
        hw.send_batch("q", [])
    with pytest.raises(PartitionOutOfRangeError, match="0..1"):
        hw.send("q", b"x", partition=2)
    with pytest.raises(PartitionOutOfRangeError):
        hw.send("q", b"x", partition=-1)
    assert [r.body for r in hw.scanner("q")] == [b"good"]


def test_broker_refuses_forged_batches(hw):
    """A client that bypasses the producer cannot store what readers would choke on."""
    from headwater.model.batch import encode_batch

    hw.admin.create_queue("q")
    good = encode_batch([b"a", b"b"])
    svc = hw.service
    for bad in (b"", b"junk" * 30, good[:-1], good + b"x", good[:50] + bytes([good[50] ^ 1]) + good[51:]):
        with pytest.raises(InvalidBatchError):
            svc.produce("q", 0, bad)
    assert svc.produce("q", 0, good).count == 2
    assert [r.body for r in hw.scanner("q")] == [b"a", b"b"]


def test_concurrent_producers_from_threads(tmp_path, clock):
    with headwater.open(tmp_path / "d", clock=clock, flush="sync") as hw:
        hw.admin.create_queue("q", partitions=3)
        errors = []

        def work(t: int) -> None:
            try:
                p = hw.producer()
                for i in range(50):
                    p.send_batch("q", [f"{t}-{i}-{j}".encode() for j in range(5)], partition=t % 3)
            except Exception as e:  # pragma: no cover - surfaced below
                errors.append(e)

        threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        got = [r.body for r in hw.scanner("q")]
        assert len(got) == len(set(got)) == 8 * 50 * 5
        for p in range(3):  # each thread's messages keep their order in their partition
            mine = [b.decode() for b in (r.body for r in hw.scanner("q", partitions=p))]
            for t in range(p, 8, 3):
                seq = [m for m in mine if m.startswith(f"{t}-")]
                assert seq == [f"{t}-{i}-{j}" for i in range(50) for j in range(5)]


# -- scanning -----------------------------------------------------------------------------


@pytest.fixture
def filled(hw, clock):
    """3 partitions; each batch 10 s after the previous; tags alternate a/b/none."""
    hw.admin.create_queue("q", partitions=3, ttl_s=None)
    for i in range(30):
        tag = ("a", "b", None)[i % 3]
        hw.send_batch(
            "q", [Message(f"{i}-{j}".encode(), tag=tag, key=f"k{i % 4}".encode()) for j in range(4)], partition=i % 3
        )
        clock.advance(10)
    return hw


def test_three_scanners(filled):
    hw = filled
    assert len(list(hw.scanner("q"))) == 120
    one = list(hw.scanner("q", partitions=1))
    assert {r.partition for r in one} == {1} and len(one) == 40
    assert [r.offset for r in one] == list(range(40))
    some = list(hw.scanner("q", partitions=[2, 0]))
    assert [r.partition for r in some] == [0] * 40 + [2] * 40


def test_scan_bounds_by_offset_id_and_time(filled, clock):
    hw = filled
    got = list(hw.scanner("q", partitions=0, start=5, stop=9))
    assert [r.offset for r in got] == [5, 6, 7, 8]
    got = list(hw.scanner("q", start={0: 38, 1: 39}, stop={2: 1}))
    assert [(r.partition, r.offset) for r in got] == [(0, 38), (0, 39), (1, 39), (2, 0)]
    ids = [r.message_id for r in hw.scanner("q", partitions=1)]
    got = list(hw.scanner("q", start=ids[3], stop=str(ids[7])))
    assert [r.message_id for r in got] == ids[3:7]
    with pytest.raises(InvalidArgumentError, match="partition"):
        hw.scanner("q", partitions=[0, 1], start=ids[3])
    # batch i was appended at t0 + 10*i; [t0+100, t0+150) holds batches 10..14
    t0 = clock.now - 300
    got = list(hw.scanner("q", start_time=int((t0 + 100) * 1000), end_time=int((t0 + 150) * 1000)))
    assert sorted({r.body.split(b"-")[0] for r in got}) == [b"10", b"11", b"12", b"13", b"14"]
    when = datetime.fromtimestamp(t0 + 100, tz=UTC)
    assert hw.offset_for_time("q", 1, when) == 12  # batches 1,4,7 hold 0..11; batch 10 starts at 12


@pytest.mark.alone("it needs the broker's clock to stand still between the send and the bound")
def test_a_time_bound_finer_than_a_millisecond_rounds_up(hw, clock):
    """Append times are whole ms: a datetime bound with a fraction of one is rounded up, so
    a range that ends "now" (with microseconds) takes the message appended in that ms, and
    one that starts then does not."""
    hw.admin.create_queue("q", ttl_s=None)
    hw.send("q", b"at T")  # stamped T = clock.now in ms
    just_after = datetime.fromtimestamp(clock.now, tz=UTC) + timedelta(microseconds=500)
    assert [r.body for r in hw.scanner("q", end_time=just_after)] == [b"at T"]
    assert list(hw.scanner("q", start_time=just_after)) == []
    assert [r.body for r in hw.scanner("q", start_time=just_after - timedelta(microseconds=999))] == [b"at T"]


def test_scan_by_tag_filters_on_the_broker(filled):
    hw = filled
    a = list(hw.scanner("q", tags="a"))
    assert len(a) == 40 and {r.tag for r in a} == {"a"}
    ab = list(hw.scanner("q", tags=["a", "b"]))
    assert len(ab) == 80
    assert len(list(hw.scanner("q", tags="*"))) == 120
    assert list(hw.scanner("q", tags="zzz")) == []
    # the broker skips batches by their tag mask: partition 0 only holds tag 'a'
    res = hw.service.fetch("q", 1, 0, max_bytes=1 << 20, tag_mask=headwater.model.batch.tags_mask(["a"]))
    assert res.batches == [] and res.next_offset == 40


def test_scanner_closes_cleanly(filled):
    hw = filled
    with hw.scanner("q") as s:
        first = next(s)
        assert first.offset == 0
    assert list(s) == []
    s2 = hw.scanner("q")
    next(s2)
    s2.close()
    s2.close()


def test_lookups_by_id_and_key(filled, clock):
    hw = filled
    rec = list(hw.scanner("q", partitions=2))[17]
    assert hw.get(rec.message_id) == rec
    assert hw.get(str(rec.message_id)) == rec
    found = hw.find("q", b"k1")
    assert len(found) == 32  # batches 1, 5, ..., 29 of 4 messages each
    assert all(r.key == b"k1" for r in found)
    assert [r.timestamp_ms for r in found] == sorted(r.timestamp_ms for r in found)
    t0 = clock.now - 300
    window = hw.find("q", b"k1", start_time=int((t0 + 50) * 1000), end_time=int((t0 + 100) * 1000))
    assert {r.body.split(b"-")[0] for r in window} == {b"5", b"9"}
    assert hw.find("q", b"unknown-key") == []
    assert len(hw.find("q", b"k1", limit=3)) == 3
    with pytest.raises(InvalidArgumentError):
        hw.find("q", "str")  # type: ignore[arg-type]  # the wrong type is what the test checks
    with pytest.raises(InvalidArgumentError, match="limit"):
        hw.find("q", b"k1", limit=True)  # a bool is not a count (the sync and async clients agree)


def test_bad_ids(filled):
    hw = filled
    for bad in ("", "xyz", "0000002a-00000003", 42):
        with pytest.raises(InvalidMessageIdError):
            hw.get(bad)  # type: ignore[arg-type]  # the wrong type is what the test checks
    with pytest.raises(
        InvalidMessageIdError, match=r"got SendFuture: .*\(\.result\(\), or await it; or use send_and_wait\)"
    ):
        hw.get(hw.producer().send("q", b"x"))  # type: ignore[arg-type]  (the README's slip)
    qid = hw.admin.describe_queue("q").queue_id
    with pytest.raises(MessageNotFoundError, match="not retained"):
        hw.get(MessageId(qid, 0, 10_000))
    with pytest.raises(MessageNotFoundError, match="no queue"):
        hw.get(MessageId(999, 0, 0))
    with pytest.raises(PartitionOutOfRangeError):
        hw.get(MessageId(qid, 7, 0))


def test_an_id_of_the_brokers_own_queues_names_no_queue(hw):
    """Ids 1-4 are the broker's internal queues (on a real broker): a lookup says no queue has
    that id, as for a deleted queue, without naming or reading them."""
    mine = {q.queue_id for q in hw.admin.list_queues()}
    for qid in sorted({1, 2, 3, 4} - mine):
        with pytest.raises(MessageNotFoundError, match=f"no queue has id {qid}") as e:
            hw.get(MessageId(qid, 0, 0))
        assert "__" not in str(e.value)


def test_message_ids_print_parse_and_sort():
    ids = [MessageId(1, 2, o) for o in (0, 9, 10, 255, 256, 2**40)]
    texts = [str(i) for i in ids]
    assert sorted(texts) == texts
    assert [MessageId.parse(t) for t in texts] == ids
    assert MessageId.parse(texts[0].upper()) == ids[0]


# -- TTL and retention --------------------------------------------------------------------


def test_ttl_hides_expired_messages_on_every_read_path(hw, clock):
    hw.admin.create_queue("q", partitions=1, ttl_s=60)
    old = hw.send("q", b"old", key=b"k")
    clock.advance(30)
    new = hw.send("q", b"new", key=b"k")
    clock.advance(31)  # old is 61 s old: expired; new is 31 s old
    assert [r.body for r in hw.scanner("q")] == [b"new"]
    assert [r.body for r in hw.scanner("q", start=0)] == [b"new"]
    assert [r.body for r in hw.find("q", b"k")] == [b"new"]
    with pytest.raises(MessageNotFoundError):
        hw.get(old)
    assert hw.get(new).body == b"new"
    assert hw.admin.describe_queue("q").partitions[0].start_offset == 1
    assert hw.offset_for_time("q", 0, 0) == 1


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("append"), st.integers(1, 3)),
            st.tuples(st.just("advance"), st.integers(-90_000, 90_000)),
            st.tuples(st.just("truncate"), st.just(0)),
        ),
        max_size=40,
    )
)
@example(ops=[("append", 1), ("advance", 61_000), ("advance", -30_000)])  # the clock steps back
@pytest.mark.parametrize("kind", ["file", "memory"])
def test_the_first_unexpired_offset_follows_the_clock_appends_and_truncation(tmp_path_factory, kind, ops):
    """The store remembers a partition's first unexpired offset between reads: whatever
    happens in between (appends, time passing or going back, a truncation), every read
    sees what a search of the whole partition would find. Both stores."""
    from headwater.model.batch import encode_batch
    from headwater.model.config import QueueConfig
    from headwater.storage import LogStore, StoreConfig
    from headwater.storage.memory import MemoryStore

    clock = FakeClock()
    config = StoreConfig(segment_bytes_max=64 * 1024)
    store = (
        MemoryStore(config, clock=clock)
        if kind == "memory"
        else LogStore(tmp_path_factory.mktemp("d"), config, clock=clock)
    )
    try:
        store.create_queue("q", QueueConfig(partitions=1, ttl_s=60))
        batches: list[tuple[int, int, int]] = []  # (base offset, end offset, timestamp ms)
        start = end = last_ts = 0
        for op, arg in ops:
            if op == "append":
                now = int(clock() * 1000)
                last_ts = max(now, last_ts)
                store.append("q", 0, encode_batch([os.urandom(2000) for _ in range(arg)]))
                batches.append((end, end + arg, last_ts))
                end += arg
            elif op == "advance":
                clock.advance(arg / 1000)
            else:
                store.truncate_queue("q")
                start = end
            cutoff = int(clock() * 1000) - 60_000
            want = next((max(b, start) for b, e, ts in batches if e > start and ts >= cutoff), end)
            assert store.describe_queue("q").partitions[0].start_offset == want
            assert store.fetch("q", 0, 0).start_offset == want
    finally:
        store.close()


def test_ttl_reclaims_disk_by_whole_segments(tmp_path, clock):
    with headwater.open(tmp_path / "d", clock=clock, segment_bytes_max=64 * 1024) as hw:
        hw.admin.create_queue("short", ttl_s=60)
        hw.admin.create_queue("long", ttl_s=None)
        for _ in range(40):
            hw.send_batch("short", [os.urandom(1000) for _ in range(10)])
        hw.send("long", b"keep me")
        log_dir = tmp_path / "d" / "log"
        before = len(list(log_dir.glob("*.log")))
        assert before > 4
        clock.advance(61)
        hw.send("short", b"fresh")  # lands in the active segment
        deleted = hw.service.store.enforce_retention()
        after = len(list(log_dir.glob("*.log")))
        # every sealed segment held only expired 'short' data, except the one with 'long'
        assert deleted >= before - 2 and after <= 3
        assert [r.body for r in hw.scanner("long")] == [b"keep me"]
        assert [r.body for r in hw.scanner("short")] == [b"fresh"]
    with headwater.open(tmp_path / "d", clock=clock) as hw:  # offsets survive the deletion
        assert hw.send("short", b"x").offset == 401
        info = hw.admin.describe_queue("short")
        assert info.partitions[0].start_offset == 400 and info.partitions[0].end_offset == 402


def test_truncate_and_delete_reclaim_space(tmp_path, clock):
    with headwater.open(tmp_path / "d", clock=clock, segment_bytes_max=64 * 1024) as hw:
        hw.admin.create_queue("a", ttl_s=None)
        hw.admin.create_queue("b", ttl_s=None)
        for _ in range(30):
            hw.send_batch("a", [os.urandom(1000) for _ in range(10)])
        for _ in range(30):
            hw.send_batch("b", [os.urandom(1000) for _ in range(10)])
        hw.admin.truncate_queue("a")
        hw.admin.delete_queue("b")
        hw.send("a", b"x")
        hw.service.store.enforce_retention()
        assert len(list((tmp_path / "d" / "log").glob("*.log"))) <= 2
        assert [r.body for r in hw.scanner("a")] == [b"x"]


# -- many partitions ----------------------------------------------------------------------


def test_ten_thousand_partitions_with_bounded_files(tmp_path, clock):
    with headwater.open(tmp_path / "d", clock=clock, segment_bytes_max=256 * 1024) as hw:
        hw.admin.create_queue("wide", partitions=10_000, ttl_s=None)
        p = hw.producer(partitioner="round_robin")
        for i in range(20_000):
            p.send_batch("wide", [f"{i}".encode()])
        info = hw.admin.describe_queue("wide")
        assert all(pi.end_offset == 2 for pi in info.partitions)
        first, second = (int(r.body) for r in hw.scanner("wide", partitions=9_999))
        assert second == first + 10_000  # round robin (from a random first partition)
        stats = hw.service.store.stats()
        assert stats["segments"] > 1
        fds = len(os.listdir("/proc/self/fd"))
        assert stats["open_segments"] <= 64 + 1
        assert fds < 200, fds  # no file per partition
        assert len(list(hw.scanner("wide"))) == 20_000


# -- the data directory -------------------------------------------------------------------


def test_a_directory_that_is_not_ours_is_refused(tmp_path):
    d = tmp_path / "other"
    d.mkdir()
    (d / "family-photos.jpg").write_bytes(b"\xff\xd8")
    with pytest.raises(NotADataDirectoryError, match="family-photos"):
        headwater.open(d)
    assert (d / "family-photos.jpg").read_bytes() == b"\xff\xd8"
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(NotADataDirectoryError):
        headwater.open(f)
    (tmp_path / "fake").mkdir()
    (tmp_path / "fake" / "headwater.json").write_text('{"format": "something-else"}')
    with pytest.raises(NotADataDirectoryError):
        headwater.open(tmp_path / "fake")


def test_second_opener_in_same_process_is_refused(tmp_path):
    with headwater.open(tmp_path / "d") as hw:
        hw.admin.create_queue("q")
        with pytest.raises(DataDirectoryLockedError, match="in use"):
            headwater.open(tmp_path / "d")
        hw.send("q", b"still fine")
    with headwater.open(tmp_path / "d") as hw:
        assert [r.body for r in hw.scanner("q")] == [b"still fine"]


def test_closed_client_says_so(tmp_path):
    hw = headwater.open(tmp_path / "d")
    hw.admin.create_queue("q")
    hw.close()
    with pytest.raises(ClosedError):
        hw.admin.list_queues()
    with pytest.raises(ClosedError):
        hw.send("q", b"x")


def test_unknown_store_setting(tmp_path):
    with pytest.raises(InvalidArgumentError, match="valid settings"):
        headwater.open(tmp_path / "d", flushh="sync")
    with pytest.raises(InvalidArgumentError):
        headwater.open(tmp_path / "d", flush="never")


def test_sync_flush_shares_fsyncs(tmp_path):
    with headwater.open(tmp_path / "d", flush="sync") as hw:
        hw.admin.create_queue("q")
        store = hw.service.store
        before = store.stats()["fsyncs"]
        barrier = threading.Barrier(16)

        def work() -> None:
            barrier.wait()
            for _ in range(20):
                hw.send("q", b"x")

        threads = [threading.Thread(target=work) for _ in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        fsyncs = store.stats()["fsyncs"] - before
        assert hw.admin.describe_queue("q").message_count == 320
        assert 0 < fsyncs < 320  # group commit: fewer fsyncs than acknowledged sends


def test_a_read_of_the_last_batch_is_served_from_memory_as_the_file_holds_it(tmp_path, clock, monkeypatch):
    """A reader at the end of a partition (a fetch stream, a woken long poll) gets the batch
    just appended from the store's copy: the same bytes and offsets as the file gives."""
    from headwater.model.batch import encode_batch, tags_mask
    from headwater.model.config import QueueConfig
    from headwater.storage import LogStore
    from headwater.storage.segment import LogSegment

    store = LogStore(tmp_path / "d", clock=clock)
    store.create_queue("q", QueueConfig(partitions=1, ttl_s=60))
    store.append("q", 0, encode_batch([b"a", b"b"]))
    clock.advance(1)
    store.append("q", 0, encode_batch([Message(b"c", tag="t"), Message(b"d", tag="t")]))
    reads = []
    real_read = LogSegment.read
    monkeypatch.setattr(LogSegment, "read", lambda self, *a: reads.append(a) or real_read(self, *a))
    from_memory = [store.fetch("q", 0, off) for off in (2, 3)]
    assert reads == [], "the last batch was read back from the file"
    assert store.fetch("q", 0, 2, tag_mask=tags_mask(["other"])).batches == []  # filtered: as before
    store.fetch("q", 0, 1)  # an earlier batch: from the file
    assert len(reads) == 1
    store.close()

    store = LogStore(tmp_path / "d", clock=clock)  # reopened: no copy in memory, all from the file
    assert [store.fetch("q", 0, off) for off in (2, 3)] == from_memory
    store.append("q", 0, encode_batch([b"e"]))
    clock.advance(120)  # every batch expired: the copy must not bring the last one back
    res = store.fetch("q", 0, 4)
    assert (res.batches, res.start_offset) == ([], 5)
    store.append("q", 0, encode_batch([b"f"]))
    store.truncate_queue("q")
    res = store.fetch("q", 0, 5)
    assert (res.batches, res.next_offset, res.start_offset) == ([], 6, 6)
    store.close()


def test_async_flush_fsyncs_on_its_interval_once_flush_bytes_are_written_and_never_idle(tmp_path):
    """The flusher fsyncs when ``flush_bytes`` are written since its last kick, without
    waiting for its interval; an interval with nothing new written fsyncs nothing."""
    with headwater.open(tmp_path / "d", flush_interval_ms=3_600_000, flush_bytes=64 * 1024) as hw:
        hw.admin.create_queue("q")
        store = hw.service.store
        before = store.stats()["fsyncs"]
        hw.send_batch("q", [b"x" * 1000] * 100)  # about 100 KB: past flush_bytes
        deadline = time.monotonic() + 5
        while store.stats()["fsyncs"] == before and time.monotonic() < deadline:
            time.sleep(0.01)
        assert store.stats()["fsyncs"] == before + 1, "no fsync, an hour before the interval's end"
        hw.send("q", b"small")  # under flush_bytes: waits for the interval
        time.sleep(0.2)
        assert store.stats()["fsyncs"] == before + 1
    with headwater.open(tmp_path / "d", flush_interval_ms=10) as hw:
        store = hw.service.store
        time.sleep(0.1)  # ten ticks with nothing written since the store opened
        assert store.stats()["fsyncs"] == 0
        hw.send("q", b"y")
        deadline = time.monotonic() + 5
        while store.stats()["fsyncs"] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.1)
        assert store.stats()["fsyncs"] == 1  # one for the write, none for the ticks after it


def test_flush_bytes_is_checked(tmp_path):
    with pytest.raises(InvalidArgumentError, match="flush_bytes"):
        headwater.open(tmp_path / "d", flush_bytes=1000)


def test_the_copies_of_last_batches_stay_within_their_bound(tmp_path, clock):
    """Each partition's last small batch is kept in memory, but all of them together within a
    bound: the least recently appended go first, and a read of theirs goes to the file."""
    from headwater.model.batch import encode_batch
    from headwater.model.config import QueueConfig
    from headwater.storage import LogStore
    from headwater.storage.last_batches import LastBatches

    store = LogStore(tmp_path / "d", clock=clock)
    store._last = LastBatches(bytes_max=4000)
    store.create_queue("q", QueueConfig(partitions=40))
    for p in range(40):
        store.append("q", p, encode_batch([b"%03d" % p * 100]))  # about 400 bytes stored each
    assert store._last.bytes <= 4000 and len(store._last.keys()) < 40
    kept = sorted(p for _qid, p in store._last.keys())
    assert kept == list(range(40 - len(kept), 40)), "the most recently appended are kept"
    for p in (0, 39):  # one from the file, one from memory: the same answer
        assert b"%03d" % p * 100 in store.fetch("q", p, 0).batches[0]
    store.delete_queue("q")
    store.create_queue("q", QueueConfig(partitions=1))  # a new queue id: nothing of the old one matches
    assert store.fetch("q", 0, 0).batches == []
    store.close()


@pytest.mark.alone("65,000 partitions: a cluster makes at most a few thousand in one change (test_cluster_admin.py)")
def test_a_listing_of_many_partitions_comes_a_page_at_a_time(hw):
    """Issue 30, finding 4: with 3 M partitions, every listing failed (a 122 MB answer over
    the frame limit). A listing now pages: queues in name order, at most
    LIST_PAGE_PARTITIONS partitions a page (a bigger queue comes alone), and
    ``list_queues()`` asks for the pages one after the other."""
    from headwater.model.config import LIST_PAGE_PARTITIONS

    big = LIST_PAGE_PARTITIONS * 3 // 4
    for name in ("c", "a", "b"):
        hw.admin.create_queue(name, partitions=big)
    hw.admin.create_queue("d", partitions=2)
    hw.admin.create_queue("e", partitions=LIST_PAGE_PARTITIONS + 1)  # bigger than a page: alone
    assert [q.name for q in hw.admin.list_queues()] == ["a", "b", "c", "d", "e"]
    assert sum(len(q.partitions) for q in hw.admin.list_queues()) == 3 * big + 2 + LIST_PAGE_PARTITIONS + 1
    service = hw._service
    pages, after = [], None
    while True:
        page = service.list_queues(after)
        pages.append([q.name for q in page.queues])
        if page.next_after is None:
            break
        after = page.next_after
    assert pages == [["a"], ["b"], ["c", "d"], ["e"]]
    assert [q.name for q in service.list_queues(None, 2).queues] == ["a"]  # a small page: one queue
    assert [q.name for q in service.list_queues("c", 2).queues] == ["d"]
    assert service.list_queues("e").queues == []  # nothing after the last name
    for bad in (-1, 1.5, True):
        with pytest.raises(InvalidArgumentError, match="partitions_max"):
            service.list_queues(None, bad)
