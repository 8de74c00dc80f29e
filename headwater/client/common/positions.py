"""ConsumerPositions: what the sync and asyncio consumers keep, without any I/O.

A consumer keeps, per assigned partition, where its next read starts (``_fetch_pos``), what
the application has consumed (``_consumed``, the offset after the last record ``poll``
handed out: what a commit stores) and the records read and not yet handed out
(``_buffers``). Assigning, seeking to an offset or a message id, forgetting partitions and
checking the arguments of all of these move only that state, so they live here once, and
:class:`~headwater.client.sync.consumer.Consumer` and
:class:`~headwater.client.aio.consumer.AsyncConsumer` add the reads: a blocking call or a
coroutine around the same steps. Each names how it drops a read in flight for a partition
that moved (:meth:`_drop_fetch`).

Positions past a partition's end. ``seek`` only moves local state, so a seek past the end
is found by the next ``poll``, which asks the broker where the partitions it was told to
seek end (:meth:`_seeks_to_check`, :meth:`_check_seeks`) and raises
:class:`~headwater.errors.InvalidArgumentError` naming the end, as long as the position
stays there. A position the consumer finds past the end while reading (the queue was
deleted and created again, or a committed offset lies past a new queue's end) is moved by
``auto_offset_reset`` (:meth:`_reset_past_end`), as Kafka's consumer does on
OffsetOutOfRange: reading on from there would skip every record up to it, silently. A queue
created again already past the positions is told by the queue id every stored batch
carries (:meth:`_off_course`): all its partitions are moved alike (:meth:`_queue_recreated`).
"""

from __future__ import annotations

import concurrent.futures
import itertools
import logging
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any

from headwater.client.common.closing import Closable
from headwater.client.common.waking import Wakes
from headwater.client.core.membership import TP, by_queue
from headwater.client.core.reads import POLL_MESSAGES_DEFAULT, check_read_settings, positive_int
from headwater.client.transport.cluster_fetch import ClusterFetchStreams, PlansFetchStreams
from headwater.client.transport.fetch_stream import STREAM_WINDOW_BYTES, FetchStreams, FetchStreamsBase
from headwater.client.transport.polling import Outage, RecordBuffers
from headwater.errors import InvalidArgumentError, InvalidMessageIdError
from headwater.model.batch import decode_header, tags_mask
from headwater.model.checks import tag_filter_arg
from headwater.model.config import QueueInfo
from headwater.model.groups import validate_group_name
from headwater.model.message import MessageId
from headwater.model.positions import OFFSET_MAX
from headwater.model.service import OpensFetchStreams

__all__ = ["ConsumerPositions", "TP"]

log = logging.getLogger("headwater.consumer")


class ConsumerPositions(Closable, Wakes):
    """The positions, buffers and settings of a consumer (see the module's docstring).

    ``group`` names where ``commit`` stores positions, so the next consumer of the group
    resumes there. ``auto_offset_reset`` (``"earliest"`` or ``"latest"``) is where a
    partition without a committed position starts. ``fetch_bytes`` bounds one fetch;
    ``max_poll_messages`` bounds one ``poll`` and the records buffered per partition.
    ``tags`` filters on the broker. Over the network, ``stream`` has the broker push new
    batches (fetch streams, up to ``stream_window_bytes`` unread) instead of answering a
    fetch per batch.
    """

    _kind = "consumer"

    def __init__(
        self,
        service: Any,
        *,
        group: str | None = None,
        auto_offset_reset: str = "earliest",
        fetch_bytes: int = 1024 * 1024,
        max_poll_messages: int = POLL_MESSAGES_DEFAULT,
        tags: str | Iterable[str] | None = None,
        stream: bool = True,
        stream_window_bytes: int = STREAM_WINDOW_BYTES,
    ) -> None:
        if auto_offset_reset not in ("earliest", "latest"):
            raise InvalidArgumentError(f"auto_offset_reset is 'earliest' or 'latest', got {auto_offset_reset!r}")
        check_read_settings(fetch_bytes=fetch_bytes, max_poll_messages=max_poll_messages)
        if group is not None and group != "":  # (none: a consumer that does not commit)
            validate_group_name(group)
        self._service = service
        self.group = group
        self.auto_offset_reset = auto_offset_reset
        self._fetch_bytes = fetch_bytes
        self.max_poll_messages = max_poll_messages
        self._tags = tag_filter_arg(tags)
        self._mask = tags_mask(self._tags) if self._tags else 0
        self._fetch_pos: dict[TP, int] = {}
        self._consumed: dict[TP, int] = {}
        # each assigned partition's position as this consumer's last commit of it stored it:
        # a commit of everything leaves out the partitions still there
        self._stored: dict[TP, int] = {}
        self._seeked: set[TP] = set()  # positions seek() set and poll() has not checked yet
        self._paused: set[TP] = set()  # pause()d: neither read nor handed out until resume()
        self._buffers: RecordBuffers[TP] = RecordBuffers()
        self._inflight: dict[TP, tuple[int, Any]] = {}  # a read per partition: (its position, future or task)
        self._dropped: set[Any] = set()  # reads a seek dropped, not yet ended (the asyncio kind awaits them)
        self._rotation = itertools.count()  # which partition's read is launched first, turn by turn
        self._outage = Outage(service)  # reads that failed while the broker restarts are tried again
        self._queue_ids: dict[str, int] = {}
        self._reset_in: set[TP] = set()  # moved past its end: into the queue created again, maybe
        self._closed = False
        # a future a subclass may complete to end a waiting poll early (the group consumers
        # do, when their assignment changes)
        self._wakeup: Any = None
        self._woken = False  # wakeup() was called (the sync consumers'): a poll raises WakeupError
        self._push_waiter: Any = None  # a future the next push completes (fetch streams)
        # over the network, with stream=True: the broker pushes the partitions' batches
        # (fetch streams) instead of answering a FETCH per batch; embedded, it changes nothing
        self._streams: FetchStreamsBase | None = None
        if not positive_int(stream_window_bytes):  # checked embedded too: the same code runs on a broker later
            raise InvalidArgumentError(f"stream_window_bytes must be a positive int, got {stream_window_bytes!r}")
        kind = FetchStreams if isinstance(service, OpensFetchStreams) else ClusterFetchStreams  # a stream per leader
        if stream and (kind is FetchStreams or isinstance(service, PlansFetchStreams)):
            self._streams = kind(
                service,
                window_bytes=stream_window_bytes,
                tag_mask=self._mask,
                push_bytes_max=fetch_bytes,
                notify=self._push_arrived,
                outage=self._outage,
            )

    # -- assigning ------------------------------------------------------------------------

    def _start(self, queue: str, info: QueueInfo, parts: list[int], committed: dict[int, int]) -> None:
        """Read ``parts`` of ``queue`` from the group's ``committed`` offsets, else from the
        start or the end (``auto_offset_reset``). A committed offset before the log's start
        is kept: the first read, at the partition's leader, skips what expired. (``info`` may
        come from a broker that led the partition before a move and dropped its copy: its
        start would skip messages the leader still has.) A partition not online (its leader
        out of reach: its offsets unknown) starts from the committed offset, else from 0,
        and its first read at the leader moves a position before its start or past its end."""
        self._queue_ids[queue] = info.queue_id
        for p in parts:
            pi = info.partitions[p]
            if not pi.online:
                if p not in committed and self.auto_offset_reset == "latest":
                    log.warning(
                        "%s[%d]: its leader is out of reach, so its end is not known; reading it from its start "
                        "(auto_offset_reset='latest' needs the end)",
                        queue,
                        p,
                    )
                self._set_position((queue, p), committed.get(p, 0))
                continue
            if p in committed and committed[p] <= pi.end_offset:
                pos = committed[p]
            else:
                pos = pi.start_offset if self.auto_offset_reset == "earliest" else pi.end_offset
                if p in committed:  # past the end: the queue was deleted and created again, say
                    log.warning(
                        "%s[%d]: the committed offset %d is past the end of the log (%d); starting at %d "
                        "(auto_offset_reset=%r)",
                        queue,
                        p,
                        committed[p],
                        pi.end_offset,
                        pos,
                        self.auto_offset_reset,
                    )
            self._set_position((queue, p), pos)

    def unassign(self, queue: str | None = None) -> None:
        """Stop reading ``queue`` (every queue when None)."""
        self._forget([tp for tp in self._fetch_pos if queue is None or tp[0] == queue])

    def _forget(self, tps: Iterable[TP]) -> None:
        for tp in tps:
            for d in (self._fetch_pos, self._consumed, self._stored, self._buffers):
                d.pop(tp, None)
            self._seeked.discard(tp)
            self._reset_in.discard(tp)
            self._paused.discard(tp)  # assigned again (a rebalance), it is read at once
            self._drop_fetch(tp)
            if self._streams is not None:
                self._streams.close(tp[0])

    # -- pausing --------------------------------------------------------------------------

    def pause(self, queue: str, partitions: int | Iterable[int] | None = None) -> None:
        """Stop reading these assigned partitions of ``queue`` (all when None) until
        :meth:`resume`, as Kafka's ``pause``: ``poll`` hands out the others' records only,
        and the broker sends nothing more of these. Their positions and the records already
        read stay; a group member stays in its group (its heartbeats go on), so an
        application that cannot keep up goes on polling without taking more. A partition
        that leaves the assignment (a rebalance, ``unassign``) is no longer paused."""
        tps = [tp for tp in self._parts(queue, partitions) if tp not in self._paused]
        if tps:
            self._paused.update(tps)
            self._read_again(queue)

    def resume(self, queue: str, partitions: int | Iterable[int] | None = None) -> None:
        """Read paused partitions of ``queue`` again (all of its paused ones when None), from
        where they stood."""
        tps = [tp for tp in self._parts(queue, partitions) if tp in self._paused]
        if tps:
            self._paused.difference_update(tps)
            self._read_again(queue)

    def paused(self) -> list[TP]:
        """The partitions :meth:`pause` stopped, as ``(queue, partition)``, sorted."""
        return sorted(self._paused)

    def _read_again(self, queue: str) -> None:
        """Reads of ``queue`` start again on the next poll, over the partitions not paused
        (a fetch stream carries its partitions from when it opened: ended here, pushes not
        taken yet are read again from the positions)."""
        if self._streams is not None:
            self._streams.close(queue)

    def _reading(self) -> dict[TP, int]:
        """The positions to read from: those of the partitions not paused."""
        if not self._paused:
            return self._fetch_pos
        paused = self._paused
        return {tp: pos for tp, pos in self._fetch_pos.items() if tp not in paused}

    def _moved_since_stored(self) -> dict[TP, int]:
        """What a commit of every assigned partition stores: the consumed positions this
        consumer has not stored as they are (after a poll that read 500 messages of 10,000
        partitions, 500 at most)."""
        stored = self._stored
        return {tp: off for tp, off in self._consumed.items() if stored.get(tp) != off}

    def _note_stored(self, queue: str, offsets: dict[int, int]) -> None:
        """A commit of ``queue``'s ``{partition: offset}`` succeeded."""
        for part, off in offsets.items():
            if (queue, part) in self._consumed:  # not forgotten meanwhile
                self._stored[(queue, part)] = off

    @property
    def streams(self) -> dict[str, dict[int, list[int]]]:
        """The fetch streams open (or opening) now: queue -> {broker id: the partitions its
        stream carries}; a broker alone is ``-1``, as METADATA names it; on a cluster, one
        stream per leader. Fetching (``stream=False``, embedded): ``{}``."""
        return self._streams.streams if self._streams is not None else {}

    def assignment(self) -> list[TP]:
        return sorted(self._fetch_pos)

    # -- positions ------------------------------------------------------------------------

    def position(self, queue: str, partition: int) -> int:
        """The offset of the next record ``poll`` will return from this partition."""
        return self._consumed[self._tp(queue, partition)]

    def seek(self, queue: str, partition: int, offset: int) -> None:
        """Continue ``partition`` from ``offset``: from the partition's start if that is
        before it; at most its end offset (where the next message goes). A seek moves only
        local state: the next ``poll`` checks the offset, and raises
        :class:`~headwater.errors.InvalidArgumentError` naming the end while it is past it."""
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise InvalidArgumentError(f"an offset is an int >= 0, got {offset!r}")
        tp = self._tp(queue, partition)
        self._set_position(tp, offset)
        self._seeked.add(tp)

    def seek_to_id(self, message_id: MessageId | str) -> None:
        """Continue the message's partition from that message."""
        mid = MessageId.parse(message_id)
        if mid.is_delayed:
            raise InvalidMessageIdError(
                f"{mid} is a delayed message's id: it names the message's place in the delay schedule, "
                f"not a position in partition {mid.target_partition}'s log, until it is delivered; then "
                f"get(id) returns it as stored, with its partition's id (record.message_id) to seek to "
                f"(or seek_to_time() its scheduled_ms)"
            )
        for queue, qid in self._queue_ids.items():
            if qid == mid.queue_id:
                self.seek(queue, mid.partition, mid.offset)
                return
        raise InvalidArgumentError(f"message id {mid} is not of an assigned queue")

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

    def _seeks_to_check(self) -> list[str]:
        """The queues with positions ``seek()`` set that ``poll()`` has not checked yet
        (against their ends: the consumer asks the broker, then :meth:`_check_seeks`)."""
        return sorted({q for q, _ in self._seeked}) if self._seeked else []  # every poll asks: none, mostly

    def _check_seeks(self, queue: str, info: QueueInfo) -> None:
        """Check the positions ``seek()`` set in ``queue`` against the partitions' ends in
        ``info``: raise InvalidArgumentError for one past its end (it stays there, and
        so does the error, until another seek), forget the others."""
        for tp in sorted(tp for tp in self._seeked if tp[0] == queue):
            self._seeked.discard(tp)
            if tp[1] >= len(info.partitions) or not info.partitions[tp[1]].online:
                continue  # created again, smaller (its read raises PartitionOutOfRangeError), or its end unknown
            end = info.partitions[tp[1]].end_offset
            pos = self._fetch_pos[tp]
            if pos > end:
                self._seeked.add(tp)
                raise InvalidArgumentError(
                    f"{queue}[{tp[1]}]: seek() to offset {pos} is past the end of the log, {end} (the offset of the "
                    f"next message); seek to an offset up to {end}, or seek_to_end({queue!r}, {tp[1]})"
                )

    def _off_course(self, tp: TP, start_offset: int, end_offset: int, batches: Sequence[Any]) -> bool:
        """Whether a read of ``tp`` (the partition's bounds and the batches it returned)
        shows that the position no longer means what it did, having moved it: past the end
        (:meth:`_reset_past_end`), or batches of another queue id than this consumer's: the
        queue was deleted and created again under it (:meth:`_queue_recreated`)."""
        if self._fetch_pos[tp] > end_offset:
            self._reset_past_end(tp, start_offset, end_offset)
            return True
        if not batches:
            return False
        known = self._queue_ids.get(tp[0])
        queue_id = decode_header(batches[0]).queue_id
        if known is None or queue_id == known:
            self._reset_in.discard(tp)
            return False
        # a partition moved past its end already stays where that put it, in the new queue;
        # either way this read is not taken: moving the others drops what was read with it
        keep = tp if tp in self._reset_in else None
        self._reset_in.discard(tp)
        self._queue_recreated(tp[0], known, queue_id, keep=keep)
        return True

    def _queue_recreated(self, queue: str, old_id: int, new_id: int, keep: TP | None = None) -> None:
        """A read returned the batches of a new queue of this name (every stored batch
        carries its queue's id, and this one is another): positions in the old queue mean
        nothing in the new one, so each partition of it (but ``keep``, whose position a read
        past the end moved already) goes by ``auto_offset_reset``: to its start (0: a first
        read skips what is not retained) or past its end, which its next read moves to the end."""
        earliest = self.auto_offset_reset == "earliest"
        log.warning(
            "queue %r was deleted and created again (queue id %d, now %d): positions in the old one mean "
            "nothing in the new one, so its partitions are read from their %s (auto_offset_reset=%r)",
            queue,
            old_id,
            new_id,
            "start" if earliest else "end",
            self.auto_offset_reset,
        )
        self._queue_ids[queue] = new_id
        for tp in [t for t in self._fetch_pos if t[0] == queue]:
            # ``keep`` read again from where it is (a stream's next pushes would be past it)
            self._set_position(tp, self._fetch_pos[tp] if tp == keep else 0 if earliest else OFFSET_MAX)
            self._reset_in.discard(tp)

    def _reset_past_end(self, tp: TP, start_offset: int, end_offset: int) -> None:
        """A read found the partition's position past its end: the queue was deleted and
        created again, or lost records its broker had not flushed. Move it by
        ``auto_offset_reset``: to ``start_offset`` or ``end_offset``."""
        pos = start_offset if self.auto_offset_reset == "earliest" else end_offset
        log.warning(
            "%s[%d]: the position %d is past the end of the log (%d): the queue was created again, or "
            "lost records; going on from %d (auto_offset_reset=%r)",
            tp[0],
            tp[1],
            self._fetch_pos.get(tp),
            end_offset,
            pos,
            self.auto_offset_reset,
        )
        self._set_position(tp, pos)
        self._reset_in.add(tp)  # its next batches may be of the queue created again: read on there

    def _set_position(self, tp: TP, offset: int) -> None:
        self._seeked.discard(tp)
        self._fetch_pos[tp] = offset
        self._consumed[tp] = offset
        self._buffers[tp] = deque()
        self._drop_fetch(tp)
        if self._streams is not None:
            self._streams.close(tp[0])  # the next poll streams from here

    def _drop_fetch(self, tp: TP) -> None:
        """Forget the partition's read in flight: its answer is for an old position."""
        self._inflight.pop(tp, None)

    def _push_arrived(self) -> None:
        """A push came (on any thread, or on the loop): end the wait for one. (:func:`settle`
        inline: this runs once per push, in the thread that reads it.)"""
        waiter = self._push_waiter
        if waiter is not None and not waiter.done():
            try:
                waiter.set_result(None)
            except concurrent.futures.InvalidStateError:  # done meanwhile, on another thread
                pass

    # -- polling and committing -----------------------------------------------------------

    def _to_commit(self, offsets: dict[TP, int] | None) -> dict[str, dict[int, int]]:
        """What ``commit(offsets)`` stores, by queue: the consumed positions of every assigned
        partition, or the given ``{(queue, partition): offset}``."""
        self._check_open()
        self._need_group("commit")
        return by_queue(self._consumed if offsets is None else offsets)

    def _need_group(self, what: str) -> None:
        if not self.group:
            raise InvalidArgumentError(f"{what} needs a group: create the consumer with group='name'")
