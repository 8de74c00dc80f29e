"""Subscriber: a push subscription's process side (HQueue 0.3's subscribers).

A subscriber is registered on the broker first (``headwater subscriber add QUEUE NAME`` or
``client.admin.add_subscriber``), with the partitions and tags it follows and where it
starts. A process then attaches to it::

    def store(record): db.insert(record.body)
    def notify(record): log.info("stored %s", record.message_id)

    sub = client.subscribe("orders", "audit", listeners=[store, notify])
    ...
    sub.stop()

Each record goes through the listeners in order, one record after the other, in offset order
per partition, on the subscriber's own thread. The subscriber's **checkpoint** (per
partition: the next offset to deliver) advances only past records whose listeners all
returned; it is stored on the broker every ``checkpoint_interval_ms`` and when the subscriber
stops. A process restarted after a crash resumes from the stored checkpoint: nothing is
skipped, and what its predecessor processed after the last checkpoint is delivered again
(at least once; at most ``checkpoint_interval_ms`` of records).

Over the network the broker **pushes** (``headwater.broker.push``): new messages are sent on
the client's connection as they are appended, only the wanted tags (the broker filters;
the subscriber checks again), with flow control by credit — the broker sends up to
``credit_messages`` / ``credit_bytes`` ahead of the listeners, and the subscriber grants
more as they finish. A lost connection or a broker restart is survived: the subscriber
subscribes again and continues (records it already processed are not given to the listeners
twice in one process). One process per subscriber name: a second one takes the stream over
and the first stops with an error.

With an embedded broker (or ``headwater.testing``) there is no connection to push on; the
subscriber reads with long polling instead, with the same listeners, checkpoints and order.

A listener that raises stops the subscriber (``on_error="stop"``, the default) before the
checkpoint passes that record, so a restart retries it; ``on_error="skip"`` logs the error
and goes on with the next record (the listeners after the failing one do not see this one).
:meth:`Subscriber.wait` re-raises what stopped it.
"""

from __future__ import annotations

import logging
import queue as queue_mod
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from headwater.client.sync.consumer import Consumer
from headwater.errors import (
    ClosedError,
    HeadwaterError,
    InvalidArgumentError,
    SubscriberNotFoundError,
    UnavailableError,
    error_for_code,
)
from headwater.model.config import QueueInfo
from headwater.model.filtering import count_messages, decode_selection
from headwater.model.message import Record
from headwater.model.service import BrokerService, OpensPushStreams
from headwater.model.subscription import SubscriberInfo, subscribed_partitions

__all__ = ["Subscriber", "SubscriberBase", "Listener"]

log = logging.getLogger("headwater.subscriber")

Listener = Callable[[Record], Any]
_STOP = object()  # wakes the dispatcher when stop() is called
RECONNECT_BACKOFF_S_MAX = 2.0
PARTITIONS_CHECK_S = 2.0
FINAL_ACK_TIMEOUT_S = 10.0  # how long stopping waits for the broker to take the last checkpoint


class ListenerFailed(Exception):
    """A listener raised, with ``on_error="stop"``: the subscriber stops with ``error``."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


class SubscriberBase:
    """What a subscriber process is, without I/O: its settings and listeners, its positions
    and stored checkpoints, the credit its listeners used, and the decisions on them. The
    sync :class:`Subscriber` (a thread) and the asyncio
    :class:`~headwater.client.aio.subscriber.AsyncSubscriber` (a task) drive it."""

    def __init__(
        self,
        queue: str,
        name: str,
        listeners: Iterable[Listener],
        *,
        credit_messages: int,
        credit_bytes: int,
        checkpoint_interval_ms: int,
        on_error: str,
    ) -> None:
        if on_error not in ("stop", "skip"):
            raise InvalidArgumentError(f"on_error is 'stop' or 'skip', got {on_error!r}")
        for name_, v in (("credit_messages", credit_messages), ("credit_bytes", credit_bytes)):
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v < 2**31:
                raise InvalidArgumentError(f"{name_} is a whole number from 1 to 2**31 - 1, got {v!r}")
        if (
            isinstance(checkpoint_interval_ms, bool)
            or not isinstance(checkpoint_interval_ms, int)
            or checkpoint_interval_ms < 0
        ):
            raise InvalidArgumentError(
                f"checkpoint_interval_ms is a whole number of milliseconds, 0 or more, got {checkpoint_interval_ms!r}"
            )
        self.queue = queue
        self.name = name
        self._lock = threading.Lock()
        self._listeners: tuple[Listener, ...] = ()
        for fn in listeners:
            self.add_listener(fn)
        self.credit_messages = credit_messages
        self.credit_bytes = credit_bytes
        self.checkpoint_interval_s = checkpoint_interval_ms / 1000
        self.on_error = on_error
        self.info: SubscriberInfo | None = None
        self.error: BaseException | None = None
        self.delivered = 0
        self._positions: dict[int, int] = {}  # next offset to give the listeners, per partition
        self._stored: dict[int, int] = {}  # checkpoints known to be on the broker
        self._last_checkpoint = time.monotonic()
        self._tags: frozenset[str] | None = None
        # push mode: the current stream, and what the listeners consumed of its credit
        self._stream: tuple[int, object] | None = None
        self._stream_pos: dict[int, int] = {}
        self._owed_messages = 0
        self._owed_bytes = 0

    def add_listener(self, fn: Listener) -> None:
        """Call ``fn(record)`` for every record, after the listeners added before it."""
        if not callable(fn):
            raise InvalidArgumentError(f"a listener is a callable taking a Record, got {fn!r}")
        with self._lock:
            self._listeners = (*self._listeners, fn)

    @property
    def listeners(self) -> tuple[Listener, ...]:
        return self._listeners

    @property
    def positions(self) -> dict[int, int]:
        """Per partition, the next offset the listeners will get (the checkpoint to be)."""
        return dict(self._positions)

    # -- delivery -------------------------------------------------------------------------------

    def _fresh(self, partition: int, r: Record) -> bool:
        """Whether ``r`` is still to be given to the listeners (not processed before a
        reconnect: not twice in one process)."""
        return r.offset >= self._positions.get(partition, 0)

    def _listener_failed(self, fn: Listener, r: Record, e: Exception) -> None:
        """A listener raised: stop before the record (``on_error="stop"``) or log and skip it."""
        if self.on_error == "stop":
            raise ListenerFailed(e) from e
        log.exception("listener %r failed on %s; the record is skipped (on_error='skip')", fn, r.message_id)

    def _passed(self, partition: int, r: Record) -> None:
        """The listeners are done with ``r``: the position passes it."""
        self._positions[partition] = r.offset + 1
        self.delivered += 1

    def _stopped_by(self, e: Exception) -> None:
        """Keep what stopped the subscriber, for ``wait()`` to raise: a listener's error, the
        broker's refusal, or (logged, as a bug) anything else."""
        if isinstance(e, ListenerFailed):
            self.error = e.error
            return
        if isinstance(e, RuntimeError) and "cannot schedule new futures" in str(e):
            # the program is ending without close(): Python's executors refuse work; not a bug
            log.info(
                "subscriber %s/%s stopped: the program is exiting (close() the subscriber or the "
                "client first to store its last checkpoint)",
                self.queue,
                self.name,
            )
        elif not isinstance(e, HeadwaterError):
            log.exception("subscriber %s/%s failed", self.queue, self.name)
        self.error = e

    def _set_info(self, info: SubscriberInfo) -> None:
        self.info = info
        self._tags = frozenset(info.tags) if info.tags else None
        for p, off in info.checkpoints.items():
            self._stored[p] = off
            if off > self._positions.get(p, -1):
                self._positions[p] = off

    def _due_checkpoint(self, final: bool) -> dict[int, int] | None:
        """The positions that moved, if the interval passed (or ``final``); None if not due.
        The caller stores them and then calls :meth:`_checkpointed`."""
        if not final and time.monotonic() - self._last_checkpoint < self.checkpoint_interval_s:
            return None
        return {p: o for p, o in self._positions.items() if self._stored.get(p) != o}

    def _checkpointed(self, changed: dict[int, int]) -> None:
        self._stored.update(changed)
        self._last_checkpoint = time.monotonic()

    def _checkpoint_wait_s(self) -> float:
        """How long the push loop may wait for a push before the next checkpoint is due."""
        return max(0.001, self._last_checkpoint + self.checkpoint_interval_s - time.monotonic())

    # -- pull (an embedded broker) ----------------------------------------------------------------

    def _pull_wait_ms(self) -> int:
        return min(100, int(self.checkpoint_interval_s * 1000) or 100)

    def _deleted(self) -> SubscriberNotFoundError:
        """What stops a subscriber whose name was deleted (the broker's push streams say the same)."""
        return SubscriberNotFoundError(f"subscriber {self.name!r} of queue {self.queue!r} was deleted")

    def _new_partitions(self, qi: QueueInfo, parts: list[int]) -> tuple[list[int], dict[int, int]]:
        """The partitions followed now, and those new since ``parts`` with where each starts."""
        assert self.info is not None
        now = subscribed_partitions(self.info, len(qi.partitions))
        return now, {p: max(self._positions.get(p, 0), qi.partitions[p].start_offset) for p in now if p not in parts}

    def _polled(self, records: Iterable[Record]) -> dict[int, list[Record]]:
        by_part: dict[int, list[Record]] = {}
        for r in records:
            by_part.setdefault(r.partition, []).append(r)
        return by_part

    def _past_skipped(
        self, parts: list[int], by_part: dict[int, list[Record]], done: set[int], position: Callable[[int], int]
    ) -> None:
        """Move past messages the filter skipped, where nothing is left undelivered."""
        for p in parts:
            if p in done or p not in by_part:
                self._positions[p] = max(self._positions.get(p, 0), position(p))

    # -- push (over the network) ------------------------------------------------------------------

    def _stream_opened(self, sid: int, token: object, info: SubscriberInfo) -> None:
        self._stream = (sid, token)
        self._owed_messages = self._owed_bytes = 0
        self._set_info(info)
        self._stream_pos = {p: info.checkpoints.get(p, 0) for p in info.checkpoints}

    def _push_lost(self, body: Any) -> bool:
        """Whether a push item ends the stream so that the subscriber subscribes again (the
        connection was lost, or the broker ended it for a passing reason); raises what the
        broker ended it with otherwise."""
        if body is None:
            log.info("subscriber %s/%s: connection lost; subscribing again", self.queue, self.name)
            return True
        if not body.ended:
            return False
        exc = error_for_code(body.ended_code)(body.ended)
        if exc.retriable:
            log.info("subscriber %s/%s: %s", self.queue, self.name, body.ended)
            return True
        self._stream = None  # the broker closed it already
        raise exc

    def _push_records(self, body: Any) -> Iterator[Record]:
        """The records of a push, decoded (and their tags checked again)."""
        start = self._positions.get(body.partition, 0)
        sel = body.selections
        return (
            r
            for i, b in enumerate(body.batches)
            for r in decode_selection(b, sel[i] if sel else (), self.queue, start_offset=start, tags=self._tags)
        )

    def _pushed(self, body: Any, complete: bool) -> bool:
        """After the listeners took a push (all of it when ``complete``): move past what the
        broker skipped, count the credit it used; whether enough is owed to give it back."""
        p = body.partition
        if complete:
            self._positions[p] = max(self._positions.get(p, 0), body.next_offset)
        # give back the credit the broker counted for this push (never less: a stream must not starve)
        messages, size = count_messages(body.batches, body.selections, self._stream_pos.get(p, 0), body.next_offset)
        self._stream_pos[p] = body.next_offset
        self._owed_messages += max(messages, 1)
        self._owed_bytes += size
        return self._owed_messages * 4 >= self.credit_messages or self._owed_bytes * 4 >= self.credit_bytes

    def _take_owed(self) -> tuple[int, int]:
        owed = self._owed_messages, self._owed_bytes
        self._owed_messages = self._owed_bytes = 0
        return owed

    def _ack_done(self, fut: Any) -> None:
        e = None if fut.cancelled() else fut.exception()
        if e is not None and not isinstance(e, (UnavailableError, ClosedError, SubscriberNotFoundError)):
            log.warning("subscriber %s/%s: an acknowledgement failed: %s", self.queue, self.name, e)


class Subscriber(SubscriberBase):
    """One process attached to a registered subscriber. Thread-safe; listeners run on the
    subscriber's thread.

    >>> import headwater, tempfile
    >>> hw = headwater.open(tempfile.mkdtemp())
    >>> _ = hw.admin.create_queue("orders")
    >>> _ = hw.admin.add_subscriber("orders", "audit", start="earliest")
    >>> _ = hw.send("orders", b"paid")
    >>> seen = []
    >>> sub = hw.subscribe("orders", "audit", listeners=[lambda r: seen.append(r.body)])
    >>> sub.wait_for(lambda: seen, timeout_s=5)
    True
    >>> sub.stop(); seen, sub.positions
    ([b'paid'], {0: 1})
    >>> hw.close()
    """

    def __init__(
        self,
        service: BrokerService,
        queue: str,
        name: str,
        listeners: Iterable[Listener] = (),
        *,
        credit_messages: int = 1000,
        credit_bytes: int = 4 << 20,
        checkpoint_interval_ms: int = 100,
        on_error: str = "stop",
        start: bool = True,
    ) -> None:
        super().__init__(
            queue,
            name,
            listeners,
            credit_messages=credit_messages,
            credit_bytes=credit_bytes,
            checkpoint_interval_ms=checkpoint_interval_ms,
            on_error=on_error,
        )
        self._service = service
        self.mode = "push" if isinstance(service, OpensPushStreams) else "pull"
        self._inbox: queue_mod.SimpleQueue = queue_mod.SimpleQueue()  # bounded by the credit
        self._stopping = threading.Event()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        if start:
            self.start()

    # -- control ------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._thread is not None and not self._stopped.is_set()

    def start(self) -> None:
        """Attach to the subscriber on the broker and start delivering (on a thread)."""
        with self._lock:
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._run, name=f"headwater-subscriber-{self.name}", daemon=True)
            self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Finish the record in progress, store the checkpoint, detach. Idempotent."""
        self._stopping.set()
        self._inbox.put(_STOP)
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout_s)

    close = stop

    def wait(self, timeout_s: float | None = None) -> bool:
        """Wait until the subscriber stops (True) or ``timeout_s`` passes (False); re-raise
        the error that stopped it, if one did."""
        done = self._stopped.wait(timeout_s)
        if done and self.error is not None:
            raise self.error
        return done

    def wait_for(self, condition: Callable[[], Any], timeout_s: float = 10.0) -> bool:
        """Wait until ``condition()`` is true (polled), the subscriber stops, or time passes."""
        deadline = time.monotonic() + timeout_s
        while not condition():
            if self._stopped.is_set() or time.monotonic() >= deadline:
                return bool(condition())
            time.sleep(0.005)
        return True

    def __enter__(self) -> Subscriber:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the thread ------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            if self.mode == "push":
                self._run_push()
            else:
                self._run_pull()
        except Exception as e:  # noqa: BLE001 - reported through wait()
            self._stopped_by(e)
        finally:
            try:
                self._checkpoint(final=True)
            except (HeadwaterError, TimeoutError) as e:
                log.warning("subscriber %s/%s: the last checkpoint was not stored: %s", self.queue, self.name, e)
            self._close_stream()
            self._stopped.set()

    def _deliver(self, partition: int, records: Iterable[Record]) -> bool:
        """Give records to the listeners in order; the position passes each one done. False
        if the subscriber began stopping before the last one (the rest waits for the next)."""
        for r in records:
            if self._stopping.is_set():
                return False
            if not self._fresh(partition, r):
                continue
            for fn in self._listeners:
                try:
                    fn(r)
                except Exception as e:  # noqa: BLE001 - the application's error, reported
                    self._listener_failed(fn, r, e)
                    break  # the listeners after it do not see it either
            self._passed(partition, r)
        return True

    def _checkpoint(self, *, final: bool = False) -> None:
        """Store the positions that moved, if the interval passed (or ``final``)."""
        changed = self._due_checkpoint(final)
        if changed is None:
            return
        if self.mode == "push":
            self._ack(changed, wait=final)
        elif changed:
            self._service.checkpoint_subscriber(self.queue, self.name, changed)
        self._checkpointed(changed)

    # -- pull (an embedded broker) ---------------------------------------------------------

    def _run_pull(self) -> None:
        self._set_info(self._service.describe_subscriber(self.queue, self.name))
        assert self.info is not None
        consumer = Consumer(self._service, tags=self.info.tags, max_poll_messages=self.credit_messages)
        try:
            parts: list[int] = []
            next_check = 0.0
            while not self._stopping.is_set():
                if time.monotonic() >= next_check:
                    self._check_subscribed()
                    parts, new = self._new_partitions(self._service.describe_queue(self.queue), parts)
                    if new:
                        consumer.assign(self.queue, list(new))
                        for p, offset in new.items():
                            consumer.seek(self.queue, p, offset)
                    next_check = time.monotonic() + PARTITIONS_CHECK_S
                by_part = self._polled(consumer.poll(timeout_ms=self._pull_wait_ms()))
                if by_part:
                    self._check_subscribed()  # not one record for a subscriber deleted meanwhile
                done = {p for p, recs in by_part.items() if self._deliver(p, recs)}
                self._past_skipped(parts, by_part, done, lambda p: consumer.position(self.queue, p))
                self._checkpoint()
        finally:
            consumer.close()

    def _check_subscribed(self) -> None:
        """Raise if the subscriber was deleted (embedded, a call in this process)."""
        try:
            self._service.describe_subscriber(self.queue, self.name)
        except SubscriberNotFoundError:
            raise self._deleted() from None

    # -- push (over the network) ----------------------------------------------------------------

    def _run_push(self) -> None:
        backoff = 0.05
        while not self._stopping.is_set():
            token = object()
            try:
                sid, info = self._service.open_push_stream(  # type: ignore[attr-defined]  # push mode: the service OpensPushStreams
                    self.queue,
                    self.name,
                    lambda body, t=token: self._inbox.put((t, body)),
                    credit_messages=self.credit_messages,
                    credit_bytes=self.credit_bytes,
                )
            except UnavailableError as e:
                log.info("subscriber %s/%s: cannot subscribe (%s); retrying", self.queue, self.name, e)
                self._stopping.wait(backoff)
                backoff = min(backoff * 2, RECONNECT_BACKOFF_S_MAX)
                continue
            backoff = 0.05
            self._stream_opened(sid, token, info)
            if self._pump(token):
                return  # stopping: the stream stays open for the last checkpoint, then closes
            self._stream = None  # lost or ended by the broker: nothing to close

    def _pump(self, token: object) -> bool:
        """Deliver the stream's pushes until it is lost or ended (False), or the subscriber
        stops (True)."""
        while not self._stopping.is_set():
            try:
                item = self._inbox.get(timeout=self._checkpoint_wait_s())
            except queue_mod.Empty:
                self._checkpoint()
                continue
            if item is _STOP:
                return True
            t, body = item
            if t is not token:
                continue  # from a stream that already ended
            if self._push_lost(body):
                return False
            complete = not body.batches or self._deliver(body.partition, self._push_records(body))
            if self._pushed(body, complete):
                self._ack({}, wait=False)
            self._checkpoint()
        return True

    def _ack(self, offsets: dict[int, int], *, wait: bool) -> None:
        stream = self._stream
        if stream is None:  # the stream was lost: store the checkpoint without it
            if offsets:
                self._service.checkpoint_subscriber(self.queue, self.name, offsets)
            return
        if not offsets and not self._owed_messages and not self._owed_bytes:
            return
        messages, size = self._take_owed()
        fut = self._service.ack_push_stream(stream[0], offsets, messages, size)  # type: ignore[attr-defined]  # push mode: the service OpensPushStreams
        if wait:
            fut.result(timeout=FINAL_ACK_TIMEOUT_S)
        else:
            fut.add_done_callback(self._ack_done)

    def _close_stream(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            try:
                self._service.close_push_stream(stream[0])  # type: ignore[attr-defined]  # push mode: the service OpensPushStreams
            except HeadwaterError:
                pass
