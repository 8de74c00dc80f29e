"""FetchStreams: a consumer's partitions pushed as they grow (FETCH_STREAM; docs/protocol.md 7.5.5).

A pulling consumer sends a FETCH, gets the answer, sends the next FETCH: at a steady trickle
that is one more request per message for the broker to read, parse and park, and one more
write for the consumer. A fetch stream turns the loop around. The client opens it over some
partitions of a queue at positions it chose; each partition is then parked like a
long-polling FETCH (in the server's partition waiters), and an append to it pushes the new
batches right there, on the loop, in the appending connection's turn, then parks it again
at its new position. The broker keeps the positions; the client keeps its own copy (what it
commits) and opens a new stream to move them.

Flow control: a stream pushes while it has **byte credit** (granted at open and by
STREAM_CREDIT as the client hands records to its application; a push may overshoot by one
batch) and while its connection's peer takes what is written: once the transport holds
unsent bytes (``write_paused``) the stream's partitions wait, and ``resumed`` (from
``resume_writing``) pushes again. So what a connection's streams hold on the broker is at most
one push per partition beyond what the peer has taken. A partition that is far behind is
pushed in reads of at most ``push_bytes_max``, and gives the loop back between them.

A stream ends with CLOSE_STREAM, with its connection, or with a last PUSH saying why: its
queue was deleted or disabled (checked every second while streams are open), a read failed,
or the broker is stopping. On a cluster a member streams only the partitions it leads: it
refuses to open a stream naming another (NotLeaderError, naming the leader, as a FETCH is
refused), and ends one with NotLeaderError once a partition it carries moved away (checked
with the queues), so the client asks for the routing table again and opens a stream at the
new leader from its positions. A stream over a disabled queue is refused (QueueDisabledError, as
a FETCH is). A partition whose position is past its end (the queue was created again, or
the client asked for it) gets one empty push saying where it ends (``end_offset`` below
``next_offset``), so the client can move it rather than wait for offsets that would skip
everything before them; then it is parked there like any other.

Thread-safety: everything runs on the server's event loop (appends from other threads reach
the partition waiters with ``call_soon_threadsafe``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from headwater.errors import (
    HeadwaterError,
    InvalidArgumentError,
    NotLeaderError,
    PartitionOutOfRangeError,
    QueueDisabledError,
    QueueNotFoundError,
    SubscriberNotFoundError,
    UnavailableError,
    UsageError,
)
from headwater.protocol import ProtocolError, Push
from headwater.protocol.messages import (
    ApiKey,
    CloseStreamRequest,
    CloseStreamResponse,
    FetchStreamRequest,
    FetchStreamResponse,
    RequestBody,
    ResponseBody,
    StreamCreditRequest,
    StreamCreditResponse,
    StreamPush,
)

__all__ = ["FetchStreams", "FETCH_STREAM_APIS", "CREDIT_BYTES_MAX"]

log = logging.getLogger("headwater.streams")

#: The requests :meth:`FetchStreams.serve` answers.
FETCH_STREAM_APIS = frozenset({ApiKey.FETCH_STREAM, ApiKey.STREAM_CREDIT, ApiKey.CLOSE_STREAM})
#: The most credit a stream holds, whatever the client grants.
CREDIT_BYTES_MAX = 1 << 30
_QUEUE_CHECK_S = 1.0  # how often open streams look whether their queue is still there


class _Part:
    """One partition of a stream: parked with the server's partition waiters until an
    append passes ``offset`` (then :meth:`wake` pushes)."""

    __slots__ = ("stream", "partition", "offset", "parked")

    def __init__(self, stream: _Stream, partition: int, offset: int) -> None:
        self.stream = stream
        self.partition = partition
        self.offset = offset
        self.parked = False

    def wake(self) -> None:
        """Records came past the offset it is parked at (``server.Waiters._wake``), or the
        server stops (an empty read then parks it again)."""
        self.parked = False
        self.stream.owner._pump(self, known_more=True)


class _Stream:
    __slots__ = (
        "owner",
        "sid",
        "st",
        "queue",
        "queue_id",
        "parts",
        "credit",
        "tag_mask",
        "push_max",
        "waiting",
        "ended",
    )

    def __init__(
        self,
        owner: FetchStreams,
        sid: int,
        st: Any,
        queue: str,
        queue_id: int,
        credit: int,
        tag_mask: int,
        push_max: int,
    ) -> None:
        self.owner = owner
        self.sid = sid
        self.st = st  # the server's ClientConnection
        self.queue = queue
        self.queue_id = queue_id
        self.parts: list[_Part] = []
        self.credit = credit
        self.tag_mask = tag_mask
        self.push_max = push_max
        # partitions held back by credit or a paused peer, in turn (a set: a stream of
        # 10,000 partitions holds each back in constant time)
        self.waiting: dict[_Part, None] = {}
        self.ended = False


class FetchStreams:
    """The fetch streams of every connection of one server. Create it on the server's loop.

    ``waiters`` is the server's partition waiters (``park``/``discard``); ``taken(st, sid)``
    says whether a push stream of another kind already uses that id on the connection."""

    def __init__(
        self,
        store: Any,
        waiters: Any,
        *,
        push_bytes_max: int = 1 << 20,
        streams_per_connection_max: int = 64,
        taken: Any = lambda st, sid: False,
    ) -> None:
        self._store = store
        self._waiters = waiters
        self._loop = asyncio.get_running_loop()
        self.push_bytes_max = push_bytes_max
        self.streams_per_connection_max = streams_per_connection_max
        self._taken = taken
        self._by_conn: dict[Any, dict[int, _Stream]] = {}
        self._check: asyncio.TimerHandle | None = None
        self._stopping = False
        self.pushes = 0
        # on_pushed(queue, batches, lo, hi): batches pushed whose messages [lo, hi) the reader
        # takes (the broker's metrics count them); None: not counted
        self.on_pushed: Any = None

    def has_streams(self, st: Any) -> bool:
        return st in self._by_conn

    def has_stream(self, st: Any, sid: int) -> bool:
        return sid in self._by_conn.get(st, {})

    # -- requests --------------------------------------------------------------------------

    def serve(self, st: Any, body: RequestBody) -> ResponseBody:
        """Answer FETCH_STREAM, STREAM_CREDIT or CLOSE_STREAM from connection ``st`` (raises
        a HeadwaterError to refuse)."""
        if type(body) is StreamCreditRequest:
            s = self._by_conn.get(st, {}).get(body.stream_id)
            if s is None:
                raise SubscriberNotFoundError(
                    f"no fetch stream {body.stream_id} is open on this connection (it ended, or was never opened)"
                )
            s.credit = min(s.credit + body.credit_bytes, CREDIT_BYTES_MAX)
            self._loop.call_soon(self._resume, s)  # after this answer
            return StreamCreditResponse()
        if type(body) is CloseStreamRequest:
            s = self._by_conn.get(st, {}).get(body.stream_id)
            if s is not None:
                self._forget(s)
            return CloseStreamResponse()
        assert type(body) is FetchStreamRequest
        return self._open(st, body)

    def _open(self, st: Any, req: FetchStreamRequest) -> ResponseBody:
        streams = self._by_conn.get(st, {})
        if req.stream_id in streams or self._taken(st, req.stream_id):
            raise InvalidArgumentError(f"stream {req.stream_id} is already open on this connection")
        if len(streams) >= self.streams_per_connection_max:
            raise UsageError(
                f"{len(streams)} fetch streams are open on this connection, the most allowed "
                f"(setting push_streams_max); close one or use another connection"
            )
        if not req.credit_bytes:
            raise InvalidArgumentError("a fetch stream needs some credit: credit_bytes > 0")
        if not req.positions:
            raise InvalidArgumentError("a fetch stream needs at least one partition in positions")
        if self._stopping:
            raise UnavailableError("the broker is stopping; open the stream again when it is back")
        info = self._store.describe_queue(req.queue)  # QueueNotFoundError
        if not info.enabled:  # else it would only park: a FETCH there raises this, so does the stream
            raise QueueDisabledError(f"queue {req.queue!r} is disabled; enable it to read or write")
        for p, offset in req.positions.items():
            if not 0 <= p < len(info.partitions):
                raise PartitionOutOfRangeError(
                    f"queue {req.queue!r} has partitions 0-{len(info.partitions) - 1}, not {p}"
                )
            if offset < 0:
                raise InvalidArgumentError(f"the position of partition {p} is {offset}: offsets are >= 0")
        cluster = _cluster_of(st)
        if cluster is not None:  # a member pushes only what it leads, as it answers a FETCH
            for p in req.positions:
                cluster.check_leader(req.queue, p)  # NotLeaderError names the leader
        push_max = max(1, min(req.push_bytes_max or self.push_bytes_max, self.push_bytes_max))
        s = _Stream(
            self,
            req.stream_id,
            st,
            req.queue,
            info.queue_id,
            min(req.credit_bytes, CREDIT_BYTES_MAX),
            req.tag_mask,
            push_max,
        )
        s.parts = [_Part(s, p, offset) for p, offset in sorted(req.positions.items())]
        self._by_conn.setdefault(st, {})[s.sid] = s
        s.waiting = dict.fromkeys(s.parts)
        self._loop.call_soon(self._resume, s)  # pushes follow the answer
        if self._check is None:
            self._check = self._loop.call_later(_QUEUE_CHECK_S, self._check_queues)
        return FetchStreamResponse()

    # -- pushing ---------------------------------------------------------------------------

    def _resume(self, s: _Stream) -> None:
        """Push the partitions held back (credit came, the peer took its bytes, or new)."""
        waiting, s.waiting = s.waiting, {}
        for p in waiting:
            self._pump(p)

    def resumed(self, st: Any) -> None:
        """Connection ``st`` sent everything written: its waiting streams go on."""
        for s in list(self._by_conn.get(st, {}).values()):
            if s.waiting and s.credit > 0:
                self._resume(s)

    def _pump(self, p: _Part, known_more: bool = False) -> None:
        """Push what partition ``p`` has past its position, then park it; or hold it back.
        ``known_more``: the caller knows the partition ends past ``p.offset`` (woken by an
        append), so it reads without asking for the end first."""
        s = p.stream
        if s.ended or p.parked:
            return
        st = s.st
        if st.lost or st.closing:
            self._forget(s)
            return
        if s.credit <= 0 or st.write_paused:
            s.waiting[p] = None
            return
        store = self._store
        try:
            past_end = False
            if not known_more:
                end = store.end_offset(s.queue, p.partition)
                # at the end: wait for an append. Past it (the queue was created again, or the
                # client seeked there): tell the client, with a read there, which finds nothing
                # and says where the partition ends; it moves the position (a new stream)
                past_end = end < p.offset
                if end == p.offset:
                    self._park(p)
                    return
            want = max(1, min(s.credit, s.push_max, st.conn.peer_frame_bytes_max - 4096))
            res = store.fetch(s.queue, p.partition, p.offset, max_bytes=want, tag_mask=s.tag_mask)
        except HeadwaterError as e:
            self._end(s, e)
            return
        except Exception as e:  # noqa: BLE001 - a bug ends this stream, not the server
            log.exception("fetch stream %d of %s on queue %r failed", s.sid, st.peer, s.queue)
            self._end(s, UnavailableError(f"internal error in the broker's fetch stream: {e}; open it again"))
            return
        nxt = max(p.offset, res.next_offset)
        moved = bool(res.batches) or nxt != p.offset
        if moved or (past_end and res.end_offset < p.offset):
            push = StreamPush(s.sid, p.partition, res.batches, nxt, res.start_offset, res.end_offset)
            try:
                st.send(st.conn.send_chunks(Push(push)))
            except (ConnectionError, ProtocolError):
                self._forget(s)
                return
            self.pushes += 1
            if self.on_pushed is not None:
                self.on_pushed(s.queue, res.batches, p.offset, nxt)
            p.offset = nxt
            s.credit -= sum(map(len, res.batches))
        if moved and nxt < res.end_offset:  # more to read: after the others had their turn
            self._loop.call_soon(self._pump, p)
        else:  # (a read that moved nothing waits for the next append, rather than spinning)
            self._park(p, recheck=moved)

    def _park(self, p: _Part, recheck: bool = True) -> None:
        s = p.stream
        p.parked = True
        self._waiters.park(s.queue, p.partition, p.offset, p)
        # an append from another thread (a delayed message) notifies only registered
        # waiters: one that landed between the read and the registration must not be missed
        if recheck and self._store.end_offset(s.queue, p.partition) > p.offset:
            self._waiters.discard(s.queue, p.partition, p)
            p.parked = False
            self._loop.call_soon(self._pump, p)

    # -- ending ----------------------------------------------------------------------------

    def _forget(self, s: _Stream) -> None:
        if s.ended:
            return
        s.ended = True
        for p in s.parts:
            if p.parked:
                self._waiters.discard(s.queue, p.partition, p)
                p.parked = False
        s.waiting = {}
        streams = self._by_conn.get(s.st)
        if streams is not None and streams.get(s.sid) is s:
            del streams[s.sid]
            if not streams:
                del self._by_conn[s.st]

    def _end(self, s: _Stream, reason: HeadwaterError) -> None:
        """End a stream, telling its client why in a last PUSH."""
        if s.ended:
            return
        self._forget(s)
        st = s.st
        if st.lost or st.closing:
            return
        last = StreamPush(s.sid, 0, [], 0, 0, 0, ended=str(reason) or type(reason).__name__, ended_code=reason.code)
        try:
            st.send(st.conn.send_chunks(Push(last)))
        except (ConnectionError, ProtocolError):
            pass

    def connection_closed(self, st: Any) -> None:
        """The connection is gone: its streams end (nobody is left to tell)."""
        for s in list(self._by_conn.get(st, {}).values()):
            self._forget(s)

    def stop(self) -> None:
        """End every stream (the server is stopping); each client hears why."""
        self._stopping = True
        if self._check is not None:
            self._check.cancel()
            self._check = None
        for streams in list(self._by_conn.values()):
            for s in list(streams.values()):
                self._end(s, UnavailableError("the broker is stopping; open the stream again when it is back"))

    def _check_queues(self) -> None:
        """End the streams whose queue was deleted or disabled (a parked partition of a
        deleted queue is never woken by an append; one of a disabled queue only by an
        append the queue refuses), or, on a cluster, one of whose partitions moved away."""
        self._check = None
        if not self._by_conn:
            return
        ids: dict[str, tuple[int, bool] | HeadwaterError] = {}  # each queue looked up once: (id, enabled)
        for streams in list(self._by_conn.values()):
            for s in list(streams.values()):
                if s.queue not in ids:
                    try:
                        info = self._store.describe_queue(s.queue)
                        ids[s.queue] = (info.queue_id, info.enabled)
                    except HeadwaterError as e:
                        ids[s.queue] = e
                got = ids[s.queue]
                if isinstance(got, HeadwaterError):
                    self._end(s, got)
                elif got[0] != s.queue_id:
                    self._end(s, QueueNotFoundError(f"queue {s.queue!r} was deleted (and created again)"))
                elif not got[1]:  # disabled while streamed: as a FETCH would be refused
                    self._end(s, QueueDisabledError(f"queue {s.queue!r} is disabled; enable it to read or write"))
                else:
                    moved = _moved_away(s)
                    if moved is not None:  # the client asks for the table again and streams from the new leader
                        self._end(s, moved)
        if self._by_conn and not self._stopping:
            self._check = self._loop.call_later(_QUEUE_CHECK_S, self._check_queues)

    def stats(self) -> dict[str, int]:
        return {"fetch_streams": sum(len(v) for v in self._by_conn.values()), "stream_pushes_total": self.pushes}


def _cluster_of(st: Any) -> Any:
    """The cluster role of the broker serving connection ``st``, or None for a broker alone.
    Found through the connection's server (``st.host.broker``): the streams are made before
    the broker joins its cluster, and a role comes and goes with ZooKeeper."""
    broker = getattr(getattr(st, "host", None), "broker", None)
    return getattr(broker, "cluster", None)


def _moved_away(s: _Stream) -> NotLeaderError | None:
    """For a stream served by a cluster's member, the refusal of a partition it pushes that
    this broker no longer leads (a move, a decommission, a failover); else None."""
    cluster = _cluster_of(s.st)
    if cluster is None:
        return None
    for p in s.parts:
        try:
            cluster.check_leader(s.queue, p.partition)
        except NotLeaderError as e:
            return e
        except HeadwaterError:  # the queue or the partition is gone: the queue check says so
            return None
    return None
