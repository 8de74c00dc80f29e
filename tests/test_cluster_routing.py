"""Clients of a cluster send each request to the broker that leads its partition
(docs/design/cluster.md, step 5; docs/cluster.md, "Clients"): three real brokers and a
real ZooKeeper, shared by the module. A client bootstrapped from one broker's address (or
from a list whose first address is dead) creates a queue, sends keyed messages (sync and
asyncio, idempotent), and every read finds them where their leaders keep them; a leader
SIGKILLed, its partitions fail after the delivery timeout while the others go on (unkeyed
messages go to them only, and a consumer of every partition reads them, its polls quiet once
its table drops the dead broker); the CLI
takes a list; a broker running alone still gives the plain client. The last test kills a
broker: the tests before it share the cluster whole."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections import Counter

import msgspec
import pytest

import headwater
import headwater.aio
from headwater.client.aio.routing import AsyncRoutedService
from headwater.client.aio.service import AsyncService
from headwater.client.core.routing import RoutingTable
from headwater.client.transport.remote import RemoteService
from headwater.client.transport.routing import RoutedService
from headwater.errors import MessageNotFoundError, NotLeaderError, QueueNotFoundError, UnavailableError
from headwater.model.cluster import COORDINATOR_QUEUE, ClusterMetadata, coordinator_partition
from tests.support.broker_process import HEADWATER, BrokerProcess, free_port
from tests.support.cluster import Cluster, eventually

MESSAGES = 3000
KEYS = 97


def _dead_address() -> str:
    return f"127.0.0.1:{free_port()}"


def _leaders(cluster: Cluster, queue: str, via: int) -> dict[int, int]:
    with cluster.connect(via) as hw:
        return {p.partition: p.leader for p in hw.admin.cluster_metadata([queue]).queue(queue).partitions}


def _key(i: int) -> bytes:
    return f"user-{i % KEYS}".encode()


def _check_placement(cluster: Cluster, queue: str, ids: list[headwater.MessageId]) -> dict[int, int]:
    """Every id's partition holds exactly what was sent to it, on its leader (asked of the
    leader directly, by a client of that broker alone); the leaders agree from every broker."""
    leaders = _leaders(cluster, queue, via=1)
    assert Counter(leaders.values()) == {1: 2, 2: 2, 3: 2}
    for via in (2, 3):
        assert _leaders(cluster, queue, via=via) == leaders
    sent = Counter(mid.partition for mid in ids)
    for partition, leader in leaders.items():
        with cluster.connect(leader) as hw:
            on_leader = [r.message_id for r in hw.scanner(queue, partitions=[partition])]
        assert sorted(on_leader, key=lambda i: i.offset) == sorted(
            (i for i in ids if i.partition == partition), key=lambda i: i.offset
        )
        assert len(on_leader) == sent[partition]
    return leaders


def _check_reads(hw: headwater.Client, queue: str, ids: list[headwater.MessageId]) -> None:
    info = hw.admin.describe_queue(queue)
    assert sum(p.end_offset - p.start_offset for p in info.partitions) == len(ids)
    assert [(p.partition, p.end_offset) for p in info.partitions] == [
        (p, sum(1 for i in ids if i.partition == p)) for p in range(6)
    ]
    listed = next(q for q in hw.admin.list_queues() if q.name == queue)
    assert listed.partitions == info.partitions
    assert hw.service.describe_queue_async(queue).result(timeout=30) == info  # the producer's refresh
    c = hw.consumer()
    try:
        c.assign(queue, range(6))
        c.seek(queue, 0, 0)  # a seek the consumer must route too
        got: list[headwater.Record] = []
        deadline = time.monotonic() + 30
        while len(got) < len(ids) and time.monotonic() < deadline:
            got.extend(c.poll(timeout_ms=500))
        got.extend(c.poll(timeout_ms=200))  # nothing more comes: each exactly once
    finally:
        c.close()
    assert sorted(r.message_id for r in got) == sorted(ids)
    scanned = list(hw.scanner(queue))
    assert sorted(r.message_id for r in scanned) == sorted(ids)
    for mid in (ids[0], ids[len(ids) // 2], ids[-1]):
        assert hw.get(mid).message_id == mid
    by_key = [r for r in scanned if r.key == _key(5)]
    found = hw.find(queue, _key(5), limit=len(ids))
    assert [r.message_id for r in found] == [
        r.message_id for r in sorted(by_key, key=lambda r: (r.timestamp_ms, r.partition, r.offset))
    ]
    first = min(scanned, key=lambda r: r.timestamp_ms)
    assert hw.offset_for_time(queue, first.partition, first.timestamp_ms) <= first.offset
    assert hw.offset_for_time(queue, 0, 2**50) == info.partitions[0].end_offset


def test_a_client_bootstrapped_from_one_broker_sends_each_partition_to_its_leader(cluster):
    with headwater.connect(cluster.address(2)) as hw:
        service = hw.service
        assert isinstance(service, RoutedService)
        hw.admin.create_queue("routed", partitions=6)
        with hw.producer(idempotent=True, linger_ms=5, metadata_max_age_ms=20) as p:  # refreshed as it sends
            futures = [p.send("routed", f"m{i}".encode(), key=_key(i)) for i in range(MESSAGES)]
            p.flush()
        ids = [f.result(timeout=30) for f in futures]
        assert len(set(ids)) == MESSAGES
        # one key, one partition
        per_key = {(_key(i), mid.partition) for i, mid in enumerate(ids)}
        assert len(per_key) == KEYS
        one = hw.send("routed", b"and one more", key=_key(0))
        assert one.partition == ids[0].partition
        batch = hw.send_batch("routed", [b"b1", b"b2"], partition=3)
        assert [m.partition for m in batch] == [3, 3]
        ids += [one, *batch]
        _check_placement(cluster, "routed", ids)
        _check_reads(hw, "routed", ids)
        links = service.links()
        assert sorted(link.address for link in links) == sorted(cluster.address(i) for i in (1, 2, 3))
    assert all(link._closed for link in links)  # closing the client closed every connection


def test_the_asyncio_client_bootstrapped_past_a_dead_address_routes_too(cluster):
    async def main() -> list[headwater.MessageId]:
        hw = await headwater.aio.connect(f"{_dead_address()},{cluster.address(3)}")
        try:
            assert isinstance(hw.service, AsyncRoutedService)
            await hw.admin.create_queue("routed-aio", partitions=6)
            async with hw.producer(idempotent=True) as p:
                futures = [p.send_nowait("routed-aio", f"a{i}".encode(), key=_key(i)) for i in range(MESSAGES)]
                await p.flush()
            ids = [await f for f in futures]
            info = await hw.admin.describe_queue("routed-aio")
            assert sum(p.end_offset for p in info.partitions) == MESSAGES
            scanned = [r.message_id async for r in hw.scanner("routed-aio")]
            assert sorted(scanned) == sorted(ids)
            assert (await hw.get(ids[7])).message_id == ids[7]
            c = hw.consumer()
            await c.assign("routed-aio")
            got: list[headwater.Record] = []
            deadline = time.monotonic() + 30
            while len(got) < len(ids) and time.monotonic() < deadline:
                got.extend(await c.poll(timeout_ms=500))
            got.extend(await c.poll(timeout_ms=200))  # nothing more comes: each exactly once
            await c.close()
            assert sorted(r.message_id for r in got) == sorted(ids)
            return ids
        finally:
            await hw.close()

    ids = asyncio.run(main())
    _check_placement(cluster, "routed-aio", ids)
    with headwater.connect(f"{_dead_address()},{cluster.address(1)}") as hw:
        assert isinstance(hw.service, RoutedService)
        _check_reads(hw, "routed-aio", ids)


def _misrouted(md: ClusterMetadata, queue: str) -> ClusterMetadata:
    """``md`` with each partition of ``queue`` said to be led by the next broker: a table as
    stale as one from before a move of every partition."""
    ids = [b.broker_id for b in md.brokers]
    queues = [
        msgspec.structs.replace(
            q,
            partitions=[
                msgspec.structs.replace(p, leader=ids[(ids.index(p.leader) + 1) % len(ids)]) for p in q.partitions
            ],
        )
        if q.name == queue
        else q
        for q in md.queues
    ]
    return msgspec.structs.replace(md, queues=queues)


def _in_order_once(cluster: Cluster, queue: str, sent: dict[int, list[bytes]]) -> None:
    """Each partition holds what was sent to it, once each, in the order sent (asked of
    its leader directly)."""
    for partition, leader in _leaders(cluster, queue, via=1).items():
        with cluster.connect(leader) as hw:
            assert [r.body for r in hw.scanner(queue, partitions=[partition])] == sent.get(partition, [])


def test_a_stale_table_is_refused_refreshed_and_the_producer_sends_again_in_order(cluster):
    """Every partition's leader wrong in the client's table: the first batches are refused
    (NotLeaderError), the table is asked for again, and the producer's retries (sync and
    asyncio, idempotent, several batches in flight) land each message once, in order."""
    with headwater.connect(cluster.address(1)) as hw:
        service = hw.service
        assert isinstance(service, RoutedService)
        hw.admin.create_queue("stale", partitions=6)
        service.refresh()
        service._install(_misrouted(service.table.metadata, "stale"), time.monotonic())  # as stale as can be
        sent: dict[int, list[bytes]] = {}
        with hw.producer(idempotent=True, linger_ms=2, batch_bytes_max=2048) as p:
            futures = []
            for i in range(600):
                body = f"s{i:04}".encode()
                futures.append(p.send("stale", body, key=_key(i)))
            ids = [f.result(timeout=30) for f in futures]
        for i, mid in enumerate(ids):
            sent.setdefault(mid.partition, []).append(f"s{i:04}".encode())
        assert service.table.partition_leaders("stale") == _leaders(cluster, "stale", via=2)  # refused, so refreshed

    real = _leaders(cluster, "stale", via=3)
    with headwater.connect(cluster.address(3)) as hw:  # a consumer's reads refused: it reads on
        service = hw.service
        service._install(_misrouted(service.table.metadata, "stale"), time.monotonic())
        c = hw.consumer()
        c.assign("stale")
        got: list[headwater.Record] = []
        deadline = time.monotonic() + 30
        while len(got) < len(ids) and time.monotonic() < deadline:
            got.extend(c.poll(timeout_ms=500))
        c.close()
        assert sorted(r.message_id for r in got) == sorted(ids)
        assert service.table.partition_leaders("stale") == real

    async def main() -> list[headwater.MessageId]:
        hw = await headwater.aio.connect(cluster.address(2))
        try:
            service = hw.service
            await service.refresh()
            service._table = RoutingTable(_misrouted(service.table.metadata, "stale"))  # as stale as can be
            async with hw.producer(idempotent=True, linger_ms=2, batch_bytes_max=2048) as p:
                futures = [p.send_nowait("stale", f"a{i:04}".encode(), key=_key(i)) for i in range(600)]
                ids = [await f for f in futures]
            assert service.table.partition_leaders("stale") == real  # refused, so refreshed
            return ids
        finally:
            await hw.close()

    for i, mid in enumerate(asyncio.run(main())):
        sent.setdefault(mid.partition, []).append(f"a{i:04}".encode())
    _in_order_once(cluster, "stale", sent)


def test_a_bootstrap_list_of_dead_addresses_names_each(cluster):
    dead = [_dead_address(), _dead_address()]
    with pytest.raises(UnavailableError) as caught:
        headwater.connect(",".join(dead), connect_timeout_s=1)
    with pytest.raises(UnavailableError) as caught_aio:
        asyncio.run(headwater.aio.connect(",".join(dead), connect_timeout_s=1))
    for error in (caught.value, caught_aio.value):
        assert "cannot reach any broker" in str(error)
        for address in dead:
            assert address in str(error)


def test_unknown_queues_and_partitions_are_the_brokers_errors(cluster):
    with headwater.connect(cluster.address(1)) as hw:
        with pytest.raises(QueueNotFoundError):
            hw.send("no-such-queue", b"x")
        with pytest.raises(QueueNotFoundError):
            hw.admin.describe_queue("no-such-queue")
        # a queue made by another client is found on the first send (the table refreshed)
        with headwater.connect(cluster.address(3)) as other:
            other.admin.create_queue("made-elsewhere", partitions=3)
        ids = [hw.send("made-elsewhere", b"x", partition=p) for p in range(3)]
        assert [i.partition for i in ids] == [0, 1, 2]
        hw.admin.add_partitions("made-elsewhere", 5)
        assert hw.send("made-elsewhere", b"y", partition=4).partition == 4


def test_a_delayed_message_is_kept_and_cancelled_by_its_partitions_leader(cluster):
    with headwater.connect(cluster.address(1)) as hw:
        hw.admin.create_queue("later", partitions=6)
        leaders = _leaders(cluster, "later", via=1)
        p = next(q for q, b in leaders.items() if b != 1)  # led by a broker other than the bootstrap
        cancelled = hw.send("later", b"never", partition=p, delay=60)
        assert hw.get(cancelled).body == b"never"
        hw.cancel(cancelled)
        with pytest.raises(MessageNotFoundError):
            hw.get(cancelled)
        hw.send("later", b"soon", partition=p, delay=0.2)
        delivered = eventually(lambda: [r.body for r in hw.scanner("later", partitions=[p])], what="the delivery")
        assert delivered == [b"soon"]


def test_a_group_consumer_is_coordinated_by_its_coordinator_and_reads_every_leader(cluster):
    """The group's calls go to its coordinator (METADATA's ``coordinators``), whichever
    broker the client bootstrapped from; its reads go to each partition's leader."""
    with headwater.connect(cluster.address(2)) as hw:
        hw.admin.create_queue("grouped", partitions=6)
        ids = list(hw.send_batch("grouped", [b"g%d" % i for i in range(120)]))
        ids += [hw.send("grouped", b"to %d" % p, partition=p) for p in range(6)]
        c = hw.consumer(group="readers", subscribe="grouped", commit_on_revoke=False)
        got: list[headwater.Record] = []
        deadline = time.monotonic() + 30
        while len(got) < len(ids) and time.monotonic() < deadline:
            got.extend(c.poll(timeout_ms=500))
        assert sorted(r.message_id for r in got) == sorted(ids)
        coordinator = hw.admin.cluster_metadata().coordinator("readers")
        assert coordinator in (1, 2, 3)
        with cluster.connect(coordinator) as home:  # the coordinator holds the group
            assert home.service.describe_group("readers").members[0].assignment == {"grouped": list(range(6))}
        c.close(commit=False)


def test_a_refusal_is_not_sent_again_to_the_broker_that_refused_it(cluster):
    """A read is sent again after a lost connection (its Resend is SAFE), but a
    NotLeaderError is the broker's answer: asking it again would be refused again."""
    leaders = _leaders(cluster, "routed", via=1)
    partition = next(p for p, b in leaders.items() if b != 1)
    with cluster.connect(1) as hw:  # broker 1 alone, no routing
        before = hw.status()["requests_total"]
        with pytest.raises(NotLeaderError, match=f"broker {leaders[partition]}"):
            hw.service.fetch("routed", partition, 0, max_bytes=1024)
        assert hw.status()["requests_total"] - before == 2  # the fetch once, and this status


def test_the_cli_takes_a_list_of_brokers(cluster):
    servers = f"{_dead_address()},{cluster.address(1)},{cluster.address(2)},{cluster.address(3)}"

    def cli(*args: str) -> str:
        done = subprocess.run([HEADWATER, "--server", servers, *args], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout

    cli("queue", "create", "cli-routed", "--partitions", "6")
    for p in range(6):
        cli("produce", "cli-routed", f"to {p}", "--partition", str(p))
    info = json.loads(cli("queue", "describe", "cli-routed", "--json"))
    assert [p["end_offset"] for p in info["partitions"]] == [1] * 6
    scanned = cli("scan", "cli-routed")
    for p in range(6):
        assert f"to {p}" in scanned


def test_a_broker_alone_gives_the_plain_client(tmp_path):
    broker = BrokerProcess(tmp_path / "alone").start()
    try:
        for bootstrap in (broker.address, f"{_dead_address()},{broker.address}"):
            with headwater.connect(bootstrap) as hw:
                assert type(hw.service) is RemoteService
                hw.admin.create_queue("q", partitions=2, exist_ok=True)
                assert hw.send("q", b"x", partition=1).partition == 1

        async def main() -> None:
            hw = await headwater.aio.connect(broker.address)
            try:
                assert type(hw.service) is AsyncService
            finally:
                await hw.close()

        asyncio.run(main())
    finally:
        broker.terminate()


def _group_coordinated_by(cluster: Cluster, hw: headwater.Client, brokers: set[int]) -> str:
    """A group name whose coordinator is one of ``brokers`` now."""
    md = hw.admin.cluster_metadata([COORDINATOR_QUEUE])
    leaders = {p.partition: p.leader for p in md.queue(COORDINATOR_QUEUE).partitions}
    return next(
        g for g in (f"readers-{i}" for i in range(1000)) if leaders[coordinator_partition(g, len(leaders))] in brokers
    )


def test_a_leader_killed_its_partitions_fail_after_the_delivery_timeout_the_others_go_on(cluster):
    """Last: it kills a broker of the module's cluster. With one copy of each partition
    nobody takes a dead broker's partitions over: sends to them fail once the delivery
    timeout has passed (not before: the producer keeps trying), the rest go on. Describing
    the queue says which partitions are offline (not empty), and a consumer assigned one
    keeps its group's committed position instead of starting over."""
    with headwater.connect(cluster.address(1), connect_timeout_s=1) as hw:
        hw.admin.create_queue("victim", partitions=6)
        leaders = _leaders(cluster, "victim", via=1)
        group = _group_coordinated_by(cluster, hw, {1, 2})
        timeout_ms = 3000
        with hw.producer(idempotent=True, delivery_timeout_ms=timeout_ms, retries=10**6, retry_backoff_ms=50) as p:
            assert all(p.send_and_wait("victim", b"before", partition=q).partition == q for q in range(6))
            hw.service.commit_offsets(group, "victim", dict.fromkeys(range(6), 1))
            orphan = headwater.connect(cluster.address(3), connect_timeout_s=1)  # bootstrapped from the victim
            orphan_producer = orphan.producer(delivery_timeout_ms=timeout_ms, retries=10**6, retry_backoff_ms=50)
            assert orphan_producer.send_and_wait("victim", b"orphan", partition=0).partition == 0
            hw.admin.create_queue("anywhere", partitions=6)
            spread = hw.producer(delivery_timeout_ms=timeout_ms, retries=10**6, retry_backoff_ms=50)
            spread.send_and_wait("anywhere", b"before")  # its copy of the metadata: all online
            watching = headwater.connect(cluster.address(1), connect_timeout_s=1)  # nothing else on it
            watcher = watching.consumer(auto_offset_reset="latest")  # every partition of the queue
            watcher.assign("anywhere")
            watcher.poll(timeout_ms=200)
            cluster.brokers[3].kill()
            _polls_through_the_kill_settle(watcher)
            dead = [q for q, b in leaders.items() if b == 3]
            alive = [q for q, b in leaders.items() if b != 3]
            stored = _unkeyed_sends_go_to_the_live_partitions(cluster, hw, spread, timeout_ms)
            _a_consumer_of_every_partition_reads_the_live_ones(watcher, stored)
            watching.close()
            for q in dead:
                started = time.monotonic()
                with pytest.raises(UnavailableError, match=rf"victim\[{q}\]|{cluster.address(3)}") as caught:
                    p.send_and_wait("victim", b"after", partition=q)
                assert "delivery_timeout_ms" in str(caught.value)
                assert time.monotonic() - started >= timeout_ms / 1000 / 2  # the producer kept trying
            sent = {q: p.send("victim", b"sent", partition=q) for q in range(6)}  # the pipelined path
            for q in alive:
                assert p.send_and_wait("victim", b"after", partition=q).partition == q
                assert sent[q].result(timeout=30).partition == q
            for q in dead:
                with pytest.raises(UnavailableError, match=rf"victim\[{q}\]|{cluster.address(3)}"):
                    sent[q].result(timeout=30)
            # a client whose bootstrap broker died asks the live ones where things are
            with pytest.raises(UnavailableError):
                orphan_producer.send_and_wait("victim", b"lost", partition=dead[0])
            eventually(  # asked of a live broker: the bootstrap one is gone
                lambda: orphan.service.refresh().leaders_of("victim").keys() <= {1, 2}, what="a refresh"
            )
            eventually(lambda: [b.broker_id for b in orphan.admin.cluster_metadata().brokers] == [1, 2])
            for q in alive:
                assert orphan_producer.send_and_wait("victim", b"orphan", partition=q).partition == q
            orphan.close()
        info = eventually(lambda: _describe_alive(hw), what="a describe")
        assert [info.partitions[q].end_offset for q in alive] == [4 + (q == 0) for q in alive]
        # the dead leader's partitions are offline, not empty (the code before said 0..0)
        assert info.offline == dead
        assert all(info.partitions[q].online for q in alive)
        assert info.message_count == sum(4 + (q == 0) for q in alive)
        listed = next(q for q in hw.admin.list_queues() if q.name == "victim")
        assert listed.offline == dead
        shown = subprocess.run(
            [HEADWATER, "--server", cluster.address(1), "queue", "describe", "victim"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert shown.returncode == 0, shown.stderr
        assert "offline" in shown.stdout
        # a reset of the group to latest would have committed 0 there (its end, as described)
        reset = subprocess.run(
            [HEADWATER, "--server", cluster.address(1), "group", "reset", group, "--queue", "victim", "--to", "latest"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert reset.returncode != 0 and "down or out of reach" in reset.stderr, reset.stderr
        # a consumer assigned a dead partition keeps the group's position there (before: it
        # took the position past the "end" 0 and started over from 0, warning of a new queue)
        c = hw.consumer(group=group, auto_offset_reset="latest")
        try:
            c.assign("victim", dead)
            assert [c.position("victim", q) for q in dead] == [1] * len(dead)
            with pytest.raises(UnavailableError, match=rf"victim\[{dead[0]}"):
                c.seek_to_end("victim", dead[0])
        finally:
            c.close()


def _unkeyed_sends_go_to_the_live_partitions(
    cluster: Cluster, hw: headwater.Client, spread, timeout_ms: int
) -> set[headwater.MessageId]:
    """Messages with neither key nor partition go to partitions whose leader lives (Kafka's
    partitioner takes the available partitions): a producer that sent before the kill fails
    at most one send per dead partition, each found out of reach once; producers started
    after it (sync and asyncio) never try them."""
    leaders = _leaders(cluster, "anywhere", via=1)
    dead = {q for q, b in leaders.items() if b == 3}
    alive = {q for q, b in leaders.items() if b != 3}
    assert dead and alive
    went: list[int | None] = []
    stored: set[headwater.MessageId] = set()
    for _ in range(40):
        try:
            stored.add(mid := spread.send_and_wait("anywhere", b"unkeyed"))
            went.append(mid.partition)
        except UnavailableError as e:
            assert "delivery_timeout_ms" in str(e)
            went.append(None)
    assert went.count(None) <= len(dead), went
    assert set(went) - {None} == alive, went  # every live partition, and only those
    spread.close()
    with hw.producer(delivery_timeout_ms=timeout_ms) as fresh:
        assert {fresh.send_and_wait("anywhere", b"unkeyed").partition for _ in range(30)} == alive
        assert {
            f.result(timeout=30).partition for f in [fresh.send("anywhere", b"unkeyed") for _ in range(30)]
        } <= alive

    async def asyncio_producer() -> set[int]:
        ahw = await headwater.aio.connect(cluster.address(1))
        try:
            async with ahw.producer(delivery_timeout_ms=timeout_ms) as ap:
                return {(await ap.send("anywhere", b"unkeyed")).partition for _ in range(30)}
        finally:
            await ahw.close()

    assert asyncio.run(asyncio_producer()) == alive
    return stored


def _polls_through_the_kill_settle(watcher) -> None:
    """A consumer assigned every partition, polling from the kill on: its polls may raise
    UnavailableError while the dead broker is still registered, then its client's table
    drops the broker and the dead partitions wait for a leader (the code before kept the
    table it had and raised every connect_timeout_s, for good)."""
    errors: list[float] = []
    started = time.monotonic()
    while time.monotonic() - started < 20 and time.monotonic() - (errors[-1] if errors else started) < 5:
        try:
            watcher.poll(timeout_ms=200)
        except UnavailableError:
            errors.append(time.monotonic())
    assert time.monotonic() - (errors[-1] if errors else started) >= 5, f"polls still fail: {len(errors)} errors"


def _a_consumer_of_every_partition_reads_the_live_ones(watcher, stored) -> None:
    """That consumer then reads every message the live partitions stored, its polls quiet."""
    got: set[headwater.MessageId] = set()
    deadline = time.monotonic() + 30
    while not stored <= got and time.monotonic() < deadline:
        got.update(r.message_id for r in watcher.poll(timeout_ms=200))
    assert stored <= got, f"{len(stored - got)} of {len(stored)} stored messages not read"
    watcher.close()


def _describe_alive(hw: headwater.Client):
    try:
        return hw.admin.describe_queue("victim")
    except UnavailableError:
        return None
