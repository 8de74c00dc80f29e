"""PushService: the broker pushes subscribers' messages over their connections (HQueue 0.3).

A subscriber process opens a **stream** with SUBSCRIBE on its connection (it picks the
stream's id, so it can route PUSH frames before the answer arrives). One asyncio task per
stream then loops: for each followed partition, read from the stream's position, keep only
the messages whose tag is one the subscriber wants (:class:`~headwater.model.filtering.TagFilter`,
exact names: nothing else leaves the broker), and send them in a PUSH frame. When every
partition is caught up the task sleeps until an append to the queue wakes it, so a message
is pushed as soon as it is appended.

Flow control is by **credit**, as in AMQP or Reactive Streams: the client grants messages
and bytes (in SUBSCRIBE, then in every SUBSCRIPTION_ACK as its listeners finish), and the
stream sends only while both are positive — a push may overshoot by one read (at least one
batch is sent), so the client's buffer is bounded by its grant plus one ``push_bytes_max``.
A push that only moves the position past filtered-out messages costs one message of credit.
The connection's writes go one frame at a time (the server's write lock, then ``drain``), so
a subscriber that stops reading stops its stream and nothing else.

Checkpoints are the client's: SUBSCRIPTION_ACK carries ``{partition: next offset}`` once the
listeners returned, and the broker writes it durably before answering. A stream starts at
the durable checkpoints, so a restarted subscriber resumes where its listeners finished
(what was delivered after the last checkpoint is delivered again: at least once).

One stream per subscriber: a SUBSCRIBE for a subscriber that already has a stream takes it
over (the old stream gets a last PUSH saying so and ends), so a restarted process is not
locked out by the half-open connection of its dead predecessor. Deleting the subscriber or
its queue ends its stream the same way.

On a cluster (docs/design/cluster.md, "Subscriptions (built)") a subscriber process opens
one stream on each leader of its partitions: SUBSCRIBE then names the partitions this
broker is to push and where each starts, the tags, and the subscription epoch the
coordinator gave the process. Such a stream pushes only those partitions, each of which
must be led here (else NotLeaderError), ends with NotLeaderError once one moves away, and
checkpoints nothing (the coordinator keeps checkpoints). Of two streams of one subscriber
here, the older epoch's is refused or ended as replaced; the coordinator also ends it from
afar after a claim or a delete (END_SUBSCRIBER_STREAMS, :meth:`PushService.end_streams`).

Thread-safety: everything runs on the server's event loop; listeners registered with the
broker (appends, deletions) cross into it with ``call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from concurrent.futures import Executor
from typing import Any

from headwater.errors import (
    HeadwaterError,
    InvalidArgumentError,
    NotLeaderError,
    PartitionOutOfRangeError,
    QueueDisabledError,
    SubscriberNotFoundError,
    UnavailableError,
    UsageError,
)
from headwater.model.batch import decode_header
from headwater.model.config import check_user_queue
from headwater.model.filtering import TagFilter, count_messages, select_batches
from headwater.model.subscription import (
    SubscriberInfo,
    normalize_tags,
    replaced_message,
    subscribed_partitions,
    validate_subscriber_name,
)
from headwater.protocol import ProtocolError, Push
from headwater.protocol.messages import (
    ApiKey,
    EndSubscriberStreamsRequest,
    EndSubscriberStreamsResponse,
    RequestBody,
    ResponseBody,
    SubscribeRequest,
    SubscribeResponse,
    SubscriptionAckRequest,
    SubscriptionAckResponse,
    SubscriptionPush,
    UnsubscribeRequest,
    UnsubscribeResponse,
)

__all__ = ["PushService", "PUSH_APIS"]

log = logging.getLogger("headwater.push")

#: The requests :meth:`PushService.handle` serves.
PUSH_APIS = frozenset({ApiKey.SUBSCRIBE, ApiKey.UNSUBSCRIBE, ApiKey.SUBSCRIPTION_ACK, ApiKey.END_SUBSCRIBER_STREAMS})
#: Bounds on what a client may grant, so credit arithmetic stays small and meaningful.
CREDIT_MESSAGES_MAX = 1_000_000
CREDIT_BYTES_MAX = 1 << 30
_PARTITIONS_CHECK_S = 1.0  # how often a stream of every partition looks for new ones
_DISABLED_RETRY_S = 1.0  # a stream of a disabled queue looks again this often
_END_NOTICE_TIMEOUT_S = 1.0  # the longest the last PUSH of an ended stream may take to go out
_LEADERSHIP_CHECK_S = 1.0  # how often an idle cluster stream checks it still leads its partitions


class _Stream:
    __slots__ = (
        "sub_id",
        "conn",
        "queue",
        "name",
        "info",
        "filter",
        "positions",
        "credit_messages",
        "credit_bytes",
        "wake",
        "task",
        "ended",
        "next_partitions_check",
        "rotation",
        "epoch",
        "led_here",
    )

    def __init__(
        self,
        sub_id: int,
        conn: Any,
        info: SubscriberInfo,
        positions: dict[int, int],
        credit_messages: int,
        credit_bytes: int,
        epoch: int = 0,
        led_here: bool = False,
    ) -> None:
        self.sub_id = sub_id
        self.conn = conn  # the server's per-connection state: conn, writer, write_lock
        self.queue = info.queue
        self.name = info.name
        self.info = info
        self.filter = TagFilter(frozenset(info.tags)) if info.tags else None
        self.positions = positions
        self.credit_messages = credit_messages
        self.credit_bytes = credit_bytes
        self.wake = asyncio.Event()
        self.task: asyncio.Task | None = None
        self.ended = False
        self.next_partitions_check = 0.0
        self.rotation = 0
        self.epoch = epoch  # the coordinator's subscription epoch of the process (cluster)
        self.led_here = led_here  # a cluster stream: only partitions this broker leads


class PushService:
    """Push streams of every connection of one server. Create it on the server's loop."""

    def __init__(
        self,
        broker: Any,
        pool: Executor,
        *,
        push_bytes_max: int = 1 << 20,
        streams_per_connection_max: int = 64,
        taken: Any = lambda st, sid: False,
    ) -> None:
        self._broker = broker
        self._store = broker.store
        self._pool = pool
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self.push_bytes_max = push_bytes_max
        self.streams_per_connection_max = streams_per_connection_max
        self._by_queue: dict[str, set[_Stream]] = {}
        self._by_name: dict[tuple[str, str], _Stream] = {}
        self._by_conn: dict[Any, dict[int, _Stream]] = {}
        self.pushes = 0
        # taken(st, sid): whether a fetch stream uses that id on the connection (ids are unique
        # among a connection's streams of both kinds)
        self._taken = taken
        broker.add_append_listener(self._on_append)
        broker.subscribers.add_delete_listener(self._on_delete)

    # -- requests ------------------------------------------------------------------------

    async def handle(self, st: Any, body: RequestBody) -> ResponseBody:
        """Serve SUBSCRIBE, UNSUBSCRIBE or SUBSCRIPTION_ACK from connection ``st``."""
        if isinstance(body, SubscribeRequest):
            return await self._subscribe(st, body)
        if isinstance(body, SubscriptionAckRequest):
            return await self._ack(st, body)
        if isinstance(body, EndSubscriberStreamsRequest):
            await self.end_streams(body.queue, body.name, body.epoch, body.deleted)
            return EndSubscriberStreamsResponse()
        assert isinstance(body, UnsubscribeRequest)
        s = self._by_conn.get(st, {}).get(body.subscription_id)
        if s is not None:
            await self._end(s, None)
        return UnsubscribeResponse()

    async def _subscribe(self, st: Any, req: SubscribeRequest) -> ResponseBody:
        if self._broker.cluster is not None and req.positions is None:  # an older client
            raise UsageError(
                f"a broker in a cluster opens no push stream of a whole subscriber (subscriber {req.name!r}): "
                f"connect with headwater.connect(<the cluster's brokers>), whose subscriber opens one stream "
                f"per partition leader"
            )
        streams = self._by_conn.get(st, {})
        if req.subscription_id in streams or self._taken(st, req.subscription_id):
            raise InvalidArgumentError(f"stream {req.subscription_id} is already open on this connection")
        if len(streams) >= self.streams_per_connection_max:
            raise UsageError(
                f"{len(streams)} push streams are open on this connection, the most allowed "
                f"(setting push_streams_max); use another connection"
            )
        if not req.credit_messages or not req.credit_bytes:
            raise InvalidArgumentError("a stream needs some credit: credit_messages and credit_bytes > 0")
        if req.positions is not None:
            info, positions = self._leader_part(req)
        else:
            info = await self._loop.run_in_executor(self._pool, self._broker.describe_subscriber, req.queue, req.name)
            qi = self._store.describe_queue(info.queue)
            positions = {
                p: info.checkpoint(p, qi.partitions[p].start_offset)
                for p in subscribed_partitions(info, len(qi.partitions))
            }
        while (old := self._by_name.get((info.queue, info.name))) is not None:  # another may come meanwhile
            # a cluster stream's epoch is compared with the live stream's only: a leader keeps
            # no memory of ended ones (the subscriber may be deleted and added again at its
            # coordinator meanwhile, unseen here); a process of an older epoch that gets a
            # stream where the newer has none yet learns it from the coordinator within seconds
            if old.epoch > req.epoch:
                raise UsageError(replaced_message(info.queue, info.name))
            # the same epoch: the same process, whose plan of streams changed (it closes the old one)
            await self._end(old, UsageError(replaced_message(info.queue, info.name)))
        s = _Stream(
            req.subscription_id,
            st,
            info,
            positions,
            min(req.credit_messages, CREDIT_MESSAGES_MAX),
            min(req.credit_bytes, CREDIT_BYTES_MAX),
            req.epoch,
            req.positions is not None,
        )
        self._by_conn.setdefault(st, {})[s.sub_id] = s
        self._by_name[(s.queue, s.name)] = s
        self._by_queue.setdefault(s.queue, set()).add(s)
        s.next_partitions_check = time.monotonic() + _PARTITIONS_CHECK_S
        s.task = asyncio.create_task(self._run(s), name=f"push {s.queue}/{s.name}")
        return SubscribeResponse(info)

    def _leader_part(self, req: SubscribeRequest) -> tuple[SubscriberInfo, dict[int, int]]:
        """A cluster stream's subscriber and start positions: the partitions the client
        names, each led here (else NotLeaderError: its table is stale), from where it says
        (never before the retained start). The client passes them rather than this broker
        asking the coordinator: it knows what its listeners finished, the coordinator only
        the last checkpoint, so a moved partition resumes with nothing sent twice."""
        validate_subscriber_name(req.name)
        if req.epoch < 1:
            raise InvalidArgumentError(
                "a stream of some partitions needs the subscription epoch CLAIM_SUBSCRIBER answered (epoch >= 1)"
            )
        if not req.positions:
            raise InvalidArgumentError("a stream of some partitions names at least one partition in positions")
        qi = self._store.describe_queue(check_user_queue(req.queue))
        positions: dict[int, int] = {}
        for p, offset in sorted(req.positions.items()):
            if self._broker.cluster is not None:
                self._broker.cluster.check_leader(req.queue, p)  # NotLeaderError names the leader
            if not 0 <= p < len(qi.partitions):
                raise PartitionOutOfRangeError(
                    f"partition {p} is out of range for {req.queue!r} (0..{len(qi.partitions) - 1})"
                )
            if offset < 0:
                raise InvalidArgumentError(f"a stream's position is an offset, 0 or more; got {offset} for {p}")
            positions[p] = max(offset, qi.partitions[p].start_offset)
        info = SubscriberInfo(
            queue=req.queue,
            name=req.name,
            partitions=list(positions),
            tags=normalize_tags(req.tags),
            checkpoints=dict(positions),
            epoch=req.epoch,
        )
        return info, positions

    async def _ack(self, st: Any, req: SubscriptionAckRequest) -> ResponseBody:
        s = self._by_conn.get(st, {}).get(req.subscription_id)
        if s is None or s.ended:
            raise SubscriberNotFoundError(
                f"no push stream {req.subscription_id} is open on this connection (it ended, or was never opened)"
            )
        # credit first: a refused checkpoint must not starve the stream
        s.credit_messages = min(s.credit_messages + req.credit_messages, CREDIT_MESSAGES_MAX)
        s.credit_bytes = min(s.credit_bytes + req.credit_bytes, CREDIT_BYTES_MAX)
        s.wake.set()
        if req.offsets and s.led_here:
            raise InvalidArgumentError(
                "a cluster stream checkpoints nothing: send CHECKPOINT_SUBSCRIBER to the subscriber's coordinator"
            )
        if req.offsets:
            await self._loop.run_in_executor(
                self._pool, self._broker.checkpoint_subscriber, s.queue, s.name, dict(req.offsets)
            )
        return SubscriptionAckResponse()

    # -- ending ----------------------------------------------------------------------------

    def _forget(self, s: _Stream) -> None:
        s.ended = True
        streams = self._by_conn.get(s.conn)
        if streams is not None and streams.get(s.sub_id) is s:
            del streams[s.sub_id]
            if not streams:
                del self._by_conn[s.conn]
        if self._by_name.get((s.queue, s.name)) is s:
            del self._by_name[(s.queue, s.name)]
        q = self._by_queue.get(s.queue)
        if q is not None:
            q.discard(s)
            if not q:
                del self._by_queue[s.queue]

    async def _end(self, s: _Stream, reason: HeadwaterError | None) -> None:
        """End a stream; with a ``reason``, tell its client in a last PUSH."""
        if s.ended:
            return
        self._forget(s)
        me = asyncio.current_task()
        if s.task is not None and s.task is not me:
            s.task.cancel()
            with contextlib.suppress(BaseException):
                await s.task
        if reason is not None:
            last = SubscriptionPush(
                s.sub_id, 0, [], 0, 0, ended=str(reason) or type(reason).__name__, ended_code=reason.code
            )
            # bounded: a client that stopped reading must not hold up a takeover or a stop
            with contextlib.suppress(ConnectionError, ProtocolError, RuntimeError, TimeoutError):
                async with asyncio.timeout(_END_NOTICE_TIMEOUT_S):
                    await self._send(s, last)

    async def end_streams(self, queue: str, name: str, epoch: int, deleted: bool) -> None:
        """End the subscriber's stream here if its epoch is older than ``epoch`` (a newer
        process claimed it at its coordinator) or, when ``deleted``, whatever its epoch."""
        s = self._by_name.get((queue, name))
        if s is None or not (deleted or s.epoch < epoch):
            return
        if deleted:
            await self._end(s, SubscriberNotFoundError(f"subscriber {name!r} of queue {queue!r} was deleted"))
        else:
            await self._end(s, UsageError(replaced_message(queue, name)))

    def connection_closed(self, st: Any) -> None:
        """The connection is gone: its streams end (nobody is left to tell)."""
        for s in list(self._by_conn.get(st, {}).values()):
            self._forget(s)
            if s.task is not None:
                s.task.cancel()

    async def stop(self) -> None:
        """End every stream (the server is stopping)."""
        for s in list(self._by_name.values()):
            await self._end(s, UnavailableError("the broker is stopping; subscribe again when it is back"))

    def _on_delete(self, queue: str, name: str) -> None:
        def end() -> None:
            s = self._by_name.get((queue, name))
            if s is not None:
                asyncio.ensure_future(
                    self._end(s, SubscriberNotFoundError(f"subscriber {name!r} of queue {queue!r} was deleted"))
                )

        self._call_on_loop(end)

    # -- delivery --------------------------------------------------------------------------

    def _on_append(self, queue: str, partition: int, end_offset: int) -> None:
        if queue in self._by_queue:  # appends nobody subscribed to cost a dict lookup
            self._call_on_loop(lambda: self._wake(queue, partition))

    def _wake(self, queue: str, partition: int) -> None:
        for s in self._by_queue.get(queue, ()):
            if partition not in s.positions:
                s.next_partitions_check = 0.0  # a partition added to the queue: look now
            s.wake.set()

    def _call_on_loop(self, fn: Any) -> None:
        if threading.get_ident() == self._loop_thread:
            fn()
        else:
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody is left to wake
                self._loop.call_soon_threadsafe(fn)

    async def _run(self, s: _Stream) -> None:
        try:
            while not s.ended:
                s.wake.clear()
                try:
                    pushed = await self._push_round(s)
                except QueueDisabledError:
                    await asyncio.sleep(_DISABLED_RETRY_S)
                    continue
                if not pushed and s.led_here:  # wakes to notice a partition that moved away
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(_LEADERSHIP_CHECK_S):
                            await s.wake.wait()
                elif not pushed:
                    await s.wake.wait()
        except asyncio.CancelledError:
            raise
        except (ConnectionError, ProtocolError):
            self._forget(s)
        except HeadwaterError as e:  # the queue was deleted, ...: tell the client, stop
            await self._end(s, self._moved_away(s) or e)
        except Exception:  # noqa: BLE001 - a bug ends this stream, not the server
            log.exception("push stream %s/%s failed", s.queue, s.name)
            await self._end(s, UnavailableError("internal error in the broker's push stream; subscribe again"))

    def _moved_away(self, s: _Stream) -> NotLeaderError | None:
        """For a cluster stream, the refusal of a partition it pushes that this broker no
        longer leads (the client refreshes its table and opens a stream at the new leader)."""
        cluster = self._broker.cluster
        if not s.led_here or cluster is None:
            return None
        for p in s.positions:
            try:
                cluster.check_leader(s.queue, p)
            except NotLeaderError as e:
                return e
            except HeadwaterError:  # the queue or the partition is gone: the read says so
                return None
        return None

    def _check_partitions(self, s: _Stream) -> None:
        now = time.monotonic()
        if s.info.partitions is not None or now < s.next_partitions_check:
            return
        s.next_partitions_check = now + _PARTITIONS_CHECK_S
        qi = self._store.describe_queue(s.queue)
        for pi in qi.partitions[len(s.positions) :]:
            s.positions[pi.partition] = s.info.checkpoint(pi.partition, pi.start_offset)

    async def _push_round(self, s: _Stream) -> bool:
        """One read of each partition with something new, pushed; whether anything went."""
        self._check_partitions(s)
        moved = self._moved_away(s)
        if moved is not None:
            raise moved
        parts = list(s.positions)
        if not parts:
            return False
        s.rotation = (s.rotation + 1) % len(parts)
        pushed = False
        for p in parts[s.rotation :] + parts[: s.rotation]:
            if s.ended or s.credit_messages <= 0 or s.credit_bytes <= 0:
                break
            pos = s.positions[p]
            if self._store.end_offset(s.queue, p) <= pos:
                continue
            want = max(1, min(s.credit_bytes, self.push_bytes_max, s.conn.conn.peer_frame_bytes_max - 4096))
            res = self._store.fetch(s.queue, p, pos, max_bytes=want, tag_mask=s.filter.mask if s.filter else 0)
            start = max(pos, res.start_offset)
            batches, selections, nxt = _within_credit(
                res.batches, s.filter, start, max(start, res.next_offset), s.credit_messages
            )
            if nxt == pos and not batches:
                continue
            messages, size = count_messages(batches, selections, start, nxt)
            await self._send(s, SubscriptionPush(s.sub_id, p, batches, nxt, res.end_offset, selections=selections))
            if self._broker.telemetry is not None:  # (the broker's metrics: messages out)
                self._broker.telemetry.sent(s.queue, messages, size)
            s.positions[p] = nxt
            s.credit_messages -= max(messages, 1)
            s.credit_bytes -= size
            pushed = True
        return pushed

    async def _send(self, s: _Stream, body: SubscriptionPush) -> None:
        st = s.conn
        chunks = st.conn.send_chunks(Push(body))
        async with st.write_lock:
            st.writer.writelines(chunks)
            await st.writer.drain()
        self.pushes += 1

    def has_stream(self, st: Any, sub_id: int) -> bool:
        """Whether connection ``st`` has a push stream ``sub_id`` open."""
        return sub_id in self._by_conn.get(st, {})

    def stats(self) -> dict[str, int]:
        return {"push_streams": len(self._by_name), "pushes_total": self.pushes}


def _within_credit(
    read: list, flt: TagFilter | None, start: int, nxt: int, credit_messages: int
) -> tuple[list, list[list[int]], int]:
    """The matching part of a read's stored batches, cut after the batch that uses up the
    message credit: (batches, selections, where the stream continues)."""
    batches: list = []
    offsets: list[list[int] | None] = []
    messages = 0
    for i, stored in enumerate(read):
        part, part_sel = select_batches([stored], flt, start_offset=start)
        batches += part
        offsets += part_sel or [None] * len(part)
        messages += count_messages(part, part_sel, start, nxt)[0]
        if messages >= credit_messages and i + 1 < len(read):
            nxt = decode_header(stored).end_offset  # the rest waits for more credit
            break
    if all(o is None for o in offsets):
        return batches, [], nxt
    return batches, [o or [] for o in offsets], nxt
