"""A broker's client of another broker: a small blocking connection over the binary protocol,
to FETCH a partition's batches as they are stored (a move's target copies its source so, and
a follower will copy its leader so), to describe a queue, to take a moving partition's
delayed messages (HANDOFF_DELAYED), to PRODUCE a batch (a shared group's dead letters
for a partition another broker leads), and to ask a keyed group's coordinator for its state.

The broker does not use :mod:`headwater.client` (a layer above it): this is the sans-IO
:class:`~headwater.protocol.Connection` over one plain socket, one request at a time. Every
call has a deadline (``timeout_s``); a peer that does not answer in time, closes the
connection or breaks the protocol raises :class:`PeerError` (connect again), and
an error the peer answered is raised as the error it names (``NotLeaderError``, ...). After
a :class:`PeerError` the connection is closed: make a new :class:`PeerClient`.

Thread-safety: none; one client belongs to one thread.
"""

from __future__ import annotations

import socket
import time
from typing import Any

from headwater.model.config import QueueInfo
from headwater.model.delay import HandoffPage
from headwater.model.keyed import KeyedGroupInfo
from headwater.model.service import FetchResult, ProduceResult
from headwater.protocol import (
    CLIENT,
    NEED_DATA,
    Connection,
    ConnectionClosed,
    ErrorResponse,
    Handshake,
    HandshakeAccepted,
    ProtocolError,
    Request,
    Response,
)
from headwater.protocol.messages import (
    DescribeQueueRequest,
    EndSubscriberStreamsRequest,
    FetchRequest,
    HandoffDelayedRequest,
    KeyedGroupRequest,
    OffsetForTimeRequest,
    ProduceRequest,
)

__all__ = ["PeerClient", "PeerError"]

CONNECT_TIMEOUT_S = 5.0  # to open the connection and shake hands
REQUEST_TIMEOUT_S = 30.0  # for one answer beyond the wait the request asked the peer to hold it
RECEIVE_BYTES = 256 * 1024


class PeerError(ConnectionError):
    """The peer broker could not be reached, did not answer in time, or broke the protocol;
    the connection is closed: connect again (the peer may have moved or died). A broker's own
    trouble, never sent over the wire: not a :class:`~headwater.errors.HeadwaterError`,
    whose codes each name one class."""


class PeerClient:
    """A blocking connection to the broker at ``address`` (``host:port``), named ``name``
    in its handshake. For example (it needs a broker there)::

        peer = PeerClient("127.0.0.1:7071", name="broker-2")
        peer.fetch("orders", 0, 0, max_bytes=1 << 20, max_wait_ms=200).end_offset
    """

    def __init__(
        self,
        address: str,
        *,
        name: str = "headwater-peer",
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
    ) -> None:
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"a peer address is host:port, not {address!r}")
        self.address = address
        self._request_timeout_s = request_timeout_s
        self._conn = Connection(CLIENT)
        try:
            self._sock: socket.socket | None = socket.create_connection((host, int(port)), timeout=connect_timeout_s)
        except OSError as e:
            raise PeerError(f"broker {address} cannot be reached: {e}") from e
        try:
            self._sock.sendall(self._conn.send(Handshake(name)))
            accepted = self._next(time.monotonic() + connect_timeout_s)
        except BaseException:
            self.close()
            raise
        if not isinstance(accepted, HandshakeAccepted):
            self.close()
            raise PeerError(f"broker {address} refused the handshake: {accepted}")

    def close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()

    def __enter__(self) -> PeerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def fetch(self, queue: str, partition: int, offset: int, *, max_bytes: int, max_wait_ms: int = 0) -> FetchResult:
        """The stored batches of ``queue``'s ``partition`` from ``offset`` on (about
        ``max_bytes`` of them), waiting up to ``max_wait_ms`` for some to arrive."""
        result: FetchResult = self._call(
            FetchRequest(queue, partition, offset, max_bytes, max_wait_ms=max_wait_ms), max_wait_ms / 1000
        )
        return result

    def describe_queue(self, queue: str) -> QueueInfo:
        """The peer's own view of ``queue``: its partitions' start and end offsets there."""
        info: QueueInfo = self._call(DescribeQueueRequest(queue), 0.0)
        return info

    def offset_for_time(self, queue: str, partition: int, timestamp_ms: int) -> int:
        """The first offset of ``queue[partition]`` appended at or after ``timestamp_ms``,
        in the peer's log (its end when none is)."""
        offset: int = self._call(OffsetForTimeRequest(queue, partition, timestamp_ms), 0.0)
        return offset

    def keyed_group(self, queue: str, group: str) -> KeyedGroupInfo:
        """Keyed group (``queue``, ``group``)'s state, from its coordinator (KEYED_GROUP,
        a lookup: ``NotCoordinatorError`` from another broker)."""
        info: KeyedGroupInfo = self._call(KeyedGroupRequest(queue, group), 0.0)
        return info

    def hand_off_delayed(
        self, queue: str, partition: int, leader_epoch: int, after: int, max_bytes: int
    ) -> HandoffPage:
        """A page of the peer's delayed batches of a partition it fenced for the move planned
        at ``leader_epoch`` (HANDOFF_DELAYED; ``NotLeaderError`` until it has fenced)."""
        page: HandoffPage = self._call(HandoffDelayedRequest(queue, partition, leader_epoch, after, max_bytes), 0.0)
        return page

    def hand_off_shared(self, queue: str, partition: int, leader_epoch: int, after: int, max_bytes: int) -> HandoffPage:
        """A page of the peer's shared groups' state of a partition it fenced for the move
        planned at ``leader_epoch``, from the group after index ``after`` (HANDOFF_DELAYED
        with ``shared``; ``NotLeaderError`` until it has fenced)."""
        req = HandoffDelayedRequest(queue, partition, leader_epoch, after, max_bytes, shared=True)
        page: HandoffPage = self._call(req, 0.0)
        return page

    def hand_off_groups(self, queue: str, partition: int, leader_epoch: int, after: int, max_bytes: int) -> HandoffPage:
        """A page of the membership of the consumer groups of a coordinator queue's partition
        the peer fenced for the move planned at ``leader_epoch``, from the group after index
        ``after`` (HANDOFF_DELAYED with ``groups``; ``NotLeaderError`` until it has fenced)."""
        req = HandoffDelayedRequest(queue, partition, leader_epoch, after, max_bytes, groups=True)
        page: HandoffPage = self._call(req, 0.0)
        return page

    def produce(self, queue: str, partition: int, batch: bytes) -> ProduceResult:
        """Append one record batch to ``queue``'s ``partition`` at the peer (its leader),
        answered once the peer's flush policy made it durable (a shared group's dead
        letters for a dead-letter partition another broker leads)."""
        result: ProduceResult = self._call(ProduceRequest(queue, partition, batch), 0.0)
        return result

    def end_subscriber_streams(self, queue: str, name: str, epoch: int, deleted: bool) -> None:
        """End the peer's push stream of subscriber (``queue``, ``name``) if older than
        ``epoch``, or in any case when ``deleted`` (END_SUBSCRIBER_STREAMS, from its
        coordinator)."""
        self._call(EndSubscriberStreamsRequest(queue, name, epoch, deleted), 0.0)

    def _call(self, body: Any, held_s: float) -> Any:
        if self._sock is None:
            raise PeerError(f"the connection to broker {self.address} is closed: connect again")
        try:
            rid = self._conn.next_request_id()
            self._sock.sendall(self._conn.send(Request(rid, body)))
            event = self._next(time.monotonic() + held_s + self._request_timeout_s)
        except BaseException:
            self.close()
            raise
        if isinstance(event, ErrorResponse):
            if event.request_id == 0:
                self.close()
            raise event.exception()
        if not isinstance(event, Response) or event.request_id != rid:
            self.close()
            raise PeerError(f"broker {self.address} answered {type(event).__name__} to request {rid}")
        return event.result()

    def _next(self, deadline: float) -> object:
        """The next event, reading until ``deadline``."""
        assert self._sock is not None
        try:
            while (event := self._conn.next_event()) is NEED_DATA:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise PeerError(f"broker {self.address} did not answer in time")
                self._sock.settimeout(left)
                data = self._sock.recv(RECEIVE_BYTES)
                self._conn.receive_data(data)
                if not data:
                    continue  # the connection's EOF event comes next
        except ProtocolError as e:
            raise PeerError(f"broker {self.address} broke the protocol: {e}") from e
        except TimeoutError as e:
            raise PeerError(f"broker {self.address} did not answer in time") from e
        except OSError as e:
            raise PeerError(f"the connection to broker {self.address} failed: {e}") from e
        if isinstance(event, ConnectionClosed):
            raise PeerError(f"broker {self.address} closed the connection")
        return event
