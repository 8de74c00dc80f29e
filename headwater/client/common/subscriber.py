"""Subscribers: a push subscription's process side (HQueue 0.3's subscribers).

A subscriber is registered on the broker first (``headwater subscriber add QUEUE NAME`` or
``client.admin.add_subscriber``), with the partitions and tags it follows and where it
starts. A process then attaches to it::

    def store(record): db.insert(record.body)
    def notify(record): log.info("stored %s", record.message_id)

    sub = client.subscribe("orders", "audit", listeners=[store, notify])
    ...
    sub.stop()

Each record goes through the listeners in order, one record after the other, in offset order
per partition, on the subscriber's own thread (or task). The subscriber's **checkpoint** (per
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
``wait()`` re-raises what stopped it.

:class:`SubscriberBase` holds both kinds' state and delivery, written once (see
:mod:`headwater.client.common.twins`); :class:`~headwater.client.sync.subscriber.Subscriber`
runs it on a thread, :class:`~headwater.client.aio.subscriber.AsyncSubscriber` in a task.
"""

from __future__ import annotations

import inspect
import logging
import threading
import time
from collections.abc import Callable, Generator, Iterable, Iterator
from typing import Any, ClassVar

from headwater.client.common.cluster_push import (
    BACKOFF_S_MAX,
    BACKOFF_S_MIN,
    METADATA_CHECK_S,
    STREAMS_CHECK_S,
    ClusterPush,
    Leg,
)
from headwater.client.common.twins import ASYNCIO, Twins, waits
from headwater.errors import (
    ClosedError,
    HeadwaterError,
    InvalidArgumentError,
    QueueDisabledError,
    SubscriberNotFoundError,
    UnavailableError,
    error_for_code,
)
from headwater.model.cluster import ALONE
from headwater.model.filtering import decode_selection
from headwater.model.message import Record
from headwater.model.service import PushStreamSpec
from headwater.model.subscription import SubscriberInfo, subscribed_partitions

__all__ = ["Listener", "SubscriberBase"]

log = logging.getLogger("headwater.subscriber")

Listener = Callable[[Record], Any]
_STOP = object()  # wakes the push loop when stop() is called
PARTITIONS_CHECK_S = 2.0
DISABLED_RETRY_S = 0.1  # how often the pull loop looks again at a disabled queue
FINAL_ACK_TIMEOUT_S = 10.0  # how long stopping waits for the broker to take the last checkpoint


class ListenerFailed(Exception):
    """A listener raised, with ``on_error="stop"``: the subscriber stops with ``error``."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


class SubscriberBase(ClusterPush, Twins):
    """What a subscriber process is and does: its settings and listeners, its positions and
    stored checkpoints, the credit its listeners used, and the delivery loops that ask the
    broker (``@waits`` bodies). A subclass gives its kind's thread or task machinery: the
    class attributes below, and methods that wait or return what to wait for:
    ``_launch()`` starts ``_run`` on a thread or in a task, kept in ``_runner``;
    ``_joined(timeout_s)`` waits for the run to end, unless called from the run itself;
    ``_until_stopped(timeout_s)`` waits for it too, and says whether it ended;
    ``_next_push(timeout_s)`` is the next item of the inbox, or None if none came in time;
    ``_settled(fut, timeout_s)`` waits for an acknowledgement's answer."""

    _Inbox: ClassVar[Callable[[], Any]]  # the queue push handlers put into
    _Event: ClassVar[Callable[[], Any]]  # the event stop() sets
    _Consumer: ClassVar[Callable[..., Any]]  # the consumer the pull loop polls with
    _push_streams: ClassVar[type]  # the capability of a service that pushes
    _routes_push: ClassVar[type]  # the capability of a cluster's service (a stream per leader)
    _sleep: ClassVar[Callable[[float], Any]]  # time.sleep or asyncio.sleep

    def __init__(
        self,
        service: Any,
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
        if on_error not in ("stop", "skip"):
            raise InvalidArgumentError(f"on_error is 'stop' or 'skip', got {on_error!r}")
        for name_, v in (("credit_messages", credit_messages), ("credit_bytes", credit_bytes)):
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v < 2**31:
                raise InvalidArgumentError(f"{name_} is a whole number from 1 to 2**31 - 1, got {v!r}")
        ms = checkpoint_interval_ms
        if isinstance(ms, bool) or not isinstance(ms, int) or ms < 0:
            raise InvalidArgumentError(
                f"checkpoint_interval_ms is a whole number of milliseconds, 0 or more, got {ms!r}"
            )
        self._service = service
        self.queue = queue
        self.name = name
        self._routed = isinstance(service, self._routes_push)
        self.mode = "push" if self._routed or isinstance(service, self._push_streams) else "pull"
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
        self._epoch = 0  # on a cluster: the subscription epoch the coordinator gave this process
        # push mode: the stream open now (broker alone: under ALONE; on a cluster: one per leader)
        self._legs: dict[int, Leg] = {}
        self._inbox = self._Inbox()  # bounded by the credit
        self._stop_requested = self._Event()  # set by stop()
        self._stopped = threading.Event()  # set when the run ends; only the thread waits on it
        self._runner: Any = None  # the thread or task, once started
        if start:
            self.start()

    def add_listener(self, fn: Listener) -> None:
        """Call ``fn(record)`` for every record, after the listeners added before it."""
        if not callable(fn):
            raise InvalidArgumentError(f"a listener is a callable taking a Record, got {fn!r}")
        with self._lock:
            self._listeners = (*self._listeners, fn)

    @property
    def listeners(self) -> tuple[Listener, ...]:
        """The listeners, in the order each record goes through them."""
        return self._listeners

    @property
    def positions(self) -> dict[int, int]:
        """Per partition, the next offset the listeners will get (the checkpoint to be)."""
        return dict(self._positions)

    # -- control --------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        """Whether the subscriber was started and has not stopped."""
        return self._runner is not None and not self._stopped.is_set()

    @property
    def _stopping(self) -> bool:
        return bool(self._stop_requested.is_set())

    def start(self) -> None:
        """Attach to the subscriber on the broker and start delivering: on a thread of its
        own (sync), in a task on the running event loop (asyncio)."""
        with self._lock:
            if self._runner is None:
                self._launch()

    @waits
    def stop(self, timeout_s: float = 10.0) -> Generator[Any, Any, None]:
        """Finish the record in progress, store the checkpoint, detach. Idempotent. From a
        listener (the subscriber's own thread or task) it asks for the stop and returns at
        once. An asyncio subscriber that does not stop within ``timeout_s`` is cancelled."""
        self._stop_requested.set()
        self._inbox.put_nowait(_STOP)
        yield self._joined(timeout_s)

    close = stop

    @waits
    def wait(self, timeout_s: float | None = None) -> Generator[Any, Any, bool]:
        """Wait until the subscriber stops (True) or ``timeout_s`` passes (False); re-raise
        the error that stopped it, if one did."""
        done = yield self._until_stopped(timeout_s)
        if done and self.error is not None:
            raise self.error
        return bool(done)

    @waits
    def wait_for(self, condition: Callable[[], Any], timeout_s: float = 10.0) -> Generator[Any, Any, bool]:
        """Wait until ``condition()`` is true (checked every 5 ms), the subscriber stops, or
        ``timeout_s`` passes; whether it is true."""
        deadline = time.monotonic() + timeout_s
        while not condition():
            if self._stopped.is_set() or time.monotonic() >= deadline:
                return bool(condition())
            yield self._sleep(0.005)
        return True

    # -- the run --------------------------------------------------------------------------------

    @waits
    def _run(self) -> Generator[Any, Any, None]:
        try:
            if self.mode == "push":
                yield from self._run_push()
            else:
                yield from self._run_pull()
        except Exception as e:  # noqa: BLE001 - reported through wait()
            self._stopped_by(e)
        finally:
            try:
                try:
                    yield from self._checkpoint(final=True)
                except (HeadwaterError, TimeoutError) as e:
                    log.warning("subscriber %s/%s: the last checkpoint was not stored: %s", self.queue, self.name, e)
                yield from self._close_legs()
            finally:
                self._stopped.set()

    def _deliver(self, partition: int, records: Iterable[Record]) -> Generator[Any, Any, bool]:
        """Give records to the listeners in order; the position passes each one done. The
        asyncio subscriber awaits a coroutine listener's result before the next listener.
        False if the subscriber began stopping before the last one (the rest waits for the
        next)."""
        # the record loop is the hot path: no step of the driver per record, and a blocking
        # subscriber does not even look at what its listeners return
        stop, awaits, positions = self._stop_requested, self._driver is ASYNCIO, self._positions
        due = time.monotonic() + self.checkpoint_interval_s  # a quick push: checkpointed after it
        for r in records:
            if stop.is_set():
                return False
            if r.offset < positions.get(partition, 0):
                continue  # processed before a reconnect: not twice in one process
            for fn in self._listeners:
                try:
                    result = fn(r)
                    if awaits and inspect.isawaitable(result):
                        yield result
                except Exception as e:  # noqa: BLE001 - the application's error, reported
                    self._listener_failed(fn, r, e)
                    break  # the listeners after it do not see it either
            positions[partition] = r.offset + 1
            self.delivered += 1
            if time.monotonic() >= due:
                # a push or poll holds up to the credit's records, which slow listeners take
                # long over: the checkpoint follows them, so a crash repeats only an interval
                yield from self._checkpoint()
                due = self._last_checkpoint + self.checkpoint_interval_s
        return True

    def _listener_failed(self, fn: Listener, r: Record, e: Exception) -> None:
        """A listener raised: stop before the record (``on_error="stop"``) or log and skip it."""
        if self.on_error == "stop":
            raise ListenerFailed(e) from e
        log.exception("listener %r failed on %s; the record is skipped (on_error='skip')", fn, r.message_id)

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

    # -- checkpoints ----------------------------------------------------------------------------

    def _checkpoint(self, *, final: bool = False) -> Generator[Any, Any, None]:
        """Store the positions that moved, if the interval passed (or ``final``)."""
        if not final and time.monotonic() - self._last_checkpoint < self.checkpoint_interval_s:
            return
        changed = {p: o for p, o in self._positions.items() if self._stored.get(p) != o}
        if self._routed:
            if not (yield from self._checkpoint_at_coordinator(changed, final)):
                return
        elif self.mode == "push":
            if not (yield from self._ack(changed, wait=final)):
                return
        elif changed:
            yield self._service.checkpoint_subscriber(self.queue, self.name, changed)
        self._stored.update(changed)
        self._last_checkpoint = time.monotonic()

    # -- pull (an embedded broker) ----------------------------------------------------------------

    def _run_pull(self) -> Generator[Any, Any, None]:
        """Long-poll the subscribed partitions with a consumer, and look for partitions added
        to the queue every ``PARTITIONS_CHECK_S``."""
        info = yield self._service.describe_subscriber(self.queue, self.name)
        self._set_info(info)
        consumer = self._Consumer(self._service, tags=info.tags, max_poll_messages=self.credit_messages)
        try:
            parts: list[int] = []
            next_check = 0.0
            while not self._stopping:
                if time.monotonic() >= next_check:
                    yield from self._check_subscribed()
                    qi = yield self._service.describe_queue(self.queue)
                    now = subscribed_partitions(info, len(qi.partitions))
                    new = {
                        p: max(self._positions.get(p, 0), qi.partitions[p].start_offset) for p in now if p not in parts
                    }
                    parts = now
                    if new:
                        yield consumer.assign(self.queue, list(new))
                        for p, offset in new.items():
                            consumer.seek(self.queue, p, offset)
                    next_check = time.monotonic() + PARTITIONS_CHECK_S
                by_part: dict[int, list[Record]] = {}
                try:
                    polled = yield consumer.poll(timeout_ms=min(100, int(self.checkpoint_interval_s * 1000) or 100))
                except QueueDisabledError:
                    # the broker's push streams wait for the queue to be enabled again: so does this
                    yield self._sleep(DISABLED_RETRY_S)
                    continue
                for r in polled:
                    by_part.setdefault(r.partition, []).append(r)
                if by_part:
                    yield from self._check_subscribed()  # not one record for a subscriber deleted meanwhile
                done = set()
                for p, recs in by_part.items():
                    if (yield from self._deliver(p, recs)):
                        done.add(p)
                for p in parts:  # move past messages the filter skipped, where nothing is left undelivered
                    if p in done or p not in by_part:
                        self._positions[p] = max(self._positions.get(p, 0), consumer.position(self.queue, p))
                yield from self._checkpoint()
        finally:
            yield consumer.close()

    def _check_subscribed(self) -> Generator[Any, Any, None]:
        """Raise if the subscriber was deleted (embedded: a call in this process)."""
        try:
            yield self._service.describe_subscriber(self.queue, self.name)
        except SubscriberNotFoundError:
            raise SubscriberNotFoundError(
                f"subscriber {self.name!r} of queue {self.queue!r} was deleted"  # as the broker's push streams say
            ) from None

    # -- push (over the network) ------------------------------------------------------------------

    def _run_push(self) -> Generator[Any, Any, None]:
        """Deliver what the broker pushes, over one stream (a broker alone) or one per leader
        (a cluster, whose claim it takes first): open the streams missing (again at once
        when one is lost, with a backoff while that fails), check them every
        ``STREAMS_CHECK_S``, store the checkpoint when due."""
        if self._routed:
            info = yield self._service.claim_subscriber(self.queue, self.name)
            self._set_info(info)
            self._epoch = info.epoch
        fresh, backoff_s, next_check, next_table = False, BACKOFF_S_MIN, 0.0, time.monotonic() + METADATA_CHECK_S
        while not self._stopping:
            now = time.monotonic()
            if now >= next_check:
                if now >= next_table:
                    fresh, next_table = True, now + METADATA_CHECK_S
                settled = yield from (self._plan(fresh) if self._routed else self._subscribe_alone())
                fresh = not settled
                if settled:
                    backoff_s, next_check = BACKOFF_S_MIN, time.monotonic() + STREAMS_CHECK_S
                else:
                    next_check, backoff_s = time.monotonic() + backoff_s, min(backoff_s * 2, BACKOFF_S_MAX)
            due_s = min(self._last_checkpoint + self.checkpoint_interval_s, next_check) - time.monotonic()
            item = yield self._next_push(max(0.001, due_s))
            if item is None:  # nothing came before the checkpoint or the check was due
                yield from self._checkpoint()
                continue
            if item is _STOP:
                return  # the streams stay open for the last checkpoint, then close
            leg, body = item
            if self._legs.get(leg.broker_id) is not leg:
                continue  # from a stream closed since: what it held is pushed again by the next
            if self._push_lost(leg, body):  # raises what ends the subscriber (replaced, deleted)
                # a cluster waits a backoff for its table to name the new leader
                fresh, next_check = True, min(next_check, time.monotonic() + (backoff_s if self._routed else 0))
                continue
            complete = not body.batches or (yield from self._deliver(body.partition, self._push_records(body)))
            if self._pushed(leg, body, complete):
                self._give_credit(leg)
            yield from self._checkpoint()

    def _subscribe_alone(self) -> Generator[Any, Any, bool]:
        """Open the stream of a broker alone unless it is open; whether it is."""
        if ALONE in self._legs:
            return True
        leg = Leg(ALONE, self._service, [])
        try:
            spec = PushStreamSpec(self.queue, self.name, self.credit_messages, self.credit_bytes)
            leg.sid, info = yield self._service.open_push_stream(spec, lambda body: self._inbox.put_nowait((leg, body)))
        except UnavailableError as e:
            log.info("subscriber %s/%s: cannot subscribe (%s); retrying", self.queue, self.name, e)
            return False
        self._set_info(info)
        leg.partitions, leg.stream_pos = sorted(info.checkpoints), dict(info.checkpoints)
        self._legs[ALONE] = leg
        return True

    def _push_lost(self, leg: Leg, body: Any) -> bool:
        """Whether a push item of ``leg`` ends it (then it is forgotten) so that the
        subscriber subscribes again (the connection was lost, or the broker ended it for a
        passing reason); raises what the broker ended it with otherwise."""
        if body is not None and not body.ended:
            return False
        del self._legs[leg.broker_id]  # the broker closed it already, or its connection went
        if body is None:
            log.info("subscriber %s/%s: connection lost; subscribing again", self.queue, self.name)
            return True
        exc = error_for_code(body.ended_code)(body.ended)
        if not exc.retriable:
            raise exc
        log.info("subscriber %s/%s: %s", self.queue, self.name, body.ended)
        return True

    def _push_records(self, body: Any) -> Iterator[Record]:
        """The records of a push, decoded (and their tags checked again)."""
        start = self._positions.get(body.partition, 0)
        sel = body.selections
        return (
            r
            for i, b in enumerate(body.batches)
            for r in decode_selection(b, sel[i] if sel else (), self.queue, start_offset=start, tags=self._tags)
        )

    def _ack(self, offsets: dict[int, int], *, wait: bool) -> Generator[Any, Any, bool]:
        """Give back the credit owed and store ``offsets`` on the stream; ``wait`` for the
        broker to take them (the last checkpoint) or not. Whether they were stored (or sent)."""
        leg = self._legs.get(ALONE)
        if leg is None and not wait:  # the stream was lost: the next one stores them
            self._last_checkpoint = time.monotonic()
            return False
        if leg is None:  # the last checkpoint, with the stream lost: store it without one
            if offsets:
                yield self._service.checkpoint_subscriber(self.queue, self.name, offsets)
            return True
        if not offsets and not leg.owed_messages and not leg.owed_bytes:
            return True
        messages, size = leg.owed_messages, leg.owed_bytes
        leg.owed_messages = leg.owed_bytes = 0
        fut = leg.link.ack_push_stream(leg.sid, offsets, messages, size)
        if wait:
            yield self._settled(fut, FINAL_ACK_TIMEOUT_S)
        else:
            fut.add_done_callback(self._ack_done)
        return True

    def _ack_done(self, fut: Any) -> None:
        e = None if fut.cancelled() else fut.exception()
        if e is not None and not isinstance(e, (UnavailableError, ClosedError, SubscriberNotFoundError)):
            log.warning("subscriber %s/%s: an acknowledgement failed: %s", self.queue, self.name, e)
