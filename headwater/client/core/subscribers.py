"""Subscriber calls on a cluster, without I/O (docs/design/cluster.md, "Subscriptions
(built)"): a subscriber's add, delete, describe and checkpoint go to its coordinator
(:meth:`~headwater.client.core.routing.RoutingTable.subscriber_coordinator`), sent again
after a NotCoordinatorError as :class:`~headwater.client.core.routing.RoutedCall` says;
LIST_SUBSCRIBERS goes to every broker and the answers are merged here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from headwater.model.subscription import SubscriberInfo

__all__ = ["merge_subscribers"]


def merge_subscribers(
    answers: Mapping[int, list[SubscriberInfo]], coordinator_of: Callable[[str, str], int | None]
) -> list[SubscriberInfo]:
    """Every broker's LIST_SUBSCRIBERS answer (broker id -> its subscribers) as one: each
    subscriber once, by queue and name, taken from its coordinator's answer
    (``coordinator_of(queue, name)``) when it has one, since a broker that just gave it up
    may still list it with an older checkpoint; else from the lowest broker id listing it.

    >>> old = SubscriberInfo(queue="q", name="s", partitions=None, tags=[], created_ms=0, checkpoints={0: 1})
    >>> new = SubscriberInfo(queue="q", name="s", partitions=None, tags=[], created_ms=0, checkpoints={0: 9})
    >>> [s.checkpoints for s in merge_subscribers({1: [old], 2: [new]}, lambda q, n: 2)]
    [{0: 9}]
    """
    chosen: dict[tuple[str, str], tuple[bool, int, SubscriberInfo]] = {}
    for broker_id, infos in sorted(answers.items()):
        for info in infos:
            key = (info.queue, info.name)
            ours = coordinator_of(info.queue, info.name) == broker_id
            held = chosen.get(key)
            if held is None or (ours and not held[0]):
                chosen[key] = (ours, broker_id, info)
    return [info for _, _, info in sorted(chosen.values(), key=lambda c: (c[2].queue, c[2].name))]
