"""Changes to a cluster's queues (``headwater.cluster.admin``): asked by any broker, made by the
controller in one transaction with its answer. On the in-memory ensemble, with a real
election; the brokers' side runs on real brokers in tests/test_cluster_queues.py."""

from __future__ import annotations

import threading
import time

import msgspec
import pytest

from headwater.cluster.admin import FIRST_QUEUE_ID, AdminHandler, ask
from headwater.cluster.controller import ControllerContext, ControllerElection, ControllerFencedError
from headwater.cluster.metadata import MetadataCache
from headwater.cluster.records import (
    AdminRequest,
    BrokerRecord,
    ControllerRecord,
    PartitionRecord,
    QueueRecord,
    decode,
    encode,
    paths,
)
from headwater.errors import InvalidArgumentError, QueueExistsError, QueueNotFoundError, UnavailableError
from headwater.model.config import QueueConfig
from headwater.testing.coordination import MemoryEnsemble


class Controller:
    """One broker's controller part: elected, its cache, its handler answering on a thread."""

    def __init__(self, ensemble: MemoryEnsemble, broker_id: int) -> None:
        self.coord = ensemble.connect()
        if self.coord.exists(paths.BROKERS) is None:
            self.coord.create(paths.BROKERS)
        record = BrokerRecord(broker_id=broker_id, host="h", port=broker_id, version="t", started_ms=0, store_id="s")
        self.coord.create(paths.broker(broker_id), encode(record), ephemeral=True)
        self.cache = MetadataCache(self.coord)
        self.cache.start()
        self.handler = AdminHandler(self.coord, lambda: self.cache.view)
        self.ctx: ControllerContext | None = None
        self.elected = threading.Event()
        self.election = ControllerElection(self.coord, broker_id, on_elected=self._on, on_resigned=lambda: None)
        self.election.start()

    def _on(self, ctx: ControllerContext) -> None:
        self.ctx = ctx
        self.elected.set()

    def answer(self) -> None:
        assert self.ctx is not None
        self.handler.handle_all(self.ctx)


def _controller(coord) -> ControllerRecord:
    return decode(coord.get(paths.CONTROLLER)[0], ControllerRecord, paths.CONTROLLER)


def _request(op: str, queue: str, **kw) -> AdminRequest:
    return AdminRequest(op=op, queue=queue, asked_by=9, asked_ms=0, **kw)


def _ask_answered(ensemble: MemoryEnsemble, ctl: Controller, request: AdminRequest):
    """Ask from another broker's session while the controller answers."""
    asker = ensemble.connect()
    stop = threading.Event()

    def answering() -> None:
        while not stop.is_set():
            ctl.answer()
            time.sleep(0.01)

    t = threading.Thread(target=answering, daemon=True)
    t.start()
    try:
        return ask(asker, request, timeout_s=5)
    finally:
        stop.set()
        t.join()


@pytest.fixture
def cluster():
    ensemble = MemoryEnsemble()
    brokers = [Controller(ensemble, i) for i in (1, 2, 3)]
    deadline = time.monotonic() + 5
    while not any(b.elected.is_set() for b in brokers):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    ctl = next(b for b in brokers if b.elected.is_set())
    ctl.cache.wait_for(lambda v: len(v.brokers) == 3, 5)
    return ensemble, ctl


def _config(partitions: int) -> dict:
    return msgspec.to_builtins(QueueConfig(partitions=partitions))


def test_a_queue_is_created_placed_over_every_broker_with_a_cluster_id(cluster):
    ensemble, ctl = cluster
    answer = _ask_answered(ensemble, ctl, _request("create_queue", "orders", config=_config(6)))
    assert answer.code == 0 and answer.queue_id == FIRST_QUEUE_ID and answer.controller_epoch == ctl.ctx.epoch
    coord = ensemble.connect()
    record = decode(coord.get(paths.queue("orders"))[0], QueueRecord, "")
    assert record.queue_id == FIRST_QUEUE_ID and record.config["partitions"] == 6
    leaders = [decode(coord.get(paths.partition("orders", n))[0], PartitionRecord, "").leader for n in range(6)]
    assert sorted(leaders) == [1, 1, 2, 2, 3, 3]  # two each
    assert coord.children(paths.REQUESTS) == []  # the asker removed its answered request
    second = _ask_answered(ensemble, ctl, _request("create_queue", "audit", config=_config(1)))
    assert second.queue_id == FIRST_QUEUE_ID + 1


def test_refusals_come_back_as_the_errors_they_are(cluster):
    ensemble, ctl = cluster
    _ask_answered(ensemble, ctl, _request("create_queue", "orders", config=_config(2)))
    with pytest.raises(QueueExistsError, match="'orders' already exists"):
        _ask_answered(ensemble, ctl, _request("create_queue", "orders", config=_config(2)))
    with pytest.raises(QueueNotFoundError, match="'nope' does not exist"):
        _ask_answered(ensemble, ctl, _request("delete_queue", "nope"))
    with pytest.raises(InvalidArgumentError, match="has 2 partitions; add_partitions takes a larger total"):
        _ask_answered(ensemble, ctl, _request("add_partitions", "orders", partitions=2))
    with pytest.raises(InvalidArgumentError, match="partitions"):
        _ask_answered(ensemble, ctl, _request("create_queue", "bad", config={"partitions": 0}))
    with pytest.raises(InvalidArgumentError, match="unknown cluster request"):
        _ask_answered(ensemble, ctl, _request("explode", "orders"))
    assert ensemble.connect().exists(paths.queue("bad")) is None


def test_a_queue_grows_and_is_deleted_whole(cluster):
    ensemble, ctl = cluster
    _ask_answered(ensemble, ctl, _request("create_queue", "orders", config=_config(3)))
    _ask_answered(ensemble, ctl, _request("add_partitions", "orders", partitions=5))
    coord = ensemble.connect()
    assert coord.children(paths.partitions("orders")) == ["0", "1", "2", "3", "4"]
    assert decode(coord.get(paths.queue("orders"))[0], QueueRecord, "").config["partitions"] == 5
    _ask_answered(ensemble, ctl, _request("delete_queue", "orders"))
    assert coord.exists(paths.queue("orders")) is None


def test_a_queue_is_disabled_and_enabled_in_its_record(cluster):
    ensemble, ctl = cluster
    _ask_answered(ensemble, ctl, _request("create_queue", "orders", config=_config(2)))
    coord = ensemble.connect()
    assert decode(coord.get(paths.queue("orders"))[0], QueueRecord, "").enabled
    _ask_answered(ensemble, ctl, _request("set_enabled", "orders", enabled=False))
    _ask_answered(ensemble, ctl, _request("set_enabled", "orders", enabled=False))  # again: no change
    assert not decode(coord.get(paths.queue("orders"))[0], QueueRecord, "").enabled
    _ask_answered(ensemble, ctl, _request("set_enabled", "orders", enabled=True))
    assert decode(coord.get(paths.queue("orders"))[0], QueueRecord, "").enabled
    with pytest.raises(QueueNotFoundError, match="'nope' does not exist"):
        _ask_answered(ensemble, ctl, _request("set_enabled", "nope", enabled=False))


def test_a_change_too_big_for_one_transaction_is_refused_with_what_fits(cluster):
    """20,000 partitions are about 2 MB of nodes: ZooKeeper refuses a request over 1 MiB by
    dropping the connection, so the controller refuses it first and says what fits."""
    ensemble, ctl = cluster
    with pytest.raises(
        InvalidArgumentError, match=r"too big for one change .* create it with at most about \d+ partitions"
    ):
        _ask_answered(ensemble, ctl, _request("create_queue", "huge", config=_config(20_000)))
    assert ensemble.connect().exists(paths.queue("huge")) is None
    _ask_answered(ensemble, ctl, _request("create_queue", "big", config=_config(1_000)))
    with pytest.raises(
        InvalidArgumentError,
        match=r"adding 20000 partitions to queue 'big' is too big .* grow it by at most about \d+ partitions",
    ):
        _ask_answered(ensemble, ctl, _request("add_partitions", "big", partitions=21_000))
    _ask_answered(ensemble, ctl, _request("add_partitions", "big", partitions=2_000))


def test_without_a_controller_a_request_is_withdrawn_and_nothing_changes():
    ensemble = MemoryEnsemble()
    coord = ensemble.connect()
    with pytest.raises(UnavailableError, match="no controller answered within 0.2 s.*nothing was changed"):
        ask(coord, _request("create_queue", "orders", config=_config(1)), timeout_s=0.2)
    assert coord.children(paths.REQUESTS) == []  # withdrawn: a controller elected later never applies it


def test_a_fenced_controller_changes_nothing(cluster):
    """A controller paused past its session still holds its context, unfenced as far as it
    knows; a newer controller was elected meanwhile. Its answer is refused by ZooKeeper (the
    epoch's version moved) and writes nothing."""
    ensemble, ctl = cluster
    asker = ensemble.connect()
    asker.create(paths.REQUESTS)
    path = asker.create(
        paths.request("r-"), encode(_request("create_queue", "orders", config=_config(1))), sequential=True
    )
    old = ctl.ctx
    # what the paused process still holds: its epoch and the version its election set
    paused = ControllerContext(ctl.coord, old.epoch, old._epoch_version, old.session_id)
    ensemble.expire(ctl.coord.session_id)
    deadline = time.monotonic() + 5
    while asker.exists(paths.CONTROLLER) is None or _controller(asker).epoch == old.epoch:
        assert time.monotonic() < deadline, "no new controller"
        time.sleep(0.01)
    assert not paused.fenced  # it still believes it controls...
    with pytest.raises(ControllerFencedError):  # ...and the epoch's version refuses its change
        ctl.handler.handle_all(paused)
    assert asker.exists(paths.queue("orders")) is None and asker.get(path)[1].version == 0  # unanswered
