"""The producer core without I/O: batches, lingering, flight, retries and sequences, driven
by hand with a clock the test moves (no broker, no thread, no event loop)."""

from __future__ import annotations

import doctest
import importlib
import random

import pytest

from headwater.client.core.outcomes import OUTCOMES, Attempt, RetryPolicy, Step, classify
from headwater.client.core.producer import Batch, ProducerCore
from headwater.errors import (
    CorruptDataError,
    InvalidArgumentError,
    OutOfOrderSequenceError,
    ProducerFencedError,
    StorageError,
    UnavailableError,
)
from headwater.model.batch import decode_header


@pytest.mark.parametrize(
    "name",
    ["headwater.client.core.outcomes", "headwater.client.core.sequences", "headwater.client.core.metadata"],
)
def test_docstring_examples(name):
    assert doctest.testmod(importlib.import_module(name)).failed == 0


def test_every_outcome_has_one_step():
    assert set(OUTCOMES) == {(a, more) for a in Attempt for more in (True, False)}
    assert classify(None, True) is Attempt.STORED
    assert classify(OutOfOrderSequenceError("gap"), True) is Attempt.OUT_OF_ORDER
    assert classify(OutOfOrderSequenceError("gap"), False) is Attempt.UNKNOWN  # no sequence to start afresh
    assert classify(OutOfOrderSequenceError("gap"), True, behind_a_retry=True) is Attempt.BEHIND_A_RETRY
    assert classify(UnavailableError("down"), True, behind_a_retry=True) is Attempt.RETRIABLE
    assert classify(UnavailableError("down"), True) is Attempt.RETRIABLE
    assert classify(InvalidArgumentError("bad"), True) is Attempt.REFUSED
    assert classify(ProducerFencedError("old"), True) is Attempt.UNKNOWN
    assert classify(StorageError("disk"), True) is Attempt.RETRIABLE  # the same bytes again: no epoch storm
    assert classify(StorageError("disk"), False) is Attempt.UNKNOWN  # without a sequence a resend may double it
    assert classify(CorruptDataError("damaged"), True) is Attempt.UNKNOWN


def core(*, linger_ms=0, batch_bytes_max=1000, pipeline=3, retries=3) -> ProducerCore:
    retry = RetryPolicy(
        retries=retries, backoff_ms=100, backoff_max_ms=100, delivery_timeout_ms=60_000, rng=random.Random(1)
    )
    return ProducerCore(
        new_batch=Batch,
        batch_sent=lambda queue, partition: None,
        retry=retry,
        linger_ms=linger_ms,
        batch_bytes_max=batch_bytes_max,
        pipeline=pipeline,
        idempotent=True,
        compression=None,
    )


def add(c: ProducerCore, body: bytes, now_ms: float, partition: int = 0) -> Batch:
    ps = c.partition("q", partition)
    b, opened = c.append(ps, body, len(body), now_ms, 0, False)
    if opened:
        c.mark_sendable(ps)
    return b


def send(c: ProducerCore, batches: list[Batch]) -> list[int]:
    """Encode as a driver does; the batches' base sequences."""
    for b in batches:
        c.encode(b)
        b.attempts += 1
    return [b.base_sequence for b in batches]


def test_a_batch_lingers_until_its_deadline_unless_hurried():
    c = core(linger_ms=10)
    add(c, b"a", now_ms=0)
    add(c, b"b", now_ms=4)
    assert c.collect(now_ms=5, hurry=False) == ([], 10)  # due at its first message + linger_ms
    batches, wake = c.collect(now_ms=10, hurry=False)
    assert [b.messages for b in batches] == [[b"a", b"b"]] and wake is None
    add(c, b"c", now_ms=11)
    assert [b.messages for b in c.collect(now_ms=12, hurry=True)[0]] == [[b"c"]]  # a flush does not wait


def test_a_full_batch_is_sealed_and_the_next_message_opens_another():
    c = core(batch_bytes_max=10, linger_ms=1000)
    first = add(c, b"x" * 6, now_ms=0)
    second = add(c, b"y" * 6, now_ms=0)  # would overflow: the first is sealed
    add(c, b"z" * 4, now_ms=0)  # fills the second: sealed too
    assert first is not second and c.partition("q", 0).open is None
    assert [b.messages for b in c.collect(now_ms=0, hurry=False)[0]] == [[b"x" * 6], [b"y" * 6, b"z" * 4]]


def test_at_most_pipeline_batches_fly_and_a_landing_one_frees_a_slot():
    c = core(pipeline=2, batch_bytes_max=1)
    for body in (b"a", b"b", b"c"):
        add(c, body, now_ms=0)
    flying, _ = c.collect(now_ms=0, hurry=True)
    assert [b.messages for b in flying] == [[b"a"], [b"b"]]
    assert send(c, flying) == [0, 1]  # sequences follow each other, before any answer
    nxt, _ = c.finish(flying[0], now_ms=lambda: 1, hurry=lambda: True)
    assert [b.messages for b in nxt] == [[b"c"]] and send(c, nxt) == [2]


def test_a_failed_batch_goes_again_first_in_its_order_once_the_flight_is_through():
    c = core(pipeline=3, batch_bytes_max=1)
    for body in (b"a", b"b", b"c"):
        add(c, body, now_ms=0)
    a, b, cc = c.collect(now_ms=0, hurry=True)[0]
    send(c, [a, b, cc])
    for batch, now in ((b, 1), (a, 2)):  # both lost; the answers come out of order
        verdict = c.judge(batch, UnavailableError("lost"), now_ms=now)
        assert verdict.step is Step.RESEND
        c.retry_later(batch, verdict.delay_ms, now_ms=now)
    add(c, b"d", now_ms=3)
    assert c.collect(now_ms=500, hurry=True)[0] == []  # c is still in flight: nothing leaves
    c.finish(cc, now_ms=lambda: 501, hurry=lambda: True)
    assert c.collect(now_ms=502, hurry=True)[0] == [a]  # one at a time, in their first order
    c.finish(a, now_ms=lambda: 503, hurry=lambda: True)
    assert c.collect(now_ms=504, hurry=True)[0] == [b]
    c.finish(b, now_ms=lambda: 505, hurry=lambda: True)
    assert [x.messages for x in c.collect(now_ms=506, hurry=True)[0]] == [[b"d"]]  # recovered


def test_out_of_order_starts_a_new_epoch_and_later_batches_wait_for_the_old_one():
    c = core(pipeline=3, batch_bytes_max=1)
    add(c, b"a", now_ms=0)
    (a,) = c.collect(now_ms=0, hurry=True)[0]
    send(c, [a])
    verdict = c.judge(a, OutOfOrderSequenceError("gap"), now_ms=1)
    assert verdict.step is Step.REENCODE and a.encoded is None and c.identity[1] == 1
    c.retry_later(a, verdict.delay_ms, now_ms=1)
    (again,) = c.collect(now_ms=1, hurry=True)[0]
    assert again is a and send(c, [a]) == [0] and decode_header(a.encoded).producer_epoch == 1


def test_out_of_order_behind_a_refused_batch_follows_it_with_the_same_bytes_and_epoch():
    """The broker refused ``a`` (its disk full) and then ``b``, in flight behind it, as out of
    order (the disk had room again for b's smaller write): the gap is ``a``'s. ``b`` goes
    again after ``a``, the same bytes under the same epoch; a full-disk test once saw the
    epoch bumped here."""
    c = core(pipeline=3, batch_bytes_max=1)
    for body in (b"a", b"b"):
        add(c, body, now_ms=0)
    a, b = c.collect(now_ms=0, hurry=True)[0]
    send(c, [a, b])
    sent = bytes(b.encoded)
    verdict = c.judge(a, StorageError("no space left on the device"), now_ms=1)
    assert verdict.step is Step.RESEND
    c.retry_later(a, verdict.delay_ms, now_ms=1)
    verdict = c.judge(b, OutOfOrderSequenceError("gap"), now_ms=2)
    assert verdict.step is Step.RESEND and c.identity[1] == 0 and bytes(b.encoded) == sent
    c.retry_later(b, verdict.delay_ms, now_ms=2)
    assert c.collect(now_ms=500, hurry=True)[0] == [a]  # a first, then b: the broker's order
    c.finish(a, now_ms=lambda: 501, hurry=lambda: True)
    assert c.collect(now_ms=502, hurry=True)[0] == [b] and b.encoded is not None and bytes(b.encoded) == sent
    # alone (nothing before it waits to go again), out of order still starts a new epoch
    c.finish(b, now_ms=lambda: 503, hurry=lambda: True)
    add(c, b"c", now_ms=504)
    (cc,) = c.collect(now_ms=504, hurry=True)[0]
    send(c, [cc])
    assert c.judge(cc, OutOfOrderSequenceError("gap"), now_ms=505).step is Step.REENCODE and c.identity[1] == 1


def test_a_failure_that_may_have_stored_the_batch_bumps_the_epoch_else_frees_its_sequence():
    c = core(batch_bytes_max=1)
    add(c, b"a", now_ms=0)
    (a,) = c.collect(now_ms=0, hurry=True)[0]
    send(c, [a])
    c.fail(a, InvalidArgumentError("refused"))
    assert c.identity[1] == 0 and c.partition("q", 0).next_sequence == 0  # given back
    add(c, b"b", now_ms=0)
    (b,) = c.finish(a, now_ms=lambda: 0, hurry=lambda: True)[0]  # what waited leaves as the slot frees
    send(c, [b])
    c.fail(b, UnavailableError("gave up"))
    assert c.identity[1] == 1  # it may be stored: the next batches start a new epoch


def test_an_identified_batch_keeps_its_identity_and_an_out_of_order_refusal_is_final():
    c = core()
    b = c.identified("q", 2, [b"x", b"y"], (77, 3), now_ms=0, base_sequence=5)
    c.fly(b)
    header = decode_header(b.encoded)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (77, 3, 5)
    b.attempts = 1
    assert c.judge(b, UnavailableError("down"), now_ms=1).step is Step.RESEND  # the same bytes again
    verdict = c.judge(b, OutOfOrderSequenceError("gap"), now_ms=1)
    assert verdict.step is Step.FAIL_FENCED and isinstance(verdict.error, OutOfOrderSequenceError)
    assert c.identity[1] == 0 and b.encoded is not None  # the producer's own epoch is untouched
    assert ("q", 2) not in c.parts  # the partition's own state is not involved
