"""The one error tree of Headwater.

Every error Headwater raises on purpose derives from :class:`HeadwaterError`. The tree
separates "you used it wrong" (:class:`UsageError`: fix the call, retrying will not help)
from "something outside misbehaved" (:class:`StorageError`, :class:`UnavailableError`)::

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
    │   ├── ClosedError                  12   no    the broker or client was closed
    │   ├── OutOfOrderSequenceError      13   no    an idempotent producer skipped or replayed
    │   └── ProducerFencedError          14   no    a newer instance of the producer took over
    ├── DataDirectoryError               20   no    the data directory cannot be used
    │   ├── NotADataDirectoryError       21   no    the directory holds something else
    │   ├── DataDirectoryLockedError     22   no    another process has it open
    │   └── UnsupportedFormatError       23   no    written by an incompatible version
    ├── StorageError                     30   no    the disk or the files misbehaved
    │   └── CorruptDataError             31   no    a checksum or layout check failed
    └── UnavailableError                 40   yes   try again later (timeouts, restarts)

Each class carries a stable numeric ``code`` and a ``retriable`` flag; :func:`error_for_code`
maps a code back to its class, which is how errors cross the wire.
"""

from __future__ import annotations

__all__ = [
    "HeadwaterError",
    "UsageError",
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
    "ProducerFencedError",
    "DataDirectoryError",
    "NotADataDirectoryError",
    "DataDirectoryLockedError",
    "UnsupportedFormatError",
    "StorageError",
    "CorruptDataError",
    "UnavailableError",
    "error_for_code",
]


class HeadwaterError(Exception):
    """Base of every error Headwater raises on purpose."""

    code: int = 0
    retriable: bool = False


class UsageError(HeadwaterError):
    """The call was wrong: change it; retrying the same call will fail the same way."""

    code = 1


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


class ClosedError(UsageError):
    code = 12


class OutOfOrderSequenceError(UsageError):
    """An idempotent producer's batch is not the next in its sequence (a gap, or a stale retry)."""

    code = 13


class ProducerFencedError(UsageError):
    """A newer instance of this producer id (a higher epoch) has taken over."""

    code = 14


class DataDirectoryError(HeadwaterError):
    """The data directory cannot be used as given."""

    code = 20


class NotADataDirectoryError(DataDirectoryError):
    code = 21


class DataDirectoryLockedError(DataDirectoryError):
    code = 22


class UnsupportedFormatError(DataDirectoryError):
    code = 23


class StorageError(HeadwaterError):
    """The disk or the files misbehaved (I/O error, no space, damaged file)."""

    code = 30


class CorruptDataError(StorageError):
    code = 31


class UnavailableError(HeadwaterError):
    """Not now: a timeout, a restart in progress. The same call may succeed later."""

    code = 40
    retriable = True


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
