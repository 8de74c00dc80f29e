"""The lead/thread hand-off of :class:`~headwater.client.transport.async_transport.AsyncTransport`:
a blocking caller about to wait for its own answers reads the connection on its own thread
(``lead``), one thread at a time, so its answer costs no wake-up of the loop and no hand-off
back to it. See the module docstring of ``async_transport`` ("Reading") for the rules."""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import select
import socket
import threading
import time

from headwater.client.transport.link import _Link
from headwater.client.transport.reading import READ_BYTES
from headwater.errors import InvalidArgumentError, UnavailableError

__all__ = [
    "LEAD_SLICE_S",
    "LEAD_SPIN_US_DEFAULT",
    "SPIN_PAUSE_LEADS",
    "Leading",
    "check_lead_spin_us",
    "default_lead_spin_us",
]

#: The longest a leading caller blocks in poll() before it looks at its answers again. The
#: loop wakes a leader when it fails a call (a deadline, a lost connection), and so does a
#: caller's ``interrupt``; this bounds the wait for anything else that settles an answer.
LEAD_SLICE_S = 0.25
#: How long a leading caller polls its socket without blocking before it blocks in poll().
#: A caller that blocks lets its vCPU halt, and on a VM without guest halt polling waking it
#: costs tens of µs; an answer that comes within the spin costs none (see
#: docs/design/client.md, "One message, one round trip"). 0 disables the spin. The
#: environment variable ``HEADWATER_LEAD_SPIN_US`` overrides it for every client made after.
LEAD_SPIN_US_DEFAULT = 100
#: The longest spin accepted: past it a caller burns a CPU for little.
LEAD_SPIN_US_MAX = 10_000
#: Leads that block at once when spins stop finding their answers (a broker further away
#: than a spin reaches, a machine too busy to answer that soon: spinning would only burn CPU
#: the broker or the application could use); then a spin looks again
#: (:class:`~headwater.model.spinning.SpinGate`).
SPIN_PAUSE_LEADS = 64


def check_lead_spin_us(lead_spin_us: object) -> int:
    """``lead_spin_us`` checked: an int from 0 (no spin) to ``LEAD_SPIN_US_MAX``."""
    if type(lead_spin_us) is not int or not 0 <= lead_spin_us <= LEAD_SPIN_US_MAX:
        raise InvalidArgumentError(
            f"lead_spin_us must be a whole number of microseconds from 0 (no spin) to {LEAD_SPIN_US_MAX}, "
            f"got {lead_spin_us!r}"
        )
    return lead_spin_us


def default_lead_spin_us() -> int:
    """``HEADWATER_LEAD_SPIN_US`` from the environment if set, else ``LEAD_SPIN_US_DEFAULT``."""
    raw = os.environ.get("HEADWATER_LEAD_SPIN_US", "").strip()
    if not raw:
        return LEAD_SPIN_US_DEFAULT
    try:
        return check_lead_spin_us(int(raw))
    except (ValueError, InvalidArgumentError):
        raise InvalidArgumentError(
            f"HEADWATER_LEAD_SPIN_US must be a whole number of microseconds from 0 (no spin) to "
            f"{LEAD_SPIN_US_MAX}, got {raw!r}: fix or unset it"
        ) from None


class Leading:
    """A thread reading for itself, a part of ``AsyncTransport`` (its state is set up in
    ``AsyncTransport.__init__``)."""

    def lead(
        self, sinks: list, timeout_s: float | None = None, *, interrupt: concurrent.futures.Future | None = None
    ) -> concurrent.futures.Future | None:
        """Read the connection on this thread until one of ``sinks`` is done or ``timeout_s``
        passes (None: no limit; 0: read what is there, without blocking), if nobody else
        reads it; return at once otherwise. Either way the caller then waits on its sinks
        as usual: what this thread did not read, the loop or the current leader does.

        Returns None, or, when another thread leads, a future done once that thread stops
        leading: a caller whose sinks nobody else reads for (a fetch stream's pushes) waits
        on it too, and leads then (see ``polling.wait_any``).

        ``interrupt``: a future another thread completes to end the wait at once (a group
        consumer's new assignment); it is one of ``sinks`` too."""
        me = threading.get_ident()
        with self._lock:
            link = self._link
            if link is None or self._closed or me == self._loop_thread or self._leader == me:
                return None
            if self._leader is not None:  # another thread reads: the caller may lead once it stops
                if self._lead_free is None:
                    self._lead_free = concurrent.futures.Future()
                return self._lead_free
            if link.lost or link.broken:
                return None
            self._leader = me
            if self._wake_pair is None:
                self._wake_pair = socket.socketpair()
                for end in self._wake_pair:
                    end.setblocking(False)
        if interrupt is not None:
            interrupt.add_done_callback(self._poke_leader)
        try:
            self._lead(link, sinks, timeout_s)
        finally:
            with self._lock:
                self._leader = None
                free, self._lead_free = self._lead_free, None
                if link.paused and not link.lost and self._loop_needed_locked(link):
                    self._resume_reading_locked(link)  # others wait for answers: the loop reads
            if free is not None:
                free.set_result(None)  # callers waiting to lead may now
        return None

    def _lead(self, link: _Link, sinks: list, timeout_s: float | None) -> None:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        assert self._wake_pair is not None
        wake = self._wake_pair[0]
        poller = link.poller  # made once per connection: leaders take turns, one at a time
        if poller is None:
            poller = link.poller = select.poll()
            poller.register(link.fd, select.POLLIN)
            poller.register(wake.fileno(), select.POLLIN)
        spin_ns = self.lead_spin_us * 1000 if timeout_s != 0 else 0  # 0: do not wait at all
        if spin_ns and not self._spin_gate.may_spin():  # the last spins found nothing: block at once
            spin_ns = 0
        spin_until = time.perf_counter_ns() + spin_ns if spin_ns else 0
        while True:
            for sink in sinks:
                if sink.done():
                    return
            if spin_until:  # poll without blocking, so that this vCPU does not halt
                # no Python call in the loop: a sink is settled only by a read here or by a
                # poke of the wake pipe, and poll() sees both
                ready = poller.poll(0)
                while not ready and time.perf_counter_ns() < spin_until:
                    ready = poller.poll(0)
                spin_until = 0  # one spin per lead: then block as usual
                self._spin_gate.spun(bool(ready))
                if ready:
                    if not self._lead_ready(link, wake, ready):
                        return
                    continue
            wait_s = LEAD_SLICE_S
            if deadline is not None:
                wait_s = min(wait_s, deadline - time.monotonic())
            ready = poller.poll(max(0, int(wait_s * 1000 + 0.999)))  # ms, rounded up
            if ready and not self._lead_ready(link, wake, ready):
                return
            if deadline is not None and time.monotonic() >= deadline:
                return

    def _lead_ready(self, link: _Link, wake: socket.socket, ready: list) -> bool:
        """Read what poll() found ready; False once the connection is lost."""
        for fd, _ in ready:
            if fd != link.fd:  # poked: look at the sinks again
                with contextlib.suppress(OSError):
                    while wake.recv(64):
                        pass
                continue
            outcomes: list = []
            with self._lock:
                if link.lost or self._link is not link:
                    return False
                # Reading._read_locked's work, without its two calls: once per answer led
                why: BaseException | None = None
                try:
                    data = link.sock.recv(READ_BYTES)
                except (BlockingIOError, InterruptedError):  # nothing after all: poll again
                    link.read_at = time.monotonic()
                except OSError as e:
                    why = UnavailableError(f"the connection to {self.address} was lost: {e}")
                else:
                    link.read_at = time.monotonic()
                    why = self._parse_locked(link, data, outcomes)
                if why is not None:
                    self._lose_locked(link, why)
                self._undelivered.extend(outcomes)
            if outcomes:  # answers of callers who do not lead, PUSH frames: the loop's
                assert self._loop is not None
                self._loop.call_soon_threadsafe(self._deliver_read)
            if why is not None:
                return False
        return True

    def _poke_leader(self, _: object = None) -> None:
        """Wake the leading caller from poll(), to look at its sinks (any thread)."""
        pair = self._wake_pair
        if pair is not None and self._leader is not None:
            with contextlib.suppress(OSError):  # full (a poke is pending) or closed
                pair[1].send(b"\0")
