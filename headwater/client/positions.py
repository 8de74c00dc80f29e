"""ConsumerPositions: what the sync and asyncio consumers keep, without any I/O.

A consumer keeps, per assigned partition, where its next read starts (``_fetch_pos``), what
the application has consumed (``_consumed``, the offset after the last record ``poll``
handed out: what a commit stores) and the records read and not yet handed out
(``_buffers``). Assigning, seeking to an offset or a message id, forgetting partitions and
checking the arguments of all of these move only that state, so they live here once, and
:class:`~headwater.client.consumer.Consumer` and
:class:`~headwater.client.aio_consumer.AsyncConsumer` add the reads: a blocking call or a
coroutine around the same steps. Each names how it drops a read in flight for a partition
that moved (:meth:`_drop_fetch`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from headwater.errors import ClosedError, InvalidArgumentError
from headwater.model.batch import tags_mask
from headwater.model.message import MessageId, Record, to_epoch_ms
from headwater.model.config import QueueInfo
from headwater.client.fetch_stream import FetchStreams
from headwater.client.polling import Outage
from headwater.client.membership import TP, by_queue

__all__ = ["ConsumerPositions", "POLL_MESSAGES_DEFAULT", "TP"]

#: Records one poll returns at most, unless told otherwise: 32, as EQueue's batch pull.
POLL_MESSAGES_DEFAULT = 32


class ConsumerPositions:
    """The positions, buffers and settings of a consumer (see the module's docstring)."""

    def __init__(self, service: Any, *, group: str | None, auto_offset_reset: str, fetch_bytes: int,
                 max_poll_messages: int, tags: str | Iterable[str] | None, stream: bool, stream_window_bytes: int,
                 on_push: Callable[[], None]) -> None:
        if auto_offset_reset not in ("earliest", "latest"):
            raise InvalidArgumentError(f"auto_offset_reset is 'earliest' or 'latest', got {auto_offset_reset!r}")
        if isinstance(max_poll_messages, bool) or not isinstance(max_poll_messages, int) or max_poll_messages < 1:
            raise InvalidArgumentError("max_poll_messages must be a positive int")
        self._service = service
        self.group = group
        self.auto_offset_reset = auto_offset_reset
        self._fetch_bytes = fetch_bytes
        self.max_poll_messages = max_poll_messages
        if isinstance(tags, str):
            tags = [tags]
        self._tags = None if tags is None or "*" in tags else frozenset(tags)
        self._mask = tags_mask(self._tags) if self._tags else 0
        self._fetch_pos: dict[TP, int] = {}
        self._consumed: dict[TP, int] = {}
        self._buffers: dict[TP, deque[Record]] = {}
        self._inflight: dict[TP, tuple[int, Any]] = {}  # a read per partition: (its position, future or task)
        self._outage = Outage(service)  # reads that failed while the broker restarts are tried again
        self._queue_ids: dict[str, int] = {}
        self._closed = False
        # a future a subclass may complete to end a waiting poll early (the group consumers
        # do, when their assignment changes)
        self._wakeup: Any = None
        # over the network, with stream=True: the broker pushes the partitions' batches
        # (fetch streams) instead of answering a FETCH per batch; embedded, it changes nothing
        self._streams: FetchStreams | None = None
        if stream and hasattr(service, "open_fetch_stream"):
            if isinstance(stream_window_bytes, bool) or not isinstance(stream_window_bytes, int) \
                    or stream_window_bytes < 1:
                raise InvalidArgumentError("stream_window_bytes must be a positive int")
            self._streams = FetchStreams(service, window_bytes=stream_window_bytes, tag_mask=self._mask,
                                         push_bytes_max=fetch_bytes, notify=on_push, outage=self._outage)

    # -- assigning ------------------------------------------------------------------------

    def _start(self, queue: str, info: QueueInfo, parts: list[int], committed: dict[int, int]) -> None:
        """Read ``parts`` of ``queue`` from the group's ``committed`` offsets, else from the
        start or the end (``auto_offset_reset``)."""
        self._queue_ids[queue] = info.queue_id
        for p in parts:
            pi = info.partitions[p]
            if p in committed:
                pos = max(committed[p], pi.start_offset)
            else:
                pos = pi.start_offset if self.auto_offset_reset == "earliest" else pi.end_offset
            self._set_position((queue, p), pos)

    def unassign(self, queue: str | None = None) -> None:
        """Stop reading ``queue`` (every queue when None)."""
        self._forget([tp for tp in self._fetch_pos if queue is None or tp[0] == queue])

    def _forget(self, tps: Iterable[TP]) -> None:
        for tp in tps:
            for d in (self._fetch_pos, self._consumed, self._buffers):
                d.pop(tp, None)
            self._drop_fetch(tp)
            if self._streams is not None:
                self._streams.close(tp[0])

    def assignment(self) -> list[TP]:
        return sorted(self._fetch_pos)

    # -- positions ------------------------------------------------------------------------

    def position(self, queue: str, partition: int) -> int:
        """The offset of the next record ``poll`` will return from this partition."""
        return self._consumed[self._tp(queue, partition)]

    def seek(self, queue: str, partition: int, offset: int) -> None:
        """Continue ``partition`` from ``offset``."""
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise InvalidArgumentError(f"an offset is an int >= 0, got {offset!r}")
        self._set_position(self._tp(queue, partition), offset)

    def seek_to_id(self, message_id: MessageId | str) -> None:
        """Continue the message's partition from that message."""
        mid = MessageId.parse(message_id)
        for queue, qid in self._queue_ids.items():
            if qid == mid.queue_id:
                self.seek(queue, mid.partition, mid.offset)
                return
        raise InvalidArgumentError(f"message id {mid} is not of an assigned queue")

    @staticmethod
    def _when_ms(when: object) -> int:
        """A seek_to_time's ``when`` in epoch ms (a datetime or a number; None is refused)."""
        ms = to_epoch_ms(when, "when")  # type: ignore[arg-type]
        if ms is None:
            raise InvalidArgumentError("when must be a datetime or epoch milliseconds, got None")
        return ms

    def _tp(self, queue: str, partition: int) -> TP:
        tp = (queue, partition)
        if tp not in self._fetch_pos:
            raise InvalidArgumentError(f"{queue}[{partition}] is not assigned to this consumer; assign() it first")
        return tp

    def _parts(self, queue: str, partitions: int | Iterable[int] | None) -> list[TP]:
        """The assigned partitions a seek names (all of ``queue``'s when None)."""
        if partitions is None:
            tps = [tp for tp in self._fetch_pos if tp[0] == queue]
            if not tps:
                raise InvalidArgumentError(f"no partition of {queue!r} is assigned; assign() it first")
            return tps
        if isinstance(partitions, int):
            partitions = [partitions]
        return [self._tp(queue, p) for p in partitions]

    def _set_position(self, tp: TP, offset: int) -> None:
        self._fetch_pos[tp] = offset
        self._consumed[tp] = offset
        self._buffers[tp] = deque()
        self._drop_fetch(tp)
        if self._streams is not None:
            self._streams.close(tp[0])  # the next poll streams from here

    def _drop_fetch(self, tp: TP) -> None:
        """Forget the partition's read in flight: its answer is for an old position."""
        self._inflight.pop(tp, None)

    # -- polling and committing -----------------------------------------------------------

    def _gives_up(self, remaining: float) -> bool:
        """Whether a poll whose wait took no records returns empty-handed: its time is up, or
        a subclass woke it (``_wakeup``). (Asked only when nothing came: a poll that got
        records goes on without the call.)"""
        wakeup = self._wakeup
        return remaining <= 0 or (wakeup is not None and wakeup.done())

    def _to_commit(self, offsets: dict[TP, int] | None) -> dict[str, dict[int, int]]:
        """What ``commit(offsets)`` stores, by queue: the consumed positions of every assigned
        partition, or the given ``{(queue, partition): offset}``."""
        self._check_open()
        self._need_group("commit")
        return by_queue(self._consumed if offsets is None else offsets)

    def _need_group(self, what: str) -> None:
        if not self.group:
            raise InvalidArgumentError(f"{what} needs a group: create the consumer with group='name'")

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("this consumer is closed")
