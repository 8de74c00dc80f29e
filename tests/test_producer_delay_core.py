"""The producer core's delayed batches without I/O: several open batches per partition, one
per due bucket, bounded, lingering and sealed; sorted by due time when encoded, with the
drivers' per-message state moved along; sequences as for any batch."""

from __future__ import annotations

import random

import pytest

from headwater.client.core.outcomes import RetryPolicy, Step
from headwater.client.core.producer import DELAY_BATCHES_MAX_DEFAULT, Batch, PartitionState, ProducerCore
from headwater.errors import InvalidArgumentError, UnavailableError
from headwater.model.batch import decode_deliver_offsets, decode_header
from headwater.model.batch_reads import decode_records

T0 = 1_800_000_000_000  # a due time on a whole minute
NOW_S = T0 / 1000 - 5  # the core's clock: T0 is due in five seconds, "near" (DELAY_FAR_MS)


class Tagged(Batch):
    """A batch that keeps a tag per message, as a driver keeps its futures."""

    __slots__ = ("tags",)

    def __init__(self, part: PartitionState, created_ms: float) -> None:
        super().__init__(part, created_ms)
        self.tags: list[int] = []

    def reordered(self, order: list[int]) -> None:
        self.tags = [self.tags[i] for i in order]


def core(
    *, linger_ms=0, bucket_ms=1000, batches_max=16, batch_bytes_max=1 << 20, pipeline=5, now_s=NOW_S, clock=None
) -> ProducerCore:
    retry = RetryPolicy(retries=3, backoff_ms=100, backoff_max_ms=100, delivery_timeout_ms=60_000, rng=random.Random(1))
    return ProducerCore(
        new_batch=Tagged,
        batch_sent=lambda queue, partition: None,
        retry=retry,
        linger_ms=linger_ms,
        batch_bytes_max=batch_bytes_max,
        pipeline=pipeline,
        idempotent=True,
        compression=None,
        delay_bucket_ms=bucket_ms,
        delay_batches_max=batches_max,
        clock=clock or (lambda: now_s),
    )


def add(c: ProducerCore, tag: int, due_ms: int, now_ms: float = 0, partition: int = 0, urgent: bool = False) -> Tagged:
    ps = c.partition("q", partition, due_ms)
    body = f"m{tag}".encode()
    b, opened = c.append(ps, body, len(body), now_ms, due_ms, urgent)
    b.tags.append(tag)  # type: ignore[attr-defined]  # a Tagged batch
    if opened or urgent:
        c.mark_sendable(ps)
    return b  # type: ignore[return-value]


def encoded(c: ProducerCore, batches: list[Batch]) -> list[tuple[list[int], list[int]]]:
    """Encode as a driver does: each batch's (tags, due times as the broker reads them)."""
    out = []
    for b in batches:
        buf = c.encode(b)
        h = decode_header(buf)
        offsets = decode_deliver_offsets(buf, h) or [0] * h.count  # the broker's own check
        assert [r.body for r in decode_records(buf, "q")] == [f"m{t}".encode() for t in b.tags]  # type: ignore[attr-defined]
        out.append((b.tags, [h.deliver_at_ms + o for o in offsets]))  # type: ignore[attr-defined]
    return out


def test_random_due_times_pack_into_one_batch_per_bucket_in_due_order():
    c = core(pipeline=10)
    rng = random.Random(4)
    dues = {i: T0 + rng.randrange(10_000) for i in range(2_000)}  # 10 buckets of a second
    for i, due in dues.items():
        add(c, i, due)
    batches, _ = c.collect(now_ms=0, hurry=True)
    assert len(batches) == 10 and sum(len(b.messages) for b in batches) == 2_000
    for tags, times in encoded(c, batches):
        assert times == sorted(times) and times == [dues[t] for t in tags]  # each keeps its exact time
        assert times[-1] - times[0] < 1_000 and len({t // 1_000 for t in times}) == 1


def test_messages_due_at_the_same_time_keep_their_order():
    c = core()
    for i, due in enumerate([T0 + 5, T0 + 1, T0 + 5, T0 + 1, T0 + 3, T0 + 5]):
        add(c, i, due)
    ((tags, times),) = encoded(c, c.collect(now_ms=0, hurry=True)[0])
    assert tags == [1, 3, 4, 0, 2, 5] and times == [T0 + 1, T0 + 1, T0 + 3, T0 + 5, T0 + 5, T0 + 5]


def test_open_delayed_batches_are_bounded_and_the_oldest_is_sealed_first():
    c = core(linger_ms=1000, batches_max=3)
    for bucket in (4, 1, 3, 0, 2):  # five buckets, at most three open
        add(c, bucket, T0 + bucket * 1_000 + 7)
    ps = c.partition("q", 0, T0)
    assert [b.tags for b in ps.opens.values()] == [[3], [0], [2]]  # type: ignore[union-attr,attr-defined]
    assert [b.tags for b in ps.ready] == [[4], [1]]  # type: ignore[attr-defined]  # sealed as the limit was hit
    add(c, 9, T0 + 3_500)  # joins its bucket's open batch
    assert len(ps.opens) == 3 and ps.opens[(T0 + 3_500) // 1_000].tags == [3, 9]  # type: ignore[union-attr,attr-defined]
    assert [b.tags for b in c.collect(now_ms=0, hurry=False)[0]] == [[4], [1]]  # type: ignore[attr-defined]


def test_each_open_batch_lingers_from_its_creation_and_a_flush_seals_them_all():
    c = core(linger_ms=10)
    add(c, 0, T0 + 100, now_ms=0)
    add(c, 1, T0 + 5_100, now_ms=4)
    add(c, 2, T0 + 150, now_ms=6)
    assert c.collect(now_ms=5, hurry=False) == ([], 10)  # the oldest's linger ends first
    batches, wake = c.collect(now_ms=10, hurry=False)
    assert [b.tags for b in batches] == [[0, 2]] and wake == 14  # type: ignore[attr-defined]
    add(c, 3, T0 + 9_000, now_ms=11)
    batches, wake = c.collect(now_ms=12, hurry=True)
    assert [b.tags for b in batches] == [[1], [3]] and wake is None  # type: ignore[attr-defined]
    assert not c.partition("q", 0, T0).has_batches()


def test_delayed_sequences_count_apart_and_a_retried_batch_is_the_same_bytes():
    c = core(bucket_ms=1000, pipeline=5)
    plain = c.partition("q", 0)
    b, _ = c.append(plain, b"p", 1, 0, 0, False)
    c.mark_sendable(plain)
    for i, due in enumerate([T0 + 1_500, T0 + 200, T0 + 1_100, T0 + 100]):
        add(c, i, due)
    batches, _ = c.collect(now_ms=0, hurry=True)
    for x in batches:
        c.encode(x)
        x.attempts += 1
    by_key = {x.part.key: [] for x in batches}
    for x in batches:
        by_key[x.part.key].append(x.base_sequence)
    assert by_key == {("q", 0): [0], ("q", 0x80000000): [0, 2]}  # two delayed batches of 2
    late = next(x for x in batches if x.deliver_times and x.deliver_times[0] == T0 + 1_100)
    first_bytes, first_tags = bytes(late.encoded), list(late.tags)  # type: ignore[arg-type,attr-defined]
    verdict = c.judge(late, UnavailableError("lost"), now_ms=1)
    assert verdict.step is Step.RESEND
    c.retry_later(late, verdict.delay_ms, now_ms=1)
    for x in batches:
        if x is not late:
            c.finish(x, now_ms=lambda: 2, hurry=lambda: True)
    (again,) = c.collect(now_ms=500, hurry=True)[0]
    assert again is late and bytes(late.encoded) == first_bytes  # type: ignore[arg-type]  # the broker sees a duplicate
    late.encoded = None  # encoded again (a new epoch): its messages stay in the same order
    c.encode(late)
    assert late.tags == first_tags and late.messages == [b"m2", b"m0"]  # type: ignore[attr-defined]


@pytest.mark.parametrize("setting", [{"delay_bucket_ms": 0}, {"delay_bucket_ms": 60_001}, {"delay_batches_max": 0}])
def test_bad_delay_batching_settings_are_refused(setting):
    import headwater.testing

    with headwater.testing.open_memory() as hw, pytest.raises(InvalidArgumentError, match=next(iter(setting))):
        hw.producer(**setting)


def test_a_delayed_batch_is_held_open_only_until_sealed_taken_or_aborted():
    c = core(linger_ms=1000, batches_max=1)
    first = add(c, 0, T0)
    ps = c.partition("q", 0, T0)
    assert ps.holds_open(first)
    second = add(c, 1, T0 + 5000)  # another bucket at the limit: the first is sealed
    assert not ps.holds_open(first) and ps.holds_open(second)
    assert c.take(ps, 0, hurry=True) == [first, second]  # sealed first, then the open one
    assert not ps.holds_open(second)
    third = add(c, 2, T0 + 9000)
    unsent, _ = c.abort()
    assert third in unsent and not ps.holds_open(third)


def test_times_due_hours_ahead_share_a_batch_by_the_minute():
    c = core(pipeline=60, batches_max=DELAY_BATCHES_MAX_DEFAULT, now_s=T0 / 1000 - 3 * 3600)  # T0 is 3 h ahead: far
    rng = random.Random(5)
    dues = {i: T0 + rng.randrange(3_600_000) for i in range(5_000)}  # an hour: 60 minutes
    for i, due in dues.items():
        add(c, i, due)
    ps = c.partition("q", 0, T0)
    assert len(ps.opens) == 60 and not ps.ready  # type: ignore[arg-type]  # one per minute, none sealed
    batches, _ = c.collect(now_ms=0, hurry=True)
    assert sum(len(b.messages) for b in batches) == 5_000
    for tags, times in encoded(c, batches):
        assert times == sorted(times) and times == [dues[t] for t in tags]  # each keeps its exact time
        assert len({t // 60_000 for t in times}) == 1  # within the batch format's span


def test_by_the_second_only_within_ten_minutes_of_now():
    c = core(now_s=T0 / 1000)
    for i, ahead_s in enumerate([1.0, 1.5, 599.0, 599.5, 600.0, 600.5, 659.0]):
        add(c, i, T0 + int(ahead_s * 1000))
    ps = c.partition("q", 0, T0)
    assert sorted(b.tags for b in ps.opens.values()) == [[0, 1], [2, 3], [4, 5, 6]]  # type: ignore[union-attr,attr-defined]


def test_a_near_message_joins_the_far_batch_holding_its_time_so_one_time_keeps_send_order():
    now = [T0 / 1000 - 700]  # T0 + 30 s is due in 730 s: far
    c = core(linger_ms=1000, clock=lambda: now[0])
    first = add(c, 0, T0 + 30_000)
    now[0] += 200  # 530 s ahead now: near, but the minute's open batch holds that time
    second = add(c, 1, T0 + 30_000)
    third = add(c, 2, T0 + 45_000)
    assert first is second is third
    ((tags, times),) = encoded(c, c.collect(now_ms=0, hurry=True)[0])
    assert tags == [0, 1, 2] and times == [T0 + 30_000, T0 + 30_000, T0 + 45_000]


def test_a_delayed_batch_a_caller_waits_for_leaves_before_older_lingering_ones():
    c = core(linger_ms=10_000)
    add(c, 0, T0 + 100)
    add(c, 1, T0 + 2_100)
    waited = add(c, 2, T0 + 4_100, urgent=True)  # sealed at once: nothing joins it now
    add(c, 3, T0 + 4_200)
    ps = c.partition("q", 0, T0)
    assert list(ps.ready) == [waited]
    assert [b.tags for b in c.collect(now_ms=1, hurry=False)[0]] == [[2]]  # type: ignore[attr-defined]
    assert [b.tags for b in c.collect(now_ms=10_001, hurry=False)[0]] == [[0], [1], [3]]  # type: ignore[attr-defined]
