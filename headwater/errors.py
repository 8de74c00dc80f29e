"""The one error tree of Headwater.

Every error Headwater raises on purpose derives from :class:`HeadwaterError`. The tree
separates "you used it wrong" (:class:`UsageError`: fix the call, retrying will not help)
from "the state the call assumed has moved on" (:class:`StateConflictError`: a rebalance,
an expired lease, a producer's sequence, a close; learn the new state, and a call made
from it may succeed) and from "something outside misbehaved" (:class:`StorageError`,
:class:`UnavailableError`)::

    HeadwaterError                      code  retriable
    ├── UsageError                        1   no    the caller must change the call
    │   ├── InvalidArgumentError          2   no    a value is of the wrong type or out of range
    │   │   ├── InvalidQueueNameError     3   no
    │   │   ├── PartitionOutOfRangeError  4   no
    │   │   ├── MessageTooLargeError      5   no
    │   │   └── InvalidMessageIdError     6   no
    │   ├── QueueNotFoundError            7   no
    │   ├── QueueExistsError              8   no
    │   ├── QueueDisabledError            9   no    enable the queue first
    │   ├── InvalidBatchError            10   no    a record batch failed validation
    │   ├── MessageNotFoundError         11   no    the id names nothing retained
    │   ├── ProducerFencedError          14   no    a newer instance of the producer took over
    │   ├── SubscriberNotFoundError      18   no    no subscriber of that name on the queue
    │   └── SubscriberExistsError        19   no    a subscriber of that name is already there
    ├── StateConflictError               15   no    the state the call assumed has moved on
    │   ├── ClosedError                  12   no    the broker or client was closed
    │   ├── OutOfOrderSequenceError      13   no    an idempotent producer skipped or replayed
    │   ├── WakeupError                  16   no    another thread's wakeup() ended a consumer's poll
    │   └── GroupError                   60   no    a consumer group refused a member's call
    │       ├── UnknownMemberError       61   no    not a member (left, or missed heartbeats): join again
    │       ├── StaleGenerationError     62   no    the group rebalanced since: heartbeat, then retry
    │       ├── PartitionNotAssignedError 63  no    the partition is not this member's now
    │       ├── GroupNotEmptyError       64   no    the group has live members (reset, plain commit)
    │       ├── GroupNotFoundError       65   no    no members and no committed offsets
    │       └── LeaseError               70   no    a shared group refused to act on a lease
    │           ├── LeaseExpiredError    71   no    expired, delivered again, or already finished
    │           └── LeaseNotOwnedError   72   no    the lease belongs to another member
    ├── DataDirectoryError               20   no    the data directory cannot be used
    │   ├── NotADataDirectoryError       21   no    the directory holds something else
    │   ├── DataDirectoryLockedError     22   no    another process has it open
    │   ├── UnsupportedFormatError       23   no    written by an incompatible version
    │   └── ReadOnlyStoreError           24   no    the store was opened read-only
    ├── StorageError                     30   no    the disk or the files misbehaved
    │   └── CorruptDataError             31   no    a checksum or layout check failed
    ├── UnavailableError                 40   yes   try again later (timeouts, restarts)
    │   ├── OutcomeUnknownError          41   no    sent, then no answer: it may or may not have been applied
    │   ├── NotLeaderError               42   yes   another broker leads that partition now: ask where, then send
    │   └── NotCoordinatorError          43   yes   another broker coordinates that group now: ask where, then send
    └── ClusterError                     80   no    a broker cannot join or act in its cluster as configured

The whole group branch is a state conflict: every refusal of a group (a stale generation,
an expired lease, a member removed after missed heartbeats, a partition moved to another
member) names group state that changed under the caller, and ``except GroupError`` /
``except LeaseError`` keep catching all of it. ``retriable`` stays False on this branch:
sending the *same* call again fails the same way; the caller learns the new state first
(heartbeat, join again, receive again, restart the sequence, open a new client).

Each class carries a stable numeric ``code`` and a ``retriable`` flag; :func:`error_for_code`
maps a code back to its class, which is how errors cross the wire.
"""

from __future__ import annotations

__all__ = [
    "HeadwaterError",
    "UsageError",
    "StateConflictError",
    "InvalidArgumentError",
    "InvalidQueueNameError",
    "PartitionOutOfRangeError",
    "MessageTooLargeError",
    "InvalidMessageIdError",
    "QueueNotFoundError",
    "QueueExistsError",
    "QueueDisabledError",
    "InvalidBatchError",
    "MessageNotFoundError",
    "ClosedError",
    "OutOfOrderSequenceError",
    "WakeupError",
    "ProducerFencedError",
    "SubscriberNotFoundError",
    "SubscriberExistsError",
    "GroupError",
    "UnknownMemberError",
    "StaleGenerationError",
    "PartitionNotAssignedError",
    "GroupNotEmptyError",
    "GroupNotFoundError",
    "LeaseError",
    "LeaseExpiredError",
    "LeaseNotOwnedError",
    "DataDirectoryError",
    "NotADataDirectoryError",
    "DataDirectoryLockedError",
    "UnsupportedFormatError",
    "ReadOnlyStoreError",
    "StorageError",
    "CorruptDataError",
    "UnavailableError",
    "OutcomeUnknownError",
    "NotLeaderError",
    "NotCoordinatorError",
    "ClusterError",
    "error_for_code",
]


class HeadwaterError(Exception):
    """Base of every error Headwater raises on purpose."""

    code: int = 0
    retriable: bool = False


class UsageError(HeadwaterError):
    """The call was wrong: change it; retrying the same call will fail the same way."""

    code = 1


class StateConflictError(HeadwaterError):
    """The call was well formed, but the state it assumed has moved on: a group rebalanced,
    a lease expired, a producer's sequence and the broker's disagree, the client or broker
    was closed. Sending the same call again fails the same way; learn the new state first
    (heartbeat or join again, receive again, open a new client), then call."""

    code = 15


class InvalidArgumentError(UsageError, ValueError):
    """A value is of the wrong type or out of its range."""

    code = 2


class InvalidQueueNameError(InvalidArgumentError):
    code = 3


class PartitionOutOfRangeError(InvalidArgumentError, IndexError):
    code = 4


class MessageTooLargeError(InvalidArgumentError):
    code = 5


class InvalidMessageIdError(InvalidArgumentError):
    code = 6


class QueueNotFoundError(UsageError, LookupError):
    code = 7


class QueueExistsError(UsageError):
    code = 8


class QueueDisabledError(UsageError):
    code = 9


class InvalidBatchError(UsageError):
    code = 10


class MessageNotFoundError(UsageError, LookupError):
    code = 11


class ClosedError(StateConflictError):
    """The broker or the client was closed; open a new one."""

    code = 12


class OutOfOrderSequenceError(StateConflictError):
    """An idempotent producer's batch is not the next in its sequence (a gap, or a stale retry)."""

    code = 13


class WakeupError(StateConflictError):
    """Another thread called the consumer's ``wakeup()`` (Kafka's): the poll that waited, or
    the next one, ended with this. Raised by the client, never sent; the consumer is as it
    was, so poll again or close it."""

    code = 16


class ProducerFencedError(UsageError):
    """A newer instance of this producer id (a higher epoch) has taken over."""

    code = 14


class SubscriberNotFoundError(UsageError, LookupError):
    """No subscriber of that name on the queue (``headwater subscriber add`` makes one)."""

    code = 18


class SubscriberExistsError(UsageError):
    """A subscriber of that name is already registered on the queue; its checkpoint is kept."""

    code = 19


class GroupError(StateConflictError):
    """A consumer group's coordinator refused a member's call; the group is unchanged."""

    code = 60


class UnknownMemberError(GroupError):
    """The member is not in the group: it left, or missed heartbeats for its session
    timeout and was removed (its partitions went to others). Join again."""

    code = 61


class StaleGenerationError(GroupError):
    """The call names a generation the group has left behind: it rebalanced since. A commit
    from a stale generation is refused so a member that was paused cannot overwrite the
    progress of the partition's new owner."""

    code = 62


class PartitionNotAssignedError(GroupError):
    """The member committed a partition it does not hold in the current generation."""

    code = 63


class GroupNotEmptyError(GroupError):
    """The operation needs a group without live members (resetting offsets, committing
    without a member id)."""

    code = 64


class GroupNotFoundError(GroupError, LookupError):
    """No such group: it has neither members nor committed offsets."""

    code = 65


class LeaseError(GroupError):
    """A shared group could not act on a lease (ack, nack, extend); the message is unchanged."""

    code = 70


class LeaseExpiredError(LeaseError):
    """The lease is over: its visibility timeout passed (the message was released or
    delivered again), or the message is already acknowledged or dead-lettered. Whoever
    holds the current lease acks it; do not ack twice."""

    code = 71


class LeaseNotOwnedError(LeaseError):
    """The lease was given to another member of the group; only that member may act on it."""

    code = 72


class DataDirectoryError(HeadwaterError):
    """The data directory cannot be used as given."""

    code = 20


class NotADataDirectoryError(DataDirectoryError):
    code = 21


class DataDirectoryLockedError(DataDirectoryError):
    code = 22


class UnsupportedFormatError(DataDirectoryError):
    code = 23


class ReadOnlyStoreError(DataDirectoryError):
    """The store was opened read-only (``read_only=True``): it serves reads, never writes."""

    code = 24


class StorageError(HeadwaterError):
    """The disk or the files misbehaved (I/O error, no space, damaged file)."""

    code = 30


class CorruptDataError(StorageError):
    code = 31


class UnavailableError(HeadwaterError):
    """Not now: a timeout, a restart in progress. The same call may succeed later."""

    code = 40
    retriable = True


class OutcomeUnknownError(UnavailableError):
    """A call that is not safe to repeat (a truncate, a create, a join) reached the broker,
    or may have, and its answer never came: it may or may not have been applied. Look before
    calling again (the message says how). Raised by the network client; never sent by a broker.
    """

    code = 41
    retriable = False


class NotLeaderError(UnavailableError):
    """The broker asked does not lead that partition now (it moved, or the broker is cut off
    from its cluster): refresh the cluster's metadata (METADATA) and send to its leader. A
    client of a cluster does so by itself; the message names the leader when it is known."""

    code = 42


class NotCoordinatorError(UnavailableError):
    """The broker asked does not coordinate that consumer group now (the coordinator
    queue's partition of the group moved, or the broker is cut off from its cluster): the
    call was not applied. Refresh the cluster's metadata (METADATA names each group's
    coordinator) and send it there; a client of a cluster does so by itself. The message
    names the coordinator when it is known."""

    code = 43


class ClusterError(HeadwaterError):
    """A broker cannot join or act in its cluster as configured (its data directory, broker
    id and ZooKeeper path do not belong together); the cluster's own errors
    (:mod:`headwater.cluster`) are its kinds, codes 82-89 (81, ZooKeeper out of reach, is an
    :class:`UnavailableError`)."""

    code = 80


def _all_error_classes() -> dict[int, type[HeadwaterError]]:
    found: dict[int, type[HeadwaterError]] = {}
    stack: list[type[HeadwaterError]] = [HeadwaterError]
    while stack:
        cls = stack.pop()
        assert cls.code not in found or found[cls.code] is cls, f"duplicate code {cls.code}"
        found[cls.code] = cls
        stack.extend(cls.__subclasses__())
    return found


_BY_CODE = _all_error_classes()


def error_for_code(code: int) -> type[HeadwaterError]:
    """The error class for a numeric code; unknown codes map to :class:`HeadwaterError`.

    Subclasses defined in other modules (the protocol's errors) are found too.
    """
    cls = _BY_CODE.get(code)
    if cls is None:
        _BY_CODE.update(_all_error_classes())
        cls = _BY_CODE.get(code, HeadwaterError)
    return cls
