"""The store contract (headwater.storage.api.Store), run on both stores.

Every test here takes the ``store`` fixture and runs once on a :class:`LogStore` over a
fresh data directory and once on a :class:`MemoryStore` (NATS runs every store test on its
filestore and its memstore). What is about files (crash recovery, segments, fsyncs, the page
cache) is tested on the LogStore alone elsewhere; the broker over both stores is tested
through the ``hw`` fixture (tests/conftest.py) and the differential test.
"""

from __future__ import annotations

import inspect

import pytest

from headwater import Message
from headwater.errors import (
    ClosedError,
    InvalidArgumentError,
    InvalidBatchError,
    MessageNotFoundError,
    OutOfOrderSequenceError,
    PartitionOutOfRangeError,
    QueueDisabledError,
    QueueExistsError,
    QueueNotFoundError,
)
from headwater.model.batch import decode_header, decode_records, encode_batch, tags_mask
from headwater.model.config import QueueConfig
from headwater.storage import LogStore, StoreConfig
from headwater.storage.api import Store
from headwater.storage.memory import MemoryStore
from headwater.testing import FakeClock

KINDS = ("file", "memory")


def open_store(kind: str, tmp_path, clock, config: StoreConfig | None = None):
    if kind == "memory":
        return MemoryStore(config, clock=clock)
    return LogStore(tmp_path / "data", config, clock=clock)


@pytest.fixture(params=KINDS)
def store(request, tmp_path, clock):
    s = open_store(request.param, tmp_path, clock, StoreConfig(segment_bytes_max=64 * 1024))
    yield s
    s.close()


def bodies(batches: list[bytes], queue: str = "q", start: int = 0) -> list[bytes]:
    return [r.body for b in batches for r in decode_records(bytes(b), queue, start_offset=start)]


def test_both_stores_have_everything_the_protocol_names(store):
    names = {n for n in dir(Store) if not n.startswith("_")} | set(Store.__annotations__)
    missing = sorted(n for n in names if not hasattr(store, n))
    assert missing == []
    for n in names:
        want = getattr(Store, n, None)
        if inspect.isfunction(want):
            got = inspect.signature(getattr(type(store), n))
            assert list(got.parameters) == list(inspect.signature(want).parameters), n


def test_admin(store, clock):
    info = store.create_queue("q", QueueConfig(partitions=2, ttl_s=None))
    assert (info.name, len(info.partitions), info.enabled, info.created_ms) == ("q", 2, True, int(clock() * 1000))
    store.create_queue("__mine", QueueConfig(partitions=1), internal=True)
    assert [i.name for i in store.list_queues()] == ["q"]
    assert [i.name for i in store.list_queues(include_internal=True)] == ["__mine", "q"]
    with pytest.raises(QueueExistsError, match="queue 'q' already exists"):
        store.create_queue("q", QueueConfig())
    with pytest.raises(InvalidArgumentError, match="internal queue names start with '__'"):
        store.create_queue("mine", QueueConfig(), internal=True)
    grown = store.add_partitions("q", 3)
    assert [p.partition for p in grown.partitions] == [0, 1, 2]
    with pytest.raises(InvalidArgumentError, match="the new count must be larger"):
        store.add_partitions("q", 3)
    assert store.set_queue_enabled("q", False).enabled is False
    store.delete_queue("q")
    with pytest.raises(QueueNotFoundError, match="queue 'q' does not exist; create it first"):
        store.describe_queue("q")
    again = store.create_queue("q", QueueConfig())
    assert again.queue_id != info.queue_id and again.partitions[0].end_offset == 0


def test_append_and_fetch(store, clock):
    store.create_queue("q", QueueConfig(partitions=2))
    first = store.append("q", 1, encode_batch([b"a", b"b"]))
    clock.advance(-5)  # append times never go back
    second = store.append("q", 1, encode_batch([b"c"]))
    assert (first.partition, first.base_offset, first.count) == (1, 0, 2)
    assert (second.base_offset, second.timestamp_ms) == (2, first.timestamp_ms)
    assert store.end_offset("q", 1) == 3 and store.end_offset("q", 0) == 0
    res = store.fetch("q", 1, 1)  # inside the first batch: the whole batch comes
    assert bodies(res.batches) == [b"a", b"b", b"c"]
    assert (res.next_offset, res.start_offset, res.end_offset) == (3, 0, 3)
    h = decode_header(bytes(res.batches[0]))
    assert (h.queue_id, h.partition, h.base_offset, h.timestamp_ms) == (first.queue_id, 1, 0, first.timestamp_ms)
    bounded = store.fetch("q", 1, 0, end_offset=2)
    assert (bodies(bounded.batches), bounded.next_offset) == ([b"a", b"b"], 2)
    small = store.fetch("q", 1, 0, max_bytes=1)  # at least one batch
    assert (len(small.batches), small.next_offset) == (1, 2)
    assert store.fetch("q", 1, 3).batches == []
    with pytest.raises(PartitionOutOfRangeError, match="has partitions 0..1; there is no partition 2"):
        store.append("q", 2, encode_batch([b"x"]))
    with pytest.raises(InvalidBatchError):
        store.append("q", 0, b"not a batch" * 10)


def test_a_tag_filter_skips_whole_batches(store):
    store.create_queue("q", QueueConfig())
    store.append("q", 0, encode_batch([Message(b"a", tag="x")]))
    store.append("q", 0, encode_batch([Message(b"b", tag="y")]))
    store.append("q", 0, encode_batch([Message(b"c", tag="x")]))
    res = store.fetch("q", 0, 0, tag_mask=tags_mask(["x"]))
    assert bodies(res.batches) == [b"a", b"c"] and res.next_offset == 3
    res = store.fetch("q", 0, 0, tag_mask=tags_mask(["z"]))
    assert (res.batches, res.next_offset) == ([], 3)


def test_an_idempotent_retry_returns_the_first_placement(store):
    store.create_queue("q", QueueConfig())
    b0 = encode_batch([b"a"], producer_id=7, base_sequence=0, producer_epoch=0)
    first = store.append("q", 0, b0)
    assert store.append("q", 0, b0) == first
    assert store.end_offset("q", 0) == 1
    with pytest.raises(OutOfOrderSequenceError, match="expected 1"):
        store.append("q", 0, encode_batch([b"b"], producer_id=7, base_sequence=5, producer_epoch=0))


def test_ttl_truncation_and_delete_before_follow_the_clock(store, clock):
    store.create_queue("q", QueueConfig(ttl_s=60))
    store.append("q", 0, encode_batch([b"a", b"b"]))
    clock.advance(30)
    store.append("q", 0, encode_batch([b"c"]))
    clock.advance(31)  # the first batch expired, the second not
    assert store.describe_queue("q").partitions[0].start_offset == 2
    res = store.fetch("q", 0, 0)
    assert (bodies(res.batches, start=2), res.start_offset) == ([b"c"], 2)
    assert store.enforce_retention() >= 0  # what is gone stays gone
    assert store.describe_queue("q").partitions[0].start_offset == 2
    store.append("q", 0, encode_batch([b"d"]))
    store.delete_before("q", 0, 3)
    assert store.fetch("q", 0, 0).start_offset == 3
    with pytest.raises(InvalidArgumentError, match=r"offset 9 is outside q\[0\] \(3..4\)"):
        store.delete_before("q", 0, 9)
    info = store.truncate_queue("q")
    assert (info.partitions[0].start_offset, info.partitions[0].end_offset) == (4, 4)
    assert store.append("q", 0, encode_batch([b"e"])).base_offset == 4


def test_a_disabled_queue_refuses_reads_and_writes(store):
    store.create_queue("q", QueueConfig())
    store.set_queue_enabled("q", False)
    for call in (lambda: store.append("q", 0, encode_batch([b"a"])), lambda: store.fetch("q", 0, 0)):
        with pytest.raises(QueueDisabledError, match="queue 'q' is disabled; enable it to read or write"):
            call()
    store.set_queue_enabled("q", True)
    assert store.append("q", 0, encode_batch([b"a"])).base_offset == 0


def test_lookups_by_id_key_and_time(store, clock):
    q = store.create_queue("q", QueueConfig(partitions=2))
    t0 = int(clock() * 1000)
    store.append("q", 0, encode_batch([Message(b"a", key=b"k"), b"b"]))
    clock.advance(10)
    store.append("q", 1, encode_batch([Message(b"c", key=b"k")]))
    store.append("q", 0, encode_batch([Message(b"d", key=b"other")]))
    name, batch = store.lookup_id(q.queue_id, 0, 1)
    assert name == "q" and bodies([batch]) == [b"a", b"b"]
    with pytest.raises(MessageNotFoundError, match=r"offset 5 of q\[0\] is not retained \(retained: 0..2\)"):
        store.lookup_id(q.queue_id, 0, 5)
    with pytest.raises(MessageNotFoundError, match="no queue has id 999"):
        store.lookup_id(999, 0, 0)
    found = store.lookup_key("q", b"k")
    assert [r.body for b in found for r in decode_records(bytes(b), "q") if r.key == b"k"] == [b"a", b"c"]
    assert len(store.lookup_key("q", b"k", limit=1)) == 1
    assert len(store.lookup_key("q", b"k", start_ms=t0 + 1)) == 1
    assert store.lookup_key("q", b"k", end_ms=t0) == []
    assert store.offset_for_time("q", 0, t0) == 0
    assert store.offset_for_time("q", 0, t0 + 1) == 2
    assert store.offset_for_time("q", 0, t0 + 60_000) == 3
    with pytest.raises(InvalidArgumentError, match="a key is bytes"):
        store.lookup_key("q", "k")


def test_append_listeners_hear_every_append(store):
    heard = []
    store.add_append_listener(lambda *a: heard.append(a))
    q = store.create_queue("q", QueueConfig(partitions=2))
    store.append("q", 1, encode_batch([b"a", b"b"]))
    b0 = encode_batch([b"c"], producer_id=1, base_sequence=0, producer_epoch=0)
    store.append_nowait("q", 0, b0)
    store.append_nowait("q", 0, b0)  # a retry appends nothing: nothing to hear
    store.append_stamped(q.queue_id, 0, encode_batch([b"d"]), 42)
    assert heard == [("q", 1, 2), ("q", 0, 1), ("q", 0, 2)]


def test_the_delay_service_surface(store):
    """What the delay service uses: targets, names by id, stamped appends found again."""
    q = store.create_queue("q", QueueConfig(flush="sync"))
    assert store.produce_target("q", 0) == (q.queue_id, q.config.message_bytes_max, True)
    assert store.queue_name(q.queue_id) == "q" and store.queue_name(999) is None
    before = store.end_position
    store.append("q", 0, encode_batch([b"plain"]))
    res, end = store.append_stamped(q.queue_id, 0, encode_batch([b"due"]), 77)
    store.wait_durable(end)
    assert res.base_offset == 1 and end == store.end_position > before
    assert [h.broker_reserved for h in store.stamped_batches(before)] == [77]
    assert store.stamped_batches(end) == []
    with pytest.raises(InvalidArgumentError, match="carries no producer id"):
        store.append_stamped(q.queue_id, 0, encode_batch([b"x"], producer_id=1, base_sequence=0, producer_epoch=0), 1)
    with pytest.raises(QueueNotFoundError, match="no queue has id 999"):
        store.append_stamped(999, 0, encode_batch([b"x"]), 1)
    assert store.fsync_failed is False and len(store.store_id) == 16
    assert store.kind in ("file", "memory") and (store.path is None) == (store.kind == "memory")


def test_stats_and_closing(store):
    store.create_queue("q", QueueConfig(partitions=3))
    store.create_queue("__x", QueueConfig(), internal=True)
    store.append("q", 0, encode_batch([b"a"]))
    store.flush()
    stats = store.stats()
    assert (stats["queues"], stats["partitions"], stats["internal_queues"]) == (1, 3, 1)
    assert stats["bytes"] > 0
    store.close()
    for call in (store.list_queues, lambda: store.append("q", 0, encode_batch([b"a"])), store.flush):
        with pytest.raises(ClosedError):
            call()


@pytest.mark.parametrize(
    "call",
    [
        lambda s: s.describe_queue("nope"),
        lambda s: s.describe_queue("bad name!"),
        lambda s: s.create_queue("q", QueueConfig(partitions=0)),
        lambda s: s.create_queue("q", "not a config"),
        lambda s: s.fetch("q", 0, "x"),
        lambda s: s.fetch("q", -1, 0),
        lambda s: s.fetch("q", True, 0),
        lambda s: s.add_partitions("q", 1),
        lambda s: s.delete_before("q", 0, 5),
        lambda s: s.offset_for_time("q", 4, 0),
        lambda s: s.lookup_id(1, 0, 0),
        lambda s: s.append("q", 0, encode_batch([b"x" * 2000], producer_id=3, base_sequence=4, producer_epoch=0)),
    ],
)
def test_both_stores_refuse_alike(call, tmp_path):
    """The same mistake gets the same error, word for word, from either store."""
    answers = []
    for kind in KINDS:
        s = open_store(kind, tmp_path, FakeClock())
        try:
            s.create_queue("q", QueueConfig(partitions=2))
            with pytest.raises(Exception) as e:
                call(s)
            answers.append((type(e.value), str(e.value)))
        finally:
            s.close()
    assert answers[0] == answers[1]


@pytest.mark.parametrize("kind", KINDS)
def test_partitions_are_bounded_per_queue_and_in_all(kind, tmp_path, clock):
    """Issue 30, finding 4: 30 queues of 100,000 partitions were created in 14.6 s (RSS 1.15
    GiB), after which every listing failed as too large to answer."""
    cfg = StoreConfig(queue_partitions_max=8, partitions_max=20)
    store = open_store(kind, tmp_path, clock, cfg)
    try:
        held = sum(q.config.partitions for q in store.list_queues(include_internal=True))
        with pytest.raises(InvalidArgumentError, match=r"'big' would have 9 partitions.*queue_partitions_max"):
            store.create_queue("big", QueueConfig(partitions=9))
        store.create_queue("a", QueueConfig(partitions=8))
        with pytest.raises(InvalidArgumentError, match=r"'a' would have 9 .*queue_partitions_max"):
            store.add_partitions("a", 9)
        room = 20 - held - 8
        store.create_queue("b", QueueConfig(partitions=min(room, 8)))
        with pytest.raises(InvalidArgumentError, match=r"'c' would bring this broker to .*partitions_max"):
            store.create_queue("c", QueueConfig(partitions=1 + max(0, room - 8)))
        assert "c" not in {q.name for q in store.list_queues()}
        store.delete_queue("b")  # room again
        store.create_queue("c", QueueConfig(partitions=1))
        with pytest.raises(InvalidArgumentError, match="queue_partitions_max must be"):
            StoreConfig(queue_partitions_max=0).validated()
    finally:
        store.close()
