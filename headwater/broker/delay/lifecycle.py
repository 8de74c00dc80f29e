"""The life of a delayed batch, as one table (the states and what moves between them).

::

    PENDING ──take (due)──────────▶ DISPATCHING ──appended + durable──▶ DELIVERED
       │  ▲                             │
       │  └──────── retry (queue disabled, storage error) ──┘
       ├──cancel (every message)──▶ CANCELLED
       ├──due, queue deleted──────▶ DROPPED    (DISPATCHING → DROPPED as well)
       └──partition moved away────▶ MOVED      (its new leader took the batch)

A cancel of some of a batch's messages keeps it PENDING: they are left out when it is
delivered. Only the dispatcher thread takes a batch out of PENDING; cancels come from any
thread under the service's lock. What a cancel answers in each state is in ``CANCEL``.
"""

from __future__ import annotations

from enum import IntEnum

__all__ = ["State", "TRANSITIONS", "CANCEL", "move"]


class State(IntEnum):
    PENDING = 1
    DISPATCHING = 2
    DELIVERED = 3
    CANCELLED = 4
    DROPPED = 5
    MOVED = 6


#: event -> {from state: to state}
TRANSITIONS: dict[str, dict[State, State]] = {
    "take": {State.PENDING: State.DISPATCHING},
    "retry": {State.DISPATCHING: State.PENDING},
    "delivered": {State.DISPATCHING: State.DELIVERED},
    "dropped": {State.DISPATCHING: State.DROPPED, State.PENDING: State.DROPPED},
    "cancel_all": {State.PENDING: State.CANCELLED},
    "moved": {State.PENDING: State.MOVED},
}

#: what cancelling a message answers, by the state of its batch: None = it is cancelled
#: (again: cancelling twice is fine), else the reason it cannot be
CANCEL: dict[State, str | None] = {
    State.PENDING: None,
    State.CANCELLED: None,
    State.DISPATCHING: "is being delivered right now; too late to cancel",
    State.DELIVERED: "was already delivered; too late to cancel",
    State.DROPPED: "was dropped when it came due (its queue had been deleted)",
    State.MOVED: "moved to another broker with its partition; ask the partition's leader",
}


def move(state: State, event: str) -> State:
    """The state after ``event``; an event the table does not allow is a bug."""
    to = TRANSITIONS[event].get(state)
    assert to is not None, f"delayed batch: {event} is not allowed in {state.name}"
    return to
