"""SharedRouter: shared groups on a cluster, for :class:`~headwater.client.transport.routing.
RoutedService` (the rules: :mod:`headwater.client.core.shared_routing`).

A receive is sent to every leader of the queue at once, each answer read by its
connection's thread; the receive's future is settled by the first answer holding
deliveries, and later ones are kept for the member's next receive. Acks, nacks and extends
go to each lease's partition leader, one request per broker at once.

Thread-safe: one lock around the receives' state; futures are settled outside it.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any

from headwater.client.core.shared_routing import (
    ReceiveRound,
    SharedReceives,
    merge_lease_answers,
    merge_shared_describe,
    phases,
    split_leases,
)
from headwater.client.transport.remote import answer_timeout_s, check_arguments
from headwater.client.transport.send_future import LazyFuture
from headwater.errors import GroupNotFoundError, HeadwaterError, UnavailableError
from headwater.model.shared import LeaseRefusal, SharedDeliveries, SharedGroupInfo
from headwater.protocol import messages as m

if TYPE_CHECKING:
    from headwater.client.transport.routing import RoutedService

__all__ = ["SharedRouter"]

log = logging.getLogger(__name__)


class SharedRouter:
    """The shared-group calls of one :class:`RoutedService`."""

    def __init__(self, service: RoutedService) -> None:
        self._service = service
        self._lock = threading.Lock()
        self._receives = SharedReceives()
        self._rounds: dict[concurrent.futures.Future[Any], ReceiveRound] = {}
        # receives whose quick round is under way: their long poll, and where to send it
        self._then: dict[concurrent.futures.Future[Any], tuple[m.SharedReceiveRequest, list[str]]] = {}

    # -- where to send ----------------------------------------------------------------------

    def _leader_addresses(self, queue: str) -> dict[int, str]:
        """``{partition: leader's address}``; the table refreshed once if it does not know
        ``queue`` (an unknown queue: ``{}``)."""
        s = self._service
        s._leaders(queue)
        table = s.table
        return {p: table.brokers[b].address for p, b in table.partition_leaders(queue).items()}

    def _submit(self, address: str, body: m.RequestBody) -> concurrent.futures.Future[Any]:
        """``body`` to the broker at ``address`` without waiting (its connection's thread
        reads the answer); a broker out of reach: a future holding its error."""
        fut: concurrent.futures.Future[Any] = LazyFuture()
        try:
            link = self._service._link(address)
            link.transport.submit(body, fut, answer_timeout_s(link.transport, body))
        except UnavailableError as e:
            fut.set_exception(e)
        return fut

    # -- receive ----------------------------------------------------------------------------

    def start_receive(self, body: m.SharedReceiveRequest) -> concurrent.futures.Future[SharedDeliveries]:
        """Send the receive to every leader of its queue without waiting: the future of
        its answer (the first holding deliveries, or empty once all answered). It asks
        without waiting first, then (all empty) with its long poll: see
        :func:`~headwater.client.core.shared_routing.phases`."""
        check_arguments(body)
        addresses = sorted(set(self._leader_addresses(body.queue).values())) or [self._service.address]
        out: concurrent.futures.Future[SharedDeliveries] = LazyFuture()
        first, then = phases(body)
        if then is not None:
            with self._lock:
                self._then[out] = (then, addresses)
        self._begin(out, first, addresses)
        return out

    def _begin(
        self, out: concurrent.futures.Future[SharedDeliveries], body: m.SharedReceiveRequest, addresses: list[str]
    ) -> None:
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
            self._submit(str(address), body).add_done_callback(
                lambda f, a=address: self._answered(key, a, f)  # type: ignore[misc]  # a bound default names the broker
            )

    def _answered(self, key: tuple[str, str, str], address: Hashable, fut: concurrent.futures.Future[Any]) -> None:
        error = fut.exception()
        if isinstance(error, UnavailableError):
            self._service._gate.mark_stale()  # a refusal, a lost connection: ask METADATA again
        result = None if error is not None else fut.result()
        with self._lock:
            r = self._receives.answered(key, address, result, error)
            done = [f for f, x in self._rounds.items() if x is r] if r is not None else []
            for f in done:
                del self._rounds[f]
        if r is not None:
            self._finish(done, r)

    def _finish(self, futures: list[concurrent.futures.Future[SharedDeliveries]], r: ReceiveRound) -> None:
        """``r`` is answered: settle ``futures`` with it, or start their long poll when
        their quick round found nothing."""
        for out in futures:
            with self._lock:
                then = self._then.pop(out, None)
            if then is not None and r.error is None and r.answer is not None and not r.answer.leases:
                self._begin(out, *then)
            else:
                self._settle(out, r)

    def _settle(self, fut: concurrent.futures.Future[SharedDeliveries], r: ReceiveRound) -> None:
        try:
            if r.error is not None:
                fut.set_exception(r.error)
            else:
                assert r.answer is not None
                fut.set_result(r.answer)
        except concurrent.futures.InvalidStateError:  # its caller cancelled it: keep what it got
            if r.answer is not None:
                with self._lock:
                    self._receives.keep(r.key, r.answer)

    def withdraw(self, fut: concurrent.futures.Future[Any]) -> bool:
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

    def release_held(self) -> None:
        """Give back the deliveries kept for receives that will not come (the client
        closes): nacked at once, so other members get them now rather than after their
        leases. Best effort: a broker out of reach lets them time out."""
        with self._lock:
            held = self._receives.drain()
        for (group, queue, member), ids in held.items():
            try:
                self._service.shared_nack(group, queue, member, ids, "released: client closed", 0)
            except HeadwaterError as e:
                log.info("%d kept lease(s) of %s on %s not given back (%s): they time out", len(ids), member, queue, e)

    # -- ack, nack, extend ----------------------------------------------------------------

    def lease_call(self, queue: str, lease_ids: list[str], make: Any) -> list[LeaseRefusal]:
        """``make(lease_ids)`` (a request body) to each lease's partition leader at once;
        their refusals merged (see :func:`~headwater.client.core.shared_routing.refused_as`)."""
        leaders = self._leader_addresses(queue)
        by_broker, leaderless = split_leases(list(lease_ids), leaders)
        if not by_broker and not leaderless:
            return list(self._service._home._call(make(list(lease_ids))))  # no table: the broker's answer
        asked = {address: self._submit(address, make(ids)) for address, ids in by_broker.items()}
        answers: dict[Any, Any] = {}
        for address, fut in asked.items():
            try:
                answers[address] = fut.result(timeout=self._service.request_timeout_s + 1)
            except concurrent.futures.TimeoutError:
                answers[address] = UnavailableError(
                    f"broker {address} got no answer in {self._service.request_timeout_s} s"
                )
            except Exception as e:  # noqa: BLE001 - merged: a moved or lost broker's leases refused, others raised
                answers[address] = e
            if isinstance(answers[address], UnavailableError):
                self._service._gate.mark_stale()
        return merge_lease_answers(list(lease_ids), by_broker, leaderless, answers)

    # -- describe, list ---------------------------------------------------------------------

    def describe(self, group: str, queue: str) -> SharedGroupInfo:
        """Each leader's partitions of the group, merged; GroupNotFoundError when no leader
        knows it."""
        leaders = self._leader_addresses(queue)
        if not leaders:
            return self._service._home.shared_describe(group, queue)  # the queue unknown: its error
        asked = {a: self._submit(a, m.SharedDescribeRequest(group, queue)) for a in sorted(set(leaders.values()))}
        answers: dict[str, SharedGroupInfo] = {}
        missing: BaseException | None = None
        for address, fut in asked.items():
            try:
                answers[address] = fut.result(timeout=self._service.request_timeout_s + 1)
            except GroupNotFoundError as e:
                missing = e  # that leader has not served the group yet
            except UnavailableError as e:
                self._service._gate.mark_stale()
                log.warning(
                    "broker %s did not describe shared group %s (%s): its partitions are left out", address, group, e
                )
                missing = missing or e
        if not answers:
            assert missing is not None
            raise missing
        return merge_shared_describe(answers, leaders)
