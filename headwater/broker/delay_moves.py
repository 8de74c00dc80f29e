"""Delayed messages, shared groups' state and consumer groups' membership move with their
partition (docs/design/delay.md, "On a cluster"; docs/design/cluster.md, "Shared groups",
"Moving a partition"): a cluster member's side of it, between the delay service
(:mod:`headwater.broker.delay`), the shared groups (:mod:`headwater.broker.shared`), the group
coordinator (:mod:`headwater.broker.groups`) and the moves (:mod:`headwater.broker.mover`).
One hand-off carries all: HANDOFF_DELAYED, its pages of delayed batches, then (``shared``)
its pages of the groups' windows, and for a partition of the coordinator queue (``groups``)
the membership of its consumer groups, under the same fence and epoch rule.

- **The gate** of the delay service: a batch is delivered only to a partition this broker
  leads now (its session lives, the view names it leader, no move has fenced it here), at a
  leader epoch at least the batch's own (an adopted batch's is its move's switch), and its
  append runs inside the cluster's ``producing``, so a fence waits for it or refuses it.
- **The source**, fenced for a move, answers the target's HANDOFF_DELAYED pages. From the
  fence on its shared groups act on nothing of the partition (``SharedGroups.moving``).
- **The target**, copied to the source's fenced end, forgets whatever batches of the
  partition it still had (a hand-off asked again replaces the last one whole), then adopts
  every page, durably, gated at the move's leader epoch + 1; then it takes every group's
  state of the partition, replacing whatever it had of it, durably (acted on only once it
  leads the partition, which is at that epoch), and of a coordinator queue's partition the
  consumer groups' membership (in memory, as membership always is; served once it leads
  the partition); only then does the mover report ``delayed_taken`` (all taken), which the
  controller's switch waits for.
- **Strays**: the batches and the shared state of a partition another broker leads, with no
  move of it to or from here, are forgotten (MOVED) once ZooKeeper itself shows that, as the
  mover drops the data: the source's after the switch, a target's after a rollback (it never
  acted on them: it never led at their epoch).

Thread-safety: the gate is called by the dispatcher under the delay service's lock (it reads
the view and the fences, takes no lock); the rest runs on the mover's threads and the
server's worker threads.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

import msgspec

from headwater.broker.delay import DelayService
from headwater.broker.delay.handoff import HOLD_ALL
from headwater.broker.groups import GroupCoordinator
from headwater.broker.mover import Mover
from headwater.broker.peer import PeerClient
from headwater.broker.shared import SharedGroups
from headwater.cluster.coordination import Coordination, NoNodeError
from headwater.cluster.metadata import ClusterView
from headwater.cluster.records import PartitionRecord, decode, paths
from headwater.errors import NotLeaderError, UnavailableError, UsageError
from headwater.model.cluster import COORDINATOR_QUEUE
from headwater.model.config import is_internal_queue
from headwater.model.delay import HandoffPage
from headwater.model.groups import HandedOffGroup
from headwater.model.shared import HandedOffShared
from headwater.storage.api import Store

__all__ = ["DelayedMoves", "HANDOFF_BYTES_MAX"]

log = logging.getLogger("headwater.cluster")

HANDOFF_BYTES_MAX = 4 * 1024 * 1024  # one page of a hand-off
FORGET_TRIES = 100  # a target waits this many times FORGET_WAIT_S for runs being appended
FORGET_WAIT_S = 0.05


class DelayedMoves:
    """The delayed messages of broker ``broker_id`` on a cluster; :meth:`start` makes them
    follow it, :meth:`close` holds them all again."""

    def __init__(
        self,
        delay: DelayService,
        store: Store,
        coord: Coordination,
        broker_id: int,
        view: Callable[[], ClusterView],
        active: Callable[[], bool],
        mover: Mover,
        producing: Callable[[str, int], AbstractContextManager[None]],
        shared: SharedGroups | None = None,
        groups: GroupCoordinator | None = None,
    ) -> None:
        self.delay = delay
        self.shared = shared
        self.groups = groups
        self.store = store
        self.coord = coord
        self.broker_id = broker_id
        self._view = view
        self._active = active
        self._mover = mover
        self._producing = producing

    def start(self) -> None:
        self._mover.delayed = self
        self.delay.gate = self
        if self.shared is not None:
            self.shared.moving = self._mover.moving
        if self.groups is not None:
            self.groups.moving = self._mover.moving

    def close(self) -> None:
        self.delay.gate = HOLD_ALL  # still a cluster's member: deliver nothing until it joins again
        self._mover.delayed = None
        if self.shared is not None:
            self.shared.moving = None
        if self.groups is not None:
            self.groups.moving = None

    # -- the gate (the dispatcher, under the delay service's lock) ----------------------------

    def leader_epoch(self, queue_id: int, partition: int) -> int | None:
        name = self.store.queue_name(queue_id)
        if name is None or is_internal_queue(name):
            return sys.maxsize  # deleted (the append drops it), or this broker's own
        if not self._active():
            return None
        view = self._view()
        qv = view.queues.get(name)
        rec = qv.partitions.get(partition) if qv is not None else None
        if rec is None or rec.leader != self.broker_id or self._mover.fenced_epoch(name, partition) is not None:
            return None
        move = view.moves.get((name, partition))
        if move is not None and move.phase == "fence" and move.source == self.broker_id:
            return None
        return rec.leader_epoch

    def delivering(self, queue_id: int, partition: int) -> AbstractContextManager[None]:
        name = self.store.queue_name(queue_id)
        if name is None or is_internal_queue(name):
            return nullcontext()
        return self._producing(name, partition)

    # -- the source ---------------------------------------------------------------------------

    def hand_off(
        self,
        queue: str,
        partition: int,
        leader_epoch: int,
        after: int,
        max_bytes: int,
        shared: bool = False,
        groups: bool = False,
    ) -> HandoffPage:
        """A page of the partition's delayed batches (``shared``: of its shared groups'
        state; ``groups``: of its consumer groups' membership) for the move planned at
        ``leader_epoch`` (HANDOFF_DELAYED), once this broker has fenced the partition for it."""
        if self._mover.fenced_epoch(queue, partition) != leader_epoch:
            raise NotLeaderError(
                f"broker {self.broker_id} has not fenced {queue}[{partition}] for its move at leader epoch "
                f"{leader_epoch}: its delayed messages and shared state are handed off once it has; ask again"
            )
        queue_id = self.store.describe_queue(queue).queue_id
        max_bytes = max(1, min(max_bytes, HANDOFF_BYTES_MAX))
        if groups:
            if self.groups is None or queue != COORDINATOR_QUEUE:
                return HandoffPage([], False)
            return _page_of_groups(self.groups.hand_off(partition), after, max_bytes)
        if shared:
            if self.shared is None:
                return HandoffPage([], False)
            return self.shared.hand_off(queue_id, partition, after, max_bytes)
        return self.delay.hand_off(queue_id, partition, after, max_bytes)

    # -- the target ---------------------------------------------------------------------------

    def take(self, peer: PeerClient, queue: str, partition: int, leader_epoch: int) -> None:
        """Adopt the source's delayed batches of the partition, durably, delivered here from
        leader epoch ``leader_epoch + 1`` on (the switch's)."""
        queue_id = self.store.describe_queue(queue).queue_id
        for _ in range(FORGET_TRIES):
            if not self.delay.forget(queue_id, partition):
                break
            time.sleep(FORGET_WAIT_S)
        else:
            raise UnavailableError(f"delayed messages of {queue}[{partition}] are still being appended here")
        after, taken = -1, 0
        while True:
            page = peer.hand_off_delayed(queue, partition, leader_epoch, after, HANDOFF_BYTES_MAX)
            self.delay.adopt(queue_id, partition, page.batches, leader_epoch + 1)
            taken += len(page.batches)
            if not page.more or not page.batches:
                break
            after = page.batches[-1].accept_seq
        log.info("took %d delayed batch(es) of %s[%d] from broker %s", taken, queue, partition, peer.address)
        if self.shared is not None:
            self._take_shared(peer, queue, queue_id, partition, leader_epoch)
        if self.groups is not None and queue == COORDINATOR_QUEUE:
            self._take_groups(peer, partition, leader_epoch)

    def _take_groups(self, peer: PeerClient, partition: int, leader_epoch: int) -> None:
        """Adopt the membership of the consumer groups of a coordinator queue's partition,
        all pages at once. A source that does not know the request's ``groups`` (an older
        broker: it answers a page of delayed batches, which has none) or refuses it hands
        off none: its groups' members join again here, as before."""
        assert self.groups is not None
        items: list[HandedOffGroup] = []
        try:
            while True:
                page = peer.hand_off_groups(
                    COORDINATOR_QUEUE, partition, leader_epoch, len(items) - 1, HANDOFF_BYTES_MAX
                )
                items.extend(page.groups)
                if not page.more or not page.groups:
                    break
        except UsageError as e:
            log.warning(
                "broker %s did not hand off the groups of %s[%d] (%s): their members join again",
                peer.address,
                COORDINATOR_QUEUE,
                partition,
                e,
            )
            items = []
        self.groups.adopt(partition, items)
        members = sum(len(g.members) for g in items)
        log.info(
            "took %d consumer group(s) (%d member(s)) of %s[%d] from broker %s",
            len(items),
            members,
            COORDINATOR_QUEUE,
            partition,
            peer.address,
        )

    def _take_shared(self, peer: PeerClient, queue: str, queue_id: int, partition: int, leader_epoch: int) -> None:
        """Adopt every shared group's state of the partition, all pages at once (so what was
        here of it is replaced by the whole hand-off, never by part of it)."""
        assert self.shared is not None
        items: list[HandedOffShared] = []
        while True:
            page = peer.hand_off_shared(queue, partition, leader_epoch, len(items) - 1, HANDOFF_BYTES_MAX)
            items.extend(page.shared)
            if not page.more or not page.shared:
                break
        self.shared.adopt(queue_id, partition, items)
        log.info("took %d shared group(s)' state of %s[%d] from broker %s", len(items), queue, partition, peer.address)

    # -- strays (the mover's follow, on the node's work thread) ---------------------------------

    def forget_strays(self, view: ClusterView) -> None:
        """Forget the batches of partitions that ZooKeeper shows another broker leading, with
        no move of them to or from here."""
        for queue_id, partition in sorted(self.delay.partitions_with_batches()):
            stray = self._stray(view, queue_id, partition)
            if stray is None:
                continue
            name, rec = stray
            if not self._led_elsewhere(name, partition):
                continue
            busy = self.delay.forget(queue_id, partition)
            log.info(
                "forgot the delayed messages of %s[%d] here: broker %d leads it%s",
                name,
                partition,
                rec.leader,
                f" ({busy} batch(es) being appended: later)" if busy else "",
            )
        if self.shared is not None:
            self._forget_shared_strays(view)

    def _forget_shared_strays(self, view: ClusterView) -> None:
        assert self.shared is not None
        for queue_id, partition in sorted(self.shared.partitions_with_state()):
            stray = self._stray(view, queue_id, partition)
            if stray is None:
                continue
            name, rec = stray
            if self._mover.fenced_epoch(name, partition) is not None or not self._led_elsewhere(name, partition):
                continue  # a source that fenced forgets once the view shows the new owner
            groups = self.shared.forget(queue_id, partition)
            log.info(
                "forgot %d shared group(s)' state of %s[%d] here: broker %d leads it",
                groups,
                name,
                partition,
                rec.leader,
            )

    def _stray(self, view: ClusterView, queue_id: int, partition: int) -> tuple[str, PartitionRecord] | None:
        """The queue's name and the partition's record when the cached view names another
        leader and no move of it to or from here (ZooKeeper is asked next, by the caller)."""
        name = self.store.queue_name(queue_id)
        qv = view.queues.get(name) if name is not None else None
        rec = qv.partitions.get(partition) if qv is not None else None
        if name is None or rec is None or rec.leader == self.broker_id:
            return None
        move = view.moves.get((name, partition))
        if move is not None and self.broker_id in (move.source, move.target):
            return None
        return name, rec

    def _led_elsewhere(self, queue: str, partition: int) -> bool:
        """ZooKeeper itself (the cache may lag) names another leader, and no move."""
        try:
            raw, _ = self.coord.get(paths.partition(queue, partition))
        except NoNodeError:
            return False
        part = decode(raw, PartitionRecord, paths.partition(queue, partition))
        return part.leader != self.broker_id and self.coord.exists(paths.move(queue, partition)) is None


def _page_of_groups(groups: list[HandedOffGroup], after: int, max_bytes: int) -> HandoffPage:
    """The groups from index ``after + 1`` on, as many as fit in about ``max_bytes`` (one at
    least); ``more`` when some are left."""
    out: list[HandedOffGroup] = []
    size = 0
    i = after + 1
    while i < len(groups):
        n = len(msgspec.msgpack.encode(groups[i]))
        if out and size + n > max_bytes:
            break
        out.append(groups[i])
        size += n
        i += 1
    return HandoffPage([], i < len(groups), groups=out)
