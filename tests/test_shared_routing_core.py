"""The I/O-free rules of shared groups on a cluster (headwater/client/core/shared_routing.py):
splitting leases by leader, merging the leaders' answers, and the deliveries a receive got
after it was answered, kept for the member's next receive and never dropped."""

from __future__ import annotations

import pytest

from headwater.client.core.shared_routing import (
    SharedReceives,
    merge_lease_answers,
    merge_shared_describe,
    refused_as,
    split_leases,
)
from headwater.errors import (
    InvalidArgumentError,
    LeaseExpiredError,
    NotLeaderError,
    QueueNotFoundError,
    UnavailableError,
)
from headwater.model.shared import (
    LeaseId,
    LeaseRefusal,
    SharedDeliveries,
    SharedGroupInfo,
    SharedGroupSettings,
    SharedLease,
    SharedPartitionInfo,
)

KEY = ("g", "q", "m")


def _lease(p: int, off: int) -> str:
    return str(LeaseId(1000, p, off, 1, "m"))


def _got(p: int, *offsets: int) -> SharedDeliveries:
    return SharedDeliveries([b"batch-%d" % p], [SharedLease(p, o, 1, _lease(p, o), 0) for o in offsets])


def _offsets(d: SharedDeliveries | None) -> list[tuple[int, int]]:
    assert d is not None
    return [(x.partition, x.offset) for x in d.leases]


# -- splitting and merging ---------------------------------------------------------------


def test_leases_split_by_their_partitions_leader_in_order():
    ids = [_lease(0, 1), _lease(3, 2), _lease(1, 3), _lease(0, 4), _lease(2, 5)]
    by, leaderless = split_leases(ids, {0: "a", 1: "b", 2: "a"})
    assert by == {"a": [_lease(0, 1), _lease(0, 4), _lease(2, 5)], "b": [_lease(1, 3)]}
    assert leaderless == [_lease(3, 2)]
    with pytest.raises(InvalidArgumentError, match="not a lease id"):
        split_leases([_lease(0, 1), "garbage"], {0: "a"})


def test_a_moved_partitions_leases_are_refused_as_expired_and_a_lost_brokers_as_unavailable():
    moved = refused_as([_lease(0, 1)], NotLeaderError("broker 2 does not lead q[0]"))
    assert [(r.lease_id, r.code) for r in moved] == [(_lease(0, 1), LeaseExpiredError.code)]
    assert "delivered again" in moved[0].message
    lost = refused_as([_lease(1, 1)], UnavailableError("connection refused"))
    assert [r.code for r in lost] == [UnavailableError.code] and "connection refused" in lost[0].message


def test_lease_answers_merge_in_the_callers_order_and_other_errors_raise():
    ids = [_lease(0, 1), _lease(1, 1), _lease(2, 1), _lease(3, 1)]
    by = {"a": [ids[0], ids[2]], "b": [ids[1]], "c": [ids[3]]}
    refusal = LeaseRefusal(ids[2], LeaseExpiredError.code, "expired")
    out = merge_lease_answers(ids, by, [], {"a": [refusal], "b": NotLeaderError("moved"), "c": []})
    assert [r.lease_id for r in out] == [ids[1], ids[2]]
    assert {r.code for r in out} == {LeaseExpiredError.code}
    with pytest.raises(QueueNotFoundError):
        merge_lease_answers(ids, by, [], {"a": [], "b": QueueNotFoundError("gone"), "c": []})
    out = merge_lease_answers(ids, {"a": ids[:2]}, ids[2:], {"a": []})
    assert [r.lease_id for r in out] == ids[2:]  # no leader now: refused, never dropped


def _part(p: int, end: int) -> SharedPartitionInfo:
    return SharedPartitionInfo(
        partition=p,
        start_offset=0,
        end_offset=end,
        committed_offset=end,
        delivered_offset=end,
        leased=0,
        awaiting_retry=0,
        acked_ahead=0,
        dead_lettered=0,
        members={},
        next_lease_deadline_ms=None,
    )


def _info(*parts: SharedPartitionInfo) -> SharedGroupInfo:
    return SharedGroupInfo(
        group="g", queue="q", settings=SharedGroupSettings(), dead_letter_queue="q.dlq", partitions=list(parts)
    )


def test_describe_takes_each_partition_from_its_leader():
    answers = {"a": _info(_part(0, 5), _part(2, 7)), "b": _info(_part(1, 6), _part(2, 99))}
    merged = merge_shared_describe(answers, {0: "a", 1: "b", 2: "a"})
    assert [(p.partition, p.end_offset) for p in merged.partitions] == [(0, 5), (1, 6), (2, 7)]
    assert merged.dead_letter_queue == "q.dlq"


# -- the receives ------------------------------------------------------------------------


def test_the_first_answer_with_deliveries_answers_and_later_ones_are_kept():
    rs = SharedReceives()
    r, send = rs.start(KEY, 10, ["a", "b", "c"])
    assert send == ["a", "b", "c"] and not r.done
    assert rs.answered(KEY, "a", SharedDeliveries([], [])) is None  # empty: wait for the others
    assert rs.answered(KEY, "b", _got(1, 0, 1)) is r
    assert _offsets(r.answer) == [(1, 0), (1, 1)]
    assert rs.answered(KEY, "c", _got(2, 5)) is None  # after the answer: kept
    assert rs.held(KEY) == 1
    r2, send = rs.start(KEY, 10, ["a", "b", "c"])
    assert send == [] and _offsets(r2.answer) == [(2, 5)]  # the next receive takes it first
    assert rs.held(KEY) == 0


def test_a_receive_is_never_sent_twice_to_a_broker_still_polling_for_the_member():
    rs = SharedReceives()
    r, _ = rs.start(KEY, 10, ["a", "b"])
    rs.answered(KEY, "a", _got(0, 1))
    r2, send = rs.start(KEY, 10, ["a", "b"])
    assert send == ["a"]  # b still holds the first receive's long poll
    assert r2.waiting == {"a", "b"}
    assert rs.answered(KEY, "b", _got(1, 3)) is r2  # b's late answer answers the next receive
    assert _offsets(r2.answer) == [(1, 3)]
    other, send = rs.start(("g", "q", "m2"), 10, ["a", "b"])
    assert send == ["a", "b"]  # another member's receives are its own


def test_kept_deliveries_are_handed_out_max_messages_at_a_time():
    rs = SharedReceives()
    r, _ = rs.start(KEY, 2, ["a", "b"])
    rs.answered(KEY, "a", _got(0, 1, 2, 3))
    assert _offsets(r.answer) == [(0, 1), (0, 2)]
    assert rs.held(KEY) == 1
    rs.answered(KEY, "b", _got(1, 7, 8))
    r2, _ = rs.start(KEY, 2, ["a", "b"])
    r3, _ = rs.start(KEY, 2, ["a", "b"])
    assert _offsets(r2.answer) == [(0, 3), (1, 7)] and _offsets(r3.answer) == [(1, 8)]
    assert b"batch-0" in r2.answer.batches and b"batch-1" in r2.answer.batches


def test_a_withdrawn_receive_is_answered_empty_and_its_late_deliveries_kept():
    rs = SharedReceives()
    r, _ = rs.start(KEY, 10, ["a", "b"])
    assert rs.withdraw(r) and r.answer == SharedDeliveries([], [])
    assert not rs.withdraw(r)  # once
    assert rs.answered(KEY, "a", _got(0, 4)) is None
    rs.keep(KEY, _got(3, 9))  # an answer its caller could not take, first in line
    r2, send = rs.start(KEY, 10, ["a", "b"])
    assert send == [] and _offsets(r2.answer) == [(3, 9), (0, 4)]


def test_all_answered_empty_is_an_empty_answer_and_all_unreachable_is_the_error():
    rs = SharedReceives()
    r, _ = rs.start(KEY, 10, ["a", "b"])
    rs.answered(KEY, "a", None, UnavailableError("a is down"))
    assert rs.answered(KEY, "b", SharedDeliveries([], [])) is r and r.answer == SharedDeliveries([], [])
    r, _ = rs.start(KEY, 10, ["a", "b"])
    rs.answered(KEY, "a", None, UnavailableError("a is down"))
    assert rs.answered(KEY, "b", None, UnavailableError("b is down")) is r
    assert isinstance(r.error, UnavailableError) and r.answer is None
    r, _ = rs.start(KEY, 10, ["a", "b"])
    assert rs.answered(KEY, "a", None, QueueNotFoundError("gone")) is r  # a refusal: at once
    assert isinstance(r.error, QueueNotFoundError)
    assert not rs.start(KEY, 10, [])[0].done  # b still polls for the member: wait for it
    r, send = SharedReceives().start(KEY, 10, [])
    assert send == [] and r.answer == SharedDeliveries([], [])  # nobody leads: nothing to wait for


def test_what_is_kept_stays_bounded_by_brokers_times_max_messages():
    rs = SharedReceives()
    brokers = ["a", "b", "c"]
    for round_no in range(50):
        r, send = rs.start(KEY, 4, brokers)
        for b in send:
            rs.answered(KEY, b, _got(brokers.index(b), *range(round_no * 10, round_no * 10 + 4)))
        assert rs.held(KEY) <= len(brokers) * 4


def test_a_round_that_does_not_wait_gathers_every_broker_it_asked():
    rs = SharedReceives()
    r, send = rs.start(KEY, 10, ["a", "b"], wait_all=True)
    assert rs.answered(KEY, "a", _got(0, 1)) is None  # b answers at once too: wait for it
    assert rs.answered(KEY, "b", _got(1, 2)) is r
    assert sorted(_offsets(r.answer)) == [(0, 1), (1, 2)]  # what one broker would give
    long_r, send = rs.start(KEY, 10, ["a", "b"])
    assert send == ["a", "b"]
    rs.answered(KEY, "a", _got(0, 3))
    assert long_r.done  # a long poll: the first with deliveries answers
    quick, send = rs.start(KEY, 10, ["a", "b"], wait_all=True)
    assert send == ["a"] and rs.answered(KEY, "a", SharedDeliveries([], [])) is quick  # b was asked before
    assert quick.answer == SharedDeliveries([], [])
    quick, send = rs.start(KEY, 10, ["b"], wait_all=True)
    assert send == [] and quick.answer == SharedDeliveries([], [])  # b polls already: nothing quick to wait for


def test_a_receive_asks_without_waiting_before_its_long_poll():
    from headwater.client.core.shared_routing import phases
    from headwater.protocol import messages as m

    body = m.SharedReceiveRequest("g", "q", "m", 10, 30_000, max_wait_ms=5_000)
    quick, long = phases(body)
    assert quick.max_wait_ms == 0 and long == body
    assert phases(quick) == (quick, None)


def test_the_kept_deliveries_are_drained_for_release_when_the_client_closes():
    rs = SharedReceives()
    r, _ = rs.start(KEY, 1, ["a"])
    rs.answered(KEY, "a", _got(0, 1, 2, 3))
    assert rs.drain() == {KEY: [_lease(0, 2), _lease(0, 3)]}
    assert rs.held(KEY) == 0 and rs.drain() == {}
