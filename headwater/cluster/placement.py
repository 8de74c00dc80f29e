"""Where partitions go: placing a queue's new partitions and planning the moves that balance
the brokers, as pure functions the controller calls (``docs/design/cluster.md``).

Placement is Kafka's rack-unaware assignment weighted by load: each new partition takes the
``replication_factor`` live brokers that hold the fewest partitions (fewest bytes next, then
a start point that turns with the partition number, so ties go round the brokers), and leads
on the one of them that leads the fewest. A new, empty broker therefore takes the new
partitions until it has caught up with the others. Placing into an empty cluster leaves
every broker's count within one of every other's.

A rebalance plan is the fewest replica moves that bring every live broker within one
partition of the mean count, and so of every other (each count is the mean rounded down or
up: a broker that joins a cluster of one with two partitions takes one); it moves the
smallest partitions it can, and a replica on a broker that is not live (decommissioned, or
gone) always moves. Everything here is deterministic: equal input, equal answer, so a new
controller that plans again agrees with the old one.

>>> place_partitions(3, [1, 2, 3], {1: BrokerLoad(partitions=4), 2: BrokerLoad(partitions=4)})
[[3], [3], [3]]
>>> plan_rebalance({("orders", 0): [1], ("orders", 1): [1]}, [1, 2], {("orders", 0): 10, ("orders", 1): 5})
[Move(queue='orders', partition=1, source=1, target=2)]
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

import msgspec

__all__ = [
    "BrokerLoad",
    "Move",
    "PlacementError",
    "apply_moves",
    "broker_loads",
    "place_partitions",
    "plan_decommission",
    "plan_rebalance",
]

PartitionKey = tuple[str, int]  # (queue name, partition number)


class PlacementError(ValueError):
    """The partitions cannot be placed or moved as asked (no live broker, a replication
    factor the live brokers cannot hold, a bad count)."""


class BrokerLoad(msgspec.Struct, frozen=True):
    """What a broker holds now: ``partitions`` replicas, ``bytes`` of them, ``leaders`` of
    which it leads. A broker missing from a load mapping holds nothing."""

    partitions: int = 0
    bytes: int = 0
    leaders: int = 0


class Move(NamedTuple):
    """Move the replica of ``queue``'s ``partition`` on broker ``source`` to broker
    ``target`` (the leader's, while the replication factor is 1)."""

    queue: str
    partition: int
    source: int
    target: int


def _live(brokers: Iterable[int]) -> list[int]:
    live = sorted(set(brokers))
    if not live:
        raise PlacementError("no live brokers to place partitions on: start a broker, or wait for one to register")
    return live


def place_partitions(
    partitions: int,
    brokers: Sequence[int],
    load: Mapping[int, BrokerLoad],
    replication_factor: int = 1,
    first_partition: int = 0,
) -> list[list[int]]:
    """The replicas of each of ``partitions`` new partitions, numbered from
    ``first_partition``, leader first: over the live ``brokers``, weighted by their
    ``load``; the replicas of a partition are distinct brokers."""
    if partitions < 1:
        raise PlacementError(f"a queue needs at least 1 partition, not {partitions}")
    if first_partition < 0:
        raise PlacementError(f"partition numbers start at 0, not {first_partition}")
    live = _live(brokers)
    if not 1 <= replication_factor <= len(live):
        raise PlacementError(
            f"replication factor {replication_factor} cannot be met: it must be at least 1 and at most the "
            f"number of live brokers, {len(live)} now ({', '.join(map(str, live))})"
        )
    held = {b: load.get(b, BrokerLoad()).partitions for b in live}
    led = {b: load.get(b, BrokerLoad()).leaders for b in live}
    size = {b: load.get(b, BrokerLoad()).bytes for b in live}
    position = {b: i for i, b in enumerate(live)}
    placed: list[list[int]] = []
    for number in range(first_partition, first_partition + partitions):

        def turn(b: int, start: int = number) -> int:  # ties go round the brokers from the partition's start
            return (position[b] - start) % len(live)

        chosen = sorted(live, key=lambda b: (held[b], size[b], turn(b)))[:replication_factor]
        leader = min(chosen, key=lambda b: (led[b], held[b], size[b], turn(b)))
        replicas = [leader] + [b for b in chosen if b != leader]
        for b in replicas:
            held[b] += 1
        led[leader] += 1
        placed.append(replicas)
    return placed


def broker_loads(
    assignment: Mapping[PartitionKey, Sequence[int]], sizes: Mapping[PartitionKey, int]
) -> dict[int, BrokerLoad]:
    """Each broker's load under ``assignment`` (the first replica of a partition leads it),
    with the partitions' ``sizes`` in bytes (0 for one missing)."""
    held: dict[int, list[int]] = {}
    for key, replicas in assignment.items():
        for i, b in enumerate(replicas):
            entry = held.setdefault(b, [0, 0, 0])
            entry[0] += 1
            entry[1] += sizes.get(key, 0)
            entry[2] += i == 0
    return {b: BrokerLoad(p, n, lead) for b, (p, n, lead) in sorted(held.items())}


def apply_moves(
    assignment: Mapping[PartitionKey, Sequence[int]], moves: Iterable[Move]
) -> dict[PartitionKey, list[int]]:
    """``assignment`` with each move done: the move's source replaced by its target, in
    place in the replica list (a leader's move keeps it first)."""
    after = {key: list(replicas) for key, replicas in assignment.items()}
    for m in moves:
        replicas = after.get((m.queue, m.partition))
        if replicas is None or m.source not in replicas:
            raise PlacementError(f"move {m} names a replica that is not there: {replicas}")
        if m.target in replicas:
            raise PlacementError(f"move {m} targets a broker that holds the partition already: {replicas}")
        replicas[replicas.index(m.source)] = m.target
    return after


class _Plan:
    """The state of a plan being made: the assignment as the moves so far leave it, each live
    broker's count and bytes, and the moves, merged so a replica moved twice moves once."""

    def __init__(
        self, assignment: Mapping[PartitionKey, Sequence[int]], live: list[int], sizes: Mapping[PartitionKey, int]
    ) -> None:
        self.live, self.sizes = live, sizes
        self.replicas = {key: list(r) for key, r in sorted(assignment.items())}
        self.count = dict.fromkeys(live, 0)
        self.bytes = dict.fromkeys(live, 0)
        self.on: dict[int, set[PartitionKey]] = {b: set() for b in live}
        for key, replicas in self.replicas.items():
            if len(set(replicas)) != len(replicas):
                raise PlacementError(f"partition {key[0]}/{key[1]} lists a broker twice: {replicas}")
            for b in replicas:
                if b in self.count:
                    self._add(b, key, 1)
        self.origin: dict[tuple[str, int, int], int] = {}  # (queue, partition, holder now) -> holder before the plan

    def _add(self, broker: int, key: PartitionKey, sign: int) -> None:
        self.count[broker] += sign
        self.bytes[broker] += sign * self.sizes.get(key, 0)
        (self.on[broker].add if sign > 0 else self.on[broker].discard)(key)

    def move(self, key: PartitionKey, source: int, target: int) -> None:
        replicas = self.replicas[key]
        replicas[replicas.index(source)] = target
        if source in self.count:
            self._add(source, key, -1)
        self._add(target, key, 1)
        first = self.origin.pop((*key, source), source)
        if first != target:
            self.origin[(*key, target)] = first

    def emptiest(self, key: PartitionKey, among: Iterable[int]) -> int | None:
        """The broker of ``among`` with the fewest partitions (then bytes) that does not hold
        ``key`` already."""
        free = [b for b in among if b not in self.replicas[key]]
        return min(free, key=lambda b: (self.count[b], self.bytes[b], b), default=None)

    def moves(self) -> list[Move]:
        return [Move(q, n, source, target) for (q, n, target), source in self.origin.items()]


def _move_off(plan: _Plan, leaving: set[int], targets: list[int]) -> None:
    """Move every replica on a ``leaving`` broker to the emptiest of ``targets``: the largest
    partitions first, so that the bytes spread as well as the counts."""
    stranded = [(key, b) for key, replicas in plan.replicas.items() for b in replicas if b in leaving]
    stranded.sort(key=lambda kb: (-plan.sizes.get(kb[0], 0), kb))
    for key, source in stranded:
        target = plan.emptiest(key, targets)
        if target is None:
            raise PlacementError(
                f"partition {key[0]}/{key[1]} cannot leave broker {source}: every live broker holds it already "
                f"({plan.replicas[key]}); add a broker first"
            )
        plan.move(key, source, target)


def _balance(plan: _Plan) -> None:
    """Move replicas from the fullest live broker to the emptiest, smallest partition first,
    until every count is the mean T/n rounded down or up. Each move mends an excess or a
    deficit (the fullest is above the mean, the emptiest below) and makes neither anew, so
    the number of moves is the larger of the two sums: the fewest there can be."""
    n, total = len(plan.live), sum(plan.count.values())
    low, high = total // n, -(-total // n)
    # each move lowers the sum of the squared counts by at least 2: a bound on the passes
    for _ in range(sum(c * c for c in plan.count.values()) // 2 + 1):
        fullest = max(plan.live, key=lambda b: (plan.count[b], plan.bytes[b], -b))
        emptiest = min(plan.live, key=lambda b: (plan.count[b], plan.bytes[b], b))
        if plan.count[fullest] <= high and plan.count[emptiest] >= low:
            return
        emptier = [b for b in plan.live if plan.count[b] < plan.count[fullest] - 1]
        for key in sorted(plan.on[fullest], key=lambda k: (plan.sizes.get(k, 0), k)):
            target = plan.emptiest(key, emptier)
            if target is not None:
                plan.move(key, fullest, target)
                break
        else:
            return  # every broker emptier holds each partition of the fullest already (factor > 1)


def plan_rebalance(
    assignment: Mapping[PartitionKey, Sequence[int]], brokers: Sequence[int], sizes: Mapping[PartitionKey, int]
) -> list[Move]:
    """The fewest moves that leave every replica on a live broker of ``brokers`` and every
    live broker within one partition of the mean count, moving small partitions (``sizes``
    in bytes) before large ones. Empty when the cluster is balanced already."""
    live = _live(brokers)
    plan = _Plan(assignment, live, sizes)
    gone = {b for replicas in plan.replicas.values() for b in replicas} - set(live)
    _move_off(plan, gone, live)
    _balance(plan)
    return plan.moves()


def plan_decommission(
    assignment: Mapping[PartitionKey, Sequence[int]],
    brokers: Sequence[int],
    sizes: Mapping[PartitionKey, int],
    leaving: int,
) -> list[Move]:
    """The moves of every replica off broker ``leaving``, each to the emptiest other live
    broker; nothing else moves."""
    staying = [b for b in _live(brokers) if b != leaving]
    if not staying:
        raise PlacementError(f"broker {leaving} is the only live broker: start another before decommissioning it")
    plan = _Plan(assignment, staying, sizes)
    _move_off(plan, {leaving}, staying)
    return plan.moves()
