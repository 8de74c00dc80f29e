"""A move under steady produce and consume, through the clients a user has (issue 31's
acceptance): one routed client sends keyed messages with an idempotent producer while a
consumer assigned every partition reads, a third broker joins and `cluster rebalance` moves
partitions to it. Every acknowledged message is read exactly once, at one offset, and a scan
afterwards finds each once: nothing lost, nothing twice."""

from __future__ import annotations

import threading
import time
from collections import Counter

import headwater
from tests.support.cluster import Cluster, eventually

QUEUE = "steady"
PARTITIONS = 4


def test_a_rebalance_under_steady_produce_and_consume_loses_and_doubles_nothing(zk_server, tmp_path):
    cluster = Cluster(zk_server, tmp_path, 2)
    try:
        cluster.controller()
        bootstrap = f"{cluster.address(1)},{cluster.address(2)}"
        acked: list[bytes] = []
        read: list[tuple[int, int, bytes]] = []
        stop_sending, stop_reading = threading.Event(), threading.Event()
        errors: list[BaseException] = []
        with headwater.connect(bootstrap) as hw:
            hw.admin.create_queue(QUEUE, partitions=PARTITIONS)

            def send() -> None:
                try:
                    with hw.producer(linger_ms=2, delivery_timeout_ms=60_000) as producer:
                        n = 0
                        while not stop_sending.is_set():
                            body = f"m-{n}".encode()
                            f = producer.send(QUEUE, body, key=f"k-{n % 31}".encode())
                            f.add_done_callback(lambda f, body=body: f.exception() or acked.append(body))
                            n += 1
                            if n % 50 == 0:
                                time.sleep(0.005)
                        producer.flush()
                except BaseException as e:  # noqa: BLE001 - the test reports it
                    errors.append(e)

            def consume() -> None:
                try:
                    with headwater.connect(bootstrap) as reader:
                        c = reader.consumer(auto_offset_reset="earliest")
                        c.assign(QUEUE)
                        while not stop_reading.is_set():
                            read.extend((r.partition, r.offset, r.body) for r in c.poll(timeout_ms=200))
                        c.close()
                except BaseException as e:  # noqa: BLE001 - the test reports it
                    errors.append(e)

            sender, reader_thread = threading.Thread(target=send), threading.Thread(target=consume)
            sender.start()
            reader_thread.start()
            try:
                eventually(lambda: len(acked) > 2000, what="sends under way")
                cluster.start(3)
                eventually(lambda: cluster.status(1)["brokers"] == [1, 2, 3], what="broker 3 joining")
                moves = hw.admin.rebalance()
                assert moves and {m.target for m in moves} == {3}
                eventually(lambda: not hw.admin.cluster_metadata([]).moves, timeout_s=60, what="the moves finishing")
                before = len(acked)
                eventually(lambda: len(acked) > before + 2000, what="sends to the new leader")
            finally:
                stop_sending.set()
                sender.join(90)
            eventually(lambda: len({b for _, _, b in read}) >= len(set(acked)), timeout_s=60, what="reading it all")
            stop_reading.set()
            reader_thread.join(30)
            assert not errors, errors
            leaders = {p.partition: p.leader for p in hw.admin.cluster_metadata([QUEUE]).queue(QUEUE).partitions}
            assert 3 in leaders.values()
            scanned = [r.body for r in hw.scanner(QUEUE)]
        assert len(acked) == len(set(acked))  # each send acknowledged once
        assert Counter(scanned) == Counter(set(acked))  # stored once each, nothing lost
        positions = [(p, o) for p, o, _ in read]
        assert len(positions) == len(set(positions))  # the consumer read each offset once
        assert Counter(b for _, _, b in read) == Counter(set(acked))  # and each message once
    finally:
        cluster.stop()
