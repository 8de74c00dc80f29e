"""The routed operations as plans, without a broker (headwater/client/core/routed_plans.py):
each plan is run by a fake driver that answers its effects from a script, so what a plan
asks for, in which order, and what it makes of the answers is checked in microseconds."""

from __future__ import annotations

import doctest
import functools
import inspect
from collections.abc import Callable
from typing import Any

import pytest

import headwater.client.core.effects as effects
import headwater.client.core.routed_plans as plans
from headwater.client.core.effects import HOME, Call, Fanout, Open, Plan, Refresh, RoutedState, Sleep
from headwater.client.core.routing import RoutingTable
from headwater.errors import (
    GroupNotFoundError,
    LeaseExpiredError,
    NotCoordinatorError,
    NotLeaderError,
    OutcomeUnknownError,
    QueueNotFoundError,
    UnavailableError,
)
from headwater.model.cluster import ClusterMetadata
from headwater.model.config import PartitionInfo, QueueConfig, QueueInfo
from headwater.model.shared import LeaseRefusal
from headwater.protocol import messages as m
from tests.support.cluster_metadata import cluster_metadata

_metadata = functools.partial(cluster_metadata, host="h", port_base=0)  # broker b at "h:b"


class _Home:
    """The bootstrap broker's service, as far as the state looks at it."""

    address = "h:1"


class _State(RoutedState):
    """A routed service's state with a clock the test moves, and no connections."""

    def __init__(self, md: ClusterMetadata) -> None:
        self.now_s = 100.0
        super().__init__(_Home(), md, bootstrap=["h:1"], request_timeout_s=5.0, clock=lambda: self.now_s)

    def _sources(self) -> list[str]:
        return ["h:1"]


def _run(plan: Plan[Any], answer: Callable[[Any], Any]) -> tuple[Any, list[Any]]:
    """Run ``plan`` as a driver would: each effect answered by ``answer(effect)`` (an
    exception it returns is thrown in at the yield). The result and the effects, in order."""
    seen: list[Any] = []
    reply: Any = None
    thrown: BaseException | None = None
    while True:
        try:
            effect = plan.send(reply) if thrown is None else plan.throw(thrown)
        except StopIteration as done:
            return done.value, seen
        seen.append(effect)
        reply, thrown = answer(effect), None
        if isinstance(reply, BaseException):
            reply, thrown = None, reply


def _refreshed(s: _State, table: RoutingTable | None = None) -> RoutingTable:
    """A Refresh's answer, as a driver's refresh leaves the state: ``table`` in use, fresh."""
    s._table = table or s._table
    s._gate.refreshed(s.now_s)
    return s._table


def _info(ends: list[int], config: QueueConfig | None = None, enabled: bool = True) -> QueueInfo:
    return QueueInfo(
        name="q",
        queue_id=1000,
        config=config or QueueConfig(),
        enabled=enabled,
        created_ms=0,
        partitions=[PartitionInfo(p, 0, e) for p, e in enumerate(ends)],
    )


def test_the_doctests_hold():
    for module in (effects, plans):
        assert doctest.testmod(module, optionflags=doctest.ELLIPSIS).failed == 0


def test_describe_asks_every_leader_at_once_and_leaves_one_out_of_reach_out():
    s = _State(_metadata({"q": [1, 2, 3]}))
    answers = {1: _info([5, 0, 0]), 2: _info([0, 7, 0]), 3: UnavailableError("down")}

    def answer(effect):
        assert isinstance(effect, Fanout)
        assert {k: (a, type(b)) for k, (a, b) in effect.asks.items()} == {
            b: (f"h:{b}", m.DescribeQueueRequest) for b in (1, 2, 3)
        }
        return dict(answers)

    info, seen = _run(plans.PLANS["describe_queue"](s, "q"), answer)
    assert [p.end_offset for p in info.partitions] == [5, 7, 0]  # broker 3's partition: broker 1's view
    assert len(seen) == 1 and s._gate.stale  # the broker out of reach makes the table stale


def test_describe_of_a_queue_the_table_does_not_know_refreshes_then_asks_the_bootstrap_broker():
    s = _State(_metadata({}))
    home_answer = QueueNotFoundError("no queue 'new'")

    def answer(effect):
        if isinstance(effect, Refresh):
            assert effect.deadline == s.now_s + s.request_timeout_s
            return _refreshed(s)  # still unknown
        if isinstance(effect, Fanout):
            assert not effect.asks
            return {}
        assert effect == Call(HOME, "describe_queue", ("new",))
        return home_answer

    with pytest.raises(QueueNotFoundError):
        _run(plans.PLANS["describe_queue"](s, "new"), answer)


def test_a_refused_call_refreshes_and_goes_to_the_new_leader():
    s = _State(_metadata({"q": [1]}))
    moved = RoutingTable(_metadata({"q": [2]}))

    def answer(effect):
        if isinstance(effect, Refresh):
            return _refreshed(s, moved)
        return NotLeaderError("moved") if effect.at == "h:1" else 42

    result, seen = _run(plans.PLANS["offset_for_time"](s, "q", 0, 5), answer)
    assert result == 42
    assert [type(e).__name__ for e in seen] == ["Call", "Refresh", "Call"]
    assert [e.at for e in seen if isinstance(e, Call)] == ["h:1", "h:2"]


def test_a_drivers_first_try_counts_as_the_plans_first():
    s = _State(_metadata({"q": [1]}))
    call = Call(HOME, "produce", ("q", 0, b"x"))
    plan = plans.routed(s, m.ApiKey.PRODUCE, "q", 0, call, first=("h:1", OutcomeUnknownError("lost")))
    with pytest.raises(OutcomeUnknownError):  # never sent twice: the driver's error stands
        _run(plan, lambda effect: pytest.fail(f"no effect expected: {effect}"))
    plan = plans.routed(s, m.ApiKey.PRODUCE, "q", 0, call, first=("h:1", NotLeaderError("moved")))
    result, seen = _run(plan, lambda e: _refreshed(s) if isinstance(e, Refresh) else "ok")
    assert result == "ok" and isinstance(seen[0], Refresh) and not s._gate.stale  # refreshed, then sent


def test_a_broker_out_of_reach_is_tried_again_only_for_a_call_safe_to_send_twice():
    s = _State(_metadata({"q": [1]}))
    calls = []

    def answer(effect):
        if isinstance(effect, Refresh):
            return _refreshed(s)
        calls.append(effect)
        return UnavailableError("down")

    with pytest.raises(UnavailableError):
        _run(plans.PLANS["offset_for_time"](s, "q", 0, 5), answer)  # safe: once more, then its error
    assert len(calls) == 2
    calls.clear()
    with pytest.raises(UnavailableError):
        _run(plans.routed(s, m.ApiKey.PRODUCE, "q", 0, Call(HOME, "produce", ())), answer)
    assert len(calls) == 1


def test_an_id_of_a_queue_no_table_knows_goes_to_the_bootstrap_broker():
    s = _State(_metadata({"q": [1, 2]}))
    result, seen = _run(
        plans.PLANS["lookup_id"](s, 77, 0, 3), lambda e: _refreshed(s) if isinstance(e, Refresh) else ("q", b"m")
    )
    assert seen[-1] == Call(HOME, "lookup_id", (77, 0, 3)) and isinstance(seen[0], Refresh)
    delayed = 1 | (1 << 31)  # a delayed id's partition: its leader keeps the schedule
    _, seen = _run(plans.PLANS["cancel_delayed"](s, 1000, delayed, 3), lambda e: None)
    assert seen == [Call("h:2", "cancel_delayed", (1000, delayed, 3))]


def test_a_coordinated_call_follows_its_coordinator_after_a_refusal():
    s = _State(_metadata({}, coordinators=[1]))
    moved = RoutingTable(_metadata({}, coordinators=[3]))

    def answer(effect):
        if isinstance(effect, Refresh):
            return _refreshed(s, moved)
        return NotCoordinatorError("moved") if effect.at == "h:1" else "assigned"

    result, seen = _run(plans.PLANS["describe_group"](s, "billing"), answer)
    assert result == "assigned"
    assert [e.at for e in seen if isinstance(e, Call)] == ["h:1", "h:3"]
    assert seen[-1].method == "describe_group" and seen[-1].args == ("billing",)


def test_a_key_lookup_is_strict_a_broker_out_of_reach_is_its_error():
    s = _State(_metadata({"q": [1, 2]}))
    plan = plans.PLANS["lookup_key"](s, "q", b"k", None, None, 10)
    with pytest.raises(UnavailableError, match="down"):
        _run(plan, lambda e: {1: [], 2: UnavailableError("down")})
    assert s._gate.stale


def test_an_admin_change_marks_the_table_stale_even_when_it_fails():
    s = _State(_metadata({}))
    with pytest.raises(QueueNotFoundError):
        _run(plans.PLANS["delete_queue"](s, "gone"), lambda e: QueueNotFoundError("gone"))
    assert s._gate.stale


def test_alter_polls_until_every_broker_follows_and_gives_up_at_its_deadline():
    s = _State(_metadata({"q": [1, 2]}, brokers=(1, 2)))
    new = QueueConfig(ttl_s=60)
    polls = []

    def answer(effect):
        if isinstance(effect, Call):
            return _info([0, 0], new)
        if isinstance(effect, Sleep):
            s.now_s += effect.seconds
            return None
        polls.append(effect)
        return {1: _info([0, 0], new), 2: _info([0, 0], new if len(polls) > 2 else QueueConfig())}

    info, seen = _run(plans.PLANS["alter_queue"](s, "q", {"ttl_s": 60}), answer)
    assert info.config == new and len(polls) == 3 and sum(isinstance(e, Sleep) for e in seen) == 2
    s2 = _State(_metadata({"q": [1, 2]}, brokers=(1, 2)))

    def never(effect):
        if isinstance(effect, Sleep):
            s2.now_s += 1.0
            return None
        return _info([0, 0], enabled=False) if isinstance(effect, Call) else {1: _info([0, 0], enabled=True)}

    with pytest.raises(UnavailableError, match="not every broker follows"):
        _run(plans.PLANS["set_queue_enabled"](s2, "q", False), never)


def test_delay_stats_of_a_one_broker_cluster_is_that_brokers():
    s = _State(_metadata({}, brokers=(1,)))
    _, seen = _run(plans.PLANS["delay_stats"](s), lambda e: _refreshed(s) if isinstance(e, Refresh) else "stats")
    assert [type(e) for e in seen] == [Refresh, Call] and seen[1] == Call(HOME, "delay_stats")


def test_acks_go_to_each_leases_leader_and_a_moved_partitions_leases_are_refused_as_expired():
    s = _State(_metadata({"q": [1, 2, -1]}))
    ids = ["3e8:0:5:1:m", "3e8:1:6:1:m", "3e8:2:7:1:m"]

    def answer(effect):
        assert {k: (a, b.lease_ids) for k, (a, b) in effect.asks.items()} == {
            "h:1": ("h:1", [ids[0]]),
            "h:2": ("h:2", [ids[1]]),
        }
        return {"h:1": [], "h:2": NotLeaderError("moved")}

    refused, _ = _run(plans.PLANS["shared_ack"](s, "g", "q", "m", ids), answer)
    assert [(r.lease_id, r.code) for r in refused] == [(x, LeaseExpiredError.code) for x in ids[1:]]
    assert s._gate.stale


def test_a_shared_describe_leaves_out_a_leader_that_has_not_served_the_group():
    s = _State(_metadata({"q": [1, 2]}))
    with pytest.raises(GroupNotFoundError):
        _run(plans.PLANS["shared_describe"](s, "g", "q"), lambda e: {a: GroupNotFoundError("g") for a in e.asks})


def test_giving_back_is_best_effort():
    s = _State(_metadata({"q": [1]}))
    held = {("g", "q", "m"): ["3e8:0:5:1:m"]}
    _, seen = _run(plans.give_back(s, held), lambda e: QueueNotFoundError("gone"))
    assert len(seen) == 1 and seen[0].asks["h:1"][1].reason == "released: client closed"
    assert _run(plans.give_back(s, held), lambda e: {"h:1": [LeaseRefusal("x", 1, "y")]})[0] is None


def test_a_refresh_waits_out_the_rate_limit_then_asks_the_live_brokers_first():
    s = _State(_metadata({"q": [1]}))
    s._gate.mark_stale()
    fresh = _metadata({"q": [2]})

    def answer(effect):
        if isinstance(effect, Sleep):
            s.now_s += effect.seconds
            return None
        return UnavailableError("down") if effect.at == "h:1" else fresh

    table, seen = _run(plans.refresh(s, None), answer)
    assert isinstance(seen[0], Sleep) and seen[0].seconds == pytest.approx(0.1)
    assert [e.at for e in seen[1:]] == ["h:1", "h:2"]  # the open one, then the table's others
    assert table.leader("q", 0).broker_id == 2 and not s._gate.stale


def test_install_gives_a_driver_every_operation_with_its_signature():
    class Driver(RoutedState):
        def produce(self, queue: str, partition: int, batch: bytes) -> str:
            return "direct"

    def drive(plan):
        def method(self, *args, **kwargs):
            return _run(plan(self, *args, **kwargs), lambda e: e)[0]

        return method

    plans.install(Driver, drive)
    d = Driver(_Home(), _metadata({"q": [1]}), bootstrap=["h:1"])
    assert d.produce("q", 0, b"") == "direct"  # its own: left alone
    assert d.status() == Call(HOME, "status")  # not routed: the bootstrap broker's
    assert list(inspect.signature(Driver.describe_queue).parameters) == ["self", "name"]
    assert list(inspect.signature(Driver.stream_table).parameters) == ["self", "queue", "fresh"]
    assert Driver.offset_for_time.__qualname__ == "Driver.offset_for_time"


def test_connecting_tries_each_address_in_turn_until_the_deadline():
    now = [0.0]
    opened = []

    def answer(effect):
        if isinstance(effect, Sleep):
            now[0] += effect.seconds
            return None
        opened.append(effect)
        now[0] += 0.5
        return ConnectionRefusedError("refused") if effect.address == "a:1" else UnavailableError("no answer")

    with pytest.raises(UnavailableError, match=r"cannot reach any broker of a:1,b:2 within 3.0 s \(a:1: refused; b:2"):
        _run(plans.first_that_answers(["a:1", "b:2"], 3.0, lambda: now[0]), answer)
    assert [o.address for o in opened[:4]] == ["a:1", "b:2", "a:1", "b:2"]
    assert all(o.probe_s is not None and o.probe_s <= 1.0 for o in opened)
    service, seen = _run(plans.first_that_answers(["only:1"], 3.0), lambda e: "service")
    assert service == "service" and seen == [Open("only:1", 3.0, None)]  # one address: no probe, the whole time
