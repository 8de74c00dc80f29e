"""Fetch streams on a cluster (docs/design/cluster.md, "Clients"): three real brokers and a
real ZooKeeper. A member streams only the partitions it leads: it refuses a stream naming
another with NotLeaderError (naming the leader, as it refuses a FETCH), and ends a stream
whose partition moved away, so its client streams from the new leader.

The module's cluster loses a broker to each decommission (a decommissioned broker leads
nothing after): the two tests that move partitions come last, read queues made before
either (``moving_queues``), and ask who leads."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections import defaultdict

import pytest

import headwater
import headwater.aio
from headwater.client.transport.remote import RemoteService
from headwater.errors import NotLeaderError
from tests.support.cluster import Cluster, eventually

PARTITIONS = 6


def _bootstrap(cluster: Cluster) -> str:
    return ",".join(cluster.address(i) for i in sorted(cluster.brokers))


def _leaders(hw: headwater.Client, queue: str) -> dict[int, list[int]]:
    """broker id -> the partitions of ``queue`` it leads, by the cluster's metadata."""
    out: dict[int, list[int]] = {}
    for p in hw.admin.cluster_metadata([queue]).queue(queue).partitions:
        out.setdefault(p.leader, []).append(p.partition)
    return out


@pytest.fixture(scope="module")
def moving_queues(cluster):
    """The queues of the tests that decommission brokers, made first: a queue made after a
    decommission is placed on the brokers left, not spread over three."""
    names = ("raw-fetch-streams", "streamed-moving")
    with headwater.connect(_bootstrap(cluster)) as hw:
        for name in names:
            hw.admin.create_queue(name, partitions=PARTITIONS)
    return names


def _read_until(svc: RemoteService, cond, what: str):
    """``cond()`` once true, while this thread reads the connection (a fetch stream's pushes
    are read by the thread that waits on it)."""
    never: concurrent.futures.Future = concurrent.futures.Future()
    return eventually(lambda: (svc.lead([never], 0.02), cond())[1], what=what)


def _send(hw: headwater.Client, queue: str, count: int, first: int = 0) -> int:
    """``count`` messages spread over every partition, bodies ``seq``."""
    msgs = [headwater.Message(b"%d" % i, key=b"k%d" % (i % 60)) for i in range(first, first + count)]
    for i in range(0, len(msgs), 100):
        hw.send_batch(queue, msgs[i : i + 100])
    return count


class Read:
    """What a consumer's polls returned, per partition."""

    def __init__(self) -> None:
        self.by_partition: dict[int, list[int]] = defaultdict(list)

    def add(self, records) -> None:
        for r in records:
            self.by_partition[r.partition].append(r.offset)

    def total(self) -> int:
        return sum(len(v) for v in self.by_partition.values())

    def check_once_in_order(self, sent: int) -> None:
        for p, offs in self.by_partition.items():
            assert offs == list(range(offs[0], offs[0] + len(offs))), f"partition {p}: a gap, a repeat or disorder"
            assert offs[0] == 0, f"partition {p} did not start at 0"
        assert self.total() == sent


def _poll_until(consumer, read: Read, count: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while read.total() < count and time.monotonic() < deadline:
        read.add(consumer.poll(500, timeout_ms=200))
    assert read.total() >= count, (read.total(), count)


def test_a_consumer_streams_from_each_leader_in_order(cluster):
    """A consumer of a 6-partition queue on 3 brokers opens one fetch stream per leader, each
    carrying the partitions that broker leads, and gets every record once, in order."""
    queue = "streamed"
    with headwater.connect(_bootstrap(cluster)) as hw:
        hw.admin.create_queue(queue, partitions=PARTITIONS)
        sent = _send(hw, queue, 600)
        leaders = _leaders(hw, queue)
        assert len(leaders) == 3
        with hw.consumer() as consumer:
            consumer.assign(queue)
            read = Read()
            _poll_until(consumer, read, sent)
            assert consumer.streams == {queue: leaders}
            more = _send(hw, queue, 120, first=sent)  # pushed as appended
            _poll_until(consumer, read, sent + more)
            assert consumer.poll(timeout_ms=100) == []
            read.check_once_in_order(sent + more)
        with hw.consumer(stream=False) as fetching:  # stream=False still fetches
            fetching.assign(queue)
            again = Read()
            _poll_until(fetching, again, sent + more)
            assert fetching.streams == {}
            again.check_once_in_order(sent + more)


def test_an_asyncio_consumer_streams_from_each_leader_in_order(cluster):
    """The asyncio consumer on a cluster streams from each leader too (its connections to
    the other brokers are opened in the background while its first polls go on)."""
    queue = "streamed-aio"
    with headwater.connect(_bootstrap(cluster)) as hw:
        hw.admin.create_queue(queue, partitions=PARTITIONS)
        sent = _send(hw, queue, 600)
        leaders = _leaders(hw, queue)

        async def read_all() -> tuple[Read, dict]:
            async with await headwater.aio.connect(_bootstrap(cluster)) as ahw:
                consumer = ahw.consumer()
                await consumer.assign(queue)
                read = Read()
                deadline = time.monotonic() + 30
                while read.total() < sent and time.monotonic() < deadline:
                    read.add(await consumer.poll(500, timeout_ms=200))
                streams = consumer.streams
                more = _send(hw, queue, 120, first=sent)  # pushed as appended
                while read.total() < sent + more and time.monotonic() < deadline:
                    read.add(await consumer.poll(500, timeout_ms=200))
                assert await consumer.poll(timeout_ms=100) == []
                return read, streams

        read, streams = asyncio.run(read_all())
        assert streams == {queue: leaders}
        read.check_once_in_order(sent + 120)


def test_a_group_consumer_streams_from_each_leader(cluster):
    """A group member streams too, and commits what it read."""
    queue, group = "streamed-group", "readers"
    with headwater.connect(_bootstrap(cluster)) as hw:
        hw.admin.create_queue(queue, partitions=PARTITIONS)
        sent = _send(hw, queue, 300)
        with hw.consumer(group=group, subscribe=queue) as member:
            read = Read()
            _poll_until(member, read, sent)
            assert member.streams == {queue: _leaders(hw, queue)}
            read.check_once_in_order(sent)
            member.commit()
            assert sum(member.committed(queue, p) for p in range(PARTITIONS)) == sent


def test_a_member_streams_only_what_it_leads_and_ends_a_stream_moved_away(cluster, moving_queues):
    """A raw stream (no routing) naming a partition another broker leads is refused with
    NotLeaderError naming the leader; one over the partitions it leads pushes them; once
    those move away (a decommission) the stream ends with NotLeaderError."""
    queue = moving_queues[0]
    with headwater.connect(_bootstrap(cluster)) as hw:
        leaders = _leaders(hw, queue)
        broker = min(leaders)
        mine = leaders[broker]
        theirs = next(p for b, ps in leaders.items() if b != broker for p in ps)
        for p in range(PARTITIONS):
            hw.send(queue, b"%d" % p, partition=p)
        svc = RemoteService(cluster.address(broker))
        try:
            _, refused = svc.open_fetch_stream(queue, {theirs: 0}, lambda push: None, credit_bytes=1 << 20)
            with pytest.raises(NotLeaderError, match=f"does not lead {queue}\\[{theirs}\\]"):
                refused.result(10)

            pushed: list = []
            sid, opened = svc.open_fetch_stream(queue, {p: 0 for p in mine}, pushed.append, credit_bytes=1 << 20)
            assert opened.result(10) is None
            _read_until(
                svc,
                lambda: {x.partition for x in pushed if x is not None and x.batches} == set(mine),
                what="a push of each partition led here",
            )
            assert all(x.partition in mine for x in pushed if x is not None and not x.ended)

            hw.admin.decommission(broker)  # its partitions go to the others
            [last] = _read_until(
                svc, lambda: [x for x in pushed if x is not None and x.ended], what="the stream ending"
            )
            assert last.stream_id == sid and last.ended_code == NotLeaderError.code, last
            assert f"does not lead {queue}[" in last.ended
            eventually(
                lambda: not hw.admin.cluster_metadata([]).moves and broker not in _leaders(hw, queue),
                timeout_s=90,
                what="the moves finishing",
            )
        finally:
            svc.close()


class AsyncReader(threading.Thread):
    """An asyncio consumer of ``queue`` on its own event loop, polling until ``stop`` is set
    and then until it has ``want()`` records: what it read and its streams at the end. Set
    ``stop`` once the senders are done, so that ``want()`` counts every record sent."""

    def __init__(self, bootstrap: str, queue: str, stop: threading.Event, want) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.queue, self.stop, self.want = bootstrap, queue, stop, want
        self.read = Read()
        self.streams: dict = {}
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            asyncio.run(self._read())
        except BaseException as e:  # noqa: BLE001 - the test raises it
            self.error = e

    async def _read(self) -> None:
        async with await headwater.aio.connect(self.bootstrap) as hw:
            consumer = hw.consumer()
            await consumer.assign(self.queue)
            deadline = time.monotonic() + 180
            while (not self.stop.is_set() or self.read.total() < self.want()) and time.monotonic() < deadline:
                self.read.add(await consumer.poll(500, timeout_ms=100))
            self.streams = consumer.streams


def test_a_consumer_follows_partitions_moved_while_it_reads(cluster, moving_queues):
    """A decommission moves a broker's partitions while a producer sends and two consumers
    stream, a blocking one and an asyncio one: their streams follow the leaders, nothing is
    lost, nothing comes twice."""
    queue = moving_queues[1]
    with headwater.connect(_bootstrap(cluster)) as hw:
        sent = [_send(hw, queue, 120)]
        stop_sending, sent_all = threading.Event(), threading.Event()
        # the reader stops once every send is counted: a batch in flight when sending stops
        # adds to sent[0] after it (24 records missed, once, when it stopped on stop_sending)
        aio_reader = AsyncReader(_bootstrap(cluster), queue, sent_all, lambda: sent[0])
        aio_reader.start()

        def send() -> None:
            while not stop_sending.is_set():
                sent[0] += _send(hw, queue, 30, first=sent[0])
                time.sleep(0.02)

        # the consumer's own client: no producer's refusal refreshes its table, its streams'
        # ends (NotLeaderError) do
        with headwater.connect(_bootstrap(cluster)) as reader, reader.consumer() as consumer:
            consumer.assign(queue)
            read = Read()
            sender = threading.Thread(target=send, daemon=True)
            sender.start()
            try:
                _poll_until(consumer, read, 200)
                assert len(_leaders(hw, queue)) >= 2, _leaders(hw, queue)
                leaving = min(_leaders(hw, queue))
                hw.admin.decommission(leaving)
                deadline = time.monotonic() + 90
                while time.monotonic() < deadline:
                    read.add(consumer.poll(500, timeout_ms=200))
                    if not hw.admin.cluster_metadata([]).moves and leaving not in _leaders(hw, queue):
                        break
                leaders = _leaders(hw, queue)
                assert leaving not in leaders
                count = sent[0]
                while sent[0] < count + 200:
                    read.add(consumer.poll(500, timeout_ms=100))
            finally:
                stop_sending.set()
                sender.join(60)
                sent_all.set()
            _poll_until(consumer, read, sent[0], timeout_s=60)
            eventually(lambda: (read.add(consumer.poll(timeout_ms=100)), consumer.streams == {queue: leaders})[1])
            read.check_once_in_order(sent[0])
            aio_reader.join(120)
            assert aio_reader.error is None, aio_reader.error
            aio_reader.read.check_once_in_order(sent[0])
            assert aio_reader.streams == {queue: leaders}
