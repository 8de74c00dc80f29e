"""Properties of the record batch codec, and of the log against an in-memory model.

Codec: whatever a producer can encode decodes back to the same messages, with or without
compression; any single damaged byte or missing tail of a stored batch is detected; bytes
that are not a batch are refused with :class:`InvalidBatchError` and nothing else.

Log: random sequences of appends, reopens, truncations, partition additions, deletions,
clock moves (TTL) and retention runs against a :class:`LogStore` with small segments,
checked after every step against a dict of lists; and the same against a
:class:`MemoryStore` (without the reopens).
"""

from __future__ import annotations

import hashlib
import shutil
import struct
import tempfile
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from headwater import Message, QueueConfig
from headwater.broker import Broker
from headwater.client import Client
from headwater.errors import InvalidBatchError, MessageTooLargeError
from headwater.model.batch import (
    BATCH_BYTES_MAX,
    COMPRESSION_LZ4,
    COMPRESSION_ZSTD,
    HEADER,
    HEADER_SIZE,
    MAGIC,
    broker_prefix,
    check_batch,
    crc32c,
    encode_batch,
    patch_batch,
    tags_mask,
    validate_batch,
)
from headwater.model.batch_reads import decode_records
from headwater.storage import StoreConfig
from headwater.storage.memory import MemoryStore
from headwater.storage.store import LogStore
from headwater.testing import FakeClock

# -- strategies ------------------------------------------------------------------------------

texts = st.text(max_size=12)
messages = st.lists(
    st.one_of(
        st.binary(max_size=200),
        st.builds(
            Message,
            st.binary(max_size=200),
            st.none() | st.binary(max_size=24),
            st.none() | st.text(min_size=1, max_size=12),
            st.none() | st.dictionaries(texts, texts, max_size=4),
        ),
    ),
    min_size=1,
    max_size=25,
)
compressions = st.sampled_from([None, "zstd", "lz4"])
broker_fields = st.tuples(
    st.integers(0, 2**32 - 1),  # queue id
    st.integers(0, 2**32 - 1),  # partition
    st.integers(0, 2**63 - 2**33),  # base offset
    st.integers(0, 2**62),  # timestamp
)


def _expect(m: Message | bytes) -> tuple:
    if isinstance(m, bytes):
        return (m, None, None, None)
    return (m.body, m.key, m.tag, m.properties or None)


def _stored(msgs, compression, fields) -> tuple[bytes, bytearray]:
    batch = encode_batch(msgs, compression=compression)
    return batch, patch_batch(batch, *fields)


# -- codec -----------------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(messages, compressions, broker_fields)
def test_round_trip(msgs, compression, fields):
    batch, stored = _stored(msgs, compression, fields)
    h, _ = validate_batch(batch)  # the broker accepts every batch a producer encodes
    assert h.count == len(msgs)
    tags = {m.tag for m in msgs if isinstance(m, Message) and m.tag is not None}
    assert h.tag_mask == tags_mask(tags)
    # the broker writes a prefix and the producer's bytes as they are: same bytes as patching
    qid, part, base, ts = fields
    assert bytes(stored) == broker_prefix(h.length, qid, part, base, ts) + batch[40:]
    check_batch(stored)
    recs = decode_records(stored, "q")
    assert [(r.body, r.key, r.tag, r.properties) for r in recs] == [_expect(m) for m in msgs]
    assert [r.offset for r in recs] == list(range(base, base + len(msgs)))
    assert {(r.queue_id, r.partition, r.timestamp_ms, r.queue) for r in recs} == {(qid, part, ts, "q")}


@settings(max_examples=100, deadline=None)
@given(messages, compressions, broker_fields, st.data())
def test_decode_slices_and_filters(msgs, compression, fields, data):
    _, stored = _stored(msgs, compression, fields)
    base, n = fields[2], len(msgs)
    lo = data.draw(st.integers(base - 2, base + n + 2))
    hi = data.draw(st.none() | st.integers(base - 2, base + n + 2))
    wanted = data.draw(st.none() | st.frozensets(st.text(min_size=1, max_size=12), max_size=3))
    recs = decode_records(stored, "q", start_offset=lo, end_offset=hi, tags=wanted)
    expect = [
        (base + i, *_expect(m))
        for i, m in enumerate(msgs)
        if lo <= base + i and (hi is None or base + i < hi) and (wanted is None or _expect(m)[2] in wanted)
    ]
    assert [(r.offset, r.body, r.key, r.tag, r.properties) for r in recs] == expect


@settings(max_examples=300, deadline=None)
@given(messages, compressions, broker_fields, st.data())
def test_any_flipped_byte_is_detected(msgs, compression, fields, data):
    batch, stored = _stored(msgs, compression, fields)
    pos = data.draw(st.integers(0, len(stored) - 1), label="position")
    bad = bytearray(stored)
    bad[pos] ^= data.draw(st.integers(1, 255), label="xor")
    with pytest.raises(InvalidBatchError):
        check_batch(bad)
    # before the broker patches it, a batch's broker fields [4, 40) are not the producer's
    # to protect; every other byte is
    if not 4 <= pos < 40:
        fresh = bytearray(batch)
        fresh[pos] = bad[pos]
        with pytest.raises(InvalidBatchError):
            validate_batch(bytes(fresh))


@settings(max_examples=200, deadline=None)
@given(messages, compressions, broker_fields, st.data())
def test_any_truncation_or_padding_is_detected(msgs, compression, fields, data):
    batch, stored = _stored(msgs, compression, fields)
    cut = data.draw(st.integers(0, len(stored) - 1), label="cut")
    with pytest.raises(InvalidBatchError):
        check_batch(stored[:cut])
    with pytest.raises(InvalidBatchError):
        validate_batch(batch[:cut])
    with pytest.raises(InvalidBatchError):
        validate_batch(batch + data.draw(st.binary(min_size=1, max_size=50), label="stray"))


def _must_refuse_or_decode(buf: bytes | bytearray) -> None:
    """Every way in must end in InvalidBatchError or a consistent decode, never another error."""
    try:
        h = check_batch(buf)
        recs = decode_records(buf, "q", header=h)
        assert len(recs) == h.count
    except InvalidBatchError:
        pass
    try:
        h, p = validate_batch(bytes(buf))
        assert len(p.bodies) == h.count
    except InvalidBatchError:
        pass


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=600))
def test_garbage_is_refused(garbage):
    _must_refuse_or_decode(garbage)


msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.binary(max_size=20)
    | st.text(max_size=10)
    | st.floats(allow_nan=False),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=25,
)
payload_like = st.one_of(
    st.binary(max_size=300),  # not msgpack at all
    msgpack_values.map(msgspec.msgpack.encode),  # msgpack of the wrong shape
    st.tuples(  # the right shape with wrong or inconsistent columns
        st.lists(st.binary(max_size=10) | st.text(max_size=3), max_size=4),
        st.none() | st.lists(st.none() | st.binary(max_size=5) | st.integers(-9, 9), max_size=4),
        st.none() | st.lists(st.none() | st.text(max_size=5) | st.binary(max_size=2), max_size=4),
        st.none() | st.lists(st.none() | st.dictionaries(texts, texts | st.integers(-9, 9), max_size=2), max_size=4),
    ).map(lambda cols: msgspec.msgpack.encode(list(cols))),
)


@st.composite
def checksummed_garbage(draw) -> bytearray:
    """Bytes that pass both checksums but carry arbitrary header fields and payloads."""
    payload = draw(payload_like)
    codec = draw(st.sampled_from([0, 0, COMPRESSION_ZSTD, COMPRESSION_LZ4, 3]))
    if codec == COMPRESSION_ZSTD and draw(st.booleans()):
        import zstandard

        payload = zstandard.ZstdCompressor().compress(payload)
    elif codec == COMPRESSION_LZ4 and draw(st.booleans()):
        import lz4.frame

        payload = lz4.frame.compress(payload, store_size=draw(st.booleans()))
    flags = draw(st.integers(0, 255).map(lambda f: (f & ~3) | codec))
    count = draw(st.sampled_from([0, 1, 2, 3, 4]) | st.integers(0, 2**32 - 1))
    size = len(payload)
    payload_size = draw(st.sampled_from([size, size]) | st.integers(0, 2**32 - 1))
    length = draw(st.just((HEADER_SIZE - 4 + payload_size) % 2**32) | st.integers(0, 2**32 - 1))
    magic = draw(st.sampled_from([MAGIC, MAGIC, 0, 2, 255]))
    header_size = draw(st.sampled_from([HEADER_SIZE, HEADER_SIZE, 0, 95, 97, 65535]))
    head = HEADER.pack(
        length,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        magic,
        flags,
        header_size,
        count,
        payload_size,
        0,
        -1,
        -1,
        -1,
        0,
        draw(st.integers(0, 2**64 - 1)),
        0,
    )
    body = head[44:] + payload
    raw = head[:40] + struct.pack("<I", crc32c(body)) + body
    return patch_batch(raw, 1, 0, draw(st.integers(0, 2**40)), 0)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(checksummed_garbage())
def test_checksummed_garbage_is_refused(buf):
    _must_refuse_or_decode(buf)


plain_messages = st.lists(st.binary(max_size=60), min_size=1, max_size=4)  # the inline path's batches


@st.composite
def stored_runs(draw) -> list[bytes | bytearray]:
    """A fetch's worth of stored batches: uncompressed ones of a few bodies, with or without
    keys, tags and properties, some compressed, now and then one damaged or not a batch at all."""
    out: list[bytes | bytearray] = []
    base = draw(st.integers(0, 40))
    for _ in range(draw(st.integers(0, 6))):
        kind = draw(st.sampled_from(["plain", "plain", "columns", "columns", "any", "flipped", "cut", "garbage"]))
        if kind == "garbage":
            out.append(draw(checksummed_garbage()))
            continue
        msgs = draw(messages if kind in ("columns", "any") else plain_messages)  # columns: keys, tags, properties
        _, stored = _stored(msgs, None if kind != "any" else draw(compressions), (7, 1, base, 1_700_000_000_000))
        base += len(msgs)
        if kind == "flipped":
            stored[draw(st.integers(0, len(stored) - 1))] ^= draw(st.integers(1, 255))
        elif kind == "cut":
            stored = stored[: draw(st.integers(0, len(stored) - 1))]
        out.append(stored)
    return out


def _outcome(fn):
    try:
        return [(r.offset, r.body, r.key, r.tag, r.properties, r.queue_id, r.scheduled_ms) for r in fn()]
    except Exception as e:  # noqa: BLE001 - the outcome compared is the error itself
        return (type(e), str(e))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stored_runs(), st.data())
def test_a_run_of_stored_batches_decodes_as_each_alone(batches, data):
    """``stored_records`` (plain batches checked and decoded inline) gives the records and the
    errors of ``decode_stored`` called batch by batch, whatever the batches hold."""
    from headwater.client.core.lookups import decode_stored, stored_records

    lo = data.draw(st.integers(0, 70))
    hi = data.draw(st.none() | st.integers(0, 70))
    present: set[str] = set()  # tags to filter on: some the batches hold
    for b in batches:
        try:
            present |= {r.tag for r in decode_stored(b, "q") if r.tag is not None}
        except Exception:  # noqa: BLE001 - a damaged batch holds no tag to choose
            continue
    tag = st.sampled_from(sorted(present)) if present else st.text(min_size=1, max_size=3)
    wanted = data.draw(st.none() | st.frozensets(tag | st.text(min_size=1, max_size=3), max_size=3))
    kw = {"start_offset": lo, "end_offset": hi, "tags": wanted}
    alone = _outcome(lambda: [r for b in batches for r in decode_stored(b, "q", **kw)])
    assert _outcome(lambda: stored_records(batches, "q", **kw)) == alone


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(plain_messages, st.integers(0, 3)), max_size=6),
    st.integers(0, 40),
    st.integers(0, 40),
    st.data(),
)
def test_count_messages_counts_what_lies_in_the_range(runs, lo, hi, data):
    """A push's cost in credit: the messages of its batches inside ``[lo, hi)`` (or of their
    selections) and the batches' bytes, against counting offset by offset."""
    from headwater.model.filtering import count_messages

    batches, offsets, base = [], [], data.draw(st.integers(0, 10))
    for msgs, gap in runs:
        _, stored = _stored(msgs, None, (1, 0, base, 0))
        batches.append(stored)
        offsets.append(list(range(base, base + len(msgs))))
        base += len(msgs) + gap
    use_selections = batches and data.draw(st.booleans())
    selections = [data.draw(st.sampled_from([[], offs])) for offs in offsets] if use_selections else []
    want = sum(lo <= o < hi for offs in offsets for o in offs)
    assert count_messages(batches, selections, lo, hi) == (want, sum(len(b) for b in batches))


def test_compressed_payload_cannot_expand_past_the_batch_limit():
    """A decompression bomb: a few KiB of zstd or lz4 that expand past BATCH_BYTES_MAX must
    be refused before the expansion is held in memory."""
    from tests.support.frames import bomb_batch

    for codec, state_size in [("zstd", True), ("lz4", True), ("lz4", False)]:
        with pytest.raises((InvalidBatchError, MessageTooLargeError), match="expands beyond"):
            validate_batch(bomb_batch(BATCH_BYTES_MAX + 1, codec=codec, state_size=state_size))


@pytest.mark.parametrize("codec", ["zstd", "lz4"])
@pytest.mark.parametrize("state_size", [True, False])
def test_a_bomb_costs_no_more_than_its_messages_may_hold(codec, state_size):
    """Issue 30, finding 3: a one-message batch of 2 KB that expands to 66 MB was decoded in
    full (66 MB, then a 66 MB copy of the body) before its body was found too large. Now a
    batch decompresses to at most what its messages may hold: each a body of at most the
    queue's message_bytes_max and MESSAGE_ROOM_BYTES for its key, tag and properties."""
    import tracemalloc

    from tests.support.frames import bomb_batch

    bomb = bomb_batch(66_000_000, codec=codec, state_size=state_size)
    tracemalloc.start()
    try:
        with pytest.raises((InvalidBatchError, MessageTooLargeError), match=r"message_bytes_max=1048576"):
            validate_batch(bomb, message_bytes_max=1 << 20)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * (1 << 20), f"refusing the bomb took {peak / 1e6:.0f} MB"


def test_a_message_may_keep_its_room_beside_the_largest_body():
    """What a batch may hold beside its bodies: up to MESSAGE_ROOM_BYTES per message for its
    key, tag and properties, compressed or not; beyond it the batch is refused, the same
    way whether compressed or not, naming the setting."""
    body = b"b" * 1000
    fits = Message(body, key=b"k" * 30_000, properties={"p": "v" * 30_000})
    beyond = Message(body, key=b"k" * 40_000, properties={"p": "v" * 40_000})
    for compression in (None, "zstd", "lz4"):
        validate_batch(encode_batch([fits], compression=compression), message_bytes_max=1000)
        with pytest.raises(MessageTooLargeError, match=r"message_bytes_max=1000 bytes, and 65536 bytes for each"):
            validate_batch(encode_batch([beyond], compression=compression), message_bytes_max=1000)
        validate_batch(encode_batch([beyond] * 2, compression=compression), message_bytes_max=100_000)


def test_a_refused_batch_leaves_no_payload_alive_in_its_error():
    """The error of a refused batch held, through its traceback's frames, the decompressed
    payload: errors kept for their answers (or in a reference cycle until a full collection)
    kept 1.8 GiB alive in a broker under a stream of compression bombs."""
    import tracemalloc

    from tests.support.frames import bomb_batch

    limit = 20 << 20
    bomb = bomb_batch(limit + 10_000)  # within the batch's room, so decoded; its body is too large
    tracemalloc.start()
    try:
        with pytest.raises(MessageTooLargeError, match="a message body is") as caught:
            validate_batch(bomb, message_bytes_max=limit)
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert caught.value.__traceback__ is not None  # still held, as an answer would hold it
    assert held < 2 * (1 << 20), f"the error keeps {held / 1e6:.0f} MB alive"


# -- the log against a model -----------------------------------------------------------------

SEGMENT_BYTES = 64 * 1024
TTL_S = 60
PARTITIONS_CAP = 6


class _QueueModel:
    def __init__(self, ttl_s: int | None, partitions: int) -> None:
        self.ttl_s = ttl_s
        self.start = [0] * partitions  # truncation point
        self.next = [0] * partitions
        # (offset, timestamp_ms, body, key, tag, properties) of every message appended
        self.msgs: list[list[tuple]] = [[] for _ in range(partitions)]


# size classes rather than st.integers: hypothesis favours small numbers, and the point is to
# cross segment rolls (64 KiB) and let retention delete whole segments
body_sizes = st.sampled_from([0, 1, 100, 1500, 6000, 15000])
sizes = st.lists(st.tuples(body_sizes, st.integers(0, 5)), min_size=1, max_size=8)


class LogVersusModel(RuleBasedStateMachine):
    """Every step: the store serves exactly what the model says is visible."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="hw-model-"))
        self.clock = FakeClock()
        self.counter = 0
        self.queues: dict[str, _QueueModel] = {}
        self.store = self._open("tail")

    def _open(self, verify: str) -> LogStore:
        # retention runs only when a rule says so (its thread would race the model)
        cfg = StoreConfig(segment_bytes_max=SEGMENT_BYTES, verify=verify, retention_interval_ms=3_600_000)
        store = LogStore(self.dir / "data", cfg, clock=self.clock)
        self.client = Client(Broker(store))
        return store

    def teardown(self) -> None:
        self.client.close()  # the broker's delay dispatcher, then the store
        shutil.rmtree(self.dir, ignore_errors=True)

    @initialize()
    def create_queues(self) -> None:
        for name, ttl, n in [("a", None, 2), ("t", TTL_S, 1)]:
            self.store.create_queue(name, QueueConfig(partitions=n, ttl_s=ttl))
            self.queues[name] = _QueueModel(ttl, n)

    @rule(queue=st.sampled_from(["a", "t"]), pick=st.integers(0, 99), shape=sizes, compression=compressions)
    def append(self, queue, pick, shape, compression):
        self._append(queue, pick, shape, compression)

    @rule(
        queue=st.sampled_from(["a", "t"]),
        picks=st.lists(st.integers(0, 99), min_size=2, max_size=8),
        size=st.sampled_from([3000, 9000, 20000]),
    )
    def append_many(self, queue, picks, size):
        for pick in picks:
            self._append(queue, pick, [(size, pick % 6)] * 3, None)

    def _append(self, queue, pick, shape, compression):
        qm = self.queues[queue]
        p = pick % len(qm.next)
        msgs = []
        for size, extra in shape:
            self.counter += 1
            body = (hashlib.blake2b(b"%d" % self.counter).digest() * (size // 64 + 1))[:size]
            key = b"k%d" % (self.counter % 3) if extra in (1, 3) else None
            tag = f"t{self.counter % 2}" if extra in (2, 3) else None
            props = {"n": str(self.counter)} if extra == 4 else None
            msgs.append(
                body
                if key is None and tag is None and props is None
                else Message(body, key=key, tag=tag, properties=props)
            )
        res = self.store.append(queue, p, encode_batch(msgs, compression=compression))
        ts = int(self.clock.now * 1000)
        assert (res.base_offset, res.count, res.timestamp_ms) == (qm.next[p], len(msgs), ts)
        for i, m in enumerate(msgs):
            qm.msgs[p].append((qm.next[p] + i, ts, *_expect(m)))
        qm.next[p] += len(msgs)

    @rule(verify=st.sampled_from(["tail", "all"]))
    def reopen(self, verify):
        self.client.close()  # not only the store: each Broker runs a thread of its own
        self.store = self._open(verify)

    @rule(queue=st.sampled_from(["a", "t"]))
    def truncate(self, queue):
        self.store.truncate_queue(queue)
        qm = self.queues[queue]
        qm.start = list(qm.next)

    @precondition(lambda self: any(len(q.next) < PARTITIONS_CAP for q in self.queues.values()))
    @rule(queue=st.sampled_from(["a", "t"]), more=st.integers(1, 3))
    def add_partitions(self, queue, more):
        qm = self.queues[queue]
        total = min(len(qm.next) + more, PARTITIONS_CAP)
        assume(total > len(qm.next))
        self.store.add_partitions(queue, total)
        for _ in range(total - len(qm.next)):
            qm.start.append(0)
            qm.next.append(0)
            qm.msgs.append([])

    @rule(queue=st.sampled_from(["a", "t"]))
    def delete_and_recreate(self, queue):
        qm = self.queues[queue]
        self.store.delete_queue(queue)
        self.store.create_queue(queue, QueueConfig(partitions=1, ttl_s=qm.ttl_s))
        self.queues[queue] = _QueueModel(qm.ttl_s, 1)

    @rule(seconds=st.integers(1, 45))
    def advance_clock(self, seconds):
        self.clock.advance(seconds)

    @rule()
    def enforce_retention(self):
        self.store.enforce_retention()

    @invariant()
    def serves_exactly_the_model(self):
        if not self.queues:
            return
        now_ms = int(self.clock.now * 1000)
        for name, qm in self.queues.items():
            info = self.store.describe_queue(name)
            assert len(info.partitions) == len(qm.next)
            for p, pi in enumerate(info.partitions):
                cutoff = None if qm.ttl_s is None else now_ms - qm.ttl_s * 1000
                visible = [m for m in qm.msgs[p] if m[0] >= qm.start[p] and (cutoff is None or m[1] >= cutoff)]
                start = visible[0][0] if visible else qm.next[p]
                assert (pi.start_offset, pi.end_offset) == (start, qm.next[p]), (name, p)
                got = [
                    (r.offset, r.timestamp_ms, r.body, r.key, r.tag, r.properties)
                    for r in self.client.scanner(name, partitions=p)
                ]
                assert got == visible, (name, p)


LogVersusModel.TestCase.settings = settings(
    max_examples=25,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
test_log_matches_model = LogVersusModel.TestCase


class MemoryVersusModel(LogVersusModel):
    """The same rules and invariant against a :class:`MemoryStore` (the store of
    ``headwater.testing``), except reopening: nothing survives closing it."""

    def _open(self, verify: str) -> MemoryStore:
        store = MemoryStore(StoreConfig(retention_interval_ms=3_600_000), clock=self.clock)
        self.client = Client(Broker(store))
        return store

    def reopen(self, verify):  # not a rule here (no @rule): a store in memory is never reopened
        raise AssertionError("a store in memory is never reopened")


MemoryVersusModel.TestCase.settings = LogVersusModel.TestCase.settings
test_memory_store_matches_model = MemoryVersusModel.TestCase


@pytest.mark.slow
def test_log_matches_model_soak():
    from hypothesis.stateful import run_state_machine_as_test

    run_state_machine_as_test(
        LogVersusModel,
        settings=settings(
            max_examples=400,
            stateful_step_count=60,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )


def _reflagged(batch: bytes, flags: int) -> bytes:
    """The batch with its flags byte replaced and its producer checksum made right again."""
    from headwater.model.batch import crc32c

    out = bytearray(batch)
    out[45] = flags
    struct.pack_into("<I", out, 40, crc32c(bytes(out[44:])))
    return bytes(out)


@pytest.mark.parametrize(
    "extra, match",
    [
        (0x20, "reserved for transactions"),
        (0x40, "reserved for transactions"),
    ],
)
def test_a_producer_cannot_set_the_transaction_flags(extra, match):
    """Readers skip control batches: a producer setting 0x40 would store messages nobody
    sees. Both bits wait for transactions."""
    batch = encode_batch([b"a"])
    validate_batch(batch)
    with pytest.raises(InvalidBatchError, match=match):
        validate_batch(_reflagged(batch, batch[45] | extra))


@pytest.mark.parametrize(
    "messages, flip, name",
    [
        ([Message(b"a")], 0x04, "keys"),  # flag set, column nil
        ([Message(b"a", key=b"k")], 0x04, "keys"),  # flag clear, column present
        ([Message(b"a")], 0x08, "tags"),
        ([Message(b"a", tag="t")], 0x08, "tags"),
        ([Message(b"a")], 0x10, "properties"),
        ([Message(b"a", properties={"p": "1"})], 0x10, "properties"),
    ],
)
def test_the_column_flags_must_agree_with_the_columns(messages, flip, name):
    batch = encode_batch(messages)
    validate_batch(batch)
    with pytest.raises(InvalidBatchError, match=f"\\({name}\\) is .* the {name} column is"):
        validate_batch(_reflagged(batch, batch[45] ^ flip))
