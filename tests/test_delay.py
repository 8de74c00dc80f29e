"""Delayed messages: arrive once, at their time, in their partition; survive restarts and
SIGKILL; cancel; bad input; clock jumps; memory bounded however many are pending.

Tests with the ``hw`` fixture run embedded, against the in-memory fake and over TCP, with
the injected clock of tests/conftest.py. Times are given as ``deliver_at`` from that clock
(over TCP the producer only has the real clock, so ``delay=`` would mean another time).
"""

from __future__ import annotations

import random
import struct
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

import headwater
from headwater.errors import InvalidArgumentError, MessageNotFoundError, MessageTooLargeError
from headwater.model.delay import split_delay_offset
from headwater.model.message import Message, MessageId
from tests.support.broker_process import BrokerProcess
from tests.support.schedule_reads import ScheduleReads
from tests.support.waiting import wait_for


def now_ms(clock) -> int:
    return int(clock() * 1000)


def scan_all(hw, queue: str) -> list:
    return list(hw.scanner(queue))


def count_is(hw, queue: str, n: int):
    recs = scan_all(hw, queue)
    return recs if len(recs) >= n else None


# -- arriving once, at the right time, in the right partition ---------------------------


@pytest.mark.alone(
    "deliver times hours ahead, made due by moving the broker's clock (test_cluster_delay.py: on a cluster)"
)
def test_delays_from_zero_to_hours_arrive_once_in_due_order_in_their_partition(hw, clock):
    hw.admin.create_queue("jobs", partitions=4, ttl_s=None)
    t0 = now_ms(clock)
    rng = random.Random(6)
    delays_ms = [
        0,
        0,
        1,
        500,
        1_000,
        30_000,
        59_999,
        60_000,
        5 * 60_000,
        3_600_000 - 1,
        3_600_000,
        3_600_000 + 1,
        2 * 3_600_000 + 17,
        5 * 3_600_000,
        11 * 3_600_000 + 123,
    ]
    delays_ms += [rng.randrange(0, 12 * 3_600_000) for _ in range(45)]
    rng.shuffle(delays_ms)
    producer = hw.producer(partitioner="key", linger_ms=2)
    futs = []
    expect = {}
    for i, d in enumerate(delays_ms):
        key = f"user-{i % 7}".encode()
        body = f"m{i}".encode()
        expect[body] = (t0 + d, key)
        futs.append(producer.send("jobs", body, key=key, tag="t", properties={"i": str(i)}, deliver_at=t0 + d))
    producer.flush()
    ids = [f.result() for f in futs]
    assert all(m.is_delayed for m, d in zip(ids, delays_ms) if d > 0)
    if getattr(hw.service, "clock", None) is clock:  # the producer shares the broker's clock
        assert not any(m.is_delayed for m, d in zip(ids, delays_ms) if d == 0)  # due now: sent at once
    # walk the clock through the next 12 hours in steps; each step delivers what came due
    delivered: dict[bytes, object] = {}
    step_ms = 7 * 60_000
    for k in range(0, 12 * 60 // 7 + 3):  # step 0: what is due already, before the clock moves
        clock.now = (t0 + k * step_ms) / 1000
        due_now = {b for b, (at, _) in expect.items() if at <= t0 + k * step_ms}

        def all_due(due_now=due_now):
            records = scan_all(hw, "jobs")
            return records if {x.body for x in records} >= due_now else None

        recs = wait_for(all_due, what=f"step {k}")
        for r in recs:
            if r.body not in delivered:
                delivered[r.body] = r
                # delivered at the first step at or after its time, not before
                assert r.timestamp_ms == max(expect[r.body][0], t0) or (
                    r.timestamp_ms >= expect[r.body][0] and r.timestamp_ms - expect[r.body][0] < step_ms
                ), (r.body, r.timestamp_ms - expect[r.body][0])
        assert set(delivered) <= set(expect)
    recs = scan_all(hw, "jobs")
    assert Counter(r.body for r in recs) == Counter(expect.keys()), "each message exactly once"
    n = len(hw.admin.describe_queue("jobs").partitions)
    from headwater.client.core.partitioner import key_partition

    for r in recs:
        at, key = expect[r.body]
        assert r.key == key and r.tag == "t" and r.properties == {"i": r.body.decode()[1:]}
        assert r.partition == key_partition(key, n)
        assert r.scheduled_ms == (at if at > t0 else r.scheduled_ms)
    for p in range(n):
        in_p = [r for r in recs if r.partition == p]
        assert [r.offset for r in in_p] == sorted(r.offset for r in in_p)
        dues = [expect[r.body][0] for r in sorted(in_p, key=lambda r: r.offset)]
        assert dues == sorted(dues), "in due-time order within the partition"
    # a delivery is readable once appended; the stats count it once its fsync is done and the
    # DELIVERED record written (a moment later), so wait for them rather than race them
    wait_for(lambda: hw.delay_stats().pending_messages == 0, what="the last deliveries to be recorded")


@pytest.mark.alone(
    "it checks timestamps against a broker clock that stands still (test_cluster_delay.py: on a cluster)"
)
def test_send_forms_take_deliver_at_and_delay(hw, clock):
    hw.admin.create_queue("forms", partitions=2, ttl_s=None)
    t0 = now_ms(clock)
    at = datetime.fromtimestamp(t0 / 1000 + 60, tz=UTC)
    a = hw.send("forms", b"dt", deliver_at=at)
    b = hw.send("forms", Message(b"ms", key=b"k"), deliver_at=t0 + 60_000)
    c = hw.send_batch("forms", [b"b1", b"b2", b"b3"], deliver_at=t0 + 60_000, partition=1)
    with hw.producer() as p:
        d = p.send("forms", b"cb", deliver_at=t0 + 60_000, callback=lambda m, e: None).result()
        e = p.send_and_wait("forms", b"sw", deliver_at=t0 + 60_000)
    ids = [a, b, *c, d, e]
    assert all(m.is_delayed for m in ids) and len(set(ids)) == len(ids)
    assert [m.target_partition for m in c] == [1, 1, 1]
    assert [m.offset for m in c] == [c[0].offset, c[0].offset + 1, c[0].offset + 2]
    pending = hw.get(c[1])
    assert pending.body == b"b2" and pending.message_id == c[1] and pending.scheduled_ms == t0 + 60_000
    assert pending.timestamp_ms == t0  # accepted at
    assert hw.delay_stats().pending_messages == 7
    assert scan_all(hw, "forms") == []
    clock.advance(61)
    recs = wait_for(lambda: count_is(hw, "forms", 7), what="delivery")
    assert sorted(r.body for r in recs) == [b"b1", b"b2", b"b3", b"cb", b"dt", b"ms", b"sw"]
    # delivered: appended, then recorded once the round's fsync is done; until then the
    # delayed id still finds the pending copy
    wait_for(lambda: hw.delay_stats().delivered_total == 7, what="the deliveries to be recorded")
    got = hw.get(c[1])  # once delivered, the delayed id finds the message as stored
    assert not got.message_id.is_delayed and got.body == b"b2" and got.partition == 1
    assert got.timestamp_ms >= got.scheduled_ms == t0 + 60_000


def test_relative_delay_uses_the_producers_clock(tmp_path, clock):
    # embedded: the producer turns delay= into a time with the broker's (injected) clock
    with headwater.open(tmp_path / "data", clock=clock) as hw:
        hw.admin.create_queue("rel")
        mid = hw.send("rel", b"x", delay=timedelta(minutes=15))
        assert hw.get(mid).scheduled_ms == now_ms(clock) + 15 * 60_000
        mid = hw.send("rel", b"y", delay=90)
        assert hw.get(mid).scheduled_ms == now_ms(clock) + 90_000
        assert not hw.send("rel", b"z", delay=0).is_delayed


@pytest.mark.alone("it sets the broker's clock (test_cluster_delay.py: on a cluster)")
def test_one_batch_of_several_deliver_times_delivers_each_run_at_its_time(hw, clock):
    hw.admin.create_queue("runs", ttl_s=None)
    t0 = (now_ms(clock) // 60_000 + 1) * 60_000  # a bucket's start: all seven fall in it
    p = hw.producer(linger_ms=50, delay_bucket_ms=60_000)
    times = [t0 + 1_000, t0 + 1_000, t0 + 2_000, t0 + 3_000, t0 + 3_000, t0 + 3_000, t0 + 1_500]
    futs = [p.send("runs", f"r{i}".encode(), deliver_at=at) for i, at in enumerate(times)]
    p.flush()
    ids = [f.result() for f in futs]
    # one batch, its messages put in due order (r6 goes back in time: third), each id its place
    assert [m.offset - ids[0].offset for m in ids] == [0, 1, 3, 4, 5, 6, 2]
    assert [hw.get(m).scheduled_ms for m in ids] == times
    hw.cancel(ids[4])
    clock.now = (t0 + 1_000) / 1000
    assert sorted(r.body for r in wait_for(lambda: count_is(hw, "runs", 2), what="the first run")) == [b"r0", b"r1"]
    clock.now = (t0 + 1_600) / 1000
    wait_for(lambda: count_is(hw, "runs", 3), what="r6")
    time.sleep(0.3)
    assert len(scan_all(hw, "runs")) == 3  # r2 is due at 2 s: not yet
    clock.now = (t0 + 3_500) / 1000
    recs = wait_for(lambda: count_is(hw, "runs", 6), what="the rest")
    time.sleep(0.3)
    recs = scan_all(hw, "runs")
    assert [r.body for r in recs] == [b"r0", b"r1", b"r6", b"r2", b"r3", b"r5"]
    assert [r.scheduled_ms for r in recs] == [times[0], times[1], times[6], times[2], times[3], times[5]]
    assert hw.get(ids[5]).body == b"r5" and not hw.get(ids[5]).message_id.is_delayed
    with pytest.raises(MessageNotFoundError, match="cancelled"):
        hw.get(ids[4])


def test_runs_of_a_batch_survive_a_restart_between_them(tmp_path, clock):
    data = tmp_path / "d"
    t0 = now_ms(clock)
    with headwater.open(data, clock=clock) as hw:
        hw.admin.create_queue("q", ttl_s=None)
        with hw.producer(linger_ms=50) as p:
            for i in range(10):
                p.send("q", f"m{i}".encode(), deliver_at=t0 + 1_000 + 100 * (i // 2))
        clock.now = (t0 + 1_250) / 1000
        wait_for(lambda: count_is(hw, "q", 6), what="three runs")
    with headwater.open(data, clock=clock) as hw:
        assert hw.delay_stats().pending_messages == 4
        clock.now = (t0 + 2_000) / 1000
        wait_for(lambda: count_is(hw, "q", 10), what="the rest")
        time.sleep(0.3)
        assert [r.body for r in scan_all(hw, "q")] == [f"m{i}".encode() for i in range(10)]


@pytest.mark.alone("it counts a fresh broker's whole schedule (delay_stats) (test_cluster_delay.py: on a cluster)")
def test_batches_with_bad_deliver_times_are_refused(hw, clock):
    from headwater.errors import InvalidBatchError
    from headwater.model.batch import encode_batch

    hw.admin.create_queue("badb")
    t0 = now_ms(clock) + 10_000
    with pytest.raises(InvalidBatchError, match="never decrease"):
        hw.service.produce("badb", 0, encode_batch([b"a", b"b"], deliver_times=[t0 + 5, t0]))
    with pytest.raises(InvalidBatchError, match="within 60000 ms"):
        hw.service.produce("badb", 0, encode_batch([b"a", b"b"], deliver_times=[t0, t0 + 60_001]))
    assert hw.delay_stats().pending_messages == 0


# -- cancel ----------------------------------------------------------------------------


@pytest.mark.alone("it counts a fresh broker's whole schedule (delay_stats) (test_cluster_delay.py: on a cluster)")
def test_a_cancelled_message_never_arrives(hw, clock):
    hw.admin.create_queue("c", partitions=2, ttl_s=None)
    t0 = now_ms(clock)
    keep = hw.send("c", b"keep", deliver_at=t0 + 10_000)
    gone = hw.send("c", b"gone", deliver_at=t0 + 10_000)
    batch = hw.send_batch("c", [b"b0", b"b1", b"b2", b"b3"], deliver_at=t0 + 20_000, partition=0)
    whole = hw.send_batch("c", [b"w0", b"w1"], deliver_at=t0 + 30_000, partition=1)
    hw.cancel(gone)
    hw.cancel(str(gone))  # again: fine
    hw.cancel(batch[1])  # one message of a batch: the others still arrive
    hw.cancel(batch[3])
    for m in whole:
        hw.cancel(m)
    with pytest.raises(MessageNotFoundError, match="cancelled"):
        hw.get(gone)
    stats = hw.delay_stats()
    assert stats.pending_messages == 3 and stats.cancelled_total >= 5
    clock.advance(40)
    recs = wait_for(lambda: count_is(hw, "c", 3), what="delivery")
    time.sleep(0.3)  # nothing else comes
    recs = scan_all(hw, "c")
    assert sorted(r.body for r in recs) == [b"b0", b"b2", b"keep"]
    b2 = hw.get(batch[2])  # the delayed id still finds its message, offsets shifted by the cancel
    assert b2.body == b"b2"
    with pytest.raises(MessageNotFoundError, match="already delivered"):
        hw.cancel(keep)
    with pytest.raises(MessageNotFoundError, match="cancelled"):
        hw.get(batch[1])


def test_cancel_refuses_unknown_and_log_ids(hw, clock):
    info = hw.admin.create_queue("u")
    plain = hw.send("u", b"now")
    with pytest.raises(MessageNotFoundError, match="not of a delayed message"):
        hw.cancel(plain)
    bucket = now_ms(clock) // 3_600_000 * 3_600_000 + 3_600_000
    ghost = MessageId(info.queue_id, 0x80000000, (bucket // 60_000) << 35 | 5)
    with pytest.raises(MessageNotFoundError, match="no delayed message"):
        hw.cancel(ghost)
    with pytest.raises(MessageNotFoundError):
        hw.get(ghost)
    real = hw.send("u", b"later", deliver_at=now_ms(clock) + 5_000)
    with pytest.raises(MessageNotFoundError, match="no delayed message"):  # the right id, another queue id
        hw.cancel(MessageId(real.queue_id + 100, real.partition, real.offset))
    with pytest.raises(headwater.InvalidMessageIdError):
        hw.cancel("not-an-id")


@pytest.mark.alone("it counts a fresh broker's whole schedule (delay_stats) (test_cluster_delay.py: on a cluster)")
def test_messages_due_hours_ahead_are_cancelled_and_found_in_a_bucket_not_loaded(hw, clock):
    """Their bucket is not loaded (due beyond the lookahead): cancel and get read the
    batch's own records through the bucket's index, which follows what is appended later."""
    hw.admin.create_queue("later", partitions=2, ttl_s=None)
    far = now_ms(clock) + 5 * 3_600_000
    singles = [hw.send("later", b"s%d" % i, deliver_at=far + i) for i in range(20)]
    batch = hw.send_batch("later", [b"b0", b"b1", b"b2"], deliver_at=far + 100, partition=0)
    assert not any(b.loaded for b in hw.delay_stats().buckets)
    hw.cancel(singles[3])
    hw.cancel(batch[1])
    after = hw.send("later", b"after", deliver_at=far + 200)  # appended once the index was made
    hw.cancel(after)
    hw.cancel(after)  # again: fine
    assert hw.get(batch[2]).body == b"b2" and hw.get(singles[19]).body == b"s19"
    for gone in (singles[3], batch[1], after):
        with pytest.raises(MessageNotFoundError, match="cancelled"):
            hw.get(gone)
    hw.cancel(batch[2])
    stats = hw.delay_stats()
    assert stats.pending_messages == 20 and stats.next_due_ms == far
    hw.cancel(singles[0])  # the first due: the next is the second's time
    hw.cancel(singles[1])
    assert hw.delay_stats().next_due_ms == far + 2
    clock.advance(6 * 3600)
    wait_for(lambda: count_is(hw, "later", 18), what="delivery")
    time.sleep(0.3)  # nothing else comes
    bodies = sorted(r.body for r in scan_all(hw, "later"))
    assert bodies == sorted([b"s%d" % i for i in range(20) if i not in (0, 1, 3)] + [b"b0"])


def test_a_cancel_due_hours_ahead_reads_its_batch_not_the_bucket_file(tmp_path, clock, monkeypatch):
    with headwater.open(tmp_path / "d", clock=clock) as hw:
        hw.admin.create_queue("later", partitions=4, ttl_s=None)
        far = now_ms(clock) + 5 * 3_600_000
        ids = [hw.send("later", b"x", deliver_at=far + i) for i in range(500)]  # a batch each
        reads = ScheduleReads(monkeypatch)
        hw.cancel(ids[10])  # the first makes the index: one read of the whole file
        assert reads.count >= 500
        reads.count = 0
        hw.cancel(ids[300])  # then: the new CANCELLED record, and the batch's own records
        hw.cancel(ids[301])
        assert reads.count <= 6, reads.count
        reads.count = 0
        assert hw.delay_stats().next_due_ms == far and hw.delay_stats().next_due_ms == far
        assert reads.count <= 1  # from the index: only the last cancel's record, caught up
        with pytest.raises(MessageNotFoundError, match="cancelled"):
            hw.get(ids[300])


# -- bad input -------------------------------------------------------------------------


@pytest.mark.alone("it counts a fresh broker's whole schedule (delay_stats) (test_cluster_delay.py: on a cluster)")
def test_bad_deliver_times(hw, clock):
    hw.admin.create_queue("bad")
    t0 = now_ms(clock)
    two_years_ms = 2 * 366 * 86_400_000
    with pytest.raises(InvalidArgumentError, match="delay_max_s"):
        hw.send("bad", b"x", deliver_at=t0 + two_years_ms + 86_400_000)
    hw.send("bad", b"x", deliver_at=t0 + two_years_ms - 86_400_000)  # inside the bound
    with pytest.raises(InvalidArgumentError, match="datetime or epoch milliseconds"):
        hw.send("bad", b"x", deliver_at="tomorrow")
    with pytest.raises(InvalidArgumentError, match="timedelta or a number of seconds"):
        hw.send("bad", b"x", delay="15m")
    with pytest.raises(InvalidArgumentError, match="not both"):
        hw.send("bad", b"x", delay=5, deliver_at=t0 + 5000)
    with pytest.raises(InvalidArgumentError, match="zero or positive"):
        hw.send("bad", b"x", delay=-5)
    with pytest.raises(InvalidArgumentError):
        hw.send("bad", b"x", delay=float("nan"))
    with pytest.raises(InvalidArgumentError):
        hw.send("bad", b"x", deliver_at=True)
    with pytest.raises(InvalidArgumentError, match="delay_max_s"):
        hw.send_batch("bad", [b"a", b"b"], deliver_at=t0 + 10 * two_years_ms)
    assert hw.delay_stats().pending_messages == 1


def test_a_past_deliver_time_delivers_at_once(hw, clock):
    hw.admin.create_queue("past")
    t0 = now_ms(clock)
    same_clock = getattr(hw.service, "clock", None) is clock  # over TCP the producer has the real one
    for at in (t0 - 3_600_000, t0, datetime(2001, 1, 1)):
        mid = hw.send("past", b"x", deliver_at=at)
        if same_clock:
            assert not mid.is_delayed  # the producer sees it is due: an ordinary send
    # a time the producer's clock sees as future but the broker's as past: delivered at once
    # (as a delayed batch due now, so the producer's sequences stay in one space)
    from headwater.model.batch import encode_batch

    r = hw.service.produce("past", 0, encode_batch([b"skewed"], deliver_at_ms=t0 - 5_000))
    assert r.partition & 0x80000000
    recs = wait_for(lambda: count_is(hw, "past", 4), what="immediate delivery")
    [skewed] = [x for x in recs if x.body == b"skewed"]
    assert skewed.scheduled_ms == t0 - 5_000


def test_the_bound_is_a_setting(tmp_path, clock):
    with headwater.open(tmp_path / "d", clock=clock, delay_max_s=60) as hw:
        hw.admin.create_queue("q")
        hw.send("q", b"ok", deliver_at=now_ms(clock) + 59_000)
        with pytest.raises(InvalidArgumentError, match="delay_max_s=60"):
            hw.send("q", b"no", deliver_at=now_ms(clock) + 61_000)
    with pytest.raises(InvalidArgumentError, match="delay_bucket_s"):
        headwater.open(tmp_path / "e", delay_bucket_s=90)


# -- clock jumps -----------------------------------------------------------------------


def test_clock_jumps_deliver_nothing_twice_and_lose_nothing(hw, clock):
    hw.admin.create_queue("j", partitions=3, ttl_s=None)
    t0 = now_ms(clock)
    bodies = {}
    for i in range(30):
        at = t0 + (i + 1) * 60_000  # one a minute for half an hour
        bodies[f"j{i}".encode()] = at
        hw.send("j", f"j{i}".encode(), deliver_at=at, partition=i % 3)
    clock.advance(-600)  # ten minutes back: nothing is due any sooner
    time.sleep(0.4)
    assert scan_all(hw, "j") == []
    clock.now = (t0 + 10.5 * 60_000) / 1000  # forward past ten of them
    wait_for(lambda: count_is(hw, "j", 10), what="the first ten")
    clock.advance(-3600)  # an hour back: what was delivered stays delivered, once
    time.sleep(0.4)
    assert len(scan_all(hw, "j")) == 10
    clock.now = (t0 + 2 * 3_600_000) / 1000  # far forward: everything due at once
    recs = wait_for(lambda: count_is(hw, "j", 30), what="the rest")
    time.sleep(0.3)
    recs = scan_all(hw, "j")
    assert Counter(r.body for r in recs) == Counter(bodies.keys())
    for p in range(3):
        in_p = sorted((r for r in recs if r.partition == p), key=lambda r: r.offset)
        assert [bodies[r.body] for r in in_p] == sorted(bodies[r.body] for r in in_p)


def test_a_clock_going_back_past_reclaimed_buckets_reuses_no_id(tmp_path, clock):
    with headwater.open(tmp_path / "d", clock=clock) as hw:
        hw.admin.create_queue("q", ttl_s=None)
        t0 = now_ms(clock)
        first = hw.send("q", b"first", deliver_at=t0 + 60_000)
        clock.advance(2 * 3600)  # delivered, and its bucket's span is over: reclaimed
        wait_for(lambda: count_is(hw, "q", 1), what="delivery")
        service = hw.service.delay
        wait_for(lambda: not service.stats().buckets, what="reclaiming the bucket")
        clock.now = (t0 + 30_000) / 1000  # back before it was due
        second = hw.send("q", b"second", deliver_at=t0 + 60_000)
        assert second != first  # filed in a later bucket: its id names nothing else
        assert split_delay_offset(second.offset)[0] > split_delay_offset(first.offset)[0]
        with pytest.raises(MessageNotFoundError, match="reclaimed"):
            hw.get(first)
        time.sleep(0.4)
        assert len(scan_all(hw, "q")) == 1  # not early
        clock.now = (t0 + 61_000) / 1000
        recs = wait_for(lambda: count_is(hw, "q", 2), what="the second delivery")
        # on time, though filed in a later bucket (its record's timestamp is the store's last
        # append time, which never goes back with the clock)
        assert [r.body for r in recs] == [b"first", b"second"]


# -- durability and recovery (embedded, the real store) ---------------------------------


def test_pending_messages_survive_a_restart(tmp_path, clock):
    data = tmp_path / "d"
    t0 = now_ms(clock)
    with headwater.open(data, clock=clock, flush="sync") as hw:
        hw.admin.create_queue("r", partitions=2, ttl_s=None)
        ids = [hw.send("r", f"r{i}".encode(), deliver_at=t0 + (i + 1) * 600_000) for i in range(10)]
        hw.cancel(ids[3])
        clock.now = (t0 + 2.5 * 600_000) / 1000
        wait_for(lambda: count_is(hw, "r", 2), what="two delivered")
    with headwater.open(data, clock=clock) as hw:
        s = hw.delay_stats()
        assert s.pending_messages == 7
        assert hw.get(ids[5]).body == b"r5"
        clock.now = (t0 + 11 * 600_000) / 1000
        wait_for(lambda: count_is(hw, "r", 9), what="the rest")
        time.sleep(0.3)
        assert sorted(r.body for r in scan_all(hw, "r")) == sorted(f"r{i}".encode() for i in range(10) if i != 3)


def test_idempotent_retries_of_delayed_batches_are_scheduled_once(tmp_path, clock):
    from headwater.model.batch import encode_batch

    data = tmp_path / "d"
    t0 = now_ms(clock)
    hw = headwater.open(data, clock=clock)
    hw.admin.create_queue("i")
    batch = encode_batch([b"once"], deliver_at_ms=t0 + 60_000, producer_id=77, base_sequence=0, producer_epoch=0)
    r1 = hw.service.produce("i", 0, batch)
    assert hw.service.produce("i", 0, batch) == r1  # a retry: the first placement
    hw.close()
    hw = headwater.open(data, clock=clock)  # the table is rebuilt on open
    assert hw.service.produce("i", 0, batch) == r1
    nxt = encode_batch([b"next"], deliver_at_ms=t0 + 60_000, producer_id=77, base_sequence=1, producer_epoch=0)
    assert hw.service.produce("i", 0, nxt).base_offset == r1.base_offset + 1
    # plain sends of the same producer to the same partition count their own sequences
    plain = encode_batch([b"plain"], producer_id=77, base_sequence=0, producer_epoch=0)
    assert hw.service.produce("i", 0, plain).base_offset == 0
    clock.advance(61)
    wait_for(lambda: count_is(hw, "i", 3), what="delivery")
    time.sleep(0.3)
    assert sorted(r.body for r in scan_all(hw, "i")) == [b"next", b"once", b"plain"]
    hw.close()


def _bucket_files(data: Path) -> list[Path]:
    return sorted((data / "delay").glob("*.sched"))


def test_a_delivery_the_schedule_did_not_record_is_found_in_the_log(tmp_path, clock):
    """The crash window: the batch is in the log, its DELIVERED record did not survive. The
    stamp in the log's batch header makes the next open record it instead of delivering it
    again."""
    from headwater.storage.schedule import CHECKPOINT_FILE, DispatchCheckpoint, read_checkpoint, write_checkpoint

    data = tmp_path / "d"
    t0 = now_ms(clock)
    with headwater.open(data, clock=clock) as hw:
        hw.admin.create_queue("w", ttl_s=None)
        for i in range(5):
            hw.send("w", f"w{i}".encode(), deliver_at=t0 + 1_000 + i)
        [f] = _bucket_files(data)
        before = f.read_bytes()  # five SCHEDULE records, nothing delivered
        ckpt = read_checkpoint(data / "delay" / CHECKPOINT_FILE)
        clock.advance(2)
        wait_for(lambda: count_is(hw, "w", 5), what="delivery")
    # put back the schedule and checkpoint as they were before the delivery
    f.write_bytes(before)
    write_checkpoint(
        data / "delay" / CHECKPOINT_FILE,
        DispatchCheckpoint(ckpt.log_position, ckpt.floor_ms, ckpt.accept_seq, ckpt.producers),
    )
    with headwater.open(data, clock=clock) as hw:
        assert any("deliveries found in the log" in line for line in hw.status()["recovery"])
        assert hw.delay_stats().pending_messages == 0
        time.sleep(0.4)
        assert Counter(r.body for r in scan_all(hw, "w")) == Counter(f"w{i}".encode() for i in range(5))


def test_a_torn_schedule_record_is_cut_on_open(tmp_path, clock):
    data = tmp_path / "d"
    t0 = now_ms(clock)
    with headwater.open(data, clock=clock, flush="sync") as hw:
        hw.admin.create_queue("t", ttl_s=None)
        for i in range(3):
            hw.send("t", f"t{i}".encode(), deliver_at=t0 + 60_000)
    [f] = _bucket_files(data)
    with open(f, "ab") as out:  # half a record: a write torn by a crash
        out.write(struct.pack("<II", 500, 123) + b"\x01" * 40)
    with headwater.open(data, clock=clock) as hw:
        assert any("cut" in line for line in hw.status()["recovery"])
        assert hw.delay_stats().pending_messages == 3
        hw.send("t", b"t3", deliver_at=t0 + 60_000)  # appends after the cut
        clock.advance(61)
        recs = wait_for(lambda: count_is(hw, "t", 4), what="delivery")
        assert sorted(r.body for r in recs) == [b"t0", b"t1", b"t2", b"t3"]


def test_a_disabled_queue_holds_its_due_messages_until_enabled(tmp_path, clock):
    with headwater.open(tmp_path / "d", clock=clock) as hw:
        hw.admin.create_queue("off", ttl_s=None)
        hw.send("off", b"x", deliver_at=now_ms(clock) + 1_000)
        hw.admin.disable_queue("off")
        clock.advance(5)
        time.sleep(0.4)
        assert hw.delay_stats().pending_messages == 1
        hw.admin.enable_queue("off")
        clock.advance(2)  # the retry comes due
        wait_for(lambda: count_is(hw, "off", 1), what="delivery after enabling")


def test_a_deleted_queue_drops_its_delayed_messages(tmp_path, clock):
    with headwater.open(tmp_path / "d", clock=clock) as hw:
        hw.admin.create_queue("del", ttl_s=None)
        mid = hw.send("del", b"x", deliver_at=now_ms(clock) + 1_000)
        hw.admin.delete_queue("del")
        hw.admin.create_queue("del", ttl_s=None)  # a new queue of the same name gets nothing
        clock.advance(2)
        wait_for(lambda: hw.delay_stats().dropped_total == 1, what="the drop")
        assert scan_all(hw, "del") == []
        with pytest.raises(MessageNotFoundError):
            hw.get(mid)


def test_a_truncated_queue_still_gets_its_delayed_messages(tmp_path, clock):
    # docs/cli.md: truncate drops what the partitions hold; what waits arrives at its time
    with headwater.open(tmp_path / "d", clock=clock) as hw:
        hw.admin.create_queue("t", ttl_s=None)
        hw.send("t", b"plain", partition=0)
        mid = hw.send("t", b"later", partition=0, deliver_at=now_ms(clock) + 1_000)
        hw.admin.truncate_queue("t")
        assert scan_all(hw, "t") == [] and hw.delay_stats().pending_messages == 1
        clock.advance(2)
        recs = wait_for(lambda: count_is(hw, "t", 1), what="the delivery after the truncation")
        assert [(r.body, r.offset) for r in recs] == [(b"later", 1)]
        # the delivery is appended, then its delayed id is marked delivered: a moment apart
        wait_for(lambda: hw.get(mid).offset == 1, what="its delayed id naming the delivered message")


@pytest.mark.alone("it sets the broker's clock (test_cluster_delay.py: on a cluster)")
def test_a_lower_message_limit_after_acceptance_still_delivers(hw, clock):
    # the limit is checked when a message is accepted, as a plain send's; lowering it later
    # must not lose what was acknowledged (as Kafka's max.message.bytes, for new sends only)
    hw.admin.create_queue("big", ttl_s=None, message_bytes_max=1_000)
    mid = hw.send("big", b"x" * 900, deliver_at=now_ms(clock) + 1_000)
    hw.admin.alter_queue("big", message_bytes_max=500)
    with pytest.raises(MessageTooLargeError):
        hw.send("big", b"y" * 900, deliver_at=now_ms(clock) + 1_000)
    clock.advance(2)
    recs = wait_for(lambda: count_is(hw, "big", 1), what="the delivery")
    assert [r.body for r in recs] == [b"x" * 900] and hw.get(mid).body == b"x" * 900
    assert hw.delay_stats().dropped_total == 0


@pytest.mark.alone("it counts a fresh broker's whole schedule (delay_stats) (test_cluster_delay.py: on a cluster)")
def test_stats_show_buckets_next_due_and_lateness(hw, clock):
    hw.admin.create_queue("s", ttl_s=None)
    t0 = now_ms(clock)
    hw.send_batch("s", [b"a", b"b"], deliver_at=t0 + 5_000)
    hw.send("s", b"c", deliver_at=t0 + 3 * 86_400_000)
    s = hw.delay_stats()
    assert s.pending_messages == 3 and s.pending_batches == 2
    assert s.next_due_ms == t0 + 5_000
    assert [b.pending_messages for b in s.buckets] == [2, 1]
    assert s.buckets[0].loaded and s.buckets[0].start_ms <= t0 + 5_000 < s.buckets[0].end_ms
    clock.advance(6)
    wait_for(lambda: count_is(hw, "s", 2), what="delivery")
    s = wait_for(lambda: (lambda x: x if x.delivered_total == 2 else None)(hw.delay_stats()), what="stats")
    assert s.pending_messages == 1 and s.lateness_p50_ms is not None and s.lateness_max_ms >= 0
    assert s.delivered_per_s > 0
    assert hw.status()["delay_pending"] == 1 if "delay_pending" in hw.status() else True


def test_async_client_sends_and_cancels(tmp_path, clock):
    import asyncio

    import headwater.aio as aio

    async def main():
        async with await aio.open(tmp_path / "d", clock=clock) as hw:
            await hw.admin.create_queue("a", ttl_s=None)
            t0 = now_ms(clock)
            p = hw.producer()
            m1 = await p.send("a", b"one", deliver_at=t0 + 60_000)
            m2 = await p.send_nowait("a", b"two", delay=120)
            m3 = await p.send_batch("a", [b"three", b"four"], deliver_at=t0 + 60_000)
            await p.flush()
            assert all(m.is_delayed for m in (m1, m2, *m3))
            assert (await hw.get(m2)).scheduled_ms == t0 + 120_000
            await hw.cancel(m3[0])
            assert (await hw.delay_stats()).pending_messages == 3
            await p.close()

    asyncio.run(main())


# -- real broker processes -------------------------------------------------------------


@pytest.mark.slow  # a crash test of ~10 s; the restart tests above run by default
def test_a_broker_sigkilled_while_thousands_are_due_delivers_each_exactly_once(tmp_path):
    data = tmp_path / "data"
    broker = BrokerProcess(data, "--flush", "sync").start()
    port = broker.port
    n = 5000
    with headwater.connect(broker.address) as hw:
        hw.admin.create_queue("k", partitions=4, ttl_s=None)
        p = hw.producer(linger_ms=5)
        start = time.time() + 4.0  # due over 5 s, starting 4 s from now
        futs = [
            p.send("k", f"k{i}".encode(), partition=i % 4, deliver_at=int((start + 5.0 * i / n) * 1000))
            for i in range(n)
        ]
        p.flush()
        assert all(f.result().is_delayed for f in futs)
        p.close()

        def delivered() -> int:
            return sum(q.message_count for q in hw.admin.list_queues() if q.name == "k")

        wait_for(lambda: delivered() > n // 4, timeout_s=30, what="a quarter delivered")
        count_at_kill = delivered()
    broker.kill()  # mid-delivery: some batches appended, some recorded, some not yet taken
    assert count_at_kill < n, "the kill came too late to test anything"
    broker = BrokerProcess(data, "--flush", "sync", port=port).start()
    with headwater.connect(broker.address) as hw:
        time.sleep(0.5)
        broker.kill()  # and once more, right after recovery
    broker = BrokerProcess(data, "--flush", "sync", port=port).start()
    with headwater.connect(broker.address) as hw:
        wait_for(lambda: hw.delay_stats().pending_messages == 0, timeout_s=30, what="nothing pending")
        time.sleep(0.5)
        bodies = Counter(r.body.decode() for r in hw.scanner("k"))
    broker.terminate()
    dupes = [b for b, c in bodies.items() if c > 1]
    assert not dupes, f"delivered twice: {dupes[:5]}"
    missing = [f"k{i}" for i in range(n) if f"k{i}" not in bodies]
    assert not missing, f"lost: {missing[:5]}"


def _rss_after_pending(tmp_path: Path, total: int, per_batch: int) -> tuple[int, int, int]:
    """Schedule ``total`` messages over a year in a broker process; its RSS (bytes) before,
    after sending, and after a restart."""
    data = tmp_path / "data"
    broker = BrokerProcess(data).start()
    base = broker.rss_bytes()
    year_ms = 365 * 86_400_000
    t0 = int(time.time() * 1000) + 3_600_000
    with headwater.connect(broker.address) as hw:
        hw.admin.create_queue("far", partitions=8, ttl_s=None)
        p = hw.producer(linger_ms=20)
        batches = total // per_batch
        body = b"x" * 100
        for b in range(batches):  # consecutive sends of one time and partition form one batch
            at = t0 + year_ms * b // batches
            for _ in range(per_batch):
                p.send("far", body, deliver_at=at, partition=b % 8)
        p.flush()
        p.close()
        s = hw.delay_stats()
        assert s.pending_messages == total
        assert len(s.buckets) >= min(batches, 8700)  # spread over a year of hourly buckets
        assert s.loaded_batches <= 3 * -(-batches // 8760)  # only the buckets due soon
        after = broker.rss_bytes()
    broker.terminate()
    broker = BrokerProcess(data).start()
    with headwater.connect(broker.address) as hw:
        assert hw.delay_stats().pending_messages == total
        reopened = broker.rss_bytes()
    broker.terminate()
    return base, after, reopened


RSS_BOUND_BYTES = 128 << 20  # the stated bound: docs/design/delay.md


def test_memory_stays_bounded_with_many_pending(tmp_path):
    base, after, reopened = _rss_after_pending(tmp_path, 100_000, 20)
    print(f"RSS: empty {base >> 20} MB, 100k pending {after >> 20} MB, reopened {reopened >> 20} MB")
    assert after < RSS_BOUND_BYTES and reopened < RSS_BOUND_BYTES, (base, after, reopened)


@pytest.mark.slow
def test_memory_stays_bounded_with_a_million_pending_over_a_year(tmp_path):
    base, after, reopened = _rss_after_pending(tmp_path, 1_000_000, 20)
    print(f"RSS: empty {base >> 20} MB, 1M pending {after >> 20} MB, reopened {reopened >> 20} MB")
    assert after < RSS_BOUND_BYTES and reopened < RSS_BOUND_BYTES, (base, after, reopened)


def test_a_fraction_of_a_millisecond_rounds_up_in_every_form():
    # time.time() * 1000 + 5000 is a float: truncating it scheduled the message up to a
    # millisecond before the time asked for, where a datetime's fraction rounds up
    from headwater.model.delay import resolve_deliver_at

    now = 1_800_000_000_000
    assert resolve_deliver_at(now + 5000.25, now_ms=now) == now + 5001
    assert resolve_deliver_at(float(now + 5000), now_ms=now) == now + 5000
    assert resolve_deliver_at(delay=1.0002, now_ms=now) == now + 1001
    assert resolve_deliver_at(delay=timedelta(microseconds=1_000_100), now_ms=now) == now + 1001
    assert resolve_deliver_at(datetime.fromtimestamp((now + 5000.25) / 1000, UTC), now_ms=now) == now + 5001
    assert resolve_deliver_at(now + 0.5, now_ms=now) == now + 1  # still in the future: delayed
    assert resolve_deliver_at(delay=0.0001, now_ms=now) == now + 1


def test_a_deliver_at_in_epoch_seconds_warns(tmp_path):
    """``deliver_at=time.time() + 60`` (seconds where milliseconds are meant) is a moment in
    January 1970: the message went at once, without a word. It still does (a time not in the
    future sends at once, as documented), with a warning that says what was meant."""
    import time as _time
    import warnings

    from headwater.model.delay import resolve_deliver_at

    with pytest.warns(UserWarning, match=r"looks like epoch seconds.*time.time\(\) \* 1000"):
        assert resolve_deliver_at(_time.time() + 60) == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # milliseconds, and small numbers (long past), say nothing
        assert resolve_deliver_at(_time.time() * 1000 + 60_000) > 0
        assert resolve_deliver_at(0) == resolve_deliver_at(5) == 0
    hw = headwater.open(tmp_path / "data")
    hw.admin.create_queue("q")
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            hw.producer().send("q", b"x", deliver_at=int(_time.time()) + 60).result()  # an int too
        assert [w.filename for w in seen] == [__file__], "the warning names a line inside headwater"
    finally:
        hw.close()


def test_a_naive_deliver_at_warns_where_local_time_is_not_utc(monkeypatch):
    """A naive datetime is UTC in Headwater; ``datetime.now() + 30 s`` on a machine in New
    York was then sent at once (or, east of UTC, hours late), silently."""
    import time as _time
    import warnings
    from datetime import datetime, timedelta

    from headwater.model.delay import resolve_deliver_at

    soon = datetime.now(UTC).replace(tzinfo=None) + timedelta(seconds=30)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # in UTC: no warning
        monkeypatch.setenv("TZ", "UTC")
        _time.tzset()
        resolve_deliver_at(soon)
        monkeypatch.setenv("TZ", "America/New_York")
        _time.tzset()
        try:
            with pytest.raises(UserWarning, match="naive datetime is taken as UTC"):
                resolve_deliver_at(soon)
            resolve_deliver_at(datetime.now(UTC) + timedelta(seconds=30))  # aware: fine
        finally:
            monkeypatch.delenv("TZ")
            _time.tzset()
