"""The controller: one broker of the cluster, elected through the coordination service, and
the epoch that fences everything it writes (``docs/design/cluster.md``, Kafka's KAFKA-6082).

Election: while ``/controller`` is absent, a candidate reads ``/controller_epoch`` (the epoch
as a decimal integer) and tries one transaction: create ``/controller`` (ephemeral, naming
itself and epoch + 1) and set ``/controller_epoch`` to epoch + 1 at the version it read.
One candidate wins; the others fail the create or the set, which is the normal way to lose.

The fence: the winner's :class:`ControllerContext` knows the version its set produced, and
every later write of that controller is a transaction that first checks ``/controller_epoch``
is still at that version. A controller that was paused, or whose session expired, while
another was elected, finds the version moved: its write applies nothing
(:class:`ControllerFencedError`), whatever it still believes.

Threads: the coordination's threads deliver watches and session events; they only record
what they saw, fence at once on evidence of a newer controller, and wake the election's own
thread. That thread reads the tree again and decides (level-triggered, so stale or coalesced
events do no harm), and runs ``on_elected`` and ``on_resigned``.
"""

from __future__ import annotations

import logging
import re
import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Literal

import msgspec

from headwater.cluster.coordination import (
    Check,
    Coordination,
    CoordinationError,
    Create,
    NodeExistsError,
    NoNodeError,
    Op,
    SessionLostError,
    SessionState,
    Set,
    Stat,
    TransactionFailedError,
)
from headwater.cluster.records import ControllerRecord, RecordError, encode, paths

__all__ = ["ControllerContext", "ControllerElection", "ControllerFencedError", "parse_controller_epoch"]

log = logging.getLogger("headwater.controller")

CLOSE_TIMEOUT_S = 30.0  # how long close() waits for a running on_elected/on_resigned to return
_EPOCH_RE = re.compile(rb"[0-9]{1,18}")


class ControllerFencedError(CoordinationError):
    """A controller's write was refused: a newer controller was elected since (the controller
    epoch moved), or this one resigned. It must stop acting as the controller."""


def parse_controller_epoch(data: bytes) -> int:
    """``/controller_epoch``'s data as the epoch, or :class:`RecordError` naming the node."""
    if _EPOCH_RE.fullmatch(data) is None:
        raise RecordError(
            f"{paths.CONTROLLER_EPOCH} holds {data[:40]!r}, not a controller epoch (a decimal integer); "
            f"no controller can be elected until it is repaired: set it (zkCli.sh) to the highest epoch "
            f"the cluster has used",
            paths.CONTROLLER_EPOCH,
        )
    return int(data)


class ControllerContext:
    """What one election won: the controller ``epoch``, and :meth:`commit`, the only way the
    controller should write. Once fenced (a write found the epoch moved, or the election
    resigned), it refuses every write at once."""

    def __init__(self, coord: Coordination, epoch: int, epoch_version: int, session_id: int) -> None:
        self.epoch = epoch
        self._coord = coord
        self._epoch_version = epoch_version  # /controller_epoch's version after our election's set
        self.session_id = session_id  # the session that won; /controller is ours only if it holds it
        self._fenced = False  # a bool flips atomically; a commit in flight is fenced by ZooKeeper
        self._on_fenced: Callable[[], None] = lambda: None  # tells the election, to resign

    @property
    def fenced(self) -> bool:
        return self._fenced

    def _fence(self) -> None:
        self._fenced = True

    def _refusal(self) -> ControllerFencedError:
        return ControllerFencedError(
            f"controller epoch {self.epoch} is fenced: a newer controller was elected or this one "
            f"resigned; stop acting as the controller and wait for on_elected",
            paths.CONTROLLER_EPOCH,
        )

    def commit(self, ops: Sequence[Op]) -> None:
        """Apply ``ops`` all or nothing, only while this controller's epoch is the newest.

        Raises :class:`ControllerFencedError` (and fences this context) if it is not; a
        :class:`TransactionFailedError` of the caller's own ops has ``index`` counted in
        ``ops``; :class:`SessionLostError` when the session is not connected (the session may
        come back: the context is not fenced by that alone).
        """
        if self._fenced:
            raise self._refusal()
        try:
            self._coord.commit([Check(paths.CONTROLLER_EPOCH, self._epoch_version), *ops])
        except TransactionFailedError as e:
            if e.index == 0:
                self._fence()
                self._on_fenced()
                raise self._refusal() from e
            raise TransactionFailedError(e.index - 1, e.cause) from e


_Kind = Literal["elected", "resigned"]


class ControllerElection:
    """This broker's candidacy for controller, on one coordination session.

    ``on_elected(ctx)`` is called when this broker becomes the controller, ``on_resigned()``
    when it stops being it (its session was lost, ``/controller`` shows another broker or
    epoch, its context was fenced, or :meth:`close`); by then ``ctx`` is fenced. Both are
    called from one thread of the election's, in order, never from the coordination's threads,
    so a slow callback delays no watch; each ``on_elected`` is followed by exactly one
    ``on_resigned``, and an election lost before its ``on_elected`` ran is told to neither.
    Epochs only grow, so ``on_elected`` is never called for an epoch older than one already
    resigned. The callbacks may call :meth:`close`. The same thread then reads the tree again,
    so a slow callback delays this broker's next candidacy, never its fence: a lost session or
    a newer controller fences the context on the coordination's thread at once.

    ``/controller_epoch`` must never be deleted while a cluster runs: made again from "0", its
    versions would repeat, and an old controller's check could pass again.

    After a lost session and a new one, the broker is a candidate again. One election per
    session, ever: two elections on one session would each take the other's ``/controller``
    for its own (not supported); a restarted candidate uses a new session.

    Example (``coord`` a :class:`~headwater.cluster.zookeeper.ZooKeeperCoordination`)::

        election = ControllerElection(coord, broker_id, on_elected=run_controller, on_resigned=stop)
        election.start()
        ...
        election.close()  # another broker is elected now
    """

    def __init__(
        self,
        coord: Coordination,
        broker_id: int,
        *,
        on_elected: Callable[[ControllerContext], None],
        on_resigned: Callable[[], None],
        close_timeout_s: float = CLOSE_TIMEOUT_S,
    ) -> None:
        self._coord = coord
        self.broker_id = broker_id
        self._on_elected = on_elected
        self._on_resigned = on_resigned
        self._close_timeout_s = close_timeout_s
        self._cond = threading.Condition()
        self._ctx: ControllerContext | None = None  # the context we lead with, unfenced
        self._controller: ControllerRecord | None = None
        self._dirty = False  # the tree may have changed: read it again and decide
        self._started = self._closed = False
        # at most: the resignation of the context whose on_elected ran, and the next election
        # (a context resigned before its on_elected ran leaves the queue with it)
        self._callbacks: deque[tuple[_Kind, ControllerContext]] = deque()
        self._thread = threading.Thread(target=self._run, name=f"headwater-controller-{broker_id}", daemon=True)

    @property
    def controller(self) -> ControllerRecord | None:
        """The controller last seen at ``/controller`` (None while absent or unreadable)."""
        return self._controller

    def start(self) -> None:
        """Become a candidate. Raises :class:`RecordError` if ``/controller_epoch`` holds no
        epoch (it is not overwritten: a wrong epoch would unfence an old controller)."""
        with self._cond:
            if self._started or self._closed:
                raise RuntimeError("a ControllerElection starts once; make a new one on a new session")
            self._started = True
        self._read_epoch()
        self._coord.on_session(self._on_session)
        self._thread.start()
        self._coord.watch_data(paths.CONTROLLER, self._on_controller)
        # an election refused for a garbage epoch stands again once an operator repairs it
        self._coord.watch_data(paths.CONTROLLER_EPOCH, self._on_epoch)

    def close(self) -> None:
        """Resign (if leading) and stop being a candidate. ``/controller`` is deleted if this
        session holds it, so another broker is elected now rather than after the session
        timeout. Waits for the callbacks to finish (up to ``close_timeout_s``)."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            ctx = self._resign_locked("the election is closed")
            self._cond.notify_all()
        if ctx is not None:
            self._release(ctx)
        if self._thread.ident is not None and threading.current_thread() is not self._thread:
            self._thread.join(self._close_timeout_s)
            if self._thread.is_alive():
                log.warning("controller callbacks of broker %d still run after close", self.broker_id)

    # -- on the coordination's threads: record, fence on evidence, wake the election -------

    def _on_session(self, state: SessionState) -> None:
        with self._cond:
            if self._closed:
                return
            ctx = self._ctx
            # LOST is told once the session is gone; a context of the session now live was
            # won after it (events may come late) and stands until the tree says otherwise
            if state is SessionState.LOST and ctx is not None and ctx.session_id != self._coord.session_id:
                self._resign_locked("its session was lost")
            if state is not SessionState.SUSPENDED:
                self._kick_locked()

    def _on_controller(self, data: bytes | None, stat: Stat | None) -> None:
        with self._cond:
            if self._closed:
                return
            ctx = self._ctx
            if ctx is not None and data is not None:
                record = self._decode(data, quiet=True)
                if record is not None and record.epoch > ctx.epoch:
                    self._resign_locked(f"broker {record.broker_id} controls at epoch {record.epoch}")
            self._kick_locked()

    def _on_epoch(self, data: bytes | None, stat: Stat | None) -> None:
        with self._cond:
            if not self._closed:
                self._kick_locked()

    def _kick_locked(self) -> None:
        self._dirty = True
        self._cond.notify_all()

    def _resign_locked(self, why: str) -> ControllerContext | None:
        """Fence the context we lead with and queue its on_resigned; the context, if any."""
        ctx, self._ctx = self._ctx, None
        if ctx is None:
            return None
        ctx._fence()
        log.info("broker %d resigns as controller at epoch %d: %s", self.broker_id, ctx.epoch, why)
        if ("elected", ctx) in self._callbacks:
            self._callbacks.remove(("elected", ctx))
        else:
            self._callbacks.append(("resigned", ctx))
        self._cond.notify_all()
        return ctx

    # -- on the election's thread ------------------------------------------------------------

    def _run(self) -> None:
        """Callbacks first, in order; then, once the tree may have changed, one decision."""
        while True:
            with self._cond:
                while not (self._callbacks or self._dirty or self._closed):
                    self._cond.wait()
                callback = self._callbacks.popleft() if self._callbacks else None
                if callback is None and self._closed:
                    return
                self._dirty = self._dirty and callback is not None
            if callback is None:
                self._evaluate()
            else:
                self._call(*callback)

    def _call(self, kind: _Kind, ctx: ControllerContext) -> None:
        try:
            if kind == "elected":
                self._on_elected(ctx)
            else:
                self._on_resigned()
        except Exception:
            log.exception("on_%s of broker %d (controller epoch %d) failed", kind, self.broker_id, ctx.epoch)

    def _evaluate(self) -> None:
        try:
            self._decide()
        except SessionLostError as e:
            log.debug("broker %d's election waits for its session: %s", self.broker_id, e)
        except RecordError as e:
            log.error("broker %d cannot stand for controller: %s", self.broker_id, e)
        except CoordinationError as e:  # unexpected: the next change of /controller tries again
            log.warning("broker %d's election failed: %s", self.broker_id, e)

    def _decide(self) -> None:
        """Read /controller and act: stand while it is absent, keep leading while it names
        our context, resign otherwise."""
        try:
            data, stat = self._coord.get(paths.CONTROLLER)
        except NoNodeError:
            with self._cond:
                if self._closed:
                    return
                self._controller = None
                self._resign_locked(f"{paths.CONTROLLER} is gone")
            self._stand()
            return
        record = self._decode(data, quiet=False)
        with self._cond:
            if self._closed:
                return
            self._controller = record
            ctx = self._ctx
            if ctx is not None and not ctx.fenced and self._names(ctx, record, stat):
                return
            self._resign_locked(f"{paths.CONTROLLER} names {record or 'something unreadable'}")
        if record is not None and record.broker_id == self.broker_id and stat.ephemeral_owner == self._coord.session_id:
            # ours, yet no context of ours leads by it (it was fenced): free it for an election
            self._delete_if_ours(record, stat)

    def _names(self, ctx: ControllerContext, record: ControllerRecord | None, stat: Stat) -> bool:
        return (
            record is not None
            and record.broker_id == self.broker_id
            and record.epoch == ctx.epoch
            and stat.ephemeral_owner == ctx.session_id
        )

    def _stand(self) -> None:
        """One try at the election: lose quietly, or lead with a new context."""
        session_id = self._coord.session_id
        epoch, version = self._read_epoch()
        record = ControllerRecord(broker_id=self.broker_id, epoch=epoch + 1)
        try:
            self._coord.commit(
                [
                    Create(paths.CONTROLLER, encode(record), ephemeral=True),
                    Set(paths.CONTROLLER_EPOCH, str(epoch + 1).encode(), version=version),
                ]
            )
        except TransactionFailedError as e:
            log.debug("broker %d lost the election for epoch %d: %s", self.broker_id, epoch + 1, e)
            if e.index == 1:  # the epoch moved under us: /controller may be gone again already
                with self._cond:
                    self._kick_locked()
            return
        ctx = ControllerContext(self._coord, epoch + 1, version + 1, session_id)
        ctx._on_fenced = self._kick
        with self._cond:
            if not self._closed:
                log.info("broker %d is the controller at epoch %d", self.broker_id, ctx.epoch)
                self._ctx, self._controller = ctx, record
                self._callbacks.append(("elected", ctx))
                self._cond.notify_all()
                return
        ctx._fence()  # closed while we stood: let the others elect at once
        self._release(ctx)

    def _kick(self) -> None:
        with self._cond:
            self._kick_locked()

    def _read_epoch(self) -> tuple[int, int]:
        """``/controller_epoch`` as (epoch, version), made "0" if absent (with its parents)."""
        try:
            data, stat = self._coord.get(paths.CONTROLLER_EPOCH)
        except NoNodeError:
            try:
                self._coord.create(paths.CONTROLLER_EPOCH, b"0", makepath=True)
            except NodeExistsError:
                pass  # another candidate made it first
            data, stat = self._coord.get(paths.CONTROLLER_EPOCH)
        return parse_controller_epoch(data), stat.version

    def _decode(self, data: bytes, *, quiet: bool) -> ControllerRecord | None:
        try:
            return msgspec.json.decode(data, type=ControllerRecord)
        except msgspec.DecodeError as e:
            if not quiet:
                log.warning(
                    "%s holds %r, not a controller record: taken as held; waiting for it to go (%s)",
                    paths.CONTROLLER,
                    data[:80],
                    e,
                )
            return None

    def _release(self, ctx: ControllerContext) -> None:
        """Delete /controller if it still names ``ctx`` under this session."""
        try:
            data, stat = self._coord.get(paths.CONTROLLER)
            record = self._decode(data, quiet=True)
            if record is not None and record.broker_id == self.broker_id and record.epoch == ctx.epoch:
                if stat.ephemeral_owner == self._coord.session_id:
                    self._delete_if_ours(record, stat)
        except NoNodeError:
            pass
        except CoordinationError as e:  # the session's end will remove it
            log.info("broker %d could not release %s: %s", self.broker_id, paths.CONTROLLER, e)

    def _delete_if_ours(self, record: ControllerRecord, stat: Stat) -> None:
        try:
            self._coord.delete(paths.CONTROLLER, version=stat.version)
            log.info("broker %d released %s at epoch %d", self.broker_id, paths.CONTROLLER, record.epoch)
        except CoordinationError as e:  # gone or rewritten since: nothing of ours to release
            log.debug("broker %d did not release %s: %s", self.broker_id, paths.CONTROLLER, e)
