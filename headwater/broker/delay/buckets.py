"""Buckets of the schedule in memory: a summary for every bucket file, the batches of the
buckets that come due soon ("loaded"), and how records of a file rebuild them.

A batch whose messages are due at several times (``FLAG_DELIVER_TIMES``) is delivered run
by run: an :class:`Entry` holds one :class:`Run` per deliver time, each with its own state
(headwater.broker.delay.lifecycle). A batch of one deliver time has one run.

Memory: a :class:`Bucket` costs about 300 bytes whether loaded or not (a year of hourly
buckets: about 2.6 MB). A loaded bucket adds an :class:`Entry` per batch (about 500 bytes
with one run and its heap item, about 150 more per further run), delivered ones included
until the bucket file is deleted. Only the buckets due within the lookahead are loaded, so
entries are bounded by the batches due in about two bucket spans (docs/design/delay.md).
A bucket not loaded in which a message was cancelled or looked up keeps a
:class:`BucketIndex` until it loads: about 67 bytes a batch when one in ten was cancelled,
44 more once ``delay_stats`` asked it when its first message is due (tracemalloc, 100,000
batches).
"""

from __future__ import annotations

import bisect
import heapq
from array import array
from collections.abc import Iterable

from headwater.broker.delay.lifecycle import State, move
from headwater.model.delay import delivery_groups
from headwater.storage.schedule import (
    ADOPTED,
    CANCELLED,
    DELIVERED,
    DROPPED,
    FILE_HEADER_SIZE,
    MOVED,
    REC_HEAD_SIZE,
    SCHEDULE,
    ScheduleFile,
    ScheduleRecord,
)

__all__ = ["Bucket", "BucketIndex", "Entry", "Run", "replay", "OPEN"]

OPEN = (State.PENDING, State.DISPATCHING)  # a run in these states is still to be delivered


class Run:
    """Messages ``[first, end)`` of a batch, due at ``due_ms``."""

    __slots__ = ("due_ms", "first", "end", "state", "attempt_ms", "delivered_offset")

    def __init__(self, due_ms: int, first: int, end: int) -> None:
        self.due_ms = due_ms
        self.first = first
        self.end = end
        self.state = State.PENDING
        self.attempt_ms = due_ms  # when the dispatcher takes it next (retries move it)
        self.delivered_offset = -1


class Entry:
    """One accepted batch: where its record lies, its runs and what became of them."""

    __slots__ = (
        "number",
        "count",
        "queue_id",
        "partition",
        "accepted_ms",
        "position",
        "size",
        "runs",
        "cancelled",
        "accept_seq",
        "producer",
        "open_runs",
        "origin",
        "gate",
    )

    def __init__(self, r: ScheduleRecord) -> None:
        self.number = r.number
        self.count = r.count
        self.queue_id = r.queue_id
        self.partition = r.partition
        self.accepted_ms = r.value
        self.position = r.batch_position
        self.size = r.batch_size
        self.runs = [Run(*g) for g in delivery_groups(r.time_ms, r.count, r.offsets)]
        self.open_runs = len(self.runs)  # runs PENDING or DISPATCHING; see close_run
        self.cancelled: set[int] | None = None  # indexes of cancelled messages
        self.accept_seq = r.accept_seq
        self.producer = r.producer
        # taken from another broker with its partition (an ADOPTED record): the delayed offset
        # its producer was given, and the leader epoch from which it may be delivered here
        self.origin: int | None = None
        self.gate = 0

    def run_of(self, index: int) -> Run:
        runs = self.runs
        if len(runs) == 1:
            return runs[0]
        return runs[bisect.bisect_right([g.first for g in runs], index) - 1]

    def run_at(self, first: int) -> Run | None:
        return next((g for g in self.runs if g.first == first), None)

    def live(self, g: Run) -> int:
        """Messages of run ``g`` not cancelled."""
        if not self.cancelled:
            return g.end - g.first
        return sum(1 for i in range(g.first, g.end) if i not in self.cancelled)

    @property
    def is_open(self) -> bool:
        return self.open_runs > 0

    def close_run(self, g: Run, state: State) -> None:
        """Move an open run to a final state (DELIVERED, DROPPED or CANCELLED)."""
        assert g.state in OPEN and state not in OPEN
        g.state = state
        self.open_runs -= 1

    @property
    def pending_messages(self) -> int:
        return sum(self.live(g) for g in self.runs if g.state in OPEN)

    def cancel(self, index: int) -> None:
        if self.cancelled is None:
            self.cancelled = set()
        self.cancelled.add(index)
        g = self.run_of(index)
        if g.state == State.PENDING and self.live(g) == 0:
            self.close_run(g, move(g.state, "cancel_all"))

    def move_away(self) -> None:
        """Close every PENDING run: the batch went with its partition to another broker."""
        for g in self.runs:
            if g.state == State.PENDING:
                self.close_run(g, move(g.state, "moved"))

    def log_offset(self, index: int) -> int:
        """The offset message ``index`` got in its partition (its run DELIVERED; cancelled
        messages were left out of the run)."""
        g = self.run_of(index)
        before = sum(1 for c in self.cancelled or () if g.first <= c < index)
        return g.delivered_offset + index - g.first - before


class Bucket:
    """One bucket file: its span, its counters, and (when loaded) its batches."""

    __slots__ = (
        "start_ms",
        "end_ms",
        "file",
        "next_number",
        "pending_messages",
        "pending_batches",
        "loaded",
        "loading",
        "entries",
        "numbers",
        "in_flight",
        "index",
    )

    def __init__(self, file: ScheduleFile) -> None:
        self.start_ms = file.bucket_start_ms
        self.end_ms = file.bucket_end_ms
        self.file = file
        self.next_number = 0
        self.pending_messages = 0
        self.pending_batches = 0  # batches with a run PENDING or DISPATCHING
        self.loaded = False
        self.loading = False
        self.entries: dict[int, Entry] | None = None  # number -> entry, when loaded
        self.numbers: list[int] = []  # the keys of entries, ascending (for lookups by id)
        self.in_flight = 0  # runs being dispatched
        self.index: BucketIndex | None = None  # not loaded: made by the first cancel or lookup

    def set_summary(self, entries: Iterable[Entry]) -> None:
        self.pending_messages = self.pending_batches = 0
        for e in entries:
            self.next_number = max(self.next_number, e.number + e.count)
            if e.is_open:
                self.pending_batches += 1
                self.pending_messages += e.pending_messages

    def find(self, number: int) -> Entry | None:
        """The loaded entry holding message ``number``, if any."""
        assert self.entries is not None
        return find_entry(self.entries, self.numbers, number)


def find_entry(entries: dict[int, Entry], numbers: list[int], number: int) -> Entry | None:
    i = bisect.bisect_right(numbers, number) - 1
    if i < 0:
        return None
    e = entries[numbers[i]]
    return e if number < e.number + e.count else None


class BucketIndex:
    """Where each batch of a bucket file lies, and the later records that name it, so that a
    cancel or a lookup of a message due later (its bucket not loaded) reads that batch's own
    records instead of the whole file (under the service's lock: docs/design/delay.md, "Ids"
    has the figures), and ``delay_stats`` finds when its first message is due
    (:meth:`next_due`). Made by one scan of the file, then caught up with what was appended
    since: every write to a bucket file is an append, so nothing else keeps it."""

    __slots__ = ("end", "numbers", "starts", "ends", "times", "parts", "seqs", "later", "_due")

    def __init__(self) -> None:
        self.end = FILE_HEADER_SIZE  # the file is indexed up to here
        self.numbers = array("q")  # each batch's first message number (SCHEDULE), ascending
        self.starts = array("q")  # where its SCHEDULE record starts
        self.ends = array("q")  # and ends
        self.times = array("q")  # its first deliver time
        self.parts = array("q")  # its queue id << 32 | partition
        self.seqs = array("q")  # its accept_seq (a hand-off's order)
        self.later: dict[int, list[int]] = {}  # batch number -> where its other records start
        # made by the first next_due: ``due << 32 | i`` of each batch i, due its first time or
        # (a batch named by a later record) its earliest open run's, once looked at
        self._due: list[int] | None = None

    def catch_up(self, file: ScheduleFile, end: int | None = None) -> None:
        """Index the records appended since (up to ``end``, the file's size when None)."""
        for r in file.scan(start=self.end, end=end, cut=False):
            stop = r.position + REC_HEAD_SIZE + r.batch_size
            if r.kind == SCHEDULE:
                if self._due is not None:
                    heapq.heappush(self._due, r.time_ms << 32 | len(self.numbers))
                self.numbers.append(r.number)
                self.starts.append(r.position)
                self.ends.append(stop)
                self.times.append(r.time_ms)
                self.parts.append(r.queue_id << 32 | r.partition)
                self.seqs.append(r.accept_seq)
            else:
                self.later.setdefault(r.number, []).append(r.position)
            self.end = stop

    def read_entry(self, file: ScheduleFile, number: int) -> Entry | None:
        """The batch holding message ``number``, rebuilt by :func:`replay` from its own
        records in file order, as a replay of the whole file would: no other batch's record
        changes it."""
        i = bisect.bisect_right(self.numbers, number) - 1
        if i < 0:
            return None
        first = self.numbers[i]
        spots = sorted([(self.starts[i], self.ends[i]), *((p, p + REC_HEAD_SIZE) for p in self.later.get(first, ()))])
        entries: dict[int, Entry] = {}
        numbers: list[int] = []
        replay((r for start, end in spots for r in file.scan(start=start, end=end, cut=False)), entries, numbers)
        return find_entry(entries, numbers, number)

    def batches_of(self, queue_id: int, partition: int, after: int = -1) -> list[int]:
        """The batches of a partition accepted after ``after`` (an accept_seq), as indexes
        for :meth:`entry_at`, in file order."""
        part, seqs = queue_id << 32 | partition, self.seqs
        return [i for i, p in enumerate(self.parts) if p == part and seqs[i] > after]

    def entry_at(self, file: ScheduleFile, i: int) -> Entry:
        """Batch ``i`` (an index of :meth:`batches_of`), rebuilt from its records."""
        e = self.read_entry(file, self.numbers[i])
        assert e is not None  # its SCHEDULE record is indexed
        return e

    def next_due(self, file: ScheduleFile) -> int | None:
        """When the bucket's first pending message is due (None: none is). A batch no later
        record names is due at its first time, exactly; one that is named (a cancel, a move)
        is read, and keyed again by its earliest pending run."""
        due = self._due
        if due is None:
            due = self._due = [t << 32 | i for i, t in enumerate(self.times)]
            heapq.heapify(due)
        while due:
            t, i = due[0] >> 32, due[0] & 0xFFFFFFFF
            if self.numbers[i] not in self.later:
                return t  # no record after its SCHEDULE: its first run is pending
            e = self.read_entry(file, self.numbers[i])
            pending = min((g.due_ms for g in e.runs if g.state == State.PENDING), default=None) if e else None
            if pending is None:
                heapq.heappop(due)  # cancelled or moved away, whole
            elif pending == t:
                return t
            else:
                heapq.heapreplace(due, pending << 32 | i)
        return None


def replay(records: Iterable[ScheduleRecord], entries: dict[int, Entry], numbers: list[int]) -> None:
    """Apply a file's records, in file order, to ``entries`` (and their ascending keys)."""
    adopted: dict[int, tuple[int, int]] = {}  # number -> (origin, gate), for the SCHEDULE next
    for r in records:
        if r.kind == SCHEDULE:
            e = entries[r.number] = Entry(r)
            numbers.append(r.number)
            if (a := adopted.pop(r.number, None)) is not None:
                e.origin, e.gate = a
            continue
        if r.kind == ADOPTED:
            adopted[r.number] = (r.accept_seq, r.time_ms)
            continue
        e = entries.get(r.number)
        if e is None:
            continue  # names a batch cut away with a damaged tail before it: nothing to do
        if r.kind == MOVED:
            e.move_away()
            continue
        if r.kind == CANCELLED:
            if 0 <= r.count < e.count and e.run_of(r.count).state in (State.PENDING, State.CANCELLED):
                e.cancel(r.count)
            continue
        g = e.run_at(r.count)
        if g is None or g.state not in OPEN:
            continue
        if r.kind == DELIVERED:
            e.close_run(g, State.DELIVERED)
            g.delivered_offset = r.value
        elif r.kind == DROPPED:
            e.close_run(g, State.DROPPED)
