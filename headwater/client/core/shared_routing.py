"""Shared groups on a cluster, without I/O (docs/shared-groups.md, "On a cluster"): which
broker each lease goes to, how the leaders' answers make one, and the deliveries a receive
got after it was answered.

A shared group's state for partition *p* lives on *p*'s leader. So a receive asks every
broker that leads a partition of the queue at once and is answered by the first answer
holding deliveries; the answers that come after it (those brokers' long polls end later)
are kept, per (group, queue, member), for that member's next receive (:class:`SharedReceives`)
and never dropped. An ack, nack or extend splits its lease ids by their partition's leader
(:func:`split_leases`), one request per broker; a broker that refuses with
``NotLeaderError`` no longer leads the partition, and its new leader does not know the
lease: it is refused as expired (:func:`refused_as`), and the message is delivered again
(at least once). Describe merges each leader's partitions (:func:`merge_shared_describe`);
listing groups (every broker's, merged by ``headwater.client.core.routing.merge_groups``)
names each shared group once.

Ack, nack, extend and describe are plans (:func:`lease_call`, :func:`shared_describe`:
see :mod:`headwater.client.core.effects`); the receives' drivers
(``headwater.client.transport.shared_routing``, ``headwater.client.aio.shared_routing``)
own the futures and the locking.

>>> receives = SharedReceives()
>>> key = ("g", "q", "m1")
>>> r, send = receives.start(key, 10, ["b1", "b2"])
>>> send, r.done
(['b1', 'b2'], False)
>>> got = SharedDeliveries([b"x"], [SharedLease(0, 5, 1, "3e8:0:5:1:m1", 0)])
>>> receives.answered(key, "b1", got) is r, len(r.answer.leases)
(True, 1)
>>> receives.answered(key, "b2", got), receives.held(key)  # late: kept for the next receive
(None, 1)
>>> r2, send = receives.start(key, 10, ["b1", "b2"])
>>> send, len(r2.answer.leases)
([], 1)
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any, cast

import msgspec

from headwater.client.core.effects import HOME, PLANS, Call, Fanout, Plan, RoutedState, addresses_of, plan
from headwater.errors import GroupNotFoundError, HeadwaterError, LeaseExpiredError, NotLeaderError, UnavailableError
from headwater.model.shared import LeaseId, LeaseRefusal, SharedDeliveries, SharedGroupInfo, SharedLease
from headwater.protocol import messages as m

__all__ = [
    "ReceiveRound",
    "give_back",
    "lease_call",
    "shared_describe",
    "SharedReceives",
    "merge_lease_answers",
    "merge_shared_describe",
    "phases",
    "refused_as",
    "split_leases",
]

log = logging.getLogger(__name__)

#: (group, queue, member): whose late deliveries a receive may take
Key = tuple[str, str, str]

LeaseRequest = m.SharedAckRequest | m.SharedNackRequest | m.SharedExtendRequest


def _empty() -> SharedDeliveries:
    return SharedDeliveries([], [])  # a new one each time: its lists are the caller's


def phases(body: m.SharedReceiveRequest) -> tuple[m.SharedReceiveRequest, m.SharedReceiveRequest | None]:
    """A receive's two rounds: every leader asked without waiting first, then, when none
    had anything, every leader asked with the receive's long poll (None: it has none).

    Why: a round answered by one leader leaves the others' long polls parked, and what
    they lease later is this member's (kept for its next receive). Asking without waiting
    first leaves nothing parked whenever messages are there already; only messages that
    arrive during a long poll can come to a parked one.

    >>> quick, long = phases(m.SharedReceiveRequest("g", "q", "m", 10, 30_000, max_wait_ms=5_000))
    >>> quick.max_wait_ms, long.max_wait_ms
    (0, 5000)
    """
    if body.max_wait_ms <= 0:
        return body, None
    return msgspec.structs.replace(body, max_wait_ms=0), body


def split_leases(lease_ids: list[str], leaders: Mapping[int, Hashable]) -> tuple[dict[Any, list[str]], list[str]]:
    """The lease ids by the broker leading their partition (``leaders``: partition ->
    broker), in their order, and those whose partition has no leader now. A malformed id
    raises ``InvalidArgumentError`` as the broker would.

    >>> split_leases(["3e8:0:5:1:m", "3e8:1:6:1:m", "3e8:2:7:1:m", "3e8:0:8:1:m"], {0: "a", 1: "b"})
    ({'a': ['3e8:0:5:1:m', '3e8:0:8:1:m'], 'b': ['3e8:1:6:1:m']}, ['3e8:2:7:1:m'])
    """
    by_broker: dict[Any, list[str]] = {}
    leaderless: list[str] = []
    for text in lease_ids:
        lease = LeaseId.parse(text)
        broker = leaders.get(lease.partition)
        if broker is None:
            leaderless.append(text)
        else:
            by_broker.setdefault(broker, []).append(text)
    return by_broker, leaderless


def refused_as(lease_ids: Iterable[str], error: BaseException) -> list[LeaseRefusal]:
    """Refusals of leases a broker could not act on. ``NotLeaderError`` (and a partition
    with no leader): the partition moved, its new leader does not know the lease, so it is
    refused as expired (the message comes again: at least once). A broker out of reach: its
    error's code (retriable), the lease's state unknown until its visibility timeout."""
    if isinstance(error, UnavailableError) and not isinstance(error, NotLeaderError):
        code = error.code
        why = f"its partition's leader did not answer ({error}); unless acted on, it expires and comes again"
    else:
        code = LeaseExpiredError.code
        why = (
            f"its partition moved to another broker, which does not know the lease ({error}); "
            f"the message will be delivered again"
        )
    return [LeaseRefusal(x, code, f"lease {x}: {why}") for x in lease_ids]


def merge_lease_answers(
    lease_ids: list[str],
    by_broker: Mapping[Any, list[str]],
    leaderless: list[str],
    answers: Mapping[Any, list[LeaseRefusal] | BaseException],
) -> list[LeaseRefusal]:
    """One ack's (nack's, extend's) refusals from its brokers' ``answers`` (broker -> its
    refusals, or the error it raised), in the order of ``lease_ids``: a broker's refusal
    and a moved or unreachable partition's leases (:func:`refused_as`). Any other error
    (the queue is gone, a bad argument) is raised, once every broker was heard.

    >>> from headwater.errors import NotLeaderError
    >>> out = merge_lease_answers(["1:0:0:1:m", "1:1:0:1:m"], {"a": ["1:0:0:1:m"], "b": ["1:1:0:1:m"]}, [],
    ...                           {"a": [], "b": NotLeaderError("moved")})
    >>> [(r.lease_id, r.code == LeaseExpiredError.code) for r in out]
    [('1:1:0:1:m', True)]
    """
    refused = refused_as(leaderless, NotLeaderError("no broker leads the partition now"))
    failure: BaseException | None = None
    for broker, answer in answers.items():
        if isinstance(answer, UnavailableError):
            refused.extend(refused_as(by_broker[broker], answer))
        elif isinstance(answer, BaseException):
            failure = failure or answer
        else:
            refused.extend(answer)
    if failure is not None:
        raise failure
    order = {x: i for i, x in enumerate(lease_ids)}
    return sorted(refused, key=lambda x: order.get(x.lease_id, len(order)))


def merge_shared_describe(answers: Mapping[Any, SharedGroupInfo], leaders: Mapping[int, Hashable]) -> SharedGroupInfo:
    """One group's describe from its leaders' answers (``answers``: broker -> its answer;
    ``leaders``: partition -> broker): each partition from its leader's answer (from any
    answer holding it when its leader's does not), in partition order; the settings from
    the first broker's answer (the members send theirs with every receive)."""
    assert answers, "merge at least one answer"
    first = answers[min(answers, key=str)]
    found: dict[int, Any] = {}
    for broker, info in answers.items():
        for p in info.partitions:
            if p.partition not in found or leaders.get(p.partition) == broker:
                found[p.partition] = p
    return SharedGroupInfo(
        group=first.group,
        queue=first.queue,
        settings=first.settings,
        dead_letter_queue=first.dead_letter_queue,
        partitions=[found[p] for p in sorted(found)],
    )


class ReceiveRound:
    """One receive of one member: the brokers whose answer it waits for, then its answer
    (or error), or withdrawn (taken back by its caller: its deliveries go to the next)."""

    __slots__ = (
        "key",
        "max_messages",
        "waiting",
        "sent",
        "wait_all",
        "answer",
        "error",
        "failures",
        "answers",
        "withdrawn",
    )

    def __init__(self, key: Key, max_messages: int, wait_all: bool = False) -> None:
        self.key = key
        self.max_messages = max_messages
        self.waiting: set[Hashable] = set()
        self.sent: set[Hashable] = set()  # the brokers asked by this round (the others were asked before)
        self.wait_all = wait_all  # answered once every broker it asked answered (a round that does not wait)
        self.answer: SharedDeliveries | None = None
        self.error: BaseException | None = None
        self.failures: list[BaseException] = []  # brokers out of reach (the others' answers count)
        self.answers = 0  # brokers that answered
        self.withdrawn = False

    @property
    def done(self) -> bool:
        return self.answer is not None or self.error is not None or self.withdrawn


class SharedReceives:
    """The receives of one client's shared consumers on a cluster (not thread-safe: the
    driver locks). Per (group, queue, member): the brokers a receive is outstanding at (a
    member never has two at one broker), the deliveries that came after their receive was
    answered, and the receive waiting now.

    Bound: a broker answers at most ``max_messages``, a receive is sent to a broker only
    when none is outstanding there, and a receive takes what is held before sending: so
    what is held never exceeds (brokers x ``max_messages``) per member. Their leases run
    from when the broker gave them: a member that stops receiving lets them time out, and
    the broker delivers them again (at least once)."""

    def __init__(self) -> None:
        self._held: dict[Key, list[SharedDeliveries]] = {}
        self._pending: dict[Key, set[Hashable]] = {}
        self._rounds: dict[Key, ReceiveRound] = {}

    def held(self, key: Key) -> int:
        """How many deliveries are kept for ``key``'s next receive."""
        return sum(len(d.leases) for d in self._held.get(key, ()))

    def start(
        self, key: Key, max_messages: int, brokers: Iterable[Hashable], *, wait_all: bool = False
    ) -> tuple[ReceiveRound, list[Hashable]]:
        """A new receive of ``key`` from ``brokers`` (the queue's leaders): the round, and
        the brokers to send it to now (those with none of this member's outstanding). Kept
        deliveries answer it at once, and nothing is sent; a round left waiting by the
        member before is replaced (its caller gave up on it). ``wait_all``: answered once
        every broker sent to answered (a round that does not wait: each answers at once, and
        together they give what one broker would), else by the first answer with deliveries."""
        r = ReceiveRound(key, max_messages, wait_all)
        old = self._rounds.pop(key, None)
        if old is not None and not old.done:
            old.withdrawn = True
        taken = self._take(key, max_messages)
        if taken is not None:
            r.answer = taken
            return r, []
        pending = self._pending.setdefault(key, set())
        send = [b for b in dict.fromkeys(brokers) if b not in pending]
        pending.update(send)
        r.waiting = set(pending)
        r.sent = set(send)
        if not r.waiting or (wait_all and not send):  # nobody to ask at once: no answer to wait for
            r.answer = _empty()  # (and with nobody asked: no broker leads a partition of the queue now)
            self._forget(key)
            return r, []
        self._rounds[key] = r
        return r, send

    def answered(
        self, key: Key, broker: Hashable, result: SharedDeliveries | None, error: BaseException | None = None
    ) -> ReceiveRound | None:
        """``broker``'s answer to ``key``'s receive (``result``, or ``error``): kept, and
        the round it completes returned (the driver settles its future), or None."""
        self._pending.get(key, set()).discard(broker)
        if result is not None and result.leases:
            self._held.setdefault(key, []).append(result)
        r = self._rounds.get(key)
        if r is None or r.done:
            self._forget(key)
            return None
        r.waiting.discard(broker)
        if error is None:
            r.answers += 1
        else:
            if isinstance(error, UnavailableError) or not isinstance(error, HeadwaterError):
                r.failures.append(error)
            else:  # the broker's refusal (a bad argument, the queue is gone): every broker's
                r.error = error
        if r.error is None and r.wait_all and r.sent & r.waiting:
            return None  # a broker asked by this round has not answered yet
        if r.error is None:
            r.answer = self._take(key, r.max_messages)
            # a round that does not wait is over once those it asked answered (the rest poll on)
            if r.answer is None and (r.wait_all or not r.waiting):
                if r.failures and not r.answers:
                    r.error = r.failures[0]  # nobody answered: the consumer rides out the outage
                else:
                    r.answer = _empty()
        if not r.done:
            return None
        del self._rounds[key]
        self._forget(key)
        return r

    def keep(self, key: Key, deliveries: SharedDeliveries) -> None:
        """Give back an answer its caller could not take (its wait was cancelled): the
        member's next receive gets it first."""
        if deliveries.leases:
            self._held.setdefault(key, []).insert(0, deliveries)

    def drain(self) -> dict[Key, list[str]]:
        """Every kept delivery's lease id, by member, forgotten here (the client closes:
        it gives them back so that others get them at once, not after their leases)."""
        out = {key: [x.lease_id for d in held for x in d.leases if x.lease_id] for key, held in self._held.items()}
        self._held.clear()
        return {key: ids for key, ids in out.items() if ids}

    def withdraw(self, r: ReceiveRound) -> bool:
        """End a receive its caller stops waiting for: True if it had no answer yet; it is
        answered empty now (nothing was handed to it; what its brokers give later is kept
        for the next receive). False when it had its answer already."""
        if r.done:
            return False
        r.answer = _empty()
        if self._rounds.get(r.key) is r:
            del self._rounds[r.key]
        self._forget(r.key)
        return True

    def _take(self, key: Key, max_messages: int) -> SharedDeliveries | None:
        held = self._held.get(key)
        if not held:
            return None
        batches: list[bytes] = []
        leases: list[SharedLease] = []
        while held and len(leases) < max_messages:
            d = held.pop(0)
            room = max_messages - len(leases)
            if len(d.leases) > room:  # the rest stays, with the same batches (the reader picks)
                held.insert(0, SharedDeliveries(d.batches, d.leases[room:]))
            batches.extend(d.batches)
            leases.extend(d.leases[:room])
        self._forget(key)
        return SharedDeliveries(batches, leases)

    def _forget(self, key: Key) -> None:
        """Drop ``key``'s empty entries (the maps hold only members with something going on)."""
        if not self._held.get(key, True):
            del self._held[key]
        if not self._pending.get(key, True):
            del self._pending[key]


# -- the plans of ack, nack, extend and describe (headwater.client.core.effects) ------------


def lease_call(s: RoutedState, request: LeaseRequest) -> Plan[list[LeaseRefusal]]:
    """``request`` (an ack, nack or extend) to each lease's partition leader at once, with
    its share of the lease ids; their refusals merged (:func:`merge_lease_answers`: a
    moved or lost broker's leases refused, any other error raised)."""
    lease_ids = list(request.lease_ids)
    by_broker, leaderless = split_leases(lease_ids, (yield from addresses_of(s, request.queue)))
    if not by_broker and not leaderless:  # no table knows the queue: the broker's answer
        return cast("list[LeaseRefusal]", (yield Call(HOME, "_call", (request,))))
    asks = {a: (a, msgspec.structs.replace(request, lease_ids=ids)) for a, ids in by_broker.items()}
    answers = yield Fanout(asks)
    if any(isinstance(a, UnavailableError) for a in answers.values()):
        s._gate.mark_stale()
    return merge_lease_answers(lease_ids, by_broker, leaderless, answers)


def _lease_plan(api: m.ApiKey) -> Callable[..., Plan[list[LeaseRefusal]]]:
    request_type = m.API_SPECS[api].request

    def lease_plan(s: RoutedState, *args: Any, **kwargs: Any) -> Plan[list[LeaseRefusal]]:
        request = request_type(*args, **kwargs)  # BrokerService's parameters are the request's fields
        assert isinstance(request, LeaseRequest)
        return (yield from lease_call(s, request))

    return lease_plan


for _api in (m.ApiKey.SHARED_ACK, m.ApiKey.SHARED_NACK, m.ApiKey.SHARED_EXTEND):
    PLANS[m.API_SPECS[_api].method or ""] = _lease_plan(_api)


@plan
def shared_describe(s: RoutedState, group: str, queue: str) -> Plan[SharedGroupInfo]:
    """Each leader's partitions of the group, merged; GroupNotFoundError when no leader
    knows it."""
    leaders = yield from addresses_of(s, queue)
    if not leaders:  # the queue unknown: its error
        return cast(SharedGroupInfo, (yield Call(HOME, "shared_describe", (group, queue))))
    got = yield Fanout({a: (a, m.SharedDescribeRequest(group, queue)) for a in sorted(set(leaders.values()))})
    answers: dict[str, SharedGroupInfo] = {}
    missing: BaseException | None = None
    for address, answer in got.items():
        if isinstance(answer, GroupNotFoundError | UnavailableError):
            if isinstance(answer, UnavailableError):
                s._gate.mark_stale()
                log.warning("broker %s did not describe shared group %s (%s)", address, group, answer)
            missing = missing or answer  # not found: that leader has not served the group yet
        elif isinstance(answer, BaseException):
            raise answer
        else:
            answers[address] = answer
    if not answers:
        assert missing is not None
        raise missing
    return merge_shared_describe(answers, leaders)


def give_back(s: RoutedState, held: Mapping[Key, list[str]]) -> Plan[None]:
    """Nack the deliveries kept for receives that will not come (the client closes:
    :meth:`SharedReceives.drain`), so other members get them now rather than after their
    leases. Best effort: a broker out of reach lets them time out."""
    for (group, queue, member), ids in held.items():
        try:
            yield from lease_call(s, m.SharedNackRequest(group, queue, member, ids, "released: client closed", 0))
        except HeadwaterError as e:
            log.info("%d kept lease(s) of %s on %s not given back (%s): they time out", len(ids), member, queue, e)
