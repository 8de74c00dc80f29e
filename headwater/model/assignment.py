"""Assignment strategies of clustering groups: which member reads which partition.

A strategy is a pure function ``(members, partition_counts, previous) -> target``:

- ``members``: ``{member_id: subscribed queue names}``;
- ``partition_counts``: ``{queue: number of partitions}`` (0: the queue is gone);
- ``previous``: ``{member_id: partitions it was meant to read}`` before this rebalance
  (members that just joined are absent or empty);
- ``target``: ``{member_id: set of (queue, partition)}`` covering every partition of every
  subscribed queue exactly once, each given to a member subscribed to its queue.

Both strategies balance each queue on its own among the members subscribed to it: every
member gets ``n // k`` or ``n // k + 1`` of the queue's ``n`` partitions (``k`` members).

``average`` is EQueue's ``AverageAllocateMessageQueueStrategy``: members sorted by id, each
takes the next contiguous run of partitions, the first ``n % k`` one more. It ignores the
previous assignment, so a member joining can move most partitions.

``sticky`` gives the same balance while moving as few partitions as possible: a member keeps
what it had up to its quota, the ``n % k`` larger quotas go to the members that already hold
the most, and only the surplus and the partitions of departed members move. No balanced
assignment moves fewer (see :func:`sticky_moves_lower_bound`, which the tests check).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

__all__ = ["TP", "Strategy", "STRATEGIES", "assign_average", "assign_sticky", "sticky_moves_lower_bound"]

TP = tuple[str, int]
Members = Mapping[str, "frozenset[str] | set[str] | tuple[str, ...]"]
Strategy = Callable[[Members, Mapping[str, int], Mapping[str, set[TP]]], dict[str, set[TP]]]


def _subscribers(members: Members, queue: str) -> list[str]:
    return sorted(m for m, queues in members.items() if queue in queues)


def _queues(members: Members, counts: Mapping[str, int]) -> list[str]:
    return sorted({q for qs in members.values() for q in qs if counts.get(q, 0) > 0})


def assign_average(
    members: Members, counts: Mapping[str, int], previous: Mapping[str, set[TP]] | None = None
) -> dict[str, set[TP]]:
    """EQueue's average allocation, queue by queue (``previous`` is ignored).

    >>> t = assign_average({"a": {"q"}, "b": {"q"}, "c": {"q"}}, {"q": 8})
    >>> [sorted(p for _, p in t[m]) for m in "abc"]
    [[0, 1, 2], [3, 4, 5], [6, 7]]
    """
    out: dict[str, set[TP]] = {m: set() for m in members}
    for q in _queues(members, counts):
        subs = _subscribers(members, q)
        n, k = counts[q], len(subs)
        size, extra = divmod(n, k)
        start = 0
        for i, m in enumerate(subs):
            take = size + (1 if i < extra else 0)
            out[m].update((q, p) for p in range(start, start + take))
            start += take
    return out


def _quotas(subs: list[str], n: int, held_count: Mapping[str, int], load: Mapping[str, int]) -> dict[str, int]:
    """Per member ``n // k`` or one more; the larger quotas go to those holding the most
    already (ties: the least loaded overall, then by id), which minimises moves."""
    size, extra = divmod(n, len(subs))
    ranked = sorted(subs, key=lambda m: (-held_count.get(m, 0), load.get(m, 0), m))
    return {m: size + (1 if i < extra else 0) for i, m in enumerate(ranked)}


def assign_sticky(
    members: Members, counts: Mapping[str, int], previous: Mapping[str, set[TP]] | None = None
) -> dict[str, set[TP]]:
    """Balanced per queue, keeping every partition where it was when balance allows.

    >>> before = assign_average({"a": {"q"}, "b": {"q"}}, {"q": 6})
    >>> after = assign_sticky({"a": {"q"}, "b": {"q"}, "c": {"q"}}, {"q": 6}, before)
    >>> [len(after[m]) for m in "abc"], len(before["a"] - after["a"]) + len(before["b"] - after["b"])
    ([2, 2, 2], 2)
    """
    previous = previous or {}
    out: dict[str, set[TP]] = {m: set() for m in members}
    load: dict[str, int] = {m: 0 for m in members}  # partitions given so far, all queues
    for q in _queues(members, counts):
        subs = _subscribers(members, q)
        n = counts[q]
        kept: dict[str, list[int]] = {m: sorted(p for qq, p in previous.get(m, ()) if qq == q and p < n) for m in subs}
        quota = _quotas(subs, n, {m: len(ps) for m, ps in kept.items()}, load)
        free = set(range(n))
        have: dict[str, int] = {}
        for m in subs:
            keep = kept[m][: quota[m]]
            out[m].update((q, p) for p in keep)
            free.difference_update(keep)
            have[m] = len(keep)
        for p in sorted(free):
            # the member furthest below its quota, then the least loaded overall
            m = min((m for m in subs if have[m] < quota[m]), key=lambda m: (have[m] - quota[m], load[m], m))
            out[m].add((q, p))
            have[m] += 1
        for m in subs:
            load[m] += quota[m]
    return out


def sticky_moves_lower_bound(members: Members, counts: Mapping[str, int], previous: Mapping[str, set[TP]]) -> int:
    """The fewest partitions any balanced assignment must take from a member that still
    reads their queue: per queue, the surplus above quota when the larger quotas go to the
    members holding the most (partitions of departed members are not counted: they move
    whatever the strategy)."""
    moves = 0
    for q in _queues(members, counts):
        subs = _subscribers(members, q)
        n = counts[q]
        held = sorted((sum(1 for qq, p in previous.get(m, ()) if qq == q and p < n) for m in subs), reverse=True)
        size, extra = divmod(n, len(subs))
        moves += sum(max(0, h - (size + (1 if i < extra else 0))) for i, h in enumerate(held))
    return moves


STRATEGIES: dict[str, Strategy] = {"average": assign_average, "sticky": assign_sticky}
