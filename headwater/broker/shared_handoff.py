"""A shared group's state of one partition as it is handed over in a move (no I/O).

A partition's shared-group state lives on its leader (docs/design/cluster.md, "Shared
groups"). When the partition moves, the old leader, fenced, hands each group's window of
the partition to the new one (HANDOFF_DELAYED with ``shared``; the paging and the adoption
are :class:`~headwater.broker.shared.SharedGroups`'). What crosses is the window as the
old leader keeps it, but for its leases: a lease is the old leader's promise to its holder,
which the new leader cannot keep (it never gave it), so it is handed over as AVAILABLE at
once, its delivery counted in its attempts (the table's RESTART row, as a broker restart
treats it). The holder's ack reaches the new leader and is refused as ``LEASE_EXPIRED``;
the message comes again. Acknowledged and dead offsets stay finished: never delivered again.

Thread-safety: none; the caller holds the shared groups' lock.
"""

from __future__ import annotations

from headwater.broker.shared_state import (
    DeliveryEvent,
    DeliveryState,
    EntryImage,
    PartitionImage,
    SharedQueueState,
    next_state,
)
from headwater.model.shared import HandedOffShared

__all__ = ["MOVE_REASON", "export_partition", "image_of"]

MOVE_REASON = "lease lost in a partition move"


def export_partition(st: SharedQueueState, partition: int) -> HandedOffShared | None:
    """Group ``st``'s state of ``partition`` to hand over (None: it never read it here).
    Leaves ``st`` as it is: after a rolled-back move this broker goes on from it."""
    c = st.cursors.get(partition)
    if c is None:
        return None
    img = c.image()
    entries: dict[int, EntryImage] = {}
    for off, (state, attempts, due_ms, reason) in img.entries.items():
        if state == DeliveryState.LEASED:
            state = int(next_state(DeliveryState.LEASED, DeliveryEvent.RESTART, False))
            due_ms, reason = 0, MOVE_REASON
        entries[off] = (state, attempts, due_ms, reason)
    return HandedOffShared(st.group, st.settings, img.floor, img.next, img.dead_lettered, entries)


def image_of(item: HandedOffShared) -> PartitionImage:
    """The handed state as the image the new leader records and loads."""
    return PartitionImage(item.floor, item.next, item.dead_lettered, dict(item.entries))
