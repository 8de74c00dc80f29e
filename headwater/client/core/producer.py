"""The producer's state, without I/O: partitions and their batches, lingering and sealing,
what is in flight, what goes again after a failure and in which order, and the sequences
batches are encoded under. The thread-based :class:`~headwater.client.sync.producer.Producer`
and the :class:`~headwater.client.aio.producer.AsyncProducer` drive it: they call it when a
message arrives, when a deadline passes and when an answer comes back, and do what it
returns (send these batches, wake me at this time, settle this batch).

Rules it keeps (``docs/design/client.md`` says why):

- A partition's *open batch* takes messages until it reaches ``batch_bytes_max`` (then it
  is sealed and waits in ``ready``) or it has lingered ``linger_ms``; ``hurry`` (a flush, a
  close, a waiting caller) ends the linger.
- Delayed messages of a partition have up to ``delay_batches_max`` open batches, one per
  *due bucket*: ``delay_bucket_ms`` wide for a time due within ``DELAY_FAR_MS`` (ten
  minutes), a minute wide (the batch format's span) for a later one. A message joins its
  bucket's batch whatever the order of due times, else the open batch of the other width
  that covers its time, so messages due at one time share a batch or leave in send order.
  A batch is encoded sorted by due time (stably, so messages due at the same time keep
  their order), each keeping its exact time. At the limit the oldest open batch is sealed;
  each lingers from its own creation; one a caller waits for is sealed at once.
- Up to ``pipeline`` batches of a partition are in flight, taken in order, and encoded in
  that order (their sequences follow each other). After an epoch bump, batches under the new
  epoch wait until the old epoch's are through: one of those may still need a retry.
- A batch to send again puts its partition in *recovery*: nothing new leaves until the
  batches in flight are through, then the failed ones go one at a time, in their original
  order. What happens after each attempt is the table in :mod:`.outcomes`.
- Delayed messages of a partition have a state of their own, keyed
  ``(queue, 0x80000000 | partition)``: the broker counts their sequences apart.
- A blocking caller may hold an idle partition *exclusively*: its one batch goes alone.
- A connector may name a batch's identity itself (:meth:`ProducerCore.identified`, the
  Spark writer's deterministic ids): such a batch has a partition state of its own, is
  never encoded anew, and an out-of-order refusal is final, for the caller to judge.

Thread-safety: none; the sync producer calls it under its state lock, and :meth:`encode`
(the sequences) under its wire lock, which orders encoding and sending.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable, Sequence

from headwater.client.core.outcomes import RetryPolicy, Step, Verdict, final_step, judge
from headwater.client.core.sequences import Identity, give_back_sequence, new_identity, next_epoch, take_sequence
from headwater.model.batch import DELIVER_SPAN_MS_MAX, encode_batch
from headwater.model.delay import DELAYED_PARTITION_BIT
from headwater.model.message import Message

__all__ = [
    "Batch",
    "PartitionState",
    "ProducerCore",
    "DELAY_BUCKET_MS_DEFAULT",
    "DELAY_BATCHES_MAX_DEFAULT",
    "DELAY_BATCHES_MAX_MAX",
    "DELAY_BUCKET_MS_MAX",
    "DELAY_FAR_MS",
    "moved_to",
]

#: delayed messages due within one such span (aligned) of a partition share a batch
DELAY_BUCKET_MS_DEFAULT = 1_000
#: a batch's messages must be due within the batch format's span of each other
DELAY_BUCKET_MS_MAX = DELIVER_SPAN_MS_MAX
#: open delayed batches per partition; at the limit the oldest is sealed. Enough for a
#: day of minute buckets, and those of the next ten minutes by the second
DELAY_BATCHES_MAX_DEFAULT = 2048
DELAY_BATCHES_MAX_MAX = 1 << 16
#: delayed messages due at least this far ahead share a batch by the minute: times spread
#: over hours would otherwise touch more buckets than a partition keeps open, and travel
#: a message a batch (docs/design/delay.md, "Times spread over hours")
DELAY_FAR_MS = 600_000
_FAR = 1 << 62  # far buckets' keys, apart from the near ones (deliver_at_ms // delay_bucket_ms)

Key = tuple[str, int]


class PartitionState:
    """One (queue, partition), or its delayed messages: the open batch, sealed batches
    waiting, batches in flight (in sequence order), batches to send again (in their original
    order), and the idempotence sequence."""

    __slots__ = (
        "queue",
        "partition",
        "key",
        "open",
        "ready",
        "in_flight",
        "retry",
        "recovering",
        "exclusive",
        "identity",
        "next_sequence",
        "opens",
    )

    def __init__(self, queue: str, partition: int, delayed: bool = False) -> None:
        self.queue, self.partition = queue, partition
        self.key: Key = (queue, partition | DELAYED_PARTITION_BIT if delayed else partition)
        self.open: Batch | None = None
        self.ready: deque[Batch] = deque()
        self.in_flight: deque[Batch] = deque()
        self.retry: deque[Batch] = deque()
        self.recovering = False  # a batch will go again: see the module's rules
        self.exclusive = False  # a blocking caller's batch is alone in flight
        self.identity: Identity | None = None  # the (producer id, epoch) of next_sequence
        self.next_sequence = 0
        # delayed: the open batches by due bucket, oldest first (``open`` stays None)
        self.opens: dict[int, Batch] | None = {} if delayed else None

    def has_batches(self) -> bool:
        """Whether messages wait to be sent for the first time."""
        return self.open is not None or bool(self.ready) or bool(self.opens)

    def holds_open(self, b: Batch) -> bool:
        """Whether ``b`` is open here (it may take more messages, and may linger). A
        delayed batch's ``bucket`` is set only while it is open: no dict lookup per send."""
        return b is self.open or b.bucket >= 0


class Batch:
    """Messages bound for one partition; a driver subclasses it to keep their futures."""

    __slots__ = (
        "part",
        "messages",
        "size_bytes",
        "buffered_bytes",
        "created_ms",
        "urgent",
        "encoded",
        "identity",
        "base_sequence",
        "attempts",
        "pipelined",
        "done",
        "deliver_times",
        "order",
        "retry_at_ms",
        "send_identity",
        "fixed",
        "bucket",
    )

    def __init__(self, part: PartitionState, created_ms: float, messages: Sequence[Message | bytes] | None = None):
        self.part = part
        self.messages: list[Message | bytes] = [] if messages is None else list(messages)
        self.size_bytes = 0
        self.buffered_bytes = 0  # the part of size_bytes counted against the driver's buffer bound
        self.created_ms = created_ms
        self.urgent = False  # someone waits for it: it does not linger
        self.encoded: bytearray | None = None  # None: to be encoded (first attempt, or a new epoch)
        self.identity: Identity | None = None  # what it was encoded under
        self.base_sequence = -1
        self.attempts = 0
        self.pipelined = False  # put in flight by the core, not held exclusively by a caller
        self.done = False
        self.deliver_times: list[int] | None = None  # delayed: each message's deliver time, rising
        self.order = 0  # when it first left: retries of a partition go in this order
        self.retry_at_ms = 0.0  # when it goes again, while in its partition's retry
        self.send_identity: Identity | None = None  # the producer's identity when it went into flight
        self.fixed = False  # its identity is the caller's: see ProducerCore.identified
        self.bucket = -1  # delayed: the due bucket it is the open batch of, while open; else -1

    def reordered(self, order: list[int]) -> None:
        """Its messages were put in due order: the message now at ``j`` was at ``order[j]``.
        A driver moves what it keeps per message index (futures, callbacks) along."""


class ProducerCore:
    """The state of one producer; see the module's docstring. ``new_batch(part, created_ms)``
    makes the driver's kind of batch; ``batch_sent(queue, partition)`` tells the partitioner
    a batch left (its sticky partition moves on); ``clock`` (seconds since the epoch) says
    how far ahead a delayed message is due."""

    def __init__(
        self,
        *,
        new_batch: Callable[[PartitionState, float], Batch],
        batch_sent: Callable[[str, int], None],
        retry: RetryPolicy,
        linger_ms: int,
        batch_bytes_max: int,
        pipeline: int,
        idempotent: bool,
        compression: str | None,
        delay_bucket_ms: int = DELAY_BUCKET_MS_DEFAULT,
        delay_batches_max: int = DELAY_BATCHES_MAX_DEFAULT,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.retry = retry
        self.linger_ms = linger_ms
        self.batch_bytes_max = batch_bytes_max
        self.pipeline = pipeline
        self.compression = compression
        self.identity = new_identity(idempotent)
        self.parts: dict[Key, PartitionState] = {}
        self.sendable: dict[Key, PartitionState] = {}  # have batches, and room in flight
        self.recovering: dict[Key, PartitionState] = {}  # have batches to send again
        self.in_flight_count = 0  # pipelined batches in flight
        self.aborting = False  # close() gave up: nothing more is sent
        self._new_batch = new_batch
        self._batch_sent = batch_sent
        self._order = itertools.count(1)
        self.delay_bucket_ms = delay_bucket_ms
        self.delay_batches_max = delay_batches_max
        self._clock = clock  # seconds since the epoch: how far ahead a delayed message is due

    # -- adding messages ----------------------------------------------------------------

    def partition(self, queue: str, partition: int, deliver_at_ms: int = 0) -> PartitionState:
        """The state of the partition, or of its delayed messages."""
        key = (queue, partition | DELAYED_PARTITION_BIT) if deliver_at_ms else (queue, partition)
        ps = self.parts.get(key)
        if ps is None:
            ps = self.parts[key] = PartitionState(queue, partition, bool(deliver_at_ms))
        return ps

    def batch_for(self, ps: PartitionState, size: int, now_ms: float, deliver_at_ms: int = 0) -> tuple[Batch, bool]:
        """The open batch ``size`` more bytes due at ``deliver_at_ms`` join, and whether it
        is new: the open one is sealed first when they would overflow it. A delayed message
        goes to its due bucket's open batch (see the module's rules)."""
        if deliver_at_ms:
            return self._delayed_batch_for(ps, size, now_ms, deliver_at_ms, self.delay_bucket(deliver_at_ms))
        b = ps.open
        if b is not None and b.size_bytes + size <= self.batch_bytes_max:
            return b, False
        if b is not None:
            self.seal(ps)
        b = ps.open = self._new_batch(ps, now_ms)
        return b, True

    def delay_bucket(self, deliver_at_ms: int) -> int:
        """The key of the due bucket of a message due at ``deliver_at_ms``: by
        ``delay_bucket_ms`` within ``DELAY_FAR_MS`` of now, else by the minute."""
        # (_bucket_key's two keys written out: this runs once per delayed send, a call less)
        if deliver_at_ms - self._clock() * 1000 < DELAY_FAR_MS:
            return deliver_at_ms // self.delay_bucket_ms
        return _FAR + deliver_at_ms // DELIVER_SPAN_MS_MAX

    def _bucket_key(self, deliver_at_ms: int, near: bool) -> int:
        """The near (``delay_bucket_ms``) or the far (minute) key of a bucket holding ``deliver_at_ms``."""
        return deliver_at_ms // self.delay_bucket_ms if near else _FAR + deliver_at_ms // DELIVER_SPAN_MS_MAX

    def _delayed_batch_for(
        self, ps: PartitionState, size: int, now_ms: float, deliver_at_ms: int, bucket: int
    ) -> tuple[Batch, bool]:
        opens = ps.opens
        assert opens is not None, "a delayed message goes to the partition's delayed state"
        b = opens.get(bucket)
        if b is None:  # the open batch of the other width holding this time, if any: then
            # messages due at one time share a batch or leave in send order (oldest first)
            other = self._bucket_key(deliver_at_ms, bucket >= _FAR)
            b = opens.get(other)
            if b is not None:
                bucket = other
        if b is not None:
            if b.size_bytes + size <= self.batch_bytes_max:
                return b, False
            self.seal_open(ps, b)
        while len(opens) >= self.delay_batches_max:
            self.seal_open(ps, next(iter(opens.values())))  # the oldest: dicts keep insertion order
        b = opens[bucket] = self._new_batch(ps, now_ms)
        b.bucket = bucket
        b.deliver_times = []
        return b, True

    def append(
        self,
        ps: PartitionState,
        msg: Message | bytes,
        size: int,
        now_ms: float,
        deliver_at_ms: int,
        urgent: bool,
        buffered: bool = True,
    ) -> tuple[Batch, bool]:
        """Add one message of ``size`` bytes (``buffered``: counted against the driver's
        buffer) to the open batch of ``ps``; its batch, and whether it opened one (the hot
        path of a send)."""
        opened = False
        if deliver_at_ms:  # its due bucket's open batch (ps.opens is there: a delayed state)
            bucket = self.delay_bucket(deliver_at_ms)
            b = ps.opens.get(bucket)  # type: ignore[union-attr]
            if b is None or b.size_bytes + size > self.batch_bytes_max:
                b, opened = self._delayed_batch_for(ps, size, now_ms, deliver_at_ms, bucket)
        else:
            b = ps.open
            if b is None or b.size_bytes + size > self.batch_bytes_max:
                b, opened = self.batch_for(ps, size, now_ms)
        b.messages.append(msg)  # this runs once per message sent: kept short
        if deliver_at_ms:
            b.deliver_times.append(deliver_at_ms)  # type: ignore[union-attr]  # a delayed batch has its list
        b.size_bytes += size
        if buffered:
            b.buffered_bytes += size
        if urgent:
            b.urgent = True
        if b.size_bytes >= self.batch_bytes_max or (urgent and deliver_at_ms):
            self.seal_open(ps, b)  # full; or delayed, and waited for: see _due_open
        return b, opened

    def append_group(
        self, ps: PartitionState, msgs: Sequence[Message | bytes], size: int, now_ms: float, deliver_at_ms: int
    ) -> tuple[Batch, bool, int]:
        """Add a waiting caller's ``msgs`` of ``size`` bytes (not counted against the
        driver's buffer; they do not linger) to the open batch of ``ps``; their batch,
        whether it is new, and the index of the first of them in it."""
        b, opened = self.batch_for(ps, size, now_ms, deliver_at_ms)
        index = len(b.messages)
        b.messages.extend(msgs)
        if deliver_at_ms:
            b.deliver_times.extend([deliver_at_ms] * len(msgs))  # type: ignore[union-attr]  # a delayed batch has its list
        b.size_bytes += size
        b.urgent = True
        if b.size_bytes >= self.batch_bytes_max or deliver_at_ms:
            self.seal_open(ps, b)  # full; or delayed, and waited for: see _due_open
        return b, opened, index

    def seal_open(self, ps: PartitionState, b: Batch) -> None:
        """The open batch ``b`` of ``ps`` takes no more messages."""
        if b is ps.open:
            self.seal(ps)
            return
        assert ps.opens is not None and ps.opens.get(b.bucket) is b
        del ps.opens[b.bucket]
        b.bucket = -1  # no longer open (see PartitionState.holds_open)
        ps.ready.append(b)
        self._batch_sent(ps.queue, ps.partition)

    def _due_open(self, ps: PartitionState, now_ms: float, hurry: bool) -> Batch | None:
        """The oldest delayed open batch of ``ps`` if it is due to leave now (it lingered, or
        a flush hurries it), taken out of the open ones; else None. Only the oldest is
        looked at, however many are open: a batch someone waits for was sealed (it is in
        ``ready``), so none behind the oldest is due before it."""
        assert ps.opens is not None
        b = next(iter(ps.opens.values()))
        if hurry or not self.linger_ms or b.created_ms + self.linger_ms <= now_ms:
            del ps.opens[b.bucket]
            b.bucket = -1
            self._batch_sent(ps.queue, ps.partition)
            return b
        return None

    def seal(self, ps: PartitionState) -> None:
        """The open batch takes no more messages."""
        assert ps.open is not None
        ps.ready.append(ps.open)
        ps.open = None
        self._batch_sent(ps.queue, ps.partition)

    def mark_sendable(self, ps: PartitionState) -> bool:
        """Note that ``ps`` has batches to time or send; False if it has no room in flight
        (the batch landing there takes them)."""
        if self.can_send(ps):
            self.sendable[ps.key] = ps
            return True
        return False

    # -- into flight ----------------------------------------------------------------------

    def can_send(self, ps: PartitionState) -> bool:
        """Whether another batch of ``ps`` may leave now."""
        if ps.recovering or ps.exclusive or len(ps.in_flight) >= self.pipeline:
            return False
        # after an epoch bump, batches under the new epoch wait until the old epoch's are
        # through: one of those may still fail and need a retry, which must land first
        return not ps.in_flight or ps.in_flight[-1].send_identity == self.identity

    def take(self, ps: PartitionState, now_ms: float, hurry: bool) -> list[Batch]:
        """Move the batches of ``ps`` due now into flight, as many as there is room for, in
        order: sealed ones first, then the open one unless it lingers."""
        taken: list[Batch] = []
        while self.can_send(ps):
            if ps.ready:
                b = ps.ready.popleft()
            elif ps.open is not None and (
                hurry or ps.open.urgent or not self.linger_ms or ps.open.created_ms + self.linger_ms <= now_ms
            ):
                b = ps.open
                ps.open = None
                self._batch_sent(ps.queue, ps.partition)
            elif ps.opens and (due := self._due_open(ps, now_ms, hurry)) is not None:
                b = due
            else:
                break
            b.order = next(self._order)
            self.fly(b)
            taken.append(b)
        return taken

    def collect(self, now_ms: float, hurry: bool) -> tuple[list[Batch], float | None]:
        """Take every batch due now into flight (retries first); and when the next one is
        due (a lingering batch or a retry), None if none waits for a time."""
        batches: list[Batch] = []
        wake_at_ms: float | None = None
        for key, ps in list(self.recovering.items()):
            if ps.in_flight:
                continue  # a retry waits until everything in flight before it is through
            if not ps.retry:
                ps.recovering = False
                del self.recovering[key]
                if ps.has_batches():
                    self.sendable[key] = ps
                continue
            b = ps.retry[0]
            if b.retry_at_ms <= now_ms:
                ps.retry.popleft()
                if b.identity is not None and ps.identity != b.identity:
                    # a batch before it went again under a new epoch, the broker having refused
                    # it as out of order; so the broker stored nothing after it under the old
                    # epoch, this one included, and would now refuse that epoch as fenced:
                    # encode this one anew too, after that batch
                    b.encoded = None
                self.fly(b)
                batches.append(b)
            else:
                wake_at_ms = b.retry_at_ms if wake_at_ms is None else min(wake_at_ms, b.retry_at_ms)
        for key, ps in list(self.sendable.items()):
            batches.extend(self.take(ps, now_ms, hurry))
            lingering = ps.open if ps.open is not None else next(iter(ps.opens.values())) if ps.opens else None
            if lingering is not None and not ps.ready and self.can_send(ps):
                due_ms = lingering.created_ms + self.linger_ms  # it lingers (the oldest, for delayed ones)
                wake_at_ms = due_ms if wake_at_ms is None else min(wake_at_ms, due_ms)
            else:
                del self.sendable[key]  # nothing left, or no room: finish() puts it back
        return batches, wake_at_ms

    def exclusive(
        self, ps: PartitionState, messages: Sequence[Message | bytes], now_ms: float, deliver_at_ms: int = 0
    ) -> Batch | None:
        """A batch of ``messages`` alone in flight for a blocking caller, if ``ps`` is idle;
        the caller sends (and retries) it and then calls :meth:`finish`."""
        if ps.in_flight or ps.recovering or ps.exclusive or ps.has_batches():
            return None
        b = self._new_batch(ps, now_ms)
        b.messages = messages if isinstance(messages, list) else list(messages)
        b.order = next(self._order)
        b.send_identity = self.identity
        if deliver_at_ms:
            b.deliver_times = [deliver_at_ms] * len(messages)
        ps.in_flight.append(b)
        ps.exclusive = True
        self._batch_sent(ps.queue, ps.partition)
        return b

    def identified(
        self,
        queue: str,
        partition: int,
        messages: Sequence[Message | bytes],
        identity: Identity,
        now_ms: float,
        *,
        base_sequence: int = 0,
        deliver_at_ms: int = 0,
        cap: int | None = None,
    ) -> Batch:
        """A batch of ``messages`` under a caller's ``identity`` from ``base_sequence``,
        encoded (checked against ``cap``); :meth:`fly` puts it in flight. Its state is its
        own, so it may be made without the driver's lock."""
        ps = PartitionState(queue, partition, bool(deliver_at_ms))
        ps.key = (queue, -next(self._order))  # not the partition's own state: a key of its own
        ps.identity, ps.next_sequence = identity, base_sequence
        b = self._new_batch(ps, now_ms)
        b.messages = list(messages)
        b.fixed = True
        b.send_identity = identity
        if deliver_at_ms:
            b.deliver_times = [deliver_at_ms] * len(b.messages)
        self.encode(b, cap)
        return b

    def fly(self, b: Batch) -> None:
        """Put ``b`` in flight: the driver sends it and reports its answer."""
        if not b.order:
            b.order = next(self._order)
        if b.encoded is None and not b.fixed:
            b.send_identity = self.identity
        b.part.in_flight.append(b)
        b.pipelined = True
        self.in_flight_count += 1

    # -- encoding -------------------------------------------------------------------------

    def refuse_first(self, b: Batch, now_ms: float) -> BaseException | None:
        """Why ``b`` must not go out for its first attempt; None when it may."""
        return self.retry.refuse_first_send(b.created_ms, now_ms, self.aborting)

    def encode(self, b: Batch, cap: int | None = None) -> bytearray:
        """Encode ``b`` under its send identity, checking bodies against ``cap``; its
        sequence follows the partition's batch encoded before it."""
        if b.deliver_times is not None:
            self._sort_by_due(b)
        ident = b.send_identity
        pid, seq, epoch = take_sequence(b.part, ident, len(b.messages))
        try:
            b.encoded = encode_batch(
                b.messages,
                compression=self.compression,
                producer_id=pid,
                base_sequence=seq,
                producer_epoch=epoch,
                message_bytes_max=cap,
                deliver_times=b.deliver_times,
            )
        except BaseException:
            give_back_sequence(b.part, ident, seq, len(b.messages))
            raise
        b.identity, b.base_sequence = ident, seq
        return b.encoded

    @staticmethod
    def _sort_by_due(b: Batch) -> None:
        """Put a delayed batch's messages in due order (stable: those due at the same time
        keep their order), as the batch format needs; the driver moves its futures along.
        Done in C where it can: this runs once per batch of random due times."""
        times = b.deliver_times
        assert times is not None
        order = sorted(range(len(times)), key=times.__getitem__)  # linear when already rising
        ordered = list(map(times.__getitem__, order))
        if ordered == times:  # already rising (traffic sent with a fixed delay): nothing moves
            return
        b.messages = list(map(b.messages.__getitem__, order))  # a new list: never the caller's, reordered
        b.deliver_times = ordered
        b.reordered(order)

    # -- outcomes -------------------------------------------------------------------------

    def judge(self, b: Batch, exc: BaseException, now_ms: float) -> Verdict:
        """The step after ``b``'s last attempt failed with ``exc``. REENCODE is done here
        (a new epoch unless a batch before it bumped it already)."""
        verdict = judge(
            self.retry,
            exc,
            attempts=b.attempts,
            sequenced=b.identity is not None and not b.fixed,
            created_ms=b.created_ms,
            now_ms=now_ms,
            aborting=self.aborting,
            behind_a_retry=self._behind_a_retry(b),
        )
        if verdict.step is Step.REENCODE:
            if b.identity == self.identity:
                self.bump_epoch()
            b.encoded = None
        return verdict

    @staticmethod
    def _behind_a_retry(b: Batch) -> bool:
        """Whether a batch sent before ``b`` under its epoch waits in its partition's retries
        (so the broker has not stored it, or will know it again by its bytes)."""
        if b.identity is None:
            return False
        return any(r.order < b.order and r.identity == b.identity for r in b.part.retry)

    def retry_later(self, b: Batch, delay_ms: float, now_ms: float) -> None:
        """Put a pipelined batch to send again, in its original order, ``delay_ms`` from now:
        its partition recovers."""
        ps = b.part
        self.land(b)
        b.retry_at_ms = now_ms + delay_ms
        i = len(ps.retry)
        while i and ps.retry[i - 1].order > b.order:
            i -= 1
        ps.retry.insert(i, b)
        ps.recovering = True
        self.recovering[ps.key] = ps
        self.sendable.pop(ps.key, None)

    def fail(self, b: Batch, exc: BaseException) -> None:
        """``b`` fails for good with ``exc``: bump the epoch if it may have been stored, else
        free its sequences (the sync producer calls this under its wire lock)."""
        if b.identity is None:
            return
        if final_step(exc, b.attempts) is Step.FAIL_FENCED and b.identity == self.identity:
            self.bump_epoch()
        else:
            give_back_sequence(b.part, b.identity, b.base_sequence, len(b.messages))

    def bump_epoch(self) -> None:
        assert self.identity is not None
        self.identity = next_epoch(self.identity)

    def land(self, b: Batch) -> None:
        """``b`` is no longer in flight (answered, failed, or never sent)."""
        ps = b.part
        if b.pipelined:
            if b in ps.in_flight:
                ps.in_flight.remove(b)
                self.in_flight_count -= 1
        elif ps.in_flight and ps.in_flight[0] is b:  # a blocking call's batch, alone in flight
            ps.in_flight.popleft()
            ps.exclusive = False

    def finish(self, b: Batch, now_ms: Callable[[], float], hurry: Callable[[], bool]) -> tuple[list[Batch], bool]:
        """``b`` is settled: take it out of flight. Returns the batches of its partition that
        waited for its slot, now in flight (the caller sends them), and whether the driver's
        timer must look again (a retry or the end of a recovery is due, or batches linger).
        The driver's clock and whether it hurries (as for :meth:`take`) are asked only when
        batches waited: most often none did."""
        ps = b.part
        self.land(b)
        if ps.retry and b in ps.retry:
            ps.retry.remove(b)
        if ps.recovering:
            return [], not ps.in_flight
        if not (ps.has_batches() and self.can_send(ps)):
            return [], False
        batches = self.take(ps, now_ms(), hurry())
        return batches, ps.has_batches() and self.mark_sendable(ps)

    def abort(self) -> tuple[list[Batch], list[Batch]]:
        """close() gave up: nothing more is sent. Returns the batches never sent, and those
        waiting to be sent again (they leave the retry lists when finished)."""
        self.aborting = True
        unsent: list[Batch] = []
        waiting: list[Batch] = []
        for ps in self.parts.values():
            unsent.extend(ps.ready)
            if ps.open is not None:
                unsent.append(ps.open)
            if ps.opens:
                for b in ps.opens.values():
                    b.bucket = -1
                    unsent.append(b)
                ps.opens.clear()
            ps.ready.clear()
            ps.open = None
            waiting.extend(ps.retry)
        self.sendable.clear()
        return unsent, waiting

    def pending(self) -> list[Batch]:
        """Every batch not settled yet."""
        return [
            b
            for ps in self.parts.values()
            for b in (*ps.in_flight, *ps.retry, *ps.ready, ps.open, *(ps.opens or {}).values())
            if b is not None
        ]

    def busy(self) -> bool:
        """Whether batches wait for a time or an answer."""
        return bool(self.sendable or self.in_flight_count or self.recovering)


def moved_to(order: list[int]) -> list[int]:
    """Where each message went when a batch was put in ``order`` (``order[j]`` is the old
    index of the message now at ``j``): the inverse permutation.

    >>> moved_to([2, 0, 1])
    [1, 2, 0]
    """
    return sorted(range(len(order)), key=order.__getitem__)  # the inverse, sorted in C
