"""Reaching the broker from the Spark driver and from Spark workers, with errors that say
what went wrong and what to do.

Spark runs the connector's code in Python worker processes, on other machines once there is
a cluster: each task connects to ``servers`` itself over the network client. An error in a
worker reaches the user as the last line of a Python traceback inside Spark's exception, so
these messages carry the whole story: the address, the cause, and the fix.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import headwater
from headwater.client import Client
from headwater.errors import QueueNotFoundError, UnavailableError
from headwater.model.config import QueueInfo

__all__ = ["connect", "describe", "unavailable_means", "with_retries"]

T = TypeVar("T")


def connect(servers: str, *, connect_timeout_s: float, request_timeout_s: float, where: str = "a Spark task") -> Client:
    """A network client through the first of ``servers`` that answers. The client's bootstrap
    list tries them: it moves on from an address that refuses at once, within one
    ``connect_timeout_s`` for the whole list (an address given all of it in turn cost the
    driver and every task that long for each broker down ahead of the one that answers)."""
    try:
        return headwater.connect(servers, connect_timeout_s=connect_timeout_s, request_timeout_s=request_timeout_s)
    except UnavailableError as e:
        raise UnavailableError(
            f"{where} cannot reach the Headwater broker at servers={servers!r}: {e} "
            f"Check that the broker runs and that this address is reachable from every Spark "
            f"worker, not only from the driver (option connectTimeoutMs sets how long to try); a "
            f"streaming query that failed on this resumes from its checkpoint once the broker is back"
        ) from e


def describe(client: Client, queue: str, servers: str) -> QueueInfo:
    try:
        return client.admin.describe_queue(queue)
    except QueueNotFoundError:
        raise QueueNotFoundError(
            f"queue {queue!r} does not exist on the broker at {servers}; create it first, e.g. "
            f"'headwater --server {servers.split(',')[0].strip()} queue create {queue} --partitions 8', "
            f"or check the option 'queue'"
        ) from None


@contextmanager
def unavailable_means(what: str) -> Iterator[None]:
    """Turn the client's "broker unavailable" (after its own reconnects and retries) into an
    error that says what the task was doing and what the user can do about it."""
    try:
        yield
    except UnavailableError as e:
        raise UnavailableError(
            f"{what} failed: {e}. The broker stayed unavailable through the client's retries; "
            f"the Spark task fails. Once the broker is back, run the query again (a streaming "
            f"query resumes from its checkpoint, without losing or repeating messages)"
        ) from e


def with_retries(call: Callable[[], T], *, attempts: int = 3, backoff_s: float = 0.2, what: str) -> T:
    """Run ``call``, retrying while the broker is unavailable (a restart, a lost connection).

    For calls the client does not retry itself and that are safe to repeat: idempotent
    appends. (Reads and admin calls are retried by the network client.)"""
    for attempt in range(attempts):
        try:
            return call()
        except UnavailableError:
            if attempt == attempts - 1:
                with unavailable_means(what):
                    raise
            time.sleep(backoff_s * (2**attempt))
    raise AssertionError("unreachable")
