"""The one-message round trip over the network (issue 32): ``send_and_wait`` writes its batch
from the caller's thread and reads the answer there when its partition is idle. It must keep
each partition's order and sequence numbers with batches of other threads in flight, and a
broker lost mid-call must give the caller one clear outcome.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

import headwater
from headwater.errors import HeadwaterError
from tests.support.broker_process import BrokerProcess, free_port


def test_send_and_wait_racing_sends_keeps_each_threads_order_and_the_sequences(server):
    """Three threads send() while one calls send_and_wait(), all on one partition of one
    idempotent producer: every call succeeds (a sequence out of order or a duplicate would be
    refused by the broker), every message is stored once, and each thread's messages are
    stored in the order it sent them, the inline ones included."""
    per_thread = 300
    with headwater.connect(server.address) as hw:
        hw.admin.create_queue("race", partitions=1, ttl_s=None)
        producer = hw.producer(linger_ms=0)
        errors: list[BaseException] = []
        futures: list = []
        start = threading.Barrier(4)

        def sender(name: str) -> None:
            start.wait()
            try:
                for i in range(per_thread):
                    futures.append(producer.send("race", f"{name}-{i}".encode()))
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        def waiter() -> None:
            start.wait()
            try:
                for i in range(per_thread):
                    producer.send_and_wait("race", f"w-{i}".encode())
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=sender, args=(f"s{k}",)) for k in range(3)]
        threads.append(threading.Thread(target=waiter))
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        producer.flush(30)
        assert not errors, errors[:3]
        for f in futures:
            f.result(timeout=10)
        producer.close()
        bodies = [r.body.decode() for r in hw.scanner("race")]
    assert len(bodies) == 4 * per_thread and len(set(bodies)) == len(bodies)  # all there, once each
    by_thread: dict[str, list[int]] = {}
    for b in bodies:
        name, i = b.split("-")
        by_thread.setdefault(name, []).append(int(i))
    assert by_thread == {name: list(range(per_thread)) for name in ("s0", "s1", "s2", "w")}


def test_send_and_wait_with_its_broker_killed_mid_call_succeeds_once_or_raises_retriable(tmp_path):
    """A thread calls send_and_wait() in a loop while the broker is SIGKILLed, kept down
    until a call gives up (connect_timeout_s), and started again on the same port: each
    call either returns (its message then stored exactly once,
    at the id it returned) or raises a retriable error (its message stored at most once);
    calls go on succeeding once the broker is back."""
    port = free_port()
    data = tmp_path / "data"
    broker = BrokerProcess(data, "--flush", "sync", port=port).start()
    outcomes: dict[str, object] = {}
    stop = threading.Event()
    try:
        with headwater.connect(broker.address, connect_timeout_s=1.0, request_timeout_s=10.0) as hw:
            hw.admin.create_queue("kill", partitions=1, ttl_s=None)
            producer = hw.producer()

            def loop() -> None:
                i = 0
                while not stop.is_set():
                    body = f"m-{i}"
                    try:
                        outcomes[body] = producer.send_and_wait("kill", body.encode())
                    except HeadwaterError as e:
                        outcomes[body] = e
                    i += 1

            t = threading.Thread(target=loop)
            t.start()
            deadline = time.monotonic() + 20
            while len(outcomes) < 50 and time.monotonic() < deadline:
                time.sleep(0.01)
            broker.kill()  # mid-stream: some call is between its write and its answer
            while not any(isinstance(o, BaseException) for o in outcomes.values()) and time.monotonic() < deadline:
                time.sleep(0.01)  # down until a call gives up (connect_timeout_s), or 20 s
            broker = BrokerProcess(data, "--flush", "sync", port=port).start()
            before = len(outcomes)
            while len(outcomes) < before + 50 and time.monotonic() < deadline + 20:
                time.sleep(0.01)
            stop.set()
            t.join(30)
            assert not t.is_alive()
            producer.close()
        with headwater.connect(broker.address) as hw:
            records = list(hw.scanner("kill"))
        stored = Counter(r.body.decode() for r in records)
        ids = {r.body.decode(): r.message_id for r in records}
    finally:
        stop.set()
        broker.kill()
    assert len(outcomes) >= before + 50  # the calls went on once the broker was back
    for body, outcome in outcomes.items():
        if isinstance(outcome, BaseException):
            assert outcome.retriable, (body, outcome)
            assert stored[body] <= 1, body
        else:
            assert stored[body] == 1, body
            assert ids[body] == outcome, body
    assert not [b for b, n in stored.items() if n > 1]
