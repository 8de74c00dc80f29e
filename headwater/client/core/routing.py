"""Where a client of a cluster sends each request, without I/O (docs/design/cluster.md,
"Clients"): the routing table made from a METADATA answer, when a refresh of it is due,
and how the answers of several leaders make one.

A partition's requests (produce, fetch, offset_for_time, lookup_id, keyed_fetch) go to its leader; a
queue-wide read goes to every broker that leads a partition of the queue, and their answers
are merged (:func:`merge_describe`, :func:`merge_pages`, :func:`merge_key_lookups`). A
consumer group's calls go to its coordinator (:meth:`RoutingTable.coordinator`), and so do a
keyed group's keyed_group, keyed_commit and keyed_resize
(:meth:`RoutingTable.keyed_coordinator`); where a call goes and whether it goes again is
:class:`RoutedCall`'s to say. LIST_GROUPS goes to every broker (:func:`merge_groups`). The
drivers (``headwater.client.transport.routing`` and ``headwater.client.aio.routing``) own
the connections and the waiting. Times are the caller's monotonic seconds.

>>> from headwater.model.cluster import BrokerAddress, PartitionLocation, QueueLocations
>>> md = ClusterMetadata(cluster_id="c1", controller=1, queues=[
...     QueueLocations(name="orders", queue_id=1000, partitions=[
...         PartitionLocation(partition=p, leader=1 + p % 2, leader_epoch=0, replicas=[1 + p % 2])
...         for p in range(3)])],
...     brokers=[BrokerAddress(broker_id=i, host="127.0.0.1", port=7070 + i, epoch=0) for i in (1, 2)])
>>> table = RoutingTable(md)
>>> table.leader("orders", 1).address, table.queue_of(1000)
('127.0.0.1:7072', 'orders')
>>> table.leaders_of("orders")
{1: [0, 2], 2: [1]}
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from headwater.errors import (
    InvalidArgumentError,
    NotCoordinatorError,
    NotLeaderError,
    OutcomeUnknownError,
    PartitionOutOfRangeError,
    QueueNotFoundError,
    UnavailableError,
)
from headwater.model.batch import decode_header
from headwater.model.cluster import ALONE, BrokerAddress, ClusterMetadata
from headwater.model.config import PartitionInfo, QueueInfo, QueuePage
from headwater.model.delay import DelayBucketStats, DelayStats
from headwater.model.groups import GroupSummary
from headwater.protocol.messages import ApiKey

__all__ = [
    "BOOTSTRAP_PROBE_S",
    "HOME",
    "REFRESH",
    "RoutedCall",
    "DELAYED_BIT",
    "ENABLED_POLL_S",
    "COORDINATED_CALLS",
    "REFRESH_INTERVAL_S",
    "RefreshGate",
    "RoutingTable",
    "coordinated_by",
    "merge_delay_stats",
    "merge_describe",
    "merge_groups",
    "merge_key_lookups",
    "merge_pages",
    "parse_bootstrap",
]

#: The shortest time between two METADATA requests of one client: a burst of refusals
#: (every in-flight batch of a moved partition) costs one refresh, not one each.
REFRESH_INTERVAL_S = 0.1

#: How long a bootstrap address of a list may take to accept a connection before the next
#: is tried (a refused one moves on at once).
BOOTSTRAP_PROBE_S = 1.0

#: How often a client asks the brokers whether each follows a queue it disabled or enabled
#: (the controller changed it; every broker applies it from ZooKeeper within moments).
ENABLED_POLL_S = 0.01

#: A delayed id's partition has this bit set (docs/protocol.md, 7.4): delayed messages stay
#: on the bootstrap broker for now.
DELAYED_BIT = 1 << 31


def parse_bootstrap(addresses: str | Iterable[str]) -> list[str]:
    """The bootstrap list: ``"h1:p1,h2:p2"`` (or a list of addresses), in order, blanks and
    repeats dropped.

    >>> parse_bootstrap(" a:1, b:2,a:1 ,")
    ['a:1', 'b:2']
    """
    parts = addresses.split(",") if isinstance(addresses, str) else list(addresses)
    out: list[str] = []
    for part in parts:
        if not isinstance(part, str):
            raise InvalidArgumentError(f"a broker address is a str 'host:port', got {type(part).__name__}")
        part = part.strip()
        if part and part not in out:
            out.append(part)
    if not out:
        raise InvalidArgumentError(
            f"no broker address in {addresses!r}; give 'host:port', or several: 'host1:port1,host2:port2'"
        )
    return out


class RoutingTable:
    """One METADATA answer, indexed: each partition's leader, each queue id's name."""

    __slots__ = (
        "brokers",
        "cluster_id",
        "metadata",
        "_addresses",
        "_by_leader",
        "_leaders",
        "_leaderless",
        "_names",
        "_of_partition",
    )

    def __init__(self, metadata: ClusterMetadata) -> None:
        self.metadata = metadata
        self.cluster_id = metadata.cluster_id
        self.brokers: dict[int, BrokerAddress] = {b.broker_id: b for b in metadata.brokers}
        self._leaders: dict[str, list[int]] = {}
        self._names: dict[int, str] = {}
        # leaderless(), leaders_of() and partition_leaders() per queue, worked out once: the
        # table never changes, and a shared receive or a describe asks each time (O(partitions))
        self._leaderless: dict[str, bool] = {}
        self._by_leader: dict[str, dict[int, list[int]]] = {}
        self._of_partition: dict[str, dict[int, int]] = {}
        self._addresses: dict[str, dict[int, str]] = {}
        for q in metadata.queues:
            leaders = [ALONE] * len(q.partitions)
            for p in q.partitions:
                if 0 <= p.partition < len(leaders):
                    leaders[p.partition] = p.leader
            self._leaders[q.name] = leaders
            self._names[q.queue_id] = q.name

    def knows(self, queue: str, partition: int | None = None) -> bool:
        """Whether the table has ``queue`` (and its ``partition``): a refusal for one it does
        not know may mean only that the table is older than the queue."""
        leaders = self._leaders.get(queue)
        return leaders is not None and (partition is None or 0 <= partition < len(leaders))

    def partition_count(self, queue: str) -> int | None:
        """How many partitions ``queue`` has in the table (None: it does not know the queue)."""
        leaders = self._leaders.get(queue)
        return None if leaders is None else len(leaders)

    def leaderless(self, queue: str) -> bool:
        """Whether some partition of ``queue`` has no live leader in the table: its broker
        is down, or the table is older than its return (ask again, rate limited, until it
        has one).

        >>> from headwater.model.cluster import PartitionLocation, QueueLocations
        >>> q = QueueLocations(name="q", queue_id=1, partitions=[
        ...     PartitionLocation(partition=0, leader=1, leader_epoch=0, replicas=[1])])
        >>> RoutingTable(ClusterMetadata(cluster_id="c", controller=1, queues=[q], brokers=[])).leaderless("q")
        True
        """
        found = self._leaderless.get(queue)
        if found is None:
            brokers = self.brokers
            found = self._leaderless[queue] = any(b not in brokers for b in self._leaders.get(queue, ()))
        return found

    def queue_of(self, queue_id: int) -> str | None:
        """The name of the queue of ``queue_id`` (a message id names its queue by id)."""
        return self._names.get(queue_id)

    def leader(self, queue: str, partition: int) -> BrokerAddress:
        """The broker that leads ``queue[partition]``. :class:`NotLeaderError` (retriable)
        when the table does not know it or it has no live leader now: refresh and ask again.

        >>> md = ClusterMetadata(cluster_id="c", controller=-1, brokers=[], queues=[])
        >>> RoutingTable(md).leader("q", 0)
        Traceback (most recent call last):
        ...
        headwater.errors.NotLeaderError: the cluster's metadata names no leader of q[0] now ...
        """
        leaders = self._leaders.get(queue)
        found = None
        if leaders is not None and 0 <= partition < len(leaders):
            found = self.brokers.get(leaders[partition])
        if found is None:
            raise NotLeaderError(
                f"the cluster's metadata names no leader of {queue}[{partition}] now (its broker is out of "
                f"reach, or it is moving); it is served again once a broker leads it"
            )
        return found

    def coordinator(self, group: str) -> BrokerAddress | None:
        """The broker that coordinates consumer group ``group``; None when the answer names
        no coordinators (a broker from before them: any broker serves every group, so send
        to the bootstrap broker). :class:`NotCoordinatorError` (retriable) when it names none
        live now: refresh and ask again.

        >>> md = ClusterMetadata(cluster_id="c", controller=1, queues=[], coordinators=[2, 1],
        ...     brokers=[BrokerAddress(broker_id=2, host="h", port=2, epoch=0)])
        >>> RoutingTable(md).coordinator("billing").address  # crc32("billing") % 2 == 0: broker 2
        'h:2'
        """
        return self._live(self.metadata.coordinator(group), f"group {group!r}")

    def keyed_coordinator(self, queue: str, group: str) -> BrokerAddress | None:
        """The broker that coordinates keyed group ``group`` of ``queue``; None when the
        answer names no keyed coordinators (an older broker, or no keyed call has made the
        cluster's keyed coordinator queue yet: send to the bootstrap broker, which makes it
        and refuses with NotCoordinatorError if another broker coordinates the group).

        >>> md = ClusterMetadata(cluster_id="c", controller=1, queues=[], keyed_coordinators=[2, 1],
        ...     brokers=[BrokerAddress(broker_id=i, host="h", port=i, epoch=0) for i in (1, 2)])
        >>> RoutingTable(md).keyed_coordinator("orders", "billing").address  # crc32("orders/billing") % 2 == 1
        'h:1'
        """
        return self._live(self.metadata.keyed_coordinator(queue, group), f"keyed group {group!r} of {queue!r}")

    def subscriber_coordinator(self, queue: str, name: str) -> BrokerAddress | None:
        """The broker that coordinates subscriber ``name`` of ``queue``; None as
        :meth:`keyed_coordinator` (the first subscriber call makes the queue)."""
        return self._live(self.metadata.subscriber_coordinator(queue, name), f"subscriber {name!r} of {queue!r}")

    def _live(self, broker_id: int | None, what: str) -> BrokerAddress | None:
        if broker_id is None:
            return None
        found = self.brokers.get(broker_id)
        if found is None:
            raise NotCoordinatorError(
                f"the cluster's metadata names no live coordinator of {what} now (its broker is out "
                f"of reach, or its partition is moving); it is served again once a broker leads it"
            )
        return found

    def leaders_of(self, queue: str) -> dict[int, list[int]]:
        """``{broker id: [partitions of queue it leads]}``, the partitions with no leader
        left out (an unknown queue: ``{}``). The table's own: read it, do not change it."""
        out = self._by_leader.get(queue)
        if out is None:
            out = {}
            for partition, leader in enumerate(self._leaders.get(queue, ())):
                if leader in self.brokers:
                    out.setdefault(leader, []).append(partition)
            self._by_leader[queue] = out
        return out

    def partition_addresses(self, queue: str) -> dict[int, str]:
        """``{partition: its leader's address}`` of ``queue`` (partitions with no leader left
        out). The table's own: read it, do not change it."""
        out = self._addresses.get(queue)
        if out is None:
            brokers = self.brokers
            out = self._addresses[queue] = {p: brokers[b].address for p, b in self.partition_leaders(queue).items()}
        return out

    def partition_leaders(self, queue: str) -> dict[int, int]:
        """``{partition: leader's broker id}`` of ``queue`` (partitions with no leader left
        out). The table's own: read it, do not change it."""
        out = self._of_partition.get(queue)
        if out is None:
            out = self._of_partition[queue] = {p: b for b, parts in self.leaders_of(queue).items() for p in parts}
        return out


class RefreshGate:
    """When the routing table is to be asked for again: after a refusal or a failure marks
    it stale, at most once every ``interval_s`` (so a burst of refusals costs one METADATA).

    >>> gate = RefreshGate(interval_s=0.1)
    >>> gate.refreshed(now_s=10.0); gate.due(10.05)
    False
    >>> gate.mark_stale(); gate.due(10.05), gate.wait_s(10.05), gate.due(10.1)
    (False, 0.05, True)
    >>> gate.refreshed(now_s=10.1); gate.due(10.5)
    False
    """

    __slots__ = ("interval_s", "last_s", "stale")

    def __init__(self, interval_s: float = REFRESH_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self.last_s: float | None = None  # when the table in use was asked for
        self.stale = False

    def mark_stale(self) -> None:
        """A leader refused, a queue was unknown, a broker was out of reach, or an admin
        change was made: the next request asks for the metadata again (when allowed)."""
        self.stale = True

    def wait_s(self, now_s: float) -> float:
        """How long until a refresh is allowed (0: now)."""
        if self.last_s is None:
            return 0.0
        return max(0.0, round(self.last_s + self.interval_s - now_s, 9))

    def due(self, now_s: float) -> bool:
        """Whether to refresh now: stale, and the last refresh is ``interval_s`` old."""
        return self.stale and self.wait_s(now_s) <= 0

    def refreshed(self, now_s: float) -> None:
        """A METADATA request was sent at ``now_s`` and its answer is the table now."""
        self.last_s = now_s
        self.stale = False


#: The calls that go to a coordinator, by how they name what it coordinates: a consumer
#: group by its name (the first argument); a keyed group and a subscriber by their queue and
#: name (the first two).
COORDINATED_CALLS: dict[ApiKey, str] = {
    ApiKey.JOIN_GROUP: "group",
    ApiKey.HEARTBEAT_GROUP: "group",
    ApiKey.LEAVE_GROUP: "group",
    ApiKey.DESCRIBE_GROUP: "group",
    ApiKey.COMMIT_OFFSETS: "group",
    ApiKey.FETCH_OFFSETS: "group",
    ApiKey.DELETE_GROUP: "group",
    ApiKey.KEYED_GROUP: "keyed",
    ApiKey.KEYED_COMMIT: "keyed",
    ApiKey.KEYED_RESIZE: "keyed",
    ApiKey.ADD_SUBSCRIBER: "subscriber",
    ApiKey.DELETE_SUBSCRIBER: "subscriber",
    ApiKey.DESCRIBE_SUBSCRIBER: "subscriber",
    ApiKey.CHECKPOINT_SUBSCRIBER: "subscriber",
    ApiKey.CLAIM_SUBSCRIBER: "subscriber",
}


def coordinated_by(
    api: ApiKey, args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> tuple[str, Callable[[RoutingTable], BrokerAddress | None]]:
    """What a call of ``api`` (one of :data:`COORDINATED_CALLS`) with these arguments is
    about (a name for messages) and how to find its coordinator in a routing table.

    >>> name, locate = coordinated_by(ApiKey.KEYED_COMMIT, ("orders", "by-customer", 0, 1, {}), {})
    >>> name
    'orders/by-customer'
    """
    kind = COORDINATED_CALLS[api]
    if kind == "group":
        group = args[0] if args else kwargs["group"]
        return group, lambda table: table.coordinator(group)
    queue = args[0] if args else kwargs["queue"]
    name = args[1] if len(args) > 1 else kwargs["group" if kind == "keyed" else "name"]
    if kind == "keyed":
        return f"{queue}/{name}", lambda table: table.keyed_coordinator(queue, name)
    return f"{queue}/{name}", lambda table: table.subscriber_coordinator(queue, name)


#: What :meth:`RoutedCall.leader` and :meth:`RoutedCall.coordinator` answer when the call is
#: not to go to an address of the table: ask for the table first (then ask again), or send it
#: to the bootstrap broker (an unknown queue, in the broker's own words; a cluster whose
#: METADATA names no coordinators, an older broker's).
REFRESH = "refresh"
HOME = "home"


class RoutedCall:
    """One call's way to the broker that owns it, without I/O: where to send it next, and
    whether it goes again after an error. Both routed services drive it: ask where (an
    address, :data:`REFRESH` or :data:`HOME`), refresh or send, and on an error ask
    :meth:`again`. The rules:

    - a refusal (:class:`NotLeaderError`, :class:`NotCoordinatorError`: never applied) goes
      again, after a refresh, while the call's deadline allows;
    - an unknown queue or partition goes again once, after a refresh (the table may be older
      than the queue); then the broker's own error stands;
    - a broker out of reach: again once per address, and only for an operation that may be
      sent twice (``resend_safe``), since the next table may name another broker; an
      :class:`OutcomeUnknownError` never.

    >>> call = RoutedCall(resend_safe=True)
    >>> call.again(NotCoordinatorError("moved"), "a:1", late=False)
    True
    >>> call.again(UnavailableError("down"), "a:1", late=False), call.again(UnavailableError("down"), "a:1", late=False)
    (True, False)
    >>> RoutedCall(resend_safe=False).again(UnavailableError("down"), "a:1", late=False)
    False
    """

    __slots__ = ("refreshed", "resend_safe", "unreachable")

    def __init__(self, resend_safe: bool) -> None:
        self.resend_safe = resend_safe
        self.refreshed = False  # the table was (or is about to be) asked for again
        self.unreachable: str | None = None  # the broker found out of reach

    def leader(self, table: RoutingTable, stale: bool, queue: str, partition: int) -> str:
        """Where ``queue[partition]``'s call goes: its leader's address, :data:`REFRESH`, or
        :data:`HOME` (a table asked for anew that still does not know it). A partition
        with no leader in a fresh table raises :class:`NotLeaderError`."""
        if stale or not table.knows(queue, partition):
            if self.refreshed and not stale:
                return HOME
            self.refreshed = True
            return REFRESH
        try:
            return table.leader(queue, partition).address
        except NotLeaderError:
            if self.refreshed:
                raise  # no leader now, says a fresh table: nobody to send to
            self.refreshed = True
            return REFRESH

    def coordinator(
        self, table: RoutingTable, stale: bool, locate: Callable[[RoutingTable], BrokerAddress | None], *, late: bool
    ) -> str:
        """Where a coordinated call goes (``locate`` finds its coordinator in a table: see
        :func:`coordinated_by`): the coordinator's address, :data:`REFRESH` (also while no
        live broker coordinates it, until ``late``), or :data:`HOME` (the table names no
        coordinators: an older broker)."""
        if stale:
            self.refreshed = True
            return REFRESH
        try:
            where = locate(table)
        except NotCoordinatorError:
            if late:
                raise
            self.refreshed = True
            return REFRESH
        return HOME if where is None else where.address

    def again(self, error: BaseException, address: str, *, late: bool) -> bool:
        """Send again after ``error`` from ``address`` (:data:`HOME`: the bootstrap broker);
        ``late``: the call's deadline has passed. Any other error is the answer."""
        if late or isinstance(error, OutcomeUnknownError):
            return False
        if isinstance(error, NotLeaderError | NotCoordinatorError):
            return True
        if isinstance(error, QueueNotFoundError | PartitionOutOfRangeError):
            if self.refreshed:
                return False
            self.refreshed = True
            return True
        if not isinstance(error, UnavailableError) or not self.resend_safe or address == self.unreachable:
            return False  # not to be sent twice, or still owned by the broker out of reach
        self.unreachable = address
        return True

    @staticmethod
    def stales(error: BaseException) -> bool:
        """Whether ``error`` makes the routing table stale: a refusal, an unknown queue or
        partition, or a broker out of reach (not an answer whose outcome is unknown)."""
        return isinstance(error, UnavailableError | QueueNotFoundError | PartitionOutOfRangeError) and not isinstance(
            error, OutcomeUnknownError
        )


def merge_groups(
    answers: Mapping[int, list[GroupSummary]],
    coordinator_of: Callable[[str], int | None],
    keyed_coordinator_of: Callable[[str, str], int | None] | None = None,
) -> list[GroupSummary]:
    """Every broker's LIST_GROUPS answer (``answers``: broker id -> its summaries) as one:
    each group once, by name and then mode. A consumer group (not keyed, not shared) is
    taken from its coordinator's answer (``coordinator_of(name)``: its broker id, None if
    unknown) when it has one, since a broker that just gave it up may still list it; a
    keyed group likewise from its coordinator's (``keyed_coordinator_of(queue, name)``);
    a shared group (each leader serves its own partitions) from the broker whose members
    are the most (the members of the others are at most as many, maybe the same ones); any
    other tie, or a group whose coordinator did not answer, from the lowest broker id that
    lists it.

    >>> k = GroupSummary(group="g", mode="keyed", queues=["q"], members=2, state="active")
    >>> old = GroupSummary(group="g", mode="keyed", queues=["q"], members=1, state="active")
    >>> [s.members for s in merge_groups({1: [old], 2: [k]}, lambda g: None, lambda q, g: 2)]
    [2]
    >>> idle = GroupSummary(group="w", mode="shared", queues=["q"], members=0, state="empty")
    >>> busy = GroupSummary(group="w", mode="shared", queues=["q"], members=1, state="stable")
    >>> [s.state for s in merge_groups({1: [idle], 2: [busy]}, lambda g: None)]
    ['stable']
    """
    chosen: dict[tuple[str, str | None, tuple[str, ...]], tuple[bool, int, int, GroupSummary]] = {}
    for broker_id, summaries in sorted(answers.items()):
        for g in summaries:
            coordinated = g.mode not in ("keyed", "shared")
            key = (g.group, None, ()) if coordinated else (g.group, g.mode, tuple(g.queues))
            if coordinated:
                ours = coordinator_of(g.group) == broker_id
            else:
                ours = (
                    g.mode == "keyed"
                    and keyed_coordinator_of is not None
                    and len(g.queues) == 1
                    and keyed_coordinator_of(g.queues[0], g.group) == broker_id
                )
            rank = (ours, g.members if g.mode == "shared" else 0, -broker_id)
            held = chosen.get(key)
            if held is None or rank > held[:3]:
                chosen[key] = (*rank, g)
    return [g for _, (*_, g) in sorted(chosen.items(), key=lambda kv: (kv[0][0], kv[0][1] or "", kv[0][2]))]


def merge_describe(base: QueueInfo, answers: Mapping[int, QueueInfo], leaders: Mapping[int, int]) -> QueueInfo:
    """A queue as one broker would describe it if it led every partition: ``base`` (any
    broker's answer: the config) with each partition's offsets from its leader's answer
    (``answers``: broker id -> its QueueInfo; ``leaders``: partition -> broker id). A
    partition whose leader did not answer (or that has none) is not online: its offsets are
    unknown (``base``'s are kept, marked so).

    >>> def info(*ends):
    ...     return QueueInfo(name="q", queue_id=1000, config=None, enabled=True, created_ms=0,
    ...                      partitions=[PartitionInfo(p, 0, e) for p, e in enumerate(ends)])
    >>> merged = merge_describe(info(0, 0, 0), {1: info(5, 0, 0), 2: info(0, 7, 0)}, {0: 1, 1: 2, 2: 3})
    >>> [(p.partition, p.end_offset, p.online) for p in merged.partitions]
    [(0, 5, True), (1, 7, True), (2, 0, False)]
    """
    partitions: list[PartitionInfo] = []
    for p in base.partitions:
        answer = answers.get(leaders.get(p.partition, ALONE))
        if answer is not None and p.partition < len(answer.partitions):
            partitions.append(answer.partitions[p.partition])
        else:
            partitions.append(PartitionInfo(p.partition, p.start_offset, p.end_offset, online=False))
    return QueueInfo(
        name=base.name,
        queue_id=base.queue_id,
        config=base.config,
        enabled=base.enabled,
        created_ms=base.created_ms,
        partitions=partitions,
    )


def merge_pages(base: QueuePage, pages: Mapping[int, QueuePage], leaders: Mapping[str, Mapping[int, int]]) -> QueuePage:
    """A page of queues (``base``, any broker's) with each partition's offsets from its
    leader's page of the same listing (``pages``: broker id -> its page; ``leaders``:
    queue -> partition -> broker id)."""
    by_broker = {b: {q.name: q for q in page.queues} for b, page in pages.items()}
    queues = []
    for q in base.queues:
        answers = {b: found for b, named in by_broker.items() if (found := named.get(q.name)) is not None}
        queues.append(merge_describe(q, answers, leaders.get(q.name, {})))
    return QueuePage(queues=queues, next_after=base.next_after)


def merge_key_lookups(answers: Mapping[int, list[bytes]], leaders: Mapping[int, int], limit: int) -> list[bytes]:
    """Several leaders' LOOKUP_KEY answers (``answers``: broker id -> its batches) as one
    broker gives them: oldest first (by each batch's timestamp; a broker's own order kept),
    at most ``limit``. A batch of a partition the answering broker does not lead
    (``leaders``: partition -> broker id) is left out: its leader has the partition's own."""

    def timed(broker_id: int, batches: list[bytes]) -> list[tuple[int, int, bytes]]:
        out = []
        for i, b in enumerate(batches):
            header = decode_header(b)
            if leaders.get(header.partition) == broker_id:
                out.append((header.timestamp_ms, i, b))
        return out

    merged = heapq.merge(*(timed(b, a) for b, a in sorted(answers.items())), key=lambda t: t[:2])
    return [b for _, _, b in merged][: max(0, limit)]


def merge_delay_stats(answers: Mapping[int, DelayStats]) -> DelayStats:
    """Every broker's DELAY_STATS (``answers``: broker id -> its stats) as the cluster's: each
    broker schedules the delayed messages of the partitions it leads, so counts and rates
    add up, the next due time is the earliest, buckets of one span add their pending
    messages (loaded if loaded anywhere). Lateness percentiles cannot be merged without the
    samples: the worst broker's are given (an upper bound), as is the worst maximum.

    >>> from headwater.model.delay import DelayBucketStats as B
    >>> def stats(pending, due, p99, buckets):
    ...     return DelayStats(now_ms=10, pending_messages=pending, pending_batches=pending, next_due_ms=due,
    ...         accepted_total=pending, delivered_total=1, cancelled_total=0, dropped_total=0,
    ...         delivered_per_s=0.5, lateness_p50_ms=p99, lateness_p99_ms=p99, lateness_max_ms=None,
    ...         loaded_batches=0, bucket_ms=60_000, buckets=buckets)
    >>> s = merge_delay_stats({1: stats(2, 500, 3.0, [B(0, 60_000, 2, True)]),
    ...                        2: stats(5, None, None, [B(0, 60_000, 4, False), B(60_000, 120_000, 1, False)])})
    >>> s.pending_messages, s.next_due_ms, s.delivered_total, s.delivered_per_s, s.lateness_p99_ms
    (7, 500, 2, 1.0, 3.0)
    >>> s.buckets
    [DelayBucketStats(start_ms=0, end_ms=60000, pending_messages=6, loaded=True), \
DelayBucketStats(start_ms=60000, end_ms=120000, pending_messages=1, loaded=False)]
    """
    got = [answers[b] for b in sorted(answers)]
    if len(got) == 1:
        return got[0]
    if not got:
        raise InvalidArgumentError("no broker answered DELAY_STATS: there is nothing to add up")

    def worst(values: Iterable[float | None]) -> float | None:
        present = [v for v in values if v is not None]
        return max(present) if present else None

    buckets: dict[tuple[int, int], tuple[int, bool]] = {}
    for s in got:
        for b in s.buckets:
            pending, loaded = buckets.get((b.start_ms, b.end_ms), (0, False))
            buckets[(b.start_ms, b.end_ms)] = (pending + b.pending_messages, loaded or b.loaded)
    dues = [s.next_due_ms for s in got if s.next_due_ms is not None]
    worst_max = worst(s.lateness_max_ms for s in got)
    return DelayStats(
        now_ms=max(s.now_ms for s in got),
        pending_messages=sum(s.pending_messages for s in got),
        pending_batches=sum(s.pending_batches for s in got),
        next_due_ms=min(dues) if dues else None,
        accepted_total=sum(s.accepted_total for s in got),
        delivered_total=sum(s.delivered_total for s in got),
        cancelled_total=sum(s.cancelled_total for s in got),
        dropped_total=sum(s.dropped_total for s in got),
        delivered_per_s=sum(s.delivered_per_s for s in got),
        lateness_p50_ms=worst(s.lateness_p50_ms for s in got),
        lateness_p99_ms=worst(s.lateness_p99_ms for s in got),
        lateness_max_ms=None if worst_max is None else int(worst_max),
        loaded_batches=sum(s.loaded_batches for s in got),
        bucket_ms=max(s.bucket_ms for s in got),
        buckets=[DelayBucketStats(k[0], k[1], v[0], v[1]) for k, v in sorted(buckets.items())],
    )
