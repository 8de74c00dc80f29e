"""Differential test: the embedded store, the network client and the broker over a store in
memory (the test fake) run the same random sequence of operations, and every result and every error (class and message)
must be the same on all three.

One hypothesis state machine drives three targets in lockstep:

- ``embedded``: ``headwater.open(dir)``, a fresh data directory per example;
- ``network``: ``headwater.connect()`` to one real ``BrokerServer`` over loopback TCP for
  the whole module (``ServerThread`` of conftest: the server ``headwater serve`` runs, in a
  thread of this process so that it shares the test's clock); each example deletes the
  queues it made;
- ``memory``: ``headwater.testing.open_memory()``, a fresh one per example: the same broker
  over a :class:`~headwater.storage.memory.MemoryStore`.

All three share one hand-moved clock, so append times and creation times are compared
exactly. What legitimately differs is normalised, and nothing else: queue ids (the store
gives its internal queues ids too, and the module's broker keeps counting across examples)
are replaced by the order the queues were created in, wherever they appear (queue infos,
records, message ids, and ids printed in error messages).

Disagreements of the embedded store or the network broker that are not fixed yet are
listed in ``KNOWN_DIFFERENCES`` (each with its reason); a difference of the store in memory
is fixed in headwater/storage/memory.py (the contract tests of tests/test_store_contract.py
then cover it), and the focused tests at the end of this file keep what the fake once got
wrong.
"""

from __future__ import annotations

import collections
import os
import random
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule, run_state_machine_as_test

import headwater
from headwater import Message, MessageId
from headwater.errors import HeadwaterError
from headwater.testing import FakeClock, open_memory
from tests.support.server_thread import ServerThread

TARGETS = ("embedded", "memory", "network")
SEGMENT_BYTES = 64 * 1024  # small segments: a long example rolls some


# -- known differences ---------------------------------------------------------------------


@dataclass(frozen=True)
class Known:
    """A disagreement not fixed yet: on an operation matching ``op`` target ``target``
    answered something matching ``actual`` where the others (agreeing) answered something
    matching ``expected`` (regexes: over the operation's text and the normalised outcomes'
    reprs)."""

    op: str
    target: str
    actual: str
    expected: str
    why: str
    #: when given, the difference is tolerated only if this turns the target's outcome
    #: into exactly the others' (the difference is no more than what it undoes)
    undo: Callable[[Any], Any] | None = None

    def tolerates(self, op: str, target: str, outcomes: dict[str, Any]) -> bool:
        if target != self.target or not re.search(self.op, op) or not re.search(self.actual, repr(outcomes[target])):
            return False
        others = [o for t, o in outcomes.items() if t != target]
        if not all(re.search(self.expected, repr(o)) for o in others) or not all(o == others[0] for o in others):
            return False
        return self.undo is None or self.undo(outcomes[target]) == others[0]


KNOWN_DIFFERENCES: list[Known] = [
    # N1 (network client, low). An argument of the wrong type AND another mistake (a queue
    # that is missing or disabled, a bad group name, no offsets): the network client checks
    # the types before sending (remote.check_arguments), so it names the type, where the
    # broker in-process checks in its own order. Either error is a fair answer; only the
    # order of the checks differs.
    Known(
        op=r".",
        target="network",
        actual=r"'InvalidArgumentError', '((a partition|an offset|a partition count) is an int|a queue name is a string"
        r"|offsets is a non-empty \{partition: offset\} mapping), got"
        r"|'InvalidArgumentError', \"invalid subscriber name ",
        expected=r"'raised', '",
        why="the network client checks argument types before the broker looks up the queue",
    ),
    # N4 (network client, low). An error a fetch stream ends with (the consumer's default
    # stream=True over the network) is raised with "reading 'q0': " before the broker's
    # message (fetch_stream.py, take()); embedded, in memory and with stream=False the
    # message is the broker's alone: "queue 'q0' does not exist; create it first".
    Known(
        op=r"^poll_all\(",
        target="network",
        actual=r"'raised', '\w+', \"reading '[^']*': ",
        expected=r"'raised', '",
        why="fetch streams prefix the broker's error with the queue read",
        undo=lambda o: (o[0], o[1], re.sub(r"^reading '[^']*': ", "", o[2])),
    ),
    # N6 (timing, not a bug). A consumer hands out records it fetched (prefetched) before
    # the queue was truncated or they expired: embedded as well as over the network, but
    # over the network a fetch stream pushes them at once, while the in-process consumer's
    # in-flight fetch may not have come back before the truncation. Repro: assign q0, poll,
    # send one message, truncate q0, poll at once: network returns the message, the others
    # [] (with 0.3 s between send and truncate all three return it). Tolerated by
    # Differential._n6_prefetched (only records no longer retained may be extra), not here:
    # telling them apart needs the queue's start offsets.
]


# -- normalising ---------------------------------------------------------------------------

_HEX_ID = re.compile(r"\b([0-9a-f]{8})-([0-9a-f]{8})-([0-9a-f]{16})\b")
_EXAMPLE_ID = "0000002a-00000003-000000000001e240"  # the id error messages show as an example
_QID_TEXT = re.compile(r"(no queue has id )(\d+)")


@dataclass
class Side:
    """One target's state: its client, the queue ids it gave (real id -> creation order),
    the ids its sends returned, its consumer."""

    name: str
    client: Any
    qids: dict[int, int] = field(default_factory=dict)
    ids: list[MessageId] = field(default_factory=list)
    consumer: Any = None
    producer: Any = None

    def __post_init__(self) -> None:
        # client.send's producer, with the same seed everywhere: unkeyed messages start on
        # the same (otherwise random) partition
        self.producer = self.client.producer(rng=random.Random(7))

    def qid(self, real: int) -> Any:
        return f"Q{self.qids[real]}" if real in self.qids else f"?{real}"

    def real_qid(self, ordinal_name: str, fallback: int = 0xFFFF) -> int:
        for real, n in self.qids.items():
            if f"Q{n}" == ordinal_name:
                return real
        return fallback

    def text(self, s: str) -> str:
        s = _HEX_ID.sub(lambda m: m[0] if m[0] == _EXAMPLE_ID else f"{self.qid(int(m[1], 16))}-{m[2]}-{m[3]}", s)
        return _QID_TEXT.sub(lambda m: m[1] + str(self.qid(int(m[2]))), s)

    def norm(self, v: Any) -> Any:
        if isinstance(v, MessageId):
            return ("id", self.qid(v.queue_id), v.partition, v.offset)
        if isinstance(v, headwater.QueueInfo):
            d = msgspec.structs.asdict(v)
            d["queue_id"] = self.qid(v.queue_id)
            d["partitions"] = [tuple(msgspec.structs.astuple(p)) for p in v.partitions]
            d["config"] = msgspec.structs.asdict(v.config)
            return ("QueueInfo", d)
        if isinstance(v, headwater.Record):
            d = msgspec.structs.asdict(v)
            d["queue_id"] = self.qid(v.queue_id)
            return ("Record", d)
        if isinstance(v, msgspec.Struct):
            return (type(v).__name__, self.norm(msgspec.structs.asdict(v)))
        if isinstance(v, dict):
            return {self.norm(k): self.norm(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [self.norm(x) for x in v]
        if isinstance(v, str):
            return self.text(v)
        return v


def outcome(side: Side, fn: Callable[[Side], Any]) -> Any:
    try:
        return ("ok", side.norm(fn(side)))
    except HeadwaterError as e:
        return ("raised", type(e).__name__, side.text(str(e)))
    except (TypeError, ValueError, KeyError, IndexError, AttributeError) as e:  # a wrong argument's own error
        return ("raised", type(e).__name__, side.text(str(e)))


# -- the targets -----------------------------------------------------------------------------

CLOCK = FakeClock()
STATS: collections.Counter = collections.Counter()  # (operation, outcome on the fake): how often


class Network:
    """The module's broker (started on first use); each example connects a new client (a
    client keeps queue metadata, which must not outlive the example's queues)."""

    server: ServerThread | None = None
    dir: str | None = None

    @classmethod
    def connect(cls) -> Any:
        if cls.server is None:
            cls.dir = tempfile.mkdtemp(prefix="hw-diff-net-")
            cls.server = ServerThread(Path(cls.dir) / "data", CLOCK, segment_bytes_max=SEGMENT_BYTES)
        return headwater.connect(cls.server.address)

    @classmethod
    def stop(cls) -> None:
        if cls.server is not None:
            cls.server.stop()
            shutil.rmtree(cls.dir, ignore_errors=True)
            cls.server = None


@pytest.fixture(scope="module", autouse=True)
def _network_broker():
    yield
    Network.stop()


# -- the values operations take ------------------------------------------------------------------

# valid values mostly (so that queues exist and hold messages), the invalid ones now and then
NAMES = st.sampled_from(["q0"] * 3 + ["q1"] * 2 + ["q2"])
ANY_NAME = st.sampled_from(["q0"] * 16 + ["q1"] * 10 + ["q2"] * 6 + ["", "bad name", "__offsets", "a" * 201, 7, None])
PARTITION = st.sampled_from([0] * 6 + [1] * 4 + [2] * 3 + [3] + [-1, 9, True, "0", None])
OFFSET = st.one_of(st.integers(0, 12), st.integers(0, 12), st.sampled_from([-1, 100, True, "1"]))
KEY = st.sampled_from([None, b"k1", b"k2", b"k3"])
TAG = st.sampled_from([None, "a", "b", "a"])
PROPS = st.sampled_from([None, {"x": "1"}, {"x": "2", "y": ""}])
BODY = st.binary(max_size=8)
GROUP = st.sampled_from(["g1"] * 5 + ["g2"] * 3 + ["bad group", ""])
WHEN = st.one_of(
    st.integers(-90, 5).map(lambda d: ("rel", d * 1000)),
    st.integers(-90, 5).map(lambda d: ("rel", d * 1000)),
    st.sampled_from([("abs", 0), ("abs", "x"), ("abs", None)]),
)


def when_ms(w: tuple[str, Any]) -> Any:
    kind, v = w
    return int(CLOCK.now * 1000) + v if kind == "rel" else v


class Differential(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.mkdtemp(prefix="hw-diff-")
        CLOCK.advance(3600)  # a new hour: nothing of the last example's time ranges overlaps
        self.sides = [  # the fake first: poll_all takes it as the reference
            Side("memory", open_memory(clock=CLOCK)),
            Side("embedded", headwater.open(Path(self.tmp) / "data", clock=CLOCK, segment_bytes_max=SEGMENT_BYTES)),
            Side("network", Network.connect()),
        ]
        self.created = 0
        self.step = 0

    def teardown(self) -> None:
        for s in self.sides:
            if s.consumer is not None:
                s.consumer.close()
        net = self.sides[2].client
        for info in net.admin.list_queues():
            net.admin.delete_queue(info.name)
        for s in self.sides:
            s.client.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    # -- running one operation on all three ----------------------------------------------------

    def run(
        self,
        op: str,
        fn: Callable[[Side], Any],
        *,
        order_free: bool = False,
        tolerate: Callable[[dict[str, Any]], bool] | None = None,
    ) -> dict[str, Any]:
        self.step += 1
        outcomes = {s.name: outcome(s, fn) for s in self.sides}
        if order_free:
            outcomes = {t: (o[0], sorted(o[1], key=repr)) if o[0] == "ok" else o for t, o in outcomes.items()}
        mem = outcomes["memory"]
        STATS[(op.split("(")[0], "ok" if mem[0] == "ok" else f"{mem[1]}: {mem[2][:60]}")] += 1
        if tolerate is None or not tolerate(outcomes):
            self.compare(op, outcomes)
        return outcomes

    def compare(self, op: str, outcomes: dict[str, Any]) -> None:
        if len({repr(o) for o in outcomes.values()}) == 1:
            return
        for target in TARGETS:
            if any(k.tolerates(op, target, outcomes) for k in KNOWN_DIFFERENCES):
                rest = {t: o for t, o in outcomes.items() if t != target}
                if len({repr(o) for o in rest.values()}) == 1:
                    return
        shown = "\n".join(f"  {t:9}{outcomes[t]!r}" for t in TARGETS)
        raise AssertionError(f"the targets disagree on {op}:\n{shown}")

    def all_ok(self, outcomes: dict[str, Any]) -> bool:
        return all(o[0] == "ok" for o in outcomes.values())

    # -- admin -------------------------------------------------------------------------------

    @initialize(
        partitions=st.lists(st.integers(1, 3), min_size=3, max_size=3),
        ttls=st.lists(st.sampled_from(["default", None, 60]), min_size=3, max_size=3),
    )
    def first_queues(self, partitions, ttls) -> None:
        for name, n, ttl in zip(["q0", "q1", "q2"], partitions, ttls):
            self.create_queue(name, n, ttl, False)

    @rule(
        name=ANY_NAME,
        partitions=st.sampled_from([1, 1, 2, 2, 3, 0, -1, True, "2"]),
        ttl=st.sampled_from(["default", None, 60, 0, 3.5]),
        exist_ok=st.booleans(),
    )
    def create_queue(self, name, partitions, ttl, exist_ok) -> None:
        kw = {} if ttl == "default" else {"ttl_s": ttl}

        def call(s: Side):
            info = s.client.admin.create_queue(name, partitions=partitions, exist_ok=exist_ok, **kw)
            if info.queue_id not in s.qids:
                s.qids[info.queue_id] = self.created
            return info

        outs = self.run(f"create_queue({name!r}, partitions={partitions!r}, {kw}, exist_ok={exist_ok})", call)
        if self.all_ok(outs) and any(len(s.qids) > self.created for s in self.sides):
            self.created += 1

    @rule(name=ANY_NAME, missing_ok=st.booleans())
    def delete_queue(self, name, missing_ok) -> None:
        self.run(f"delete_queue({name!r})", lambda s: s.client.admin.delete_queue(name, missing_ok=missing_ok))

    @rule(name=ANY_NAME)
    def truncate_queue(self, name) -> None:
        self.run(f"truncate_queue({name!r})", lambda s: s.client.admin.truncate_queue(name))

    @rule(name=ANY_NAME, partitions=st.sampled_from([2, 3, 4, 1, 0, True, "3", 100_001]))
    def add_partitions(self, name, partitions) -> None:
        self.run(f"add_partitions({name!r}, {partitions!r})", lambda s: s.client.admin.add_partitions(name, partitions))

    @rule(name=ANY_NAME, enabled=st.booleans())
    def set_enabled(self, name, enabled) -> None:
        self.run(
            f"{'en' if enabled else 'dis'}able_queue({name!r})",
            lambda s: (s.client.admin.enable_queue if enabled else s.client.admin.disable_queue)(name),
        )

    @rule(name=ANY_NAME)
    def describe_queue(self, name) -> None:
        self.run(f"describe_queue({name!r})", lambda s: s.client.admin.describe_queue(name))

    @rule()
    def list_queues(self) -> None:
        self.run("list_queues()", lambda s: s.client.admin.list_queues())

    @rule(seconds=st.sampled_from([0.001, 0.5, 1, 30, 61]))
    def advance_clock(self, seconds) -> None:
        CLOCK.advance(seconds)

    # -- producing ---------------------------------------------------------------------------

    def _sent(self, outs: dict[str, Any], results: dict[str, Any]) -> None:
        if self.all_ok(outs):
            for s in self.sides:
                r = results[s.name]
                s.ids.extend(r if isinstance(r, list) else [r])

    @rule(
        name=ANY_NAME,
        body=BODY,
        key=st.sampled_from([None, None, b"k1", b"k2", b"k3", "k1"]),
        tag=st.sampled_from([None, None, "a", "b", "", 5]),
        props=st.sampled_from([None, None, {"x": "1"}, {"x": 1}]),
        partition=st.one_of(st.none(), st.none(), PARTITION),
    )
    def send(self, name, body, key, tag, props, partition) -> None:
        results = {}

        def call(s: Side):
            results[s.name] = mid = s.producer.send_and_wait(
                name, body, key=key, tag=tag, properties=props, partition=partition
            )
            return mid

        outs = self.run(
            f"send({name!r}, {body!r}, key={key!r}, tag={tag!r}, properties={props!r}, partition={partition!r})", call
        )
        self._sent(outs, results)

    @rule(
        name=ANY_NAME,
        msgs=st.lists(st.builds(Message, BODY, key=KEY, tag=TAG, properties=PROPS), max_size=4),
        partition=st.one_of(st.none(), PARTITION),
    )
    def send_batch(self, name, msgs, partition) -> None:
        results = {}

        def call(s: Side):
            results[s.name] = ids = list(s.producer.send_batch(name, msgs, partition=partition))
            return ids

        outs = self.run(f"send_batch({name!r}, {msgs!r}, partition={partition!r})", call)
        self._sent(outs, results)

    @rule(name=NAMES, body=BODY, key=KEY, tag=TAG, props=PROPS)
    def send_valid(self, name, body, key, tag, props) -> None:
        self.send(name, body, key, tag, props, None)

    # -- lookups -----------------------------------------------------------------------------

    @precondition(lambda self: self.sides[0].ids)
    @rule(i=st.integers(0, 1000), as_text=st.booleans())
    def get_sent(self, i, as_text) -> None:
        def call(s: Side):
            mid = s.ids[i % len(s.ids)]
            return s.client.get(str(mid) if as_text else mid)

        self.run(f"get(sent[{i}])", call)

    @rule(
        queue=st.sampled_from(["Q0", "Q0", "Q1", "Q2", "Q3", "none"]),
        partition=st.sampled_from([0, 0, 1, 2, 5]),
        offset=st.sampled_from([0, 1, 2, 3, 50]),
    )
    def get_id(self, queue, partition, offset) -> None:
        self.run(
            f"get({queue}, {partition}, {offset})",
            lambda s: s.client.get(MessageId(s.real_qid(queue), partition, offset)),
        )

    @rule(text=st.sampled_from(["nonsense", "", 5, None, "0000zz01-00000000-0000000000000000"]))
    def get_bad(self, text) -> None:
        self.run(f"get({text!r})", lambda s: s.client.get(text))

    @rule(
        name=ANY_NAME,
        key=st.sampled_from([b"k1", b"k1", b"k2", b"k3", b"", None, "k1"]),
        start=st.one_of(st.none(), WHEN),
        end=st.one_of(st.none(), WHEN),
        limit=st.sampled_from([1000, 1000, 1, 2, 0, True]),
    )
    def find(self, name, key, start, end, limit) -> None:
        def call(s: Side):
            return s.client.find(
                name, key, start_time=start and when_ms(start), end_time=end and when_ms(end), limit=limit
            )

        self.run(f"find({name!r}, {key!r}, {start}, {end}, limit={limit!r})", call)

    @rule(name=ANY_NAME, partition=PARTITION, when=WHEN)
    def offset_for_time(self, name, partition, when) -> None:
        self.run(
            f"offset_for_time({name!r}, {partition!r}, {when})",
            lambda s: s.client.offset_for_time(name, partition, when_ms(when)),
        )

    @rule(
        name=ANY_NAME,
        partitions=st.one_of(st.none(), PARTITION, st.lists(st.integers(0, 3), max_size=3)),
        start=st.one_of(st.none(), OFFSET, st.just({0: 1, 1: 2})),
        stop=st.one_of(st.none(), OFFSET),
        start_time=st.one_of(st.none(), WHEN),
        end_time=st.one_of(st.none(), WHEN),
        tags=st.sampled_from([None, "a", ["a", "b"], "*", "", ["b"]]),
        sent_bound=st.integers(-1, 1000),
    )
    def scan(self, name, partitions, start, stop, start_time, end_time, tags, sent_bound) -> None:
        def call(s: Side):
            lo = s.ids[sent_bound % len(s.ids)] if sent_bound >= 0 and s.ids else start
            with s.client.scanner(
                name,
                partitions=partitions,
                start=lo,
                stop=stop,
                start_time=start_time and when_ms(start_time),
                end_time=end_time and when_ms(end_time),
                tags=tags,
            ) as sc:
                return list(sc)

        self.run(
            f"scanner({name!r}, partitions={partitions!r}, start={start!r}/{sent_bound}, stop={stop!r}, "
            f"start_time={start_time}, end_time={end_time}, tags={tags!r})",
            call,
        )

    # -- push subscribers (the registry) -----------------------------------------------------------

    SUB = st.sampled_from(["s1", "s1", "s2", "bad name", ""])

    @rule(
        name=ANY_NAME,
        sub=SUB,
        partitions=st.sampled_from([None, None, 0, [0, 1], [5], "x"]),
        tags=st.sampled_from([None, None, "a", ["a", "b"], "", 5]),
        start=st.sampled_from(["latest", "earliest", "offset:1", "offset:-1", "soon", ("rel", -1000), ("rel", 0)]),
    )
    def add_subscriber(self, name, sub, partitions, tags, start) -> None:
        def call(s: Side):
            return s.client.admin.add_subscriber(
                name, sub, partitions=partitions, tags=tags, start=when_ms(start) if isinstance(start, tuple) else start
            )

        self.run(f"add_subscriber({name!r}, {sub!r}, partitions={partitions!r}, tags={tags!r}, start={start!r})", call)

    @rule(name=st.one_of(st.none(), ANY_NAME))
    def list_subscribers(self, name) -> None:
        self.run(f"list_subscribers({name!r})", lambda s: s.client.admin.list_subscribers(name))

    @rule(name=ANY_NAME, sub=SUB, delete=st.booleans())
    def describe_or_delete_subscriber(self, name, sub, delete) -> None:
        self.run(
            f"{'delete' if delete else 'describe'}_subscriber({name!r}, {sub!r})",
            lambda s: (s.client.admin.delete_subscriber if delete else s.client.admin.describe_subscriber)(name, sub),
        )

    @rule(name=ANY_NAME, sub=SUB, offsets=st.sampled_from([{0: 0}, {0: 1}, {0: 3}, {1: 0}, {0: -1}, {}, {9: 0}]))
    def checkpoint_subscriber(self, name, sub, offsets) -> None:
        self.run(
            f"service.checkpoint_subscriber({name!r}, {sub!r}, {offsets!r})",
            lambda s: s.client.service.checkpoint_subscriber(name, sub, offsets),
        )

    # -- consumers and group offsets -------------------------------------------------------------

    @rule(group=st.one_of(st.none(), GROUP), reset=st.sampled_from(["earliest", "earliest", "latest", "middle"]))
    def new_consumer(self, group, reset) -> None:
        def call(s: Side):
            if s.consumer is not None:
                s.consumer.close()
                s.consumer = None
            s.consumer = s.client.consumer(group=group, auto_offset_reset=reset)

        self.run(f"consumer(group={group!r}, auto_offset_reset={reset!r})", call)

    def _n6_prefetched(self, outcomes: dict[str, Any]) -> bool:
        """N6 (timing; see KNOWN_DIFFERENCES): over the network a fetch stream
        pushes new records to the consumer as they are appended, so records truncated (or
        expired) after the push are still handed out by the next poll; in process the poll
        reads after the truncation. Tolerated only when the network's extra records are all
        ones no longer retained, and the rest is the same."""
        net, mem, emb = outcomes["network"], outcomes["memory"], outcomes["embedded"]
        if mem != emb or net[0] != "ok" or mem[0] != "ok" or net == mem:
            return False
        extra = [r for r in net[1] if r not in mem[1]]
        if [r for r in net[1] if r in mem[1]] != mem[1]:
            return False
        admin = self.sides[0].client.admin
        for _, r in extra:
            try:
                start = admin.describe_queue(r["queue"]).partitions[r["partition"]].start_offset
            except Exception:  # noqa: BLE001 - the queue is gone: not retained either
                continue
            if r["offset"] >= start:
                return False
        return True

    def has_consumer(self) -> bool:
        return all(s.consumer is not None for s in self.sides)

    @precondition(has_consumer)
    @rule(name=ANY_NAME, partitions=st.one_of(st.none(), PARTITION, st.lists(st.integers(0, 3), max_size=3)))
    def assign(self, name, partitions) -> None:
        self.run(f"assign({name!r}, {partitions!r})", lambda s: s.consumer.assign(name, partitions))

    @rule(
        group=st.sampled_from([None, "g1", "g1", "g2"]),
        name=NAMES,
        partitions=st.sampled_from([None, None, 0, 1]),
        reset=st.sampled_from(["earliest", "latest"]),
        max_messages=st.sampled_from([None, 1, 2]),
    )
    def consume(self, group, name, partitions, reset, max_messages) -> None:
        """A consumer that assigns a queue and polls what there is: the common path."""
        self.new_consumer(group, reset)
        self.assign(name, partitions)
        self.poll_all(max_messages)

    @precondition(lambda self: self.has_consumer() and self.sides[0].consumer.assignment())
    @rule(i=st.integers(0, 100), offset=OFFSET)
    def seek_assigned(self, i, offset) -> None:
        tps = self.sides[0].consumer.assignment()
        q, p = tps[i % len(tps)]
        self.seek(q, p, offset)

    @precondition(has_consumer)
    @rule(name=ANY_NAME, partition=PARTITION, offset=OFFSET)
    def seek(self, name, partition, offset) -> None:
        self.run(f"seek({name!r}, {partition!r}, {offset!r})", lambda s: s.consumer.seek(name, partition, offset))

    @precondition(has_consumer)
    @rule(
        name=ANY_NAME,
        how=st.sampled_from(["beginning", "end", "time"]),
        when=WHEN,
        partitions=st.one_of(st.none(), PARTITION),
    )
    def seek_to(self, name, how, when, partitions) -> None:
        def call(s: Side):
            c = s.consumer
            if how == "time":
                return c.seek_to_time(name, when_ms(when), partitions)
            return (c.seek_to_beginning if how == "beginning" else c.seek_to_end)(name, partitions)

        self.run(f"seek_to_{how}({name!r}, {partitions!r})", call)

    @precondition(has_consumer)
    @rule(i=st.integers(0, 1000))
    def seek_to_id(self, i) -> None:
        self.run(f"seek_to_id(sent[{i}])", lambda s: s.consumer.seek_to_id(s.ids[i % len(s.ids)]) if s.ids else None)

    @precondition(has_consumer)
    @rule(max_messages=st.sampled_from([None, 1, 3, 0]))
    def poll_all(self, max_messages) -> None:
        """Poll until nothing more comes: the records in (queue, partition, offset) order
        (which partition's fetch answers first is timing, not behaviour). The fake polls
        first (it runs first); the others are given time to deliver as many records, or to
        raise as it did (a fetch stream reports a deleted queue when the broker's push
        comes), then one more short poll shows any extra."""
        reference: dict[str, Any] = {}

        def call(s: Side):
            want = reference.get("records")
            raised = "raised" in reference
            got: list = []
            deadline = time.monotonic() + 3
            try:
                while True:
                    if want is None and not raised:  # the reference: until a poll comes back empty
                        recs = s.consumer.poll(max_messages, timeout_ms=200 if not got else 20)
                        got.extend(recs)
                        if not recs:
                            break
                        continue
                    long_wait = raised or len(got) < want
                    recs = s.consumer.poll(max_messages, timeout_ms=500 if long_wait else 20)
                    got.extend(recs)
                    if not recs and (not long_wait or time.monotonic() > deadline):
                        break
            except Exception:
                reference.setdefault("raised", True)
                raise
            reference.setdefault("records", len(got))
            return sorted(got, key=lambda r: (r.queue, r.partition, r.offset))

        outs = self.run(f"poll_all({max_messages!r})", call, tolerate=self._n6_prefetched)
        if not self.all_ok(outs) or outs["network"] != outs["memory"]:
            # A poll that raised (a deleted or disabled queue among several assigned) may
            # have handed out another partition's records on an earlier poll over the
            # network (the error comes with the broker's push) and not in process: timing,
            # so positions are no longer comparable. Start again with new consumers.
            for s in self.sides:
                s.consumer.close()
                s.consumer = None
            return
        self.run("assignment/positions", lambda s: [(tp, s.consumer.position(*tp)) for tp in s.consumer.assignment()])

    @precondition(has_consumer)
    @rule(explicit=st.one_of(st.none(), st.tuples(ANY_NAME, PARTITION, OFFSET)))
    def commit(self, explicit) -> None:
        def call(s: Side):
            if explicit is None:
                return s.consumer.commit()
            q, p, o = explicit
            return s.consumer.commit({(q, p): o})

        self.run(f"commit({explicit!r})", call)

    @precondition(has_consumer)
    @rule(name=ANY_NAME, partition=PARTITION)
    def committed(self, name, partition) -> None:
        self.run(f"committed({name!r}, {partition!r})", lambda s: s.consumer.committed(name, partition))

    @rule(
        group=GROUP,
        name=ANY_NAME,
        offsets=st.one_of(
            st.dictionaries(
                st.sampled_from([0] * 4 + [1] * 3 + [2, 3, -1, "0", True]),
                st.sampled_from(list(range(8)) * 2 + [-1, "1", None]),
                min_size=1,
                max_size=2,
            ),
            st.dictionaries(st.integers(0, 2), st.integers(0, 8), min_size=1, max_size=2),
            st.sampled_from([None, [1], {}]),
        ),
    )
    def commit_offsets(self, group, name, offsets) -> None:
        self.run(
            f"service.commit_offsets({group!r}, {name!r}, {offsets!r})",
            lambda s: s.client.service.commit_offsets(group, name, offsets),
        )

    @rule(group=GROUP, name=ANY_NAME)
    def fetch_offsets(self, group, name) -> None:
        self.run(f"service.fetch_offsets({group!r}, {name!r})", lambda s: s.client.service.fetch_offsets(group, name))

    @rule(group=GROUP)
    def describe_group(self, group) -> None:
        self.run(f"service.describe_group({group!r})", lambda s: s.client.service.describe_group(group))

    @rule()
    def list_groups(self) -> None:
        self.run("service.list_groups()", lambda s: s.client.service.list_groups(), order_free=True)


def _run(examples: int, steps: int) -> None:
    run_state_machine_as_test(
        Differential,
        settings=settings(
            max_examples=examples,
            stateful_step_count=steps,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        ),
    )


def test_the_three_targets_agree() -> None:
    _run(examples=60, steps=40)  # a slice; the slow test below runs 1500 examples
    if os.environ.get("HW_DIFF_STATS"):
        for (op, how), n in sorted(STATS.items()):
            print(f"{op:24} {n:5} {how}")


@pytest.mark.slow
@pytest.mark.timeout(3600)  # about 10 minutes on two cores; the suite's 600 s limit is too tight
def test_the_three_targets_agree_long() -> None:
    _run(examples=1500, steps=60)


# -- focused tests of what the differential test found in the fake ------------------------------
# Each failed against the fake before its fix (when it was a second broker, MemoryBroker); each
# runs on the store and the fake alike (the network client is covered by the differential test
# above).


@pytest.fixture(params=["embedded", "memory"])
def local(request, tmp_path, clock):
    if request.param == "memory":
        client = open_memory(clock=clock)
    else:
        client = headwater.open(tmp_path / "data", clock=clock)
    yield client
    client.close()


def _raises(exc: type, fn: Callable[[], Any]) -> str:
    with pytest.raises(exc) as e:
        fn()
    assert type(e.value) is exc, type(e.value)
    return str(e.value)


@pytest.mark.parametrize("call", ["describe_group", "commit_offsets", "fetch_offsets"])
def test_a_bad_group_name_is_refused_with_the_rules(local, call) -> None:
    local.admin.create_queue("q0")
    fn = {
        "describe_group": lambda: local.service.describe_group("bad group"),
        "commit_offsets": lambda: local.service.commit_offsets("bad group", "q0", {0: 0}),
        "fetch_offsets": lambda: local.service.fetch_offsets("bad group", "q0"),
    }[call]
    assert _raises(headwater.InvalidArgumentError, fn) == (
        "invalid group name 'bad group': use 1-200 letters, digits, '.', '_' and '-', starting with a letter or digit"
    )


@pytest.mark.parametrize(
    "call",
    [
        lambda hw: hw.admin.describe_queue("__offsets"),
        lambda hw: hw.admin.truncate_queue("__offsets"),
        lambda hw: hw.admin.disable_queue("__offsets"),
        lambda hw: hw.admin.delete_queue("__offsets"),
        lambda hw: hw.admin.add_partitions("__offsets", 2),
        lambda hw: hw.offset_for_time("__offsets", 0, 0),
        lambda hw: hw.service.fetch_offsets("g1", "__offsets"),
        lambda hw: hw.service.commit_offsets("g1", "__offsets", {}),
        lambda hw: hw.service.lookup_key("__offsets", "not bytes", None, None, 10),
        lambda hw: hw.service.create_queue("__mine", headwater.QueueConfig()),
        # the queue is checked before anything else: a bad tag, group or offset comes second
        lambda hw: hw.admin.add_subscriber("__offsets", "s1", tags=""),
        lambda hw: hw.service.keyed_group("__offsets", "bad group"),
        lambda hw: hw.service.keyed_resize("__offsets", "bad group", 2),
        lambda hw: hw.service.fetch("__offsets", 0, "x", max_bytes=1),
        lambda hw: hw.service.shared_describe("bad group", "__offsets"),
    ],
)
def test_names_starting_with_two_underscores_belong_to_the_broker(local, call) -> None:
    msg = _raises(headwater.InvalidArgumentError, lambda: call(local))
    assert re.fullmatch(r"queue '__\w+': names starting with '__' belong to the broker", msg)


def test_a_queue_name_that_is_not_a_string(local) -> None:
    assert _raises(headwater.InvalidArgumentError, lambda: local.admin.describe_queue(7)) == (
        "a queue name is a string, got int"
    )


def test_get_of_an_offset_not_retained_says_what_is(local) -> None:
    info = local.admin.create_queue("q0")
    mid = MessageId(info.queue_id, 0, 0)
    assert _raises(headwater.MessageNotFoundError, lambda: local.get(mid)) == (
        "offset 0 of q0[0] is not retained (the partition is empty)"
    )
    local.send_batch("q0", [b"a", b"b"])
    assert _raises(headwater.MessageNotFoundError, lambda: local.get(MessageId(info.queue_id, 0, 5))) == (
        "offset 5 of q0[0] is not retained (retained: 0..1)"
    )


def test_commit_offsets_checks_in_the_brokers_order_and_words(local) -> None:
    local.admin.create_queue("q0", partitions=2)
    local.send_batch("q0", [b"a", b"b"], partition=0)
    local.admin.truncate_queue("q0")
    commit = local.service.commit_offsets
    assert _raises(headwater.InvalidArgumentError, lambda: commit("g1", "q0", {0: 1})) == (
        "cannot commit offset 1 for q0[0]: before the log start 2"
    )
    # a partition that is not an int is one the queue does not have
    assert _raises(headwater.PartitionOutOfRangeError, lambda: commit("g1", "q0", {"0": 2})) == (
        "queue 'q0' has partitions 0..1; there is no partition '0'"
    )
    assert _raises(headwater.PartitionOutOfRangeError, lambda: commit("g1", "q0", {True: 2})) == (
        "queue 'q0' has partitions 0..1; there is no partition True"
    )
    # an empty mapping is refused before the queue is looked up
    assert _raises(headwater.InvalidArgumentError, lambda: commit("g1", "nope", {})) == (
        "offsets is a non-empty {partition: offset} mapping, got an empty one"
    )
