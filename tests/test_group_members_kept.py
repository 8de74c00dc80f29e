"""A broker serving the network writes its groups' membership to the offsets' log as it
changes (headwater.broker.groups, headwater.broker.offsets "Members"), and takes it back when
it starts again: members, generation, targets and holders, each session starting anew.
Here over a real LogStore, closed and opened again (nothing is written at a stop any more,
so a close and a crash leave the same log); the brokers killed with SIGKILL are in
test_groups ("goes on through a crash")."""

from __future__ import annotations

import logging

import msgspec
import pytest

from headwater import StoreConfig
from headwater.broker.groups import GroupCoordinator
from headwater.broker.membership import Membership
from headwater.broker.offsets import OFFSETS_QUEUE, OffsetStore
from headwater.errors import GroupNotFoundError, UnknownMemberError
from headwater.model.config import QueueConfig
from headwater.model.groups import HandedOffGroup
from headwater.storage.store import LogStore
from headwater.testing import FakeClock

JOIN = dict(client_id="c", queues=["q"], mode="clustering", strategy="sticky", session_timeout_ms=10_000)


@pytest.fixture
def data(tmp_path):
    path = tmp_path / "data"
    store = LogStore(path, StoreConfig())
    store.create_queue("q", QueueConfig(partitions=2))
    store.close()
    return path


def _coordinator(path, clock, *, keep=True, read_only=False):
    store = LogStore(path, StoreConfig(read_only=read_only))
    groups = GroupCoordinator(store, OffsetStore(store), clock=clock)
    if keep:
        groups.keep_members(write=not read_only)
    return store, groups


def _members(groups, group) -> list[str]:
    """The member ids of ``group`` (none: it is not known at all)."""
    try:
        return [m.member_id for m in groups.describe_group(group).members]
    except GroupNotFoundError:
        return []


def _records(store) -> int:
    return store.end_offset(OFFSETS_QUEUE, 0)


def test_the_version_changes_with_what_a_hand_off_holds_and_only_then():
    ms = Membership(lambda q: 2, incarnation="v")
    assert ms.version("g") == 0
    a = ms.join("g", member_id=None, now_ms=0, **JOIN)
    seen = {ms.version("g")}
    ms.heartbeat("g", a.member_id, a.generation, 10)  # acknowledges its generation: a change
    seen.add(ms.version("g"))
    steady = ms.version("g")
    for t in (20, 30, 40):
        ms.heartbeat("g", a.member_id, a.generation, t)  # keeps the session alive: no change
    assert ms.version("g") == steady
    b = ms.join("g", member_id=None, now_ms=50, **JOIN)  # a rebalance
    assert ms.version("g") not in seen
    seen.add(ms.version("g"))
    ms.heartbeat("g", a.member_id, b.generation, 60)  # a releases what b's target took
    assert ms.version("g") not in seen
    seen.add(ms.version("g"))
    ms.heartbeat("g", b.member_id, b.generation, 70)  # b is granted it
    assert ms.version("g") not in seen
    ms.leave("g", b.member_id, 80)
    ms.leave("g", a.member_id, 90)
    assert ms.version("g") == 0  # no members, no group


def test_members_come_back_after_a_restart_with_their_holders(data):
    clock = FakeClock()
    store, groups = _coordinator(data, clock)
    a = groups.join_group("g", None, **JOIN)
    b = groups.join_group("g", None, **JOIN)
    groups.heartbeat_group("g", a.member_id, b.generation)  # a gives up b's partition
    b = groups.heartbeat_group("g", b.member_id, b.generation)
    before = groups.describe_group("g")
    assert b.assignment == {"q": [1]} and not b.pending
    store.close()  # the log has what was answered
    store2, again = _coordinator(data, clock)
    after = again.describe_group("g")
    assert after.generation == before.generation
    assert {(m.member_id, tuple(m.assignment.get("q", []))) for m in after.members} == {
        (m.member_id, tuple(m.assignment.get("q", []))) for m in before.members
    }
    # the members go on: same ids, same generation, their partitions, and commits taken
    assert again.heartbeat_group("g", b.member_id, b.generation).assignment == {"q": [1]}
    again.commit_offsets("g", "q", {1: 0}, member_id=b.member_id, generation=b.generation)
    # a new join rebalances with a generation never given before
    c = again.join_group("g", None, **JOIN)
    assert c.generation > b.generation
    store2.close()


def test_a_heartbeat_that_changes_nothing_writes_nothing(data):
    clock = FakeClock()
    store, groups = _coordinator(data, clock)
    a = groups.join_group("g", None, **JOIN)
    groups.heartbeat_group("g", a.member_id, a.generation)
    written = _records(store)
    for _ in range(5):
        clock.advance(1)
        groups.heartbeat_group("g", a.member_id, a.generation)
        groups.describe_group("g")
    assert _records(store) == written
    store.close()


def test_a_group_whose_members_left_or_expired_does_not_come_back(data):
    clock = FakeClock()
    store, groups = _coordinator(data, clock)
    a = groups.join_group("g", None, **JOIN)
    groups.leave_group("g", a.member_id)
    b = groups.join_group("h", None, **JOIN)
    clock.advance(11)  # past b's session timeout: the next call touching h removes it
    with pytest.raises(UnknownMemberError):
        groups.heartbeat_group("h", b.member_id, b.generation)
    store.close()
    store2, again = _coordinator(data, clock)
    assert _members(again, "g") == [] and _members(again, "h") == []
    store2.close()


def test_an_embedded_broker_neither_writes_nor_takes_back_members(data):
    clock = FakeClock()
    store, served = _coordinator(data, clock)
    a = served.join_group("g", None, **JOIN)
    written = _records(store)
    store.close()
    store2, embedded = _coordinator(data, clock, keep=False)
    assert _members(embedded, "g") == []  # its members lived in a process now gone
    embedded.join_group("h", None, **JOIN)
    assert _records(store2) == written
    store2.close()
    store3, again = _coordinator(data, clock)  # a broker serving the network again
    assert _members(again, "g") == [a.member_id]
    store3.close()


def test_a_read_only_broker_takes_members_back_and_writes_nothing(data):
    clock = FakeClock()
    store, groups = _coordinator(data, clock)
    a = groups.join_group("g", None, **JOIN)
    store.close()
    store2, ro = _coordinator(data, clock, read_only=True)
    assert _members(ro, "g") == [a.member_id]
    written = _records(store2)
    ro.heartbeat_group("g", a.member_id, a.generation)  # a change (it acknowledges), kept in memory only
    assert _records(store2) == written
    store2.close()


def test_a_compaction_keeps_the_members(data):
    clock = FakeClock()
    store = LogStore(data, StoreConfig())
    offsets = OffsetStore(store, compact_ratio=1, compact_min=4)
    groups = GroupCoordinator(store, offsets, clock=clock)
    groups.keep_members()
    a = groups.join_group("g", None, **JOIN)
    for _ in range(10):  # commits enough to compact the log several times
        groups.commit_offsets("g", "q", {0: 0}, member_id=a.member_id, generation=a.generation)
    assert store.describe_queue(OFFSETS_QUEUE).partitions[0].start_offset > 0  # compacted
    store.close()
    store2, again = _coordinator(data, clock)
    assert _members(again, "g") == [a.member_id]
    assert again.describe_group("g").generation == a.generation
    store2.close()


DAMAGED = b"\x93not a group"


def test_a_record_that_cannot_be_read_makes_its_members_join_again(data, caplog):
    with pytest.raises(msgspec.DecodeError):
        msgspec.msgpack.decode(DAMAGED, type=HandedOffGroup)
    clock = FakeClock()
    store = LogStore(data, StoreConfig())
    offsets = OffsetStore(store)
    groups = GroupCoordinator(store, offsets, clock=clock)
    groups.keep_members()
    groups.join_group("g", None, **JOIN)
    offsets.save_members("g", DAMAGED)  # a damaged record, as no call writes one
    store.close()
    with caplog.at_level(logging.WARNING, logger="headwater.groups"):
        store2, again = _coordinator(data, clock)
    assert "cannot be read" in caplog.text
    assert _members(again, "g") == []
    store2.close()


def test_a_read_writes_nothing_and_the_next_call_writes_what_it_expired(data):
    """describe and list are reads: the members they find expired (and the rebalance that
    follows) are written by the group's next call that may change it, before its answer
    tells anyone the new generation."""
    clock = FakeClock()
    store, groups = _coordinator(data, clock)
    a = groups.join_group("g", None, **dict(JOIN, session_timeout_ms=60_000))
    b = groups.join_group("g", None, **JOIN)
    groups.heartbeat_group("g", a.member_id, b.generation)
    written = _records(store)
    clock.advance(11)  # past b's session timeout, not a's
    assert _members(groups, "g") == [a.member_id]
    groups.list_groups()
    assert _records(store) == written
    answer = groups.heartbeat_group("g", a.member_id, b.generation)
    assert answer.generation > b.generation and _records(store) > written
    store.close()
    store2, again = _coordinator(data, clock)
    assert _members(again, "g") == [a.member_id]
    assert again.describe_group("g").generation == answer.generation
    store2.close()
