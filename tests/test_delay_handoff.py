"""The hand-off pieces of delayed messages that need no cluster (headwater/broker/delay/
handoff.py): two embedded brokers play a move's source and target, a gate stands for the
cluster. Holding what a broker does not lead, handing off, adopting (durably, idempotently,
gated by a leader epoch), ids kept across the move, forgetting. The cluster itself:
tests/test_cluster_delay.py."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

import headwater
from headwater.errors import MessageNotFoundError, NotLeaderError
from headwater.model.batch import encode_batch
from headwater.model.delay import split_delay_offset
from tests.support.schedule_reads import ScheduleReads
from tests.support.waiting import wait_for


class Gate:
    """A cluster's answer, set by the test: this broker leads at ``epoch`` (None: it does not)."""

    def __init__(self, epoch: int | None) -> None:
        self.epoch = epoch

    def leader_epoch(self, queue_id: int, partition: int) -> int | None:
        return self.epoch

    @contextmanager
    def delivering(self, queue_id: int, partition: int) -> Iterator[None]:
        if self.epoch is None:
            raise NotLeaderError("not the leader (test gate)")
        yield


def now_ms(clock) -> int:
    return int(clock() * 1000)


def bodies(hw, queue: str) -> list[bytes]:
    return [r.body for r in hw.scanner(queue)]


def opened(path, clock, epoch: int | None):
    hw = headwater.open(path, clock=clock, flush="sync")
    hw.service.delay.gate = Gate(epoch)
    return hw


def qid(hw, name: str) -> int:
    return hw.service.describe_queue(name).queue_id


def hand_over(src, dst, queue_id: int, gate: int, *, page_bytes: int = 1 << 20) -> int:
    """What a move's target does: forget, then adopt every page; the batches taken."""
    dst.service.delay.forget(queue_id, 0)
    after, taken = -1, 0
    while True:
        page = src.service.delay.hand_off(queue_id, 0, after, page_bytes)
        dst.service.delay.adopt(queue_id, 0, page.batches, gate)
        taken += len(page.batches)
        if not page.more:
            return taken
        after = page.batches[-1].accept_seq


@pytest.fixture
def pair(tmp_path, clock):
    a = opened(tmp_path / "a", clock, 3)
    b = opened(tmp_path / "b", clock, None)
    for hw in (a, b):
        hw.admin.create_queue("q", ttl_s=None)
    assert qid(a, "q") == qid(b, "q")  # as the cluster makes them
    brokers = [a, b]  # a test that reopens one puts it back here
    yield brokers
    for hw in brokers:
        hw.close()


def test_a_broker_holds_what_it_does_not_lead_and_delivers_once_it_does(pair, clock):
    a, _ = pair
    a.service.delay.gate.epoch = None
    a.send("q", b"x", deliver_at=now_ms(clock) + 1_000)
    clock.advance(2)
    time.sleep(0.5)
    assert bodies(a, "q") == [] and a.delay_stats().pending_messages == 1  # held, not dropped
    a.service.delay.gate.epoch = 3
    clock.advance(1)  # a held batch is looked at again hold_ms later, by the broker's clock
    wait_for(lambda: bodies(a, "q") == [b"x"], what="delivery once it leads")


def test_adopted_batches_wait_for_the_switch_epoch_keep_their_ids_and_arrive_once(pair, clock, tmp_path):
    a, b = pair
    t0 = now_ms(clock)
    ids = [a.send("q", f"m{i}".encode(), deliver_at=t0 + 5_000 + i) for i in range(5)]
    a.cancel(ids[1])
    a.service.delay.gate.epoch = None  # fenced
    assert hand_over(a, b, qid(a, "q"), gate=4, page_bytes=1) == 5  # one batch a page
    assert b.delay_stats().pending_messages == 4
    assert b.get(ids[2]).body == b"m2"  # the id its producer got, on the new leader
    with pytest.raises(MessageNotFoundError, match="cancelled"):
        b.get(ids[1])
    b.cancel(ids[3])  # by its original id, after the move
    # a retry, or a new send, to the target gets no id that names an adopted message
    new = b.service.produce("q", 0, encode_batch([b"new"], deliver_at_ms=t0 + 5_000))
    assert new.base_offset not in {m.offset for m in ids}
    b.service.delay.gate.epoch = 3  # it leads at an epoch before the switch: adopted ones wait
    clock.advance(6)
    wait_for(lambda: bodies(b, "q") == [b"new"], what="the target's own message")
    time.sleep(0.5)
    assert bodies(b, "q") == [b"new"]
    b.service.delay.gate.epoch = 4  # the switch
    clock.advance(1)
    wait_for(lambda: len(bodies(b, "q")) == 4, what="delivery on the target")
    time.sleep(0.3)
    assert sorted(bodies(b, "q")) == [b"m0", b"m2", b"m4", b"new"] and bodies(a, "q") == []
    assert not b.get(ids[4]).message_id.is_delayed  # delivered: its id in the log
    with pytest.raises(MessageNotFoundError, match="too late|already delivered|cancelled"):
        b.cancel(ids[4])


def test_a_repeated_hand_off_replaces_the_last_one_and_survives_a_restart(pair, clock, tmp_path):
    a, b = pair
    t0 = now_ms(clock)
    ids = [a.send("q", f"m{i}".encode(), deliver_at=t0 + 5_000) for i in range(3)]
    a.service.delay.gate.epoch = None
    queue_id = qid(a, "q")
    hand_over(a, b, queue_id, gate=4)
    hand_over(a, b, queue_id, gate=4)  # the target restarted mid-hand-off and asked again
    assert b.delay_stats().pending_messages == 3
    b.close()
    b = opened(tmp_path / "b", clock, 3)  # before the switch: the gate holds them
    pair[1] = b
    assert b.delay_stats().pending_messages == 3 and b.get(ids[0]).body == b"m0"
    hand_over(a, b, queue_id, gate=4)  # and once more after the restart
    assert b.delay_stats().pending_messages == 3
    clock.advance(6)
    time.sleep(0.5)
    assert bodies(b, "q") == []  # epoch 3 < 4
    b.service.delay.gate.epoch = 4
    clock.advance(1)
    wait_for(lambda: len(bodies(b, "q")) == 3, what="delivery after the switch")
    time.sleep(0.3)
    assert sorted(bodies(b, "q")) == [b"m0", b"m1", b"m2"]


def test_the_source_forgets_what_it_handed_off_even_across_a_restart(pair, clock, tmp_path):
    a, b = pair
    t0 = now_ms(clock)
    mid = a.send("q", b"x", deliver_at=t0 + 5_000)
    a.service.delay.gate.epoch = None
    hand_over(a, b, qid(a, "q"), gate=4)
    assert a.service.delay.forget(qid(a, "q"), 0) == 0
    assert a.delay_stats().pending_messages == 0
    assert qid(a, "q") not in {q for q, _ in a.service.delay.partitions_with_batches()}
    with pytest.raises(MessageNotFoundError, match="moved to another broker"):
        a.get(mid)
    a.close()
    a = opened(tmp_path / "a", clock, 3)  # it leads again (say): nothing comes back
    pair[0] = a
    clock.advance(6)
    time.sleep(0.5)
    assert bodies(a, "q") == [] and a.delay_stats().pending_messages == 0


def test_a_partly_delivered_batch_hands_off_only_its_open_runs(pair, clock):
    a, b = pair
    t0 = now_ms(clock)
    batch = encode_batch([b"early", b"late"], deliver_times=[t0 + 1_000, t0 + 5_000])
    res = a.service.produce("q", 0, batch)
    clock.advance(2)
    wait_for(lambda: bodies(a, "q") == [b"early"], what="the first run")
    a.service.delay.gate.epoch = None
    page = a.service.delay.hand_off(qid(a, "q"), 0, -1, 1 << 20)
    assert [(x.origin, x.delivered) for x in page.batches] == [(res.base_offset, [(0, 0)])]
    hand_over(a, b, qid(a, "q"), gate=4)
    assert b.delay_stats().pending_messages == 1
    b.service.delay.gate.epoch = 4
    clock.advance(4)
    wait_for(lambda: bodies(b, "q") == [b"late"], what="the second run on the target")
    time.sleep(0.3)
    assert bodies(b, "q") == [b"late"]


def test_an_adopted_batch_is_filed_in_its_origins_bucket_past_its_number(pair, clock):
    a, b = pair
    t0 = now_ms(clock)
    local = b.send("q", b"b-own", deliver_at=t0 + 5_000)  # the target numbers this bucket too
    b.service.delay.forget(qid(b, "q"), 0)  # (it hands it off first: only the id matters)
    theirs = [a.send("q", f"a{i}".encode(), deliver_at=t0 + 5_000) for i in range(3)]
    a.service.delay.gate.epoch = None
    hand_over(a, b, qid(a, "q"), gate=4)
    later = b.send("q", b"b-later", deliver_at=t0 + 5_000)
    start, number = split_delay_offset(later.offset)
    assert start == split_delay_offset(theirs[0].offset)[0] and number > max(
        split_delay_offset(m.offset)[1] for m in [*theirs, local]
    )
    assert [b.get(m).body for m in theirs] == [b"a0", b"a1", b"a2"] and b.get(later).body == b"b-later"


def test_an_idempotent_producers_sequences_move_in_order_and_its_retries_keep_their_ids(pair, clock, tmp_path):
    a, b = pair
    t0 = now_ms(clock)

    def batch(body: bytes, seq: int, due_ms: int) -> bytes:
        return bytes(encode_batch([body], deliver_at_ms=due_ms, producer_id=9, base_sequence=seq, producer_epoch=0))

    # accepted as 0, 1; their origins the other way round (the later bucket first)
    late = a.service.produce("q", 0, batch(b"late", 0, t0 + 3 * 3_600_000))
    soon = a.service.produce("q", 0, batch(b"soon", 1, t0 + 5_000))
    assert late.base_offset > soon.base_offset
    a.service.delay.gate.epoch = None
    hand_over(a, b, qid(a, "q"), gate=4)
    for _ in range(2):  # the table as adopted, then as rebuilt on open
        assert b.service.produce("q", 0, batch(b"soon", 1, t0 + 5_000)) == soon  # a retry after the move
        assert b.service.produce("q", 0, batch(b"late", 0, t0 + 3 * 3_600_000)) == late
        b.close()
        b = pair[1] = opened(tmp_path / "b", clock, 4)
    nxt = b.service.produce("q", 0, batch(b"next", 2, t0 + 5_000))  # in order: no new epoch needed
    assert nxt.base_offset not in (late.base_offset, soon.base_offset)
    clock.advance(6)
    wait_for(lambda: sorted(bodies(b, "q")) == [b"next", b"soon"], what="delivery on the target")


def test_a_hand_off_of_batches_due_hours_ahead_reads_each_page_s_own_batches(pair, clock, monkeypatch):
    """Their buckets are not loaded (due beyond the lookahead): each bucket file is indexed
    once (here by the cancels), and every page reads only the records of its own batches,
    not the whole files again (a large backlog made every page of a move a replay of the
    whole schedule, under the service's lock). What moves is the same: every batch once, in
    accept order, with its cancels."""
    a, b = pair
    far = now_ms(clock) + 5 * 3_600_000
    ids = [a.send("q", f"m{i}".encode(), deliver_at=far + i * 60_000) for i in range(120)]  # a batch each
    for i in (7, 70):
        a.cancel(ids[i])
    reads = ScheduleReads(monkeypatch)
    a.service.delay.gate.epoch = None  # fenced
    queue_id, delay = qid(a, "q"), a.service.delay
    pages: list = []
    counts: list[int] = []
    while not pages or pages[-1].more:
        reads.count = 0
        pages.append(delay.hand_off(queue_id, 0, pages[-1].batches[-1].accept_seq if pages else -1, 1))
        counts.append(reads.count)
    # a page's batch and the next (is there more?), a CANCELLED record, and at first the
    # records the index catches up with; the old code read all 122 for every page
    assert counts[0] <= 4 and max(counts[1:]) <= 3, counts
    moved = [hb for p in pages for hb in p.batches]
    assert [hb.origin for hb in moved] == [m.offset for m in ids]
    assert [hb.accept_seq for hb in moved] == sorted(hb.accept_seq for hb in moved)
    assert [i for i, hb in enumerate(moved) if hb.cancelled] == [7, 70]
    b.service.delay.forget(queue_id, 0)
    for p in pages:
        b.service.delay.adopt(queue_id, 0, p.batches, 4)
    assert b.delay_stats().pending_messages == 118
    assert b.get(ids[119]).body == b"m119"
