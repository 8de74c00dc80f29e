"""Broker: the :class:`~headwater.model.service.BrokerService` over one store.

Embedded mode is this object used in-process (``headwater.open``); the network server puts
the same object behind a socket (``headwater.broker.server``); the test fake
(``headwater.testing.open_memory``) is this object over a
:class:`~headwater.storage.memory.MemoryStore`. Consumer offsets, groups,
delay and transactions compose here, above storage, so the store stays a log engine.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from headwater._version import __version__
from headwater.broker.append_waiters import AppendWaiters
from headwater.broker.delay import DelayService, DelayTicket
from headwater.broker.delay.handoff import HOLD_ALL
from headwater.broker.groups import GroupCoordinator
from headwater.broker.keyed import KeyedGroups
from headwater.broker.offsets import OffsetStore
from headwater.broker.shared import SharedGroups
from headwater.broker.subscriptions import SubscriberRegistry
from headwater.errors import InvalidArgumentError, MessageNotFoundError, UsageError
from headwater.model.cluster import (
    ALONE,
    CLUSTER_INTERNAL_QUEUES,
    BrokerAddress,
    ClusterMetadata,
    PartitionLocation,
    PartitionMove,
    QueueLocations,
)
from headwater.model.config import (
    INTERNAL_PREFIX,
    LIST_PAGE_PARTITIONS,
    QueueConfig,
    QueueInfo,
    QueuePage,
    check_user_queue,
    is_internal_queue,
)
from headwater.model.delay import DELAYED_PARTITION_BIT, DelayStats, HandoffPage, peek_deliver_at
from headwater.model.filtering import TagMaskFilter, filter_batches
from headwater.model.groups import GroupAssignment, GroupDescription, GroupSummary
from headwater.model.keyed import KeyedFetchResult, KeyedGroupInfo
from headwater.model.service import FetchResult, MetricsExposition, ProduceResult
from headwater.model.shared import LeaseRefusal, SharedDeliveries, SharedGroupInfo
from headwater.model.subscription import SubscriberInfo
from headwater.storage.api import Store
from headwater.storage.memory import EmptyDirectoryStore
from headwater.storage.store import LogStore, StoreConfig

if TYPE_CHECKING:
    from headwater.broker.delay_moves import DelayedMoves
    from headwater.broker.metrics import BrokerMetrics

#: Why a broker answers METRICS with an error until :meth:`Broker.enable_metrics` is called.
METRICS_NOT_SERVED = (
    "this broker keeps no metrics: they are kept by a broker server (headwater serve), or by an embedded "
    "broker after broker.enable_metrics()"
)

__all__ = ["Broker"]

#: what a broker started with ``--zookeeper`` answers until it has joined its cluster
JOINING = (
    "this broker is joining its cluster and serves nothing until it has (it cannot tell yet "
    "which partitions it leads): ask another broker of the cluster, or this one again in a moment"
)


class ClusterRole(Protocol):
    """What a broker in a cluster asks of its part in it (:mod:`headwater.broker.cluster_node`)."""

    def check_leader(self, queue: str, partition: int) -> None: ...
    def leads(self, queue: str, partition: int) -> bool: ...
    def leader_address(self, queue: str, partition: int) -> str | None: ...
    def producing(self, queue: str, partition: int) -> AbstractContextManager[None]: ...
    def create_queue(self, name: str, config: QueueConfig) -> QueueInfo: ...
    def delete_queue(self, name: str) -> None: ...
    def add_partitions(self, name: str, partitions: int) -> QueueInfo: ...
    def set_queue_enabled(self, name: str, enabled: bool) -> QueueInfo: ...
    def alter_queue(self, name: str, changes: dict[str, Any]) -> QueueInfo: ...
    def metadata(self, queues: list[str] | None) -> ClusterMetadata: ...
    def rebalance(self, dry_run: bool) -> list[PartitionMove]: ...
    def decommission(self, broker_id: int, dry_run: bool) -> list[PartitionMove]: ...
    def status(self) -> dict[str, object]: ...
    def end_subscriber_streams(self, queue: str, name: str, epoch: int, deleted: bool) -> None: ...


def _not_a_cluster(what: str) -> InvalidArgumentError:
    return InvalidArgumentError(
        f"{what} moves partitions between the brokers of a cluster; this broker runs alone "
        f"(start brokers with --zookeeper to make a cluster: docs/cluster.md)"
    )


class Broker:
    """Serves one store (a data directory, or memory). Thread-safe."""

    def __init__(
        self,
        store: Store,
        *,
        group_clock: Callable[[], float] | None = None,
        shared_clock: Callable[[], float] | None = None,
        clustered: bool = False,
    ) -> None:
        """``shared_clock`` (leases, subscriptions) defaults to the store's wall clock, so a
        test's movable clock moves them with TTL and delays; ``group_clock`` (sessions) to a
        monotonic one, unless the store's clock is a test's own. ``clustered``: it is about to
        join a cluster, so its delayed messages wait for the cluster to say which partitions
        it leads (headwater.broker.delay_moves) instead of going to every partition, and its
        server answers nothing but its health (``joining``) until the cluster node has
        followed the cluster's view once."""
        if shared_clock is None:
            shared_clock = store.clock
        if group_clock is None:
            group_clock = time.monotonic if store.clock is time.time else store.clock
        self.store = store
        self._started = time.monotonic()
        self.cluster: ClusterRole | None = None  # set while this broker is a cluster's member
        # why this broker serves nothing yet (None: it serves): one started to join a cluster acts
        # as the cluster's member or not at all; alone it would accept what it may not lead now
        self.joining: str | None = JOINING if clustered else None
        self.advertised: tuple[str, int] = ("", 0)  # (host, port) clients reach it by; set by its server
        self.offsets = OffsetStore(store)
        # consumer group membership (in memory) over the durable offsets; group_clock times sessions
        self.groups = GroupCoordinator(store, self.offsets, clock=group_clock)
        # shared groups: leases and acks, durable in __shared; shared_clock (wall time) times leases
        self.shared = SharedGroups(store, shared_clock, cluster=lambda: self.cluster)
        # keyed groups (durable in __keyed) and push subscribers (durable in __subscribers)
        self.keyed = KeyedGroups(store)
        self.subscribers = SubscriberRegistry(store, clock=shared_clock)
        # long polling in-process: fetchers wait in their thread until an append wakes them
        self.appends = AppendWaiters()
        store.add_append_listener(self.appends.notify)
        # delayed messages (headwater.broker.delay): schedule files, dispatcher thread
        self.clock = store.clock  # producers in this process turn delay= into times with it
        self.delay = DelayService(
            store, clock=store.clock, report=store.recovery_report, gate=HOLD_ALL if clustered else None
        )
        self.delayed_moves: DelayedMoves | None = None  # set while a cluster's member
        # Prometheus metrics (headwater.broker.metrics), once enable_metrics() made them
        self.telemetry: BrokerMetrics | None = None
        self.metrics_off_why = METRICS_NOT_SERVED

    @classmethod
    def open(
        cls,
        path: str | Path,
        config: StoreConfig | None = None,
        *,
        clock: Callable[[], float] = time.time,
        clustered: bool = False,
    ) -> Broker:
        store: Store
        if config is not None and config.read_only and Path(path).is_dir() and not any(Path(path).iterdir()):
            store = EmptyDirectoryStore(Path(path), config, clock=clock)  # read as no queues; nothing written
        else:
            store = LogStore(path, config, clock=clock)
        try:
            return cls(store, clustered=clustered)
        except BaseException:
            store.close()
            raise

    def add_append_listener(self, fn: Callable[[str, int, int], None]) -> None:
        """Call ``fn(queue, partition, end_offset)`` after every append, from the appending
        thread (keep it quick: hand work to another thread or loop)."""
        self.store.add_append_listener(fn)

    def enable_metrics(self) -> BrokerMetrics:
        """Keep Prometheus metrics from now on (:mod:`headwater.broker.metrics`) and return
        them; again: the same ones. Needs prometheus-client (``pip install
        'headwater[server]'``): without it, :class:`UsageError` saying so."""
        if self.telemetry is None:
            try:
                from headwater.broker.metrics import BrokerMetrics
            except ImportError as e:
                self.metrics_off_why = (
                    f"this broker keeps no metrics: prometheus-client is not installed ({e}); "
                    f"pip install 'headwater[server]' and restart it"
                )
                raise UsageError(self.metrics_off_why) from e
            self.telemetry = BrokerMetrics(self)
            self.store.add_flush_listener(self.telemetry.flushed)
        return self.telemetry

    def metrics(self) -> MetricsExposition:
        """The broker's metrics in the Prometheus text format (docs/metrics.md); UsageError
        saying why when it keeps none."""
        if self.telemetry is None:
            raise UsageError(self.metrics_off_why)
        return self.telemetry.exposition()

    # admin
    def create_queue(self, name: str, config: QueueConfig) -> QueueInfo:
        if self.cluster is not None:
            return self.cluster.create_queue(check_user_queue(name), config)
        return self.store.create_queue(check_user_queue(name), config)

    def describe_queue(self, name: str) -> QueueInfo:
        return self.store.describe_queue(self._readable(name))

    def _readable(self, queue: str) -> str:
        """``queue`` if a client may read it: a user's queue, or on a cluster a coordinator
        queue, which the brokers copy from each other when one of its partitions moves."""
        if queue in CLUSTER_INTERNAL_QUEUES and self.cluster is not None:
            return queue
        return check_user_queue(queue)

    def list_queues(self, after: str | None = None, partitions_max: int = 0) -> QueuePage:
        if after is not None and not isinstance(after, str):
            raise InvalidArgumentError(f"after must be a queue name (str) or None, got {after!r}")
        if isinstance(partitions_max, bool) or not isinstance(partitions_max, int) or partitions_max < 0:
            raise InvalidArgumentError(f"partitions_max must be an int >= 0 (0: the page size), got {partitions_max!r}")
        room = min(partitions_max or LIST_PAGE_PARTITIONS, LIST_PAGE_PARTITIONS)
        queues = sorted(self.store.list_queues(), key=lambda q: q.name)
        page: list[QueueInfo] = []
        for q in queues:
            if after is not None and q.name <= after:
                continue
            n = len(q.partitions)
            if page and n > room:
                return QueuePage(page, page[-1].name)
            page.append(q)
            room -= n
        return QueuePage(page)

    def rebalance(self, dry_run: bool = False) -> list[PartitionMove]:
        """The moves that balance the cluster's live brokers, started unless ``dry_run``."""
        if self.cluster is None:
            raise _not_a_cluster("rebalance")
        return self.cluster.rebalance(bool(dry_run))

    def decommission(self, broker_id: int, dry_run: bool = False) -> list[PartitionMove]:
        """The moves of every partition off ``broker_id``, started unless ``dry_run``."""
        if self.cluster is None:
            raise _not_a_cluster("decommission")
        return self.cluster.decommission(broker_id, bool(dry_run))

    def metadata(self, queues: list[str] | None = None) -> ClusterMetadata:
        if queues is not None and (not isinstance(queues, list) or not all(isinstance(q, str) for q in queues)):
            raise InvalidArgumentError(f"queues must be a list of queue names or None, got {queues!r}")
        if self.cluster is not None:
            return self.cluster.metadata(queues)
        infos = (
            sorted(self.store.list_queues(), key=lambda q: q.name)
            if queues is None
            else [self.store.describe_queue(name) for name in dict.fromkeys(queues)]
        )
        # alone, this broker leads every partition: a cluster of one
        host, port = self.advertised
        here = [ALONE]
        return ClusterMetadata(
            cluster_id="",
            controller=ALONE,
            brokers=[BrokerAddress(broker_id=ALONE, host=host, port=port, epoch=0)],
            queues=[
                QueueLocations(
                    name=q.name,
                    queue_id=q.queue_id,
                    partitions=[
                        PartitionLocation(partition=p.partition, leader=ALONE, leader_epoch=0, replicas=here)
                        for p in q.partitions
                    ],
                )
                for q in infos
            ],
            coordinators=[ALONE],  # one coordinator partition, always this broker's
            keyed_coordinators=[ALONE],  # likewise for keyed groups
            subscriber_coordinators=[ALONE],  # and for subscribers
        )

    def delete_queue(self, name: str) -> None:
        if self.cluster is not None:  # each broker deletes its copy as it follows the cluster
            return self.cluster.delete_queue(check_user_queue(name))
        self.store.delete_queue(check_user_queue(name))
        self.queue_deleted(name)

    def queue_deleted(self, name: str) -> None:
        """The store no longer has queue ``name`` (deleted here, or by the cluster): what was
        kept about it alone goes too (its metrics' series)."""
        if self.telemetry is not None:
            self.telemetry.queue_deleted(name)

    def truncate_queue(self, name: str) -> QueueInfo:
        """Drop every message of the queue here. On a cluster, each broker drops its own
        copies: a client asks every broker (``headwater.client`` does)."""
        info = self.store.truncate_queue(check_user_queue(name))
        self.store.enforce_retention()
        return info

    def set_queue_enabled(self, name: str, enabled: bool) -> QueueInfo:
        if self.cluster is not None:
            return self.cluster.set_queue_enabled(check_user_queue(name), enabled)
        return self.store.set_queue_enabled(check_user_queue(name), enabled)

    def alter_queue(self, name: str, changes: dict[str, Any]) -> QueueInfo:
        if self.cluster is not None:
            return self.cluster.alter_queue(check_user_queue(name), changes)
        return self.store.alter_queue(check_user_queue(name), changes)

    def add_partitions(self, name: str, partitions: int) -> QueueInfo:
        if self.cluster is not None:
            return self.cluster.add_partitions(check_user_queue(name), partitions)
        return self.store.add_partitions(check_user_queue(name), partitions)

    # data
    def produce(self, queue: str, partition: int, batch: bytes) -> ProduceResult:
        result, durable_at = self.produce_nowait(queue, partition, batch)
        if durable_at is not None:
            self.wait_durable(durable_at)
        return result

    def produce_nowait(
        self, queue: str, partition: int, batch: bytes
    ) -> tuple[ProduceResult, int | DelayTicket | None]:
        """Append without waiting for the fsync; see :meth:`LogStore.append_nowait`. A batch
        with a deliver time goes to the delay service instead (when the time is not in the
        future, to be delivered at once: its producer's sequences count in the delayed space
        whatever the clocks say); its answer holds a delayed id, and the token to wait for
        is a :class:`DelayTicket`."""
        if type(queue) is not str or queue.startswith(INTERNAL_PREFIX):  # 2 calls fewer when not
            check_user_queue(queue)
        if self.cluster is not None:
            # a move's fence waits for the appends begun inside, then refuses new ones
            with self.cluster.producing(queue, partition):
                done = self._append_nowait(queue, partition, batch)
        elif peek_deliver_at(batch):  # _append_nowait, inline: one call fewer per produce
            done = self.delay.accept(queue, partition, batch)
        else:
            done = self.store.append_nowait(queue, partition, batch)
        if self.telemetry is not None:
            self.telemetry.produced(queue, done[0].count, len(batch))
        return done

    def _append_nowait(
        self, queue: str, partition: int, batch: bytes
    ) -> tuple[ProduceResult, int | DelayTicket | None]:
        if peek_deliver_at(batch):
            return self.delay.accept(queue, partition, batch)
        return self.store.append_nowait(queue, partition, batch)

    def wait_durable(self, position: int | DelayTicket) -> None:
        if isinstance(position, DelayTicket):
            self.delay.wait_durable(position)
        else:
            self.store.wait_durable(position)

    def fetch(
        self,
        queue: str,
        partition: int,
        offset: int,
        *,
        max_bytes: int,
        tag_mask: int = 0,
        end_offset: int | None = None,
        max_wait_ms: int = 0,
    ) -> FetchResult:
        """Batches from ``offset`` on; with ``max_wait_ms`` wait that long for data to arrive."""
        self._readable(queue)
        if self.cluster is not None:
            self.cluster.check_leader(queue, partition)
        deadline = time.monotonic() + max_wait_ms / 1000
        while True:
            res = self.store.fetch(
                queue, partition, offset, max_bytes=max_bytes, tag_mask=tag_mask, end_offset=end_offset
            )
            if tag_mask and res.batches:  # the store skipped whole batches; drop the rest here
                res = FetchResult(
                    filter_batches(
                        res.batches,
                        TagMaskFilter(tag_mask),
                        start_offset=max(offset, res.start_offset),
                        end_offset=end_offset,
                    ),
                    res.next_offset,
                    res.start_offset,
                    res.end_offset,
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0 or res.settles(offset, end_offset):
                if self.telemetry is not None:
                    self.telemetry.sent_batches(queue, res.batches, offset, res.next_offset)
                return res
            self._wait_for_append(queue, partition, offset, remaining)

    def _wait_for_append(self, queue: str, partition: int, offset: int, timeout_s: float) -> None:
        """Block until the partition grows past ``offset`` or ``timeout_s`` passes (a long
        poll of the embedded broker)."""
        self.appends.wait_blocking(offset, timeout_s, lambda: self.store.end_offset(queue, partition))

    def lookup_id(self, queue_id: int, partition: int, offset: int) -> tuple[str, bytes]:
        if isinstance(partition, int) and partition & DELAYED_PARTITION_BIT:
            self._check_delayed_leader(queue_id, partition)
            return self.delay.lookup(queue_id, partition, offset)
        name = self.store.queue_name(queue_id)
        if is_internal_queue(name):  # the broker's own: not for users to name or see
            raise MessageNotFoundError(f"no queue has id {queue_id} (was it deleted?)")
        if self.cluster is not None and name is not None:
            self.cluster.check_leader(name, partition)
        return self.store.lookup_id(queue_id, partition, offset)

    def lookup_key(self, queue: str, key: bytes, start_ms: int | None, end_ms: int | None, limit: int) -> list[bytes]:
        return self.store.lookup_key(check_user_queue(queue), key, start_ms, end_ms, limit)

    def offset_for_time(self, queue: str, partition: int, timestamp_ms: int) -> int:
        if self.cluster is not None:
            self.cluster.check_leader(check_user_queue(queue), partition)
        return self.store.offset_for_time(check_user_queue(queue), partition, timestamp_ms)

    # consumer offsets
    def commit_offsets(
        self,
        group: str,
        queue: str,
        offsets: dict[int, int],
        member_id: str | None = None,
        generation: int | None = None,
    ) -> None:
        self.groups.commit_offsets(group, check_user_queue(queue), offsets, member_id, generation)

    def delete_group(self, group: str, queue: str | None = None) -> None:
        self.groups.delete_group(group, None if queue is None else check_user_queue(queue))

    def fetch_offsets(self, group: str, queue: str) -> dict[int, int]:
        return self.offsets.fetch(group, check_user_queue(queue))

    # consumer groups (headwater.broker.groups)
    def join_group(
        self,
        group: str,
        member_id: str | None,
        client_id: str,
        queues: list[str],
        mode: str,
        strategy: str,
        session_timeout_ms: int,
    ) -> GroupAssignment:
        return self.groups.join_group(group, member_id, client_id, queues, mode, strategy, session_timeout_ms)

    def heartbeat_group(self, group: str, member_id: str, generation: int) -> GroupAssignment:
        return self.groups.heartbeat_group(group, member_id, generation)

    def leave_group(self, group: str, member_id: str) -> None:
        self.groups.leave_group(group, member_id)

    def describe_group(self, group: str) -> GroupDescription:
        return self.groups.describe_group(group)

    def list_groups(self) -> list[GroupSummary]:
        """Every group: clustering and broadcast groups by name, then each queue's keyed and
        shared groups."""
        queues = self.store.list_queues()
        return self.groups.list_groups() + self.keyed.summaries(queues) + self.shared.summaries(queues)

    # shared groups (headwater.broker.shared)
    def shared_receive(
        self,
        group: str,
        queue: str,
        member: str,
        max_messages: int = 32,
        visibility_timeout_ms: int = 30_000,
        at_most_once: bool = False,
        settings: dict[str, int | float] | None = None,
        max_wait_ms: int = 0,
    ) -> SharedDeliveries:
        res = self.shared.receive(
            group,
            check_user_queue(queue),
            member,
            max_messages,
            visibility_timeout_ms,
            at_most_once,
            settings,
            max_wait_ms,
        )
        if self.telemetry is not None:
            self.telemetry.sent(queue, len(res.leases), sum(map(len, res.batches)))
        return res

    def shared_receive_now(
        self,
        group: str,
        queue: str,
        member: str,
        max_messages: int,
        visibility_timeout_ms: int,
        at_most_once: bool,
        settings: dict[str, int | float] | None,
    ) -> tuple[SharedDeliveries, int | None]:
        """A receive that never waits, plus when to try again (the server's long polling)."""
        res, hint_ms = self.shared.receive_now(
            group, check_user_queue(queue), member, max_messages, visibility_timeout_ms, at_most_once, settings
        )
        if self.telemetry is not None:
            self.telemetry.sent(queue, len(res.leases), sum(map(len, res.batches)))
        return res, hint_ms

    def shared_ack(self, group: str, queue: str, member: str, lease_ids: list[str]) -> list[LeaseRefusal]:
        return self.shared.ack(group, check_user_queue(queue), member, lease_ids)

    def shared_nack(
        self, group: str, queue: str, member: str, lease_ids: list[str], reason: str = "", delay_ms: int | None = None
    ) -> list[LeaseRefusal]:
        return self.shared.nack(group, check_user_queue(queue), member, lease_ids, reason, delay_ms)

    def shared_extend(
        self, group: str, queue: str, member: str, lease_ids: list[str], visibility_timeout_ms: int
    ) -> list[LeaseRefusal]:
        return self.shared.extend(group, check_user_queue(queue), member, lease_ids, visibility_timeout_ms)

    def shared_describe(self, group: str, queue: str) -> SharedGroupInfo:
        return self.shared.describe(group, check_user_queue(queue))

    # keyed groups (headwater.broker.keyed)
    def keyed_group(
        self, queue: str, group: str, key: str | None = None, size: int | None = None, start: str = "earliest"
    ) -> KeyedGroupInfo:
        return self.keyed.group(check_user_queue(queue), group, key, size, start)

    def keyed_fetch(
        self,
        queue: str,
        group: str,
        member: int,
        generation: int,
        partition: int,
        offset: int,
        *,
        max_bytes: int,
        max_wait_ms: int = 0,
    ) -> KeyedFetchResult:
        """The member's messages from ``offset`` on; with ``max_wait_ms`` wait for some. On
        a cluster, served by the partition's leader (NotLeaderError elsewhere)."""
        check_user_queue(queue)
        if self.cluster is not None:
            self.cluster.check_leader(queue, partition)
        deadline = time.monotonic() + max_wait_ms / 1000
        while True:
            res = self.keyed.fetch_now(queue, group, member, generation, partition, offset, max_bytes)
            remaining = deadline - time.monotonic()
            if (
                res.batches
                or res.next_offset != offset
                or remaining <= 0
                or (res.stop_offset is not None and offset >= res.stop_offset)
            ):
                if self.telemetry is not None:
                    self.telemetry.sent_batches(queue, res.batches, offset, res.next_offset, res.selections)
                return res
            self._wait_for_append(queue, partition, offset, remaining)

    def keyed_commit(
        self, queue: str, group: str, member: int, generation: int, offsets: dict[int, int]
    ) -> KeyedGroupInfo:
        return self.keyed.commit(check_user_queue(queue), group, member, generation, offsets)

    def keyed_resize(self, queue: str, group: str, size: int) -> KeyedGroupInfo:
        return self.keyed.resize(check_user_queue(queue), group, size)

    # push subscribers (headwater.broker.subscriptions; delivery: headwater.broker.push)
    def add_subscriber(
        self,
        queue: str,
        name: str,
        partitions: list[int] | None = None,
        tags: list[str] | None = None,
        start: str = "latest",
    ) -> SubscriberInfo:
        return self.subscribers.add(check_user_queue(queue), name, partitions, tags, start)

    def delete_subscriber(self, queue: str, name: str) -> None:
        self.subscribers.delete(check_user_queue(queue), name)
        if self.cluster is not None:  # the coordinator tells the leaders, which hold its streams
            self.cluster.end_subscriber_streams(queue, name, 0, True)

    def list_subscribers(self, queue: str | None = None) -> list[SubscriberInfo]:
        return self.subscribers.list(None if queue is None else check_user_queue(queue))

    def describe_subscriber(self, queue: str, name: str) -> SubscriberInfo:
        return self.subscribers.describe(check_user_queue(queue), name)

    def checkpoint_subscriber(self, queue: str, name: str, offsets: dict[int, int], epoch: int = 0) -> None:
        self.subscribers.checkpoint(check_user_queue(queue), name, offsets, epoch)

    def claim_subscriber(self, queue: str, name: str) -> SubscriberInfo:
        info = self.subscribers.claim(check_user_queue(queue), name)
        if self.cluster is not None:  # the older process's streams end now, on every leader
            self.cluster.end_subscriber_streams(queue, name, info.epoch, False)
        return info

    # delayed messages (headwater.broker.delay)
    def cancel_delayed(self, queue_id: int, partition: int, offset: int) -> None:
        name = self.store.queue_name(queue_id) if self.cluster is not None else None
        if self.cluster is None or name is None or not isinstance(partition, int):
            self.delay.cancel(queue_id, partition, offset)
            return
        # on a cluster: refused while a move has fenced the partition (its delayed messages
        # are being handed off), so no cancel is lost on the way to the new leader
        with self.cluster.producing(name, partition & ~DELAYED_PARTITION_BIT):
            self.delay.cancel(queue_id, partition, offset)

    def _check_delayed_leader(self, queue_id: int, partition: int) -> None:
        name = self.store.queue_name(queue_id) if self.cluster is not None else None
        if self.cluster is not None and name is not None:
            self.cluster.check_leader(name, partition & ~DELAYED_PARTITION_BIT)

    def hand_off_delayed(
        self,
        queue: str,
        partition: int,
        leader_epoch: int,
        after: int,
        max_bytes: int,
        shared: bool = False,
        groups: bool = False,
    ) -> HandoffPage:
        """HANDOFF_DELAYED, broker to broker: a page of a partition's delayed messages (or,
        ``shared``, of its shared groups' state; ``groups``, of its consumer groups'
        membership) for its move's target (headwater.broker.delay_moves)."""
        if self.delayed_moves is None:
            raise _not_a_cluster("handing off delayed messages")
        return self.delayed_moves.hand_off(queue, partition, leader_epoch, after, max_bytes, shared, groups)

    def delay_stats(self) -> DelayStats:
        return self.delay.stats()

    # operations
    def status(self) -> dict[str, object]:
        where = (
            {"mode": "memory"} if self.store.path is None else {"mode": "embedded", "data_dir": str(self.store.path)}
        )
        return {
            "version": __version__,
            **where,
            "uptime_s": round(time.monotonic() - self._started, 3),
            **self.store.stats(),
            **self.delay.summary(),
            "recovery": list(self.store.recovery_report),
            **({"cluster": self.cluster.status()} if self.cluster is not None else {}),
        }

    def flush(self) -> None:
        self.store.flush()

    def close(self) -> None:
        try:
            self.delay.close()  # its dispatcher appends to the store: stop it first
        finally:
            self.store.close()
