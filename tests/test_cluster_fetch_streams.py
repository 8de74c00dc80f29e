"""Fetch streams on a cluster (docs/design/cluster.md, "Clients"): three real brokers and a
real ZooKeeper. A member streams only the partitions it leads: it refuses a stream naming
another with NotLeaderError (naming the leader, as it refuses a FETCH), and ends a stream
whose partition moved away, so its client streams from the new leader."""

from __future__ import annotations

import concurrent.futures

import pytest

import headwater
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


def _read_until(svc: RemoteService, cond, what: str):
    """``cond()`` once true, while this thread reads the connection (a fetch stream's pushes
    are read by the thread that waits on it)."""
    never: concurrent.futures.Future = concurrent.futures.Future()
    return eventually(lambda: (svc.lead([never], 0.02), cond())[1], what=what)


def test_a_member_streams_only_what_it_leads_and_ends_a_stream_moved_away(cluster):
    """A raw stream (no routing) naming a partition another broker leads is refused with
    NotLeaderError naming the leader; one over the partitions it leads pushes them; once
    those move away (a decommission) the stream ends with NotLeaderError."""
    queue = "raw-fetch-streams"
    with headwater.connect(_bootstrap(cluster)) as hw:
        hw.admin.create_queue(queue, partitions=PARTITIONS)
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
            hw.admin.rebalance()  # the broker leads again for the tests after this one
