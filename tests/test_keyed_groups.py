"""Keyed groups (CDAP): member i of n gets exactly the keys hashing to i, in order per key, and
a resize keeps per-key order (pause, drain to a barrier, resume). Embedded, in memory and
over TCP; one multi-process test on a real broker."""

from __future__ import annotations

import doctest
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

import headwater
from headwater import Message
from headwater.broker.keyed import KeyedGroupState
from headwater.errors import (
    GroupNotFoundError,
    InvalidArgumentError,
    PartitionOutOfRangeError,
    StaleGenerationError,
    UsageError,
)
from headwater.model.batch_reads import decode_records
from headwater.model.keyed import key_of, member_of
from tests.support.broker_process import BrokerProcess, kill_all

KEYS = [f"user-{i}".encode() for i in range(24)]


def produce(hw, queue: str, per_key: int, first: int = 0, *, prop: bool = False) -> list[Message]:
    """``per_key`` messages of every key, interleaved, bodies ``key:seq``; routed by key."""
    msgs = []
    for seq in range(first, first + per_key):
        for k in KEYS:
            body = k + b":%d" % seq
            msgs.append(Message(body, properties={"user": k.decode()}) if prop else Message(body, key=k))
    for i in range(0, len(msgs), 100):
        if prop:  # no message key: spread over partitions by hand
            for j, m in enumerate(msgs[i : i + 100]):
                hw.send_batch(queue, [m], partition=(i + j) % len(hw.admin.describe_queue(queue).partitions))
        else:
            hw.send_batch(queue, msgs[i : i + 100])
    return msgs


def drain(consumers, expect: int, timeout_s: float = 10.0, *, commit: bool = True) -> dict[int, list]:
    """Poll the members round-robin until ``expect`` records came; records per member."""
    got: dict[int, list] = defaultdict(list)
    deadline = time.monotonic() + timeout_s
    while sum(map(len, got.values())) < expect and time.monotonic() < deadline:
        for c in consumers:
            recs = c.poll(timeout_ms=20)
            got[c.member].extend(recs)
            if commit and recs:
                c.commit()
    return got


def parse(r) -> tuple[bytes, int]:
    k, _, seq = r.body.rpartition(b":")
    return k, int(seq)


def test_docstrings():
    import headwater.client.sync.keyed_consumer
    import headwater.model.keyed

    for mod in (headwater.model.keyed, headwater.client.sync.keyed_consumer):
        assert doctest.testmod(mod).failed == 0


def test_each_member_gets_exactly_its_keys_in_order(hw):
    hw.admin.create_queue("q", partitions=3)
    produce(hw, "q", 5)
    members = [hw.keyed_consumer("g", "q", member=i, size=4) for i in range(4)]
    got = drain(members, len(KEYS) * 5)
    assert sum(map(len, got.values())) == len(KEYS) * 5
    for m, recs in got.items():
        assert {member_of(r.key, 4) for r in recs} == {m}
        per_key = defaultdict(list)
        for r in recs:
            per_key[r.key].append(parse(r)[1])
        assert all(seqs == list(range(5)) for seqs in per_key.values())
    for c in members:
        assert c.poll(timeout_ms=50) == []


def test_a_member_is_iterable(hw):
    """``for record in member``, as a plain or shared consumer is (a member had only poll)."""
    hw.admin.create_queue("q", partitions=2)
    produce(hw, "q", 3)
    mine = sum(member_of(k, 2) == 1 for k in KEYS) * 3
    with hw.keyed_consumer("g", "q", member=1, size=2) as m:
        got = []
        for r in m:
            got.append(r)
            if len(got) == mine:
                break
    assert {member_of(r.key, 2) for r in got} == {1}
    assert sorted(parse(r)[1] for r in got) == sorted(list(range(3)) * (mine // 3))


def test_property_key_and_keyless_messages(hw):
    hw.admin.create_queue("q", partitions=2)
    produce(hw, "q", 2, prop=True)
    hw.send_batch("q", [b"no-user-%d" % i for i in range(6)], partition=1)
    members = [hw.keyed_consumer("g", "q", member=i, size=3, key="property:user") for i in range(3)]
    got = drain(members, len(KEYS) * 2 + 6)
    for m, recs in got.items():
        for r in recs:
            assert member_of(key_of("user", r.key, r.properties), 3) == m
    assert sorted(r.body for r in got[0] if r.properties is None) == sorted(b"no-user-%d" % i for i in range(6))
    assert sum(map(len, got.values())) == len(KEYS) * 2 + 6


def test_the_broker_sends_only_the_members_messages(hw):
    hw.admin.create_queue("q", partitions=1)
    for seq in range(10):  # batches mixing every key; 200-byte bodies
        hw.send_batch("q", [Message(b"%d" % seq + b"." * 200, key=k) for k in KEYS], partition=0)
    total = sum(len(b) for b in hw.service.fetch("q", 0, 0, max_bytes=1 << 30).batches)
    info = hw.service.keyed_group("q", "g", "key", 4)
    seen, size, offset = 0, 0, 0
    while True:
        res = hw.service.keyed_fetch("q", "g", 2, info.generation, 0, offset, max_bytes=1 << 20)
        for b in res.batches:  # every message of every batch on the wire, not only the range
            size += len(b)
            for r in decode_records(b, "q"):
                assert member_of(r.key, 4) == 2
                seen += 1
        if res.next_offset == offset:
            break
        offset = res.next_offset
    assert seen == sum(member_of(k, 4) == 2 for k in KEYS) * 10
    # a quarter of the messages, plus a 96-byte header per run of neighbours (docs/keyed-groups.md)
    assert size < total / 2


def test_positions_are_per_member_and_committed(hw):
    hw.admin.create_queue("q", partitions=2)
    produce(hw, "q", 3)
    a = hw.keyed_consumer("g", "q", member=0, size=2)
    first = a.poll(max_messages=5, timeout_ms=1000)
    assert len(first) == 5
    a.commit()
    a.close()
    info = hw.admin.describe_keyed_group("g", "q")
    assert info.positions[0] == {p: a.position(p) for p in (0, 1)} and 1 not in info.positions
    again = hw.keyed_consumer("g", "q", member=0, size=2)
    rest = drain([again], sum(member_of(k, 2) == 0 for k in KEYS) * 3 - 5)
    assert {r.offset for r in first}.isdisjoint({r.offset for r in rest[0]})


def test_bad_input_is_refused_and_changes_nothing(hw):
    hw.admin.create_queue("q", partitions=2)
    m = hw.keyed_consumer("g", "q", member=1, size=3)
    hw.send_batch("q", [Message(b"x", key=k) for k in KEYS], partition=0)  # a resize has to wait
    before = hw.admin.describe_keyed_group("g", "q")
    with pytest.raises(InvalidArgumentError, match="at least one member"):
        hw.admin.resize_keyed_group("g", "q", 0)
    with pytest.raises(InvalidArgumentError, match="from 1 to"):
        hw.admin.resize_keyed_group("g", "q", -2)
    with pytest.raises(InvalidArgumentError, match="has 3 members, not 5"):
        hw.keyed_consumer("g", "q", member=0, size=5)
    with pytest.raises(InvalidArgumentError, match="keyed by 'key', not 'property:x'"):
        hw.keyed_consumer("g", "q", member=0, size=3, key="property:x")
    with pytest.raises(InvalidArgumentError, match="'key' .* or 'property:NAME'"):
        hw.keyed_consumer("h", "q", member=0, size=3, key="value")
    with pytest.raises(InvalidArgumentError, match="member 3 is not in a group of 3"):
        hw.keyed_consumer("g", "q", member=3, size=3)
    with pytest.raises(GroupNotFoundError, match="no keyed group 'nope'"):
        hw.admin.describe_keyed_group("nope", "q")
    with pytest.raises(StaleGenerationError, match="generation 1"):
        hw.service.keyed_commit("q", "g", 1, 7, {0: 0})
    with pytest.raises(StaleGenerationError, match="members 0..2"):
        hw.service.keyed_fetch("q", "g", 3, 1, 0, 0, max_bytes=100)
    if not hw.admin.cluster_metadata().cluster_id:  # a cluster's coordinator knows only the logs it leads
        with pytest.raises(InvalidArgumentError, match="beyond the log end"):
            hw.service.keyed_commit("q", "g", 1, 1, {1: 5})
    with pytest.raises(PartitionOutOfRangeError):
        hw.service.keyed_commit("q", "g", 1, 1, {9: 0})
    assert hw.admin.describe_keyed_group("g", "q") == before
    hw.admin.resize_keyed_group("g", "q", 4)
    with pytest.raises(UsageError, match="already resizing from 3 to 4"):
        hw.admin.resize_keyed_group("g", "q", 2)
    assert hw.admin.resize_keyed_group("g", "q", 4).resizing_to == 4  # asking again is fine
    m.close()


def test_resize_keeps_order_per_key(hw):
    """Three members, a resize to 4 while messages keep coming, then to 2: every message
    exactly once (commits after each poll), and per key strictly in order across members."""
    hw.admin.create_queue("q", partitions=3)
    produce(hw, "q", 4)
    log: list[tuple[bytes, int, int]] = []  # (key, seq, member), in processing order
    members = {i: hw.keyed_consumer("g", "q", member=i, size=3) for i in range(3)}

    def step(rounds: int) -> None:
        for _ in range(rounds):
            for m in list(members.values()):
                recs = m.poll(max_messages=7, timeout_ms=5)
                for r in recs:
                    k, seq = parse(r)
                    assert member_of(r.key, m.info.size) == m.member
                    log.append((k, seq, m.member))
                m.commit()

    step(2)  # part-way through
    info = hw.admin.resize_keyed_group("g", "q", 4)
    assert info.resizing_to == 4 and set(info.barrier) == {0, 1, 2}
    members[3] = hw.keyed_consumer("g", "q", member=3, size=4)
    assert members[3].role == "waiting"
    produce(hw, "q", 4, first=4)  # past the barrier: for the new generation
    deadline = time.monotonic() + 20
    while hw.admin.describe_keyed_group("g", "q").resizing_to is not None:
        assert time.monotonic() < deadline, "the resize did not complete"
        step(1)
    assert hw.admin.describe_keyed_group("g", "q").size == 4
    step(3)
    hw.admin.resize_keyed_group("g", "q", 2)
    produce(hw, "q", 2, first=8)
    while len(log) < len(KEYS) * 10:
        assert time.monotonic() < deadline + 20, f"only {len(log)} records"
        step(1)
    assert members[3].retired and members[2].retired and members[3].poll(timeout_ms=10) == []
    per_key = defaultdict(list)
    for k, seq, _ in log:
        per_key[k].append(seq)
    assert len(per_key) == len(KEYS)
    assert all(seqs == list(range(10)) for seqs in per_key.values()), per_key
    assert {m for _, _, m in log} == {0, 1, 2, 3}


def test_resize_completes_at_once_when_members_are_caught_up(hw):
    hw.admin.create_queue("q", partitions=2)
    produce(hw, "q", 1)
    ms = [hw.keyed_consumer("g", "q", member=i, size=2) for i in range(2)]
    drain(ms, len(KEYS))
    for m in ms:  # past the other member's messages too
        while m.poll(timeout_ms=50):
            pass
        m.commit()
    info = hw.admin.resize_keyed_group("g", "q", 3)
    assert info.resizing_to is None and info.size == 3 and info.generation == 2
    assert info.base == {p.partition: p.end_offset for p in hw.admin.describe_queue("q").partitions}
    m2 = hw.keyed_consumer("g", "q", member=2, size=3)
    produce(hw, "q", 1, first=1)
    got = drain([*ms, m2], len(KEYS))
    assert all(parse(r)[1] == 1 for recs in got.values() for r in recs)
    assert {member_of(r.key, 3) for r in got[2]} == {2}


def test_a_member_that_does_not_run_holds_the_resize(hw):
    hw.admin.create_queue("q")
    produce(hw, "q", 1)
    a = hw.keyed_consumer("g", "q", member=0, size=2)
    drain([a], sum(member_of(k, 2) == 0 for k in KEYS))
    info = hw.admin.resize_keyed_group("g", "q", 1)
    assert info.resizing_to == 1
    a.poll(timeout_ms=50)  # drained and committed at the barrier; member 1 never ran
    assert hw.admin.describe_keyed_group("g", "q").resizing_to == 1
    st = KeyedGroupState(hw.admin.describe_keyed_group("g", "q"))
    assert st.info.draining({0: 0}) == [1]
    b = hw.keyed_consumer("g", "q", member=1, size=2)  # the old size: it drains now
    got = drain([b], sum(member_of(k, 2) == 1 for k in KEYS))
    assert len(got[1]) == sum(member_of(k, 2) == 1 for k in KEYS)
    b.poll(timeout_ms=50)
    info = hw.admin.describe_keyed_group("g", "q")
    assert info.resizing_to is None and info.size == 1 and info.generation == 2
    assert b.poll(timeout_ms=10) == [] and b.retired
    produce(hw, "q", 1, first=1)
    assert len(drain([a], len(KEYS))[0]) == len(KEYS)


def test_members_read_partitions_added_while_they_run(hw, monkeypatch):
    """An active member looks for new partitions every _PARTITIONS_CHECK_S (over the network
    without waiting: the answer is taken on a later poll) and reads them from their start."""
    import headwater.client.common.keyed_consumer as keyed_consumer

    monkeypatch.setattr(keyed_consumer, "_PARTITIONS_CHECK_S", 0.05)
    hw.admin.create_queue("q", partitions=1)
    members = [hw.keyed_consumer("g", "q", member=i, size=2) for i in range(2)]
    produce(hw, "q", 1)
    drain(members, len(KEYS))
    hw.admin.add_partitions("q", 3)
    for p in (1, 2):
        hw.send_batch("q", [Message(k + b":1", key=k) for k in KEYS], partition=p)
    got = drain(members, 2 * len(KEYS))
    assert sorted(r.partition for recs in got.values() for r in recs) == [1] * len(KEYS) + [2] * len(KEYS)
    assert all(m.position(2) == len(KEYS) for m in members)


def test_positions_and_resizes_survive_a_broker_restart(tmp_path):
    with headwater.open(tmp_path / "d") as hw:
        hw.admin.create_queue("q", partitions=2)
        produce(hw, "q", 2)
        a = hw.keyed_consumer("g", "q", member=0, size=2, key="key")
        a.poll(max_messages=3, timeout_ms=1000)
        a.commit()
        at = (a.position(0), a.position(1))
        hw.admin.resize_keyed_group("g", "q", 3)
        before = hw.admin.describe_keyed_group("g", "q")
    with headwater.open(tmp_path / "d") as hw:
        assert hw.admin.describe_keyed_group("g", "q") == before
        a = hw.keyed_consumer("g", "q", member=0, size=3)
        assert a.role == "draining" and (a.position(0), a.position(1)) == at


def test_state_table_is_compacted(tmp_path):
    with headwater.open(tmp_path / "d") as hw:
        hw.admin.create_queue("q")
        hw.send("q", Message(b"x", key=b"k"))
        c = hw.keyed_consumer("g", "q", member=0, size=1)
        info = hw.service.keyed_group("q", "g")
        for _ in range(3000):
            hw.service.keyed_commit("q", "g", 0, info.generation, {0: 1})
        internal = hw.service.store.describe_queue("__keyed").partitions[0]
        assert internal.end_offset - internal.start_offset < 2100
        c.close()
    with headwater.open(tmp_path / "d") as hw:
        assert hw.admin.describe_keyed_group("g", "q").positions == {0: {0: 1}}


# many processes on a real broker -------------------------------------------------------------

MEMBER = str(Path(__file__).parent / "support" / "keyed_member.py")


@pytest.mark.slow
def test_processes_keep_order_per_key_through_resizes(tmp_path):
    """Three member processes; the queue keeps growing; a resize to 4 (a fourth process
    joins), then to 2 (two retire). Each process logs (monotonic time, key, seq) as it
    processes; merged by time, every key's sequence is complete and in order."""
    broker = BrokerProcess(tmp_path / "data").start()
    procs: list[subprocess.Popen] = []
    try:
        hw = headwater.connect(broker.address)
        hw.admin.create_queue("clicks", partitions=3)
        hw.service.keyed_group("clicks", "g", "key", 3)  # before the processes start: they may be slow

        def member(i: int, size: int) -> None:
            out = tmp_path / f"member-{i}-{len(procs)}.log"
            procs.append(subprocess.Popen([sys.executable, MEMBER, broker.address, str(i), str(size), str(out)]))

        for i in range(3):
            member(i, 3)
        per_key = 60
        for seq in range(0, per_key, 6):
            produce(hw, "clicks", 6, first=seq)
            time.sleep(0.05)
            if seq == 18:
                hw.admin.resize_keyed_group("g", "clicks", 4)
                member(3, 4)
            if seq == 42:
                wait_resized(hw, 4)
                hw.admin.resize_keyed_group("g", "clicks", 2)
        wait_resized(hw, 2)
        deadline = time.monotonic() + 60
        while True:
            events = read_logs(tmp_path)
            if len(events) >= len(KEYS) * per_key:
                break
            assert time.monotonic() < deadline, f"{len(events)} of {len(KEYS) * per_key} processed"
            time.sleep(0.2)
        time.sleep(0.5)  # anything more would be a duplicate: let it show
        events = read_logs(tmp_path)
        assert len(events) == len(KEYS) * per_key  # no crash: each exactly once
        seqs = defaultdict(list)
        members_of_key = defaultdict(set)
        for _, key, seq, m in sorted(events):
            seqs[key].append(seq)
            members_of_key[key].add(m)
        assert all(s == list(range(per_key)) for s in seqs.values())
        assert any(len(ms) > 1 for ms in members_of_key.values())  # keys did move between members
        for p in procs[2:4]:  # members 2 and 3 retired at the resize to 2
            assert p.wait(30) == 0
        hw.close()
    finally:
        kill_all(procs, broker)


def wait_resized(hw, size: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        info = hw.admin.describe_keyed_group("g", "clicks")
        if info.resizing_to is None and info.size == size:
            return
        assert time.monotonic() < deadline, f"stuck: {info}"
        time.sleep(0.05)


def read_logs(d: Path) -> list[tuple[int, str, int, int]]:
    out = []
    for f in d.glob("member-*.log"):
        for line in f.read_text().splitlines():
            parts = line.split()
            if len(parts) == 4:
                out.append((int(parts[0]), parts[1], int(parts[2]), int(parts[3])))
    return out


# asyncio -------------------------------------------------------------------------------------


async def adrain(consumers, expect: int, timeout_s: float = 10.0) -> dict[int, list]:
    """:func:`drain` for asyncio members (commits after each poll that got records)."""
    got: dict[int, list] = defaultdict(list)
    deadline = time.monotonic() + timeout_s
    while sum(map(len, got.values())) < expect and time.monotonic() < deadline:
        for c in consumers:
            recs = await c.poll(timeout_ms=20)
            got[c.member].extend(recs)
            if recs:
                await c.commit()
    return got


def test_asyncio_members_get_their_keys_in_order_through_a_resize(aio_target, monkeypatch):
    """The asyncio member (AsyncKeyedConsumer): its keys only, in order per key, positions
    committed and resumed, a resize 2 -> 3 followed without restarts, and the admin calls."""
    import headwater.client.common.keyed_consumer as keyed_consumer
    from tests.support.aio_target import run

    monkeypatch.setattr(keyed_consumer, "_PARTITIONS_CHECK_S", 0.05)

    async def send(hw, first: int, per_key: int) -> None:
        await hw.send_batch(
            "q", [Message(k + b":%d" % seq, key=k) for seq in range(first, first + per_key) for k in KEYS]
        )

    async def test(hw):
        await hw.admin.create_queue("q", partitions=3)
        await send(hw, 0, 3)
        members = [hw.keyed_consumer("g", "q", member=i, size=2) for i in range(2)]
        with pytest.raises(InvalidArgumentError, match="not joined"):
            members[0].info  # noqa: B018 - joining waits for the first poll (or start())
        got = await adrain(members, len(KEYS) * 3)
        for m, recs in got.items():
            assert {member_of(r.key, 2) for r in recs} == {m}
        await members[0].commit()  # a poll that took nothing may have moved past the others' records
        info = await hw.admin.describe_keyed_group("g", "q")
        assert info.size == 2 and info.positions[0] == {p: members[0].position(p) for p in range(3)}
        await members[0].close()
        members[0] = hw.keyed_consumer("g", "q", member=0, size=2)  # resumes from its commit
        assert await members[0].poll(timeout_ms=100) == []
        await send(hw, 100, 1)  # one more each: ``async for`` over a member takes its own
        mine = []
        async for r in members[1]:
            mine.append(r)
            if len(mine) == sum(member_of(k, 2) == 1 for k in KEYS):
                break
        assert {member_of(r.key, 2) for r in mine} == {1} and {parse(r)[1] for r in mine} == {100}
        await members[1].commit()
        assert len((await adrain(members[:1], sum(member_of(k, 2) == 0 for k in KEYS)))[0]) > 0

        info = await hw.admin.resize_keyed_group("g", "q", 3)
        assert info.size == 3 and info.resizing_to is None  # every member was caught up
        async with hw.keyed_consumer("g", "q", member=2, size=3) as third:
            members.append(third)
            await send(hw, 3, 2)
            more = await adrain(members, len(KEYS) * 2)
        log = defaultdict(list)
        for m, recs in more.items():
            assert {member_of(r.key, 3) for r in recs} == {m}
            for r in recs:
                log[r.key].append(parse(r)[1])
        assert all(seqs == [3, 4] for seqs in log.values()) and len(log) == len(KEYS)

        with pytest.raises(InvalidArgumentError):  # a declaration the group does not have
            await hw.keyed_consumer("g", "q", member=0, size=2, key="property:user").poll(timeout_ms=10)

        members[2] = hw.keyed_consumer("g", "q", member=2, size=3)  # the one closed by async with, again
        await hw.admin.add_partitions("q", 4)  # read from their start, found without waiting
        await hw.send_batch("q", [Message(k + b":5", key=k) for k in KEYS], partition=3)
        added = [r for recs in (await adrain(members, len(KEYS))).values() for r in recs]
        assert len(added) == len(KEYS) and {r.partition for r in added} == {3}

        sub = await hw.admin.add_subscriber("q", "audit", partitions=1, tags="t", start=0)
        assert (sub.partitions, sub.tags) == ([1], ["t"])
        assert [s.name for s in await hw.admin.list_subscribers("q")] == ["audit"]
        assert (await hw.admin.describe_subscriber("q", "audit")).name == "audit"
        await hw.admin.delete_subscriber("q", "audit")
        assert await hw.admin.list_subscribers() == []

    run(aio_target, test)


def test_similar_keys_spread_over_the_members():
    """Ten keys ``user-0`` .. ``user-9`` reach all four members of a keyed group (plain CRC32C,
    the hash before, gave them to two)."""
    assert {member_of(f"user-{i}".encode(), 4) for i in range(10)} == {0, 1, 2, 3}
    assert len({member_of(str(i).encode(), 8) for i in range(8)}) >= 5  # CRC32C: 4
