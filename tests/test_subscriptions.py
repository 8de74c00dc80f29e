"""Push subscriptions (HQueue 0.3) and server-side filtering.

The registry and the subscriber's delivery run embedded, in memory and over TCP (the ``hw``
fixture); push streams, credit and takeovers over TCP; a subscriber process SIGKILLed
mid-stream on a real broker resumes from its checkpoint without gaps. Filtering is checked
on what crosses the wire, and as a property of the filter itself.
"""

from __future__ import annotations

import doctest
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import headwater
from headwater import Message
from headwater.errors import (
    InvalidArgumentError,
    PartitionOutOfRangeError,
    QueueNotFoundError,
    SubscriberExistsError,
    SubscriberNotFoundError,
    UsageError,
)
from headwater.model.batch import FLAG_CONTROL, check_batch, encode_batch, patch_batch, tag_bit, tags_mask
from headwater.model.batch_reads import decode_records
from headwater.model.filtering import AllOf, TagFilter, TagMaskFilter, filter_batch, message_matches
from headwater.model.keyed import KeyHashFilter
from headwater.model.service import PushStreamSpec
from tests.support.broker_process import BrokerProcess
from tests.support.server_thread import ServerThread
from tests.support.waiting import wait_for

# tags whose bits differ, so a filter by tag hash is exact for them
TAGS = ["a", "b", "c"]
assert len({tag_bit(t) for t in TAGS}) == 3


def tagged(n: int, start: int = 0) -> list[Message]:
    """Messages cycling through tags a, b, c and no tag; bodies are their numbers."""
    return [Message(b"%d" % i, tag=(TAGS + [None])[i % 4]) for i in range(start, start + n)]


def test_docstrings():
    import headwater.cli.subscribers
    import headwater.client.common.subscriber
    import headwater.client.sync.subscriber

    for mod in (headwater.client.sync.subscriber, headwater.client.common.subscriber, headwater.cli.subscribers):
        assert doctest.testmod(mod).failed == 0


# the registry ---------------------------------------------------------------------------------


def test_add_list_describe_delete(hw, clock):
    hw.admin.create_queue("q", partitions=3)
    hw.admin.create_queue("r")
    hw.send_batch("q", [b"x"] * 4, partition=1)
    a = hw.admin.add_subscriber("q", "audit")
    assert a.checkpoints == {0: 0, 1: 4, 2: 0} and a.partitions is None and a.tags is None
    assert a.created_ms == int(clock.now * 1000) or hw.status()["mode"] != "memory"
    b = hw.admin.add_subscriber("q", "billing", partitions=[2, 0], tags=["paid", "refunded"], start="earliest")
    assert b.partitions == [0, 2] and b.tags == ["paid", "refunded"] and b.checkpoints == {0: 0, 2: 0}
    c = hw.admin.add_subscriber("r", "audit", tags="*")
    assert c.tags is None
    assert [(s.queue, s.name) for s in hw.admin.list_subscribers()] == [
        ("q", "audit"),
        ("q", "billing"),
        ("r", "audit"),
    ]
    assert [s.name for s in hw.admin.list_subscribers("q")] == ["audit", "billing"]
    assert hw.admin.describe_subscriber("q", "billing") == b
    hw.admin.delete_subscriber("q", "audit")
    assert [s.name for s in hw.admin.list_subscribers("q")] == ["billing"]
    hw.admin.delete_queue("q")
    assert [(s.queue, s.name) for s in hw.admin.list_subscribers()] == [("r", "audit")]
    hw.admin.create_queue("q")  # the same name again: a new queue, no subscribers
    assert hw.admin.list_subscribers("q") == []


def test_start_positions(hw):
    hw.admin.create_queue("q", partitions=2)
    hw.send_batch("q", [b"x"] * 5, partition=0)
    hw.send_batch("q", [b"x"] * 2, partition=1)
    assert hw.admin.add_subscriber("q", "e", start="earliest").checkpoints == {0: 0, 1: 0}
    assert hw.admin.add_subscriber("q", "l", start="latest").checkpoints == {0: 5, 1: 2}
    assert hw.admin.add_subscriber("q", "o", start="offset:3").checkpoints == {0: 3, 1: 2}
    t = hw.admin.add_subscriber("q", "t", start=10**15)
    assert t.checkpoints == {0: 5, 1: 2}
    assert hw.admin.add_subscriber("q", "t0", start=0).checkpoints == {0: 0, 1: 0}


def test_bad_input_is_refused_and_changes_nothing(hw):
    hw.admin.create_queue("q", partitions=2)
    hw.send("q", b"x", partition=0)
    hw.admin.add_subscriber("q", "audit", start="earliest")
    before = hw.admin.list_subscribers()
    with pytest.raises(SubscriberExistsError, match="already has a subscriber 'audit'"):
        hw.admin.add_subscriber("q", "audit", start="latest")
    with pytest.raises(SubscriberNotFoundError, match="no subscriber 'nope'.*headwater subscriber add q nope"):
        hw.admin.delete_subscriber("q", "nope")
    with pytest.raises(SubscriberNotFoundError):
        hw.admin.describe_subscriber("q", "nope")
    with pytest.raises(SubscriberNotFoundError):
        hw.service.checkpoint_subscriber("q", "nope", {0: 0})
    with pytest.raises(QueueNotFoundError):
        hw.admin.add_subscriber("nope", "audit")
    with pytest.raises(InvalidArgumentError, match="invalid subscriber name"):
        hw.admin.add_subscriber("q", "bad name!")
    with pytest.raises(PartitionOutOfRangeError):
        hw.admin.add_subscriber("q", "x", partitions=[5])
    with pytest.raises(InvalidArgumentError, match="tags are non-empty strings"):
        hw.admin.add_subscriber("q", "x", tags=[""])
    with pytest.raises(InvalidArgumentError, match="start is one of"):
        hw.admin.add_subscriber("q", "x", start="yesterday")
    with pytest.raises(InvalidArgumentError, match="beyond the log end"):
        hw.service.checkpoint_subscriber("q", "audit", {0: 2})
    hw.admin.add_subscriber("q", "only1", partitions=[1])
    with pytest.raises(PartitionOutOfRangeError, match="follows partitions \\[1\\]"):
        hw.service.checkpoint_subscriber("q", "only1", {0: 0})
    hw.admin.delete_subscriber("q", "only1")
    assert hw.admin.list_subscribers() == before


# delivery (embedded and in memory: long polling; over TCP: pushed) ----------------------------


def test_listeners_are_called_in_order_and_the_checkpoint_follows(hw):
    hw.admin.create_queue("q", partitions=2)
    hw.admin.add_subscriber("q", "s", start="earliest")
    hw.send_batch("q", [b"a%d" % i for i in range(20)], partition=0)
    hw.send_batch("q", [b"b%d" % i for i in range(20)], partition=1)
    calls: list[tuple[str, bytes]] = []
    sub = hw.subscribe(
        "q",
        "s",
        listeners=[lambda r: calls.append(("f", r.body)), lambda r: calls.append(("g", r.body))],
        checkpoint_interval_ms=10,
    )
    assert sub.wait_for(lambda: len(calls) == 80)
    for i in range(0, 80, 2):  # each record: f then g
        assert calls[i][0] == "f" and calls[i + 1] == ("g", calls[i][1])
    for p in "ab":
        assert [b for n, b in calls if n == "f" and b.startswith(p.encode())] == [
            b"%s%d" % (p.encode(), i) for i in range(20)
        ]
    late: list[bytes] = []
    sub.add_listener(lambda r: late.append(r.body))
    hw.send("q", b"c", partition=1)
    assert sub.wait_for(lambda: late == [b"c"])
    assert sub.wait_for(lambda: hw.admin.describe_subscriber("q", "s").checkpoints == {0: 20, 1: 21})
    sub.stop()
    assert not sub.running and sub.delivered == 41 and sub.positions == {0: 20, 1: 21}


def test_restart_resumes_from_the_checkpoint(hw):
    hw.admin.create_queue("q", partitions=2)
    hw.admin.add_subscriber("q", "s", start="earliest")
    hw.send_batch("q", [b"%d" % i for i in range(30)], partition=0)
    seen: list[bytes] = []
    sub = hw.subscribe("q", "s", listeners=[seen.append and (lambda r: seen.append(r.body))])
    assert sub.wait_for(lambda: len(seen) == 30)
    sub.stop()
    hw.send_batch("q", [b"%d" % i for i in range(30, 40)], partition=0)
    hw.send_batch("q", [b"p1"], partition=1)
    more: list[bytes] = []
    sub = hw.subscribe("q", "s", listeners=[lambda r: more.append(r.body)])
    assert sub.wait_for(lambda: len(more) == 11)
    time.sleep(0.1)
    sub.stop()
    assert sorted(more) == sorted([b"%d" % i for i in range(30, 40)] + [b"p1"])


def test_tags_are_filtered_and_rechecked(hw):
    hw.admin.create_queue("q", partitions=2)
    hw.admin.add_subscriber("q", "ab", start="earliest", tags=["a", "b"])
    hw.send_batch("q", tagged(40), partition=0)
    hw.send_batch("q", [Message(b"c-only", tag="c")] * 5, partition=1)
    hw.send_batch("q", tagged(8, 40), partition=1)
    got = []
    sub = hw.subscribe("q", "ab", listeners=[got.append])
    assert sub.wait_for(lambda: len(got) == 24)
    assert sub.wait_for(lambda: sub.positions == {0: 40, 1: 13})
    time.sleep(0.1)
    sub.stop()
    assert len(got) == 24 and {r.tag for r in got} == {"a", "b"}
    assert hw.admin.describe_subscriber("q", "ab").checkpoints == {0: 40, 1: 13}  # past the skipped


def test_a_failing_listener_stops_before_its_record(hw):
    hw.admin.create_queue("q")
    hw.admin.add_subscriber("q", "s", start="earliest")
    hw.send_batch("q", [b"%d" % i for i in range(10)], partition=0)
    seen = []

    def fussy(r):
        if r.body == b"4":
            raise RuntimeError("cannot handle 4")
        seen.append(r.body)

    sub = hw.subscribe("q", "s", listeners=[fussy])
    with pytest.raises(RuntimeError, match="cannot handle 4"):
        sub.wait(10)
    assert seen == [b"0", b"1", b"2", b"3"]
    assert hw.admin.describe_subscriber("q", "s").checkpoints == {0: 4}
    again = []
    sub = hw.subscribe("q", "s", listeners=[lambda r: again.append(r.body)])
    assert sub.wait_for(lambda: len(again) == 6)
    sub.stop()
    assert again[0] == b"4"
    skipped = []
    hw.admin.add_subscriber("q", "t", start="earliest")
    sub = hw.subscribe("q", "t", listeners=[fussy, lambda r: skipped.append(r.body)], on_error="skip")
    assert sub.wait_for(lambda: sub.positions == {0: 10})
    sub.stop()
    assert b"4" not in skipped and len(skipped) == 9 and sub.error is None


def test_the_checkpoint_follows_slow_listeners_within_one_push(hw):
    # one stored batch of 300 is one push (or one poll): the checkpoint must not wait for its end
    hw.admin.create_queue("q")
    hw.admin.add_subscriber("q", "s", start="earliest")
    hw.send_batch("q", [b"%d" % i for i in range(300)], partition=0)
    release = threading.Event()

    def slow(r):
        time.sleep(0.002)
        if r.offset == 150:
            release.wait(10)  # a listener stuck on the 151st record, as a process about to crash

    sub = hw.subscribe("q", "s", listeners=[slow], checkpoint_interval_ms=10)
    try:
        stored = wait_for(lambda: hw.admin.describe_subscriber("q", "s").checkpoints[0], 5, "a checkpoint mid-push")
        assert sub.delivered < 300 and 0 < stored <= 150
    finally:
        release.set()
    assert sub.wait_for(lambda: sub.positions == {0: 300})
    sub.stop()
    assert hw.admin.describe_subscriber("q", "s").checkpoints == {0: 300}


def test_a_disabled_queue_pauses_a_subscriber_and_does_not_stop_it(hw):
    # over the network the broker's stream waits for the queue to be enabled; embedded (and
    # in memory) the subscriber stopped with QueueDisabledError, at start and mid-run
    hw.admin.create_queue("q")
    hw.admin.add_subscriber("q", "s", start="earliest")
    hw.send("q", b"before", partition=0)
    hw.admin.disable_queue("q")
    got = []
    sub = hw.subscribe("q", "s", listeners=[lambda r: got.append(r.body)])
    assert not sub.wait(0.5) and sub.running and got == []  # subscribed while disabled: it waits
    hw.admin.enable_queue("q")
    assert sub.wait_for(lambda: got == [b"before"])
    hw.admin.disable_queue("q")
    assert not sub.wait(0.5) and sub.running  # disabled while it runs: it waits
    hw.admin.enable_queue("q")
    hw.send("q", b"after", partition=0)
    assert sub.wait_for(lambda: got == [b"before", b"after"])
    sub.stop()
    assert sub.error is None and hw.admin.describe_subscriber("q", "s").checkpoints == {0: 2}


def test_partitions_added_later_are_followed(hw):
    hw.admin.create_queue("q", partitions=1)
    hw.admin.add_subscriber("q", "all")
    got = []
    sub = hw.subscribe("q", "all", listeners=[got.append])
    hw.admin.add_partitions("q", 3)
    time.sleep(0.3)
    hw.send("q", b"new", partition=2)
    assert sub.wait_for(lambda: [r.body for r in got] == [b"new"], timeout_s=10)
    sub.stop()


def test_an_unknown_subscriber_stops_with_a_clear_error(hw):
    hw.admin.create_queue("q")
    sub = hw.subscribe("q", "nope", listeners=[print])
    with pytest.raises(SubscriberNotFoundError, match="no subscriber 'nope'"):
        sub.wait(10)


# push over the network -------------------------------------------------------------------------


@pytest.fixture
def net(tmp_path, clock):
    server = ServerThread(tmp_path / "data", time.time)
    client = headwater.connect(server.address)
    yield client, server
    client.close()
    server.stop()


class Wire:
    """A raw push stream that records every PUSH body it gets (what crossed the wire)."""

    def __init__(self, hw, queue: str, name: str, credit_messages: int = 10_000, credit_bytes: int = 1 << 26):
        self.bodies: list = []
        self.lock = threading.Lock()
        self.hw = hw
        spec = PushStreamSpec(queue, name, credit_messages, credit_bytes)
        self.sid, self.info = hw.service.open_push_stream(spec, self._got)

    def _got(self, body) -> None:
        with self.lock:
            self.bodies.append(body)

    def records(self) -> list:
        with self.lock:
            bodies = list(self.bodies)
        return [r for b in bodies if b is not None for batch in b.batches for r in decode_records(batch, "q")]

    def wire_bytes(self) -> int:
        with self.lock:
            return sum(len(batch) for b in self.bodies if b is not None for batch in b.batches)

    def wait(self, cond, timeout_s: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout_s
        while not cond():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True


def test_push_sends_only_matching_messages(net):
    hw, _ = net
    hw.admin.create_queue("q")
    hw.admin.add_subscriber("q", "a", start="earliest", tags=["a"])
    hw.send_batch("q", tagged(400), partition=0)  # one batch: a quarter is 'a'
    hw.send_batch("q", [Message(b"b", tag="b")] * 50, partition=0)  # skipped whole by its tag summary
    hw.send_batch("q", [Message(b"a!", tag="a")] * 50, partition=0)  # all match: sent as stored
    total = sum(len(b) for b in hw.service.fetch("q", 0, 0, max_bytes=1 << 30).batches)
    wire = Wire(hw, "q", "a")
    assert wire.wait(lambda: len(wire.records()) >= 150)
    time.sleep(0.2)
    recs = wire.records()  # every message of every batch that crossed the wire
    assert len(recs) == 150 and {r.tag for r in recs} == {"a"}
    assert [r.offset for r in recs] == sorted(r.offset for r in recs)
    assert wire.wire_bytes() < total / 2
    assert wire.bodies[-1].next_offset == 500
    hw.service.close_push_stream(wire.sid)


def test_fetch_by_tag_mask_drops_messages_inside_batches(hw):
    hw.admin.create_queue("q")
    hw.send_batch("q", tagged(100), partition=0)
    res = hw.service.fetch("q", 0, 0, max_bytes=1 << 20, tag_mask=tags_mask(["b"]))
    recs = [r for b in res.batches for r in decode_records(b, "q")]
    assert [r.offset for r in recs] == list(range(1, 100, 4)) and res.next_offset == 100
    assert all(check_batch(b) for b in res.batches)
    assert [r.tag for r in hw.scanner("q", tags="b")] == ["b"] * 25  # and the reader agrees
    assert len(list(hw.scanner("q"))) == 100  # no filter: the stored batch, untouched
    assert hw.service.fetch("q", 0, 0, max_bytes=1 << 20).batches[0] == bytes(
        hw.service.fetch("q", 0, 0, max_bytes=1 << 20).batches[0]
    )


def test_credit_bounds_what_is_pushed(net):
    hw, _ = net
    hw.admin.create_queue("q")
    hw.admin.add_subscriber("q", "s", start="earliest")
    for i in range(100):
        hw.send("q", b"%d" % i, partition=0)
    wire = Wire(hw, "q", "s", credit_messages=5)
    assert wire.wait(lambda: len(wire.records()) >= 5)
    time.sleep(0.3)
    assert len(wire.records()) == 5  # one message per stored batch: exactly the credit
    hw.service.ack_push_stream(wire.sid, {0: 5}, 10, 0).result(5)
    assert wire.wait(lambda: len(wire.records()) >= 15)
    time.sleep(0.3)
    assert len(wire.records()) == 15
    assert hw.admin.describe_subscriber("q", "s").checkpoints == {0: 5}
    hw.service.close_push_stream(wire.sid)
    # bytes are credit too: one byte lets one batch through, then nothing
    hw.admin.add_subscriber("q", "t", start="earliest")
    wire = Wire(hw, "q", "t", credit_bytes=1)
    assert wire.wait(lambda: len(wire.records()) >= 1)
    time.sleep(0.3)
    assert len(wire.records()) == 1
    hw.service.close_push_stream(wire.sid)


def test_a_second_process_takes_the_subscriber_over(net):
    hw, server = net
    hw.admin.create_queue("q")
    hw.admin.add_subscriber("q", "s", start="earliest")
    other = headwater.connect(server.address)
    try:
        first = hw.subscribe("q", "s", listeners=[lambda r: None])
        time.sleep(0.2)
        second_seen = []
        second = other.subscribe("q", "s", listeners=[second_seen.append])
        with pytest.raises(UsageError, match="took the stream over"):
            first.wait(10)
        hw.send("q", b"x", partition=0)
        assert second.wait_for(lambda: len(second_seen) == 1)
        hw.admin.delete_subscriber("q", "s")
        with pytest.raises(SubscriberNotFoundError, match="was deleted"):
            second.wait(10)
    finally:
        other.close()


def test_a_claim_bumps_a_durable_epoch_that_fences_older_checkpoints(tmp_path):
    """The epoch a cluster's coordinator keeps, on one broker's registry: each claim adds
    one, durably (it is in the record that moves with a coordinator), and a checkpoint
    naming an older epoch is refused while one naming none (a broker alone) is not."""
    with headwater.open(tmp_path) as hw:
        hw.admin.create_queue("q", partitions=2)
        assert hw.admin.add_subscriber("q", "s", start="earliest").epoch == 0
        hw.send_batch("q", [b"x"] * 4, partition=0)
        assert [hw.service.claim_subscriber("q", "s").epoch for _ in range(2)] == [1, 2]
        with pytest.raises(UsageError, match="took the stream over"):
            hw.service.checkpoint_subscriber("q", "s", {0: 3}, 1)
        hw.service.checkpoint_subscriber("q", "s", {0: 2}, 2)
        hw.service.checkpoint_subscriber("q", "s", {0: 3})
        with pytest.raises(SubscriberNotFoundError):
            hw.service.claim_subscriber("q", "nobody")
    with headwater.open(tmp_path) as hw:
        info = hw.admin.describe_subscriber("q", "s")
        assert (info.epoch, info.checkpoints) == (2, {0: 3, 1: 0})


def test_stream_requests_are_checked(net):
    hw, _ = net
    hw.admin.create_queue("q")
    with pytest.raises(SubscriberNotFoundError):
        hw.service.open_push_stream(PushStreamSpec("q", "nope", 1, 1), lambda b: None)
    hw.admin.add_subscriber("q", "s")
    with pytest.raises(InvalidArgumentError, match="needs some credit"):
        hw.service.open_push_stream(PushStreamSpec("q", "s", 0, 1), lambda b: None)
    with pytest.raises(SubscriberNotFoundError, match="no push stream 77"):
        hw.service.ack_push_stream(77, {}, 1, 1).result(5)
    # a stream of some partitions (a cluster's kind) needs an epoch and partitions that exist
    with pytest.raises(InvalidArgumentError, match="epoch"):
        hw.service.open_push_stream(PushStreamSpec("q", "s", 1, 1, positions={0: 0}), lambda b: None)
    with pytest.raises(InvalidArgumentError, match="names at least one partition"):
        hw.service.open_push_stream(PushStreamSpec("q", "s", 1, 1, 1, {}), lambda b: None)
    with pytest.raises(PartitionOutOfRangeError):
        hw.service.open_push_stream(PushStreamSpec("q", "s", 1, 1, 1, {5: 0}), lambda b: None)
    with pytest.raises(InvalidArgumentError, match="0 or more"):
        hw.service.open_push_stream(PushStreamSpec("q", "s", 1, 1, 1, {0: -1}), lambda b: None)
    assert hw.status()["push_streams"] == 0


def test_a_subscriber_outlives_a_broker_restart(tmp_path):
    broker = BrokerProcess(tmp_path / "data").start()
    try:
        hw = headwater.connect(broker.address)
        hw.admin.create_queue("q")
        hw.admin.add_subscriber("q", "s", start="earliest")
        hw.send_batch("q", [b"%d" % i for i in range(10)], partition=0)
        seen = []
        sub = hw.subscribe("q", "s", listeners=[lambda r: seen.append(int(r.body))])
        assert sub.wait_for(lambda: len(seen) == 10)
        broker.terminate()
        broker = BrokerProcess(tmp_path / "data", port=broker.port).start()
        hw.send_batch("q", [b"%d" % i for i in range(10, 20)], partition=0)
        assert sub.wait_for(lambda: len(seen) == 20, timeout_s=20), seen
        sub.stop()
        assert seen == list(range(20))
        hw.close()
    finally:
        broker.kill()


SUBSCRIBER = str(Path(__file__).parent / "support" / "subscriber_proc.py")


@pytest.mark.slow
@pytest.mark.parametrize("flavour", ["sync", "asyncio"])
def test_a_subscriber_process_killed_mid_stream_resumes_without_gaps(tmp_path, flavour):
    """A producer keeps sending; the subscriber process is SIGKILLed twice mid-stream and
    started again. Each run starts exactly at the checkpoint stored when the run before it
    died, and reads on without a gap; together the runs processed every message. What a run
    processed after its last checkpoint is processed again by the next (at least once)."""
    broker = BrokerProcess(tmp_path / "data").start()
    stop = threading.Event()
    sent = Counter()
    runs: list[tuple[Path, dict[int, int]]] = []  # (log, the checkpoints it started from)
    procs: list[subprocess.Popen] = []
    try:
        hw = headwater.connect(broker.address)
        hw.admin.create_queue("q", partitions=2)
        hw.admin.add_subscriber("q", "s", start="earliest")

        def produce() -> None:
            i = 0
            while not stop.is_set() and i < 3000:
                hw.send_batch("q", [b"%d" % (i + j) for j in range(10)], partition=(i // 10) % 2)
                i += 10
                time.sleep(0.005)
            sent["n"] = i

        def start_run() -> subprocess.Popen:
            log = tmp_path / f"run-{len(runs)}.log"
            log.touch()
            runs.append((log, hw.admin.describe_subscriber("q", "s").checkpoints))
            proc = subprocess.Popen(
                [
                    sys.executable,
                    SUBSCRIBER,
                    broker.address,
                    "q",
                    "s",
                    str(log),
                    *(["--asyncio"] if flavour == "asyncio" else []),
                ],
                stdout=subprocess.PIPE,
            )
            procs.append(proc)
            assert proc.stdout.readline().startswith(b"subscribed")
            return proc

        producer = threading.Thread(target=produce)
        producer.start()
        for _ in range(2):
            proc = start_run()
            deadline = time.monotonic() + 20
            started = sum(runs[-1][1].values())
            while (
                len(runs[-1][0].read_text().splitlines()) < 300
                or sum(hw.admin.describe_subscriber("q", "s").checkpoints.values()) <= started
            ):
                assert time.monotonic() < deadline
                time.sleep(0.01)
            proc.kill()  # SIGKILL, mid-stream: no last checkpoint
            proc.wait()
            proc.stdout.close()
        proc = start_run()
        producer.join(60)
        deadline = time.monotonic() + 60
        while True:
            rows = [
                (int(p), int(o), int(b))
                for log, _ in runs
                for p, o, b in (ln.split() for ln in log.read_text().splitlines())
            ]
            if len({b for _, _, b in rows}) == sent["n"]:
                break
            assert time.monotonic() < deadline, f"{len({b for _, _, b in rows})} of {sent['n']} processed"
            time.sleep(0.1)
        proc.kill()
        proc.wait()
        proc.stdout.close()
        assert sorted({b for _, _, b in rows}) == list(range(sent["n"]))  # no gaps, all together
        for k, (log, started) in enumerate(runs):
            mine = [(int(p), int(o)) for p, o, _ in (ln.split() for ln in log.read_text().splitlines())]
            for part in (0, 1):
                offs = [o for p, o in mine if p == part]
                if offs:  # from its checkpoint on, one after the other
                    assert offs == list(range(started.get(part, 0), started.get(part, 0) + len(offs))), (k, part)
            if k:  # it resumed from what the run before had stored, not from the start
                assert sum(started.values()) > sum(runs[k - 1][1].values())
        hw.close()
    finally:
        stop.set()
        for proc in procs:  # a failed run must not leave its subscribers running
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stdout.close()
        broker.kill()


# the CLI ------------------------------------------------------------------------------------


def test_cli_subscriber_commands(tmp_path):
    from headwater.cli.main import app

    data = str(tmp_path / "d")
    run = CliRunner().invoke
    assert run(app, ["--data", data, "queue", "create", "orders", "-p", "2"]).exit_code == 0
    r = run(
        app,
        [
            "--data",
            data,
            "subscriber",
            "add",
            "orders",
            "audit",
            "--from",
            "earliest",
            "--tags",
            "paid,refunded",
            "-p",
            "1",
        ],
    )
    assert r.exit_code == 0 and "added subscriber 'audit'" in r.output
    r = run(app, ["--data", data, "subscriber", "add", "orders", "audit"])
    assert r.exit_code == 1 and "already has a subscriber 'audit'" in r.output
    r = run(app, ["--data", data, "subscriber", "list", "--json"])
    assert r.exit_code == 0 and '"tags": ["paid", "refunded"]' in r.output and '"partitions": [1]' in r.output
    r = run(app, ["--data", data, "subscriber", "list"])
    assert "audit" in r.output and "paid,refunded" in r.output
    r = run(app, ["--data", data, "subscriber", "describe", "orders", "audit"])
    assert r.exit_code == 0 and "checkpoint" in r.output
    r = run(app, ["--data", data, "subscriber", "add", "orders", "x", "--from", "soon"])
    assert r.exit_code == 1 and "--from" in r.output
    assert run(app, ["--data", data, "subscriber", "delete", "orders", "audit"]).exit_code == 0
    r = run(app, ["--data", data, "subscriber", "delete", "orders", "audit"])
    assert r.exit_code == 1 and "no subscriber 'audit'" in r.output
    assert "no subscribers" in run(app, ["--data", data, "subscriber", "list"]).output


# the filter itself -------------------------------------------------------------------------------

msgs = st.lists(
    st.builds(
        Message,
        st.binary(max_size=20),
        key=st.none() | st.sampled_from([b"k1", b"k2", b"k3", b"k4"]),
        tag=st.none() | st.sampled_from(["a", "b", "c", "d"]),
        properties=st.none() | st.fixed_dictionaries({"user": st.sampled_from(["u1", "u2", "u3"])}),
    ),
    min_size=1,
    max_size=30,
)
filters = st.one_of(
    st.sets(st.sampled_from(["a", "b", "c", "d"]), min_size=1).map(lambda t: TagFilter(frozenset(t))),
    st.sets(st.sampled_from(["a", "b", "c", "d"]), min_size=1).map(lambda t: TagMaskFilter(tags_mask(t))),
    st.integers(1, 4).flatmap(
        lambda n: st.builds(KeyHashFilter, st.sampled_from([None, "user"]), st.just(n), st.integers(0, n - 1))
    ),
)


@settings(max_examples=300, deadline=None)
@given(
    messages=msgs,
    flt=filters,
    base=st.integers(0, 1000),
    cut=st.integers(0, 40),
    end=st.integers(0, 40),
    compression=st.sampled_from([None, "zstd"]),
)
def test_filter_keeps_exactly_the_matching_messages(messages, flt, base, cut, end, compression):
    stored = bytes(patch_batch(encode_batch(messages, compression=compression), 3, 1, base, 1_800_000_000_000))
    lo, hi = base + cut, base + cut + end
    out = filter_batch(stored, flt, start_offset=lo, end_offset=hi)
    want = [(base + i, m.body) for i, m in enumerate(messages) if message_matches(flt, m) and lo <= base + i < hi]
    got = []
    for b in out:
        check_batch(b)  # both checksums right: a reader takes it for a stored batch
        recs = decode_records(b, "q")
        assert all(
            message_matches(flt, Message(r.body, key=r.key, tag=r.tag, properties=r.properties)) for r in recs
        ), "a message that does not match was kept"
        if b is stored:
            assert all(message_matches(flt, m) for m in messages)
        got += [(r.offset, r.body) for r in recs if lo <= r.offset < hi]
    assert got == want


def test_filter_keeps_whole_batches_and_control_batches():
    stored = bytes(patch_batch(encode_batch([Message(b"x", tag="a")] * 3), 1, 0, 10, 5))
    assert filter_batch(stored, TagFilter(frozenset({"a"})))[0] is stored
    assert filter_batch(stored, TagFilter(frozenset({"b"}))) == []
    control = bytes(patch_batch(encode_batch([b"marker"], extra_flags=FLAG_CONTROL), 1, 0, 13, 5))
    assert filter_batch(control, TagFilter(frozenset({"b"})))[0] is control
    both = AllOf([TagFilter(frozenset({"a"})), KeyHashFilter(None, 1, 0)])
    assert filter_batch(stored, both)[0] is stored


# the asyncio services carry the same calls ------------------------------------------------------


@pytest.mark.parametrize("kind", ["embedded", "network"])
def test_asyncio_services(tmp_path, kind):
    import asyncio

    import headwater.aio

    async def main() -> None:
        server = ServerThread(tmp_path / "net", time.time) if kind == "network" else None
        hw = await (headwater.aio.connect(server.address) if server else headwater.aio.open(tmp_path / "emb"))
        svc = hw.service
        try:
            await hw.admin.create_queue("q")
            await svc.produce("q", 0, encode_batch([Message(b"x", key=b"k%d" % i, tag="a") for i in range(8)]))
            info = await svc.add_subscriber("q", "s", None, ["a"], "earliest")
            assert [s.name for s in await svc.list_subscribers("q")] == ["s"]
            await svc.checkpoint_subscriber("q", "s", {0: 3})
            assert (await svc.describe_subscriber("q", "s")).checkpoints == {0: 3} != info.checkpoints
            await svc.delete_subscriber("q", "s")
            with pytest.raises(SubscriberNotFoundError):
                await svc.describe_subscriber("q", "s")
            g = await svc.keyed_group("q", "g", "key", 2)
            got = 0
            for m in (0, 1):
                res = await svc.keyed_fetch("q", "g", m, g.generation, 0, 0, max_bytes=1 << 20, max_wait_ms=10)
                got += sum(
                    len(decode_records(b, "q"))
                    if not res.selections or not res.selections[i]
                    else len(res.selections[i])
                    for i, b in enumerate(res.batches)
                )
                await svc.keyed_commit("q", "g", m, g.generation, {0: res.next_offset})
            assert got == 8
            assert (await svc.keyed_resize("q", "g", 3)).generation == 2  # everyone was at the end
        finally:
            await hw.close()
            if server:
                server.stop()

    asyncio.run(main())


def test_stopping_a_subscriber_closes_its_stream(net):
    hw, _ = net
    hw.admin.create_queue("q")
    hw.admin.add_subscriber("q", "s")
    sub = hw.subscribe("q", "s")
    assert sub.wait_for(lambda: hw.status()["push_streams"] == 1)
    hw.send("q", b"x", partition=0)
    assert sub.wait_for(lambda: sub.delivered == 1)
    sub.stop()
    assert hw.status()["push_streams"] == 0
    assert hw.admin.describe_subscriber("q", "s").checkpoints == {0: 1}


def test_stop_finishes_the_record_in_progress_and_checkpoints_it(hw):
    hw.admin.create_queue("q")
    hw.admin.add_subscriber("q", "s", start="earliest")
    hw.send_batch("q", [b"%d" % i for i in range(10)], partition=0)
    seen, subs = [], []

    def listener(r):
        seen.append(r.body)
        if r.body == b"3":
            subs[0].stop()  # from the listener's own thread: returns at once

    subs.append(hw.subscribe("q", "s", listeners=[listener], start=False))
    subs[0].start()
    assert subs[0].wait(10)
    assert seen == [b"0", b"1", b"2", b"3"]
    assert hw.admin.describe_subscriber("q", "s").checkpoints == {0: 4}


# the asyncio subscriber (headwater.aio: pushed over TCP, long polling embedded) -----------------


def test_an_asyncio_subscriber(aio_target, monkeypatch):
    """AsyncSubscriber: plain and coroutine listeners in order, the checkpoint following,
    tags, a failing listener, a stop from a listener, partitions added later, an unknown
    subscriber, and the client's close storing the checkpoint."""
    import asyncio

    import headwater.client.common.subscriber as common_subscriber
    from tests.support.aio_target import run

    monkeypatch.setattr(common_subscriber, "PARTITIONS_CHECK_S", 0.05)  # how often it looks, embedded

    async def test(hw):
        await hw.admin.create_queue("q", partitions=2)
        await hw.admin.add_subscriber("q", "s", start="earliest")
        await hw.send_batch("q", [b"a%d" % i for i in range(20)], partition=0)
        await hw.send_batch("q", [b"b%d" % i for i in range(20)], partition=1)
        calls: list[tuple[str, bytes]] = []

        async def later(r):
            await asyncio.sleep(0)
            calls.append(("g", r.body))

        sub = hw.subscribe(
            "q", "s", listeners=[lambda r: calls.append(("f", r.body)), later], checkpoint_interval_ms=10
        )
        assert sub.mode == ("push" if aio_target.kind in ("network", "cluster") else "pull")
        assert await sub.wait_for(lambda: len(calls) == 80)
        for i in range(0, 80, 2):  # each record: f, then g awaited, before the next record
            assert calls[i][0] == "f" and calls[i + 1] == ("g", calls[i][1])
        for p in (b"a", b"b"):
            assert [b for n, b in calls if n == "f" and b.startswith(p)] == [p + b"%d" % i for i in range(20)]
        await hw.send("q", b"c", partition=1)
        assert await sub.wait_for(lambda: calls[-1] == ("g", b"c"))

        async def stored():
            return (await hw.admin.describe_subscriber("q", "s")).checkpoints

        deadline = time.monotonic() + 10
        while await stored() != {0: 20, 1: 21} and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert await stored() == {0: 20, 1: 21}
        await sub.stop()
        assert not sub.running and sub.closed and sub.delivered == 41 and sub.positions == {0: 20, 1: 21}

        # tags: filtered (on the broker when pushed) and checked again; the checkpoint passes the rest
        await hw.admin.add_subscriber("q", "ab", start="earliest", tags=["a", "b"])
        await hw.send_batch("q", tagged(40), partition=0)
        got = []
        async with hw.subscribe("q", "ab", listeners=[got.append], start=False) as tagged_sub:
            assert await tagged_sub.wait_for(lambda: len(got) == 20 and tagged_sub.positions.get(0) == 60)
        assert {r.tag for r in got} == {"a", "b"} and [r.offset for r in got] == sorted(r.offset for r in got)
        assert (await hw.admin.describe_subscriber("q", "ab")).checkpoints[0] == 60

        # a failing listener stops the subscriber before its record; the next one starts there
        await hw.admin.create_queue("f")
        await hw.admin.add_subscriber("f", "s", start="earliest")
        await hw.send_batch("f", [b"%d" % i for i in range(10)])
        seen = []

        async def fussy(r):
            if r.body == b"4":
                raise RuntimeError("cannot handle 4")
            seen.append(r.body)

        failing = hw.subscribe("f", "s", listeners=[fussy])
        with pytest.raises(RuntimeError, match="cannot handle 4"):
            await failing.wait(10)
        assert seen == [b"0", b"1", b"2", b"3"] and not failing.running
        assert (await hw.admin.describe_subscriber("f", "s")).checkpoints == {0: 4}

        # a stop from a listener (the subscriber's own task) returns at once; the record is checkpointed
        again, holder = [], []

        async def stop_at_6(r):
            again.append(r.body)
            if r.body == b"6":
                await holder[0].stop()

        holder.append(hw.subscribe("f", "s", listeners=[stop_at_6]))
        assert await holder[0].wait(10)
        assert again == [b"4", b"5", b"6"]
        assert (await hw.admin.describe_subscriber("f", "s")).checkpoints == {0: 7}

        # on_error="skip": the record is passed, the listeners after the failing one miss it
        await hw.admin.add_subscriber("f", "t", start="earliest")
        skipped = []
        skipping = hw.subscribe("f", "t", listeners=[fussy, skipped.append], on_error="skip")
        assert await skipping.wait_for(lambda: skipping.positions == {0: 10})
        await skipping.stop()
        assert len(skipped) == 9 and skipping.error is None

        # partitions added while it runs are followed
        await hw.admin.add_subscriber("q", "all")  # from the end
        fresh = []
        follower = hw.subscribe("q", "all", listeners=[fresh.append])
        await asyncio.sleep(0.2)
        await hw.admin.add_partitions("q", 3)
        await asyncio.sleep(1.2 if aio_target.kind == "network" else 0.3)  # the broker looks every second
        await hw.send("q", b"new", partition=2)
        assert await follower.wait_for(lambda: [r.body for r in fresh] == [b"new"], timeout_s=10)

        # an unknown subscriber stops with a clear error
        nobody = hw.subscribe("q", "nope", listeners=[print])
        with pytest.raises(SubscriberNotFoundError, match="no subscriber 'nope'"):
            await nobody.wait(10)

        # bad settings are refused when the subscriber is made
        with pytest.raises(InvalidArgumentError, match="on_error"):
            hw.subscribe("q", "s", on_error="retry")
        with pytest.raises(InvalidArgumentError, match="credit_messages"):
            hw.subscribe("q", "s", credit_messages=0)
        with pytest.raises(InvalidArgumentError, match="a listener is a callable"):
            hw.subscribe("q", "s", listeners=["not callable"])
        with pytest.raises(InvalidArgumentError, match="checkpoint_interval_ms"):
            hw.subscribe("q", "s", checkpoint_interval_ms=-1)

        # the client's close stops the follower and stores its checkpoint (checked below)
        await hw.send("q", b"last", partition=0)
        assert await follower.wait_for(lambda: len(fresh) == 2)
        kept.append(follower)

    kept: list = []
    run(aio_target, test)
    assert not kept[0].running
    if aio_target.kind != "memory":  # (nothing is kept of an in-memory broker)
        with (
            headwater.connect(aio_target.addresses)
            if aio_target.kind == "cluster"
            else headwater.open(aio_target.path)
            if aio_target.server is None
            else headwater.connect(aio_target.server.address) as hw
        ):
            assert hw.admin.describe_subscriber("q", "all").checkpoints == kept[0].positions


def test_an_asyncio_subscriber_is_taken_over_and_outlives_a_restart(tmp_path):
    """Over TCP: a broker restart is survived (it subscribes again, nothing twice), a second
    process takes the name over (the first stops with the broker's error), and deleting the
    subscriber stops the second."""
    import asyncio

    import headwater.aio

    broker = BrokerProcess(tmp_path / "data").start()

    async def main() -> None:
        nonlocal broker
        hw = await headwater.aio.connect(broker.address)
        other = None
        try:
            await hw.admin.create_queue("q")
            await hw.admin.add_subscriber("q", "s", start="earliest")
            await hw.send_batch("q", [b"%d" % i for i in range(10)], partition=0)
            seen = []
            sub = hw.subscribe("q", "s", listeners=[lambda r: seen.append(int(r.body))])
            assert await sub.wait_for(lambda: len(seen) == 10)
            await asyncio.to_thread(broker.terminate)
            broker = await asyncio.to_thread(BrokerProcess(tmp_path / "data", port=broker.port).start)
            await hw.send_batch("q", [b"%d" % i for i in range(10, 20)], partition=0)
            assert await sub.wait_for(lambda: len(seen) == 20, timeout_s=20), seen
            assert seen == list(range(20)) and sub.running

            other = await headwater.aio.connect(broker.address)
            second_seen = []
            second = other.subscribe("q", "s", listeners=[second_seen.append])
            with pytest.raises(UsageError, match="took the stream over"):
                await sub.wait(10)
            await hw.send("q", b"x", partition=0)
            assert await second.wait_for(lambda: len(second_seen) == 1)
            await hw.admin.delete_subscriber("q", "s")
            with pytest.raises(SubscriberNotFoundError, match="was deleted"):
                await second.wait(10)
            assert (await hw.status())["push_streams"] == 0
        finally:
            if other is not None:
                await other.close()
            await hw.close()

    try:
        asyncio.run(main())
    finally:
        broker.kill()


def test_a_last_checkpoint_never_answered_still_stops_the_subscriber(monkeypatch):
    """Stopping waits FINAL_ACK_TIMEOUT_S for the broker to take the last checkpoint; a
    broker that never answers (a connection that hangs) is logged, and the subscriber still
    stops: wait() returns. (The sync subscriber's thread used to die of the TimeoutError
    before marking itself stopped, so wait() hung.)"""
    import asyncio
    import concurrent.futures

    import headwater.client.common.subscriber as subscriber
    from headwater.client.aio.subscriber import AsyncSubscriber
    from headwater.client.sync.subscriber import Subscriber
    from headwater.model.subscription import SubscriberInfo

    monkeypatch.setattr(subscriber, "FINAL_ACK_TIMEOUT_S", 0.2)
    info = SubscriberInfo(queue="q", name="s", checkpoints={0: 0})

    class Silent:
        """Opens a push stream, then never answers an acknowledgement."""

        def __init__(self, make_future) -> None:
            self.make_future, self.closed = make_future, []

        def open_push_stream(self, spec, handler):
            self.handler = handler
            return 7, info

        def ack_push_stream(self, stream_id, offsets, credit_messages, credit_bytes):
            return self.make_future()

        def close_push_stream(self, stream_id):
            self.closed.append(stream_id)

    from headwater.protocol import messages as m
    from headwater.testing import open_memory

    mem = open_memory()
    mem.admin.create_queue("q")
    mem.send("q", b"x")
    stored = mem.service.fetch("q", 0, 0, max_bytes=1 << 20).batches  # a batch as the broker keeps it
    mem.close()

    def push(handler) -> None:
        handler(m.SubscriptionPush(7, 0, stored, 1, 1))

    svc = Silent(concurrent.futures.Future)
    seen = []
    sub = Subscriber(svc, "q", "s", [seen.append])
    assert sub.wait_for(lambda: hasattr(svc, "handler"))
    push(svc.handler)
    assert sub.wait_for(lambda: seen)
    sub.stop()
    assert sub.wait(5) and svc.closed == [7]

    class SilentAsync(Silent):
        async def open_push_stream(self, *args, **kw):
            return Silent.open_push_stream(self, *args, **kw)

        async def close_push_stream(self, stream_id):
            self.closed.append(stream_id)

    async def main() -> None:
        svc = SilentAsync(lambda: asyncio.get_running_loop().create_future())
        seen = []
        sub = AsyncSubscriber(svc, "q", "s", [seen.append])
        assert await sub.wait_for(lambda: hasattr(svc, "handler"))
        push(svc.handler)
        assert await sub.wait_for(lambda: seen)
        await sub.stop()
        assert await sub.wait(5) and svc.closed == [7]

    asyncio.run(main())


def test_the_two_subscribers_are_one_body_driven_two_ways():
    """Subscriber and AsyncSubscriber run the delivery of headwater.client.common.subscriber:
    what waits is a plain method of the one and a coroutine of the other, with one signature
    and one docstring; what does not wait is plain on both. ``Listener`` is still importable
    from the sync module."""
    import asyncio
    import inspect

    from headwater.client.aio.subscriber import AsyncSubscriber
    from headwater.client.common import subscriber as common
    from headwater.client.sync.subscriber import Listener, Subscriber

    assert Listener is common.Listener
    for name in ("stop", "close", "wait", "wait_for"):
        sync_method, aio_method = getattr(Subscriber, name), getattr(AsyncSubscriber, name)
        assert not inspect.iscoroutinefunction(sync_method) and inspect.iscoroutinefunction(aio_method), name
        assert inspect.signature(sync_method) == inspect.signature(aio_method), name
        assert sync_method.__doc__ == aio_method.__doc__ and sync_method.__doc__, name
    for name in ("start", "add_listener"):
        assert not inspect.iscoroutinefunction(getattr(AsyncSubscriber, name)), name
    assert inspect.signature(Subscriber) == inspect.signature(AsyncSubscriber)

    class Idle:
        """A service no subscriber is started on."""

    sub = Subscriber(Idle(), "q", "s", start=False)
    sub.stop()  # never started: stopping is a no-op, and nothing waits
    assert not sub.running and not sub.wait(0)

    async def main() -> None:
        sub = AsyncSubscriber(Idle(), "q", "s", start=False)
        await sub.stop()
        assert sub.closed and not sub.running and await sub.wait(0)

    asyncio.run(main())


def test_deleting_a_running_subscriber_stops_it_in_every_mode(hw):
    """Embedded (pull) the subscriber looked only at its queue: deleted, it went on
    delivering new messages. Now it stops before delivering another, with the same error
    as over the network."""
    hw.admin.create_queue("q")
    hw.admin.add_subscriber("q", "s")
    got: list[bytes] = []
    sub = hw.subscribe("q", "s", listeners=[lambda r: got.append(r.body)])
    try:
        hw.send("q", b"before")
        assert sub.wait_for(lambda: got == [b"before"], timeout_s=10)
        hw.admin.delete_subscriber("q", "s")
        hw.send("q", b"after delete")
        with pytest.raises(SubscriberNotFoundError, match="subscriber 's' of queue 'q' was deleted"):
            sub.wait(10)
        assert got == [b"before"] and not sub.running
    finally:
        sub.stop()


def test_deleting_a_running_asyncio_subscriber_stops_it(aio_target):
    from tests.support.aio_target import run

    async def test(hw):
        await hw.admin.create_queue("q")
        await hw.admin.add_subscriber("q", "s")
        got: list[bytes] = []
        sub = hw.subscribe("q", "s", listeners=[lambda r: got.append(r.body)])
        await hw.send("q", b"before")
        assert await sub.wait_for(lambda: got == [b"before"], timeout_s=10)
        await hw.admin.delete_subscriber("q", "s")
        await hw.send("q", b"after delete")
        with pytest.raises(SubscriberNotFoundError, match="subscriber 's' of queue 'q' was deleted"):
            await sub.wait(10)
        assert got == [b"before"]

    run(aio_target, test)


def test_a_program_that_exits_without_closing_its_subscriber_prints_no_traceback(tmp_path):
    """The subscriber's thread met the executors of a program that is ending ("cannot
    schedule new futures after interpreter shutdown") and logged it as a bug."""
    import subprocess
    import sys

    script = tmp_path / "leave.py"
    script.write_text(
        "import logging, sys, time, headwater\n"
        "logging.basicConfig()\n"
        "hw = headwater.open(sys.argv[1]); hw.admin.create_queue('q')\n"
        "hw.admin.add_subscriber('q', 's')\n"
        "sub = hw.subscribe('q', 's', listeners=[print])\n"
        "time.sleep(0.3)\n"
    )
    for i in range(4):  # the old code printed one about every other run (a race with the exit)
        run = subprocess.run(
            [sys.executable, str(script), str(tmp_path / f"data{i}")], capture_output=True, text=True, timeout=60
        )
        assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr
