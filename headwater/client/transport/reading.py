"""How :class:`~headwater.client.transport.async_transport.AsyncTransport` reads its connection:
the loop's reader, parsing frames into outcomes under the lock, and when the loop's reader
stands aside for a thread that reads for itself (:mod:`.leading`) and takes over again."""

from __future__ import annotations

import logging
import time

from headwater.client.transport.link import _call_push_handler, _deliver, _Link, _LinkLost, _stream_of
from headwater.errors import UnavailableError
from headwater.protocol import NEED_DATA, ErrorResponse, ProtocolError, Push, Response

__all__ = ["READ_BYTES", "Reading"]

log = logging.getLogger("headwater.client")

#: Bytes asked of each recv(). Kept under glibc's mmap threshold (128 KiB): a bigger
#: buffer makes every read, however small, map fresh pages (15 µs a read instead of 3).
READ_BYTES = 64 * 1024


class Reading:
    """Reading the connection, a part of ``AsyncTransport`` (its state is set up in
    ``AsyncTransport.__init__``)."""

    def _readable(self, link: _Link) -> None:
        if not link.accepted.done():
            got = self._recv(link)
            if isinstance(got, BaseException):
                self._drop(link, got)
            elif got is not None:
                self._handshake(link, got)
            return
        outcomes: list = []
        with self._lock:
            if link.lost:
                return
            if self._leader is not None:  # a caller reads for itself: stand aside until it is done
                self._stand_aside_locked(link)
                return
            got = self._recv(link)
            if got is None:  # nothing to read: a leader took it
                if not self._loop_needed_locked(link):  # and nobody waits for more
                    self._stand_aside_locked(link)
                return
            why = got if isinstance(got, BaseException) else self._parse_locked(link, got, outcomes)
            if self._undelivered:  # a thread read frames before these, not delivered yet: they go first
                self._undelivered.extend(outcomes)
                outcomes = self._take_undelivered_locked()
        _deliver(outcomes, self._push_handlers)
        if why is not None:
            self._drop(link, why)

    def _recv(self, link: _Link) -> bytes | BaseException | None:
        """What the socket holds (b"" at EOF: the connection then says how it ended), the
        error that lost the connection, or None when there is nothing to read yet."""
        try:
            data = link.sock.recv(READ_BYTES)
        except (BlockingIOError, InterruptedError):
            link.read_at = time.monotonic()
            return None
        except OSError as e:
            return UnavailableError(f"the connection to {self.address} was lost: {e}")
        link.read_at = time.monotonic()
        return data

    def _read_locked(self, link: _Link, outcomes: list) -> BaseException | None:
        """Read what the socket holds, if anything, and parse it (see :meth:`_parse_locked`)."""
        got = self._recv(link)
        if got is None or isinstance(got, BaseException):
            return got
        return self._parse_locked(link, got, outcomes)

    def _parse_locked(self, link: _Link, data: bytes, outcomes: list) -> BaseException | None:
        """Parse ``data`` into ``outcomes`` (then write what the backlog may now send); the
        reason to drop the connection, if it must go.

        The answer of a call whose caller leads is settled here, under the lock, whoever
        reads it: a caller that takes the lead after this sees its answer, instead of
        blocking in poll() on a socket already read (so a led sink takes no callbacks)."""
        why: BaseException | None = None
        conn = link.conn
        pending = link.pending
        unframed = conn.unframed
        try:
            conn.receive_data(data)
            while True:
                ev = conn.next_event()
                if ev is NEED_DATA:
                    break
                cls = type(ev)
                if cls is Response or cls is ErrorResponse:
                    call = pending.pop(ev.request_id, None)
                    if call is not None:  # else it timed out: the answer came too late
                        if call.lead:
                            _deliver([(call.sink, ev)])
                        else:
                            outcomes.append((call.sink, ev))
                    elif ev.request_id == 0:  # the broker's last word before it closes
                        why = UnavailableError(f"the broker closed the connection: {ev.message}")
                        break
                elif cls is Push:
                    body = ev.body
                    sid = _stream_of(body)
                    if sid in self._push_anywhere:  # handled on this thread, as it comes
                        handler = self._push_handlers.get(sid)
                        if handler is not None:
                            _call_push_handler(handler, body)
                    else:
                        outcomes.append((None, body))
                else:  # ConnectionClosed
                    why = UnavailableError(f"the connection to {self.address} was lost")
                    break
                if not unframed and not conn.ended:  # all read: skip the call that says NEED_DATA
                    break
        except ProtocolError as e:
            why = UnavailableError(f"protocol error from {self.address}: {e}")
            log.warning("%s", why)
        if why is None and self._backlog and self._link is link:
            self._drain_locked(link, outcomes)
        return why

    def _loop_needed_locked(self, link: _Link) -> bool:
        """Whether anyone waits for what the connection brings. Once no thread leads, that
        includes callers who meant to lead but found another thread leading: they wait on
        their sinks, and only the loop would read their answers. Streams whose pushes any
        thread may take (a consumer's fetch streams) do not count: their consumer reads them
        when it polls, and until then they wait in the socket (their credit bounds them)."""
        return bool(link.pending or self._backlog or len(self._push_handlers) > len(self._push_anywhere))

    def _stand_aside_locked(self, link: _Link) -> None:
        """The loop stops reading ``link`` (on the loop): its callers read for themselves."""
        assert self._loop is not None
        self._loop.remove_reader(link.fd)
        link.paused = True

    def _resume_reading_locked(self, link: _Link) -> None:
        """Have the loop read ``link`` again (its reader stood aside for a leader)."""
        link.paused = False
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._resume_reading, link)

    def _resume_reading(self, link: _Link) -> None:
        if not link.lost:
            assert self._loop is not None
            self._loop.add_reader(link.fd, self._readable, link)

    def _check_unread_locked(self, link: _Link, outcomes: list) -> _Link | None:
        """``link`` went unread since its last leader: read what came meanwhile, so a broker
        that closed the connection is seen before a request is written to it. The link to
        write to: ``link``, or None when it is gone (the request then waits for the next)."""
        why = self._read_locked(link, outcomes)
        if why is None:
            return link
        self._lose_locked(link, why)
        if self._link is link:  # its push streams end with it (_drop will not see it current)
            self._link = None
            handlers, self._push_handlers = self._push_handlers, {}
            self._push_anywhere = set()
            for handler in handlers.values():
                outcomes.append((None, _LinkLost(handler)))
        return None

    def _lose_locked(self, link: _Link, why: BaseException) -> None:
        """A thread other than the loop found ``link`` gone: write nothing more to it, and
        have the loop drop it."""
        link.broken = True
        if link.why is None:
            link.why = why
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._drop, link, why)

    def _take_undelivered_locked(self) -> list:
        outcomes = list(self._undelivered)
        self._undelivered.clear()
        return outcomes

    def _deliver_read(self) -> None:
        """Deliver, on the loop, what other threads read (in the order they read it)."""
        with self._lock:
            outcomes = self._take_undelivered_locked()
        _deliver(outcomes, self._push_handlers)
