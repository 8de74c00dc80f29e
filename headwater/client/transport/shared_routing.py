"""SharedRouter: the receives of shared groups on a cluster, for
:class:`~headwater.client.transport.routing.RoutedService` and, through
:class:`~headwater.client.aio.shared_routing.AsyncSharedRouter`, its asyncio twin (the
rules: :mod:`headwater.client.core.shared_routing`).

A receive is sent to every leader of the queue at once, each answer read by its
connection's thread (asyncio: its task); the receive's future is settled by the first
answer holding deliveries, and later ones are kept for the member's next receive. Acks,
nacks, extends and describe are plans (:mod:`headwater.client.core.routed_plans`).

Thread-safe: one lock around the receives' state; futures are settled outside it. A
subclass says how a future is made, a request sent and the leaders found
(:meth:`SharedRouter._new_future`, :meth:`SharedRouter._send`,
:meth:`SharedRouter._addresses`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Hashable
from typing import Any

from headwater.client.core.effects import leaders_of
from headwater.client.core.shared_routing import ReceiveRound, SharedReceives, phases
from headwater.client.transport.remote import check_arguments
from headwater.client.transport.send_future import LazyFuture
from headwater.errors import UnavailableError
from headwater.model.shared import SharedDeliveries
from headwater.protocol import messages as m

__all__ = ["SharedRouter"]

#: what setting an answer on a future its caller cancelled raises, by kind of future
_TAKEN = (concurrent.futures.InvalidStateError, asyncio.InvalidStateError)


class SharedRouter:
    """The shared-group receives of one routed service (blocking: a RoutedService)."""

    def __init__(self, service: Any) -> None:
        self._service = service
        self._lock = threading.Lock()
        self._receives = SharedReceives()
        self._rounds: dict[Any, ReceiveRound] = {}
        # receives whose quick round is under way: their long poll, and where to send it
        self._then: dict[Any, tuple[m.SharedReceiveRequest, list[str]]] = {}
        # queue -> (the table, each broker's partitions by it): see _led_by
        self._led_cache: dict[str, tuple[Any, dict[Hashable, list[int]]]] = {}

    # -- what differs by driver -------------------------------------------------------------

    def _new_future(self) -> Any:
        return LazyFuture()

    def _send(self, address: str, body: m.SharedReceiveRequest) -> Any:
        """``body`` to the broker at ``address`` without waiting: the future of its answer."""
        return self._service._submit(address, body)

    def _addresses(self, queue: str) -> list[str]:
        """The addresses of the queue's leaders (the table refreshed once, waiting, if it
        does not know ``queue``); none: the bootstrap broker's. A partition with no leader
        in the table starts a refresh nobody waits for (rate limited), so that a broker back
        from an outage is asked again: no receive reaches a partition the table has no
        leader for, so no error would ever ask."""
        s = self._service
        leaders = s._run(leaders_of(s, queue))  # the table's (refreshed first if stale or new to the queue)
        table = s.table
        if table.leaderless(queue):
            s._gate.mark_stale()
            s._refresh_soon()
        return sorted({table.brokers[b].address for b in leaders}) or [s.address]

    def _led_by(self, queue: str, address: Hashable) -> list[int]:
        """The partitions of ``queue`` the table says the broker at ``address`` leads, in
        order (as a broker's answer names its own). Worked out once per table and queue: a
        queue of 10,000 partitions would cost milliseconds per answer."""
        table = self._service.table
        held = self._led_cache.get(queue)
        if held is None or held[0] is not table:  # a refresh installs a new table
            by: dict[Hashable, list[int]] = {}
            for p, b in sorted(table.partition_leaders(queue).items()):
                by.setdefault(table.brokers[b].address, []).append(p)
            held = self._led_cache[queue] = (table, by)
        return held[1].get(address, [])

    # -- receive ----------------------------------------------------------------------------

    def start_receive(self, body: m.SharedReceiveRequest) -> Any:
        """Send the receive to every leader of its queue without waiting: the future of
        its answer (the first holding deliveries, or empty once all answered). It asks
        without waiting first, then (all empty) with its long poll: see
        :func:`~headwater.client.core.shared_routing.phases`."""
        check_arguments(body)
        addresses = self._addresses(body.queue)
        out = self._new_future()
        first, then = phases(body)
        if then is not None:
            with self._lock:
                self._then[out] = (then, addresses)
        self._begin(out, first, addresses)
        return out

    def _begin(self, out: Any, body: m.SharedReceiveRequest, addresses: list[str]) -> None:
        """One round of ``out``'s receive: ``body`` to ``addresses`` (those with no receive
        of the member outstanding). Never blocks on a refresh: it may run on a connection's
        thread."""
        key = (body.group, body.queue, body.member)
        with self._lock:
            r, send = self._receives.start(key, body.max_messages, addresses, wait_all=body.max_wait_ms == 0)
            if not r.done:
                self._rounds[out] = r
            # a round its caller left unanswered (never withdrawn) was replaced by this one: forget its future
            self._rounds = {f: x for f, x in self._rounds.items() if not x.done}
            self._then = {f: v for f, v in self._then.items() if f in self._rounds or f is out}
        if r.done:
            self._finish([out], r)
            return
        for address in send:
            self._send(str(address), body).add_done_callback(
                lambda f, a=address: self._answered(key, a, f)  # type: ignore[misc]  # a bound default names the broker
            )

    def _answered(self, key: tuple[str, str, str], address: Hashable, fut: Any) -> None:
        if fut.cancelled():
            error: BaseException | None = UnavailableError("the receive was cancelled (the client is closing)")
        else:
            error = fut.exception()
        if isinstance(error, UnavailableError):
            self._service._gate.mark_stale()  # a refusal, a lost connection: ask METADATA again
        result = None if error is not None else fut.result()
        if result is not None and result.led is not None and result.led != self._led_by(key[1], address):
            s = self._service  # a partition moved (to or from it): no error says so, its answer does
            s._gate.mark_stale()
            s._refresh_soon()
        with self._lock:
            r = self._receives.answered(key, address, result, error)
            done = [f for f, x in self._rounds.items() if x is r] if r is not None else []
            for f in done:
                del self._rounds[f]
        if r is not None:
            self._finish(done, r)

    def _finish(self, futures: list[Any], r: ReceiveRound) -> None:
        """``r`` is answered: settle ``futures`` with it, or start their long poll when
        their quick round found nothing."""
        for out in futures:
            with self._lock:
                then = self._then.pop(out, None)
            if then is not None and r.error is None and r.answer is not None and not r.answer.leases and not out.done():
                self._begin(out, *then)
            else:
                self._settle(out, r)

    def _settle(self, fut: Any, r: ReceiveRound) -> None:
        if not fut.done():
            try:
                if r.error is not None:
                    fut.set_exception(r.error)
                else:
                    fut.set_result(r.answer)
                return
            except _TAKEN:
                pass
        if r.answer is not None:  # its caller cancelled it: keep what it got for the next receive
            with self._lock:
                self._receives.keep(r.key, r.answer)

    def withdraw(self, fut: Any) -> bool:
        """A receive whose caller stops waiting: answered empty now, if it had no answer
        (nothing was leased for it; what its brokers give later goes to the member's next
        receive). Always False: its requests were written, and the caller takes the answer
        at once. (True would tell the consumer the client is reconnecting, and after a
        broker's outage it would raise.)"""
        with self._lock:
            self._then.pop(fut, None)
            r = self._rounds.pop(fut, None)
            ended = r is not None and self._receives.withdraw(r)
        if ended:
            assert r is not None
            self._settle(fut, r)
        return False

    def receive(self, body: m.SharedReceiveRequest) -> SharedDeliveries:
        """A blocking receive."""
        fut = self.start_receive(body)
        try:
            return fut.result(timeout=self._service.request_timeout_s + body.max_wait_ms / 1000)
        except concurrent.futures.TimeoutError:
            self.withdraw(fut)  # answered empty, unless its answer came meanwhile
            return fut.result()

    def drain(self) -> dict[tuple[str, str, str], list[str]]:
        """The lease ids kept for receives that will not come (the client closes), by
        member, forgotten here: the service gives them back."""
        with self._lock:
            return self._receives.drain()
