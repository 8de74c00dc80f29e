"""Sessions the gateway holds for HTTP clients between their requests: consumer group members
and shared-group consumers. HTTP has no connection to tie them to, so each lives until it is
deleted or, as in Kafka's REST proxy (``consumer.instance.timeout.ms``), until no request
used it for ``idle_timeout_ms``: a reaper task closes it then (a group member leaves its
group, so its partitions go to the others; a shared consumer releases its leases).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from headwater.errors import UnavailableError, UnknownMemberError

__all__ = ["Session", "Sessions", "REAP_INTERVAL_S"]

log = logging.getLogger("headwater.http")

#: How often the reaper looks for idle sessions.
REAP_INTERVAL_S = 1.0


class Session:
    """A consumer held for an HTTP client; ``lock`` keeps its calls one at a time (a
    consumer is used from one task at a time)."""

    def __init__(self, key: tuple[str, ...], consumer: Any, idle_timeout_ms: int) -> None:
        self.key = key
        self.consumer = consumer
        self.idle_timeout_ms = idle_timeout_ms
        self.lock = asyncio.Lock()
        self.used_at = time.monotonic()
        self.busy = 0  # calls in progress: a member in a long poll is not idle
        self.positions: dict[tuple[str, int], int] = {}  # next offset per partition polled

    def idle_s(self, now: float) -> float:
        return 0.0 if self.busy else now - self.used_at


class Sessions:
    """The sessions by key, at most ``sessions_max``, closed when idle."""

    def __init__(self, idle_timeout_ms: int, sessions_max: int) -> None:
        self.idle_timeout_ms = idle_timeout_ms
        self.sessions_max = sessions_max
        self._by_key: dict[tuple[str, ...], Session] = {}
        self._reaper: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._reaper = asyncio.create_task(self._reap(), name="headwater-http-reaper")

    def get(self, key: tuple[str, ...]) -> Session | None:
        return self._by_key.get(key)

    def add(self, key: tuple[str, ...], consumer: Any, idle_timeout_ms: int | None = None) -> Session:
        if len(self._by_key) >= self.sessions_max:
            raise UnavailableError(
                f"the gateway holds {self.sessions_max} consumers already (sessions_max): end unused ones "
                f"(DELETE /v1/groups/{{group}}/members/{{member}} or "
                f"DELETE /v1/shared/{{group}}/queues/{{queue}}/members/{{member}}), reuse member names, "
                f"or wait until idle ones expire ({self.idle_timeout_ms // 1000} s unused)"
            )
        s = Session(key, consumer, idle_timeout_ms or self.idle_timeout_ms)
        self._by_key[key] = s
        return s

    def require(self, key: tuple[str, ...], what: str) -> Session:
        s = self._by_key.get(key)
        if s is None:
            raise UnknownMemberError(f"{what} is not held by this gateway: it was deleted, expired, or never created")
        return s

    @contextlib.asynccontextmanager
    async def using(self, session: Session) -> AsyncIterator[Any]:
        """Use the session's consumer, alone, marking it busy (not idle) meanwhile."""
        session.busy += 1
        try:
            async with session.lock:
                yield session.consumer
        finally:
            session.busy -= 1
            session.used_at = time.monotonic()

    async def remove(self, key: tuple[str, ...], **close_kw: Any) -> bool:
        s = self._by_key.pop(key, None)
        if s is None:
            return False
        async with s.lock:
            await s.consumer.close(**close_kw)
        return True

    async def _reap(self) -> None:
        while True:
            await asyncio.sleep(REAP_INTERVAL_S)
            now = time.monotonic()
            for key, s in list(self._by_key.items()):
                if s.idle_s(now) * 1000 >= s.idle_timeout_ms:
                    log.info("closing %s: idle for %.0f s", "/".join(key), s.idle_s(now))
                    try:
                        await self.remove(key, **_close_kw(s.consumer))
                    except Exception as e:  # one that cannot close cleanly must not stop the reaper
                        log.warning("closing %s: %s", "/".join(key), e)

    async def close(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            await asyncio.gather(self._reaper, return_exceptions=True)
        for key in list(self._by_key):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.remove(key, **_close_kw(self._by_key[key].consumer)), 10)


def _close_kw(consumer: Any) -> dict[str, Any]:
    # an expired member does not commit: what it polled and nobody committed is delivered again
    return {"commit": False} if hasattr(consumer, "member_id") else {}
