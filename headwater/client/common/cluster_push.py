"""A subscriber's push streams on a cluster: one per broker that leads some of its partitions
(docs/design/cluster.md, "Subscriptions (built)", "Delivery").

The process first **claims** the subscriber at its coordinator (CLAIM_SUBSCRIBER): the
coordinator bumps the subscriber's epoch durably and answers with it, the tags and the
checkpoints. It then opens a SUBSCRIBE stream on each leader of its partitions
(:func:`~headwater.client.core.subscribers.plan_streams`), carrying the epoch, the tags and,
per partition, where to start: the offset its listeners reached in this process (at first,
the stored checkpoint). Each leader pushes only the partitions it leads, with the same credit
flow control as a broker alone (each stream has its own grant). Checkpoints go to the
coordinator (CHECKPOINT_SUBSCRIBER, with the epoch), never to a leader.

**Moves and failures.** A leader that no longer leads a partition ends its stream with
NotLeaderError; a lost connection ends it too. The process then asks for the routing table
again and plans again: a stream whose partitions changed is closed and opened again (at the
new leader too), from the listeners' positions, so nothing is skipped, and a record already
given to the listeners is not given again in this process (a push from before is dropped
by position). The plan is also checked every ``PARTITIONS_CHECK_S`` (the table asked for
again every ``METADATA_CHECK_S``), which finds partitions added to the queue, and a stream
that could not be opened is tried again with a backoff.

**One process per name.** A leader ends a stream whose epoch is older than one it was
given for the same subscriber ("replaced", as a broker alone says), and refuses to open
one; the process also asks the coordinator, the single authority, at each check, and stops
when a newer epoch is there (a leader restarted since forgets the epochs it saw) or the
subscriber was deleted. A replaced process's checkpoints are refused by the coordinator.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Generator
from typing import TYPE_CHECKING, Any

from headwater.client.core.subscribers import plan_streams
from headwater.errors import HeadwaterError, SubscriberNotFoundError, UnavailableError, UsageError
from headwater.model.filtering import count_messages
from headwater.model.service import PushStreamSpec
from headwater.model.subscription import replaced_message

if TYPE_CHECKING:
    from headwater.model.subscription import SubscriberInfo

__all__ = ["ClusterPush", "Leg", "METADATA_CHECK_S", "STREAMS_CHECK_S"]

log = logging.getLogger("headwater.subscriber")

METADATA_CHECK_S = 10.0  # how often a cluster subscriber asks for the routing table unprompted
STREAMS_CHECK_S = 2.0  # how often it checks its claim and its plan of streams
BACKOFF_S_MIN = 0.05
BACKOFF_S_MAX = 2.0  # the longest wait before a stream that could not be opened is tried again


class Leg:
    """One push stream of a subscriber: to broker ``broker_id`` (``ALONE``: a broker alone)
    over ``link``, of ``partitions``, with what the listeners used of its credit."""

    __slots__ = ("broker_id", "link", "sid", "partitions", "stream_pos", "owed_messages", "owed_bytes")

    def __init__(self, broker_id: int, link: Any, partitions: list[int]) -> None:
        self.broker_id = broker_id
        self.link = link
        self.sid = 0  # once open
        self.partitions = partitions
        self.stream_pos: dict[int, int] = {}  # where the broker's stream is, per partition (the credit it counts)
        self.owed_messages = 0
        self.owed_bytes = 0


class ClusterPush:
    """A subscriber's push streams (:class:`Leg`), and on a cluster its claim and its plan of
    streams by leader: a part of :class:`~headwater.client.common.subscriber.SubscriberBase`
    (which gives what is declared below, and runs the push loop over both)."""

    if TYPE_CHECKING:
        _service: Any
        queue: str
        name: str
        info: SubscriberInfo | None
        credit_messages: int
        credit_bytes: int
        _last_checkpoint: float
        _positions: dict[int, int]
        _inbox: Any
        _epoch: int
        _legs: dict[int, Leg]

        def _set_info(self, info: SubscriberInfo) -> None: ...
        def _ack_done(self, fut: Any) -> None: ...

    @property
    def streams(self) -> dict[int, list[int]]:
        """The push streams open now: broker id -> the partitions its stream carries (a
        broker alone is ``-1``, as METADATA names it; pulling, none)."""
        return {b: list(leg.partitions) for b, leg in self._legs.items()}

    def _checkpoint_at_coordinator(self, changed: dict[int, int], final: bool) -> Generator[Any, Any, bool]:
        """Store ``changed`` at the coordinator, fenced by the epoch; whether it was stored
        (a refusal for a passing reason is logged, and a later checkpoint stores them)."""
        if not changed:
            return True
        try:
            yield self._service.checkpoint_subscriber(self.queue, self.name, changed, self._epoch)
        except SubscriberNotFoundError:
            raise SubscriberNotFoundError(
                f"subscriber {self.name!r} of queue {self.queue!r} was deleted"  # as its streams say
            ) from None
        except UnavailableError as e:
            if final:
                raise
            # a leader the coordinator checks them against is down, or the coordinator moves:
            # delivery goes on, and the next checkpoint stores these positions
            log.info("subscriber %s/%s: checkpoint not stored yet (%s)", self.queue, self.name, e)
            self._last_checkpoint = time.monotonic()
            return False
        return True

    def _check_claim(self) -> Generator[Any, Any, None]:
        """Ask the coordinator whether this process still owns the name (raises if not)."""
        try:
            info = yield self._service.describe_subscriber(self.queue, self.name)
        except SubscriberNotFoundError:
            raise SubscriberNotFoundError(f"subscriber {self.name!r} of queue {self.queue!r} was deleted") from None
        except UnavailableError as e:  # the coordinator is moving or out of reach: ask at the next check
            log.info("subscriber %s/%s: its coordinator did not answer (%s)", self.queue, self.name, e)
            return
        if info.epoch > self._epoch:
            raise UsageError(replaced_message(self.queue, self.name))

    def _plan(self, fresh: bool) -> Generator[Any, Any, bool]:
        """Check the claim (raises if it is lost), close the streams whose partitions changed
        and open the missing ones; whether every partition has its stream now."""
        yield from self._check_claim()
        table = yield self._service.stream_table(self.queue, fresh)
        assert self.info is not None
        plan, leaderless = plan_streams(table, self.info)
        for broker_id, leg in list(self._legs.items()):
            if plan.get(broker_id) != leg.partitions:
                yield from self._close_leg(leg)
        settled = not leaderless
        for broker_id, partitions in plan.items():
            if broker_id in self._legs:
                continue
            try:
                yield from self._open_leg(broker_id, partitions)
            except UnavailableError as e:  # NotLeaderError too: the table is older than a move
                log.info("subscriber %s/%s: no stream at broker %d yet (%s)", self.queue, self.name, broker_id, e)
                settled = False
        if leaderless:
            log.info("subscriber %s/%s: no leader of partitions %s now", self.queue, self.name, leaderless)
        return settled

    def _open_leg(self, broker_id: int, partitions: list[int]) -> Generator[Any, Any, None]:
        leg = Leg(broker_id, (yield self._service.broker_link(broker_id)), partitions)
        assert self.info is not None
        positions = {p: self._positions.get(p, 0) for p in partitions}
        spec = PushStreamSpec(
            self.queue, self.name, self.credit_messages, self.credit_bytes, self._epoch, positions, self.info.tags
        )
        leg.sid, started = yield leg.link.open_push_stream(spec, lambda body: self._inbox.put_nowait((leg, body)))
        leg.stream_pos = dict(started.checkpoints)
        self._legs[broker_id] = leg

    def _close_leg(self, leg: Leg) -> Generator[Any, Any, None]:
        if self._legs.get(leg.broker_id) is leg:
            del self._legs[leg.broker_id]
        try:
            yield leg.link.close_push_stream(leg.sid)
        except HeadwaterError:
            pass  # its connection is gone, and the stream with it

    def _close_legs(self) -> Generator[Any, Any, None]:
        for leg in list(self._legs.values()):
            yield from self._close_leg(leg)

    def _pushed(self, leg: Leg, body: Any, complete: bool) -> bool:
        """After the listeners took a push of ``leg`` (all of it when ``complete``): move past
        what the broker skipped, count the credit it used; whether enough is owed to give."""
        p = body.partition
        if complete:
            self._positions[p] = max(self._positions.get(p, 0), body.next_offset)
        # give back the credit the broker counted for this push (never less: a stream must not starve)
        messages, size = count_messages(body.batches, body.selections, leg.stream_pos.get(p, 0), body.next_offset)
        leg.stream_pos[p] = body.next_offset
        leg.owed_messages += max(messages, 1)
        leg.owed_bytes += size
        return leg.owed_messages * 4 >= self.credit_messages or leg.owed_bytes * 4 >= self.credit_bytes

    def _give_credit(self, leg: Leg) -> None:
        """Give ``leg``'s broker back the credit the listeners used, without waiting (the
        checkpoint goes to the coordinator, not here)."""
        messages, size = leg.owed_messages, leg.owed_bytes
        leg.owed_messages = leg.owed_bytes = 0
        leg.link.ack_push_stream(leg.sid, {}, messages, size).add_done_callback(self._ack_done)
