"""A producer's copies of queue metadata (partition count, limits), without I/O: which copy
is stale, and what a background refresh brings. Times are the caller's monotonic ms.

A copy older than the producer's ``metadata_max_age_ms`` is still used while a fresh one is
asked for in the background, so no send waits for that round trip; a refresh that failed is
tried again ``METADATA_RETRY_MS`` later; a queue that no longer exists is forgotten (the
next send asks again and fails with the broker's error).

>>> cache = MetadataCache(max_age_ms=5000)
>>> cache.put("q", "old", asked_at_ms=0)
>>> cache.lookup("q", now_ms=10_000), cache.start_refresh("q"), cache.start_refresh("q")
(('old', True), True, False)
>>> cache.refreshed("q", 10_000, TimeoutError("down"), now_ms=12_000)
>>> cache.lookup("q", now_ms=12_400), cache.lookup("q", now_ms=12_600)  # stale again at 12_500
(('old', False), ('old', True))
>>> cache.refreshed("q", 13_000, "new", now_ms=13_100)
>>> cache.lookup("q", now_ms=13_100)
('new', False)
>>> cache.refreshed("q", 14_000, QueueNotFoundError("gone"), now_ms=14_100)
>>> cache.lookup("q", now_ms=14_100)
(None, False)
"""

from __future__ import annotations

from headwater.errors import QueueNotFoundError
from headwater.model.config import QueueInfo

__all__ = ["METADATA_RETRY_MS", "MetadataCache"]

METADATA_RETRY_MS = 500  # a background refresh of a queue's metadata that failed is tried again after this


class MetadataCache:
    """Queue name -> (when it was asked for, its metadata); the queues being refreshed."""

    __slots__ = ("max_age_ms", "entries", "_refreshing")

    def __init__(self, max_age_ms: float) -> None:
        self.max_age_ms = max_age_ms
        self.entries: dict[str, tuple[float, QueueInfo]] = {}  # read directly by a send's hot path
        self._refreshing: set[str] = set()

    def lookup(self, queue: str, now_ms: float) -> tuple[QueueInfo | None, bool]:
        """The copy of ``queue``'s metadata (None: unknown), and whether it is stale."""
        got = self.entries.get(queue)
        if got is None:
            return None, False
        return got[1], now_ms - got[0] > self.max_age_ms

    def start_refresh(self, queue: str) -> bool:
        """Whether to ask for ``queue``'s metadata in the background now (none is under way)."""
        if queue in self._refreshing:
            return False
        self._refreshing.add(queue)
        return True

    def put(self, queue: str, info: QueueInfo, asked_at_ms: float) -> None:
        """Keep metadata the caller waited for."""
        self.entries[queue] = (asked_at_ms, info)

    def expire(self, queue: str) -> None:
        """Make the copy stale now (a send found a broker of the queue out of reach): it is
        still used while the next send asks for a fresh one.

        >>> cache = MetadataCache(max_age_ms=5000)
        >>> cache.put("q", "old", asked_at_ms=0)
        >>> cache.expire("q")
        >>> cache.lookup("q", now_ms=1)
        ('old', True)
        """
        got = self.entries.get(queue)
        if got is not None:
            self.entries[queue] = (float("-inf"), got[1])

    def forget(self, queue: str) -> None:
        """Drop the copy (a send found the queue gone, or without the partition)."""
        self.entries.pop(queue, None)

    def refreshed(self, queue: str, asked_at_ms: float, outcome: QueueInfo | BaseException, now_ms: float) -> None:
        """Keep what a background refresh asked at ``asked_at_ms`` brought: new metadata,
        unless a newer copy arrived meanwhile; after a failure, the old copy, stale again in
        ``METADATA_RETRY_MS``."""
        self._refreshing.discard(queue)
        got = self.entries.get(queue)
        if isinstance(outcome, QueueNotFoundError):
            self.entries.pop(queue, None)
        elif isinstance(outcome, BaseException):
            if got is not None:
                self.entries[queue] = (max(got[0], now_ms - self.max_age_ms + METADATA_RETRY_MS), got[1])
        elif got is None or got[0] <= asked_at_ms:
            self.entries[queue] = (asked_at_ms, outcome)
