"""What the blocking and the asyncio shared consumers share: the leases they hold, and
receiving and settling them, written once as ``@waits`` bodies (see :mod:`.twins`).

A shared group is not bound to partitions (QMQ's pull log, Kafka's share groups): every
member receives from every partition, so adding members speeds consumption up whatever the
partition count. Each message received is leased to this member for
``visibility_timeout_ms``; :meth:`Delivery.ack` finishes it, :meth:`Delivery.nack` gives it
back for redelivery after a backoff, and a lease that runs out is given back the same way.
After ``max_attempts`` deliveries the message goes to the dead-letter queue
``<queue>.dlq`` with the failure reason in its properties. ``at_most_once=True`` finishes
each message on delivery instead (QMQ's ``consumeMostOnce``): never delivered twice,
lost if the member fails while handling it. The guide is ``docs/shared-groups.md``.

:class:`~headwater.client.sync.shared_consumer.SharedConsumer` drives the bodies on the
caller's thread, :class:`~headwater.client.aio.shared_consumer.AsyncSharedConsumer` as
coroutines; each keeps only how it waits for receives sent over the network, or for a
``wakeup()`` while the broker is away (``_wait_receive``).

``wakeup()`` (:mod:`.waking`) ends the receive that waits, or the next one, with
:class:`~headwater.errors.WakeupError`. What the broker answered by then is not handed out
past it, nor dropped: it is kept (``_kept``) for the next receive. A receive request already
written waits out its long poll on the broker (the protocol has no cancel): the consumer
stops waiting for it and keeps its future (``_late``, as for an asyncio receive cancelled).
The next receive waits for that answer rather than send another request (so one at most
waits on the broker) and hands out what it leased; ``close()`` waits for it (up to the end
of that long poll) to give back what it leased with the rest. Embedded, the long poll
runs in slices of ``LOCAL_SLICE_MS`` on the caller's side, so a wakeup ends it within one
and no request is left behind.
"""

from __future__ import annotations

import logging
import os
import secrets
import time
from collections.abc import Generator, Iterable
from typing import Any

from headwater.client.common.closing import Closable
from headwater.client.common.twins import Twins, waits
from headwater.client.common.waking import Wakes
from headwater.client.core.lookups import decode_stored
from headwater.client.core.reads import check_poll
from headwater.client.transport.polling import Outage
from headwater.errors import (
    HeadwaterError,
    InvalidArgumentError,
    LeaseError,
    UnavailableError,
    error_for_code,
)
from headwater.model.config import validate_queue_name
from headwater.model.message import MessageId, Record
from headwater.model.service import AsyncStartsSharedReceive, StartsSharedReceive
from headwater.model.shared import (
    LeaseRefusal,
    SharedDeliveries,
    SharedGroupInfo,
    SharedGroupSettings,
    validate_group,
    validate_member,
    validate_receive,
)

__all__ = ["LOCAL_SLICE_MS", "Delivery", "SharedConsumerBase", "deliveries_from", "raise_refused"]

log = logging.getLogger("headwater.client")

#: Embedded, the longest a receive waits in the broker at a time: a ``wakeup()`` ends a
#: receive within it (the asyncio embedded service holds a thread no longer either).
LOCAL_SLICE_MS = 100
#: How long past the end of its long poll ``close()`` waits for the answer of a receive that
#: a wakeup (or a cancellation) left in flight, for its way back over the network.
LATE_ANSWER_GRACE_S = 1.0
_LATER = object()  # what _written_answer returns when the answer goes to a later receive


class Delivery:
    """A message leased to this member: ``record``, which delivery of it this is
    (``attempt``, from 1), and the lease to :meth:`ack`, :meth:`nack` or :meth:`extend`.

    A message delivered at most once has no lease (``lease_id`` is empty): it is already
    finished, and ack/nack/extend do nothing.
    """

    __slots__ = ("record", "attempt", "lease_id", "deadline_ms", "_consumer")

    def __init__(self, record: Record, attempt: int, lease_id: str, deadline_ms: int, consumer: Any) -> None:
        self.record = record
        self.attempt = attempt
        self.lease_id = lease_id
        self.deadline_ms = deadline_ms  # when the lease ends, ms since the epoch (broker clock)
        self._consumer = consumer

    @property
    def body(self) -> bytes:
        return self.record.body

    @property
    def message_id(self) -> MessageId:
        return self.record.message_id

    def ack(self) -> None:
        """Finish this message (durably on the broker). :class:`LeaseExpiredError` if the
        lease ran out first: the message is someone else's (or will be) to process."""
        self._consumer.ack([self])

    def nack(self, reason: str = "", delay_ms: int | None = None) -> None:
        """Give this message back: delivered again after ``delay_ms`` (None: the group's
        backoff), or dead-lettered with ``reason`` when its attempts are used up."""
        self._consumer.nack([self], reason, delay_ms)

    def extend(self, visibility_timeout_ms: int | None = None) -> None:
        """Keep the lease ``visibility_timeout_ms`` (default: the consumer's) from now."""
        self._consumer.extend([self], visibility_timeout_ms)

    def __repr__(self) -> str:
        return f"Delivery({self.record.message_id}, attempt={self.attempt}, lease_id={self.lease_id!r})"


def deliveries_from(res: SharedDeliveries, queue: str, consumer: Any, cls: type = Delivery) -> list[Any]:
    """Deliveries in lease order, each with its record picked out of the batches. A lease
    whose record the batches lack (it expired by TTL meanwhile) is skipped: it runs out."""
    records: dict[tuple[int, int], Record] = {}
    wanted = {(x.partition, x.offset) for x in res.leases}
    for b in res.batches:
        for r in decode_stored(b, queue):
            if (r.partition, r.offset) in wanted:
                records[(r.partition, r.offset)] = r
    return [
        cls(records[(x.partition, x.offset)], x.attempt, x.lease_id, x.deadline_ms, consumer)
        for x in res.leases
        if (x.partition, x.offset) in records
    ]


def raise_refused(refused: list[LeaseRefusal], what: str) -> None:
    """Raise the error of the first refusal (its class from the code), naming how many there
    were; the exception's ``refused`` holds them all."""
    if not refused:
        return
    first = refused[0]
    cls = error_for_code(first.code)
    if not issubclass(cls, HeadwaterError):
        cls = LeaseError
    more = f" ({len(refused) - 1} more lease(s) refused too; see .refused)" if len(refused) > 1 else ""
    err = cls(f"{what}: {first.message}{more}")
    err.refused = list(refused)  # type: ignore[attr-defined]  # the refusals ride on the error for the caller
    raise err


class SharedConsumerBase(Twins, Closable, Wakes):
    """A member of shared group ``group`` on ``queue``: settings checked up front, the
    member id, the leases received and not yet settled, and the calls to the broker. Its
    subclasses say how they wait (:mod:`.twins`); each is used from one thread or task.

    The settings (``max_attempts``, ``backoff_ms``, and the others of
    :class:`~headwater.model.shared.SharedGroupSettings`) are sent with every receive
    and become the group's: give every member the same."""

    _delivery: type[Delivery] = Delivery  # what receive() hands out
    _kind = "shared consumer"
    _woken_call = "receive"

    def __init__(
        self,
        service: Any,
        group: str,
        queue: str,
        *,
        visibility_timeout_ms: int = 30_000,
        max_attempts: int = 5,
        backoff_ms: int = 1_000,
        at_most_once: bool = False,
        member: str | None = None,
        **settings: Any,
    ) -> None:
        validate_group(group)
        validate_queue_name(queue)
        validate_receive(1, visibility_timeout_ms)
        if not isinstance(at_most_once, bool):
            raise InvalidArgumentError(f"at_most_once is a bool, got {type(at_most_once).__name__}")
        self.settings = SharedGroupSettings.from_mapping(
            {"max_attempts": max_attempts, "backoff_ms": backoff_ms, **settings}
        )
        self._service = service
        self.group = group
        self.queue = queue
        self.member = validate_member(member) if member is not None else _new_member_id()
        self.visibility_timeout_ms = visibility_timeout_ms
        self.at_most_once = at_most_once
        self._settings_map = self.settings.as_mapping()
        self._held: dict[str, Any] = {}  # leases received and not yet acked or nacked
        self._kept: list[Delivery] = []  # answered and not handed out yet (a wakeup, a cancel, more than asked)
        # receives written that a wakeup or a cancel stopped waiting for: (future, when close
        # stops waiting for it); their answers are the next receives'
        self._late: list[tuple[Any, float]] = []
        self._closed = False
        self._outage = Outage(service)  # receives through a broker's restart (over the network)
        # over the network a receive is sent without waiting, and taken back while unwritten
        # (asked once: a Protocol's isinstance costs microseconds)
        self._starts_receive = isinstance(service, (StartsSharedReceive, AsyncStartsSharedReceive))

    def _receive_args(self, max_messages: int, timeout_ms: int) -> tuple:
        self._check_open()
        max_messages = check_poll(max_messages, timeout_ms, 32, call="receive")  # a positive int; a finite timeout >= 0
        return (
            self.group,
            self.queue,
            self.member,
            max_messages,
            self.visibility_timeout_ms,
            self.at_most_once,
            self._settings_map,
            int(timeout_ms),
        )

    def _keep(self, deliveries: list[Delivery]) -> None:
        """Deliveries the broker leased: held, and handed out by the receives from here in
        order (all by the one that asked, unless it was woken or cancelled, or asked for
        fewer than an earlier one did)."""
        self._kept.extend(self._track(deliveries))

    def _track(self, out: list) -> list:
        for d in out:
            if d.lease_id:
                self._held[d.lease_id] = d
        return out

    def _ids(self, deliveries: Any) -> list[str]:
        """The lease ids of ``deliveries``: a Delivery, a lease id (str), or a list of them."""
        self._check_open()
        if isinstance(deliveries, (Delivery, str)) or not isinstance(deliveries, (list, tuple, set, frozenset)):
            deliveries = [deliveries]  # one (anything else is refused below)
        ids = []
        for d in deliveries:
            if isinstance(d, Delivery):
                if d.lease_id:  # at most once: nothing to settle
                    ids.append(d.lease_id)
            elif isinstance(d, str):
                ids.append(d)
            else:
                raise InvalidArgumentError(
                    f"ack, nack and extend take deliveries from receive() or their lease ids (str), "
                    f"one or a list; got {type(d).__name__} {d!r}"
                )
        return ids

    def _settle(self, ids: list[str]) -> None:
        for i in ids:
            self._held.pop(i, None)

    # -- what asks the broker (driven as blocking methods or coroutines) ----------------------

    @waits
    def receive(self, max_messages: int = 32, timeout_ms: int = 1000) -> Generator[Any, Any, list[Delivery]]:
        """Up to ``max_messages`` deliveries from any partition, waiting up to ``timeout_ms``
        for the first (long polling on the broker).

        While the broker is away (restarting, say) a receive returns nothing after its
        ``timeout_ms``, as a poll does, and the client connects again meanwhile; once it
        gave up for ``connect_timeout_s``, the receive raises :class:`UnavailableError`.

        ``wakeup()`` (from another thread) ends the receive that waits, or the next one,
        with :class:`~headwater.errors.WakeupError`; what was leased for it is handed out by
        a later receive (or given back by ``close()``), never dropped."""
        args = self._receive_args(max_messages, timeout_ms)
        self._arm_wakeup()
        self._check_woken()
        if self._late:
            self._take_late()
        if not self._kept:
            if self._starts_receive:
                res = yield from self._receive_remote(args)
            else:
                res = yield from self._receive_local(args)
            if res is not None:
                self._keep(deliveries_from(res, self.queue, self, self._delivery))
            if self._late:
                self._take_late()
            if self._wakeup.done():  # woken: what came waits for the next receive
                self._end_woken()
        out, self._kept = self._kept[: args[3]], self._kept[args[3] :]
        return out

    def _end_woken(self) -> None:
        """The wait ended by ``wakeup()``: raise its WakeupError (once)."""
        self._woken = True
        self._check_woken()

    def _end_orphans(self) -> Any:
        """What ``close`` waits for first: receives still running for callers that stopped
        waiting (the asyncio kind's, embedded); None: nothing."""
        return None

    def _local_answer(self, args: tuple) -> Any:
        """A receive of a service in this process (embedded, in memory): the call, or the
        awaitable, of its answer."""
        return self._service.shared_receive(*args)

    def _receive_local(self, args: tuple) -> Generator[Any, Any, Any]:
        """A receive embedded: its long poll in slices of ``LOCAL_SLICE_MS``, until something
        is leased, its time is up or ``wakeup()`` was called (seen between slices)."""
        deadline = time.monotonic() + args[-1] / 1000
        wakeup = self._wakeup
        while True:
            remaining_ms = max(0, int((deadline - time.monotonic()) * 1000))
            res = yield self._local_answer((*args[:-1], min(remaining_ms, LOCAL_SLICE_MS)))
            if res.leases or remaining_ms <= LOCAL_SLICE_MS or wakeup.done():
                return res

    def _receive_remote(self, args: tuple) -> Generator[Any, Any, Any]:
        """A receive over the network: first the answer of a receive left in flight, if
        one is (kept: :meth:`_take_late`; no second request is sent while one waits on the
        broker), then a request of its own for the time left. Its answer, or None."""
        if not self._late:
            return (yield from self._receive_sent(args))
        deadline = time.monotonic() + args[-1] / 1000
        wakeup = self._wakeup
        yield self._wait_receive([*(f for f, _ in self._late), wakeup], args[-1] / 1000)
        self._take_late()
        if self._late or self._kept or wakeup.done() or time.monotonic() >= deadline:
            return None
        # it ended with nothing: ask for the time left
        return (yield from self._receive_sent((*args[:-1], max(0, int((deadline - time.monotonic()) * 1000)))))

    def _receive_sent(self, args: tuple) -> Generator[Any, Any, Any]:
        """Send a receive: its answer, or None when the broker is away, the request was
        taken back unwritten (nothing was leased for it; one written is waited for, as its
        answer holds leases), or the wait was woken first (its answer goes to a later
        receive)."""
        timeout_s = args[-1] / 1000
        submitted_at = time.monotonic()
        try:
            res = yield from self._written_answer(args, timeout_s)
        except UnavailableError as e:  # the connection was lost, or the broker is stopping
            if self.at_most_once or not self._outage.rides_out(e):
                raise  # at most once: an answer lost on the way would have lost its messages
            backoff_s = max(0.0, min(self._outage.backoff_s(), submitted_at + timeout_s - time.monotonic()))
            yield self._wait_receive([self._wakeup], backoff_s)  # a wakeup() ends it too
            return None
        if res is _LATER:
            return None
        if res is None:
            self._outage.unsent(submitted_at)
            return None
        self._outage.over()
        return res

    def _written_answer(self, args: tuple, timeout_s: float) -> Generator[Any, Any, Any]:
        """Send the receive and wait for its answer or a wakeup; None if it was taken back
        unwritten after its timeout, ``_LATER`` if a wakeup ended the wait before its answer
        (which then goes to a later receive: :meth:`_leave`)."""
        service = self._service
        wakeup = self._wakeup
        fut = service.start_shared_receive(*args)
        try:
            yield self._wait_receive([fut, wakeup], timeout_s)
            if not fut.done() and not wakeup.done():  # its time is up
                if service.withdraw(fut):
                    self._withdrawn(fut)
                    return None
                if not fut.done():  # written: the broker answers by its long poll's end
                    yield self._wait_receive([fut, wakeup], None)
        except BaseException:  # cancelled (asyncio), interrupted: what it leases is not lost
            self._leave(fut, timeout_s)
            raise
        if not fut.done():  # woken
            self._leave(fut, timeout_s)
            return _LATER
        return fut.result()

    def _leave(self, fut: Any, timeout_s: float) -> None:
        """Stop waiting for the receive ``fut``: taken back if it is not written (nothing is
        leased for it), else its answer goes to a later receive (:meth:`_take_late`)."""
        if not fut.done() and self._service.withdraw(fut):
            self._withdrawn(fut)
        else:
            self._late.append((fut, time.monotonic() + timeout_s + LATE_ANSWER_GRACE_S))
            self._left(fut)

    def _withdrawn(self, fut: Any) -> None:
        """A request taken back unwritten: the asyncio kind cancels its future."""

    def _left(self, fut: Any) -> None:
        """A receive's future left for later: the asyncio kind marks its error as seen."""

    def _take_late(self) -> None:
        """Keep what the late receives that are answered leased (one that failed leased
        nothing this client knows of: its leases, if any, run out)."""
        waiting = []
        for fut, until in self._late:
            if not fut.done():
                waiting.append((fut, until))
            elif not fut.cancelled() and fut.exception() is None and fut.result() is not None:
                self._keep(deliveries_from(fut.result(), self.queue, self, self._delivery))
        self._late = waiting

    def _wait_late(self) -> Generator[Any, Any, None]:
        """Closing: wait for the late receives' answers, each up to its long poll's end."""
        for fut, until in list(self._late):
            if not fut.done():
                yield self._wait_receive([fut], max(0.0, until - time.monotonic()))
        self._take_late()
        self._late.clear()  # an answer still to come: its leases run out

    @waits
    def ack(self, deliveries: Iterable[Delivery]) -> Generator[Any, Any, None]:
        """Finish these messages in one call. The leases the broker refuses (expired,
        another member's) raise :class:`LeaseError` after the others are acknowledged."""
        ids = self._ids(deliveries)
        if ids:
            refused = yield self._service.shared_ack(self.group, self.queue, self.member, ids)
            self._settle(ids)
            raise_refused(refused, "ack")

    @waits
    def nack(
        self, deliveries: Iterable[Delivery], reason: str = "", delay_ms: int | None = None
    ) -> Generator[Any, Any, None]:
        """Give these messages back for redelivery (see :meth:`Delivery.nack`)."""
        ids = self._ids(deliveries)
        if ids:
            refused = yield self._service.shared_nack(self.group, self.queue, self.member, ids, reason, delay_ms)
            self._settle(ids)
            raise_refused(refused, "nack")

    @waits
    def extend(
        self, deliveries: Iterable[Delivery], visibility_timeout_ms: int | None = None
    ) -> Generator[Any, Any, None]:
        """Keep these leases ``visibility_timeout_ms`` (default: the consumer's) from now."""
        ids = self._ids(deliveries)
        if ids:
            vt = self.visibility_timeout_ms if visibility_timeout_ms is None else visibility_timeout_ms
            raise_refused((yield self._service.shared_extend(self.group, self.queue, self.member, ids, vt)), "extend")

    @waits
    def describe(self) -> Generator[Any, Any, SharedGroupInfo]:
        """The group's state on the broker: settings, and per partition the committed floor,
        leases per member, messages awaiting a retry, dead letters."""
        return (yield self._service.shared_describe(self.group, self.queue))

    @waits
    def close(self) -> Generator[Any, Any, None]:
        """Give back what this member still holds (redelivered to others at once; the
        delivery counts as an attempt), then stop. A receive that ``wakeup()`` left in
        flight is waited for first, up to the end of its long poll, and what it leased is
        given back too."""
        if self._closed:
            return
        ending = self._end_orphans()
        if ending is not None:
            yield ending
        if self._late:  # answers a wakeup or a cancel left to come: given back with the rest
            yield from self._wait_late()
        held = list(self._held)
        self._held.clear()
        unleased = sum(1 for d in self._kept if not d.lease_id)
        if unleased:  # at most once: finished on the broker when received, never handed out
            log.warning(
                "shared group %s on %s: %d message(s) received at most once were closed before a receive "
                "handed them out: they are lost",
                self.group,
                self.queue,
                unleased,
            )
        self._kept.clear()  # (held too: given back with the rest)
        if held:
            try:
                yield self._service.shared_nack(
                    self.group, self.queue, self.member, held, "released: consumer closed", 0
                )
            except HeadwaterError:
                pass  # they run out by themselves
        self._closed = True


def _new_member_id() -> str:
    """Unique per consumer: the process id for operators, random bits for uniqueness."""
    return f"m{os.getpid()}-{secrets.token_hex(6)}"
