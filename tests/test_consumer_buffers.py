"""How a consumer hands out what it buffered (``polling.drain_buffers``), against a model:
partition after partition in the order their buffers filled, at most ``limit`` records, and
each partition's consumed position where a commit must store it; and a poll walks only the
partitions holding records, however many are assigned."""

from __future__ import annotations

from collections import deque

from hypothesis import given
from hypothesis import strategies as st

from headwater.client.transport.polling import RecordBuffers, drain_buffers, take_batches
from headwater.model.batch import encode_batch, patch_batch
from headwater.model.message import Message, Record

partitions = st.lists(
    st.tuples(st.integers(0, 5), st.integers(0, 3)),  # (records buffered, records skipped past them)
    min_size=1,
    max_size=4,
)


def _fill(buffers: RecordBuffers, tp: tuple[str, int], offsets: range) -> None:
    buffers.setdefault(tp, deque()).extend(Record(tp[0], tp[1], o, 0, b"%d" % o) for o in offsets)
    buffers.filled_up(tp)


@given(partitions, st.permutations(range(4)), st.integers(1, 12))
def test_drain_hands_out_in_fill_order_and_moves_consumed(parts, order, limit):
    buffers: RecordBuffers = RecordBuffers()
    fetch_pos, consumed = {}, {}
    for p, (n, skipped) in enumerate(parts):
        base = 100 * p
        buffers[("q", p)] = deque()
        fetch_pos[("q", p)] = base + n + skipped  # filtered-out or expired records lie past the last
        # a partition with nothing buffered is consumed up to where reading goes on (take_batches)
        consumed[("q", p)] = base if n else base + skipped
    filled = [p for p in order if p < len(parts)]
    for p in filled:
        _fill(buffers, ("q", p), range(100 * p, 100 * p + parts[p][0]))
    model = [(("q", p), list(buffers[("q", p)])) for p in filled if parts[p][0]]
    before = dict(consumed)

    out = drain_buffers(buffers, fetch_pos, consumed, limit)

    expect, want_consumed = [], {}
    for tp, recs in model:
        if len(expect) >= limit:
            break
        room = limit - len(expect)
        expect += recs[:room]
        want_consumed[tp] = fetch_pos[tp] if len(recs) <= room else recs[room - 1].offset + 1
    assert out == expect
    for tp, recs in model:
        left = recs[len([r for r in out if (r.queue, r.partition) == tp]) :]
        assert list(buffers[tp]) == left
        assert consumed[tp] == want_consumed.get(tp, before[tp])
        assert (tp in buffers.filled) == bool(left)


class _Watched(dict):
    """A ``consumed`` map that records which partitions a drain wrote."""

    def __init__(self, *a):
        super().__init__(*a)
        self.written: set = set()

    def __setitem__(self, k, v):
        self.written.add(k)
        super().__setitem__(k, v)


def test_a_poll_walks_only_the_partitions_holding_records():
    buffers: RecordBuffers = RecordBuffers()
    tps = [("q", p) for p in range(10_000)]
    for tp in tps:
        buffers[tp] = deque()
    fetch_pos = dict.fromkeys(tps, 0)
    consumed = _Watched(fetch_pos)
    _fill(buffers, ("q", 7_000), range(0, 3))
    fetch_pos[("q", 7_000)] = 3

    assert [r.offset for r in drain_buffers(buffers, fetch_pos, consumed, 500)] == [0, 1, 2]
    # the code before walked all 10,000 buffers each poll, writing consumed for every empty one
    assert consumed.written == {("q", 7_000)}
    assert not buffers.filled
    consumed.written.clear()
    assert drain_buffers(buffers, fetch_pos, consumed, 500) == []
    assert not consumed.written


def test_a_partition_partly_handed_out_keeps_its_turn_and_a_refilled_one_goes_last():
    buffers: RecordBuffers = RecordBuffers()
    fetch_pos = {("q", 0): 5, ("q", 1): 3}
    consumed = {("q", 0): 0, ("q", 1): 0}
    _fill(buffers, ("q", 0), range(0, 5))
    _fill(buffers, ("q", 1), range(0, 3))

    assert [(r.partition, r.offset) for r in drain_buffers(buffers, fetch_pos, consumed, 2)] == [(0, 0), (0, 1)]
    assert consumed[("q", 0)] == 2
    assert [(r.partition, r.offset) for r in drain_buffers(buffers, fetch_pos, consumed, 4)] == [
        (0, 2), (0, 3), (0, 4), (1, 0)
    ]  # fmt: skip
    _fill(buffers, ("q", 0), range(5, 7))
    fetch_pos[("q", 0)] = 7
    assert [(r.partition, r.offset) for r in drain_buffers(buffers, fetch_pos, consumed, 10)] == [
        (1, 1), (1, 2), (0, 5), (0, 6)
    ]  # fmt: skip
    assert consumed == {("q", 0): 7, ("q", 1): 3}


def test_a_buffer_replaced_by_a_seek_or_forgotten_hands_nothing_out():
    buffers: RecordBuffers = RecordBuffers()
    fetch_pos = {("q", 0): 3, ("q", 1): 3}
    consumed = {("q", 0): 0, ("q", 1): 0}
    _fill(buffers, ("q", 0), range(0, 3))
    _fill(buffers, ("q", 1), range(0, 3))
    buffers[("q", 0)] = deque()  # seek: the position moved, the buffer went with it
    fetch_pos[("q", 0)] = consumed[("q", 0)] = 50
    del buffers[("q", 1)], fetch_pos[("q", 1)], consumed[("q", 1)]  # unassigned

    assert drain_buffers(buffers, fetch_pos, consumed, 10) == []
    assert not buffers.filled
    assert consumed == {("q", 0): 50}


def test_take_batches_marks_the_partition_filled_only_when_it_took_records():
    buffers: RecordBuffers = RecordBuffers()
    tp = ("q", 0)
    buffers[tp] = deque()
    fetch_pos, consumed = {tp: 0}, {tp: 0}
    batch = patch_batch(encode_batch([Message(b"a"), Message(b"b", tag="x")]), 1, 0, 0, 0)

    assert take_batches(tp, [batch], 0, 2, fetch_pos, consumed, buffers, frozenset({"nope"})) == 0
    assert not buffers.filled and consumed[tp] == 2  # nothing to hand out: consumed up to the fetch position
    assert take_batches(tp, [batch], 0, 2, fetch_pos, consumed, buffers, None) == 2
    assert list(buffers.filled) == [tp]
