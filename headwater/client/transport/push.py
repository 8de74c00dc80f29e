"""Push streams of :class:`~headwater.client.transport.async_transport.AsyncTransport`: the
handlers that PUSH frames (a subscription's or a fetch stream's deliveries) are routed to by
stream id, and opening a stream (register the handler, then send the request)."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import Any

from headwater.client.transport.link import Sink
from headwater.protocol.messages import PushBody, RequestBody

__all__ = ["PushStreams"]


class PushStreams:
    """Push stream handlers, a part of ``AsyncTransport`` (its state is set up in
    ``AsyncTransport.__init__``)."""

    def register_push(self, handler: Callable[[PushBody | None], None], *, any_thread: bool = False) -> int:
        """A new stream id whose PUSH frames go to ``handler`` (None: the connection was lost),
        on the loop; with ``any_thread``, on whichever thread reads them (a caller that leads
        too), as they are parsed: the handler must then be quick and thread-safe. Thread-safe;
        a handler registered while no connection is up waits for the next one."""
        with self._lock:
            sid = self._next_stream_id
            while sid in self._push_handlers:
                sid = sid % (2**32 - 1) + 1
            self._next_stream_id = sid % (2**32 - 1) + 1
            self._push_handlers[sid] = handler
            if any_thread:
                self._push_anywhere.add(sid)
        return sid

    def unregister_push(self, stream_id: int) -> None:
        with self._lock:
            self._push_handlers.pop(stream_id, None)
            self._push_anywhere.discard(stream_id)

    def start_stream(
        self,
        request: Callable[[int], RequestBody],
        handler: Callable[[PushBody | None], None],
        sink: Sink,
        *,
        any_thread: bool = False,
    ) -> int:
        """Open a push stream without waiting (any thread): register ``handler`` under a new
        id, submit ``request(id)`` (SUBSCRIBE, FETCH_STREAM) with ``sink`` for the broker's
        answer, and return the id. The handler is dropped again if the answer is a failure."""
        sid = self.register_push(handler, any_thread=any_thread)
        sink.add_done_callback(functools.partial(self._stream_answered, sid))
        self.submit(request(sid), sink)
        return sid

    def _stream_answered(self, stream_id: int, sink: Sink) -> None:
        if sink.cancelled() or sink.exception() is not None:
            self.unregister_push(stream_id)

    async def open_stream(
        self,
        request: Callable[[int], RequestBody],
        handler: Callable[[PushBody | None], None],
        *,
        any_thread: bool = False,
    ) -> tuple[int, Any]:
        """:meth:`start_stream`, on the loop, and wait: the id and the answer's result."""
        fut = asyncio.get_running_loop().create_future()
        sid = self.start_stream(request, handler, fut, any_thread=any_thread)
        return sid, await fut
