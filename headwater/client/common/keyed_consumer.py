"""A member of a keyed group (CDAP's groups that partition by their own key), written once
for the blocking and the asyncio member (see :mod:`.twins`).

Member ``i`` of a group of ``n`` receives exactly the messages whose key hashes to ``i``
(:func:`headwater.model.keyed.member_of`), from every partition of the queue, in offset order
per partition and so in order per key. The broker does the filtering: other members'
messages never reach this process. Positions are kept on the broker per (member, partition)
and stored by :meth:`KeyedConsumerBase.commit`.

Resizing (``client.admin.resize_keyed_group``) is followed without restarts:

- a member of the old size reads up to the resize's barrier, and once the application has
  handed back everything before it (called :meth:`~KeyedConsumerBase.poll` again after the
  last records, or :meth:`~KeyedConsumerBase.commit`), its position is committed at the barrier;
- when every old member got there, the new size applies: members below it continue from
  the barrier, members at or above it are **retired** (:attr:`~KeyedConsumerBase.retired`; their
  ``poll`` returns nothing), and new members (started with the new size) begin.

So a key that moves to another member is read by it only after its old member committed
everything of that key before the barrier: order per key holds across the change. A member
that keeps running through a resize commits at the barrier by itself; one that stopped before
reaching it holds the resize until it is run again.

Delivery is at least once: after a crash a member resumes from its last commit.

:class:`KeyedConsumerBase` holds what the blocking member
(:class:`~headwater.client.sync.keyed_consumer.KeyedConsumer`) and the asyncio one
(:class:`~headwater.client.aio.keyed_consumer.AsyncKeyedConsumer`) share: the group as last
seen, positions, buffers, the decoding of a fetch's answer, and the poll, commit and
membership steps as ``@waits`` bodies. Each subclass keeps how it sends a fetch without
waiting (``_start_fetch``: a thread or a future against a task), waits for one to be answered
or for a wakeup (``_wait_fetches``), looks up the queue's partitions (``_ask_partitions``)
and waits for a resize to move on (``_nap``).

``wakeup()`` (:mod:`.waking`) ends the poll that waits, or the next one, with
:class:`~headwater.errors.WakeupError`, as a plain consumer's does: its fetches in flight
stay in flight for the next poll, records already buffered stay buffered (none is handed
out past the wakeup), and so do the positions and the member's place in its group.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Generator
from typing import Any

from headwater.client.common.closing import Closable
from headwater.client.common.twins import Twins, waits
from headwater.client.common.waking import Wakes
from headwater.client.core.reads import POLL_MESSAGES_DEFAULT, check_poll, check_read_settings
from headwater.client.transport.polling import Outage, RecordBuffers, drain_buffers
from headwater.errors import InvalidArgumentError, StaleGenerationError
from headwater.model.config import QueueInfo
from headwater.model.filtering import decode_selection
from headwater.model.keyed import KeyedFetchResult, KeyedGroupInfo, key_of, member_of, parse_key_spec
from headwater.model.message import Record

__all__ = ["KeyedConsumerBase"]

_PARTITIONS_CHECK_S = 5.0  # how often an active member looks for partitions added to the queue


class KeyedConsumerBase(Twins, Closable, Wakes):
    """Member ``member`` of keyed group ``group`` on ``queue`` (see the module's docstring).
    Use from one thread or task.

    ``size`` and ``key`` declare the group: the first member creates it (its members start
    at the queue's ``start``, ``"earliest"`` or ``"latest"``); later members must agree
    (``size`` may also be the size a resize is heading to)."""

    _kind = "keyed consumer"

    def __init__(
        self,
        service: object,
        group: str,
        queue: str,
        *,
        member: int,
        size: int,
        key: str = "key",
        start: str = "earliest",
        fetch_bytes: int = 1024 * 1024,
        max_poll_messages: int = POLL_MESSAGES_DEFAULT,
        refresh_ms: int = 100,
    ) -> None:
        if isinstance(member, bool) or not isinstance(member, int) or member < 0:
            raise InvalidArgumentError(f"member is an index from 0, got {member!r}")
        if isinstance(size, int) and not isinstance(size, bool) and member >= size > 0:
            raise InvalidArgumentError(f"member {member} is not in a group of {size} (members 0..{size - 1})")
        check_read_settings(fetch_bytes=fetch_bytes, max_poll_messages=max_poll_messages)
        self._property = parse_key_spec(key)
        self._service = service
        self.group = group
        self.queue = queue
        self.member = member
        self.max_poll_messages = max_poll_messages
        self._fetch_bytes = fetch_bytes
        self._refresh_s = refresh_ms / 1000
        self._declared = (key, size, start)  # sent when joining
        self._closed = False
        self._rotation = itertools.count()
        self._fetch_pos: dict[int, int] = {}
        self._consumed: dict[int, int] = {}
        self._buffers: RecordBuffers[int] = RecordBuffers()
        self._inflight: dict[int, tuple[int, Any]] = {}  # a fetch per partition: (its position, future or task)
        self._outage = Outage(service)  # fetches that failed while the broker restarts are tried again
        self._committed: dict[int, int] = {}
        self._next_partitions_check = 0.0
        self._partitions_check: Any = None  # the answer to the last look for added partitions, until taken
        self._info: KeyedGroupInfo | None = None

    # -- the group ------------------------------------------------------------------------

    @property
    def info(self) -> KeyedGroupInfo:
        """The group as this member last saw it."""
        if self._info is None:
            raise InvalidArgumentError("this member has not joined its group yet: poll() first")
        return self._info

    @property
    def generation(self) -> int:
        return self.info.generation

    @property
    def role(self) -> str:
        """``"active"``, ``"draining"`` (a resize is under way: reading up to its barrier),
        ``"waiting"`` (new in a resize: it starts once the old members drained) or
        ``"retired"`` (the group shrank below this member)."""
        return self.info.role(self.member)

    @property
    def retired(self) -> bool:
        return self.role == "retired"

    @waits
    def refresh(self) -> Generator[Any, Any, KeyedGroupInfo]:
        """Ask the broker where the group stands now (and follow it)."""
        yield from self._refreshing()
        return self.info

    def _refreshing(self) -> Generator[Any, Any, None]:
        if self._info is None:  # not joined yet (an asyncio member joins on first use): join
            self._check_open()
            key, size, start = self._declared
            info = yield self._service.keyed_group(self.queue, self.group, key, size, start)
        else:
            info = yield self._service.keyed_group(self.queue, self.group)
        yield from self._follow(info)

    def _follow(self, info: KeyedGroupInfo) -> Generator[Any, Any, None]:
        if self._adopt(info):
            self._add_partitions((yield self._service.describe_queue(self.queue)))

    def _adopt(self, info: KeyedGroupInfo) -> bool:
        """Take the group's state: positions restart from it when the generation changed.
        Whether the member must now look up the queue's partitions (:meth:`_add_partitions`)."""
        old = self._info
        self._info = info
        if old is not None and old.generation == info.generation:
            return False  # same members, same positions (a resize may have begun: see _stop)
        self._fetch_pos.clear()
        self._consumed.clear()
        self._buffers.clear()
        self._drop_inflight()
        self._committed.clear()
        return info.role(self.member) in ("active", "draining")

    def _drop_inflight(self) -> None:
        self._inflight.clear()

    def _add_partitions(self, qi: QueueInfo) -> None:
        """Read the partitions of the queue (``qi``) this member does not read yet."""
        info = self.info
        for pi in qi.partitions:
            if pi.partition not in self._fetch_pos:
                pos = info.position(self.member, pi.partition, pi.start_offset)
                self._fetch_pos[pi.partition] = self._consumed[pi.partition] = pos
                self._committed[pi.partition] = pos
                self._buffers[pi.partition] = deque()
        self._next_partitions_check = time.monotonic() + _PARTITIONS_CHECK_S

    def _checked_partitions(self) -> bool:
        """Take the answer to the last look for added partitions, if it came; whether it is
        time to look again (every ``_PARTITIONS_CHECK_S``)."""
        fut = self._partitions_check
        if fut is not None:
            if fut.done():
                self._partitions_check = None
                qi = self._outage.result(fut)  # None: the broker restarts; look again next time
                if qi is not None:
                    self._add_partitions(qi)
            return False
        return time.monotonic() >= self._next_partitions_check

    def _asked_partitions(self, answer: Any) -> None:
        """A look for added partitions was sent; ``answer`` (a future or task) holds the
        queue's QueueInfo, taken by :meth:`_checked_partitions` on a later poll."""
        self._partitions_check = answer
        self._next_partitions_check = time.monotonic() + _PARTITIONS_CHECK_S

    def _stop(self, partition: int) -> int | None:
        info = self.info
        if info.resizing_to is None:
            return None
        return info.barrier.get(partition, 0)

    def _drained(self) -> bool:
        return all(not self._buffers[p] and self._consumed[p] >= (self._stop(p) or 0) for p in self._fetch_pos)

    def _step(self) -> str:
        """What ``poll()`` does next, by the member's role: ``"stop"`` (retired: nothing
        more comes), ``"commit"`` (drained to a resize's barrier: commit there), ``"wait"``
        (for the resize to move on, then refresh) or ``"fetch"``."""
        role = self.role
        if role == "retired":
            return "stop"
        if role == "draining" and self._drained():
            return "commit" if self._committed != self._consumed else "wait"
        return "wait" if role == "waiting" else "fetch"

    def _to_fetch(self) -> list[tuple[int, int]]:
        """``(partition, position)`` of each partition to fetch now, in turn: none in flight,
        room in its buffer, and short of a resize's barrier."""
        parts = list(self._fetch_pos)
        if not parts:
            return []
        start = next(self._rotation) % len(parts)
        out = []
        for p in parts[start:] + parts[:start]:
            stop = self._stop(p)
            pos = self._fetch_pos[p]
            if (
                p in self._inflight
                or len(self._buffers[p]) >= self.max_poll_messages
                or (stop is not None and pos >= stop)
            ):
                continue
            out.append((p, pos))
        return out

    def _collect(self) -> tuple[int, bool]:
        """Take the answers of the fetches that are done into the buffers: the records taken,
        and whether the group moved on (then refresh)."""
        got = 0
        stale = False
        for p, (pos, fut) in list(self._inflight.items()):
            if not fut.done():
                continue
            del self._inflight[p]
            try:
                res: KeyedFetchResult | None = self._outage.result(fut)
            except StaleGenerationError:
                stale = True
                continue
            if res is None:
                continue  # the broker restarts: fetch again on the next turn
            info = self.info
            if res.generation != info.generation or (res.stop_offset is not None and info.resizing_to is None):
                stale = True  # the group moved on (a resize began or ended): look again
            if self._fetch_pos.get(p) != pos or res.generation != info.generation:
                continue
            start = max(pos, res.start_offset)
            buf = self._buffers[p]
            for i, b in enumerate(res.batches):
                offsets = res.selections[i] if res.selections else ()
                for r in decode_selection(b, offsets, self.queue, start_offset=start, end_offset=res.stop_offset):
                    # the broker filtered by key hash; check again, as a reader checks tags
                    if member_of(key_of(self._property, r.key, r.properties), info.size) == self.member:
                        buf.append(r)
                        got += 1
            self._buffers.filled_up(p)
            nxt = max(start, res.next_offset)
            self._fetch_pos[p] = nxt
            if not buf:
                self._consumed[p] = nxt
        return got, stale

    def _buffered(self, max_messages: int | None, timeout_ms: int) -> list[Record]:
        """What ``poll`` returns at once, without waiting: records already buffered. Each
        kind's ``poll`` calls :meth:`_poll` only when there are none, so a poll loop served
        from the buffers pays no generator step (~0.5 us) per poll. None after a
        ``wakeup()``: the poll raises first."""
        self._check_open()
        limit = check_poll(max_messages, timeout_ms, self.max_poll_messages)
        if self._woken:
            return []
        return drain_buffers(self._buffers, self._fetch_pos, self._consumed, limit)

    @waits
    def _poll(self, max_messages: int | None, timeout_ms: int) -> Generator[Any, Any, list[Record]]:
        """Up to ``max_messages`` of this member's records, waiting up to ``timeout_ms``.

        Calling it again means the records it returned before are processed: a draining
        member commits at the barrier then, by itself. ``wakeup()`` (from another thread)
        ends the poll that waits, or the next one, with :class:`~headwater.errors.WakeupError`."""
        self._check_open()
        limit = check_poll(max_messages, timeout_ms, self.max_poll_messages)
        self._arm_wakeup()
        self._check_woken()
        if self._info is None:
            yield from self._refreshing()  # join
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            out = drain_buffers(self._buffers, self._fetch_pos, self._consumed, limit)
            if out:
                return out
            remaining = deadline - time.monotonic()
            step = self._step()
            if step == "stop":
                return []
            if step == "commit":
                yield from self._committing()
                continue
            if step == "wait":
                if remaining <= 0:
                    return []
                yield self._nap(min(self._refresh_s, remaining))
                self._check_woken()
                yield from self._refreshing()
                continue
            if self.role == "active" and self._checked_partitions():
                # look for partitions added to the queue; over the network without waiting (the
                # answer is taken on a later poll), so a poll keeps its timeout while the broker is away
                self._ask_partitions()
            self._launch_fetches(max(0, int(remaining * 1000)))
            yield self._wait_fetches(remaining)
            got, stale = self._collect()
            if stale:
                yield from self._refreshing()
            if not got and self._gives_up(remaining):
                return []

    def _launch_fetches(self, wait_ms: int) -> None:
        generation = self.info.generation
        for p, pos in self._to_fetch():
            args = (self.queue, self.group, self.member, generation, p, pos)
            self._inflight[p] = (pos, self._start_fetch(args, wait_ms))

    # -- positions --------------------------------------------------------------------------

    def position(self, partition: int) -> int:
        """The offset after the last record of ``partition`` that :meth:`poll` returned."""
        if partition not in self._consumed:
            raise InvalidArgumentError(f"member {self.member} reads no partition {partition} now ({self.role})")
        return self._consumed[partition]

    @waits
    def commit(self) -> Generator[Any, Any, None]:
        """Store the positions of what :meth:`poll` returned, on the broker, durably."""
        yield from self._committing()

    def _committing(self) -> Generator[Any, Any, None]:
        self._check_open()
        if self._info is None or self.role not in ("active", "draining") or not self._consumed:
            return  # nothing to store
        positions = dict(self._consumed)
        try:
            info = yield self._service.keyed_commit(
                self.queue, self.group, self.member, self.info.generation, positions
            )
        except StaleGenerationError:
            yield from self._refreshing()  # the group moved on without these positions: they no longer count
            return
        self._committed = positions
        yield from self._follow(info)
