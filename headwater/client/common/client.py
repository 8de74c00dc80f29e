"""The admin facade a user holds, written once: :class:`AdminBase`.

``Admin`` and ``AsyncAdmin`` are this base with a driver (:mod:`.twins`): a method that asks
the broker blocks in one and is a coroutine in the other.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable
from datetime import datetime
from typing import Any, TypeVar

from headwater.client.common.twins import Twins, waits
from headwater.errors import QueueExistsError, QueueNotFoundError
from headwater.model.checks import check_int_arg, mapping_copy
from headwater.model.config import QueueConfig, QueueInfo, validate_queue_name
from headwater.model.keyed import KeyedGroupInfo
from headwater.model.subscription import SubscriberInfo, subscriber_settings

__all__ = ["AdminBase"]

_UNSET = object()

T = TypeVar("T")
#: a ``@waits`` body: it yields service calls and returns the driven method's result
Waits = Generator[Any, Any, T]


class AdminBase(Twins):
    """Create, inspect and change queues; each method is one broker call (a coroutine in
    :class:`~headwater.client.aio.client.AsyncAdmin`)."""

    def __init__(self, service: Any) -> None:
        self._service = service

    @waits
    def create_queue(
        self,
        name: str,
        *,
        partitions: int = 1,
        ttl_s: int | None | object = _UNSET,
        flush: str | None = None,
        message_bytes_max: int = 1024 * 1024,
        settings: dict[str, str] | None = None,
        exist_ok: bool = False,
    ) -> Waits[QueueInfo]:
        """Create a queue.

        ``ttl_s``: seconds a message is kept (default 7 days; ``None`` keeps forever).
        ``flush``: ``"sync"`` or ``"async"`` (default: the broker's policy).
        ``exist_ok``: if a queue of that name is there already, return it as it is (its
        partitions and settings may differ from these) instead of raising
        :class:`~headwater.errors.QueueExistsError`; Kafka's ``--if-not-exists``.
        """
        validate_queue_name(name)
        kw = {} if ttl_s is _UNSET else {"ttl_s": ttl_s}
        config = QueueConfig(
            partitions=partitions,
            flush=flush,
            message_bytes_max=message_bytes_max,
            settings=mapping_copy(settings or {}),
            **kw,
        ).validated()
        try:
            return (yield self._service.create_queue(name, config))
        except QueueExistsError:
            if not exist_ok:
                raise
            return (yield self._service.describe_queue(name))

    @waits
    def describe_queue(self, name: str) -> Waits[QueueInfo]:
        """The queue's settings, partitions and their offsets."""
        return (yield self._service.describe_queue(name))

    @waits
    def list_queues(self) -> Waits[list[QueueInfo]]:
        """Every queue, described."""
        return (yield self._service.list_queues())

    @waits
    def delete_queue(self, name: str, *, missing_ok: bool = False) -> Waits[None]:
        """Delete a queue and all its messages. ``missing_ok``: a queue that is not there is
        not an error (:class:`~headwater.errors.QueueNotFoundError` otherwise)."""
        try:
            yield self._service.delete_queue(name)
        except QueueNotFoundError:
            if not missing_ok:
                raise

    @waits
    def truncate_queue(self, name: str) -> Waits[QueueInfo]:
        """Drop every message, keep the queue and its settings. Offsets keep counting up."""
        return (yield self._service.truncate_queue(name))

    @waits
    def disable_queue(self, name: str) -> Waits[QueueInfo]:
        """Refuse reads and writes (with QueueDisabledError) until enabled again."""
        return (yield self._service.set_queue_enabled(name, False))

    @waits
    def enable_queue(self, name: str) -> Waits[QueueInfo]:
        """Accept reads and writes again after ``disable_queue``."""
        return (yield self._service.set_queue_enabled(name, True))

    @waits
    def add_partitions(self, name: str, partitions: int) -> Waits[QueueInfo]:
        """Grow the queue to ``partitions`` partitions in total."""
        check_int_arg(partitions, "a partition count")
        return (yield self._service.add_partitions(name, partitions))

    # keyed groups (headwater.client.sync.keyed_consumer, headwater.client.aio.keyed_consumer)
    @waits
    def describe_keyed_group(self, group: str, queue: str) -> Waits[KeyedGroupInfo]:
        """A keyed group's size, key, generation, positions and any resize under way."""
        return (yield self._service.keyed_group(queue, group))

    @waits
    def resize_keyed_group(self, group: str, queue: str, size: int) -> Waits[KeyedGroupInfo]:
        """Change a keyed group's number of members, safely for per-key order: members of
        the current size drain up to a barrier (the end offsets now), then the new size
        applies from it. Returns at once; ``describe_keyed_group`` shows the progress.
        Resizing to 0 is an error; to the current size, nothing."""
        return (yield self._service.keyed_resize(queue, group, size))

    # push subscribers (attach to one with the client's ``subscribe``)
    @waits
    def add_subscriber(
        self,
        queue: str,
        name: str,
        *,
        partitions: int | Iterable[int] | None = None,
        tags: str | Iterable[str] | None = None,
        start: str | datetime | int = "latest",
    ) -> Waits[SubscriberInfo]:
        """Register subscriber ``name`` on ``queue``; processes attach with ``client.subscribe``.

        ``partitions``: the ones followed (all, and those added later, by default).
        ``tags``: the ones delivered (every message by default, or ``"*"``).
        ``start``: ``"latest"`` (what is appended from now on), ``"earliest"``, a time
        (datetime or epoch ms: the first message appended at or after it), or
        ``"offset:N"`` (that offset in each partition, kept within what it holds).
        :class:`SubscriberExistsError` if the name is taken.
        """
        return (yield self._service.add_subscriber(queue, name, *subscriber_settings(partitions, tags, start)))

    @waits
    def delete_subscriber(self, queue: str, name: str) -> Waits[None]:
        """Remove a subscriber and its checkpoint; a process attached to it stops."""
        yield self._service.delete_subscriber(queue, name)

    @waits
    def list_subscribers(self, queue: str | None = None) -> Waits[list[SubscriberInfo]]:
        """The subscribers of ``queue``, or of every queue."""
        return (yield self._service.list_subscribers(queue))

    @waits
    def describe_subscriber(self, queue: str, name: str) -> Waits[SubscriberInfo]:
        """A subscriber's settings, checkpoint and attached process, if any."""
        return (yield self._service.describe_subscriber(queue, name))
