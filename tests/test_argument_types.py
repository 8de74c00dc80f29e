"""A value of the wrong type is refused with the same InvalidArgumentError, in the same words,
embedded, in memory and over the network (sync and asyncio): never a bare TypeError from
deep inside, nor the wire encoder's wording. Each case here once differed on some target
(see test_differential's KNOWN_DIFFERENCES)."""

from __future__ import annotations

import pytest

import headwater
from headwater.errors import InvalidArgumentError
from tests.support.aio_target import run

SUBSCRIBER_NAME = (
    "invalid subscriber name 5: use 1-200 letters, digits, '.', '_' and '-', starting with a letter or digit"
)

CASES = {
    "list_subscribers(5)": (lambda hw: hw.admin.list_subscribers(5), "a queue name is a string, got int"),
    "add_subscriber name 5": (lambda hw: hw.admin.add_subscriber("q", 5), SUBSCRIBER_NAME),
    "describe_subscriber name 5": (lambda hw: hw.admin.describe_subscriber("q", 5), SUBSCRIBER_NAME),
    "delete_subscriber name 5": (lambda hw: hw.admin.delete_subscriber("q", 5), SUBSCRIBER_NAME),
    "add_subscriber partitions 'x'": (
        lambda hw: hw.admin.add_subscriber("q", "s", partitions="x"),
        "partitions is a partition number or a list of them, got str",
    ),
    "add_subscriber partitions [True]": (
        lambda hw: hw.admin.add_subscriber("q", "s", partitions=[True]),
        "a partition is an int, got bool",
    ),
    "add_subscriber tags 5": (
        lambda hw: hw.admin.add_subscriber("q", "s", tags=5),
        "tags is a tag, a list of tags or '*' (every message), got int",
    ),
    "add_subscriber tags ['']": (
        lambda hw: hw.admin.add_subscriber("q", "s", tags=[""]),
        "tags are non-empty strings, got ''",
    ),
    "scanner partitions True": (
        lambda hw: list(hw.scanner("q", partitions=True)),
        "partitions is a partition number or a list of them, got bool",
    ),
    "scanner partitions ['a']": (lambda hw: list(hw.scanner("q", partitions=["a"])), "a partition is an int, got str"),
    "scanner tags 5": (
        lambda hw: list(hw.scanner("q", tags=5)),
        "tags is a tag, a list of tags or '*' (every message), got int",
    ),
    "consumer tags 5": (
        lambda hw: hw.consumer(tags=5),
        "tags is a tag, a list of tags or '*' (every message), got int",
    ),
    "consumer assign partitions {}": (
        lambda hw: hw.consumer().assign("q", {0: 1}),
        "partitions is a partition number or a list of them, got dict",
    ),
    "commit_offsets None": (
        lambda hw: hw.service.commit_offsets("g", "q", None),
        "offsets is a non-empty {partition: offset} mapping, got NoneType",
    ),
    "commit_offsets [1]": (
        lambda hw: hw.service.commit_offsets("g", "q", [1]),
        "offsets is a non-empty {partition: offset} mapping, got list",
    ),
    "commit_offsets {}": (
        lambda hw: hw.service.commit_offsets("g", "q", {}),
        "offsets is a non-empty {partition: offset} mapping, got an empty one",
    ),
    "offset_for_time None": (
        lambda hw: hw.offset_for_time("q", 0, None),
        "when must be a datetime or epoch milliseconds, got None",
    ),
    "offset_for_time 'x'": (
        lambda hw: hw.offset_for_time("q", 0, "x"),
        "when must be a datetime or epoch milliseconds, got str",
    ),
    # issue 30, finding 7: a bare ValueError from dict() in both modes
    "create_queue settings 'x'": (
        lambda hw: hw.admin.create_queue("q2", settings="x"),
        "settings must map strings to strings, got str",
    ),
    # issue 30, finding 7: the embedded broker took these, the network client refused them
    "offset_for_time 2**64": (
        lambda hw: hw.offset_for_time("q", 0, 2**64),
        f"when is out of range: epoch milliseconds fit in 64 bits, got {2**64}",
    ),
    "scanner start_time 2**70": (
        lambda hw: list(hw.scanner("q", start_time=2**70)),
        f"start_time is out of range: epoch milliseconds fit in 64 bits, got {2**70}",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_wrong_type_is_refused_alike_everywhere(hw, case):
    hw.admin.create_queue("q", partitions=2)
    hw.send("q", b"one")  # offset_for_time(None) on a partition with messages once raised TypeError
    call, message = CASES[case]
    with pytest.raises(InvalidArgumentError) as e:
        call(hw)
    assert str(e.value) == message
    assert sum(p.end_offset for p in hw.admin.describe_queue("q").partitions) == 1  # and nothing else changed


def test_the_asyncio_client_refuses_them_alike(aio_target):
    async def test(hw: headwater.aio.AsyncClient) -> None:
        await hw.admin.create_queue("q", partitions=2)
        for call, message in (
            (
                lambda: hw.service.commit_offsets("g", "q", None),
                "offsets is a non-empty {partition: offset} mapping, got NoneType",
            ),
            (lambda: hw.offset_for_time("q", 0, None), "when must be a datetime or epoch milliseconds, got None"),
            (
                lambda: hw.admin.add_subscriber("q", "s", tags=5),
                "tags is a tag, a list of tags or '*' (every message), got int",
            ),
            (lambda: hw.admin.list_subscribers(5), "a queue name is a string, got int"),
        ):
            with pytest.raises(InvalidArgumentError) as e:
                await call()
            assert str(e.value) == message
        with pytest.raises(InvalidArgumentError, match="a partition is an int, got str"):
            async for _ in hw.scanner("q", partitions=["a"]):
                pass

    run(aio_target, test)


NAMES = {
    "queue": lambda hw, name: hw.admin.create_queue(name),
    "group": lambda hw, name: hw.consumer(group=name),
    "shared group": lambda hw, name: hw.shared_consumer(name, "q"),
    "shared member": lambda hw, name: hw.shared_consumer("g", "q", member=name),
    "subscriber": lambda hw, name: hw.admin.add_subscriber("q", name),
}


@pytest.mark.parametrize("what", list(NAMES))
def test_a_name_with_a_trailing_newline_is_refused_and_a_long_one_is_not_echoed_whole(hw, what):
    """Names were matched by ``^...$``, whose ``$`` also matches before a final newline:
    ``create_queue("orders\\n")`` made a queue named so. And a refused name of 10,000
    characters came back whole in the error."""
    hw.admin.create_queue("q")
    with pytest.raises(InvalidArgumentError, match=r"invalid .*'orders\\n'"):
        NAMES[what](hw, "orders\n")
    with pytest.raises(InvalidArgumentError) as e:
        NAMES[what](hw, "x" * 10_000 + "!")
    message = str(e.value)
    assert len(message) < 300 and "10001 characters" in message, message[:120]
    assert [q.name for q in hw.admin.list_queues()] == ["q"]  # nothing made
