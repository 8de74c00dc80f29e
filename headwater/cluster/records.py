"""What the cluster keeps in ZooKeeper: the znode paths and the record each one holds.

Every record is JSON (msgspec), so that an operator reading the tree with ``zkCli.sh`` sees
what a broker sees. The layout and who writes what are in ``docs/design/cluster.md``; the
epochs that fence each writer are fields here, so a receiver can refuse a stale decision.
"""

from __future__ import annotations

from typing import TypeVar

import msgspec

from headwater.cluster.coordination import CoordinationError
from headwater.errors import ClusterError
from headwater.model.cluster import MoveOutcome

__all__ = [
    "AdminRequest",
    "AdminResult",
    "BrokerRecord",
    "ClusterRecord",
    "ControllerRecord",
    "DEFAULT_CHROOT",
    "FORMAT_VERSION",
    "MoveFenced",
    "MoveOutcomes",
    "MovePlan",
    "MoveProgress",
    "MoveRecord",
    "PartitionRecord",
    "QueueRecord",
    "RecordError",
    "decode",
    "encode",
    "paths",
]

DEFAULT_CHROOT = "/headwater"  # where a cluster lives when --zookeeper names no chroot
FORMAT_VERSION = 1  # of the tree below the chroot; a broker refuses a cluster of a newer one


class RecordError(CoordinationError, ClusterError):
    """A znode holds something that is not the record its path should hold."""

    code = 84


class ClusterRecord(msgspec.Struct, frozen=True, kw_only=True):
    """``/cluster``: made once, by the first broker; every broker's data directory remembers
    the id, so a broker pointed at another cluster (a wrong chroot) refuses to start."""

    cluster_id: str
    format_version: int = FORMAT_VERSION
    created_ms: int = 0


class BrokerRecord(msgspec.Struct, frozen=True, kw_only=True):
    """``/brokers/<id>`` (ephemeral). The broker epoch is the node's creation zxid, known
    only once it exists, so it is not in the data: :meth:`Stat.created_zxid` gives it.
    ``store_id`` names the data directory, so a restarted broker recognises the registration
    its previous process left (it waits for that session to expire) and tells it from
    another broker's with the same id (it refuses)."""

    broker_id: int
    host: str
    port: int
    version: str
    started_ms: int
    store_id: str

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


class ControllerRecord(msgspec.Struct, frozen=True, kw_only=True):
    """``/controller`` (ephemeral): who controls, at which controller epoch."""

    broker_id: int
    epoch: int


class QueueRecord(msgspec.Struct, frozen=True, kw_only=True):
    """``/queues/<name>``: the queue as the controller created it. ``config`` is a
    :class:`~headwater.model.config.QueueConfig` as its builtins (``msgspec.to_builtins``)."""

    queue_id: int
    config: dict[str, object]
    created_ms: int
    controller_epoch: int
    replication_factor: int = 1
    enabled: bool = True  # False: disabled (every broker refuses its reads and writes)


class PartitionRecord(msgspec.Struct, frozen=True, kw_only=True):
    """``/queues/<name>/p/<n>``: the brokers that hold the partition (one until replication
    comes), the one that leads it, and the leader epoch, incremented at every change of
    leader; ``controller_epoch`` is the epoch of the controller that wrote it."""

    replicas: list[int]
    leader: int
    leader_epoch: int
    controller_epoch: int


class MoveRecord(msgspec.Struct, frozen=True, kw_only=True):
    """``/moves/<name>/<n>``: a partition on its way from ``source`` to ``target``;
    ``phase`` is ``queued`` (planned, waiting for a free slot: ``order`` says when), ``copy``
    (the target copies), then ``fence`` (the source refuses produces) before the switch.
    ``leader_epoch`` is the partition's when the move was planned: a move made for another
    owner than the partition has now is void. ``started_ms`` is when the phase began."""

    source: int
    target: int
    phase: str
    started_ms: int
    controller_epoch: int
    leader_epoch: int = 0
    order: int = 0


class MoveProgress(msgspec.Struct, frozen=True, kw_only=True):
    """``/moves/<name>/<n>/progress``, written by the target: it holds the partition up to
    ``copied_offset`` (durably), and the source's end offset was ``source_end_offset`` at
    its last fetch. ``delayed_taken``: the source's pending delayed messages of the partition
    and its shared groups' state of it are adopted here (durably, once the source fenced):
    the switch waits for it. A target that knows nothing of delayed messages writes no such
    field, and is taken at its word."""

    copied_offset: int
    source_end_offset: int
    updated_ms: int
    error: str = ""  # the target cannot take the partition (why): the controller rolls the move back
    delayed_taken: bool = True


class MoveOutcomes(msgspec.Struct, frozen=True, kw_only=True):
    """``/move_outcomes``: how the latest moves ended, oldest first (at most
    ``MOVE_OUTCOMES_KEPT``), written by the controller in the transaction that ends each
    move, so the operator's tools can say what became of a move, and why one rolled back."""

    outcomes: list[MoveOutcome] = msgspec.field(default_factory=list)


class MoveFenced(msgspec.Struct, frozen=True, kw_only=True):
    """``/moves/<name>/<n>/fenced``, written by the source once it refuses produces for the
    partition and has flushed: its log ends at ``end_offset`` for good (at ``leader_epoch``)."""

    end_offset: int
    leader_epoch: int
    broker_id: int


class MovePlan(msgspec.Struct, frozen=True, kw_only=True):
    """One planned move, as an :class:`AdminResult` answers it."""

    queue: str
    partition: int
    source: int
    target: int


class AdminResult(msgspec.Struct, frozen=True, kw_only=True):
    """The controller's answer to an :class:`AdminRequest`: ``code`` 0 when done, else the
    error's code (``headwater.errors``) and its message, raised again where it was asked."""

    code: int = 0
    message: str = ""
    queue_id: int = 0
    controller_epoch: int = 0
    moves: list[MovePlan] = msgspec.field(default_factory=list)  # rebalance, decommission: the plan


class AdminRequest(msgspec.Struct, frozen=True, kw_only=True):
    """``/requests/r-<seq>``: a change only the controller makes (create, delete, grow a
    queue), asked by the broker a client called. The controller writes ``result`` into the
    node; the asker reads it and deletes the node."""

    op: str  # create_queue, delete_queue, add_partitions, set_enabled, alter_queue, rebalance, decommission
    queue: str  # "" for rebalance and decommission
    asked_by: int
    asked_ms: int
    config: dict[str, object] | None = None  # create_queue: a QueueConfig as builtins; alter_queue: the changes
    partitions: int = 0  # add_partitions: the new total
    broker_id: int = 0  # decommission: the broker to empty
    dry_run: bool = False  # rebalance, decommission: answer the plan, move nothing
    enabled: bool = True  # set_enabled: the queue's new state
    result: AdminResult | None = None


R = TypeVar("R", bound=msgspec.Struct)


def encode(record: msgspec.Struct) -> bytes:
    return msgspec.json.encode(record)


def decode(data: bytes, kind: type[R], path: str) -> R:
    """``data`` as a ``kind``, or :class:`RecordError` naming the node and what is wrong."""
    try:
        return msgspec.json.decode(data, type=kind)
    except msgspec.DecodeError as e:
        raise RecordError(f"{path} does not hold a {kind.__name__}: {e}", path) from None


class paths:
    """The znode paths, relative to the chroot (a namespace, read as ``paths.broker(3)``)."""

    CLUSTER = "/cluster"
    BROKERS = "/brokers"
    CONTROLLER = "/controller"
    CONTROLLER_EPOCH = "/controller_epoch"
    QUEUES = "/queues"
    MOVES = "/moves"
    MOVE_OUTCOMES = "/move_outcomes"
    REQUESTS = "/requests"
    QUEUE_IDS = "/queue_ids"  # the next cluster queue id (a decimal integer), set by the controller

    @staticmethod
    def request(name: str) -> str:
        return f"/requests/{name}"

    @staticmethod
    def broker(broker_id: int) -> str:
        return f"/brokers/{broker_id}"

    @staticmethod
    def queue(name: str) -> str:
        return f"/queues/{name}"

    @staticmethod
    def partitions(name: str) -> str:
        return f"/queues/{name}/p"

    @staticmethod
    def partition(name: str, partition: int) -> str:
        return f"/queues/{name}/p/{partition}"

    @staticmethod
    def moves_of(name: str) -> str:
        return f"/moves/{name}"

    @staticmethod
    def move(name: str, partition: int) -> str:
        return f"/moves/{name}/{partition}"

    @staticmethod
    def move_progress(name: str, partition: int) -> str:
        """Written by a move's target: :class:`MoveProgress`."""
        return f"/moves/{name}/{partition}/progress"

    @staticmethod
    def move_fenced(name: str, partition: int) -> str:
        """Written by a move's source: :class:`MoveFenced`."""
        return f"/moves/{name}/{partition}/fenced"
