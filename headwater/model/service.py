"""The one small interface between the client and a broker.

The client (``headwater.client``) speaks only to a :class:`BrokerService`. The embedded
broker implements it in-process; the network transport implements it over the wire. Every
argument and result is a plain value (numbers, strings, bytes, model structs), so the same
calls cross a socket unchanged, and record batches travel as the bytes they are stored as.
"""

from __future__ import annotations

from typing import Protocol

import msgspec

from headwater.model.config import QueueConfig, QueueInfo

__all__ = ["BrokerService", "ProduceResult", "FetchResult"]


class ProduceResult(msgspec.Struct, frozen=True, array_like=True):
    """Where an appended batch landed."""

    queue_id: int
    partition: int
    base_offset: int
    count: int
    timestamp_ms: int


class FetchResult(msgspec.Struct, frozen=True, array_like=True):
    """Stored batches of one partition from some offset on.

    ``batches`` are whole stored batches; the first may begin before the offset asked for
    and the last may run past ``end`` of the request (the reader trims). ``next_offset`` is
    where to continue (past batches the broker skipped because of filters or expiry);
    ``start_offset`` and ``end_offset`` are the partition's retained range at fetch time.
    """

    batches: list[bytes]
    next_offset: int
    start_offset: int
    end_offset: int


class BrokerService(Protocol):
    # admin
    def create_queue(self, name: str, config: QueueConfig) -> QueueInfo: ...
    def describe_queue(self, name: str) -> QueueInfo: ...
    def list_queues(self) -> list[QueueInfo]: ...
    def delete_queue(self, name: str) -> None: ...
    def truncate_queue(self, name: str) -> QueueInfo: ...
    def set_queue_enabled(self, name: str, enabled: bool) -> QueueInfo: ...
    def add_partitions(self, name: str, partitions: int) -> QueueInfo: ...

    # data
    def produce(self, queue: str, partition: int, batch: bytes) -> ProduceResult: ...
    def fetch(
        self, queue: str, partition: int, offset: int, *, max_bytes: int, tag_mask: int = 0,
        end_offset: int | None = None, max_wait_ms: int = 0,
    ) -> FetchResult:
        """Batches from ``offset`` on; when there are none yet, wait up to ``max_wait_ms``
        for some to arrive (long polling)."""
        ...
    def lookup_id(self, queue_id: int, partition: int, offset: int) -> tuple[str, bytes]: ...
    def lookup_key(
        self, queue: str, key: bytes, start_ms: int | None, end_ms: int | None, limit: int
    ) -> list[bytes]: ...
    def offset_for_time(self, queue: str, partition: int, timestamp_ms: int) -> int: ...
    # consumer offsets
    def commit_offsets(self, group: str, queue: str, offsets: dict[int, int]) -> None:
        """Store ``{partition: offset}`` for ``group`` (durably; survives restarts)."""
        ...

    def fetch_offsets(self, group: str, queue: str) -> dict[int, int]:
        """The offsets ``group`` committed on ``queue`` (partitions without one are absent)."""
        ...

    def status(self) -> dict[str, object]:
        """Broker facts for operators: version, uptime, storage figures, what recovery repaired."""
        ...

    def close(self) -> None: ...
