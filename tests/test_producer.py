"""The producer: futures and callbacks, batching, flush and close, bounded buffer, retries
with idempotence, delivery timeout, compression. Most tests run through the ``hw`` fixture:
embedded, in memory and over TCP."""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections import Counter

import msgspec
import pytest

import headwater
from headwater import Message, MessageId
from headwater.client import key_partition
from headwater.client.sync.producer import Producer
from headwater.client.transport.send_future import LazyFuture, SendFuture
from headwater.errors import (
    ClosedError,
    InvalidArgumentError,
    MessageTooLargeError,
    OutOfOrderSequenceError,
    PartitionOutOfRangeError,
    QueueDisabledError,
    QueueNotFoundError,
    UnavailableError,
    UsageError,
)
from headwater.model.batch import COMPRESSION_LZ4, COMPRESSION_MASK, COMPRESSION_ZSTD, decode_header
from tests.support.aio_target import run
from tests.support.waiting import wait_for


class Wrapped:
    """A BrokerService in front of the real one that counts produce calls and can hold them
    at a gate or fail them: ``plan`` says, call by call, ``"before"`` (fail without reaching
    the broker), ``"after"`` (the broker appends, the answer is lost), ``"gap"`` (the broker
    refuses the sequence, as one that lost its tail would) or None (pass)."""

    def __init__(
        self, inner, plan=(), fail_all: bool = False, gate: threading.Event | None = None, pipelined: bool = True
    ) -> None:
        self.inner = inner
        self.plan = list(plan)
        self.fail_all = fail_all
        self.gate = gate
        self.calls = 0
        self.batch_sizes: list[int] = []
        self._seen: set[bytes] = set()
        self._lock = threading.Lock()
        # the producer pipelines with produce_async when the service has one (network)
        self.produce_async = self._produce_async if pipelined and hasattr(inner, "produce_async") else None

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def _next(self, batch) -> str | None:
        with self._lock:
            self.calls += 1
            self.batch_sizes.append(decode_header(batch).count)
            if self.fail_all:
                return "before"
            action = self.plan.pop(0) if self.plan else None
            seen = bytes(batch) in self._seen
            self._seen.add(bytes(batch))
            # a broker refuses a sequence only for a batch it has not stored: never a retry
            # of one it stored (that one it recognises)
            return None if action == "gap" and seen else action

    def produce(self, queue, partition, batch):
        action = self._next(batch)
        if self.gate is not None:
            assert self.gate.wait(30)
        if action == "before":
            raise UnavailableError("injected: the broker is restarting")
        if action == "gap":
            raise OutOfOrderSequenceError("injected: expected sequence 0")
        result = self.inner.produce(queue, partition, batch)
        if action == "after":
            raise UnavailableError("injected: the answer was lost")
        return result

    def _produce_async(self, queue, partition, batch):
        action = self._next(batch)
        out: concurrent.futures.Future = concurrent.futures.Future()
        if action in ("before", "gap"):
            out.set_exception(
                UnavailableError("injected: the broker is restarting")
                if action == "before"
                else OutOfOrderSequenceError("injected: expected sequence 0")
            )
            return out

        def done(f):
            if f.exception() is not None:
                out.set_exception(f.exception())
            elif action == "after":
                out.set_exception(UnavailableError("injected: the answer was lost"))
            else:
                out.set_result(f.result())

        self.inner.produce_async(queue, partition, batch).add_done_callback(done)
        return out


def stored(hw, queue: str, partition: int | None = None) -> list:
    return list(hw.scanner(queue, partitions=partition))


# -- futures and callbacks ----------------------------------------------------------------


def test_send_returns_futures_and_calls_callbacks_once(hw):
    hw.admin.create_queue("q", partitions=3)
    calls: list[tuple] = []
    with hw.producer(linger_ms=5) as p:
        futs = [
            p.send(
                "q",
                f"m{i}".encode(),
                key=f"k{i % 5}".encode(),
                tag="t",
                callback=lambda mid, exc, i=i: calls.append((i, mid, exc, threading.current_thread().name)),
            )
            for i in range(40)
        ]
        ids = [f.result(timeout=30) for f in futs]
    assert all(isinstance(m, MessageId) for m in ids)
    assert [hw.get(m).body for m in ids] == [f"m{i}".encode() for i in range(40)]
    assert sorted(c[0] for c in calls) == list(range(40))  # once each
    assert all(mid == ids[i] and exc is None for i, mid, exc, _ in calls)
    assert {c[3] for c in calls} == {"headwater-producer"}
    assert p.send_and_wait is not None and not futs[0].cancel()


def test_send_and_wait_and_send_batch_return_ids(hw):
    hw.admin.create_queue("q", partitions=2)
    p = hw.producer()
    mid = p.send_and_wait("q", b"one", partition=1, tag="x", properties={"a": "b"})
    ids = p.send_batch("q", [b"two", Message(b"three", key=b"k")], partition=1)
    assert mid.partition == 1 and [i.offset for i in ids] == [1, 2]
    seen = []
    assert p.send_and_wait("q", b"four", partition=1, callback=lambda m, e: seen.append(m)).offset == 3
    p.flush()
    assert seen and seen[0].offset == 3
    r = hw.get(mid)
    assert (r.body, r.tag, r.properties) == (b"one", "x", {"a": "b"})


def test_failed_send_calls_back_with_the_error(hw):
    hw.admin.create_queue("q")
    hw.admin.disable_queue("q")  # the broker refuses: not retriable
    svc = Wrapped(hw.service)
    p = Producer(svc)
    got = []
    fut = p.send("q", b"x", callback=lambda mid, exc: got.append((mid, exc)))
    with pytest.raises(QueueDisabledError):
        fut.result(timeout=30)
    p.flush()
    assert len(got) == 1 and got[0][0] is None and isinstance(got[0][1], QueueDisabledError)
    assert svc.calls == 1  # no retries of a refusal
    assert p.producer_epoch == 0  # nothing may have been stored: the epoch stays
    p.close()


def test_a_raising_callback_is_logged_and_the_rest_go_on(hw, caplog):
    hw.admin.create_queue("q")
    p = hw.producer(linger_ms=20)
    got = []
    p.send("q", b"a", callback=lambda mid, exc: 1 / 0)
    p.send("q", b"b", callback=lambda mid, exc: got.append(mid))
    p.flush()
    assert len(got) == 1 and "send callback raised" in caplog.text
    p.close()


def test_blocking_calls_from_a_callback_are_refused(hw):
    hw.admin.create_queue("q")
    p = hw.producer()
    errors = []

    def cb(mid, exc):
        for call in (p.flush, lambda: p.close()):
            try:
                call()
            except UsageError as e:
                errors.append(e)
        p.send("q", b"from the callback")  # queuing is fine

    p.send("q", b"x", callback=cb)
    time.sleep(0.05)
    p.flush()
    p.flush()
    assert len(errors) == 2
    assert [r.body for r in stored(hw, "q")] == [b"x", b"from the callback"]


def test_send_future_behaves_as_a_future():
    f = SendFuture()
    assert not f.done() and not f.cancel() and not f.cancelled() and not f.running()
    with pytest.raises(concurrent.futures.TimeoutError):
        f.result(timeout=0.01)
    seen = []
    f.add_done_callback(lambda x: seen.append(x.result()))
    threading.Timer(0.05, f.set_result, (7,)).start()
    assert f.result(timeout=10) == 7 and seen == [7]
    with pytest.raises(concurrent.futures.InvalidStateError):
        f.set_result(8)
    f.add_done_callback(lambda x: seen.append("late"))
    assert seen == [7, "late"]

    quiet = [SendFuture() for _ in range(3)]  # nobody waited: the fast path
    quiet[0].set_result(1)
    quiet[1].set_exception(ValueError("no"))
    assert quiet[0].result() == 1 and isinstance(quiet[1].exception(), ValueError)
    with pytest.raises(ValueError):
        quiet[1].result()
    threading.Timer(0.05, quiet[2].set_result, (3,)).start()
    done, _ = concurrent.futures.wait(quiet, timeout=10)
    assert len(done) == 3
    assert set(concurrent.futures.as_completed(quiet, timeout=10)) == set(quiet)
    assert "finished" in repr(quiet[0])
    with pytest.raises(concurrent.futures.InvalidStateError):  # settled twice, nobody waiting
        quiet[0].set_result(2)


def test_lazy_future_calls_back_without_a_condition_and_cancels_as_a_future():
    f = LazyFuture()
    seen = []
    f.add_done_callback(lambda x: seen.append(x.result()))
    f.add_done_callback(lambda x: seen.append("second"))
    assert f.has_done_callbacks() and not f.done()
    f.set_result(5)
    assert seen == [5, "second"]
    assert f._lazy is None  # settled and called back without making a condition
    with pytest.raises(concurrent.futures.InvalidStateError):
        f.set_result(6)
    with pytest.raises(concurrent.futures.InvalidStateError):
        f.set_exception(ValueError("late"))
    assert not f.cancel() and f.result() == 5
    f.add_done_callback(lambda x: seen.append("late"))
    assert seen == [5, "second", "late"]

    g = LazyFuture()
    called = []
    g.add_done_callback(called.append)
    assert g.cancel() and g.cancelled() and g.done() and called == [g]
    assert g.cancel()  # still cancelled
    with pytest.raises(concurrent.futures.CancelledError):
        g.result()
    with pytest.raises(concurrent.futures.InvalidStateError):
        g.set_result(1)  # the transport drops an answer that comes for nobody

    h = LazyFuture()  # a thread waits first: Future's own way, on the condition
    threading.Timer(0.05, h.cancel).start()
    with pytest.raises(concurrent.futures.CancelledError):
        h.result(timeout=10)
    k = LazyFuture()
    threading.Timer(0.05, k.set_exception, (ValueError("no"),)).start()
    assert isinstance(k.exception(timeout=10), ValueError)
    k.add_done_callback(called.append)
    assert called == [g, k]


# -- ordering and batching ----------------------------------------------------------------


def test_order_per_partition_under_concurrent_sends(hw):
    hw.admin.create_queue("q", partitions=3)
    p = hw.producer(linger_ms=1)
    futs: dict[int, list] = {}
    errors = []

    def work(t: int) -> None:
        try:
            mine = futs.setdefault(t, [])
            for i in range(150):
                mine.append(p.send("q", f"{t}-{i}".encode(), key=f"thread-{t}".encode()))
                if i % 50 == 0:
                    p.send_batch("q", [Message(f"{t}-{i}-b{j}".encode(), key=f"thread-{t}".encode()) for j in range(3)])
        except Exception as e:  # pragma: no cover - surfaced below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    p.flush()
    assert not errors
    for t, fs in futs.items():
        ids = [f.result() for f in fs]
        assert len({i.partition for i in ids}) == 1
        assert [i.offset for i in ids] == sorted(i.offset for i in ids)  # in send order
        got = [r.body.decode() for r in stored(hw, "q", ids[0].partition) if r.body.startswith(f"{t}-".encode())]
        want = []
        for i in range(150):
            want.append(f"{t}-{i}")
            if i % 50 == 0:
                want += [f"{t}-{i}-b{j}" for j in range(3)]
        assert got == want
    assert hw.admin.describe_queue("q").message_count == 8 * (150 + 9)


def test_linger_forms_multi_message_batches(hw):
    hw.admin.create_queue("q", partitions=2)
    svc = Wrapped(hw.service)
    with Producer(svc, linger_ms=300) as p:
        futs = [p.send("q", f"m{i}".encode(), partition=1) for i in range(200)]
        p.flush()
    assert svc.calls <= 3 and sum(svc.batch_sizes) == 200
    assert [f.result().offset for f in futs] == list(range(200))
    batches = hw.service.fetch("q", 1, 0, max_bytes=1 << 20).batches
    assert len(batches) == svc.calls and decode_header(batches[0]).count >= 50


def test_batch_bytes_max_splits_batches(hw):
    hw.admin.create_queue("q")
    svc = Wrapped(hw.service)
    with Producer(svc, linger_ms=60_000, batch_bytes_max=1000) as p:
        for _ in range(50):
            p.send("q", b"x" * 84)  # 100 bytes each, counting the overhead
        p.flush()
    assert svc.batch_sizes == [10] * 5


def test_natural_batching_while_a_batch_is_in_flight(hw):
    hw.admin.create_queue("q")
    gate = threading.Event()
    svc = Wrapped(hw.service, gate=gate, pipelined=False)
    p = Producer(svc)  # linger_ms=0
    first = p.send("q", b"first")
    deadline = time.monotonic() + 10
    while svc.calls == 0 and time.monotonic() < deadline:
        time.sleep(0.001)
    rest = [p.send("q", f"m{i}".encode()) for i in range(100)]
    t = threading.Thread(target=lambda: rest.append(p.send_batch("q", [b"sync-1", b"sync-2"])))
    t.start()
    time.sleep(0.05)
    gate.set()
    t.join(30)
    p.flush()
    assert svc.batch_sizes == [1, 102]  # everything that came while one was in flight: one batch
    assert first.result().offset == 0 and [f.result().offset for f in rest[:100]] == list(range(1, 101))
    assert [i.offset for i in rest[100]] == [101, 102]
    p.close()


def test_unkeyed_sends_stick_to_a_partition_per_batch(hw):
    hw.admin.create_queue("q", partitions=4)
    svc = Wrapped(hw.service)
    with Producer(svc, linger_ms=30_000, batch_bytes_max=10 * (8 + 16)) as p:
        futs = [p.send("q", b"12345678") for _ in range(80)]
        p.flush()
    parts = [f.result().partition for f in futs]
    assert svc.batch_sizes == [10] * 8
    assert all(len(set(parts[i : i + 10])) == 1 for i in range(0, 80, 10))  # one partition per batch
    assert set(parts) == {0, 1, 2, 3}  # and the batches go round


# -- flush, close, validation, the buffer --------------------------------------------------


def test_flush_waits_for_everything_sent_so_far(hw):
    hw.admin.create_queue("q", partitions=2)
    p = hw.producer(linger_ms=60_000)
    futs = [p.send("q", f"m{i}".encode()) for i in range(30)]
    assert not any(f.done() for f in futs)  # lingering
    p.flush(timeout_s=30)
    assert all(f.done() for f in futs)
    assert hw.admin.describe_queue("q").message_count == 30
    p.flush()  # nothing pending: returns at once


def test_close_sends_what_is_queued_then_refuses(hw):
    hw.admin.create_queue("q")
    p = hw.producer(linger_ms=60_000)
    fut = p.send("q", b"queued")
    p.close()
    assert fut.result(timeout=0).offset == 0
    assert p._sender is None
    with pytest.raises(ClosedError):
        p.send("q", b"x")
    with pytest.raises(ClosedError):
        p.send_and_wait("q", b"x")
    with pytest.raises(ClosedError):
        p.send_batch("q", [b"x"])
    p.close()  # twice is fine


def test_closing_the_client_closes_its_producers(tmp_path):
    hw = headwater.open(tmp_path / "d")
    hw.admin.create_queue("q")
    p = hw.producer(linger_ms=60_000)
    fut = p.send("q", b"late")
    hw.close()
    assert fut.result(timeout=0).offset == 0
    with headwater.open(tmp_path / "d") as hw:
        assert [r.body for r in hw.scanner("q")] == [b"late"]


def test_close_with_a_timeout_fails_what_was_not_sent(hw):
    hw.admin.create_queue("q")
    gate = threading.Event()
    p = Producer(Wrapped(hw.service, gate=gate, pipelined=False))
    first = p.send("q", b"in flight")
    time.sleep(0.05)
    second = p.send("q", b"waiting")
    p.close(timeout_s=0.1)
    with pytest.raises(ClosedError):
        second.result(timeout=10)
    gate.set()
    assert first.result(timeout=30).offset == 0


def test_invalid_input_raises_before_anything_is_queued(hw):
    hw.admin.create_queue("q", partitions=2, message_bytes_max=100)
    p = hw.producer()
    keyed = hw.producer(partitioner="key")
    bad = [
        (InvalidArgumentError, lambda: p.send("q", "text")),  # type: ignore[arg-type]  # the wrong type is what the test checks
        (InvalidArgumentError, lambda: p.send("q", b"x", key="k")),  # type: ignore[arg-type]  # the wrong type is what the test checks
        (InvalidArgumentError, lambda: p.send("q", b"x", tag="")),
        (InvalidArgumentError, lambda: p.send("q", b"x", properties={"a": 1})),  # type: ignore[dict-item]  # the wrong type is what the test checks
        (InvalidArgumentError, lambda: p.send("q", Message(b"x"), key=b"k")),
        (InvalidArgumentError, lambda: p.send("q", Message("text"))),  # type: ignore[arg-type]  # the wrong type is what the test checks
        (InvalidArgumentError, lambda: p.send("q", b"x", callback=42)),  # type: ignore[arg-type]  # the wrong type is what the test checks
        (InvalidArgumentError, lambda: p.send("q", b"x", partition="0")),  # type: ignore[arg-type]  # the wrong type is what the test checks
        (MessageTooLargeError, lambda: p.send("q", b"x" * 101)),
        (MessageTooLargeError, lambda: p.send("q", Message(b"x" * 101, key=b"k"))),
        (PartitionOutOfRangeError, lambda: p.send("q", b"x", partition=2)),
        (QueueNotFoundError, lambda: p.send("nope", b"x")),
        (InvalidArgumentError, lambda: keyed.send("q", b"no key")),
        (InvalidArgumentError, lambda: keyed.send_and_wait("q", b"no key")),
        (InvalidArgumentError, lambda: p.send_batch("q", [b"ok", 3])),  # type: ignore[list-item]  # the wrong type is what the test checks
        (InvalidArgumentError, lambda: p.send_batch("q", [Message(b"a", key=b"k"), Message(b"b", key=3)])),  # type: ignore[arg-type]  # the wrong type is what the test checks
    ]
    for err, call in bad:
        with pytest.raises(err):
            call()
    assert p._buffered_bytes == 0 and not any(ps.open or ps.ready for ps in p._parts.values())
    p.flush()
    assert stored(hw, "q") == []
    for name, value in (
        ("linger_ms", -1),
        ("batch_bytes_max", 0),
        ("retries", 1.5),
        ("idempotent", 1),
        ("compression", "gzip"),
        ("buffer_bytes_max", True),
        ("delivery_timeout_ms", 0),
    ):
        with pytest.raises(InvalidArgumentError, match=name if name != "compression" else "compression"):
            hw.producer(**{name: value})
    with pytest.raises(InvalidArgumentError, match="retry_backoff_max_ms must be an int from 500"):
        Producer(hw.service, retry_backoff_ms=500, retry_backoff_max_ms=100)  # the cap below the first wait


def test_full_buffer_blocks_then_raises(hw):
    hw.admin.create_queue("q")
    gate = threading.Event()
    p = Producer(Wrapped(hw.service, gate=gate, pipelined=False), buffer_bytes_max=1000, max_block_ms=200)
    futs = [p.send("q", b"x" * 84) for _ in range(10)]  # 1000 bytes: full
    t0 = time.monotonic()
    with pytest.raises(UnavailableError, match="buffer full"):
        p.send("q", b"y" * 84)
    assert time.monotonic() - t0 >= 0.19
    with pytest.raises(MessageTooLargeError, match="buffer_bytes_max"):
        p.send("q", b"z" * 2000)
    threading.Timer(0.1, gate.set).start()
    late = p.send("q", b"w" * 84)  # blocks until the first batch is acknowledged
    p.flush()
    assert [f.result().offset for f in futs] + [late.result().offset] == list(range(11))
    p.close()


# -- queue metadata -----------------------------------------------------------------------


class HeldDescribe:
    """A BrokerService in front of the real one that can ask for metadata in the background
    (as the network service does), each of those requests held until :meth:`answer`; it
    counts the requests the producer waited for."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.waited_for = 0
        self.held: list[tuple[str, concurrent.futures.Future]] = []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def describe_queue(self, name):
        self.waited_for += 1
        return self.inner.describe_queue(name)

    def describe_queue_async(self, name):
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self.held.append((name, fut))
        return fut

    def answer(self, error: BaseException | None = None) -> None:
        held, self.held = self.held, []
        for name, fut in held:
            if error is None:
                fut.set_result(self.inner.describe_queue(name))
            else:
                fut.set_exception(error)


def test_sends_go_on_with_stale_metadata_while_a_fresh_copy_is_asked_for(hw):
    hw.admin.create_queue("grow", partitions=1)
    svc = HeldDescribe(hw.service)
    p = Producer(svc, partitioner="round_robin", metadata_max_age_ms=50)
    p.send_and_wait("grow", b"first")  # an unknown queue: its metadata is waited for
    assert svc.waited_for == 1
    hw.admin.add_partitions("grow", 3)
    time.sleep(0.1)  # the copy is stale now
    ids = [p.send("grow", b"x").result(timeout=10) for _ in range(6)]
    assert svc.waited_for == 1 and len(svc.held) == 1  # one refresh asked for, none waited for
    assert {m.partition for m in ids} == {0}  # the old copy still routes: one partition
    svc.answer()
    ids = [p.send("grow", b"y").result(timeout=10) for _ in range(6)]
    assert {m.partition for m in ids} == {0, 1, 2}  # the fresh copy: three
    assert svc.waited_for == 1
    p.close()


def test_over_the_network_the_refresh_is_a_request_nobody_waits_for(server):
    client = headwater.connect(server.address)
    try:
        client.admin.create_queue("grow", partitions=1)
        svc = client.service
        waited: list[str] = []
        real_describe = svc.describe_queue
        svc.describe_queue = lambda name: waited.append(name) or real_describe(name)
        p = Producer(svc, partitioner="round_robin", metadata_max_age_ms=50)
        p.send_and_wait("grow", b"first")
        client.admin.add_partitions("grow", 4)
        time.sleep(0.1)
        parts: set[int] = set()
        deadline = time.monotonic() + 10
        while len(parts) < 4 and time.monotonic() < deadline:  # the answer comes in the background
            parts.add(p.send("grow", b"x").result(timeout=10).partition)
        assert parts == {0, 1, 2, 3}
        assert waited == ["grow"]  # only the first, for a queue not known yet
        p.close()
    finally:
        client.close()


class Outage:
    """A BrokerService in front of the real one whose partitions in ``down`` are out of
    reach, as a cluster's are while their leader is down: their sends fail with
    UnavailableError and a describe marks them offline (``online`` False)."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.down: set[int] = set()
        self.described = 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def describe_queue(self, name):
        self.described += 1
        info = self.inner.describe_queue(name)
        parts = [msgspec.structs.replace(p, online=p.partition not in self.down) for p in info.partitions]
        return msgspec.structs.replace(info, partitions=parts)

    def describe_queue_async(self, name):  # the background refresh, answered at once
        fut: concurrent.futures.Future = concurrent.futures.Future()
        fut.set_result(self.describe_queue(name))
        return fut

    def produce(self, queue, partition, batch):
        if partition in self.down:
            raise UnavailableError(f"cannot reach the leader of {queue}[{partition}] (a test's outage)")
        return self.inner.produce(queue, partition, batch)


@pytest.mark.parametrize("partitioner", ["default", "round_robin", "random"])
def test_unkeyed_messages_go_to_the_partitions_online_while_any_is(hw, partitioner):
    """Kafka's partitioner takes the available partitions for messages without a key; a
    keyed message or one sent to a partition still goes there (and waits for its leader)."""
    hw.admin.create_queue("q", partitions=4)
    svc = Outage(hw.service)
    svc.down = {1, 3}
    with Producer(svc, partitioner=partitioner, delivery_timeout_ms=300, retry_backoff_ms=20) as p:
        got = Counter(p.send_and_wait("q", b"x").partition for _ in range(40))
        got.update(f.result(timeout=10).partition for f in [p.send("q", b"y") for _ in range(40)])
        got.update(m.partition for m in p.send_batch("q", [b"z"] * 5))
        assert set(got) == {0, 2}  # both of them, and only them
        with pytest.raises(UnavailableError, match=r"q\[1\]"):
            p.send_and_wait("q", b"there", partition=1)
        svc.down = {0, 1, 2, 3}  # none online: the sticky partition as before, which waits
        with pytest.raises(UnavailableError):
            p.send_and_wait("q", b"nowhere")


def test_a_partition_found_out_of_reach_makes_the_metadata_stale(hw):
    """The producer's copy of the metadata is kept for metadata_max_age_ms; a send that
    finds a broker out of reach makes it stale at once, so unkeyed messages leave the
    partitions the next describe finds offline, without waiting for the copy to age."""
    hw.admin.create_queue("q", partitions=2)
    svc = Outage(hw.service)
    with Producer(svc, partitioner="round_robin", metadata_max_age_ms=600_000, delivery_timeout_ms=300) as p:
        assert {p.send_and_wait("q", b"x").partition for _ in range(4)} == {0, 1}
        assert svc.described == 1
        svc.down = {1}
        with pytest.raises(UnavailableError):
            p.send_and_wait("q", b"there", partition=1)
        assert {p.send_and_wait("q", b"x").partition for _ in range(10)} == {0}
        assert svc.described == 2  # asked once more, not per send


def test_a_failed_refresh_keeps_the_old_copy_and_is_tried_again_later(hw):
    from headwater.client.core.metadata import METADATA_RETRY_MS

    hw.admin.create_queue("q", partitions=2)
    svc = HeldDescribe(hw.service)
    p = Producer(svc, metadata_max_age_ms=50)
    p.send_and_wait("q", b"first")
    time.sleep(0.1)
    p.send("q", b"a").result(timeout=10)
    assert len(svc.held) == 1
    svc.answer(UnavailableError("injected: the broker is restarting"))
    for _ in range(5):  # not asked for again at every send
        p.send("q", b"b").result(timeout=10)
    assert svc.held == []
    time.sleep(METADATA_RETRY_MS / 1000 + 0.1)
    p.send("q", b"c").result(timeout=10)
    assert len(svc.held) == 1 and svc.waited_for == 1
    svc.answer()
    p.close()


# -- retries, idempotence, timeouts -------------------------------------------------------


def test_retries_store_each_message_once_and_return_original_ids(hw):
    hw.admin.create_queue("q", partitions=2)
    svc = Wrapped(hw.service, plan=["after", "before", None, "after", "after", None, "before", "after"])
    p = Producer(svc, retry_backoff_ms=5, linger_ms=2)
    futs = []
    for i in range(60):
        futs.append(p.send("q", f"m{i}".encode(), partition=i % 2))
        if i % 20 == 0:
            time.sleep(0.01)  # several batches
    ids = list(p.send_batch("q", [b"b0", b"b1"], partition=0))
    ids.append(p.send_and_wait("q", b"last", partition=1))
    p.flush()
    assert svc.calls >= 9 and not svc.plan
    records = {r.message_id: r.body for r in stored(hw, "q")}
    want = [f"m{i}".encode() for i in range(60)] + [b"b0", b"b1", b"last"]
    assert sorted(records.values()) == sorted(want)  # each exactly once
    assert [records[f.result()] for f in futs] + [records[i] for i in ids] == want
    assert p.producer_epoch == 0  # every batch got through


def test_inline_send_retries_a_lost_answer(hw):
    hw.admin.create_queue("q")
    svc = Wrapped(hw.service, plan=["after", "after"])
    p = Producer(svc, retry_backoff_ms=1)
    ids = p.send_batch("q", [b"a", b"b"], partition=0)
    assert [i.offset for i in ids] == [0, 1] and svc.calls == 3
    assert [r.body for r in stored(hw, "q")] == [b"a", b"b"]


def test_exhausted_retries_fail_and_bump_the_epoch(hw):
    hw.admin.create_queue("q")
    svc = Wrapped(hw.service, plan=["after", "after", "after"])
    p = Producer(svc, retries=2, retry_backoff_ms=1)
    fut = p.send("q", b"stored, but never acknowledged")
    with pytest.raises(UnavailableError, match="answer was lost"):
        fut.result(timeout=30)
    assert p.producer_epoch == 1
    # Without the new epoch the broker would take this one-message batch with sequence 0
    # for a retry of the first and answer with its offset, dropping it.
    assert p.send_and_wait("q", b"next").offset == 1
    assert p.send("q", b"and on").result(timeout=30).offset == 2
    assert [r.body for r in stored(hw, "q")] == [b"stored, but never acknowledged", b"next", b"and on"]


def test_a_refused_sequence_is_sent_again_under_a_new_epoch(hw):
    hw.admin.create_queue("q")
    p = Producer(hw.service)
    assert p.send_and_wait("q", b"a").offset == 0
    p._service = Wrapped(hw.service, plan=["gap"], pipelined=False)
    assert p.send_and_wait("q", b"b").offset == 1  # inline
    p._service = svc = Wrapped(hw.service, plan=["gap"])
    p._produce_async = svc.produce_async
    assert p.send("q", b"c").result(timeout=30).offset == 2  # through the sender
    assert p.producer_epoch == 2 and svc.calls == 2
    batches = hw.service.fetch("q", 0, 0, max_bytes=1 << 20).batches
    assert [(decode_header(b).producer_epoch, decode_header(b).base_sequence) for b in batches] == [
        (0, 0),
        (1, 0),
        (2, 0),
    ]
    assert [r.body for r in stored(hw, "q")] == [b"a", b"b", b"c"]


def test_delivery_timeout_fails_a_batch_that_keeps_failing(hw):
    hw.admin.create_queue("q")
    svc = Wrapped(hw.service, fail_all=True)
    p = Producer(svc, retries=1000, retry_backoff_ms=10, retry_backoff_max_ms=20, delivery_timeout_ms=300)
    t0 = time.monotonic()
    fut = p.send("q", b"x")
    with pytest.raises(UnavailableError, match="delivery_timeout_ms=300"):
        fut.result(timeout=30)
    assert 0.2 < time.monotonic() - t0 < 10 and svc.calls >= 5
    with pytest.raises(UnavailableError, match="delivery_timeout_ms"):
        p.send_and_wait("q", b"y")
    p.close()


def test_delivery_timeout_fails_a_batch_that_waited_too_long(hw):
    hw.admin.create_queue("q")
    gate = threading.Event()
    p = Producer(Wrapped(hw.service, gate=gate, pipelined=False), delivery_timeout_ms=200)
    first = p.send("q", b"in flight")
    time.sleep(0.05)
    second = p.send("q", b"waits behind it")
    time.sleep(0.4)
    gate.set()
    assert first.result(timeout=30).offset == 0  # a request in flight is not abandoned
    with pytest.raises(UnavailableError, match="waited longer"):
        second.result(timeout=30)
    assert [r.body for r in stored(hw, "q")] == [b"in flight"]
    p.close()


def test_retries_without_idempotence_still_deliver(hw):
    hw.admin.create_queue("q")
    svc = Wrapped(hw.service, plan=["before", "before"])
    p = Producer(svc, idempotent=False, retry_backoff_ms=1)
    assert p.producer_id is None
    assert p.send("q", b"x").result(timeout=30).offset == 0
    batch = hw.service.fetch("q", 0, 0, max_bytes=1 << 20).batches[0]
    assert decode_header(batch).producer_id == -1
    p.close()


# -- compression --------------------------------------------------------------------------


@pytest.mark.parametrize("codec, flag", [("zstd", COMPRESSION_ZSTD), ("lz4", COMPRESSION_LZ4)])
def test_compression_round_trip(hw, codec, flag):
    hw.admin.create_queue("q")
    # a linger no loaded machine outlasts: flush() seals the one batch, so each is compressed whole
    p = hw.producer(compression=codec, linger_ms=60_000)
    msgs = [Message(f"body {i} ".encode() * 20, key=f"k{i}".encode(), tag="t") for i in range(50)]
    futs = [p.send("q", m) for m in msgs]
    ids = p.send_batch("q", [b"plain" * 100] * 3)
    p.flush()
    got = stored(hw, "q")
    assert [(r.body, r.key) for r in got[:50]] == [(m.body, m.key) for m in msgs]
    assert [r.message_id for r in got] == [f.result() for f in futs] + list(ids)
    for b in hw.service.fetch("q", 0, 0, max_bytes=1 << 20).batches:
        h = decode_header(b)
        assert h.flags & COMPRESSION_MASK == flag and h.payload_size < 40 * h.count


def test_a_retry_behind_one_refused_as_out_of_order_goes_under_the_new_epoch_too(hw):
    """Two batches in flight: the broker refuses the first as out of order (so it stored
    neither), the second never arrives. The first goes again under a new epoch; the second,
    behind it, must too: under its old epoch the broker would refuse it as fenced."""
    hw.admin.create_queue("q")
    svc = Wrapped(hw.service, plan=["gap", "before"])
    p = Producer(svc, retry_backoff_ms=1, linger_ms=50, batch_bytes_max=64)
    futs = [p.send("q", b"first" * 10), p.send("q", b"second" * 10)]
    assert [f.result(timeout=30).offset for f in futs] == [0, 1]
    assert [r.body for r in stored(hw, "q")] == [b"first" * 10, b"second" * 10]
    p.close()


def test_mixed_calls_from_threads_with_faults_keep_order_and_store_once(hw):
    import random

    hw.admin.create_queue("q", partitions=3)
    rng = random.Random(7)
    svc = Wrapped(hw.service, plan=[rng.choice([None, None, "before", "after", "gap"]) for _ in range(400)])
    p = Producer(svc, retry_backoff_ms=1, retries=50, linger_ms=1, batch_bytes_max=600)
    errors = []

    def work(t: int) -> None:
        try:
            key = f"t{t}".encode()
            futs = []
            for i in range(60):
                kind = i % 3
                if kind == 0:
                    futs.append(p.send("q", f"{t}-{i}".encode(), key=key))
                elif kind == 1:
                    p.send_and_wait("q", f"{t}-{i}".encode(), key=key)
                else:
                    p.send_batch("q", [Message(f"{t}-{i}".encode(), key=key)])
            for f in futs:
                f.result(timeout=60)
        except Exception as e:  # pragma: no cover - surfaced below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    p.close()
    assert not errors, errors[:3]
    bodies = [r.body.decode() for r in stored(hw, "q")]
    assert len(bodies) == len(set(bodies)) == 6 * 60  # each once
    for t in range(6):
        mine = [b for b in bodies if b.startswith(f"{t}-")]
        assert mine == [f"{t}-{i}" for i in range(60)]  # in order (one key: one partition)


# -- pipelining ---------------------------------------------------------------------------


class Held:
    """A service whose ``produce_async`` holds each request until :meth:`release`, then
    runs it against the real service in arrival order (as a broker appends a connection's
    requests); call numbers in ``fail`` fail without reaching the broker."""

    def __init__(self, inner, fail=()) -> None:
        self.inner = inner
        self.fail = set(fail)
        self.calls = 0
        self.sizes: list[int] = []
        self.threads: list[str] = []  # the thread that made each call
        self._held: list[tuple] = []
        self._lock = threading.Lock()

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def produce_async(self, queue, partition, batch):
        fut: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            self.calls += 1
            self.sizes.append(decode_header(batch).count)
            self.threads.append(threading.current_thread().name)
            self._held.append((self.calls, queue, partition, bytes(batch), fut))
        return fut

    def held(self) -> int:
        with self._lock:
            return len(self._held)

    def release(self, n: int | None = None) -> None:
        with self._lock:
            n = len(self._held) if n is None else n
            items, self._held = self._held[:n], self._held[n:]
        for call, queue, partition, batch, fut in items:
            if call in self.fail:
                fut.set_exception(UnavailableError(f"injected: call {call} lost"))
                continue
            try:
                fut.set_result(self.inner.produce(queue, partition, batch))
            except Exception as e:  # noqa: BLE001 - the broker's answer
                fut.set_exception(e)


def test_batches_of_a_partition_are_pipelined_up_to_max_in_flight(hw):
    hw.admin.create_queue("q")
    svc = Held(hw.service)
    p = Producer(svc)  # idempotent, linger_ms=0: five in flight
    assert p.max_in_flight == 5
    futs = [p.send("q", f"m{i}".encode()) for i in range(8)]
    wait_for(lambda: svc.held() == 5)
    time.sleep(0.05)
    assert svc.sizes == [1] * 5  # each left at once; the last three wait for room
    svc.release(1)
    wait_for(lambda: svc.calls == 6)
    release_and_check_stored(svc, hw, futs)
    assert svc.sizes == [1] * 5 + [3]  # what waited left as one batch
    p.close()


def release_and_check_stored(svc: Held, hw, futs: list) -> None:
    """Let every held request through; the futures' offsets and the stored bodies of queue
    "q" must then be those of sends ``m0``, ``m1``, ... in order."""
    svc.release()
    wait_for(lambda: all(f.done() for f in futs))
    assert [f.result().offset for f in futs] == list(range(len(futs)))
    assert [r.body for r in stored(hw, "q")] == [f"m{i}".encode() for i in range(len(futs))]


def test_a_batch_that_waited_for_room_leaves_from_the_thread_that_made_room(hw):
    # over the network that thread is the client's I/O thread, which read the answer: sending
    # from there spares a wake-up of the sender thread per batch when a pipeline is full
    hw.admin.create_queue("q")
    svc = Held(hw.service)
    p = Producer(svc)
    futs = [p.send("q", f"m{i}".encode()) for i in range(7)]
    assert svc.held() == 5 and p._sender is None  # send() sent them itself; two wait for room
    svc.release(1)  # settles the first answer on this thread
    assert svc.calls == 6 and svc.sizes[-1] == 2  # the two left at once, as one batch
    assert svc.threads[-1] == threading.current_thread().name
    assert p._sender is None  # no sender thread was needed
    release_and_check_stored(svc, hw, futs)
    p.close()


def test_a_lingering_batch_waits_for_its_linger_after_room_is_made(hw):
    hw.admin.create_queue("q")
    svc = Held(hw.service)
    p = Producer(svc, linger_ms=200, max_in_flight=1)
    first = p.send("q", b"a")
    wait_for(lambda: svc.held() == 1)  # left when its linger ended
    second = p.send("q", b"b")  # lingers, and would wait for room anyway
    svc.release(1)
    assert svc.calls == 1  # room alone does not cut its linger short
    wait_for(lambda: svc.calls == 2)
    svc.release()
    assert first.result(5).offset == 0 and second.result(5).offset == 1
    p.close()


def test_max_in_flight_one_keeps_one_request_per_partition(hw):
    hw.admin.create_queue("q", partitions=2)
    svc = Held(hw.service)
    p = Producer(svc, max_in_flight=1)
    futs = [p.send("q", b"x", partition=i % 2) for i in range(6)]
    wait_for(lambda: svc.held() == 2)
    time.sleep(0.05)
    assert svc.calls == 2  # one per partition
    while not all(f.done() for f in futs):
        svc.release()
        time.sleep(0.01)
    assert sorted(f.result().offset for f in futs) == [0, 0, 1, 1, 2, 2]
    p.close()
    with pytest.raises(InvalidArgumentError, match="max_in_flight"):
        Producer(svc, max_in_flight=6)
    assert Producer(svc, idempotent=False).max_in_flight == 1


@pytest.mark.parametrize("lost", [[1], [2], [3, 4], [1, 2, 3, 4, 5]])
def test_a_lost_batch_in_a_pipeline_is_retried_before_the_batches_after_it(hw, lost):
    """Five batches in flight, some lost before reaching the broker: the broker refuses
    those after a gap (out of order, nothing stored), the producer sends them all again in
    order, and every message is stored once, in send order."""
    hw.admin.create_queue("q")
    svc = Held(hw.service, fail=lost)
    p = Producer(svc, retry_backoff_ms=1)
    futs = [p.send("q", f"m{i}".encode()) for i in range(5)]
    wait_for(lambda: svc.held() == 5)
    futs += [p.send("q", f"m{i}".encode()) for i in range(5, 9)]
    while not all(f.done() for f in futs):
        svc.release()
        time.sleep(0.005)
    assert [r.body for r in stored(hw, "q")] == [f"m{i}".encode() for i in range(9)]
    assert [f.result().offset for f in futs] == list(range(9))
    p.close()


def test_a_batch_after_an_epoch_bump_waits_for_the_old_epochs_batches(hw):
    """A bump (here: a batch of another partition failing for good after it may have been
    stored) must not let a new-epoch batch overtake an old-epoch one still in flight: if
    that one failed and were sent again, the broker would refuse it as fenced."""
    hw.admin.create_queue("q", partitions=2)
    svc = Held(hw.service, fail=[1, 2])
    p = Producer(svc, retries=0)
    doomed = p.send("q", b"doomed", partition=1)  # call 1: fails for good, bumps the epoch
    kept = p.send("q", b"a", partition=0)  # call 2: lost, retried
    wait_for(lambda: svc.held() == 2)
    svc.release(1)
    wait_for(lambda: doomed.done())
    assert p.producer_epoch == 1
    later = p.send("q", b"b", partition=0)  # new epoch: waits until "a" is through
    time.sleep(0.05)
    assert svc.calls == 2
    p._retry.retries = 3  # from here on "a" is retried (the settings are read-only)
    while not later.done():
        svc.release()
        time.sleep(0.005)
    with pytest.raises(UnavailableError):
        doomed.result()
    assert kept.result().offset == 0 and later.result().offset == 1
    assert [r.body for r in stored(hw, "q", 0)] == [b"a", b"b"]
    p.close()


def test_a_codec_whose_library_is_missing_is_refused_when_the_producer_is_made(monkeypatch, tmp_path):
    """A plain ``pip install headwater`` has no zstandard: the producer says what to install
    when it is made, instead of failing each batch with ModuleNotFoundError on its thread."""
    import asyncio
    import sys

    import headwater.aio

    monkeypatch.setitem(sys.modules, "zstandard", None)  # import zstandard now raises ImportError
    hw = headwater.open(tmp_path / "data")
    try:
        with pytest.raises(
            InvalidArgumentError,
            match=r"compression='zstd' needs the zstandard package, "
            r"which is not installed: pip install 'headwater\[compression\]'",
        ):
            hw.producer(compression="zstd")
        hw.producer(compression="lz4").close()  # installed: fine
    finally:
        hw.close()

    async def main() -> None:
        ahw = await headwater.aio.open(tmp_path / "data")
        try:
            with pytest.raises(InvalidArgumentError, match="needs the zstandard package"):
                ahw.producer(compression="zstd")
        finally:
            await ahw.close()

    asyncio.run(main())


def test_short_lived_producers_do_not_all_start_on_partition_0(hw):
    """Round robin begins at a random partition: twenty producers that each send one
    unkeyed batch and go (the CLI's produce, a cron job) spread over the queue, where they
    all used to land on partition 0."""
    hw.admin.create_queue("spread", partitions=8)
    partitions = set()
    for _ in range(20):
        p = hw.producer()
        partitions.add(p.send_batch("spread", [b"one"])[0].partition)
        p.close()
    assert len(partitions) > 1


def test_similar_keys_spread_over_the_partitions(hw):
    """Keys that differ in a character or two (``user-0`` .. ``user-9``) fill every partition.
    The key hash used to be plain CRC32C, which is linear: those ten keys filled two of four
    partitions, and the keys ``0`` .. ``7`` four of eight."""
    hw.admin.create_queue("by-user", partitions=4)
    keys = [f"user-{i}".encode() for i in range(10)]
    p = hw.producer(partitioner="key")
    try:
        ids = [p.send("by-user", Message(b"x", key=k)) for k in keys]
        p.flush()
        partitions = [f.result().partition for f in ids]
    finally:
        p.close()
    assert set(partitions) == {0, 1, 2, 3}
    assert partitions == [key_partition(k, 4) for k in keys]


def test_the_key_hash_spreads_families_of_keys_like_random_choices():
    """Over many families of similar keys, the partitions a family uses are as many as random
    choices would use (the expectation for 8 keys on 8 partitions is 5.25)."""
    families = [
        [f"{prefix}{i}".encode() for i in range(start, start + 8)]
        for prefix in ("", "user-", "k", "order:", "session/", "tenant.")
        for start in range(0, 400, 8)
    ]
    used = [len({key_partition(k, 8) for k in keys}) for keys in families]
    assert 4.9 < sum(used) / len(used) < 5.6
    assert min(used) >= 3


def test_close_returns_once_an_identified_batch_in_flight_is_answered(hw):
    """close() flushes the producer's own sends and stops its sender thread, which waits for
    every batch in flight, a ``send_identified`` one too (its caller waits for its answer). An
    answer settled on the thread that read it did not wake the sender, so once close() had
    looked, the sender slept on and close() never returned: the Spark writer's finish() hung
    when a refusal ended it while other partitions' batches were in flight."""
    hw.admin.create_queue("q")
    release = threading.Event()

    class HoldsIdentified:  # the broker answers producer id 77 once released
        produce_async = None

        def __getattr__(self, name):
            return getattr(hw.service, name)

        def produce(self, queue, partition, batch):
            if decode_header(batch).producer_id == 77:
                assert release.wait(30)
            return hw.service.produce(queue, partition, batch)

    p = Producer(HoldsIdentified(), linger_ms=1)
    assert p.send("q", b"own").result(timeout=10).offset == 0  # it lingered: the sender thread runs
    held = p.send_identified("q", 0, [b"named"], identity=(77, 0))
    closer = threading.Thread(target=p.close, daemon=True)
    closer.start()
    time.sleep(0.2)  # close() has flushed (nothing of its own left) and waits for the sender
    assert closer.is_alive()
    release.set()
    assert held.result(timeout=10).base_offset == 1
    closer.join(10)
    assert not closer.is_alive(), "close() still waits for the sender thread"


def test_a_batch_sent_under_a_named_identity_is_stored_once_and_keeps_its_refusals(hw):
    """``send_identified`` (the Spark writer's path): the caller names the batch's producer
    id and epoch; sent again, it is recognised; out of order, the caller hears of it."""
    hw.admin.create_queue("q", partitions=2)
    p = hw.producer()
    first = p.send_identified("q", 1, [b"a", b"b"], identity=(4242, 7)).result(timeout=10)
    again = p.send_identified("q", 1, [b"a", b"b"], identity=(4242, 7)).result(timeout=10)
    assert (first.partition, first.base_offset, first.count) == (1, 0, 2) and again == first
    with pytest.raises(OutOfOrderSequenceError):  # sequence 5, where the broker expects 2
        p.send_identified("q", 1, [b"c"], identity=(4242, 7), base_sequence=5).result(timeout=10)
    rest = p.send_identified("q", 1, [b"c"], identity=(4242, 7), base_sequence=2).result(timeout=10)
    assert rest.base_offset == 2 and p.producer_epoch == 0  # the producer's own epoch is untouched
    assert [r.body for r in hw.scanner("q", partitions=[1])] == [b"a", b"b", b"c"]
    p.close()


def test_the_asyncio_producer_sends_under_a_named_identity_alike(aio_target):
    async def test(hw) -> None:
        await hw.admin.create_queue("q", partitions=2)
        p = hw.producer()
        first = await p.send_identified("q", 1, [b"a", b"b"], identity=(4242, 7))
        assert await p.send_identified("q", 1, [b"a", b"b"], identity=(4242, 7)) == first
        assert (first.partition, first.base_offset, first.count) == (1, 0, 2)
        with pytest.raises(OutOfOrderSequenceError):
            await p.send_identified("q", 1, [b"c"], identity=(4242, 7), base_sequence=5)
        rest = await p.send_identified("q", 1, [b"c"], identity=(4242, 7), base_sequence=2)
        assert rest.base_offset == 2
        await p.close()

    run(aio_target, test)


def test_send_and_wait_of_plain_bytes_asks_a_partitioner_that_decides_per_message(hw):
    """send_and_wait(queue, bytes) skips the partitioner's per-message call for the sticky
    strategies only: a callable still picks the partition, and "key" still refuses a message
    without a key."""
    hw.admin.create_queue("picked", partitions=3)
    with hw.producer(partitioner=lambda msg, n: n - 1) as p:
        assert [p.send_and_wait("picked", b"x").partition for _ in range(3)] == [2, 2, 2]
    with hw.producer(partitioner="key") as p:
        with pytest.raises(InvalidArgumentError, match="needs every message to have a key"):
            p.send_and_wait("picked", b"x")
    with hw.producer(partitioner="round_robin") as p:
        assert sorted(p.send_and_wait("picked", b"x").partition for _ in range(3)) == [0, 1, 2]
