"""The durability of consumer-group commits (the store's ``offsets_flush``): ``async``
answers before the fsync and survives a SIGKILLed broker (the page cache outlives the
process); ``sync`` answers after the fsync that covers the commit. Counted with the store's
fsyncs, never timed."""

from __future__ import annotations

import pytest

import headwater
from headwater import StoreConfig
from headwater.broker.broker import Broker
from headwater.broker.offsets import OffsetStore
from headwater.errors import InvalidArgumentError
from headwater.model.batch import encode_batch
from headwater.model.cluster import COORDINATOR_QUEUE
from headwater.model.config import QueueConfig
from headwater.model.message import Message
from headwater.storage.store import LogStore
from tests.support.broker_process import BrokerProcess
from tests.support.coordinator_node import PARTITIONS, FakeNode, group_of

NO_TICK_MS = 3_600_000  # the background fsync never runs during a test


def _fsyncs(broker: Broker) -> int:
    return broker.store.stats()["fsyncs"]


def _broker(tmp_path, offsets_flush: str) -> Broker:
    broker = Broker.open(tmp_path / "data", StoreConfig(flush_interval_ms=NO_TICK_MS, offsets_flush=offsets_flush))
    broker.create_queue("jobs", QueueConfig(partitions=2))
    broker.produce("jobs", 0, encode_batch([Message(b"x")] * 10))
    return broker


def test_async_commits_are_answered_without_an_fsync(tmp_path):
    broker = _broker(tmp_path, "async")
    try:
        assert broker.offsets.flush == "async"
        before = _fsyncs(broker)
        for off in range(1, 6):
            broker.commit_offsets("g", "jobs", {0: off})
        assert _fsyncs(broker) == before  # none waited for, and the flusher did not tick
        assert broker.fetch_offsets("g", "jobs") == {0: 5}
    finally:
        broker.close()


def test_sync_commits_are_answered_after_their_fsync(tmp_path):
    broker = _broker(tmp_path, "sync")
    try:
        assert broker.offsets.flush == "sync"
        for off in range(1, 6):
            before = _fsyncs(broker)
            broker.commit_offsets("g", "jobs", {0: off})
            assert _fsyncs(broker) == before + 1  # the commit's own fsync, done before the answer
    finally:
        broker.close()


@pytest.mark.parametrize("offsets_flush", ["async", "sync"])
def test_a_cluster_coordinator_follows_offsets_flush(tmp_path, offsets_flush):
    """The coordinator queue's commits (a broker of a cluster) obey the same setting."""
    store = LogStore(tmp_path / "data", StoreConfig(flush_interval_ms=NO_TICK_MS, offsets_flush=offsets_flush))
    try:
        offsets = OffsetStore(store)
        node = FakeNode()
        offsets.join_cluster(node)
        config = QueueConfig(partitions=PARTITIONS, ttl_s=None, flush="sync")  # as the cluster node makes it
        store.create_queue(COORDINATOR_QUEUE, config, internal=True)
        store.create_queue("orders", QueueConfig(partitions=1))
        node.leading.add(1)
        offsets.load(1)
        group = group_of(1)
        before = store.stats()["fsyncs"]
        offsets.commit(group, "orders", {0: 0})
        assert store.stats()["fsyncs"] == before + (offsets_flush == "sync")
        assert offsets.fetch(group, "orders") == {0: 0}
    finally:
        store.close()


def test_offsets_flush_is_checked():
    with pytest.raises(InvalidArgumentError, match="offsets_flush must be 'sync' or 'async'"):
        StoreConfig(offsets_flush="always").validated()


def test_async_commits_survive_a_sigkilled_broker(tmp_path):
    data = tmp_path / "data"
    # no background fsync: what survives the kill is what the page cache held
    args = ("--set", f"flush_interval_ms={NO_TICK_MS}", "--set", "offsets_flush=async")
    broker = BrokerProcess(data, *args).start()
    try:
        with headwater.connect(broker.address) as hw:
            hw.admin.create_queue("jobs", partitions=2)
            hw.send_batch("jobs", [b"a", b"b", b"c"], partition=1)
            with hw.consumer(group="g") as c:
                c.assign("jobs")
                got = []
                while len(got) < 3:
                    got += c.poll(timeout_ms=10_000)
                c.commit()
            hw.service.commit_offsets("other", "jobs", {0: 0, 1: 2})
        broker.kill()  # SIGKILL: no flush, no clean close
        broker = BrokerProcess(data, *args, port=broker.port).start()
        with headwater.connect(broker.address) as hw:
            assert hw.service.fetch_offsets("g", "jobs") == {0: 0, 1: 3}
            assert hw.service.fetch_offsets("other", "jobs") == {0: 0, 1: 2}
    finally:
        broker.kill()


def test_which_commits_a_server_may_answer_on_its_loop(tmp_path):
    """answers_at_once: only what waits for nothing (no fsync, no compaction, no cluster)."""
    store = LogStore(tmp_path / "data", StoreConfig(flush_interval_ms=NO_TICK_MS))
    try:
        offsets = OffsetStore(store, compact_min=4, compact_ratio=2)
        store.create_queue("orders", QueueConfig(partitions=8))
        assert offsets.answers_at_once(1)
        offsets.commit("g", "orders", {0: 0, 1: 0, 2: 0})
        assert offsets.answers_at_once(3)  # 6 records in the log: no compaction yet
        assert not offsets.answers_at_once(4)  # 7 > max(4, 2 x 3 keys): it may compact
        with offsets._lock:  # another commit under way (maybe compacting): not on the loop
            assert not offsets.answers_at_once(1)
        node = FakeNode()
        offsets.join_cluster(node)
        assert not offsets.answers_at_once(1)  # a coordinator of a cluster may wait for a fence
    finally:
        store.close()
    sync = LogStore(tmp_path / "sync", StoreConfig(offsets_flush="sync"))
    try:
        assert not OffsetStore(sync).answers_at_once(1)
    finally:
        sync.close()
