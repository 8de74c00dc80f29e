"""StoreConfig: the settings of a store, whichever kind (a data directory or memory)."""

from __future__ import annotations

import msgspec

from headwater.errors import InvalidArgumentError

__all__ = ["StoreConfig"]


class StoreConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Settings of a store (one data directory)."""

    flush: str = "async"  # default flush policy of queues that name none
    flush_interval_ms: int = 200  # async: the longest a write waits for its fsync
    flush_bytes: int = 8 * 1024 * 1024  # async: fsync sooner once this much is written since the last
    # consumer groups' offset commits: "async" answers once written (a power loss redelivers at
    # most flush_interval_ms of commits), "sync" after the fsync (headwater.broker.offsets)
    offsets_flush: str = "async"
    page_cache_keep_bytes: int = 256 * 1024 * 1024  # the newest log left in the OS page cache (0: all of it)
    segment_bytes_max: int = 128 * 1024 * 1024
    open_segments_max: int = 64  # sealed segments kept open for reading
    index_cache_segments: int = 16  # sealed segment indexes kept in memory
    retention_interval_ms: int = 10_000
    verify: str = "tail"  # "tail": check the last segment on open; "all": every segment
    producer_expiry_ms: int = 7 * 86_400_000  # idempotence state of an idle producer is dropped
    delay_max_s: int = 2 * 366 * 86_400  # a delayed message may be due at most this far ahead
    delay_bucket_s: int = 3600  # span of one schedule file of delayed messages (whole minutes)
    queue_partitions_max: int = 100_000  # partitions of one queue (headwater.storage.quotas)
    partitions_max: int = 100_000  # partitions of all queues together, the broker's own included
    # read, never write: no recovery cut, no index or file rewritten, no append (ReadOnlyStoreError)
    read_only: bool = False

    def validated(self) -> StoreConfig:
        if self.flush not in ("sync", "async"):
            raise InvalidArgumentError(f"flush must be 'sync' or 'async', got {self.flush!r}")
        if self.offsets_flush not in ("sync", "async"):
            raise InvalidArgumentError(f"offsets_flush must be 'sync' or 'async', got {self.offsets_flush!r}")
        if self.verify not in ("tail", "all"):
            raise InvalidArgumentError(f"verify must be 'tail' or 'all', got {self.verify!r}")
        if not 1 <= self.flush_interval_ms <= 3_600_000:
            raise InvalidArgumentError("flush_interval_ms must be from 1 to 3600000")
        if not 64 * 1024 <= self.flush_bytes <= 2**40:
            raise InvalidArgumentError("flush_bytes must be from 64 KiB to 1 TiB")
        if not (self.page_cache_keep_bytes == 0 or 1024 * 1024 <= self.page_cache_keep_bytes <= 2**40):
            raise InvalidArgumentError("page_cache_keep_bytes must be 0 (keep all) or from 1 MiB to 1 TiB")
        if not 64 * 1024 <= self.segment_bytes_max <= 2**31:
            raise InvalidArgumentError("segment_bytes_max must be from 64 KiB to 2 GiB")
        if self.open_segments_max < 1 or self.index_cache_segments < 1:
            raise InvalidArgumentError("open_segments_max and index_cache_segments must be >= 1")
        d = self.delay_max_s
        if isinstance(d, bool) or not isinstance(d, int) or not 1 <= d <= 100 * 366 * 86_400:
            raise InvalidArgumentError(f"delay_max_s must be whole seconds from 1 to 100 years, got {d!r}")
        for name in ("queue_partitions_max", "partitions_max"):
            n = getattr(self, name)
            if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 10_000_000:
                raise InvalidArgumentError(f"{name} must be a whole number from 1 to 10000000, got {n!r}")
        b = self.delay_bucket_s
        if isinstance(b, bool) or not isinstance(b, int) or not 60 <= b <= 86_400 or b % 60:
            raise InvalidArgumentError(
                f"delay_bucket_s must be a whole number of minutes from 60 to 86400 seconds, got {b!r}"
            )
        return self
