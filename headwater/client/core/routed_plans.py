"""The routed operations of a cluster's client, written once for the blocking and the
asyncio drivers (:mod:`headwater.client.core.effects` says how a plan asks for I/O).

Where each goes (docs/design/cluster.md, "Clients"):

- a partition's call (offset_for_time; produce, fetch and keyed_fetch once their first
  try, direct, failed) to the partition's leader, sent again as
  :class:`~headwater.client.core.routing.RoutedCall` says (:func:`routed`); a message
  id's (lookup_id, cancel_delayed) to its partition's leader (:func:`by_id`);
- a coordinated call (a consumer group's, a keyed group's, a subscriber's) to its
  coordinator (:func:`coordinated`);
- a queue-wide read (describe_queue, list_queues, lookup_key) to every leader of the queue,
  the answers merged; delay_stats, list_groups and list_subscribers to every broker;
- admin changes to the bootstrap broker, the table marked stale after each; alter and
  enable answered once every broker follows;
- a shared group's ack, nack, extend and describe to each lease's (partition's) leader
  (their plans are :mod:`headwater.client.core.shared_routing`'s);
- every other operation to the bootstrap broker (:func:`on_home`).

:data:`PLANS` names the plan of each routed method; :func:`install` gives a driver class a
method for each, and for every other operation of ``API_SPECS``.

>>> from headwater.model.cluster import BrokerAddress, PartitionLocation, QueueLocations
>>> md = ClusterMetadata(cluster_id="c", controller=1, queues=[QueueLocations(name="q", queue_id=1000,
...     partitions=[PartitionLocation(partition=0, leader=1, leader_epoch=0, replicas=[1])])],
...     brokers=[BrokerAddress(broker_id=1, host="h", port=1, epoch=0)])
>>> class Home:
...     address = "h:1"
>>> s = RoutedState(Home(), md, bootstrap=["h:1"])
>>> plan = PLANS["offset_for_time"](s, "q", 0, 5)
>>> next(plan)  # a fresh table: the leader's address
Call(at='h:1', method='offset_for_time', args=('q', 0, 5), kwargs={})
>>> try:
...     plan.send(42)
... except StopIteration as done:
...     done.value
42
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from typing import Any, cast

from headwater.client.core.effects import (
    PLANS,
    Call,
    Open,
    Plan,
    Refresh,
    RoutedState,
    Sleep,
    fresh_table,
    gathered,
    leaders_of,
    plan,
    to_brokers,
)
from headwater.client.core.routing import (
    BOOTSTRAP_PROBE_S,
    COORDINATED_CALLS,
    DELAYED_BIT,
    ENABLED_POLL_S,
    HOME,
    REFRESH,
    RoutedCall,
    RoutingTable,
    coordinated_by,
    merge_delay_stats,
    merge_describe,
    merge_groups,
    merge_key_lookups,
    merge_pages,
)
from headwater.client.core.shared_routing import give_back
from headwater.client.core.subscribers import merge_subscribers
from headwater.errors import HeadwaterError, InvalidArgumentError, QueueNotFoundError, UnavailableError
from headwater.model.cluster import ClusterMetadata
from headwater.model.config import QueueInfo, QueuePage
from headwater.model.delay import DelayStats
from headwater.model.groups import GroupSummary
from headwater.model.service import BrokerService
from headwater.model.subscription import SubscriberInfo
from headwater.protocol import messages as m

# the shared groups' plans are registered in PLANS by their module, imported here; the
# drivers take give_back from here
__all__ = [
    "PLANS",
    "ask_metadata",
    "by_id",
    "coordinated",
    "first_that_answers",
    "give_back",
    "install",
    "on_home",
    "refresh",
    "routed",
]


# -- the table ---------------------------------------------------------------------------


def refresh(s: RoutedState, deadline: float | None) -> Plan[RoutingTable]:
    """Ask METADATA again now (waiting out the rate limit, within ``deadline``) of any live
    broker; the driver runs it under its refresh lock. A table refreshed while this one
    waited for the lock is taken as it is."""
    if not s._gate.stale and deadline is not None:
        return s._table
    wait_s = s._gate.wait_s(s._clock())
    if deadline is not None:
        wait_s = min(wait_s, max(0.0, deadline - s._clock()))
    if wait_s > 0:
        yield Sleep(wait_s)
    asked_at = s._clock()
    s._install((yield from ask_metadata(s)), asked_at)
    return s._table


@plan
def metadata(s: RoutedState, queues: list[str] | None = None) -> Plan[ClusterMetadata]:
    """Any live broker's METADATA answer (see :func:`ask_metadata`)."""
    return (yield from ask_metadata(s, queues))


def ask_metadata(s: RoutedState, queues: list[str] | None = None) -> Plan[ClusterMetadata]:
    """METADATA from the first broker that answers: the open connections first (the live
    ones first), then the table's brokers and the bootstrap list."""
    errors: list[str] = []
    tried: set[str] = set()
    sources = s._sources()
    for address in sources + [b.address for b in s._table.brokers.values()] + s.bootstrap:
        if address in tried:
            continue
        tried.add(address)
        try:
            answer: ClusterMetadata = yield Call(address, "metadata", (queues,))
            return answer
        except UnavailableError as e:
            errors.append(f"{address}: {e}")
    raise UnavailableError(f"no broker of the cluster answered METADATA: {'; '.join(errors)}")


# -- one partition, one coordinator --------------------------------------------------------


def _again(s: RoutedState, decide: RoutedCall, error: HeadwaterError, where: str, deadline: float) -> bool:
    if decide.stales(error):
        s._gate.mark_stale()
    return decide.again(error, where, late=s._clock() >= deadline)


def routed(
    s: RoutedState,
    api: m.ApiKey,
    queue: str,
    partition: int,
    call: Call,
    wait_s: float = 0.0,
    first: tuple[str, HeadwaterError] | None = None,
) -> Plan[Any]:
    """``call`` at ``queue[partition]``'s leader, sent again (within the call's deadline:
    ``request_timeout_s`` and ``wait_s``) as :class:`RoutedCall` says. ``first``: where a
    driver's first try (by a fresh table) went and what it raised."""
    deadline = s._deadline() + wait_s
    decide = RoutedCall(m.API_SPECS[api].resend is m.Resend.SAFE)
    if first is not None and not _again(s, decide, first[1], first[0], deadline):
        raise first[1]

    def where() -> str:
        return decide.leader(s._table, s._gate.stale, queue, partition)

    # HOME: a fresh table does not know the queue either: QueueNotFoundError or
    # PartitionOutOfRangeError, in the broker's words, is the answer
    return (yield from _until_answered(s, decide, call, deadline, where, home_is_final=True))


def _until_answered(
    s: RoutedState,
    decide: RoutedCall,
    call: Call,
    deadline: float,
    where_next: Callable[[], str],
    *,
    home_is_final: bool,
) -> Plan[Any]:
    """``call`` at ``where_next()`` (an address, :data:`REFRESH` or :data:`HOME`), sent
    again after an error while ``decide`` says so."""
    while True:
        where = where_next()
        if where is REFRESH:
            s._gate.mark_stale()
            yield Refresh(deadline)
            continue
        if where is HOME and home_is_final:
            return (yield call._replace(at=HOME))
        try:
            return (yield call._replace(at=where))
        except HeadwaterError as e:
            if not _again(s, decide, e, where, deadline):
                raise


@plan
def offset_for_time(s: RoutedState, queue: str, partition: int, timestamp_ms: int) -> Plan[int]:
    call = Call(HOME, "offset_for_time", (queue, partition, timestamp_ms))
    return cast(int, (yield from routed(s, m.ApiKey.OFFSET_FOR_TIME, queue, partition, call)))


def by_id(s: RoutedState, api: m.ApiKey, queue_id: int, partition: int, call: Call) -> Plan[Any]:
    """``call`` at the leader of a message id's partition (a delayed id's too: the leader
    keeps its schedule), or at the bootstrap broker, for its MessageNotFoundError, when no
    table knows the queue (the table asked for again once when it does not)."""
    name = s._table.queue_of(queue_id)
    if name is None:
        s._gate.mark_stale()
        name = (yield Refresh(s._deadline())).queue_of(queue_id)
    if name is None:
        return (yield call._replace(at=HOME))
    return (yield from routed(s, api, name, partition & ~DELAYED_BIT, call))


@plan
def lookup_id(s: RoutedState, queue_id: int, partition: int, offset: int) -> Plan[tuple[str, bytes]]:
    """The message of an id, from its partition's leader."""
    call = Call(HOME, "lookup_id", (queue_id, partition, offset))
    return cast("tuple[str, bytes]", (yield from by_id(s, m.ApiKey.LOOKUP_ID, queue_id, partition, call)))


@plan
def cancel_delayed(s: RoutedState, queue_id: int, partition: int, offset: int) -> Plan[None]:
    """Cancel a delayed message at its partition's leader, which keeps its schedule."""
    call = Call(HOME, "cancel_delayed", (queue_id, partition, offset))
    yield from by_id(s, m.ApiKey.CANCEL_DELAYED, queue_id, partition, call)


def coordinated(s: RoutedState, api: m.ApiKey, *args: Any, **kwargs: Any) -> Plan[Any]:
    """A coordinated call (one of ``COORDINATED_CALLS``) at its coordinator, sent again
    (within the call's deadline, the table asked for again first) as :class:`RoutedCall`
    says; a table that names no coordinators (an older broker): the bootstrap broker."""
    _, locate = coordinated_by(api, args, kwargs)
    method = m.API_SPECS[api].method
    assert method is not None
    call = Call(HOME, method, args, kwargs)
    deadline = s._deadline()
    decide = RoutedCall(m.API_SPECS[api].resend is m.Resend.SAFE)

    def where() -> str:
        return decide.coordinator(s._table, s._gate.stale, locate, late=s._clock() >= deadline)

    return (yield from _until_answered(s, decide, call, deadline, where, home_is_final=False))


# -- queue-wide reads ----------------------------------------------------------------------


@plan
def describe_queue(s: RoutedState, name: str) -> Plan[QueueInfo]:
    """The queue (its config from any broker), each partition's offsets from its leader;
    a partition whose leader is out of reach (or that has none now) is not ``online``."""
    leaders = yield from leaders_of(s, name)
    answers = gathered(s, (yield to_brokers(s, sorted(leaders), m.DescribeQueueRequest(name))), strict=False)
    if not answers:  # unknown, no leader now, or none answered: one broker's answer
        info = cast(QueueInfo, (yield Call(HOME, "describe_queue", (name,))))
        if not s._table.knows(name):
            return info
        return merge_describe(info, {}, s._table.partition_leaders(name))
    return merge_describe(answers[min(answers)], answers, s._table.partition_leaders(name))


@plan
def list_queues(s: RoutedState, after: str | None = None, partitions_max: int = 0) -> Plan[QueuePage]:
    """A page of queues from the bootstrap broker, each partition's offsets from its leader."""
    page: QueuePage = yield Call(HOME, "list_queues", (after, partitions_max))
    if any(not s._table.knows(q.name) for q in page.queues):
        s._gate.mark_stale()
    table = yield from fresh_table(s)
    leaders = {q.name: table.partition_leaders(q.name) for q in page.queues}
    brokers = sorted({b for parts in leaders.values() for b in parts.values()})
    pages = yield to_brokers(s, brokers, m.ListQueuesRequest(after, partitions_max))
    return merge_pages(page, gathered(s, pages, strict=False), leaders)


@plan
def lookup_key(
    s: RoutedState, queue: str, key: bytes, start_ms: int | None, end_ms: int | None, limit: int
) -> Plan[list[bytes]]:
    """A key's batches from every leader of the queue, merged oldest first."""
    leaders = yield from leaders_of(s, queue)
    if not leaders:
        return cast("list[bytes]", (yield Call(HOME, "lookup_key", (queue, key, start_ms, end_ms, limit))))
    body = m.LookupKeyRequest(queue, key, start_ms, end_ms, limit)
    answers = gathered(s, (yield to_brokers(s, sorted(leaders), body)), strict=True)
    return merge_key_lookups(answers, s._table.partition_leaders(queue), limit)


@plan
def delay_stats(s: RoutedState) -> Plan[DelayStats]:
    """Every broker's schedule of delayed messages, added up (``merge_delay_stats``): each
    keeps those of the partitions it leads. A broker out of reach is left out."""
    s._gate.mark_stale()  # a broker that joined since the last table has a schedule too
    brokers = sorted((yield Refresh(s._deadline())).brokers)
    answers = {}
    if len(brokers) > 1:
        answers = gathered(s, (yield to_brokers(s, brokers, m.DelayStatsRequest())), strict=False)
    if not answers:
        return cast(DelayStats, (yield Call(HOME, "delay_stats")))
    return merge_delay_stats(answers)


@plan
def list_groups(s: RoutedState) -> Plan[list[GroupSummary]]:
    """Every broker's groups, each once (a consumer group as its coordinator lists it)."""
    table = yield from fresh_table(s)
    answers = gathered(s, (yield to_brokers(s, sorted(table.brokers), m.ListGroupsRequest())), strict=False)
    if not answers:
        return cast("list[GroupSummary]", (yield Call(HOME, "list_groups")))
    return merge_groups(answers, table.metadata.coordinator, table.metadata.keyed_coordinator)


@plan
def list_subscribers(s: RoutedState, queue: str | None = None) -> Plan[list[SubscriberInfo]]:
    """Every broker's subscribers (of ``queue``, or of every queue), each once."""
    table = yield from fresh_table(s)
    answers = gathered(s, (yield to_brokers(s, sorted(table.brokers), m.ListSubscribersRequest(queue))), strict=False)
    if not answers:
        return cast("list[SubscriberInfo]", (yield Call(HOME, "list_subscribers", (queue,))))
    return merge_subscribers(answers, table.metadata.subscriber_coordinator)


@plan
def stream_table(s: RoutedState, queue: str, fresh: bool = False) -> Plan[RoutingTable]:
    """The table a subscriber plans its push streams by: asked for again first when
    ``fresh`` (a stream was refused or lost), stale, or when it does not know ``queue``."""
    if fresh or s._gate.stale or not s._table.knows(queue):
        s._gate.mark_stale()
        table: RoutingTable = yield Refresh(s._deadline())
        return table
    return s._table


# -- admin: the bootstrap broker, the table stale after each change --------------------------


def _changed(s: RoutedState, method: str, *args: Any, **kwargs: Any) -> Plan[Any]:
    try:
        return (yield Call(HOME, method, args, kwargs))
    finally:
        s._gate.mark_stale()


def _change_plan(method: str) -> Callable[..., Plan[Any]]:
    def change(s: RoutedState, *args: Any, **kwargs: Any) -> Plan[Any]:
        return (yield from _changed(s, method, *args, **kwargs))

    return change


PLANS["delete_queue"] = _change_plan("delete_queue")


@plan
def create_queue(s: RoutedState, name: str, *args: Any, **kwargs: Any) -> Plan[QueueInfo]:
    """Through the controller; answered once every broker that answers has the queue, so
    that a send or a read right after it finds the queue at its leader (the broker asked
    waits only for its own copy)."""
    info: QueueInfo = yield from _changed(s, "create_queue", name, *args, **kwargs)
    return (yield from _followed(s, name, info, lambda q: q.queue_id == info.queue_id))


@plan
def add_partitions(s: RoutedState, name: str, partitions: int) -> Plan[QueueInfo]:
    """Through the controller; answered once every broker that answers has the partitions."""
    info: QueueInfo = yield from _changed(s, "add_partitions", name, partitions)
    return (yield from _followed(s, name, info, lambda q: len(q.partitions) >= len(info.partitions)))


@plan
def truncate_queue(s: RoutedState, name: str) -> Plan[QueueInfo]:
    """Every broker drops its copies of the queue's messages; a broker out of reach
    raises (truncate again once it is back: it is safe to repeat)."""
    if not (yield from leaders_of(s, name)):
        return cast(QueueInfo, (yield Call(HOME, "truncate_queue", (name,))))  # unknown, in the broker's words
    asked = to_brokers(s, sorted(s._table.brokers), m.TruncateQueueRequest(name))
    answers = gathered(s, (yield asked), strict=True)
    return merge_describe(answers[min(answers)], answers, s._table.partition_leaders(name))


def _followed(s: RoutedState, name: str, info: QueueInfo, follows: Callable[[QueueInfo], bool]) -> Plan[QueueInfo]:
    """``info`` once every broker that answers describes ``name`` as ``follows`` says
    (each follows the cluster's record of the queue within moments; one that has no queue
    of that name yet does not)."""
    deadline = s._deadline()
    while True:
        got = yield to_brokers(s, sorted(s._table.brokers), m.DescribeQueueRequest(name))
        has = {b: a for b, a in got.items() if not isinstance(a, QueueNotFoundError)}
        if len(has) == len(got) and all(follows(q) for q in gathered(s, has, strict=False).values()):
            return info
        if s._clock() >= deadline:
            raise UnavailableError(f"the queue {name!r} was changed, but not every broker follows it yet")
        yield Sleep(ENABLED_POLL_S)


@plan
def alter_queue(s: RoutedState, name: str, changes: dict[str, Any]) -> Plan[QueueInfo]:
    """Through the controller; answered once every broker that answers has it."""
    info: QueueInfo = yield from _changed(s, "alter_queue", name, changes)
    return (yield from _followed(s, name, info, lambda q: q.config == info.config))


@plan
def set_queue_enabled(s: RoutedState, name: str, enabled: bool) -> Plan[QueueInfo]:
    """Through the controller; answered once every broker that answers has it."""
    info: QueueInfo = yield from _changed(s, "set_queue_enabled", name, enabled)
    return (yield from _followed(s, name, info, lambda q: q.enabled == bool(enabled)))


# -- connecting ------------------------------------------------------------------------------


def first_that_answers(
    bootstrap: list[str], connect_timeout_s: float, clock: Callable[[], float] = time.monotonic
) -> Plan[Any]:
    """The service (and METADATA) of the first of ``bootstrap`` that answers, trying each
    in turn (a refused connection, or a broker still joining its cluster, moves on at once)
    until ``connect_timeout_s`` has passed;
    then one :class:`UnavailableError` naming every address tried. One address gets the
    whole ``connect_timeout_s`` (as before lists)."""
    if len(bootstrap) == 1:
        return (yield Open(bootstrap[0], connect_timeout_s, None))
    deadline = clock() + connect_timeout_s
    errors: dict[str, str] = {}
    while True:
        for address in bootstrap:
            left_s = deadline - clock()
            try:
                return (yield Open(address, max(0.1, left_s), max(0.05, min(left_s, BOOTSTRAP_PROBE_S))))
            except (OSError, ValueError, InvalidArgumentError, UnavailableError) as e:
                errors[address] = str(e) or type(e).__name__
        if clock() >= deadline:
            tried = "; ".join(f"{a}: {why}" for a, why in errors.items())
            raise UnavailableError(
                f"cannot reach any broker of {','.join(bootstrap)} within {connect_timeout_s} s ({tried}); "
                f"are they running, and are the addresses right?"
            )
        yield Sleep(min(0.1, max(0.0, deadline - clock())))


# -- every other operation: the bootstrap broker ----------------------------------------------


def on_home(method: str) -> Callable[..., Plan[Any]]:
    """The plan of an operation that stays on the bootstrap broker (docs/cluster.md,
    "Clients"): sent as its service sends it."""

    def plan(s: RoutedState, *args: Any, **kwargs: Any) -> Plan[Any]:
        return (yield Call(HOME, method, args, kwargs))

    return plan


def _coordinated_plan(api: m.ApiKey) -> Callable[..., Plan[Any]]:
    def plan(s: RoutedState, *args: Any, **kwargs: Any) -> Plan[Any]:
        return (yield from coordinated(s, api, *args, **kwargs))

    return plan


for _api in COORDINATED_CALLS:
    PLANS[m.API_SPECS[_api].method or ""] = _coordinated_plan(_api)


def install(cls: type, drive: Callable[[Callable[..., Plan[Any]]], Callable[..., Any]]) -> None:
    """Give a driver class a method for each of :data:`PLANS`, and for every other operation
    of ``API_SPECS`` (:func:`on_home`), that it does not define itself: ``drive(plan)``
    makes the method (a blocking one, or a coroutine function), named and documented as
    the operation."""
    names = [spec.method for spec in m.API_SPECS.values() if spec.method is not None]
    for name in dict.fromkeys([*PLANS, *names]):
        if name in cls.__dict__:
            continue
        plan = PLANS.get(name) or on_home(name)
        method = drive(plan)
        method.__name__ = name
        method.__qualname__ = f"{cls.__name__}.{name}"
        proto = getattr(BrokerService, name, None)
        method.__doc__ = plan.__doc__ if proto is None or plan.__doc__ else proto.__doc__
        # help() and inspect show the operation's parameters, not (*args, **kwargs)
        shown = inspect.signature(plan if proto is None else proto)
        if proto is None:  # the plan's: its first parameter is the state, the method's is self
            first, *rest = shown.parameters.values()
            shown = shown.replace(
                parameters=[first.replace(name="self", annotation=inspect.Parameter.empty), *rest],
                return_annotation=inspect.Signature.empty,
            )
        method.__signature__ = shown  # type: ignore[attr-defined]  # read by inspect
        setattr(cls, name, method)
