"""The store contract (headwater.storage.api.Store), run on both stores.

Every test here takes the ``store`` fixture and runs once on a :class:`LogStore` over a
fresh data directory and once on a :class:`MemoryStore` (NATS runs every store test on its
filestore and its memstore). What is about files (crash recovery, segments, fsyncs, the page
cache) is tested on the LogStore alone elsewhere; the broker over both stores is tested
through the ``hw`` fixture (tests/conftest.py) and the differential test.
"""

from __future__ import annotations

import inspect
import random

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
from headwater.model.batch import decode_header, encode_batch, patch_batch, tags_mask
from headwater.model.batch_reads import decode_records
from headwater.model.config import QueueConfig
from headwater.model.service import ProduceResult
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


@pytest.mark.parametrize("seed", range(3))
def test_batches_of_partitions_sent_in_turn_read_back_whole_and_in_order(store, seed):
    """Batches sent to several partitions in turn lie in a segment with other partitions'
    batches between them, small ones near each other and large ones far apart. From any
    offset, with any size limit and tag filter, following each fetch's next offset reads
    every batch of the partition once, whole, in order."""
    rnd = random.Random(seed)
    store.create_queue("q", QueueConfig(partitions=4))
    sent: dict[int, list[tuple[int, list[bytes], str]]] = {p: [] for p in range(4)}
    for n in range(300):
        p = rnd.randrange(4) if rnd.random() < 0.3 else n % 4
        big = rnd.random() < 0.05  # far from its partition's next batch
        msgs = [
            rnd.randbytes(rnd.choice([20_000, 40_000]) if big else rnd.randrange(1, 300))
            for _ in range(rnd.choice([1, 1, 1, 3]))
        ]
        tag = rnd.choice("xyz")
        res = store.append("q", p, encode_batch([Message(m, tag=tag) for m in msgs]))
        sent[p].append((res.base_offset, msgs, tag))
    for p, batches in sent.items():
        end = store.end_offset("q", p)
        for _ in range(6):
            start = rnd.randrange(end)
            tags = rnd.choice([None, "x", "y"])
            mask = tags_mask([tags]) if tags else 0
            limit = rnd.choice([1, 500, 5_000, 64 * 1024, 1 << 20])
            want = [
                m
                for base, msgs, tag in batches
                if base + len(msgs) > start and (tags is None or tag == tags)
                for m in msgs
            ]
            got: list[bytes] = []
            at = start
            while at < end:
                res = store.fetch("q", p, at, max_bytes=limit, tag_mask=mask)
                for b in res.batches:
                    h = decode_header(bytes(b))
                    assert h.partition == p and len(b) == 4 + int.from_bytes(bytes(b)[:4], "little")
                    got.extend(r.body for r in decode_records(bytes(b), "q"))
                assert res.next_offset > at
                at = res.next_offset
            assert got == want, (p, start, tags, limit)


def test_an_idempotent_retry_returns_the_first_placement(store):
    store.create_queue("q", QueueConfig())
    b0 = encode_batch([b"a"], producer_id=7, base_sequence=0, producer_epoch=0)
    first = store.append("q", 0, b0)
    assert store.append("q", 0, b0) == first
    assert store.end_offset("q", 0) == 1
    with pytest.raises(OutOfOrderSequenceError, match="expected 1"):
        store.append("q", 0, encode_batch([b"b"], producer_id=7, base_sequence=5, producer_epoch=0))


def test_describe_partitions_says_what_describe_queue_says_of_those_alone(store, clock):
    store.create_queue("q", QueueConfig(partitions=5, ttl_s=60))
    store.append("q", 1, encode_batch([b"a", b"b"]))
    clock.advance(61)  # expired: partition 1 starts past them
    store.append("q", 1, encode_batch([b"c"]))
    store.append("q", 3, encode_batch([b"d"]))
    info = store.describe_queue("q")

    got = store.describe_partitions("q", [3, 1, 9, -1, True, "2"])  # those the queue has, and ints only

    assert (got.name, got.queue_id, got.partition_count) == ("q", info.queue_id, 5)
    assert got.partitions == {1: info.partitions[1], 3: info.partitions[3]}
    assert got.partitions[1].start_offset == 2
    assert store.describe_partitions("q", []).partitions == {}
    with pytest.raises(QueueNotFoundError):
        store.describe_partitions("nope", [0])


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
        lambda s: s.create_queue("x", QueueConfig(), queue_id=1),
        lambda s: s.create_queue("x", QueueConfig(), queue_id=2**32),
        lambda s: (s.append("q", 0, encode_batch([b"a"])), s.reset_partition("q", 0, 5)),
        lambda s: (s.reset_partition("q", 0, 5), s.reset_partition("q", 0, 4)),
        lambda s: s.reset_partition("q", 1, "5"),
        lambda s: s.append_copy("q", 0, bytes(patch_batch(encode_batch([b"x"]), 1, 0, 3, 5)), 3),
        lambda s: s.append_copy("q", 0, bytes(patch_batch(encode_batch([b"x"]), 2, 0, 0, 5)), 0),
        lambda s: s.append_copy("q", 0, bytes(encode_batch([b"x"])), 0),
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


# -- what a cluster needs: queue ids it allocates, partitions copied between brokers -------


def test_a_queue_takes_the_id_it_is_given(store):
    """A cluster's controller allocates queue ids; every broker creates the queue under it."""
    assert store.create_queue("a", QueueConfig(), queue_id=100).queue_id == 100
    assert store.create_queue("b", QueueConfig()).queue_id == 101  # later automatic ids stay past it
    assert store.create_queue("c", QueueConfig(), queue_id=5).queue_id == 5  # below the next: free, so fine
    assert store.create_queue("__i", QueueConfig(), internal=True, queue_id=7).queue_id == 7
    assert store.create_queue("d", QueueConfig()).queue_id == 102
    assert store.describe_queue("a").queue_id == 100 and store.queue_name(5) == "c"
    with pytest.raises(InvalidArgumentError, match=r"cannot create queue 'e' with id 100: queue 'a' of this store"):
        store.create_queue("e", QueueConfig(), queue_id=100)
    with pytest.raises(InvalidArgumentError, match=r"queue 'e' with id 7: queue '__i' of this store has that id"):
        store.create_queue("e", QueueConfig(), queue_id=7)  # internal ones hold their ids too
    with pytest.raises(QueueExistsError, match="queue 'a' already exists"):
        store.create_queue("a", QueueConfig(), queue_id=100)
    assert "e" not in {i.name for i in store.list_queues()}
    store.append("a", 0, encode_batch([b"x"]))
    h = decode_header(bytes(store.fetch("a", 0, 0).batches[0]))
    assert h.queue_id == 100  # message ids carry it
    assert store.lookup_id(100, 0, 0)[0] == "a"


@pytest.mark.parametrize("bad", [True, 0, -1, 2**32, "7", 7.0])
def test_a_bad_queue_id_is_refused(store, bad):
    with pytest.raises(InvalidArgumentError, match="a queue id is"):
        store.create_queue("a", QueueConfig(), queue_id=bad)
    assert store.list_queues() == []
    assert store.create_queue("a", QueueConfig()).queue_id == 1  # nothing was taken


def test_the_last_queue_id_leaves_no_automatic_one(store):
    assert store.create_queue("top", QueueConfig(), queue_id=2**32 - 1).queue_id == 2**32 - 1
    with pytest.raises(InvalidArgumentError, match=r"every queue id up to 4294967295; create it with a free"):
        store.create_queue("next", QueueConfig())
    assert store.create_queue("next", QueueConfig(), queue_id=1).queue_id == 1


def test_an_empty_partition_is_reset_forward(store, clock):
    store.create_queue("q", QueueConfig(partitions=2, ttl_s=60))
    store.reset_partition("q", 0, 1000)
    info = store.describe_queue("q").partitions
    assert (info[0].start_offset, info[0].end_offset, info[1].end_offset) == (1000, 1000, 0)
    res = store.fetch("q", 0, 0)
    assert (res.batches, res.start_offset, res.end_offset) == ([], 1000, 1000)
    assert store.append("q", 0, encode_batch([b"a", b"b"])).base_offset == 1000
    assert store.end_offset("q", 0) == 1002 and store.offset_for_time("q", 0, 0) == 1000
    with pytest.raises(InvalidArgumentError, match=r"cannot reset q\[0\]: it holds offsets 1000..1001.*needs an empty"):
        store.reset_partition("q", 0, 5000)
    store.delete_before("q", 0, 1002)  # emptied: a reset may go on from there
    with pytest.raises(InvalidArgumentError, match=r"to offset 1001: offsets are never reused.*end offset 1002"):
        store.reset_partition("q", 0, 1001)
    store.reset_partition("q", 0, 1002)  # to its own end: allowed, changes nothing
    store.reset_partition("q", 0, 2000)
    assert store.append("q", 0, encode_batch([b"c"])).base_offset == 2000
    assert bodies(store.fetch("q", 0, 0).batches) == [b"c"]
    clock.advance(61)  # everything expired: empty to readers, so it may be reset
    store.reset_partition("q", 0, 3000)
    assert store.fetch("q", 0, 0).start_offset == 3000
    assert store.append("q", 0, encode_batch([b"d"])).base_offset == 3000
    assert store.enforce_retention() >= 0  # what the reset left behind goes, the rest stays
    assert bodies(store.fetch("q", 0, 0).batches) == [b"d"]
    assert store.truncate_queue("q").partitions[0].start_offset == 3001
    store.reset_partition("q", 0, 3001)


@pytest.mark.parametrize(
    "args, error, words",
    [
        (("q", 0, "5"), InvalidArgumentError, "an offset is an int, got str"),
        (("q", 0, True), InvalidArgumentError, "an offset is an int, got bool"),
        (("q", 0, -1), InvalidArgumentError, "offsets are never reused"),
        (("q", 0, 2**62 + 1), InvalidArgumentError, "at most 4611686018427387904"),
        (("q", 2, 5), PartitionOutOfRangeError, "there is no partition 2"),
        (("nope", 0, 5), QueueNotFoundError, "queue 'nope' does not exist"),
    ],
)
def test_a_bad_reset_is_refused(store, args, error, words):
    store.create_queue("q", QueueConfig(partitions=2))
    with pytest.raises(error, match=words):
        store.reset_partition(*args)
    assert store.describe_queue("q").partitions[0].end_offset == 0


def _source(clock) -> tuple[MemoryStore, list[ProduceResult]]:
    """A store in memory with a queue of id 7 whose partition 0 holds every kind of batch
    (a copy reads the same from either kind: one stored format)."""
    src = MemoryStore(clock=clock)
    src.create_queue("q", QueueConfig(partitions=2), queue_id=7)
    idem = dict(producer_id=77, producer_epoch=3)
    made = [
        src.append("q", 0, encode_batch([b"a", Message(b"b", key=b"k")])),
        src.append("q", 0, encode_batch([Message(b"c", tag="t")], base_sequence=0, **idem)),
    ]
    clock.advance(2)
    made.append(src.append_stamped(7, 0, encode_batch([b"due"]), 4242)[0])
    made.append(src.append("q", 0, encode_batch([b"d", b"e"], base_sequence=1, compression="zstd", **idem)))
    clock.advance(3)
    made.append(src.append("q", 0, encode_batch([Message(b"f", key=b"k")], base_sequence=3, **idem)))
    return src, made


def _stored(src, queue: str = "q", partition: int = 0) -> list[bytes]:
    return [bytes(b) for b in src.fetch(queue, partition, 0, max_bytes=1 << 30).batches]


def test_a_copy_keeps_offsets_bytes_and_producer_state(store, clock):
    src, made = _source(clock)
    heard = []
    store.add_append_listener(lambda *a: heard.append(a))
    store.create_queue("q", QueueConfig(partitions=2), queue_id=7)
    clock.advance(-60)  # the copying store's clock is behind: times are the source's anyway
    for raw in _stored(src):
        h = decode_header(raw)
        got = store.append_copy("q", 0, raw, h.base_offset)
        assert got == ProduceResult(7, 0, h.base_offset, h.count, h.timestamp_ms)
    assert [r.base_offset for r in made] == [0, 2, 3, 4, 6]
    assert _stored(store) == _stored(src)  # byte for byte, broker_reserved and times included
    assert store.end_offset("q", 0) == 7 and heard[-1] == ("q", 0, 7)
    assert [h.broker_reserved for h in store.stamped_batches(0)] == [4242]
    for offset in range(7):
        assert store.lookup_id(7, 0, offset) == src.lookup_id(7, 0, offset)
    assert store.lookup_key("q", b"k") == src.lookup_key("q", b"k")
    for ts in (0, made[1].timestamp_ms, made[1].timestamp_ms + 1, made[-1].timestamp_ms, 2**62):
        assert store.offset_for_time("q", 0, ts) == src.offset_for_time("q", 0, ts)
    # a producer retrying what the source acknowledged finds it here: nothing twice
    retry = encode_batch([b"d", b"e"], producer_id=77, producer_epoch=3, base_sequence=1, compression="zstd")
    assert store.append("q", 0, retry) == made[3]
    assert store.end_offset("q", 0) == 7
    nxt = store.append("q", 0, encode_batch([b"g"], producer_id=77, producer_epoch=3, base_sequence=4))
    assert nxt.base_offset == 7 and nxt.timestamp_ms >= made[-1].timestamp_ms  # never before the copies
    with pytest.raises(OutOfOrderSequenceError, match="expected 5"):
        store.append("q", 0, encode_batch([b"h"], producer_id=77, producer_epoch=3, base_sequence=9))
    src.close()


def test_a_copy_begins_where_a_reset_put_the_partition(store, clock):
    src, _ = _source(clock)
    src.delete_before("q", 0, 3)  # its log begins at 3 now
    store.create_queue("q", QueueConfig(partitions=2), queue_id=7)
    store.reset_partition("q", 0, 3)
    for raw in _stored(src):
        store.append_copy("q", 0, raw, decode_header(raw).base_offset)
    assert _stored(store) == _stored(src) and store.fetch("q", 0, 0).start_offset == 3
    # the producer's first batches went with the source's deleted part: its retry of a
    # later one is still recognised
    retry = encode_batch([Message(b"f", key=b"k")], producer_id=77, producer_epoch=3, base_sequence=3)
    assert store.append("q", 0, retry).base_offset == 6 and store.end_offset("q", 0) == 7
    src.close()


def test_a_partition_moved_away_and_back_serves_what_it_kept(store, clock):
    """A broker that led a partition, moved it away (a copy elsewhere, then emptied it here)
    and takes it back rewinds to the other log's start: what it kept is served again and
    the copy goes on from its own end, so the move back copies only what is new."""
    src, _ = _source(clock)
    store.create_queue("q", QueueConfig(partitions=2), queue_id=7)
    for raw in _stored(src)[:3]:  # held here up to offset 4, then moved away
        store.append_copy("q", 0, raw, decode_header(raw).base_offset)
    store.delete_before("q", 0, 4)
    theirs = src.fetch("q", 0, 3, max_bytes=1).batches[0]  # the other log's batch at offset 3
    with pytest.raises(InvalidArgumentError, match=r"rewind q\[0\] to offset 0: .* offset 3 was not given"):
        store.rewind_partition("q", 0, 0)
    with pytest.raises(InvalidArgumentError, match=r"offset 3 differs from the one kept here \(the logs differ\)"):
        store.rewind_partition("q", 0, 0, _stored(src)[1])
    assert store.describe_queue("q").partitions[0].start_offset == 4  # refused: nothing changed
    store.rewind_partition("q", 0, 0, bytes(theirs))
    info = store.describe_queue("q").partitions[0]
    assert (info.start_offset, info.end_offset) == (0, 4)
    for raw in _stored(src):
        if decode_header(raw).base_offset >= 4:
            store.append_copy("q", 0, raw, decode_header(raw).base_offset)
    assert _stored(store) == _stored(src)
    assert store.lookup_key("q", b"k") == src.lookup_key("q", b"k")
    store.delete_before("q", 0, 7)
    store.rewind_partition("q", 0, 3, _stored(src)[-1])  # to the middle of a batch, as the other log's start
    assert bodies(store.fetch("q", 0, 3).batches, start=3) == [b"due", b"d", b"e", b"f"]
    src.close()


def test_a_partition_that_kept_nothing_rewinds_empty(store):
    store.create_queue("q", QueueConfig(partitions=2, ttl_s=None))
    big = b"x" * 40_000  # a segment (64 KiB here) holds one
    for _ in range(2):
        store.append("q", 0, encode_batch([big]))
    store.delete_before("q", 0, 2)
    for _ in range(2):  # partition 0's segments are sealed: retention removes them
        store.append("q", 1, encode_batch([big]))
    assert store.enforce_retention() >= 0
    store.rewind_partition("q", 0, 0)  # nothing kept: no batch to compare
    info = store.describe_queue("q").partitions[0]
    assert (info.start_offset, info.end_offset) == (0, 0)
    assert store.fetch("q", 0, 0).batches == []
    assert store.append("q", 0, encode_batch([b"again"])).base_offset == 0
    assert bodies(store.fetch("q", 0, 0).batches) == [b"again"]


@pytest.mark.parametrize(
    "args, error, words",
    [
        (("q", 0, 0), InvalidArgumentError, r"cannot rewind q\[0\]: it holds offsets 0..1, and a rewind needs"),
        (("q", 1, 1), InvalidArgumentError, r"to offset 1: a rewind goes back, from its end offset 0"),
        (("q", 1, -1), InvalidArgumentError, "at least 0"),
        (("q", 1, "0"), InvalidArgumentError, "an offset is an int, got str"),
        (("q", 2, 0), PartitionOutOfRangeError, "there is no partition 2"),
        (("nope", 0, 0), QueueNotFoundError, "queue 'nope' does not exist"),
    ],
)
def test_a_bad_rewind_is_refused(store, args, error, words):
    store.create_queue("q", QueueConfig(partitions=2))
    store.append("q", 0, encode_batch([b"a", b"b"]))
    with pytest.raises(error, match=words):
        store.rewind_partition(*args)
    assert [(p.start_offset, p.end_offset) for p in store.describe_queue("q").partitions] == [(0, 2), (0, 0)]
    store.rewind_partition("q", 1, 0)  # to its own end: allowed, changes nothing


def test_a_copy_into_a_disabled_queue_is_taken(store, clock):
    src, _ = _source(clock)
    store.create_queue("q", QueueConfig(partitions=2), queue_id=7)
    store.set_queue_enabled("q", False)  # moving a queue is no use of it
    raw = _stored(src)[0]
    assert store.append_copy("q", 0, raw, 0).count == 2
    store.set_queue_enabled("q", True)
    assert _stored(store) == [raw]
    src.close()


def _damaged(raw: bytes, at: int) -> bytes:
    out = bytearray(raw)
    out[at] ^= 0x10
    return bytes(out)


def test_a_bad_copy_is_refused_and_nothing_is_stored(store, clock):
    src, _ = _source(clock)
    store.create_queue("q", QueueConfig(partitions=2), queue_id=7)
    store.create_queue("other", QueueConfig(partitions=2))
    batches = _stored(src)
    store.append_copy("q", 0, batches[0], 0)
    with pytest.raises(InvalidArgumentError, match=r"must begin at its end offset 2, got base_offset 3 \(a gap\)"):
        store.append_copy("q", 0, batches[2], 3)
    with pytest.raises(InvalidArgumentError, match=r"end offset 2, got base_offset 0 \(an overlap\)"):
        store.append_copy("q", 0, batches[0], 0)
    with pytest.raises(InvalidBatchError, match=r"stored as queue id 7 partition 0 offset 3, not as q\[0\] \(queue"):
        store.append_copy("q", 0, batches[2], 2)  # the offset the caller says is not the batch's
    store.reset_partition("q", 1, 2)
    with pytest.raises(InvalidBatchError, match=r"partition 0 offset 2, not as q\[1\]"):
        store.append_copy("q", 1, batches[1], 2)  # another partition's batch
    with pytest.raises(InvalidBatchError, match=r"stored as queue id 7 .*not as other\[0\]"):
        store.append_copy("other", 0, batches[0], 0)
    with pytest.raises(InvalidBatchError, match="batch checksum mismatch"):
        store.append_copy("q", 0, _damaged(batches[1], 100), 2)  # the producer's bytes
    with pytest.raises(InvalidBatchError, match="batch header checksum mismatch"):
        store.append_copy("q", 0, _damaged(batches[1], 25), 2)  # the append time
    with pytest.raises(InvalidBatchError):
        store.append_copy("q", 0, batches[1][:-1], 2)
    with pytest.raises(InvalidArgumentError, match="a base offset is an int, got str"):
        store.append_copy("q", 0, batches[1], "2")
    with pytest.raises(QueueNotFoundError, match="queue 'nope' does not exist"):
        store.append_copy("nope", 0, batches[1], 2)
    with pytest.raises(PartitionOutOfRangeError, match="there is no partition 5"):
        store.append_copy("q", 5, batches[1], 2)
    assert _stored(store) == batches[:1] and store.end_offset("q", 0) == 2
    store.append_copy("q", 0, batches[1], 2)  # the right one still goes in
    assert _stored(store) == batches[:2]
    src.close()


def test_a_copy_never_goes_back_in_time(store, clock):
    src = MemoryStore(clock=clock)
    src.create_queue("q", QueueConfig(), queue_id=7)
    src.append("q", 0, encode_batch([b"late"]))
    clock.advance(-10)
    early = MemoryStore(clock=clock)
    early.create_queue("q", QueueConfig(), queue_id=7)
    early.reset_partition("q", 0, 1)
    early.append("q", 0, encode_batch([b"early"]))  # offset 1, appended 10 s before offset 0
    store.create_queue("q", QueueConfig(), queue_id=7)
    store.append_copy("q", 0, _stored(src)[0], 0)
    with pytest.raises(InvalidBatchError, match=r"append times never go back along a partition"):
        store.append_copy("q", 0, _stored(early)[0], 1)
    assert store.end_offset("q", 0) == 1
    src.close()
    early.close()
