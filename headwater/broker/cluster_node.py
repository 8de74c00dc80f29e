"""A broker's part in a cluster (``docs/design/cluster.md``): its membership, its cache of the
cluster's metadata, its candidacy for controller and, while elected, the controller's work;
and what the broker does with the metadata: it creates the queues the cluster has (under the
cluster's queue ids), serves only the partitions it leads, coordinates the consumer
groups and keyed groups of the coordinator queues' partitions it leads, and sends changes
to queues through the controller.

One session with ZooKeeper carries all of it. The work the watches start (the controller's
answers, creating and deleting local queues) runs on one thread of the node's, in order, so
a watch's thread never blocks on the store or on ZooKeeper.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import msgspec

from headwater.broker.broker import Broker
from headwater.broker.delay_moves import DelayedMoves
from headwater.broker.keyed_peers import KeyedPeers
from headwater.broker.mover import Mover
from headwater.broker.subscriber_peers import end_streams_everywhere
from headwater.cluster.admin import AdminHandler, ask
from headwater.cluster.controller import ControllerContext, ControllerElection, ControllerFencedError
from headwater.cluster.coordination import Coordination, CoordinationError
from headwater.cluster.membership import Membership
from headwater.cluster.metadata import ClusterView, MetadataCache
from headwater.cluster.moves import MOVES_RUNNING_MAX, MoveDriver
from headwater.cluster.records import AdminRequest, paths
from headwater.errors import (
    HeadwaterError,
    NotCoordinatorError,
    NotLeaderError,
    PartitionOutOfRangeError,
    QueueExistsError,
    QueueNotFoundError,
    UnavailableError,
)
from headwater.model.cluster import (
    CLUSTER_INTERNAL_QUEUES,
    COORDINATOR_PARTITIONS,
    COORDINATOR_QUEUE,
    KEYED_COORDINATOR_QUEUE,
    SUBSCRIBER_COORDINATOR_QUEUE,
    BrokerAddress,
    ClusterMetadata,
    PartitionLocation,
    PartitionMove,
    QueueLocations,
    coordinator_partition,
)
from headwater.model.config import ALTERABLE, QueueConfig, QueueIdentity, QueueInfo, altered_config, is_internal_queue
from headwater.model.keyed import KeyedGroupInfo

__all__ = ["ClusterNode"]

log = logging.getLogger("headwater.cluster")


def _altered(have: QueueConfig, want: QueueConfig) -> bool:
    """Whether the settings alter_queue changes differ between the two."""
    return any(getattr(have, k) != getattr(want, k) for k in ALTERABLE)


REQUEST_TIMEOUT_S = 30.0  # how long a broker waits for the controller to answer a change
MOVES_POLL_S = 0.2  # the controller looks at the moves this often (progress is not watched)


class ClusterNode:
    """Everything a broker does as a member of a cluster; :meth:`start` once it is registered."""

    def __init__(
        self,
        broker: Broker,
        membership: Membership,
        *,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
        moves_running_max: int = MOVES_RUNNING_MAX,
        auto_rebalance_after_s: float = 0.0,
        coordinator_partitions: int = COORDINATOR_PARTITIONS,
    ) -> None:
        self.broker = broker
        self.membership = membership
        self.coord: Coordination = membership.coordination
        self.broker_id = membership.broker_id
        self._request_timeout_s = request_timeout_s
        self.cache = MetadataCache(self.coord)
        self._admin = AdminHandler(self.coord, lambda: self.cache.view)
        self._election = ControllerElection(
            self.coord, self.broker_id, on_elected=self._elected, on_resigned=self._resigned
        )
        self._ctx: ControllerContext | None = None
        self._moves = MoveDriver(self.coord, lambda: self.cache.view, running_max=moves_running_max)
        self._auto_after_s = auto_rebalance_after_s
        self._brokers_since: tuple[frozenset[int], float] = (frozenset(), 0.0)  # as last seen, and since when
        self.mover = Mover(
            broker.store, self.coord, self.broker_id, lambda: self.cache.view, lambda: membership.active, self._work_put
        )
        # delayed messages go only to partitions led here, and move with them, as shared state does
        self.delayed = DelayedMoves(
            broker.delay, broker.store, self.coord, self.broker_id, lambda: self.cache.view,
            lambda: membership.active, self.mover, self.producing, shared=broker.shared, groups=broker.groups,
        )  # fmt: skip
        self._work: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._worker = threading.Thread(target=self._run, name="headwater-cluster", daemon=True)
        self._seen: set[str] = set()  # cluster queues this broker has made: gone from the view, deleted here
        self._foreign: set[str] = set()  # local queues named as a cluster queue, but not it
        self._local_ready = threading.Condition()
        self._serves = threading.Event()  # set once the first follow is done (Broker.joining cleared)
        self._coordinator_partitions = coordinator_partitions  # when this broker is the one to create the queue
        # (coordinator queue, partition) loaded here -> its leader epoch then
        self._coordinating: dict[tuple[str, int], int] = {}
        self.keyed_peers = KeyedPeers(broker.store, self.broker_id, lambda: self.cache.view)

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        self.broker.offsets.join_cluster(self)
        self.broker.keyed.join_cluster(self)
        self.broker.subscribers.join_cluster(self)
        self._worker.start()
        self.cache.on_change(lambda view: self._work.put(lambda: self._follow(view)))
        self.cache.start()
        self._work.put(lambda: self._follow(self.cache.view))
        try:
            self.coord.create(paths.REQUESTS)
        except CoordinationError:
            pass  # there already (or the session is down: the controller makes it when asked)
        self.coord.watch_children(paths.REQUESTS, lambda names: self._work.put(self._answer))
        self._election.start()
        self.mover.start()
        self.broker.cluster = self
        self.delayed.start()
        self.broker.delayed_moves = self.delayed
        self._work.put(self._serving)  # after the first follow: the queues made here, the coordinators loaded

    def _serving(self) -> None:
        if self.broker.joining is not None:
            self.broker.joining = None
            log.info("broker %d serves as a member of cluster %s", self.broker_id, self.membership.cluster_id)
        self._serves.set()

    def wait_serving(self, timeout_s: float) -> bool:
        """Wait until the broker serves as the cluster's member (its first follow of the
        view done); False if ``timeout_s`` passed first."""
        return self._serves.wait(timeout_s)

    def _work_put(self, task: Callable[[], None]) -> None:
        self._work.put(task)

    def close(self) -> None:
        self.broker.cluster = None
        self.broker.delayed_moves = None
        self.delayed.close()
        try:
            self._election.close()  # first: another broker takes over at once
        finally:
            self.mover.close()
            self.keyed_peers.close()
            self.cache.close()
            self._work.put(None)
            self._worker.join(10)

    def _run(self) -> None:
        while (task := self._work.get()) is not None:
            try:
                task()
            except ControllerFencedError as e:
                log.warning("no longer the controller: %s", e)
            except (CoordinationError, HeadwaterError) as e:
                log.warning("cluster work failed, to be tried again at the next change: %s", e)
            except Exception:  # a bug: log it, keep the broker serving
                log.exception("cluster work failed")

    # -- the controller --------------------------------------------------------------------

    def _elected(self, ctx: ControllerContext) -> None:
        log.info("broker %d is the controller (epoch %d)", self.broker_id, ctx.epoch)
        self._ctx = ctx
        self._work.put(self._answer)
        threading.Thread(target=self._drive_moves, args=(ctx,), name="headwater-moves", daemon=True).start()

    def _drive_moves(self, ctx: ControllerContext) -> None:
        """The controller's move thread: one step of every move, every MOVES_POLL_S, while
        ``ctx`` leads (a new election starts a new thread)."""
        while self._ctx is ctx and not ctx.fenced:
            try:
                self._moves.tick(ctx)
                if self._auto_after_s > 0:
                    self._auto_rebalance(ctx)
            except ControllerFencedError:
                return
            except (CoordinationError, HeadwaterError) as e:
                log.info("driving the moves: %s; trying again", e)
            except Exception:
                log.exception("driving the moves failed")
            time.sleep(MOVES_POLL_S)

    def _auto_rebalance(self, ctx: ControllerContext) -> None:
        """Rebalance once the live brokers have been the same for ``auto_rebalance_after_s``
        (a broker that restarts does not set partitions moving) and no move is under way."""
        view = self.cache.view
        brokers, now = frozenset(view.brokers), time.monotonic()
        if brokers != self._brokers_since[0]:
            self._brokers_since = (brokers, now)
            return
        if view.moves or now - self._brokers_since[1] < self._auto_after_s:
            return
        planned = self._admin.rebalance_now(ctx)
        self._brokers_since = (brokers, now)  # planned or balanced: look again after another while
        if planned:
            log.info("rebalancing by itself (auto_rebalance_after_s): %d partition move(s) planned", len(planned))

    def _resigned(self) -> None:
        if self._ctx is not None:
            log.info("broker %d is no longer the controller (epoch %d)", self.broker_id, self._ctx.epoch)
        self._ctx = None

    def _answer(self) -> None:
        ctx = self._ctx
        if ctx is not None and not ctx.fenced:
            self._admin.handle_all(ctx)

    # -- following the view ----------------------------------------------------------------

    def _follow(self, view: ClusterView) -> None:
        """Make the local store hold every queue of the cluster, with the cluster's ids and
        partition counts; delete here what the cluster deleted."""
        store = self.broker.store
        local = {q.name: q for q in store.list_queues(include_internal=True)}
        for name, qv in view.queues.items():
            config = msgspec.convert(qv.record.config, QueueConfig)
            have = local.get(name)
            if have is None:
                store.create_queue(name, config, internal=is_internal_queue(name), queue_id=qv.record.queue_id)
            elif have.queue_id != qv.record.queue_id:
                if name in self._foreign:
                    continue
                self._foreign.add(name)  # said once: every change of the view would repeat it
                log.error(
                    "queue %s here has id %d, the cluster's has id %d: this broker does not serve it; "
                    "delete it here (it was made outside the cluster) to take the cluster's",
                    name,
                    have.queue_id,
                    qv.record.queue_id,
                )
                continue
            elif len(have.partitions) < config.partitions:
                store.add_partitions(name, config.partitions)
            if have is not None and _altered(have.config, config):
                store.alter_queue(name, {k: getattr(config, k) for k in ALTERABLE})  # altered by the cluster
            if (have.enabled if have is not None else True) != qv.record.enabled:
                store.set_queue_enabled(name, qv.record.enabled)  # disabled or enabled by the cluster
            self._seen.add(name)
        for name in sorted(self._seen - set(view.queues)):
            if name in local:
                store.delete_queue(name)
                self.broker.queue_deleted(name)
                log.info("deleted queue %s here: the cluster deleted it", name)
            self._seen.discard(name)
        self._follow_coordinators(view)
        with self._local_ready:
            self._local_ready.notify_all()
        self.mover.follow(view)

    def _follow_coordinators(self, view: ClusterView) -> None:
        """Load the groups of the coordinator partitions (of consumer groups, keyed groups
        and subscribers) this broker has come to lead (at start, after a move's switch, after a new
        session), unload those it no longer leads; one led at another leader epoch than
        when loaded is loaded again."""
        kinds = {
            COORDINATOR_QUEUE: (self.broker.groups.load_partition, self.broker.groups.unload_partition),
            KEYED_COORDINATOR_QUEUE: (self.broker.keyed.load, self.broker.keyed.unload),
            SUBSCRIBER_COORDINATOR_QUEUE: (self.broker.subscribers.load, self.broker.subscribers.unload),
        }
        leading: dict[tuple[str, int], int] = {}
        for name in kinds:
            qv = view.queues.get(name)
            if qv is not None and self._local_id(name) == qv.record.queue_id:
                leading.update(
                    {(name, n): r.leader_epoch for n, r in qv.partitions.items() if r.leader == self.broker_id}
                )
        for (name, n), epoch in sorted(self._coordinating.items()):
            if leading.get((name, n)) != epoch:
                kinds[name][1](n)
                del self._coordinating[(name, n)]
                log.info("no longer coordinates the groups of %s[%d]", name, n)
        for (name, n), epoch in sorted(leading.items()):
            if (name, n) not in self._coordinating:
                kinds[name][0](n)
                self._coordinating[(name, n)] = epoch
                log.info("coordinates the groups of %s[%d] (leader epoch %d)", name, n, epoch)

    def _await_local(self, done: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + self._request_timeout_s
        with self._local_ready:
            while not done():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise UnavailableError(f"the change was made, but {what} did not reach this broker in time")
                self._local_ready.wait(min(left, 0.5))

    # -- serving ---------------------------------------------------------------------------

    def check_leader(self, queue: str, partition: int) -> None:
        """Refuse (NotLeaderError, retriable) a partition this broker does not lead now."""
        if is_internal_queue(queue) and queue not in CLUSTER_INTERNAL_QUEUES:
            return  # the broker's own queues are its own
        if not self.membership.active:
            raise NotLeaderError(
                f"broker {self.broker_id} is cut off from its cluster's ZooKeeper and serves no partition now; "
                f"another broker may lead {queue}[{partition}]"
            )
        view = self.cache.view
        qv = view.queues.get(queue)
        if qv is None:
            raise QueueNotFoundError(f"queue {queue!r} does not exist")
        rec = qv.partitions.get(partition)
        if rec is None:
            n = len(qv.partitions)
            raise PartitionOutOfRangeError(f"partition {partition} is out of range for {queue!r} (0..{n - 1})")
        if rec.leader != self.broker_id:
            where = view.broker_address(rec.leader)
            raise NotLeaderError(
                f"broker {self.broker_id} does not lead {queue}[{partition}]; broker {rec.leader}"
                + (f" at {where}" if where else " (not registered now)")
                + f" does, at leader epoch {rec.leader_epoch}"
            )

    def leader_address(self, queue: str, partition: int) -> str | None:
        """``host:port`` of the broker leading ``queue[partition]`` in this broker's view,
        or None when the queue, the partition or a live leader is unknown (where a shared
        group's dead letters for a partition another broker leads go)."""
        view = self.cache.view
        leader = view.leader(queue, partition)
        return None if leader is None else view.broker_address(leader)

    @contextmanager
    def producing(self, queue: str, partition: int) -> Iterator[None]:
        """Around a send's append: refused unless this broker leads the partition and no
        move has fenced it here; a fence waits for the appends inside."""
        self.check_leader(queue, partition)
        if is_internal_queue(queue) and queue not in CLUSTER_INTERNAL_QUEUES:
            yield
            return
        with self.mover.producing(queue, partition):
            yield

    def leads(self, queue: str, partition: int) -> bool:
        """Whether this broker leads ``queue[partition]`` now (and is not cut off)."""
        return self.membership.active and self.cache.view.leader(queue, partition) == self.broker_id

    def coordinator_partition(self, group: str, of: str = COORDINATOR_QUEUE) -> int:
        """The partition of coordinator queue ``of`` of ``group`` (a keyed group's
        ``keyed_coordinator_name``), if this broker coordinates the group now; else
        NotCoordinatorError naming the coordinator. The first group call of a cluster has
        the controller create the queue (placed over the brokers live then)."""
        if not self.membership.active:
            raise NotCoordinatorError(
                f"broker {self.broker_id} is cut off from its cluster's ZooKeeper and coordinates no group now; "
                f"another broker may coordinate {group!r}"
            )
        qv = self.cache.view.queues.get(of)
        if qv is None:
            if threading.current_thread() is self._worker:  # it makes the queue here: it cannot wait for it
                raise NotCoordinatorError(f"the cluster has no {of} queue yet: nobody coordinates {group!r}")
            self._make_coordinator_queue(of)
            qv = self.cache.view.queues[of]
        k = coordinator_partition(group, msgspec.convert(qv.record.config, QueueConfig).partitions)
        rec = qv.partitions.get(k)
        if rec is None or rec.leader != self.broker_id:
            leader = -1 if rec is None else rec.leader
            where = self.cache.view.broker_address(leader)
            raise NotCoordinatorError(
                f"broker {self.broker_id} does not coordinate group {group!r}; broker {leader}"
                + (f" at {where}" if where else " (not registered now)")
                + f" does (it leads {of}[{k}])"
            )
        return k

    def _make_coordinator_queue(self, name: str) -> None:
        config = QueueConfig(partitions=self._coordinator_partitions, ttl_s=None, flush="sync")
        try:
            self._ask("create_queue", name, config=msgspec.to_builtins(config))
        except QueueExistsError:
            pass  # another broker's group call made it first
        self._await_local(
            lambda: name in self.cache.view.queues and self._local_id(name) is not None,
            f"the coordinator queue {name}",
        )

    def log_ranges(self, queue: QueueInfo, ask_leaders: bool) -> dict[int, tuple[int, int]]:
        """See :meth:`KeyedPeers.log_ranges`."""
        return self.keyed_peers.log_ranges(queue, ask_leaders)

    def offset_for_time(self, queue: str, partition: int, timestamp_ms: int) -> int:
        """See :meth:`KeyedPeers.offset_for_time`."""
        return self.keyed_peers.offset_for_time(queue, partition, timestamp_ms)

    def end_subscriber_streams(self, queue: str, name: str, epoch: int, deleted: bool) -> None:
        """See :func:`~headwater.broker.subscriber_peers.end_streams_everywhere`."""
        end_streams_everywhere(self.cache.view, self.broker_id, queue, name, epoch, deleted)

    def keyed_state(self, queue: QueueIdentity, group: str, generation: int, fresh: bool = False) -> KeyedGroupInfo:
        """See :meth:`KeyedPeers.keyed_state`."""
        return self.keyed_peers.keyed_state(queue, group, generation, fresh)

    def _ask(self, op: str, name: str, **fields: Any) -> int:
        req = AdminRequest(op=op, queue=name, asked_by=self.broker_id, asked_ms=int(time.time() * 1000), **fields)
        return ask(self.coord, req, self._request_timeout_s).queue_id

    def create_queue(self, name: str, config: QueueConfig) -> QueueInfo:
        queue_id = self._ask("create_queue", name, config=msgspec.to_builtins(config))
        self._await_local(lambda: self._local_id(name) == queue_id, f"queue {name!r}")
        return self.broker.store.describe_queue(name)

    def delete_queue(self, name: str) -> None:
        queue_id = self._ask("delete_queue", name)
        self._await_local(lambda: self._local_id(name) != queue_id, f"the deletion of {name!r}")

    def add_partitions(self, name: str, partitions: int) -> QueueInfo:
        self._ask("add_partitions", name, partitions=partitions)
        self._await_local(
            lambda: len(self.broker.store.describe_queue(name).partitions) >= partitions, f"{name!r}'s new partitions"
        )
        return self.broker.store.describe_queue(name)

    def alter_queue(self, name: str, changes: dict[str, Any]) -> QueueInfo:
        want = altered_config(self.broker.store.describe_queue(name).config, changes)  # bad values: said here
        self._ask("alter_queue", name, config=dict(changes))
        self._await_local(
            lambda: not _altered(self.broker.store.describe_queue(name).config, want), f"the change of {name!r}"
        )
        return self.broker.store.describe_queue(name)

    def set_queue_enabled(self, name: str, enabled: bool) -> QueueInfo:
        self._ask("set_enabled", name, enabled=bool(enabled))
        self._await_local(
            lambda: self.broker.store.describe_queue(name).enabled == bool(enabled),
            f"the {'enabling' if enabled else 'disabling'} of {name!r}",
        )
        return self.broker.store.describe_queue(name)

    def rebalance(self, dry_run: bool) -> list[PartitionMove]:
        return self._plan("rebalance", 0, dry_run)

    def decommission(self, broker_id: int, dry_run: bool) -> list[PartitionMove]:
        return self._plan("decommission", broker_id, dry_run)

    def _plan(self, op: str, broker_id: int, dry_run: bool) -> list[PartitionMove]:
        req = AdminRequest(
            op=op,
            queue="",
            asked_by=self.broker_id,
            asked_ms=int(time.time() * 1000),
            broker_id=broker_id,
            dry_run=dry_run,
        )
        planned = ask(self.coord, req, self._request_timeout_s).moves
        return [PartitionMove(queue=m.queue, partition=m.partition, source=m.source, target=m.target) for m in planned]

    def _local_id(self, name: str) -> int | None:
        try:
            return self.broker.store.describe_queue(name).queue_id
        except QueueNotFoundError:
            return None

    def metadata(self, queues: list[str] | None) -> ClusterMetadata:
        view = self.cache.view
        if queues is None:
            names = sorted(q for q in view.queues if not is_internal_queue(q))
        else:
            missing = [q for q in dict.fromkeys(queues) if q not in view.queues and not is_internal_queue(q)]
            if missing:
                raise QueueNotFoundError(f"queue {missing[0]!r} does not exist")
            names = list(dict.fromkeys(queues))
        located: list[QueueLocations] = []
        for name in names:
            qv = view.queues.get(name)
            if qv is None:  # an internal queue: this broker's own
                info = self.broker.store.describe_queue(name)
                parts = [
                    PartitionLocation(
                        partition=p.partition, leader=self.broker_id, leader_epoch=0, replicas=[self.broker_id]
                    )
                    for p in info.partitions
                ]
                located.append(QueueLocations(name=name, queue_id=info.queue_id, partitions=parts))
                continue
            parts = [
                PartitionLocation(partition=n, leader=r.leader, leader_epoch=r.leader_epoch, replicas=list(r.replicas))
                for n, r in sorted(qv.partitions.items())
            ]
            located.append(QueueLocations(name=name, queue_id=qv.record.queue_id, partitions=parts))
        return ClusterMetadata(
            cluster_id=self.membership.cluster_id,
            controller=view.controller.broker_id if view.controller is not None else -1,
            brokers=[
                BrokerAddress(broker_id=i, host=b.record.host, port=b.record.port, epoch=b.epoch)
                for i, b in sorted(view.brokers.items())
            ],
            queues=located,
            moves=[
                PartitionMove(queue=q, partition=n, source=m.source, target=m.target, phase=m.phase)
                for (q, n), m in sorted(view.moves.items())
            ],
            coordinators=self._coordinators(view, COORDINATOR_QUEUE),
            keyed_coordinators=self._coordinators(view, KEYED_COORDINATOR_QUEUE),
            subscriber_coordinators=self._coordinators(view, SUBSCRIBER_COORDINATOR_QUEUE),
            ended_moves=list(view.ended_moves),
        )

    @staticmethod
    def _coordinators(view: ClusterView, name: str) -> list[int]:
        """Each partition's leader of coordinator queue ``name`` (-1: none known); [] before
        the queue is made."""
        qv = view.queues.get(name)
        if qv is None:
            return []
        n = msgspec.convert(qv.record.config, QueueConfig).partitions
        return [(r.leader if (r := qv.partitions.get(k)) is not None else -1) for k in range(n)]

    def status(self) -> dict[str, object]:
        view = self.cache.view
        return {
            **self.membership.status(),
            "controller": view.controller.broker_id if view.controller is not None else -1,
            "controller_epoch": view.controller.epoch if view.controller is not None else 0,
            "brokers": sorted(view.brokers),
            "leads": len(
                [1 for qv in view.queues.values() for r in qv.partitions.values() if r.leader == self.broker_id]
            ),
        }
