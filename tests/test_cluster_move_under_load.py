"""A move under steady produce and consume, through the clients a user has (issue 31's
acceptance): one routed client sends keyed messages with an idempotent producer while a
consumer assigned every partition reads (or a group of two members reads, committing after
each poll), a third broker joins and `cluster rebalance` moves partitions to it (the
group's coordinator partition among them, maybe). Every acknowledged message is stored
once and read: exactly once by the assigned consumer; by the group at least once, and twice
only across a rejoin of its reader (a coordinator that moved forgets its members, which
read again from their last commit)."""

from __future__ import annotations

import threading
import time
from collections import Counter

import headwater
from tests.support.cluster import Cluster, eventually

QUEUE = "steady"
PARTITIONS = 4


def send_steadily(hw: headwater.Client, acked: list[bytes], stop: threading.Event, errors: list) -> None:
    """Send keyed messages with an idempotent producer until ``stop``; each acknowledged
    body is added to ``acked``, an error of the sender to ``errors``."""
    try:
        with hw.producer(linger_ms=2, delivery_timeout_ms=60_000) as producer:
            n = 0
            while not stop.is_set():
                body = f"m-{n}".encode()
                f = producer.send(QUEUE, body, key=f"k-{n % 31}".encode())
                f.add_done_callback(lambda f, body=body: f.exception() or acked.append(body))
                n += 1
                if n % 50 == 0:
                    time.sleep(0.005)
            producer.flush()
    except BaseException as e:  # noqa: BLE001 - the test reports it
        errors.append(e)


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

            sender = threading.Thread(target=send_steadily, args=(hw, acked, stop_sending, errors))
            reader_thread = threading.Thread(target=consume)
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


def test_a_rebalance_under_a_group_consuming_with_commits_loses_nothing(zk_server, tmp_path):
    cluster = Cluster(zk_server, tmp_path, 2)
    try:
        cluster.controller()
        bootstrap = f"{cluster.address(1)},{cluster.address(2)}"
        acked: list[bytes] = []
        read: list[tuple[str, str, bytes]] = []  # (member name, member id when read, body)
        stop_sending, stop_reading = threading.Event(), threading.Event()
        errors: list[BaseException] = []
        with headwater.connect(bootstrap) as hw:
            hw.admin.create_queue(QUEUE, partitions=PARTITIONS)

            def member(name: str) -> None:
                try:
                    with headwater.connect(bootstrap) as reader:
                        c = reader.consumer(group="steady-readers", subscribe=QUEUE, auto_offset_reset="earliest")
                        while not stop_reading.is_set():
                            records = c.poll(timeout_ms=200)
                            read.extend((name, c.member_id or "", r.body) for r in records)
                            if records:
                                try:
                                    c.commit()
                                except headwater.HeadwaterError:
                                    pass  # a coordinator that moved: the member joins again, reads again
                        c.close()
                except BaseException as e:  # noqa: BLE001 - the test reports it
                    errors.append(e)

            threads = [threading.Thread(target=send_steadily, args=(hw, acked, stop_sending, errors))] + [
                threading.Thread(target=member, args=(n,)) for n in "ab"
            ]
            for t in threads:
                t.start()
            try:
                eventually(lambda: len(acked) > 2000, what="sends under way")
                cluster.start(3)
                eventually(lambda: cluster.status(1)["brokers"] == [1, 2, 3], what="broker 3 joining")
                moves = hw.admin.rebalance()
                assert moves and {m.target for m in moves} == {3}
                eventually(lambda: not hw.admin.cluster_metadata([]).moves, timeout_s=60, what="the moves finishing")
                before = len(acked)
                eventually(lambda: len(acked) > before + 2000, what="sends to the new leaders")
            finally:
                stop_sending.set()
                threads[0].join(90)
            eventually(lambda: {b for _, _, b in read} >= set(acked), timeout_s=60, what="the group reading it all")
            stop_reading.set()
            for t in threads[1:]:
                t.join(30)
            assert not errors, errors
            scanned = [r.body for r in hw.scanner(QUEUE)]
        assert len(acked) == len(set(acked))
        assert Counter(scanned) == Counter(set(acked))  # stored once each, nothing lost
        by_body: dict[bytes, list[tuple[str, str]]] = {}
        for name, member_id, body in read:
            by_body.setdefault(body, []).append((name, member_id))
        for body, readers in by_body.items():
            if len(readers) > 1:  # again only after a rejoin: by another member id
                assert len(set(readers)) == len(readers), (body, readers)
    finally:
        cluster.stop()
