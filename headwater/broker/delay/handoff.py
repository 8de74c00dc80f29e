"""Delayed messages on a cluster: the dispatcher delivers only to partitions this broker
leads, and a partition's pending delayed batches move with it (docs/design/delay.md, "On a
cluster"; docs/design/cluster.md, "Moving a partition").

- **Holding.** With a :class:`DeliveryGate` (a cluster member has one from the moment it
  opens), a run comes due only if the gate names a leader epoch for its partition here, at
  least the batch's own ``gate`` (0 for a batch accepted here). Otherwise it is *held*: left
  PENDING and looked at again after ``hold_ms``. The append itself runs inside the gate's
  ``delivering`` (the cluster's ``producing``), so a fence waits for it, or refuses it.
- **Handing off** (the source, fenced): :meth:`DelayHandoff.hand_off` pages through the
  partition's batches in the order it accepted them (``accept_seq``; an adopted batch took
  its place when adopted, in the same order), each with the delayed offset its producer was
  given (``origin``). Adopting in that order keeps each producer's sequences in order in the
  target's idempotence table, as recovery replays them.
- **Adopting** (the target): :meth:`DelayHandoff.adopt` writes each as an ADOPTED record and
  its SCHEDULE record (with its cancels and delivered runs) into the bucket of its origin
  when it can, numbered at or after the origin's number, so a later id of this broker never
  names an adopted one; its ``gate`` is the leader epoch the switch will give this broker.
  :meth:`DelayHandoff.forget` closes every open batch of a partition with a MOVED record: the
  target before it adopts (a repeated hand-off replaces the last one whole), the source once
  ZooKeeper shows the partition's new owner, a target whose move rolled back likewise.

An adopted batch is found by its origin through ``_aliases``, in memory for every adopted
batch until its bucket file is deleted (about 100 bytes each). A hand-off finds the batches
of bucket files not loaded through each bucket's index
(:class:`~headwater.broker.delay.buckets.BucketIndex`; the first page makes the missing ones
outside the service's lock): under the lock a page reads only its own batches, however many
more the partition has.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Protocol

from headwater.broker.delay.buckets import Bucket, Entry, replay
from headwater.broker.delay.lifecycle import State
from headwater.errors import ClosedError, InvalidArgumentError, NotLeaderError, UnavailableError
from headwater.model.batch import decode_deliver_offsets, decode_header
from headwater.model.delay import (
    DELAYED_PARTITION_BIT,
    NUMBER_LIMIT,
    HandedOffBatch,
    HandoffPage,
    delay_offset,
    split_delay_offset,
)
from headwater.storage.schedule import (
    ADOPTED,
    CANCELLED,
    DELIVERED,
    MOVED,
    REC_HEAD_SIZE,
    SCHEDULE,
    ScheduleRecord,
    encode_record,
)

__all__ = ["DeliveryGate", "HOLD_ALL", "DelayHandoff"]

DISPATCHING_WAIT_S = 10.0  # a hand-off waits this long for runs being appended to settle


class DeliveryGate(Protocol):
    """What the delay service asks of a cluster member before it delivers."""

    def leader_epoch(self, queue_id: int, partition: int) -> int | None:
        """The leader epoch at which this broker leads the partition now and may append to
        it (not fenced by a move), or None."""
        ...

    def delivering(self, queue_id: int, partition: int) -> AbstractContextManager[None]:
        """Around a delivery's append: refuses (NotLeaderError) unless it may append."""
        ...


class _HoldAll:
    """The gate of a cluster member that has not joined yet: it delivers nothing."""

    def leader_epoch(self, queue_id: int, partition: int) -> int | None:
        return None

    def delivering(self, queue_id: int, partition: int) -> AbstractContextManager[None]:
        raise NotLeaderError("this broker has not joined its cluster yet: it delivers no delayed message")


HOLD_ALL: DeliveryGate = _HoldAll()


class DelayHandoff:
    """The part of :class:`~headwater.broker.delay.service.DelayService` that moves delayed
    batches with their partition (its state is the service's)."""

    def deliverable_locked(self, e: Entry) -> bool:
        """Whether ``e``'s partition is this broker's to deliver to now (see the module)."""
        gate = self.gate
        if gate is None:
            return True
        epoch = gate.leader_epoch(e.queue_id, e.partition)
        return epoch is not None and epoch >= e.gate

    def hold_locked(self, b: Bucket, e: Entry, run: int, now: int) -> None:
        g = e.runs[run]
        g.attempt_ms = now + self.limits.hold_ms
        heapq.heappush(self._heap, (g.attempt_ms, b.start_ms, e.number, run))

    # -- the partitions' open batches ------------------------------------------------------

    def _entries_of_locked(self, queue_id: int, partition: int) -> Iterator[tuple[Bucket, Entry]]:
        """Every batch of the partition with a run still open, in bucket order; in a bucket
        not loaded each is read from its file by the bucket's index (a copy, not the
        service's entry)."""
        for start in list(self._order):
            b = self._buckets[start]
            if not b.pending_batches:
                continue
            if b.loaded and b.entries is not None:
                for e in list(b.entries.values()):
                    if e.queue_id == queue_id and e.partition == partition and e.is_open:
                        yield b, e
                continue
            index = self._index_locked(b)
            for i in index.batches_of(queue_id, partition):
                e = index.entry_at(b.file, i)
                if e.is_open:
                    yield b, e

    def _handed_off_after_locked(
        self, queue_id: int, partition: int, after: int
    ) -> list[tuple[int, Bucket, Entry | int]] | None:
        """Every batch of the partition its buckets still hold (open or not) accepted after
        ``after``, in accept order: (accept_seq, bucket, entry), or an index of the bucket's
        :class:`~headwater.broker.delay.buckets.BucketIndex` in place of the entry of a
        bucket not loaded (read when a page takes it: a page reads only its own batches).
        None while a run of the partition is being appended (only a loaded bucket has one)."""
        found: list[tuple[int, Bucket, Entry | int]] = []
        for start in list(self._order):
            b = self._buckets[start]
            if b.loaded and b.entries is not None:
                for e in b.entries.values():
                    if e.queue_id != queue_id or e.partition != partition:
                        continue
                    if any(g.state == State.DISPATCHING for g in e.runs):
                        return None
                    if e.accept_seq > after:
                        found.append((e.accept_seq, b, e))
            else:
                index = self._index_locked(b)
                found += ((index.seqs[i], b, i) for i in index.batches_of(queue_id, partition, after))
        found.sort(key=lambda t: t[0])
        return found

    def partitions_with_batches(self) -> set[tuple[int, int]]:
        """(queue id, partition) of every partition that may have open batches here (a
        superset: :meth:`forget` takes one out once it finds none)."""
        with self._lock:
            return set(self._partitions)

    # -- the source ----------------------------------------------------------------------------

    def hand_off(self, queue_id: int, partition: int, after: int, max_bytes: int) -> HandoffPage:
        """The partition's batches accepted here after ``after`` (an ``accept_seq``; -1: from
        the first), about
        ``max_bytes`` of them: the open ones, and those delivered or cancelled whose bucket is
        still kept (so their ids still answer on the new leader). The caller checked that the
        partition is fenced here, so nothing is accepted, cancelled or delivered for it
        meanwhile; runs being appended when it fenced are waited for (their append was
        refused, or done before the fence)."""
        with self._lock:
            starts = list(self._order)
        for start in starts:  # each bucket not loaded read once, holding up nobody (the first page)
            self._index_bucket_unlocked(start)
        deadline = time.monotonic() + DISPATCHING_WAIT_S
        while True:
            with self._lock:
                found = self._handed_off_after_locked(queue_id, partition, after)
                if found is not None:
                    return self._page_locked(found, max_bytes)
            if time.monotonic() > deadline:
                raise UnavailableError(
                    f"delayed messages of partition {partition} are still being delivered here; ask again"
                )
            time.sleep(0.02)

    def _page_locked(self, found: list[tuple[int, Bucket, Entry | int]], max_bytes: int) -> HandoffPage:
        out: list[HandedOffBatch] = []
        size = 0
        for accept_seq, b, e in found:
            if isinstance(e, int):
                assert b.index is not None
                e = b.index.entry_at(b.file, e)
            if out and size + e.size > max_bytes:
                return HandoffPage(out, True)
            gone = set(e.cancelled or ())
            for g in e.runs:
                if g.state in (State.DROPPED, State.MOVED):
                    gone.update(range(g.first, g.end))
            delivered = [(g.first, g.delivered_offset) for g in e.runs if g.state == State.DELIVERED]
            batch = b.file.read(e.position, e.size)
            out.append(HandedOffBatch(_origin(b, e), accept_seq, e.accepted_ms, batch, sorted(gone), delivered))
            size += e.size
        return HandoffPage(out, False)

    # -- the target ------------------------------------------------------------------------------

    def adopt(self, queue_id: int, partition: int, batches: list[HandedOffBatch], gate: int) -> None:
        """Take ``batches`` of the partition from its old leader, durably: they are
        delivered here only once this broker leads the partition at leader epoch ``gate``
        or later. Call :meth:`forget` first: a batch adopted twice is kept twice."""
        self._check_writable()
        now = self.now_ms()
        with self._lock:
            if self.closed:
                raise ClosedError("the broker is closed")
            for hb in batches:
                self._adopt_one_locked(queue_id, partition, hb, gate, now)
            writes = self._writes
        self._commit.wait_durable(writes)

    def _adopt_one_locked(self, queue_id: int, partition: int, hb: HandedOffBatch, gate: int, now: int) -> None:
        h = decode_header(hb.batch)
        offsets = decode_deliver_offsets(hb.batch, h)
        o_start, o_number = split_delay_offset(hb.origin)
        floor_start = -(-self._floor_ms // self.bucket_ms) * self.bucket_ms
        # the origin's own bucket when this broker may still have it: numbered at or after
        # the origin, so no id this broker gives later names the adopted batch
        own = o_start % self.bucket_ms == 0 and o_start >= floor_start
        start = o_start if own else self._bucket_start(h.deliver_at_ms)
        b = self._buckets.get(start) or self._new_bucket_locked(start, now)
        n = max(b.next_number, o_number) if own else b.next_number
        if n + h.count > NUMBER_LIMIT:
            raise InvalidArgumentError(f"the schedule bucket starting at {start} is full; the move is tried again")
        self._accept_seq += 1
        parts = encode_record(ADOPTED, queue_id, partition, 0, n, gate, 0, hb.origin)
        parts += encode_record(
            SCHEDULE, queue_id, partition, h.count, n, h.deliver_at_ms, hb.accepted_ms, self._accept_seq, hb.batch
        )
        for i in hb.cancelled:
            parts += encode_record(CANCELLED, queue_id, partition, i, n, now)
        for first, offset in hb.delivered:
            parts += encode_record(DELIVERED, queue_id, partition, first, n, now, offset)
        pos = self._write_locked(b, parts) + REC_HEAD_SIZE  # the SCHEDULE record's
        producer = (h.producer_id, h.base_sequence, h.producer_epoch)
        rec = ScheduleRecord(
            SCHEDULE, queue_id, partition, h.count, n, h.deliver_at_ms, hb.accepted_ms, self._accept_seq,
            pos, len(hb.batch), producer, offsets,
        )  # fmt: skip
        # the same records, replayed: memory says what the file says
        entries: dict[int, Entry] = {}
        replay(self._records_of(rec, gate, hb), entries, [])
        e = entries[n]
        b.next_number = max(b.next_number, n + h.count)
        b.pending_messages += e.pending_messages
        if e.is_open:
            b.pending_batches += 1
        if b.loaded:
            self._add_entry_locked(b, e)
        self._aliases.setdefault((queue_id, partition, o_start), {})[o_number] = (h.count, start, n)
        self._partitions.add((queue_id, partition))
        # a retry of the batch, sent to this broker now, is answered with the id it was given
        self._producers.record(h, queue_id, partition | DELAYED_PARTITION_BIT, hb.origin, hb.accepted_ms)

    @staticmethod
    def _records_of(rec: ScheduleRecord, gate: int, hb: HandedOffBatch) -> Iterator[ScheduleRecord]:
        q, p, n = rec.queue_id, rec.partition, rec.number
        yield ScheduleRecord(ADOPTED, q, p, 0, n, gate, 0, hb.origin, 0, 0, None)
        yield rec
        for i in hb.cancelled:
            yield ScheduleRecord(CANCELLED, q, p, i, n, 0, 0, 0, 0, 0, None)
        for first, offset in hb.delivered:
            yield ScheduleRecord(DELIVERED, q, p, first, n, 0, offset, 0, 0, 0, None)

    def forget(self, queue_id: int, partition: int) -> int:
        """Close every open batch of the partition with a MOVED record (durably): another
        broker holds them now. The number of batches being appended right now, left open
        (call again)."""
        self._check_writable()
        with self._lock:
            busy = 0
            for b, e in list(self._entries_of_locked(queue_id, partition)):
                if any(g.state == State.DISPATCHING for g in e.runs):
                    busy += 1
                    continue
                self._write_locked(b, encode_record(MOVED, queue_id, partition, 0, e.number, self.now_ms()))
                b.pending_messages -= e.pending_messages
                b.pending_batches -= 1
                e.move_away()  # on a loaded entry this is the state; else the file holds it
                if e.origin is not None:
                    self._drop_alias_locked(e, b.start_ms)
            if not busy:
                self._partitions.discard((queue_id, partition))
            writes = self._writes
        self._commit.wait_durable(writes)
        return busy

    # -- ids of adopted batches ----------------------------------------------------------------

    def _alias_locked(self, queue_id: int, partition: int, offset: int) -> tuple[int, int, int] | None:
        """Where the adopted message with delayed offset ``offset`` is here: (bucket start,
        its batch's number, its index in the batch), or None."""
        start, number = split_delay_offset(offset)
        found = self._aliases.get((queue_id, partition, start))
        if not found:
            return None
        for first, (count, local_start, local_number) in found.items():
            if first <= number < first + count:
                return local_start, local_number, number - first
        return None

    def _drop_alias_locked(self, e: Entry, local_start: int) -> None:
        assert e.origin is not None
        o_start, o_number = split_delay_offset(e.origin)
        found = self._aliases.get((e.queue_id, e.partition, o_start))
        if found is not None and found.get(o_number, (0, -1, -1))[1:] == (local_start, e.number):
            del found[o_number]
            if not found:
                del self._aliases[(e.queue_id, e.partition, o_start)]

    def _note_adopted_locked(self, e: Entry, local_start: int) -> None:
        """Recovery: index an adopted batch by its origin, unless it moved away since."""
        if e.origin is None or any(g.state == State.MOVED for g in e.runs):
            return
        o_start, o_number = split_delay_offset(e.origin)
        self._aliases.setdefault((e.queue_id, e.partition, o_start), {})[o_number] = (e.count, local_start, e.number)

    def _forget_aliases_of_locked(self, b: Bucket) -> None:
        """A bucket file is deleted: its adopted batches are no longer found by origin."""
        for key in list(self._aliases):
            found = self._aliases[key]
            for first in [k for k, v in found.items() if v[1] == b.start_ms]:
                del found[first]
            if not found:
                del self._aliases[key]


def _origin(b: Bucket, e: Entry) -> int:
    """The delayed offset the producer of ``e`` was given for its first message."""
    return e.origin if e.origin is not None else delay_offset(b.start_ms, e.number)
