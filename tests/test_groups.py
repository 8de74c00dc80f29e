"""Consumer groups: assignment strategies, the coordinator's state machine (a seeded
simulation checking invariants after every step), the client in all three modes, the CLI,
and members in separate processes on a real broker process (slow)."""

from __future__ import annotations

import contextlib
import json
import os
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import headwater
from headwater.broker.membership import Membership
from headwater.errors import (
    GroupNotEmptyError,
    GroupNotFoundError,
    InvalidArgumentError,
    PartitionNotAssignedError,
    QueueNotFoundError,
    StaleGenerationError,
    UnknownMemberError,
)
from headwater.model.assignment import assign_average, assign_sticky, sticky_moves_lower_bound
from headwater.model.groups import TRANSITIONS, Event, GroupState, HandedOffGroup
from tests.support.broker_process import BrokerProcess, free_port, kill_all
from tests.support.cluster import eventually
from tests.support.waiting import poll_until

# strategies --------------------------------------------------------------------------------


def parts(target, member):
    return sorted(p for _, p in target[member])


def test_average_is_equeues_allocation():
    # EQueue's examples: 4 queues to 4, 2 and 3 consumers
    four = {m: {"t"} for m in "abcd"}
    assert [parts(assign_average(four, {"t": 4}), m) for m in "abcd"] == [[0], [1], [2], [3]]
    two = {m: {"t"} for m in "ab"}
    assert [parts(assign_average(two, {"t": 4}), m) for m in "ab"] == [[0, 1], [2, 3]]
    three = {m: {"t"} for m in "abc"}
    assert [parts(assign_average(three, {"t": 4}), m) for m in "abc"] == [[0, 1], [2], [3]]
    # more members than partitions: the last ones get nothing
    many = {m: {"t"} for m in "abcdef"}
    assert [len(assign_average(many, {"t": 4})[m]) for m in "abcdef"] == [1, 1, 1, 1, 0, 0]


def test_average_ignores_the_previous_assignment_and_sticky_does_not():
    before = {"a": {("t", p) for p in range(4)}, "b": {("t", p) for p in range(4, 8)}}
    members = {m: {"t"} for m in "abc"}
    avg = assign_average(members, {"t": 8}, before)
    sticky = assign_sticky(members, {"t": 8}, before)
    moved = lambda t: sum(len(before[m] - t[m]) for m in before)  # noqa: E731
    assert moved(sticky) == 2 == sticky_moves_lower_bound(members, {"t": 8}, before)
    assert moved(avg) > moved(sticky)
    assert sorted(len(t) for t in sticky.values()) == [2, 3, 3]


def test_sticky_moves_only_the_departed_members_partitions():
    members = {m: {"t"} for m in "abcd"}
    before = assign_sticky(members, {"t": 12})
    del members["b"]
    after = assign_sticky(members, {"t": 12}, before)
    for m in "acd":
        assert before[m] <= after[m]
    assert set().union(*after.values()) == {("t", p) for p in range(12)}


def test_strategies_respect_subscriptions():
    members = {"a": {"x"}, "b": {"x", "y"}, "c": {"y"}}
    for strategy in (assign_average, assign_sticky):
        t = strategy(members, {"x": 3, "y": 2, "z": 5}, {})
        assert all(q == "x" for q, _ in t["a"]) and all(q == "y" for q, _ in t["c"])
        assert set().union(*t.values()) == {("x", 0), ("x", 1), ("x", 2), ("y", 0), ("y", 1)}


@settings(max_examples=150, deadline=None)
@given(
    subs=st.lists(st.sets(st.sampled_from("xyz"), min_size=1), min_size=1, max_size=7),
    counts=st.fixed_dictionaries({q: st.integers(0, 9) for q in "xyz"}),
    churn=st.lists(st.tuples(st.booleans(), st.sets(st.sampled_from("xyz"), min_size=1)), max_size=4),
)
def test_both_strategies_cover_and_balance_and_sticky_is_minimal(subs, counts, churn):
    members = {f"m{i}": s for i, s in enumerate(subs)}
    prev = {m: set() for m in members}
    serial = len(members)
    for leave, new_subs in [(False, None), *churn]:
        if new_subs is not None:
            if leave and len(members) > 1:
                members.pop(sorted(members)[0])
            else:
                members[f"m{serial}"] = new_subs
                serial += 1
        for strategy in (assign_average, assign_sticky):
            t = strategy(members, counts, prev)
            assert set(t) == set(members)
            owned = [tp for m in t for tp in t[m]]
            wanted = {(q, p) for q in set().union(*members.values()) for p in range(counts[q])}
            assert len(owned) == len(set(owned)) and set(owned) == wanted
            for m, tps in t.items():
                assert all(q in members[m] for q, _ in tps)
            for q in "xyz":
                readers = [m for m in members if q in members[m]]
                if readers and counts[q]:
                    sizes = {sum(1 for qq, _ in t[m] if qq == q) for m in readers}
                    assert max(sizes) - min(sizes) <= 1
        sticky = assign_sticky(members, counts, prev)
        kept_prev = {
            m: {tp for tp in prev.get(m, ()) if tp[0] in members[m] and tp[1] < counts[tp[0]]} for m in members
        }
        moved = sum(len(kept_prev[m] - sticky[m]) for m in members)
        assert moved == sticky_moves_lower_bound(members, counts, prev)
        prev = sticky


@pytest.mark.parametrize("name", ["headwater.model.assignment", "headwater.client.sync.group_consumer"])
def test_docstring_examples(name):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0


# the state machine ---------------------------------------------------------------------------


def test_the_transition_table_covers_every_reachable_pair():
    for state in GroupState:
        for event in Event:
            if state is GroupState.EMPTY and event in (Event.EXPIRE, Event.RESIZE):
                continue  # an empty group has no member to expire or subscription to resize
            assert (state, event) in TRANSITIONS, (state, event)


def test_after_a_restart_groups_with_offsets_wait_before_granting():
    ms = Membership(lambda q: 2, incarnation="r")
    ms.hold_grants(["old"], until_ms=3000)
    a = ms.join(
        "old",
        member_id=None,
        client_id="c",
        queues=["q"],
        mode="clustering",
        strategy="sticky",
        session_timeout_ms=10_000,
        now_ms=0,
    )
    assert a.assignment == {} and a.pending  # members from before the restart may still read
    assert ms.heartbeat("old", a.member_id, a.generation, 2999).assignment == {}
    assert ms.heartbeat("old", a.member_id, a.generation, 3000).assignment == {"q": [0, 1]}
    new = ms.join(
        "new",
        member_id=None,
        client_id="c",
        queues=["q"],
        mode="clustering",
        strategy="sticky",
        session_timeout_ms=10_000,
        now_ms=0,
    )
    assert new.assignment == {"q": [0, 1]}  # a group nobody had before is not held back


def test_a_group_handed_to_a_new_coordinator_goes_on_without_joining_again():
    old = Membership(lambda q: 4, incarnation="old")
    kw = dict(client_id="c", queues=["q"], mode="clustering", strategy="sticky", session_timeout_ms=10_000)
    a = old.join("g", member_id=None, now_ms=0, **kw)
    b = old.join("g", member_id=None, now_ms=0, **kw)
    a = old.heartbeat("g", a.member_id, b.generation, 10)  # gives up what b is to take
    b = old.heartbeat("g", b.member_id, b.generation, 20)
    old.join("other", member_id=None, now_ms=0, **kw)
    old.hold_grants(["held"], until_ms=3000)
    old.join("held", member_id=None, now_ms=0, **kw)
    handed = old.hand_off(["g", "held", "gone"], now_ms=1000)
    assert [h.name for h in handed] == ["g", "held"]  # asked for, and with members
    new = Membership(lambda q: 4, incarnation="new")
    new.adopt(handed, now_ms=50_000)  # the new broker's clock
    assert new.snapshot("g")["holder"] == old.snapshot("g")["holder"]
    again = new.heartbeat("g", a.member_id, b.generation, 50_010)
    assert (again.generation, again.assignment) == (b.generation, a.assignment) and not again.pending
    new.check_commit("g", b.member_id, b.generation, "q", b.assignment["q"], 50_020)  # its partitions, still
    with pytest.raises(PartitionNotAssignedError):
        new.check_commit("g", b.member_id, b.generation, "q", a.assignment["q"], 50_020)
    held = new.join("held", member_id=None, now_ms=51_000, **kw)
    assert held.assignment == {} and held.pending  # its grants are held as long as they were there
    assert new.heartbeat("held", held.member_id, held.generation, 51_999).assignment == {}
    assert new.heartbeat("held", held.member_id, held.generation, 52_000).assignment == {"q": [2, 3]}
    c = new.join("g", member_id=None, now_ms=50_100, **kw)
    assert c.generation > b.generation  # a generation is never reused
    assert new.live_members("g", 50_000 + 10_001) == 2  # b's session began at the adoption: it never beat
    new.adopt([], now_ms=60_000)  # nothing handed: what is here stays
    assert "other" not in new.groups() and "held" in new.groups()


class Sim:
    """A coordinator (the model's state machine) and members that behave like the client: a
    heartbeat (the client's background thread) records the answer, a poll (the application's
    thread, later) applies it: the member then reads what the answer listed, and its next
    heartbeat acknowledges that generation."""

    TIMEOUT_MS = 3000

    def __init__(self, rng: random.Random, strategy: str) -> None:
        self.rng = rng
        self.strategy = strategy
        self.counts = {"a": rng.randint(1, 8), "b": rng.randint(1, 5), "c": 1}
        self.ms = Membership(lambda q: self.counts.get(q, 0), incarnation="sim")
        self.now = 0.0
        self.members: dict[str, dict] = {}  # id -> {"queues", "view", "applied", "state"}
        self.last_generation = 0
        self.moves = 0

    def move(self) -> None:
        """The coordinator moves: the group's membership is handed off, encoded as on the wire,
        to a new coordinator (another incarnation, its generation counter behind), which the
        members go on with as they were; only their sessions begin again."""
        before = self.snap()
        wire = msgspec.msgpack.encode(self.ms.hand_off(["g", "none"], self.now))
        self.moves += 1
        self.ms = Membership(lambda q: self.counts.get(q, 0), incarnation=f"moved{self.moves}")
        self.ms.adopt(msgspec.msgpack.decode(wire, type=list[HandedOffGroup]), self.now)
        after = self.snap()
        if before is None:  # nobody in it: nothing handed, and it begins anew there, as after a restart
            assert after is None
            self.last_generation = 0
            return
        assert after is not None
        drop = [{k: v for k, v in s.items() if k != "members"} for s in (before, after)]
        assert drop[0] == drop[1], "the hand-off changed the group"
        for mid, (queues, target, held, acked, deadline) in after["members"].items():
            assert before["members"][mid][:4] == (queues, target, held, acked)
            assert deadline == self.now + self.TIMEOUT_MS

    def snap(self):
        return self.ms.snapshot("g")

    def generation(self) -> int:
        s = self.snap()
        return 0 if s is None else s["generation"]

    def apply(self, mid, answer) -> None:
        m = self.members[mid]
        m["view"] = {(q, p) for q, ps in answer.assignment.items() for p in ps}
        m["applied"] = answer.generation

    def join(self) -> str:
        queues = self.rng.choice([["a"], ["a", "b"], ["b"], ["a", "b", "c"], ["c"]])
        answer = self.ms.join(
            "g",
            member_id=None,
            client_id="sim",
            queues=queues,
            mode="clustering",
            strategy=self.strategy,
            session_timeout_ms=self.TIMEOUT_MS,
            now_ms=self.now,
        )
        self.members[answer.member_id] = {
            "queues": set(queues),
            "view": set(),
            "applied": 0,
            "state": "live",
            "update": None,
        }
        self.apply(answer.member_id, answer)
        return answer.member_id

    def beat(self, mid) -> None:
        try:
            self.members[mid]["update"] = self.ms.heartbeat("g", mid, self.members[mid]["applied"], self.now)
        except UnknownMemberError:
            self.members.pop(mid)  # removed while paused: it drops everything (and may join again)

    def poll(self, mid) -> None:
        m = self.members[mid]
        if m["update"] is not None:
            self.apply(mid, m["update"])
            m["update"] = None

    def live(self):
        return [mid for mid, m in self.members.items() if m["state"] == "live"]

    def tick(self, ms: float) -> None:
        """Time passes in steps shorter than a session; live members heartbeat in each."""
        while ms > 0:
            step = min(ms, self.TIMEOUT_MS / 3)
            self.now += step
            ms -= step
            for mid in self.live():
                self.beat(mid)
            for mid in self.live():
                if self.rng.random() < 0.5:  # some applications are busy for a while
                    self.poll(mid)

    def settle(self) -> None:
        """Let crashed and paused members expire and the rest heartbeat until nothing moves."""
        if any(m["state"] != "live" for m in self.members.values()):
            self.tick(self.TIMEOUT_MS * 1.5)
            self.ms.expire(self.now, "g")
            for mid in [k for k, m in self.members.items() if m["state"] == "crashed"]:
                self.members.pop(mid)
        for _ in range(10):
            for mid in self.live():
                self.beat(mid)
            for mid in self.live():
                self.poll(mid)
            s = self.snap()
            if s is None or all(
                set(t) == set(h) == self.members[mid]["view"]
                and mid in self.members
                and self.members[mid]["applied"] == s["generation"]
                for mid, (_, t, h, _, _) in s["members"].items()
            ):
                return
        raise AssertionError("the group did not settle in 10 rounds of heartbeats")


def check_safety(sim: Sim) -> None:
    s = sim.snap()
    if s is None:
        assert not sim.live() or all(not m["view"] for m in sim.members.values())
        return
    held = {mid: set(h) for mid, (_, _, h, _, _) in s["members"].items()}
    flat = [tp for h in held.values() for tp in h]
    assert len(flat) == len(set(flat)), "a partition is held by two members"
    assert {tp: mid for mid, h in held.items() for tp in h} == s["holder"]
    for mid in sim.live():  # a live member reads only what it holds
        assert sim.members[mid]["view"] <= held.get(mid, set()), mid
    assert s["generation"] >= sim.last_generation, "the generation went back"
    sim.last_generation = s["generation"]


def check_settled(sim: Sim) -> None:
    s = sim.snap()
    if s is None:
        return
    members = {mid: q for mid, (q, _, _, _, _) in s["members"].items()}
    holder = s["holder"]
    for q in set().union(*members.values()):
        for p in range(sim.counts[q]):
            mid = holder.get((q, p))
            assert mid is not None and q in members[mid], f"{q}[{p}] is not read after settling"
    for mid, (_, target, held, _, _) in s["members"].items():
        assert target == held and sim.members[mid]["view"] == set(held)
    for q in set().union(*members.values()):
        readers = [mid for mid in members if q in members[mid]]
        sizes = [sum(1 for tp in sim.members[mid]["view"] if tp[0] == q) for mid in readers]
        assert max(sizes) - min(sizes) <= 1, f"{q} is not balanced: {sizes}"


def check_sticky(sim: Sim, before, after) -> None:
    """The rebalance between two snapshots moved no more partitions than it had to."""
    if sim.strategy != "sticky" or before is None or after is None:
        return
    members = {mid: q for mid, (q, _, _, _, _) in after["members"].items()}
    prev = {mid: set(t) for mid, (_, t, _, _, _) in before["members"].items() if mid in members}
    counts = after["counts"]
    kept = {
        mid: {tp for tp in prev.get(mid, ()) if tp[0] in members[mid] and tp[1] < counts.get(tp[0], 0)}
        for mid in members
    }
    moved = sum(len(kept[mid] - set(after["members"][mid][1])) for mid in members)
    assert moved == sticky_moves_lower_bound(members, counts, prev), "sticky moved more than it had to"


def commit_case(sim: Sim) -> None:
    """A commit from a random member, with the current or a stale generation, of partitions it
    holds or not; the coordinator's verdict must match the rule, and a refusal changes nothing."""
    rng = sim.rng
    sim.ms.expire(sim.now, "g")  # (a commit expires members whose session ran out, first)
    s = sim.snap()
    ids = list(sim.members) + ["nobody-sim-0"]
    mid = rng.choice(ids)
    gen = sim.generation()
    generation = rng.choice([gen, gen, max(0, gen - rng.randint(1, 3)), sim.members.get(mid, {}).get("applied", 0)])
    queue = rng.choice("abc")
    held = set(s["members"][mid][2]) if s and mid in s["members"] else set()
    candidates = [p for q, p in held if q == queue] or [0]
    chosen = rng.sample(candidates, k=min(len(candidates), rng.randint(1, 2)))
    if rng.random() < 0.2:
        chosen.append(sim.counts[queue] - 1)
    before = sim.snap()
    if s is None or mid not in s["members"]:
        expected = UnknownMemberError
    elif generation != s["generation"]:
        expected = StaleGenerationError
    elif not all((queue, p) in held for p in chosen):
        expected = PartitionNotAssignedError
    else:
        expected = None
    if expected is None:
        sim.ms.check_commit("g", mid, generation, queue, chosen, sim.now)
    else:
        with pytest.raises(expected):
            sim.ms.check_commit("g", mid, generation, queue, chosen, sim.now)
        assert sim.snap() == before, "a refused commit changed the group"
    if s is not None and s["members"]:
        with pytest.raises(GroupNotEmptyError):
            sim.ms.check_commit("g", None, None, queue, [0], sim.now)


SEEDS = [int(os.environ["HEADWATER_GROUP_SEED"])] if "HEADWATER_GROUP_SEED" in os.environ else range(60)


@pytest.mark.parametrize("seed", SEEDS)
def test_seeded_simulation_of_the_coordinator(seed):
    print(f"seed {seed} (re-run with HEADWATER_GROUP_SEED={seed})")
    rng = random.Random(seed)
    sim = Sim(rng, rng.choice(["average", "sticky"]))
    ops = [
        "join",
        "join",
        "leave",
        "crash",
        "pause",
        "resume",
        "beat",
        "beat",
        "poll",
        "poll",
        "tick",
        "commit",
        "commit",
        "resize",
        "settle",
        "bad",
        "move",
    ]
    for step in range(250):
        op = rng.choice(ops)
        before = sim.snap()
        gen_before = sim.generation()
        try:
            if op == "join" and len(sim.members) < 8:
                sim.join()
                assert sim.generation() > gen_before
            elif op == "leave" and sim.live():
                mid = rng.choice(sim.live())
                sim.ms.leave("g", mid, sim.now)
                sim.members.pop(mid)
                assert sim.generation() > gen_before or sim.snap() is None
            elif op == "crash" and sim.live():
                sim.members[rng.choice(sim.live())]["state"] = "crashed"  # never heartbeats again
            elif op == "pause" and sim.live():
                sim.members[rng.choice(sim.live())]["state"] = "paused"
            elif op == "resume":
                paused = [k for k, m in sim.members.items() if m["state"] == "paused"]
                if paused:
                    mid = rng.choice(paused)
                    m = sim.members[mid]
                    # a member paused past its session timeout first tries to commit what it read
                    if before is None or mid not in before["members"] or before["members"][mid][4] < sim.now:
                        for q, p in sorted(m["view"])[:1]:
                            with pytest.raises(UnknownMemberError):
                                sim.ms.check_commit("g", mid, m["applied"], q, [p], sim.now)
                    m["state"] = "live"
                    sim.beat(mid)
            elif op == "beat" and sim.live():
                sim.beat(rng.choice(sim.live()))
            elif op == "poll" and sim.live():
                sim.poll(rng.choice(sim.live()))
            elif op == "tick":
                sim.tick(rng.uniform(0, sim.TIMEOUT_MS * 1.2))
            elif op == "commit":
                commit_case(sim)
            elif op == "resize":
                q = rng.choice("ab")
                sim.counts[q] += rng.randint(1, 3)
                if sim.live():
                    sim.beat(rng.choice(sim.live()))
            elif op == "settle":
                sim.settle()
                check_settled(sim)
            elif op == "move":
                sim.move()
            elif op == "bad":
                sim.ms.expire(sim.now, "g")
                before = sim.snap()
                bad = rng.choice(
                    [
                        dict(strategy="round-robin"),
                        dict(mode="fanout"),
                        dict(queues=["nope"]),
                        dict(session_timeout_ms=5),
                        dict(strategy="average" if sim.strategy == "sticky" else "sticky"),
                    ]
                )
                if bad.get("strategy") in ("average", "sticky") and sim.snap() is None:
                    continue  # an empty group takes any strategy
                kw = dict(
                    member_id=None,
                    client_id="bad",
                    queues=["a"],
                    mode="clustering",
                    strategy=sim.strategy,
                    session_timeout_ms=sim.TIMEOUT_MS,
                    now_ms=sim.now,
                )
                kw.update(bad)
                with pytest.raises((InvalidArgumentError, QueueNotFoundError)):
                    sim.ms.join("g", **kw)
                assert sim.snap() == before, f"a refused join changed the group: {bad}"
            check_safety(sim)
            after = sim.snap()
            if after is not None and before is not None and after["generation"] == before["generation"] + 1:
                check_sticky(sim, before, after)  # one rebalance in this step
        except AssertionError as e:
            raise AssertionError(f"seed {seed}, step {step} ({op}): {e}") from e
    sim.settle()
    check_settled(sim)
    check_safety(sim)


# the service: the same behaviour embedded, in memory and over TCP -------------------------------


def join(svc, member_id=None, *, queues=("q",), strategy="sticky", mode="clustering", timeout_ms=10_000, group="g"):
    return svc.join_group(group, member_id, "test", list(queues), mode, strategy, timeout_ms)


def test_join_answers_the_assignment_at_once(hw):
    hw.admin.create_queue("q", partitions=4)
    svc = hw.service
    a = join(svc)
    assert a.assignment == {"q": [0, 1, 2, 3]} and not a.pending and a.generation >= 1
    b = join(svc)
    assert b.generation > a.generation and b.assignment == {} and b.pending  # a still holds them
    # a learns the new generation; until it acknowledges it, it keeps what it must give up
    a2 = svc.heartbeat_group("g", a.member_id, a.generation)
    assert a2.generation == b.generation and a2.assignment == {"q": [0, 1]}
    assert svc.heartbeat_group("g", b.member_id, b.generation).assignment == {}
    svc.heartbeat_group("g", a.member_id, a2.generation)  # acknowledged: q[2], q[3] are free
    b2 = svc.heartbeat_group("g", b.member_id, b.generation)
    assert b2.assignment == {"q": [2, 3]} and not b2.pending
    d = svc.describe_group("g")
    assert d.state == "stable" and d.mode == "clustering" and d.strategy == "sticky"
    assert {m.member_id: m.assignment for m in d.members} == {a.member_id: {"q": [0, 1]}, b.member_id: {"q": [2, 3]}}
    svc.leave_group("g", a.member_id)
    b3 = svc.heartbeat_group("g", b.member_id, b2.generation)
    assert b3.assignment == {"q": [0, 1, 2, 3]} and b3.generation > b2.generation
    [summary] = svc.list_groups()
    assert (summary.group, summary.members, summary.queues) == ("g", 1, ["q"])
    svc.leave_group("g", b.member_id)  # tidy: a cluster run waits for members left behind


def test_commits_from_stale_generations_or_strangers_are_refused(hw):
    hw.admin.create_queue("q", partitions=2)
    hw.send_batch("q", [b"x"] * 10, partition=0)
    svc = hw.service
    a = join(svc)
    svc.commit_offsets("g", "q", {0: 3}, member_id=a.member_id, generation=a.generation)
    b = join(svc)
    before = svc.describe_group("g")
    with pytest.raises(StaleGenerationError, match="stale"):
        svc.commit_offsets("g", "q", {0: 5}, member_id=a.member_id, generation=a.generation)
    with pytest.raises(UnknownMemberError):
        svc.commit_offsets("g", "q", {0: 5}, member_id="someone-else", generation=b.generation)
    with pytest.raises(PartitionNotAssignedError):  # b holds nothing yet
        svc.commit_offsets("g", "q", {0: 5}, member_id=b.member_id, generation=b.generation)
    with pytest.raises(GroupNotEmptyError):  # a plain commit (reset) while members are there
        svc.commit_offsets("g", "q", {0: 0})
    # bad offsets: a clear error, and nothing changes (on a cluster the log is checked only by
    # a coordinator that also leads the partition: docs/cluster.md, "Consumer groups")
    if not hw.admin.cluster_metadata().cluster_id:
        with pytest.raises(InvalidArgumentError, match="beyond the log end"):
            svc.commit_offsets("g", "q", {0: 11}, member_id=a.member_id, generation=b.generation)
    after = svc.describe_group("g")
    assert svc.fetch_offsets("g", "q") == {0: 3}
    assert [m.member_id for m in after.members] == [m.member_id for m in before.members]
    assert after.generation == before.generation
    # a with the current generation: it still holds q[0] until it acknowledges
    svc.commit_offsets("g", "q", {0: 5}, member_id=a.member_id, generation=b.generation)
    assert svc.fetch_offsets("g", "q") == {0: 5}
    for m in (a, b):
        svc.leave_group("g", m.member_id)
    svc.commit_offsets("g", "q", {0: 0})  # no members: resets are allowed
    assert svc.describe_group("g").offsets == {"q": {0: 0}}


def test_bad_joins_are_refused_and_change_nothing(hw):
    hw.admin.create_queue("q", partitions=2)
    svc = hw.service
    a = join(svc, strategy="average")
    before = svc.describe_group("g")
    with pytest.raises(InvalidArgumentError, match="unknown assignment strategy 'fair'"):
        join(svc, strategy="fair")
    with pytest.raises(InvalidArgumentError, match="unknown group mode"):
        join(svc, mode="fanout")
    with pytest.raises(InvalidArgumentError, match="strategy 'average'"):
        join(svc, strategy="sticky")
    with pytest.raises(InvalidArgumentError, match="clustering group"):
        join(svc, mode="broadcast")
    with pytest.raises(QueueNotFoundError):
        join(svc, queues=["q", "missing"])
    with pytest.raises(InvalidArgumentError, match="session_timeout_ms"):
        join(svc, timeout_ms=0)
    with pytest.raises(InvalidArgumentError, match="invalid group name"):
        join(svc, group="no spaces")
    with pytest.raises(InvalidArgumentError, match="never one of"):
        svc.heartbeat_group("g", a.member_id, a.generation + 100)
    after = svc.describe_group("g")
    assert after.generation == before.generation and len(after.members) == 1
    with pytest.raises(GroupNotFoundError):
        svc.describe_group("nobody")
    svc.leave_group("g", a.member_id)


def test_members_that_stop_heartbeating_are_removed(hw, clock):
    clock.advance(0)  # a cluster's brokers run on the wall clock: skip before anyone joins
    hw.admin.create_queue("q", partitions=4)
    svc = hw.service
    a = join(svc, timeout_ms=1000)
    b = join(svc, timeout_ms=5000)
    clock.advance(0.6)
    svc.heartbeat_group("g", b.member_id, b.generation)
    clock.advance(0.6)  # a: 1.2 s without a heartbeat
    got = svc.heartbeat_group("g", b.member_id, b.generation)
    assert got.assignment == {"q": [0, 1, 2, 3]} and got.generation > b.generation
    with pytest.raises(UnknownMemberError, match="join again"):
        svc.heartbeat_group("g", a.member_id, a.generation)
    with pytest.raises(UnknownMemberError):  # a paused member cannot overwrite progress
        svc.commit_offsets("g", "q", {0: 0}, member_id=a.member_id, generation=got.generation)


def test_broadcast_members_each_get_everything(hw):
    hw.admin.create_queue("q", partitions=3)
    svc = hw.service
    a = join(svc, mode="broadcast")
    b = join(svc, mode="broadcast")
    assert a.assignment == b.assignment == {"q": [0, 1, 2]}
    with pytest.raises(InvalidArgumentError, match="broadcast group"):
        svc.commit_offsets("g", "q", {0: 0}, member_id=a.member_id, generation=b.generation)
    hw.admin.add_partitions("q", 4)
    time.sleep(1.1)  # the broker caches partition counts for a second
    assert svc.heartbeat_group("g", a.member_id, b.generation).assignment == {"q": [0, 1, 2, 3]}
    assert svc.describe_group("g").mode == "broadcast"
    for m in (a, b):
        svc.leave_group("g", m.member_id)


def test_simple_consumers_keep_working_beside_groups(hw):
    hw.admin.create_queue("q", partitions=2)
    hw.send_batch("q", [b"a", b"b"], partition=1)
    c = hw.consumer(group="plain")
    c.assign("q")
    assert len(c.poll(timeout_ms=500)) == 2
    c.commit()
    assert hw.service.describe_group("plain").offsets == {"q": {0: 0, 1: 2}}
    assert [g.group for g in hw.service.list_groups()] == ["plain"]
    with pytest.raises(InvalidArgumentError, match="need subscribe"):
        hw.consumer(group="plain", strategy="sticky")
    c.close()


def test_list_groups_shows_keyed_and_shared_groups_of_the_queues_that_exist(hw, clock):
    """Every kind is listed: clustering groups by name, then a line per keyed and shared
    group and queue; a deleted queue's keyed and shared groups are not."""
    hw.admin.create_queue("q", partitions=2)
    hw.admin.create_queue("other")
    hw.send_batch("q", [b"a", b"b"], partition=0)
    hw.send("other", b"c", partition=0)
    c = hw.consumer(group="plain")
    c.assign("q")
    assert len(c.poll(timeout_ms=500)) == 2
    c.commit()
    c.close()
    svc = hw.service
    svc.keyed_group("q", "by-user", "key", 3)
    held = svc.shared_receive("workers", "q", "m1", 1, 30_000)
    assert len(held.leases) == 1
    done = svc.shared_receive("workers", "other", "m2", 1, 30_000)
    assert svc.shared_ack("workers", "other", "m2", [lease.lease_id for lease in done.leases]) == []
    rows = [(g.group, g.mode or "clustering", g.state, g.members, g.queues) for g in svc.list_groups()]
    assert ("plain", "clustering", "empty", 0, ["q"]) in rows
    assert ("by-user", "keyed", "stable", 3, ["q"]) in rows
    assert ("workers", "shared", "stable", 1, ["q"]) in rows  # m1 holds a lease
    assert ("workers", "shared", "empty", 0, ["other"]) in rows  # nothing leased there now
    assert len(rows) == 4
    clock.advance(31)  # m1's lease runs out: nobody holds one
    assert ("workers", "shared", "empty", 0, ["q"]) in [
        (g.group, g.mode, g.state, g.members, g.queues) for g in svc.list_groups()
    ]
    hw.admin.delete_queue("q")
    assert [(g.group, g.mode, g.queues) for g in svc.list_groups()] == [("workers", "shared", ["other"])]


# the client ------------------------------------------------------------------------------------


def drain(consumers, want, timeout_s=10.0):
    """Poll every consumer in turn (committing) until ``want`` records came in; by consumer."""
    got = {id(c): [] for c in consumers}
    deadline = time.monotonic() + timeout_s
    while sum(map(len, got.values())) < want and time.monotonic() < deadline:
        for c in consumers:
            recs = c.poll(timeout_ms=50)
            got[id(c)].extend(recs)
            if recs:
                c.commit()
    return [got[id(c)] for c in consumers]


def test_clustering_members_share_the_work_once_each_in_order(hw):
    hw.admin.create_queue("q", partitions=6)
    for p in range(6):
        hw.send_batch("q", [f"{p}-{i}".encode() for i in range(30)], partition=p)
    events = []
    settings = dict(group="g", subscribe="q", strategy="sticky", session_timeout_ms=5000, heartbeat_interval_ms=50)
    a = hw.consumer(
        **settings, on_assign=lambda tps: events.append(("a+", tps)), on_revoke=lambda tps: events.append(("a-", tps))
    )
    first = a.poll(max_messages=20, timeout_ms=1000)
    a.commit()
    b = hw.consumer(**settings, on_assign=lambda tps: events.append(("b+", tps)))
    got_a, got_b = drain([a, b], 180 - len(first))
    got_a = first + got_a
    assert sorted((r.partition, r.offset) for r in got_a + got_b) == [(p, o) for p in range(6) for o in range(30)]
    for recs in (got_a, got_b):
        for p in range(6):
            offs = [r.offset for r in recs if r.partition == p]
            assert offs == sorted(offs)
    deadline = time.monotonic() + 5
    while len(b.assignment()) < 3 and time.monotonic() < deadline:
        assert a.poll(timeout_ms=20) == [] and b.poll(timeout_ms=20) == []
    assert sorted(a.assignment() + b.assignment()) == [("q", p) for p in range(6)]
    assert len(a.assignment()) == len(b.assignment()) == 3
    assert ("a-", b.assignment()) in events and ("b+", b.assignment()) in events
    assert hw.service.fetch_offsets("g", "q") == {p: 30 for p in range(6)}
    a.close()
    deadline = time.monotonic() + 5
    while len(b.assignment()) < 6 and time.monotonic() < deadline:
        b.poll(timeout_ms=50)
    assert len(b.assignment()) == 6
    b.close()
    assert hw.service.describe_group("g").members == []


def test_a_queue_made_again_with_fewer_partitions_is_assigned_as_it_is_now(hw):
    """The coordinator caches partition counts for a second; a queue deleted and made again
    within it kept its old count, and a member was assigned partitions it did not have (found
    by the contract tests on a cluster, where tests reuse one broker's groups)."""
    hw.admin.create_queue("q", partitions=6)
    with hw.consumer(group="g", subscribe=["q"]) as c:
        c.poll(timeout_ms=100)
        assert len(c.assignment()) == 6
    hw.admin.delete_queue("q")
    hw.admin.create_queue("q", partitions=2)
    hw.send_batch("q", [b"a", b"b"], partition=1)
    with hw.consumer(group="g", subscribe=["q"]) as c:
        got = c.poll(timeout_ms=300)
        assert sorted(c.assignment()) == [("q", 0), ("q", 1)]  # not six, from the count of before
        deadline = time.monotonic() + 10
        while len(got) < 2 and time.monotonic() < deadline:
            got += c.poll(timeout_ms=100)
        assert [r.body for r in got] == [b"a", b"b"]


def test_a_new_member_resumes_from_committed_offsets(hw):
    hw.admin.create_queue("q", partitions=2)
    hw.send_batch("q", [b"%d" % i for i in range(10)], partition=0)
    with hw.consumer(group="g", subscribe=["q"]) as c:
        assert len(c.poll(max_messages=4, timeout_ms=1000)) == 4
        c.commit()
        c.poll(max_messages=3, timeout_ms=1000)  # polled, and committed by close()
    with hw.consumer(group="g", subscribe=["q"]) as c:
        assert c.position("q", 0) == 7
        assert [r.offset for r in c.poll(timeout_ms=1000)] == [7, 8, 9]
        assert c.committed("q", 0) == 7


def test_leaving_with_an_exception_does_not_commit(hw):
    hw.admin.create_queue("q")
    hw.send_batch("q", [b"a", b"b", b"c"], partition=0)
    with pytest.raises(RuntimeError):
        with hw.consumer(group="g", subscribe="q") as c:
            for r in c:
                raise RuntimeError("handler failed on " + r.body.decode())
    assert hw.service.fetch_offsets("g", "q") == {}


def test_broadcast_members_read_everything_and_keep_offsets_in_a_file(hw, tmp_path):
    hw.admin.create_queue("q", partitions=3)
    for p in range(3):
        hw.send_batch("q", [f"{p}-{i}".encode() for i in range(5)], partition=p)
    paths = [tmp_path / "a.offsets", tmp_path / "b.offsets"]
    members = [hw.consumer(group="bc", subscribe="q", mode="broadcast", offsets_path=p) for p in paths]
    for got in drain(members, 30):
        assert sorted((r.partition, r.offset) for r in got) == [(p, o) for p in range(3) for o in range(5)]
    for c in members:
        c.close()
    doc = json.loads(paths[0].read_text())
    assert doc["group"] == "bc" and doc["queues"]["q"]["offsets"] == {"0": 5, "1": 5, "2": 5}
    assert not list(tmp_path.glob(".*.tmp"))  # written through a temporary file, renamed
    hw.send_batch("q", [b"new"], partition=1)
    with hw.consumer(group="bc", subscribe="q", mode="broadcast", offsets_path=paths[0]) as c:
        assert [r.body for r in c.poll(timeout_ms=1000)] == [b"new"]
        assert c.committed("q", 1) == 5
    assert hw.service.fetch_offsets("bc", "q") == {}  # nothing on the broker
    (tmp_path / "bad.offsets").write_text("{not json")
    with pytest.raises(InvalidArgumentError, match="not a Headwater offsets file"):
        hw.consumer(group="bc", subscribe="q", mode="broadcast", offsets_path=tmp_path / "bad.offsets")


def test_client_side_bad_input(hw):
    hw.admin.create_queue("q")
    with pytest.raises(InvalidArgumentError, match="unknown assignment strategy"):
        hw.consumer(group="g", subscribe="q", strategy="round-robin")
    with pytest.raises(InvalidArgumentError, match="name its group"):
        hw.consumer(subscribe="q")
    with pytest.raises(InvalidArgumentError, match="offsets_path is for broadcast"):
        hw.consumer(group="g", subscribe="q", offsets_path="x.json")
    with pytest.raises(InvalidArgumentError, match="heartbeat_interval_ms"):
        hw.consumer(group="g", subscribe="q", session_timeout_ms=1000, heartbeat_interval_ms=1000)
    with pytest.raises(GroupNotFoundError):
        hw.service.describe_group("g")  # nothing was left behind
    with hw.consumer(group="g", subscribe="q") as c:
        with pytest.raises(InvalidArgumentError, match="come from its group"):
            c.assign("q")


def test_heartbeats_do_not_wait_for_a_slow_handler(tmp_path):
    # a real clock: sessions of 300 ms, a handler that takes a second per record
    with headwater.open(tmp_path / "data") as hw:
        hw.admin.create_queue("q", partitions=2)
        hw.send_batch("q", [b"slow-1", b"slow-2"], partition=0)
        c = hw.consumer(group="g", subscribe="q", session_timeout_ms=300, heartbeat_interval_ms=50)
        member, generation = c.member_id, c.generation
        seen = []
        for r in c.poll(timeout_ms=1000):
            time.sleep(1.0)
            seen.append(r.body)
        c.commit()
        assert seen == [b"slow-1", b"slow-2"]
        assert (c.member_id, c.generation) == (member, generation)
        assert hw.service.fetch_offsets("g", "q") == {0: 2, 1: 0}
        c.close()


def test_a_member_that_stops_polling_leaves_and_rejoins(tmp_path):
    with headwater.open(tmp_path / "data") as hw:
        hw.admin.create_queue("q", partitions=2)
        settings = dict(group="g", subscribe="q", session_timeout_ms=2000, heartbeat_interval_ms=50)
        stuck = hw.consumer(**settings, max_poll_interval_ms=300)
        other = hw.consumer(**settings)
        deadline = time.monotonic() + 5
        while len(other.assignment()) < 2 and time.monotonic() < deadline:
            other.poll(timeout_ms=50)  # stuck never polls: it leaves after 300 ms
        assert other.assignment() == [("q", 0), ("q", 1)]
        old = stuck.member_id
        stuck.poll(timeout_ms=200)  # joins again
        assert stuck.member_id != old
        with pytest.raises(UnknownMemberError):
            hw.service.heartbeat_group("g", old, 0)
        stuck.close()
        other.close()


def test_commit_after_a_rebalance_is_retried_with_the_new_generation(hw):
    hw.admin.create_queue("q", partitions=2)
    hw.send_batch("q", [b"x"] * 4, partition=0)
    settings = dict(group="g", subscribe="q", session_timeout_ms=60_000, heartbeat_interval_ms=30_000)
    a = hw.consumer(**settings)
    assert len(a.poll(timeout_ms=1000)) == 4
    b = hw.consumer(**settings)  # a has not heard of it (its next heartbeat is 30 s away)
    a.commit()  # refused as stale, then retried once a heartbeat told it the new generation
    assert hw.service.fetch_offsets("g", "q")[0] == 4
    b.close()
    a.close()


def test_a_member_closing_just_after_another_left_still_commits(hw):
    """Members shutting down together: a left first, and b closes before a heartbeat told it
    the new generation. b's closing commit is refused as stale; the heartbeat that follows
    (while b is leaving, so nothing is applied) teaches it the generation, and the commit
    lands: b's positions are stored, not read again by the next member."""
    hw.admin.create_queue("q", partitions=2)
    for p in (0, 1):
        hw.send_batch("q", [b"x"] * 4, partition=p)
    settings = dict(group="g", subscribe="q", session_timeout_ms=60_000)
    a = hw.consumer(**settings, heartbeat_interval_ms=100)  # hears of b soon, and hands a partition over
    deadline = time.monotonic() + 10
    read = 0
    while read < 8 and time.monotonic() < deadline:
        read += len(a.poll(timeout_ms=50))
    b = hw.consumer(**settings, heartbeat_interval_ms=30_000)  # once it holds one, beats every 30 s
    while not (a.assignment() and b.assignment()) and time.monotonic() < deadline:
        a.poll(timeout_ms=50)
        b.poll(timeout_ms=50)
    (held,) = b.assignment()
    hw.send_batch("q", [b"y"] * 3, partition=held[1])
    while b.position(*held) < 7 and time.monotonic() < deadline:
        b.poll(timeout_ms=50)
    assert hw.service.fetch_offsets("g", "q")[held[1]] == 4  # a's, as it handed the partition over
    a.close()  # a new generation; b's next heartbeat is 30 s away
    b.close()
    assert hw.service.fetch_offsets("g", "q")[held[1]] == 7


# the CLI ---------------------------------------------------------------------------------------


def cli(*args, code=0):
    from typer.testing import CliRunner

    from headwater.cli.main import app

    env = {
        "COLUMNS": "200",
        "FORCE_COLOR": None,
        "TTY_COMPATIBLE": None,
        "HEADWATER_DATA": None,
        "HEADWATER_SERVER": None,
    }
    result = CliRunner(env=env).invoke(app, list(args))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    return result


def test_cli_group_list_describe_reset_and_queue_lag(tmp_path, clock):
    from tests.support.server_thread import ServerThread

    server = ServerThread(tmp_path / "data", clock)
    srv = ["--server", server.address]
    try:
        with headwater.connect(server.address) as hw:
            hw.admin.create_queue("orders", partitions=3)
            for p in range(3):
                hw.send_batch("orders", [b"m"] * (10 * (p + 1)), partition=p)
            member = hw.consumer(group="billing", subscribe="orders", client_id="worker-7")
            member.commit({("orders", 0): 4, ("orders", 1): 20})

            out = cli(*srv, "group", "list").stdout
            assert "billing" in out and "clustering" in out and "orders" in out
            out = cli(*srv, "group", "describe", "billing").stdout
            assert "worker-7" in out and "stable" in out and "pending leases" in out
            doc = json.loads(cli(*srv, "group", "describe", "billing", "--json").stdout)
            rows = {r["partition"]: r for r in doc["partitions"]}
            assert (rows[0]["committed"], rows[0]["end_offset"], rows[0]["lag"]) == (4, 10, 6)
            assert rows[2]["committed"] is None and rows[2]["member"] == member.member_id
            assert doc["members"][0]["client_id"] == "worker-7"

            lag = json.loads(cli(*srv, "queue", "lag", "orders", "--json").stdout)
            assert [(r["partition"], r["lag"]) for r in lag] == [(0, 6), (1, 0), (2, None)]
            assert "total" in cli(*srv, "queue", "lag", "orders").stdout

            err = cli(
                *srv, "group", "reset", "billing", "--queue", "orders", "--execute", "--to", "earliest", code=1
            ).stderr
            assert "live member" in err and "group describe billing" in err
            assert hw.service.fetch_offsets("billing", "orders") == {0: 4, 1: 20}  # unchanged
            member.close(commit=False)

            cli(*srv, "group", "reset", "billing", "--queue", "orders", "--execute", "--to", "latest")
            assert hw.service.fetch_offsets("billing", "orders") == {0: 10, 1: 20, 2: 30}
            cli(*srv, "group", "reset", "billing", "--queue", "orders", "--execute", "--to", "3", "--partitions", "0-1")
            assert hw.service.fetch_offsets("billing", "orders") == {0: 3, 1: 3, 2: 30}
            cli(*srv, "group", "reset", "billing", "--queue", "orders", "--execute", "--to", "-1h")
            assert hw.service.fetch_offsets("billing", "orders") == {0: 0, 1: 0, 2: 0}
            # past every log's end: each partition goes to its end, as kafka-consumer-groups does
            out = cli(*srv, "group", "reset", "billing", "--queue", "orders", "--execute", "--to", "99").stdout
            assert "past the log end of partition(s) 0, 1, 2" in " ".join(out.split())
            assert hw.service.fetch_offsets("billing", "orders") == {0: 10, 1: 20, 2: 30}
            err = cli(*srv, "group", "describe", "nobody", code=1).stderr
            assert "no group 'nobody'" in err and "group list" in err
    finally:
        server.stop()
    # on the data directory itself: offsets and lag (membership lives in a running broker)
    out = cli("--data", str(tmp_path / "data"), "group", "describe", "billing").stdout
    assert "use --server to see them" in out
    assert "billing" in cli("--data", str(tmp_path / "data"), "group", "list").stdout


# members in separate processes on a real broker process (slow) ---------------------------------

ROOT = Path(__file__).resolve().parent.parent
SESSION_MS, HEARTBEAT_MS = 3000, 300


def spawn_member(address, group, queue, mode, log, *extra):
    return subprocess.Popen(
        [sys.executable, "-m", "tests.support.group_member", address, group, queue, mode, str(log), *extra], cwd=ROOT
    )


def read_log(path: Path) -> dict:
    """What a member process did: member id, records, commits, last assignment."""
    out = {"member": None, "records": [], "commits": {}, "held": set(), "order_ok": True, "ended": False}
    last: dict[int, int] = {}
    for line in path.read_text().splitlines():
        parts = line.split(" ")
        kind = parts[1]
        if kind == "M":
            out["member"] = parts[2]
        elif kind == "R":
            p, off = int(parts[2]), int(parts[3])
            out["records"].append((p, off, parts[4]))
            if p in last and off <= last[p]:
                out["order_ok"] = False
            last[p] = off
        elif kind == "C":
            out["commits"][int(parts[2])] = int(parts[3])
        elif kind in ("A", "V"):
            tps = {int(tp.split(":")[1]) for tp in parts[2:] if tp}
            if kind == "A":
                out["held"] |= tps
                for p in tps:  # a partition assigned again restarts at its committed offset
                    last.pop(p, None)
            else:
                out["held"] -= tps
        elif kind == "E":
            out["ended"] = True
    return out


def wait_for(pred, timeout_s, what):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            value = pred()
        except GroupNotFoundError:  # nobody joined yet
            value = None
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.slow
def test_four_member_processes_one_killed_every_message_processed(tmp_path):
    """Four members in four processes; one is SIGKILLed mid-stream. Its partitions go to the
    others within the session timeout, every message is processed, ordered per partition,
    and the only duplicates are the killed member's uncommitted window: records it processed
    after its last commit, on the partitions it held when it died (at least once delivery)."""
    broker = BrokerProcess(tmp_path / "data").start()
    procs = []
    try:
        hw = headwater.connect(broker.address)
        hw.admin.create_queue("work", partitions=8)
        stop = tmp_path / "stop"
        logs = [tmp_path / f"m{i}.log" for i in range(4)]
        for log in logs:
            procs.append(
                spawn_member(
                    broker.address,
                    "g",
                    "work",
                    "clustering",
                    log,
                    "--session-ms",
                    str(SESSION_MS),
                    "--heartbeat-ms",
                    str(HEARTBEAT_MS),
                    "--handle-ms",
                    "1",
                    "--stop",
                    str(stop),
                )
            )
        wait_for(
            lambda: (lambda d: len(d.members) == 4 and d.state == "stable")(hw.service.describe_group("g")),
            30,
            "four members in a stable group",
        )
        total = 6000
        producer = hw.producer(linger_ms=5)

        def produce():
            for i in range(0, total, 100):
                for j in range(i, i + 100):
                    producer.send("work", str(j).encode(), partition=j % 8)
                producer.flush()
                time.sleep(0.02)

        feeder = threading.Thread(target=produce)
        feeder.start()
        wait_for(lambda: len(read_log(logs[0])["records"]) > 300, 30, "the victim to be busy")
        victim = read_log(logs[0])["member"]
        procs[0].kill()
        killed_at = time.monotonic()
        procs[0].wait()

        def reassigned():
            d = hw.service.describe_group("g")
            held = sorted(p for m in d.members for p in m.assignment.get("work", []))
            return victim not in {m.member_id for m in d.members} and held == list(range(8)) and d.state == "stable"

        wait_for(reassigned, 30, "the victim's partitions to be reassigned")
        took_s = time.monotonic() - killed_at
        # removed once its session ran out after its last heartbeat (< one interval before the
        # kill), then handed over on the survivors' next heartbeats
        assert took_s <= (SESSION_MS + 2 * HEARTBEAT_MS) / 1000 + 1.0, took_s
        feeder.join()
        producer.close()

        def all_processed():
            seen = {body for log in logs for _, _, body in read_log(log)["records"]}
            return len(seen) == total

        wait_for(all_processed, 60, "every message to be processed")
        stop.touch()
        for p in procs[1:]:
            assert p.wait(30) == 0
        runs = [read_log(log) for log in logs]
        assert all(r["ended"] for r in runs[1:])
        assert all(r["order_ok"] for r in runs), "a member saw a partition's offsets out of order"
        seen = Counter((p, off) for r in runs for p, off, _ in r["records"])
        assert len(seen) == total
        print(
            f"reassigned {took_s:.2f} s after the kill; {sum(n - 1 for n in seen.values())} duplicate(s) "
            f"of {total}; the killed member held {sorted(runs[0]['held'])}"
        )
        dead = runs[0]
        dead_records = {(p, off) for p, off, _ in dead["records"]}
        for (p, off), n in seen.items():
            if n == 1:
                continue
            assert n == 2 and (p, off) in dead_records, f"{(p, off)} processed {n} times"
            assert p in dead["held"], f"duplicate on {p}, which the killed member did not hold"
            assert off >= dead["commits"].get(p, 0), f"duplicate {(p, off)} before the killed member's last commit"
        # and once everyone stopped, the committed offsets are the end of every partition
        assert hw.service.fetch_offsets("g", "work") == {p: total // 8 for p in range(8)}
        hw.close()
    finally:
        kill_all(procs, broker)


@pytest.mark.slow
def test_broadcast_member_processes_each_see_everything(tmp_path):
    broker = BrokerProcess(tmp_path / "data").start()
    procs = []
    try:
        hw = headwater.connect(broker.address)
        hw.admin.create_queue("news", partitions=4)
        stop = tmp_path / "stop"
        logs = [tmp_path / f"b{i}.log" for i in range(3)]
        for i, log in enumerate(logs):
            procs.append(
                spawn_member(
                    broker.address,
                    "bc",
                    "news",
                    "broadcast",
                    log,
                    "--offsets",
                    str(tmp_path / f"b{i}.offsets"),
                    "--stop",
                    str(stop),
                )
            )
        wait_for(lambda: len(hw.service.describe_group("bc").members) == 3, 30, "three broadcast members")
        total = 2000
        hw.send_batch("news", [str(i).encode() for i in range(total)])
        for log in logs:
            wait_for(lambda: len({b for _, _, b in read_log(log)["records"]}) == total, 30, f"{log.name} to see all")  # noqa: B023 (called at once, within this iteration)
        stop.touch()
        for p in procs:
            assert p.wait(30) == 0
        for i, log in enumerate(logs):
            run = read_log(log)
            assert sorted(int(b) for _, _, b in run["records"]) == list(range(total))  # each exactly once
            doc = json.loads((tmp_path / f"b{i}.offsets").read_text())
            assert sum(doc["queues"]["news"]["offsets"].values()) == total
        hw.close()
    finally:
        kill_all(procs, broker)


@pytest.mark.slow
def test_a_member_goes_on_through_a_crash_of_its_broker_and_keeps_its_offsets(tmp_path):
    port = free_port()
    broker = BrokerProcess(tmp_path / "data", "--flush", "sync", port=port).start()
    try:
        hw = headwater.connect(broker.address, request_timeout_s=5)
        hw.admin.create_queue("q", partitions=2)
        hw.send_batch("q", [b"%d" % i for i in range(10)], partition=0)
        c = hw.consumer(group="g", subscribe="q", session_timeout_ms=2000, heartbeat_interval_ms=100)
        assert len(c.poll(timeout_ms=2000)) == 10
        c.commit()
        before, generation = c.member_id, c.generation
        broker.kill()
        broker = BrokerProcess(tmp_path / "data", "--flush", "sync", port=port).start()
        hw.send_batch("q", [b"after"], partition=0)
        got: list = []

        def polled() -> bool:
            with contextlib.suppress(headwater.UnavailableError):
                got.extend(c.poll(timeout_ms=200))
            return bool(got)

        eventually(polled, timeout_s=20, what="the record sent after the restart")
        # the restarted broker took the member back from the offsets' log: same id, same
        # generation, its partitions kept, no rejoin, and it reads on from where it was
        assert (c.member_id, c.generation) == (before, generation)
        assert [r.body for r in got] == [b"after"]
        c.commit()
        assert hw.service.fetch_offsets("g", "q") == {0: 11, 1: 0}
        c.close()
        hw.close()
    finally:
        broker.kill()


@pytest.mark.parametrize("stop", ["terminate", "kill"])
def test_members_go_on_through_a_restart_of_their_broker(tmp_path, stop):
    """A broker writes its groups' members to the offsets' log as they change and takes
    them back when it starts again, after a clean stop (SIGTERM) or a crash (SIGKILL), as a
    coordinator's move hands them over: the members go on with the same ids and generation,
    each keeping its partitions, with no rejoin and no commit refused."""
    port = free_port()
    broker = BrokerProcess(tmp_path / "data", port=port).start()
    try:
        hw = headwater.connect(broker.address, request_timeout_s=5)
        hw.admin.create_queue("q", partitions=2)
        settings = dict(group="g", subscribe="q", session_timeout_ms=5000, heartbeat_interval_ms=100)
        a, b = hw.consumer(**settings), hw.consumer(**settings)

        def assigned() -> bool:
            a.poll(timeout_ms=50)
            b.poll(timeout_ms=50)
            return len(a.assignment()) == 1 == len(b.assignment())

        eventually(assigned, what="both members assigned")
        before = hw.service.describe_group("g")
        if stop == "terminate":
            assert broker.terminate() == 0
        else:
            broker.kill()
        broker = BrokerProcess(tmp_path / "data", port=port).start()
        hw.send_batch("q", [b"a0", b"a1"], partition=0)
        hw.send_batch("q", [b"b0"], partition=1)
        got = []

        def polled() -> bool:
            for c in (a, b):
                with contextlib.suppress(headwater.UnavailableError):
                    got.extend(r.body for r in c.poll(timeout_ms=50))
            return len(got) >= 3

        eventually(polled, timeout_s=20, what="the records sent after the restart")
        assert sorted(got) == [b"a0", b"a1", b"b0"]
        a.commit()
        b.commit()
        after = hw.service.describe_group("g")
        assert {m.member_id for m in after.members} == {m.member_id for m in before.members}
        assert after.generation == before.generation  # nobody joined again
        assert hw.service.fetch_offsets("g", "q") == {0: 2, 1: 1}
        a.close()
        b.close()
        hw.close()
    finally:
        broker.kill()


# asyncio -------------------------------------------------------------------------------------


def test_asyncio_members_share_the_work(aio_target):
    import asyncio

    from tests.support.aio_target import run

    async def test(hw):
        await hw.admin.create_queue("q", partitions=4)
        for p in range(4):
            await hw.send_batch("q", [f"{p}-{i}".encode() for i in range(25)], partition=p)
        revoked = []

        async def on_revoke(tps):  # callbacks may be coroutines
            revoked.extend(tps)

        settings = dict(group="g", subscribe="q", strategy="sticky", heartbeat_interval_ms=50)
        a = hw.consumer(**settings, on_revoke=on_revoke)
        first = await a.poll(max_messages=10, timeout_ms=1000)
        await a.commit()
        assert a.assignment() == [("q", p) for p in range(4)]
        b = hw.consumer(**settings)
        await b.start()
        got = list(first)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while (len(got) < 100 or len(b.assignment()) < 2) and loop.time() < deadline:
            for c in (a, b):
                recs = await c.poll(timeout_ms=50)
                got += recs
                if recs:
                    await c.commit()
        assert sorted((r.partition, r.offset) for r in got) == [(p, o) for p in range(4) for o in range(25)]
        assert len(a.assignment()) == len(b.assignment()) == 2 and revoked == b.assignment()
        assert await hw.service.fetch_offsets("g", "q") == {p: 25 for p in range(4)}
        with pytest.raises(InvalidArgumentError, match="come from its group"):
            await a.assign("q")
        await a.close()
        async with hw.consumer(group="g", subscribe="q", mode="broadcast", offsets_path=None):
            raise AssertionError("a broadcast member cannot join a clustering group")  # pragma: no cover

    def expect_refusal(hw_test):
        async def wrapped(hw):
            with pytest.raises(InvalidArgumentError, match="clustering group"):
                await hw_test(hw)

        return wrapped

    run(aio_target, expect_refusal(test))


def test_asyncio_broadcast_members_keep_local_offsets(aio_target, tmp_path):
    from tests.support.aio_target import run

    async def test(hw):
        await hw.admin.create_queue("q", partitions=2)
        await hw.send_batch("q", [b"a", b"b"], partition=0)
        path = tmp_path / "m.offsets"
        async with hw.consumer(group="bc", subscribe="q", mode="broadcast", offsets_path=path) as c:
            assert [r.body for r in await c.poll(timeout_ms=1000)] == [b"a", b"b"]
        assert json.loads(path.read_text())["queues"]["q"]["offsets"] == {"0": 2, "1": 0}
        await hw.send_batch("q", [b"c"], partition=0)
        async with hw.consumer(group="bc", subscribe="q", mode="broadcast", offsets_path=path) as c:
            assert [r.body for r in await c.poll(timeout_ms=1000)] == [b"c"]
            assert await c.committed("q", 0) == 2
        with pytest.raises(GroupNotFoundError):  # both left; broadcast groups commit nothing to the broker
            await hw.service.describe_group("bc")

    run(aio_target, test)


def _sent_commits(monkeypatch, consumer) -> list[dict[int, int]]:
    """The ``{partition: offset}`` of each COMMIT_OFFSETS sent through the consumer's service
    (its client's: every consumer of the client) from now on."""
    sent: list[dict[int, int]] = []
    service = consumer._service
    real = service.commit_offsets

    def spy(group, queue, offsets, *args, **kwargs):
        sent.append(dict(offsets))
        return real(group, queue, offsets, *args, **kwargs)

    monkeypatch.setattr(service, "commit_offsets", spy)
    return sent


def test_a_commit_of_everything_sends_only_the_positions_that_moved(hw, monkeypatch):
    """A member of a queue of many partitions that read a few since its last commit stores
    those few (the code before sent every partition it holds each time)."""
    hw.admin.create_queue("q", partitions=6)
    for p in range(6):
        hw.send_batch("q", [b"%d-%d" % (p, i) for i in range(3)], partition=p)
    with hw.consumer(group="g", subscribe=["q"]) as c:
        assert len(poll_until(c, 18)) == 18
        sent = _sent_commits(monkeypatch, c)
        c.commit()
        assert sent == [dict.fromkeys(range(6), 3)]
        c.commit()  # nothing new: nothing sent
        assert len(sent) == 1
        hw.send_batch("q", [b"more"], partition=4)
        assert [r.body for r in c.poll(timeout_ms=2000)] == [b"more"]
        c.commit()
        assert sent[1:] == [{4: 4}]
        c.seek("q", 2, 1)  # a position moved back is stored again
        c.commit()
        assert sent[2:] == [{2: 1}]
        assert c.committed("q", 2) == 1
        assert c.committed("q", 4) == 4


def test_a_consumer_of_assigned_partitions_commits_what_moved_and_again_after_reassign(hw, monkeypatch):
    hw.admin.create_queue("q", partitions=3)
    for p in range(3):
        hw.send_batch("q", [b"x", b"y"], partition=p)
    c = hw.consumer(group="g")
    c.assign("q")
    assert len(poll_until(c, 6)) == 6
    sent = _sent_commits(monkeypatch, c)
    c.commit()
    c.commit()
    assert sent == [{0: 2, 1: 2, 2: 2}]
    # another consumer of the group moves partition 1 on; once this one reads it again, its
    # position is stored again even though it equals what it stored before
    other = hw.consumer(group="g")
    other.assign("q", [1])
    other.seek("q", 1, 0)
    other.commit()
    other.close()
    c.unassign("q")
    c.assign("q", [1])
    assert [r.body for r in c.poll(timeout_ms=2000)] == [b"x", b"y"]
    c.commit()
    assert sent[1:] == [{1: 0}, {1: 2}]  # the other's commit (one client: one service), then this one's
    assert c.committed("q", 1) == 2
    c.close()
