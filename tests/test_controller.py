"""The controller's election and its epoch fence (``headwater.cluster.controller``), on a real
ZooKeeper and on the in-memory ensemble: the same tests, as the coordination contract runs.
A session is expired for real on ZooKeeper (another client takes it over and closes it)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from headwater.cluster.controller import ControllerContext, ControllerElection, ControllerFencedError
from headwater.cluster.coordination import Coordination, Create, SessionLostError, Set
from headwater.cluster.records import ControllerRecord, RecordError, decode, encode, paths

COUNTER = "/counter"


def eventually(check: Callable[[], bool], timeout_s: float = 20.0, what: str = "the condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"{what} did not come about in time"
        time.sleep(0.02)


@dataclass
class Candidate:
    """An election and what its callbacks told, in order."""

    coord: Coordination
    broker_id: int
    told: list[tuple[str, int]] = field(default_factory=list)  # ("elected"|"resigned", epoch)
    contexts: list[ControllerContext] = field(default_factory=list)
    election: ControllerElection | None = None

    def start(self, **kwargs: Any) -> Candidate:
        self.election = ControllerElection(
            self.coord, self.broker_id, on_elected=self._elected, on_resigned=self._resigned, **kwargs
        )
        self.election.start()
        return self

    def _elected(self, ctx: ControllerContext) -> None:
        self.contexts.append(ctx)
        self.told.append(("elected", ctx.epoch))

    def _resigned(self) -> None:
        self.told.append(("resigned", self.contexts[-1].epoch))

    @property
    def leading(self) -> ControllerContext | None:
        """The context of an on_elected not yet followed by on_resigned."""
        return self.contexts[-1] if self.told and self.told[-1][0] == "elected" else None

    def close(self) -> None:
        assert self.election is not None
        self.election.close()


def controller_record(c: Coordination) -> ControllerRecord | None:
    stat = c.exists(paths.CONTROLLER)
    return None if stat is None else decode(c.get(paths.CONTROLLER)[0], ControllerRecord, paths.CONTROLLER)


def one_leader(cands: list[Candidate], observer: Coordination) -> Candidate | None:
    """The one candidate that leads, if exactly one does and /controller names its context."""
    leaders = [c for c in cands if c.leading is not None]
    record = controller_record(observer)
    if len(leaders) != 1 or record is None:
        return None
    ctx = leaders[0].leading
    assert ctx is not None
    ok = record == ControllerRecord(broker_id=leaders[0].broker_id, epoch=ctx.epoch) and not ctx.fenced
    return leaders[0] if ok else None


def wait_for_leader(cands: list[Candidate], observer: Coordination) -> Candidate:
    found: list[Candidate | None] = [None]

    def check() -> bool:
        found[0] = one_leader(cands, observer)
        return found[0] is not None

    eventually(check, what="a controller")
    assert found[0] is not None
    return found[0]


def test_one_of_three_candidates_is_elected_and_the_others_see_it(service):
    observer = service.connect()
    cands = [Candidate(service.connect(), b).start() for b in (1, 2, 3)]
    leader = wait_for_leader(cands, observer)
    assert leader.told == [("elected", 1)]
    assert observer.get(paths.CONTROLLER_EPOCH)[0] == b"1"
    assert observer.exists(paths.CONTROLLER).ephemeral_owner == leader.coord.session_id
    record = ControllerRecord(broker_id=leader.broker_id, epoch=1)
    for c in cands:
        eventually(lambda c=c: c.election.controller == record, what="every candidate seeing the controller")
    assert [c.told for c in cands if c is not leader] == [[], []]
    leader.leading.commit([Create(COUNTER, b"1:1")])
    assert observer.get(COUNTER)[0] == b"1:1"


def test_close_elects_another_at_once_and_the_epoch_grows(service):
    observer = service.connect()
    cands = [Candidate(service.connect(), b).start() for b in (1, 2, 3)]
    for epoch in (1, 2, 3):
        leader = wait_for_leader(cands, observer)
        ctx = leader.leading
        assert ctx.epoch == epoch
        leader.close()  # its session stays open: the node goes because close deletes it
        assert leader.told[-2:] == [("elected", epoch), ("resigned", epoch)] and ctx.fenced
        record = controller_record(observer)
        assert record is None or record.broker_id != leader.broker_id
        with pytest.raises(ControllerFencedError, match=f"controller epoch {epoch} is fenced"):
            ctx.commit([Create(COUNTER)])
        cands.remove(leader)
        if not cands:
            break
    assert observer.get(paths.CONTROLLER_EPOCH)[0] == b"3" and observer.exists(COUNTER) is None


class CountingCoordination:
    """A session that counts the transactions it is asked for and can run a hook first."""

    def __init__(self, inner: Coordination) -> None:
        self.inner = inner
        self.commits = 0
        self.before_commit: Callable[[list[Any]], None] = lambda ops: None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    @property
    def session_id(self) -> int:
        return self.inner.session_id

    def commit(self, ops) -> None:
        self.commits += 1
        self.before_commit(list(ops))
        self.inner.commit(ops)


def test_a_controller_whose_session_expired_changes_nothing(service):
    observer = service.connect()
    first = Candidate(CountingCoordination(service.connect()), 1).start()
    second = Candidate(service.connect(), 2).start()
    cands = [first, second]
    wait_for_leader(cands, observer)
    if second.leading is not None:  # make broker 1 the controller
        second.close()
        cands = [first, Candidate(service.connect(), 3).start()]
        wait_for_leader(cands, observer)
    old = first.leading
    old.commit([Create(COUNTER, f"{old.epoch}:1".encode())])

    old_session = first.coord.session_id
    service.expire(first.coord.inner)
    newer = wait_for_leader(cands, observer)
    eventually(lambda: first.coord.session_id not in (0, old_session), what="broker 1's new session")
    assert newer.leading.epoch == old.epoch + 1
    assert first.told[:2] == [("elected", old.epoch), ("resigned", old.epoch)] and old.fenced
    with pytest.raises(ControllerFencedError):  # it heard of the expiry: refused at once
        old.commit([Set(COUNTER, f"{old.epoch}:2".encode())])
    # a paused controller that heard nothing yet: the same context, unfenced, on the live session
    sent = CountingCoordination(first.coord.inner)
    paused = ControllerContext(sent, old.epoch, old._epoch_version, first.coord.session_id)
    with pytest.raises(ControllerFencedError, match=f"controller epoch {old.epoch} is fenced"):
        paused.commit([Set(COUNTER, f"{old.epoch}:2".encode())])
    assert paused.fenced and sent.commits == 1
    with pytest.raises(ControllerFencedError):  # refused at once: nothing is sent
        paused.commit([Set(COUNTER, f"{old.epoch}:3".encode())])
    assert sent.commits == 1
    assert observer.get(COUNTER)[0] == f"{old.epoch}:1".encode()
    newer.leading.commit([Set(COUNTER, f"{newer.leading.epoch}:2".encode())])
    assert observer.get(COUNTER)[0] == f"{old.epoch + 1}:2".encode()


def test_a_lone_candidate_stands_again_after_its_session_is_lost(service):
    observer = service.connect()
    only = Candidate(service.connect(), 7).start()
    wait_for_leader([only], observer)
    service.expire(only.coord)
    eventually(lambda: only.told == [("elected", 1), ("resigned", 1), ("elected", 2)], what="a new election")
    assert controller_record(observer) == ControllerRecord(broker_id=7, epoch=2)
    assert only.contexts[0].fenced and not only.contexts[1].fenced


def test_garbage_in_controller_epoch_is_refused_not_overwritten(service, caplog):
    observer = service.connect()
    observer.create(paths.CONTROLLER_EPOCH, b"banana", makepath=True)
    cand = Candidate(service.connect(), 1)
    with pytest.raises(RecordError, match=r"/controller_epoch holds b'banana', not a controller epoch") as e:
        cand.start()
    assert e.value.path == paths.CONTROLLER_EPOCH
    cand.close()
    assert observer.get(paths.CONTROLLER_EPOCH)[0] == b"banana" and observer.exists(paths.CONTROLLER) is None

    # while running: the next election is refused, and happens once the node is repaired
    observer.set(paths.CONTROLLER_EPOCH, b"41")
    cands = [Candidate(service.connect(), b).start() for b in (1, 2)]
    leader = wait_for_leader(cands, observer)
    assert leader.leading.epoch == 42
    observer.set(paths.CONTROLLER_EPOCH, b"-3")
    caplog.set_level(logging.ERROR, logger="headwater.controller")
    leader.close()
    cands.remove(leader)
    eventually(lambda: "/controller_epoch holds b'-3'" in caplog.text, what="the refusal")
    assert cands[0].told == [] and observer.exists(paths.CONTROLLER) is None
    observer.set(paths.CONTROLLER_EPOCH, b"42")  # repaired: the election stands again
    assert wait_for_leader(cands, observer).leading.epoch == 43


def test_garbage_in_controller_is_taken_as_held(service, caplog):
    caplog.set_level(logging.WARNING, logger="headwater.controller")
    observer = service.connect()
    observer.create(paths.CONTROLLER, b"junk", makepath=True)
    cand = Candidate(service.connect(), 1).start()
    eventually(lambda: "/controller holds b'junk', not a controller record" in caplog.text, what="the warning")
    assert cand.told == [] and cand.election.controller is None
    assert observer.get(paths.CONTROLLER)[0] == b"junk"
    observer.delete(paths.CONTROLLER)
    assert wait_for_leader([cand], observer).told == [("elected", 1)]


def test_a_session_expired_in_the_middle_of_the_election(service):
    observer = service.connect()
    coord = CountingCoordination(service.connect())
    expired = threading.Event()

    def expire_first(ops) -> None:
        if not expired.is_set() and any(type(op) is Create and op.path == paths.CONTROLLER for op in ops):
            expired.set()
            service.expire(coord.inner)

    coord.before_commit = expire_first
    cand = Candidate(coord, 1).start()
    leader = wait_for_leader([cand], observer)
    assert expired.is_set()
    ctx = leader.leading
    assert all(c.fenced for c in cand.contexts[:-1])
    assert controller_record(observer) == ControllerRecord(broker_id=1, epoch=ctx.epoch)
    assert observer.exists(paths.CONTROLLER).ephemeral_owner == coord.session_id
    ctx.commit([Create(COUNTER, f"{ctx.epoch}:1".encode())])
    assert observer.get(COUNTER)[0] == f"{ctx.epoch}:1".encode()


def test_close_while_electing_leaves_no_controller_behind(service):
    observer = service.connect()
    coord = CountingCoordination(service.connect())
    entered, release = threading.Event(), threading.Event()

    def hold(ops) -> None:
        entered.set()
        assert release.wait(20)

    coord.before_commit = hold
    cand = Candidate(coord, 1).start()
    assert entered.wait(20)
    closing = threading.Thread(target=cand.close)
    closing.start()
    eventually(lambda: cand.election._closed, what="close to begin")
    release.set()
    closing.join(20)
    assert not closing.is_alive()
    assert observer.get(paths.CONTROLLER_EPOCH)[0] == b"1"  # it won, after close began
    assert cand.told == [] and observer.exists(paths.CONTROLLER) is None  # and let go at once
    other = Candidate(service.connect(), 2).start()
    assert wait_for_leader([other], observer).leading.epoch == 2


def test_a_slow_on_elected_delays_no_resignation(service):
    observer = service.connect()
    in_callback, release = threading.Event(), threading.Event()
    contexts: list[ControllerContext] = []
    told: list[str] = []

    def slow_elected(ctx: ControllerContext) -> None:
        contexts.append(ctx)
        in_callback.set()
        assert release.wait(20)
        told.append(f"elected {ctx.epoch}")

    coord = service.connect()
    election = ControllerElection(coord, 1, on_elected=slow_elected, on_resigned=lambda: told.append("resigned"))
    election.start()
    assert in_callback.wait(20)
    service.expire(coord)  # the LOST event reaches the election while on_elected still runs
    eventually(lambda: contexts[0].fenced, what="the fence")
    with pytest.raises(ControllerFencedError):
        contexts[0].commit([Create(COUNTER)])
    release.set()
    eventually(lambda: told[:2] == ["elected 1", "resigned"], what="the callbacks, in order")
    eventually(lambda: controller_record(observer) == ControllerRecord(broker_id=1, epoch=2), what="epoch 2")
    election.close()
    assert observer.exists(COUNTER) is None


def test_start_twice_is_refused(service):
    cand = Candidate(service.connect(), 1).start()
    with pytest.raises(RuntimeError, match="starts once"):
        cand.election.start()


def test_a_controller_on_a_closed_session_writes_nothing(service):
    observer = service.connect()
    cand = Candidate(service.connect(), 1).start()
    ctx = wait_for_leader([cand], observer).leading
    cand.coord.close()
    with pytest.raises((SessionLostError, ControllerFencedError)):
        ctx.commit([Create(COUNTER, encode(ControllerRecord(broker_id=1, epoch=1)))])
    assert observer.exists(COUNTER) is None
