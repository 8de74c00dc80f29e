"""Store: what the broker and its services use of a store, whichever kind it is.

Two stores implement it: :class:`~headwater.storage.store.LogStore` keeps a data directory
(a commit log, indexes, a catalog; it survives crashes) and
:class:`~headwater.storage.memory.MemoryStore` keeps the same queues in memory (nothing
survives ``close``). Both validate batches with the same codec, raise the same errors with
the same words, and pass the same contract tests (tests/test_store_contract.py, and every
test of the ``hw`` fixture, which runs the broker over both), as NATS runs every store test
on its memstore and its filestore. The broker never asks which kind it has, except to
choose where the delay service keeps its schedule (:meth:`Store.schedule_store`).

For a cluster (docs/design/cluster.md, "Moving a partition"), a queue is created under the
id the controller allocated (``create_queue(..., queue_id=)``), and a partition another
broker holds is copied in: ``reset_partition`` to the base offset of the first batch a fetch
from the source's start offset returns, ``append_copy`` of every batch in order, then
``delete_before`` the source's start offset if it lies inside that first batch. The copy
serves the same bytes at the same offsets and knows the same producers' retries.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Protocol

from headwater.model.batch import BatchHeader
from headwater.model.config import PartitionBounds, QueueConfig, QueueInfo
from headwater.model.service import FetchResult, ProduceResult
from headwater.storage.schedule import DispatchCheckpoint, ScheduleFile
from headwater.storage.settings import StoreConfig

__all__ = ["Store", "ScheduleStore"]


class ScheduleStore(Protocol):
    """Where the delay service keeps its bucket files and its dispatch checkpoint
    (:mod:`headwater.storage.schedule` has their format): a folder of the data directory,
    or memory."""

    def exists(self) -> bool:
        """Whether anything was ever kept here (a store that never saw a delayed message)."""
        ...

    def prepare(self) -> None:
        """Make room for the first bucket (create the folder, durably)."""
        ...

    def open_buckets(self, store_id: bytes, report: list[str], *, read_only: bool = False) -> Iterator[ScheduleFile]:
        """Every bucket kept, in start order; damaged ones are set aside (``read_only``:
        skipped) and reported."""
        ...

    def create_bucket(self, start_ms: int, end_ms: int, store_id: bytes, created_ms: int) -> ScheduleFile:
        """A new, empty bucket file for ``[start_ms, end_ms)``."""
        ...

    def read_checkpoint(self) -> DispatchCheckpoint | None:
        """The dispatch checkpoint, or None if none was written yet."""
        ...

    def write_checkpoint(self, ckpt: DispatchCheckpoint) -> None:
        """Replace the dispatch checkpoint (atomically)."""
        ...

    def sync_deletes(self) -> None:
        """Make the deletion of bucket files durable."""
        ...


class Store(Protocol):
    """The queues of one store, and the services the broker builds on them. Thread-safe."""

    config: StoreConfig
    recovery_report: list[str]  # what opening had to repair (empty for a store in memory)
    read_only: bool  # opened to read only: every write raises ReadOnlyStoreError

    @property
    def kind(self) -> str:
        """``"file"`` or ``"memory"``: for status and the delay schedule, nothing else."""
        ...

    @property
    def path(self) -> Path | None:
        """The data directory; None for a store in memory."""
        ...

    @property
    def clock(self) -> Callable[[], float]:
        """The wall clock this store times appends, TTL and retention with."""
        ...

    @property
    def fsync_failed(self) -> bool:
        """An fsync failed: the store appends and acknowledges nothing more until reopened."""
        ...

    @property
    def store_id(self) -> bytes:
        """The 16 bytes that tie the store's files (its delay schedule's too) to it."""
        ...

    @property
    def end_position(self) -> int:
        """The log position the next append will take (every batch so far lies before it)."""
        ...

    # admin
    def create_queue(
        self, name: str, config: QueueConfig, *, internal: bool = False, queue_id: int | None = None
    ) -> QueueInfo:
        """Create a queue; ``queue_id`` (1..2**32-1) gives it the id a cluster's controller
        allocated (message ids carry it), else the store takes its next one."""
        ...

    def describe_queue(self, name: str) -> QueueInfo: ...
    def describe_partitions(self, name: str, partitions: Iterable[int]) -> PartitionBounds:
        """What ``describe_queue`` says of ``partitions`` alone (those the queue has)."""
        ...

    def list_queues(self, *, include_internal: bool = False) -> list[QueueInfo]: ...
    def delete_queue(self, name: str) -> None: ...
    def truncate_queue(self, name: str) -> QueueInfo: ...
    def set_queue_enabled(self, name: str, enabled: bool) -> QueueInfo: ...
    def add_partitions(self, name: str, partitions: int) -> QueueInfo: ...
    def alter_queue(self, name: str, changes: dict[str, Any]) -> QueueInfo: ...
    def delete_before(self, queue: str, partition: int, offset: int) -> None: ...
    def reset_partition(self, queue: str, partition: int, offset: int) -> None:
        """Make an empty partition begin at ``offset`` (never below its end offset), so that a
        copy of another store's partition keeps that store's offsets."""
        ...

    def rewind_partition(self, queue: str, partition: int, offset: int, last_batch: bytes | None = None) -> None:
        """Make an emptied partition begin at ``offset``, below its end, for a copy of a log
        that begins there: the batches kept from before are served again when they hold
        every offset from there and end with ``last_batch`` (the other log's batch at the end
        offset - 1); with none kept past ``offset`` it begins there empty; else refused."""
        ...

    # appending
    def add_append_listener(self, fn: Callable[[str, int, int], None]) -> None: ...
    def add_flush_listener(self, fn: Callable[[float], None]) -> None:
        """Call ``fn(seconds)`` after every fsync of the log, with the time it took."""
        ...

    def append(self, queue: str, partition: int, batch: bytes) -> ProduceResult: ...
    def append_nowait(self, queue: str, partition: int, batch: bytes) -> tuple[ProduceResult, int | None]: ...
    def wait_durable(self, position: int) -> None: ...
    def flush(self) -> None: ...
    def append_copy(self, queue: str, partition: int, batch: bytes, base_offset: int) -> ProduceResult:
        """Append a batch as another store keeps it (the bytes a fetch returns) at its own
        offset, which must be the partition's end offset; durable on return like ``append``."""
        ...

    # for the delay service
    def produce_target(self, queue: str, partition: int) -> tuple[int, int, bool]: ...
    def queue_name(self, queue_id: int) -> str | None: ...
    def append_stamped(
        self, queue_id: int, partition: int, batch: bytes | bytearray, broker_reserved: int
    ) -> tuple[ProduceResult, int]: ...
    def stamped_batches(self, since_position: int) -> list[BatchHeader]: ...
    def schedule_store(self) -> ScheduleStore: ...

    # reading
    def fetch(
        self,
        queue: str,
        partition: int,
        offset: int,
        *,
        max_bytes: int = 1024 * 1024,
        tag_mask: int = 0,
        end_offset: int | None = None,
    ) -> FetchResult: ...
    def end_offset(self, queue: str, partition: int) -> int: ...
    def offset_for_time(self, queue: str, partition: int, timestamp_ms: int) -> int: ...
    def lookup_id(self, queue_id: int, partition: int, offset: int) -> tuple[str, bytes]: ...
    def lookup_key(
        self, queue: str, key: bytes, start_ms: int | None = None, end_ms: int | None = None, limit: int = 1000
    ) -> list[bytes]: ...

    # retention, stats, closing
    def enforce_retention(self) -> int: ...
    def stats(self) -> dict[str, int]: ...
    def close(self) -> None: ...
