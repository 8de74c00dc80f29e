"""The broker's bounded spin before its loop blocks (``idle_spin_us``).

After the loop has served what a connection sent, it usually waits in ``epoll_wait`` for the
next request, and its CPU halts. On a VM without guest halt polling, waking a halted vCPU
costs tens of µs on both sides: the client's ``sendmsg`` pays for the wake-up, then the
broker's answer waits for its CPU to come back. A client calling ``send_and_wait`` in a loop
sends its next request some 50 µs after its answer, so the broker instead polls every client
socket without blocking for up to ``idle_spin_us`` (default 100) first; the spin ends as soon
as any socket has bytes, and the loop then reads them at once. See docs/design/client.md,
"The broker spins too".

A spin pays only while it finds a request. Like the client's spin
(:mod:`headwater.client.transport.leading`), the broker's backs off by a
:class:`~headwater.model.spinning.SpinGate`: below a quarter of spins finding a request
(requests further apart than a spin, as at a steady 2,000 msgs/s, or a busy machine) the
next ``SPIN_PAUSE_SERVES`` serves do not spin, and then one spin looks again. While it
spins the loop runs nothing else, so a timer or a hand-off from another thread waits at most
one spin, and the loop does not spin at all while its own work runs on other threads (a big
batch decoded off the loop, a scan on a worker, a sync flush's acknowledgement): those
threads need the interpreter the spin holds. Requests on any connection end a spin at once.

>>> spin = IdleSpin(0)
>>> spin.enabled
False
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from headwater.model.spinning import SpinGate

__all__ = [
    "IDLE_SPIN_US_DEFAULT",
    "IDLE_SPIN_US_MAX",
    "SPIN_PAUSE_SERVES",
    "CountedExecutor",
    "IdleSpin",
    "transport_fd",
]

#: The spin's default length: a Python client's turn between an answer and its next request
#: (encode, hand back, call again) takes 40-80 µs on a 2 GHz core.
IDLE_SPIN_US_DEFAULT = 100
#: The longest spin accepted: everything else the loop does may wait one spin.
IDLE_SPIN_US_MAX = 1000
SPIN_PAUSE_SERVES = 64  # serves without a spin once spins stop finding requests


class IdleSpin:
    """The spin of one server's loop: the sockets it watches and whether spins pay."""

    def __init__(self, spin_us: int, others_busy: Callable[[], bool] = lambda: False) -> None:
        """``others_busy``: whether work of the loop's runs on other threads now (no spin then)."""
        self._spin_ns = spin_us * 1000
        self._others_busy = others_busy
        self.enabled = spin_us > 0
        self._poller = select.epoll() if self.enabled else None
        self._watched: dict[int, object] = {}  # fd -> the connection it belongs to
        self._fds: dict[object, int] = {}  # and back: a closed transport no longer tells its fd
        self._scheduled = False
        self.gate = SpinGate(SPIN_PAUSE_SERVES)
        self.spins = 0
        self.hits = 0

    def watch(self, fd: int, owner: object) -> None:
        """Let a request on ``fd`` (a client's socket) end a spin."""
        if self._poller is None or fd < 0:
            return
        try:
            self._poller.register(fd, select.EPOLLIN)
        except FileExistsError:  # a closed socket's number, taken again before it was forgotten
            self._poller.modify(fd, select.EPOLLIN)
        except OSError:  # closed already: nothing to watch
            return
        self._watched[fd] = owner
        self._fds[owner] = fd

    def forget(self, owner: object) -> None:
        """Stop watching ``owner``'s socket, unless its number is another's by now (reused)."""
        fd = self._fds.pop(owner, None)
        if fd is None or self._poller is None or self._watched.get(fd) is not owner:
            return
        del self._watched[fd]
        with contextlib.suppress(OSError):  # closed: the kernel forgot it already
            self._poller.unregister(fd)

    def after_serve(self, loop: asyncio.AbstractEventLoop) -> None:
        """The loop served what came in: spin once, after the callbacks already queued."""
        if not self._scheduled and self._poller is not None:
            self._scheduled = True
            loop.call_soon(self._spin)

    def _spin(self) -> None:
        self._scheduled = False
        if not self.gate.may_spin():
            return
        poller = self._poller
        if poller is None or self._others_busy():
            return
        poll = poller.poll
        now = time.perf_counter_ns
        until = now() + self._spin_ns
        ready = poll(0)
        yield_ = os.sched_yield
        while not ready and now() < until:  # no Python call but these: the GIL is dropped in poll
            yield_()  # another process runnable on this CPU runs first: the spin takes only idle time
            ready = poll(0)
        self.spins += 1
        if ready:
            self.hits += 1
        self.gate.spun(bool(ready))

    def close(self) -> None:
        poller, self._poller = self._poller, None
        self.enabled = False
        self._watched.clear()
        self._fds.clear()
        if poller is not None:
            poller.close()


class CountedExecutor(ThreadPoolExecutor):
    """A thread pool that knows how many of its jobs are submitted and not finished (``busy``)."""

    def __init__(self, max_workers: int, thread_name_prefix: str) -> None:
        super().__init__(max_workers, thread_name_prefix=thread_name_prefix)
        self._busy_lock = threading.Lock()
        self.busy = 0

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        with self._busy_lock:
            self.busy += 1
        try:
            fut = super().submit(fn, *args, **kwargs)
        except BaseException:
            self._finished()
            raise
        fut.add_done_callback(self._finished)
        return fut

    def _finished(self, _: object = None) -> None:
        with self._busy_lock:
            self.busy -= 1


def transport_fd(transport: asyncio.BaseTransport) -> int:
    """The socket number of a connection's transport; -1 when it has none (closed)."""
    sock = transport.get_extra_info("socket")
    try:
        return -1 if sock is None else int(sock.fileno())
    except (OSError, ValueError):
        return -1
