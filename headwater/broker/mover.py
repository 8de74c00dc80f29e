"""A broker's side of moving partitions (``docs/design/cluster.md``, "Moving a partition"),
driven by the moves in its view of the cluster (:mod:`headwater.cluster.moves` drives them
on the controller).

- As a move's **target**, a thread of its own copies the partition from the source with
  FETCH (:mod:`headwater.broker.peer`): it resets its empty partition to where the source's
  log begins, or resumes from its own end offset (a restarted target keeps what it copied),
  appends every batch with ``append_copy`` (which rebuilds the idempotent producers' state),
  flushes, and reports how far it holds the partition in ``/moves/<q>/<n>/progress``.
- As a move's **source** in phase ``fence``, it refuses sends for the partition
  (``NotLeaderError``, retriable), waits for the sends already accepted to be appended,
  flushes, and publishes its final end offset in ``/moves/<q>/<n>/fenced``. A fence is
  lifted only when ZooKeeper itself (not the cache, which may see the move's deletion before
  the partition's new owner) shows the move gone and this broker still leading at the epoch
  it fenced at: a rolled-back move.
- A partition this broker holds data of but neither leads nor copies (a move switched it
  away, or a copy was rolled back) has its data dropped (``delete_before`` its end), once
  ZooKeeper confirms it; the queue stays.
- The partition's state beside its log (``delayed``, :mod:`headwater.broker.delay_moves`): a
  target copied up to the source's fenced end takes the source's delayed batches and shared
  groups' state of the partition before it reports ``delayed_taken`` (which covers both),
  which the switch waits for; stray partitions' batches and shared state are forgotten as
  their data is dropped.

:meth:`Mover.follow` runs on the cluster node's work thread (never a watch's), at each
change of the view and every ``TICK_S``; copies run on their own threads.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from headwater.broker.peer import PeerClient, PeerError
from headwater.cluster.coordination import Coordination, CoordinationError, NodeExistsError, NoNodeError
from headwater.cluster.metadata import ClusterView
from headwater.cluster.records import MoveFenced, MoveProgress, MoveRecord, PartitionRecord, decode, encode, paths
from headwater.errors import HeadwaterError, InvalidArgumentError, NotLeaderError
from headwater.model.batch import decode_header
from headwater.model.cluster import CLUSTER_INTERNAL_QUEUES
from headwater.model.config import is_internal_queue
from headwater.storage.api import Store

if TYPE_CHECKING:
    from headwater.broker.delay_moves import DelayedMoves

__all__ = ["Mover"]

log = logging.getLogger("headwater.cluster")

Key = tuple[str, int]
TICK_S = 1.0  # the moves are looked at again this often, besides at each change
FETCH_BYTES_MAX = 1024 * 1024  # one copy fetch
FETCH_WAIT_MS = 200  # a caught-up copy waits this long at the source for more
PROGRESS_EVERY_S = 0.2  # the target reports its progress at most this often while behind
FENCE_DRAIN_TIMEOUT_S = 30.0  # sends accepted before the fence must be appended by then
RETRY_S = 0.5  # after a failed fetch


class CannotCopyError(PeerError):
    """This broker cannot take the partition at the source's offsets: the move must roll back."""


class Mover:
    """The moves of broker ``broker_id``: ``view`` gives the latest cluster view, ``active``
    whether its session lives, ``schedule`` runs a task on the node's work thread."""

    def __init__(
        self,
        store: Store,
        coord: Coordination,
        broker_id: int,
        view: Callable[[], ClusterView],
        active: Callable[[], bool],
        schedule: Callable[[Callable[[], None]], None],
    ) -> None:
        self.store = store
        self.coord = coord
        self.broker_id = broker_id
        self._view = view
        self._active = active
        self._schedule = schedule
        self._cond = threading.Condition()
        self._fences: dict[Key, int] = {}  # partition -> the leader epoch it was fenced at
        self._sending: Counter[Key] = Counter()  # sends accepted, not yet appended
        self._copies: dict[Key, threading.Thread] = {}
        self._reported: dict[Key, tuple[int, int, bool, float]] = {}  # copied, source end, taken, when
        self.delayed: DelayedMoves | None = None  # set by the cluster node: delayed messages move too
        self._taken: set[Key] = set()  # copies whose source's delayed messages and shared state are adopted here
        self._closed = threading.Event()
        self._ticker = threading.Thread(target=self._tick, name=f"headwater-mover-{broker_id}", daemon=True)

    def start(self) -> None:
        self._ticker.start()

    def close(self) -> None:
        self._closed.set()
        for t in list(self._copies.values()):
            t.join(5)

    def _tick(self) -> None:
        while not self._closed.wait(TICK_S):
            self._schedule(lambda: self.follow(self._view()))

    # -- sends -------------------------------------------------------------------------------

    @contextmanager
    def producing(self, queue: str, partition: int) -> Iterator[None]:
        """Around an append of a send: refuse it while the partition is fenced, and let a
        fence wait for it to be appended."""
        key = (queue, partition)
        with self._cond:
            self._refuse_if_fenced(key, self._view())
            self._sending[key] += 1
        try:
            yield
        finally:
            with self._cond:
                self._sending[key] -= 1
                if self._sending[key] <= 0:
                    del self._sending[key]
                    self._cond.notify_all()

    def moving(self, queue: str, partition: int) -> bool:
        """Whether a move of the partition away from this broker has fenced it here (or the
        view says it is fencing): its shared groups' state is handed over, not acted on."""
        key = (queue, partition)
        if key in self._fences:  # one dict read: no lock (called under the shared groups' lock)
            return True
        move = self._view().moves.get(key)
        return move is not None and move.phase == "fence" and move.source == self.broker_id

    def fenced_epoch(self, queue: str, partition: int) -> int | None:
        """The leader epoch at which this broker fenced the partition for a move, or None."""
        return self._fences.get((queue, partition))  # one dict read: no lock (a watch may hold it)

    def _refuse_if_fenced(self, key: Key, view: ClusterView) -> None:
        epoch = self._fences.get(key)
        now = view.leader_epoch(*key)
        move = view.moves.get(key)
        by_view = move is not None and move.phase == "fence" and move.source == self.broker_id
        if by_view or (epoch is not None and (now is None or now <= epoch)):
            target = f"broker {move.target}" if move is not None else "another broker"
            raise NotLeaderError(
                f"{key[0]}[{key[1]}] is moving from broker {self.broker_id} to {target}: it takes no sends for a "
                f"moment; ask for the cluster's metadata and send to its leader"
            )

    # -- following the view (the node's work thread) ------------------------------------------

    def follow(self, view: ClusterView) -> None:
        if self._closed.is_set() or not self._active():
            return
        for key, move in sorted(view.moves.items()):
            if move.target == self.broker_id and move.phase in ("copy", "fence"):
                self._start_copy(key)
            if move.source == self.broker_id and move.phase == "fence":
                self._fence(key, move)
        for key in list(self._fences):
            if key not in view.moves:
                self._maybe_unfence(key)
        self._drop_strays(view)
        if self.delayed is not None:
            self.delayed.forget_strays(view)

    def _fence(self, key: Key, move: MoveRecord) -> None:
        """Refuse sends, wait for those accepted, flush, publish the end offset (once)."""
        fenced_path = paths.move_fenced(*key)
        if key in self._fences and self.coord.exists(fenced_path) is not None:
            return
        with self._cond:
            self._fences.setdefault(key, move.leader_epoch)
            if not self._cond.wait_for(lambda: self._sending[key] == 0, FENCE_DRAIN_TIMEOUT_S):
                log.warning("sends to %s[%d] still being appended: the fence waits", *key)
                return
        self.store.flush()
        end = self.store.end_offset(*key)
        data = encode(MoveFenced(end_offset=end, leader_epoch=move.leader_epoch, broker_id=self.broker_id))
        try:
            self.coord.create(fenced_path, data)
        except NodeExistsError:
            self.coord.set(fenced_path, data)  # a restarted source publishes the same end again
        except NoNodeError:
            return  # the move is gone: unfenced at the next look if it was rolled back
        log.info("fenced %s[%d] at end offset %d for its move to broker %d", *key, end, move.target)

    def _read_partition(self, key: Key) -> PartitionRecord | None:
        try:
            raw, _ = self.coord.get(paths.partition(*key))
        except NoNodeError:
            return None
        return decode(raw, PartitionRecord, paths.partition(*key))

    def _maybe_unfence(self, key: Key) -> None:
        """Lift the fence if ZooKeeper shows the move gone and this broker leading still at
        the fenced epoch (a rollback); after a switch, the fence stays until the view shows
        the new owner (it then refuses the partition anyway)."""
        if self.coord.exists(paths.move(*key)) is not None:
            return
        part = self._read_partition(key)
        with self._cond:
            epoch = self._fences.get(key)
            if part is None or epoch is None:
                self._fences.pop(key, None)
            elif part.leader == self.broker_id and part.leader_epoch == epoch:
                del self._fences[key]
                log.info("%s[%d] takes sends again: its move was rolled back", *key)
            elif part.leader_epoch > epoch and (self._view().leader_epoch(*key) or 0) > epoch:
                del self._fences[key]  # the view shows the new owner: check_leader refuses now

    def _drop_strays(self, view: ClusterView) -> None:
        """Drop the data of partitions that another broker leads and no move copies here."""
        for name, qv in view.queues.items():
            if is_internal_queue(name) and name not in CLUSTER_INTERNAL_QUEUES:
                continue
            strays = [
                n
                for n, rec in qv.partitions.items()
                if rec.leader != self.broker_id
                and not ((m := view.moves.get((name, n))) is not None and self.broker_id in (m.target, m.source))
                and (name, n) not in self._copies
            ]
            if not strays:
                continue
            try:
                info = self.store.describe_queue(name)
            except HeadwaterError:
                continue
            for p in info.partitions:
                if p.partition in strays and p.end_offset > p.start_offset:
                    self._drop(name, p.partition, p.end_offset)

    def _drop(self, queue: str, partition: int, end: int) -> None:
        part = self._read_partition((queue, partition))  # the cache may lag: ZooKeeper decides
        if part is None or part.leader == self.broker_id or self.coord.exists(paths.move(queue, partition)):
            return
        self.store.delete_before(queue, partition, end)
        log.info("dropped %s[%d] up to offset %d here: broker %d leads it", queue, partition, end, part.leader)

    # -- copying (a thread per move) -------------------------------------------------------------

    def _start_copy(self, key: Key) -> None:
        t = self._copies.get(key)
        if t is not None and t.is_alive():
            return
        t = threading.Thread(target=self._copy, args=(key,), name=f"headwater-copy-{key[0]}-{key[1]}", daemon=True)
        self._copies[key] = t
        t.start()

    def _current(self, key: Key) -> MoveRecord | None:
        move = self._view().moves.get(key)
        ok = move is not None and move.target == self.broker_id and move.phase in ("copy", "fence")
        return move if ok and not self._closed.is_set() else None

    def _copy(self, key: Key) -> None:
        peer: PeerClient | None = None
        try:
            while (move := self._current(key)) is not None:
                try:
                    if peer is None:
                        address = self._view().broker_address(move.source)
                        if address is None:
                            raise PeerError(f"broker {move.source} is not registered")
                        peer = PeerClient(address, name=f"headwater-broker-{self.broker_id}-mover")
                        self._prepare(peer, key)
                    if not self._copy_some(peer, key):
                        return
                except CannotCopyError as e:
                    log.warning("cannot copy %s[%d] from broker %d: %s", *key, move.source, e)
                    self._report(key, 0, 0, error=str(e))  # the controller rolls the move back
                    return
                except (HeadwaterError, CoordinationError, OSError) as e:
                    log.info("copying %s[%d] from broker %d: %s; trying again", *key, move.source, e)
                    if peer is not None:
                        peer.close()
                        peer = None
                    self._closed.wait(RETRY_S)
        except Exception:
            log.exception("copying %s[%d] failed", *key)
        finally:
            if peer is not None:
                peer.close()
            me = threading.current_thread()
            self._reported.pop(key, None)
            self._taken.discard(key)
            self._schedule(lambda: self._forget_copy(key, me))

    def _forget_copy(self, key: Key, thread: threading.Thread) -> None:
        if self._copies.get(key) is thread:
            del self._copies[key]

    def _prepare(self, peer: PeerClient, key: Key) -> None:
        """Make the local partition a prefix of the source's: keep what was copied before if
        it still joins the source's log, else begin again where the source's log begins."""
        queue, n = key
        local = self.store.describe_queue(queue).partitions[n]
        remote = peer.describe_queue(queue).partitions[n]
        if local.end_offset > local.start_offset and remote.start_offset <= local.end_offset <= remote.end_offset:
            return  # resume from our end
        first = peer.fetch(queue, n, remote.start_offset, max_bytes=1)
        begin = decode_header(first.batches[0]).base_offset if first.batches else first.end_offset
        if local.end_offset > local.start_offset:
            self.store.delete_before(queue, n, local.end_offset)
        if local.end_offset > remote.end_offset:
            raise PeerError(
                f"{queue}[{n}] here ends at {local.end_offset}, past the end of broker {peer.address}'s copy "
                f"({remote.end_offset}): it cannot be copied here"
            )
        if begin > local.end_offset:
            self.store.reset_partition(queue, n, begin)
        elif begin < local.end_offset:
            # this broker held the partition before, up to local.end_offset, and dropped it:
            # what it kept of it is served again if the source's log agrees (it was copied from
            # there, or there from here), and the copy goes on from its end; kept nothing, it
            # begins again where the source's log does
            held = local.end_offset
            theirs = peer.fetch(queue, n, held - 1, max_bytes=1).batches
            try:
                self.store.rewind_partition(queue, n, begin, bytes(theirs[0]) if theirs else None)
            except InvalidArgumentError as e:
                raise CannotCopyError(
                    f"it held {queue}[{n}] before, up to offset {held}: {e}; move it to another broker, or "
                    f"here once the source's log starts at {held} or later (retention)"
                ) from None
            log.info("%s[%d]: serving again from offset %d what this broker kept of it", queue, n, begin)

    def _copy_some(self, peer: PeerClient, key: Key) -> bool:
        """One fetch from the source, appended here and reported; False once the move is gone."""
        queue, n = key
        offset = self.store.end_offset(queue, n)
        res = peer.fetch(queue, n, offset, max_bytes=FETCH_BYTES_MAX, max_wait_ms=FETCH_WAIT_MS)
        for raw in res.batches:
            h = decode_header(raw)
            if h.base_offset + h.count <= offset:
                continue  # the source's batch began before where we asked
            self.store.append_copy(queue, n, bytes(raw), h.base_offset)
            offset = h.base_offset + h.count
        if not res.batches and res.next_offset > offset:  # the source skipped expired batches
            self.store.delete_before(queue, n, offset)
            self.store.reset_partition(queue, n, res.next_offset)
            offset = res.next_offset
        if res.batches:
            self.store.flush()  # what is reported copied must survive a crash of this broker
        return self._report(key, offset, res.end_offset, taken=self._state_taken(peer, key, offset))

    def _state_taken(self, peer: PeerClient, key: Key, copied: int) -> bool:
        """Whether the source's delayed messages and shared groups' state of the partition
        are adopted here: taken once the source has fenced and this copy reached its fenced
        end (nothing changes there after that), and again by a target that restarted."""
        if self.delayed is None or key in self._taken:
            return True
        move = self._current(key)
        if move is None or move.phase != "fence":
            return False
        try:
            raw, _ = self.coord.get(paths.move_fenced(*key))
        except NoNodeError:
            return False
        fenced = decode(raw, MoveFenced, paths.move_fenced(*key))
        if copied < fenced.end_offset or fenced.leader_epoch != move.leader_epoch:
            return False
        self.delayed.take(peer, key[0], key[1], move.leader_epoch)
        self._taken.add(key)
        return True

    def _report(self, key: Key, copied: int, source_end: int, *, taken: bool = False, error: str = "") -> bool:
        now = time.monotonic()
        last = self._reported.get(key)
        if (
            not error
            and last is not None
            and (last[:3] == (copied, source_end, taken) or (copied < source_end and now - last[3] < PROGRESS_EVERY_S))
        ):
            return True
        data = encode(
            MoveProgress(
                copied_offset=copied,
                source_end_offset=source_end,
                updated_ms=int(time.time() * 1000),
                error=error,
                delayed_taken=taken,
            )
        )
        path = paths.move_progress(*key)
        try:
            try:
                self.coord.set(path, data)
            except NoNodeError:
                self.coord.create(path, data)  # never makepath: a move that is gone stays gone
        except NoNodeError:
            return False
        self._reported[key] = (copied, source_end, taken, now)
        return True
