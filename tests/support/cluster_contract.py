"""The contract tests on a cluster: the ``hw`` fixture's fourth way (``cluster``), a client of
three ``headwater serve --zookeeper`` processes on loopback, routed by the bootstrap list.

One cluster serves the whole run (starting three brokers takes seconds; the contract tests
are hundreds): each test gets it with no queues, and deletes what it made when it ends. The
brokers are processes on the wall clock, so a test that moves the broker's clock
(``clock.advance``) is skipped there: :class:`WallClock` says so."""

from __future__ import annotations

import time

import pytest

import headwater
from tests.support.cluster import Cluster, eventually

__all__ = ["WallClock", "cluster_client", "empty_cluster"]

BROKERS = 3
MEMBERS_GONE_S = 40.0  # longer than any session timeout a contract test sets


class WallClock:
    """The ``clock`` fixture of a test on the cluster: the brokers' own (wall) time, which a
    test cannot move."""

    @property
    def now(self) -> float:
        return time.time()

    def __call__(self) -> float:
        return time.time()

    def advance(self, seconds: float) -> None:
        pytest.skip("the test moves the broker's clock; a cluster's brokers are processes on the wall clock")


def empty_cluster(cluster: Cluster) -> None:
    """Delete every queue of the cluster (a test's leftovers), and wait until each broker's
    view has none and no group has members left (a member a test left behind leaves at its
    session's end), so the next test may use the same names."""
    with headwater.connect(",".join(cluster.address(i) for i in sorted(cluster.brokers))) as hw:
        for q in hw.admin.list_queues():
            try:
                hw.admin.delete_queue(q.name)
            except headwater.QueueNotFoundError:
                pass
        eventually(
            lambda: not [g for g in hw.service.list_groups() if g.members],
            timeout_s=MEMBERS_GONE_S,
            what="every group's members gone",
        )

    def none_left() -> bool:
        for i in sorted(cluster.brokers):
            with cluster.connect(i) as one:
                if one.admin.cluster_metadata().queues:
                    return False
        return True

    eventually(none_left, what="every broker's view of the cluster without queues")


def cluster_client(cluster: Cluster) -> headwater.Client:
    """A client of the cluster, every broker in its bootstrap list."""
    return headwater.connect(",".join(cluster.address(i) for i in sorted(cluster.brokers)))
