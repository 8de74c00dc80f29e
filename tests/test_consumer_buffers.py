"""How a consumer hands out what it buffered (``polling.drain_buffers``), against a model:
partition after partition, in order, at most ``limit`` records, and each partition's consumed
position where a commit must store it."""

from __future__ import annotations

from collections import deque

from hypothesis import given
from hypothesis import strategies as st

from headwater.client.transport.polling import drain_buffers
from headwater.model.message import Record

partitions = st.lists(
    st.tuples(st.integers(0, 5), st.integers(0, 3)),  # (records buffered, records skipped past them)
    min_size=1,
    max_size=4,
)


@given(partitions, st.integers(1, 12))
def test_drain_hands_out_in_order_and_moves_consumed(parts, limit):
    buffers, fetch_pos, consumed = {}, {}, {}
    for p, (n, skipped) in enumerate(parts):
        base = 100 * p
        buffers[("q", p)] = deque(Record("q", p, base + i, 0, b"%d" % i) for i in range(n))
        fetch_pos[("q", p)] = base + n + skipped  # filtered-out or expired records lie past the last
        consumed[("q", p)] = base
    model = [(tp, list(buf)) for tp, buf in buffers.items()]

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
        assert consumed[tp] == want_consumed.get(tp, 100 * tp[1])
