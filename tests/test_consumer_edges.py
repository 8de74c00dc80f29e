"""The consumer at its edges: positions past a partition's end (a seek there, a queue created
again under it), disabled queues, arguments it refuses, the id of a delayed message. Each
runs embedded, in memory and over the network (fetch streams, and fetches with
``stream=False``), sync and asyncio."""

from __future__ import annotations

import time

import pytest

from headwater.errors import (
    InvalidArgumentError,
    InvalidMessageIdError,
    QueueDisabledError,
    QueueNotFoundError,
)

STREAM = pytest.mark.parametrize("stream", [True, False], ids=["stream", "fetch"])


def _filled(hw, queue: str = "c", n: int = 10) -> None:
    hw.admin.create_queue(queue, partitions=1)
    hw.send_batch(queue, [b"m%d" % i for i in range(n)], partition=0)


def _read_all(c, n: int) -> list[bytes]:
    got: list[bytes] = []
    deadline = time.monotonic() + 5
    while len(got) < n and time.monotonic() < deadline:
        got += [r.body for r in c.poll(timeout_ms=200)]
    return got


# -- positions past the end ----------------------------------------------------------------


@STREAM
def test_a_seek_past_the_end_makes_poll_raise_naming_the_end(hw, stream):
    _filled(hw)
    c = hw.consumer(stream=stream)
    c.assign("c")
    assert len(_read_all(c, 10)) == 10
    c.seek("c", 0, 50)
    hw.send("c", b"new", partition=0)
    for _ in range(2):  # it stays an error until the position moves
        with pytest.raises(InvalidArgumentError, match=r"c\[0\]: seek\(\) to offset 50 is past the end of the log, 11"):
            c.poll(timeout_ms=300)
        assert c.position("c", 0) == 50
    c.seek("c", 0, 10)  # up to the end is fine
    assert _read_all(c, 1) == [b"new"]
    assert c.position("c", 0) == 11
    c.seek("c", 0, 11)  # the end itself: the next message
    assert c.poll(timeout_ms=50) == []
    c.close()


def _read_then_recreate(hw, stream: bool, reset: str, n: int, *, partitions: int):
    """A group member that read queue ``c``'s ``n`` messages, and the queue deleted and created
    again (empty, with ``partitions``) under it."""
    c = hw.consumer(group="g", stream=stream, auto_offset_reset=reset)
    c.assign("c")
    c.seek_to_beginning("c")
    assert len(_read_all(c, n)) == n
    hw.admin.delete_queue("c")
    hw.admin.create_queue("c", partitions=partitions)
    return c


@STREAM
@pytest.mark.parametrize("reset", ["earliest", "latest"])
def test_a_queue_created_again_resets_positions_by_auto_offset_reset(hw, stream, reset):
    _filled(hw)
    c = _read_then_recreate(hw, stream, reset, 10, partitions=1)
    hw.send("c", b"fresh", partition=0)
    got: list[bytes] = []
    deadline = time.monotonic() + 6
    while c.position("c", 0) > 1 and time.monotonic() < deadline:
        try:
            got += [r.body for r in c.poll(timeout_ms=300)]
        except QueueNotFoundError:  # a read in flight (or the stream) saw the queue deleted
            pass
    assert c.position("c", 0) <= 1, "the position past the new queue's end was never reset"
    if reset == "earliest":
        got += _read_all(c, 1 - len(got))
        assert got == [b"fresh"]
    else:
        assert got == [] and c.position("c", 0) == 1
        hw.send("c", b"later", partition=0)
        assert _read_all(c, 1) == [b"later"]
    c.commit()  # the reset position, within the new queue's log
    assert c.committed("c", 0) == c.position("c", 0) == 2 - (reset == "earliest")
    c.close()


@STREAM
@pytest.mark.parametrize("reset", ["earliest", "latest"])
def test_a_queue_created_again_longer_is_told_by_its_id(hw, stream, reset):
    """Created again and already past the old positions, the new queue used to be read on from
    them (its first messages skipped): every batch carries its queue's id, so the consumer
    sees the new queue in what it reads and moves every partition by auto_offset_reset."""
    hw.admin.create_queue("c", partitions=2)
    hw.send_batch("c", [b"old%d" % i for i in range(10)], partition=0)
    hw.send_batch("c", [b"old%d" % i for i in range(4)], partition=1)
    c = _read_then_recreate(hw, stream, reset, 14, partitions=2)
    new = {0: [b"new0-%d" % i for i in range(15)], 1: [b"new1-%d" % i for i in range(6)]}
    for p, bodies in new.items():
        hw.send_batch("c", bodies, partition=p)
    got: list[bytes] = []
    deadline = time.monotonic() + 8
    while time.monotonic() < deadline and (
        len(got) < 21 if reset == "earliest" else (c.position("c", 0), c.position("c", 1)) != (15, 6)
    ):
        try:
            got += [r.body for r in c.poll(timeout_ms=300)]
        except QueueNotFoundError:  # a read in flight (or the stream) saw the queue deleted
            pass
    if reset == "earliest":
        assert sorted(got) == sorted(new[0] + new[1])  # each once, none skipped
    else:
        assert got == [] and (c.position("c", 0), c.position("c", 1)) == (15, 6)
        hw.send("c", b"later", partition=1)
        assert _read_all(c, 1) == [b"later"]
    c.commit()
    assert c.committed("c", 0) == 15
    c.close()


def test_a_committed_offset_past_the_end_starts_by_auto_offset_reset(hw):
    _filled(hw)
    info = hw.admin.describe_queue("c")
    for reset, start in (("earliest", 0), ("latest", 10)):
        c = hw.consumer(auto_offset_reset=reset)
        c._start("c", info, [0], {0: 99})  # as assign() with a committed offset of another life of the queue
        assert c.position("c", 0) == start
        c.close()


# -- disabled queues -----------------------------------------------------------------------


@STREAM
@pytest.mark.parametrize("stored", [0, 3])
def test_polling_a_disabled_queue_raises(hw, stream, stored):
    hw.admin.create_queue("d")
    if stored:
        hw.send_batch("d", [b"x"] * stored)
    hw.admin.disable_queue("d")
    c = hw.consumer(stream=stream)
    c.assign("d")
    for _ in range(2):
        with pytest.raises(QueueDisabledError, match="queue 'd' is disabled; enable it to read or write"):
            c.poll(timeout_ms=500)
    hw.admin.enable_queue("d")
    hw.send("d", b"back")
    assert _read_all(c, stored + 1)[-1] == b"back"
    c.close()


@STREAM
def test_a_queue_disabled_under_a_consumer_makes_poll_raise(hw, stream):
    _filled(hw, "d", 2)
    c = hw.consumer(stream=stream)
    c.assign("d")
    assert len(_read_all(c, 2)) == 2
    hw.admin.disable_queue("d")
    deadline = time.monotonic() + 6
    with pytest.raises(QueueDisabledError, match="queue 'd' is disabled"):
        while time.monotonic() < deadline:  # a read parked before the queue was disabled ends first
            assert c.poll(timeout_ms=300) == []
    c.close()


# -- arguments -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "settings",
    [
        dict(fetch_bytes=-1),
        dict(fetch_bytes="1"),
        dict(fetch_bytes=0),
        dict(fetch_bytes=True),
        dict(max_poll_messages=0),
        dict(tags=5),
        dict(tags=[b"x"]),
        dict(tags=b"x"),
    ],
)
def test_consumer_settings_are_checked_when_it_is_made(hw, settings):
    hw.admin.create_queue("c")
    with pytest.raises(InvalidArgumentError, match=next(iter(settings))):
        hw.consumer(**settings)
    with pytest.raises(InvalidArgumentError, match=next(iter(settings))):  # the group member shares the checks
        hw.consumer(group="g", subscribe="c", **settings)


@pytest.mark.parametrize("group", ["bad group!", 5, b"g", "g" * 201])
def test_a_consumers_group_name_is_checked_when_it_is_made(hw, group):
    """As a shared consumer's: named at once, not as an encoding error of a later call."""
    hw.admin.create_queue("c")
    with pytest.raises(InvalidArgumentError, match="invalid group name"):
        hw.consumer(group=group)
    with pytest.raises(InvalidArgumentError, match="invalid group name"):
        hw.consumer(group=group, subscribe="c")


@STREAM
def test_poll_arguments_are_checked(hw, stream):
    _filled(hw)
    c = hw.consumer(stream=stream, tags="*")
    c.assign("c")
    for kwargs, what in (
        (dict(timeout_ms=None), "timeout_ms"),
        (dict(timeout_ms=-5), "timeout_ms"),
        (dict(timeout_ms="100"), "timeout_ms"),
        (dict(timeout_ms=float("inf")), "timeout_ms"),
        (dict(max_messages=-1), "max_messages"),
        (dict(max_messages=0), "max_messages"),
        (dict(max_messages=2.0), "max_messages"),
    ):
        with pytest.raises(InvalidArgumentError, match=what):
            c.poll(**kwargs)
    assert len(_read_all(c, 10)) == 10  # nothing was lost to the refused calls
    c.close()


def test_commit_names_the_shape_of_offsets(hw):
    _filled(hw)
    c = hw.consumer(group="g")
    c.assign("c")
    for bad in ({"c": 0}, {("c",): 0}, {("c", 0): -1}, {("c", "0"): 1}, [(("c", 0), 1)]):
        with pytest.raises(InvalidArgumentError, match=r"\{\(queue, partition\): offset\}"):
            c.commit(bad)
    c.commit({("c", 0): 3})
    assert c.committed("c", 0) == 3
    c.close()
    m = hw.consumer(group="h", subscribe="c")
    with pytest.raises(InvalidArgumentError, match=r"\{\(queue, partition\): offset\}"):
        m.commit({"c": 0})
    m.close()


def test_seek_to_a_delayed_id_says_what_to_do(hw):
    _filled(hw)
    # (due at once over the network, where the broker's clock is the test's: the id is delayed all the same)
    mid = hw.send("c", b"later", partition=0, delay=3600)
    assert mid.is_delayed
    c = hw.consumer()
    c.assign("c")
    with pytest.raises(InvalidMessageIdError, match=r"delayed message's id: .* not a position in partition 0's log"):
        c.seek_to_id(mid)
    c.close()


# -- asyncio -------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "fetch"])
def test_asyncio_consumer_edges(aio_target, stream):
    from tests.support.aio_target import run

    async def read_all(c, n):
        got: list[bytes] = []
        deadline = time.monotonic() + 5
        while len(got) < n and time.monotonic() < deadline:
            got += [r.body for r in await c.poll(timeout_ms=200)]
        return got

    async def test(hw):
        await hw.admin.create_queue("c")
        await hw.send_batch("c", [b"m%d" % i for i in range(10)], partition=0)
        for settings in (dict(fetch_bytes=-1), dict(fetch_bytes="1"), dict(tags=5)):
            with pytest.raises(InvalidArgumentError, match=next(iter(settings))):
                hw.consumer(stream=stream, **settings)
        c = hw.consumer(group="g", stream=stream)
        await c.assign("c")
        assert len(await read_all(c, 10)) == 10
        for kwargs in (dict(timeout_ms=None), dict(timeout_ms=-5), dict(max_messages=-1)):
            with pytest.raises(InvalidArgumentError, match=next(iter(kwargs))):
                await c.poll(**kwargs)
        with pytest.raises(InvalidArgumentError, match=r"\{\(queue, partition\): offset\}"):
            await c.commit({"c": 0})

        # a seek past the end
        c.seek("c", 0, 50)
        await hw.send("c", b"new", partition=0)
        with pytest.raises(InvalidArgumentError, match=r"offset 50 is past the end of the log, 11"):
            await c.poll(timeout_ms=300)
        assert c.position("c", 0) == 50
        c.seek("c", 0, 10)
        assert await read_all(c, 1) == [b"new"]

        # a delayed id (of another queue: the broker's clock is the test's, so it may be due at once)
        await hw.admin.create_queue("e")
        e = hw.consumer(stream=stream)
        await e.assign("e")
        mid = await hw.send("e", b"later", partition=0, delay=3600)
        with pytest.raises(InvalidMessageIdError, match="delayed message's id"):
            e.seek_to_id(mid)
        await e.close()

        # the queue created again: from its start (auto_offset_reset="earliest")
        await hw.admin.delete_queue("c")
        await hw.admin.create_queue("c")
        await hw.send("c", b"fresh", partition=0)
        got: list[bytes] = []
        deadline = time.monotonic() + 6
        while not got and time.monotonic() < deadline:
            try:
                got += [r.body for r in await c.poll(timeout_ms=300)]
            except QueueNotFoundError:
                pass
        assert got == [b"fresh"]
        await c.commit()
        assert await c.committed("c", 0) == 1

        # a disabled queue
        await hw.admin.create_queue("d")
        await hw.admin.disable_queue("d")
        d = hw.consumer(stream=stream)
        await d.assign("d")
        for _ in range(2):
            with pytest.raises(QueueDisabledError, match="queue 'd' is disabled; enable it to read or write"):
                await d.poll(timeout_ms=500)
        await d.close()
        await c.close()

    run(aio_target, test)


# -- every consumer kind takes the same poll arguments; a long poll past the end answers ---


def test_group_keyed_and_shared_consumers_check_poll_arguments_alike(hw):
    """The group member, the keyed member and the shared consumer raised TypeError for
    ``timeout_ms=None`` (or took a negative timeout as 0, and max_messages=0 as the
    default): each refuses what the plain consumer refuses."""
    _filled(hw)
    members = [
        hw.consumer(group="g", subscribe="c"),
        hw.keyed_consumer("k", "c", member=0, size=1),
        hw.shared_consumer("s", "c"),
    ]
    try:
        for m in members:
            read = m.receive if hasattr(m, "receive") else m.poll
            for kwargs, what in (
                (dict(timeout_ms=None), "timeout_ms"),
                (dict(timeout_ms=-5), "timeout_ms"),
                (dict(max_messages=0), "max_messages"),
                (dict(max_messages=-1), "max_messages"),
            ):
                with pytest.raises(InvalidArgumentError, match=what):
                    read(**kwargs)
        with pytest.raises(InvalidArgumentError, match="fetch_bytes"):
            hw.keyed_consumer("k2", "c", member=0, size=1, fetch_bytes=0)
    finally:
        for m in members:
            m.close()


def test_a_long_poll_past_the_end_answers_at_once(hw):
    """Waiting there would only skip the offsets before the position: the fetch answers at
    once and the reader decides (embedded, in memory, and a FETCH over the network)."""
    _filled(hw)
    service = hw.service
    t0 = time.monotonic()
    res = service.fetch("c", 0, 50, max_bytes=1 << 16, max_wait_ms=3000)
    assert (res.batches, res.next_offset, res.end_offset) == ([], 50, 10)
    assert time.monotonic() - t0 < 1
    t0 = time.monotonic()
    res = service.fetch("c", 0, 10, max_bytes=1 << 16, max_wait_ms=300)  # at the end: it waits
    assert res.batches == [] and time.monotonic() - t0 >= 0.25


def test_shared_acks_take_deliveries_or_lease_ids_and_refuse_anything_else(hw):
    """ack(["7:1:..."]) raised AttributeError ('str' object has no attribute 'lease_id')."""
    _filled(hw, n=2)
    c = hw.shared_consumer("s", "c")
    try:
        first, second = c.receive(max_messages=2, timeout_ms=2000)
        c.ack(first.lease_id)  # a lease id, as a string
        c.ack([second])
        for bad in (42, [b"raw"], [None]):
            with pytest.raises(InvalidArgumentError, match="deliveries from receive\\(\\) or their lease ids"):
                c.ack(bad)
        with pytest.raises(InvalidArgumentError, match=r"receive\(\): max_messages is a positive int \(or None: 32\)"):
            c.receive(max_messages=0)
        with pytest.raises(InvalidArgumentError, match=r"receive\(\): timeout_ms") as e:
            c.receive(timeout_ms=-1)
        assert "poll" not in str(e.value)
    finally:
        c.close()


@pytest.mark.parametrize(
    "settings, match",
    [
        # the error named heartbeat_interval_ms, which the user never set
        (dict(session_timeout_ms=10), "session_timeout_ms must be a whole number from 100"),
        (dict(max_poll_interval_ms=0), "max_poll_interval_ms .* must be a whole number of ms from 100"),
    ],
)
def test_group_settings_name_the_setting_at_fault(hw, settings, match):
    hw.admin.create_queue("c")
    with pytest.raises(InvalidArgumentError, match=match):
        hw.consumer(group="g", subscribe="c", **settings)
