"""AsyncSharedRouter: shared groups on a cluster, for :class:`~headwater.client.aio.routing.
AsyncRoutedService`; the twin of :class:`~headwater.client.transport.shared_routing.
SharedRouter` (the rules: :mod:`headwater.client.core.shared_routing`). Used from one event
loop: no lock."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Hashable
from typing import TYPE_CHECKING, Any

from headwater.client.core.shared_routing import (
    ReceiveRound,
    SharedReceives,
    merge_lease_answers,
    merge_shared_describe,
    phases,
    split_leases,
)
from headwater.client.transport.remote import call_arguments, check_arguments
from headwater.errors import GroupNotFoundError, HeadwaterError, UnavailableError
from headwater.model.shared import LeaseRefusal, SharedDeliveries, SharedGroupInfo
from headwater.protocol import messages as m

if TYPE_CHECKING:
    from headwater.client.aio.routing import AsyncRoutedService
    from headwater.client.aio.service import AsyncService

__all__ = ["AsyncSharedRouter"]

log = logging.getLogger(__name__)

LeaseCall = Callable[["AsyncService", list[str]], Awaitable[list[LeaseRefusal]]]


class AsyncSharedRouter:
    """The shared-group calls of one :class:`AsyncRoutedService`."""

    def __init__(self, service: AsyncRoutedService) -> None:
        self._service = service
        self._receives = SharedReceives()
        self._rounds: dict[asyncio.Future[Any], ReceiveRound] = {}
        # receives whose quick round is under way: their long poll, and where to send it
        self._then: dict[asyncio.Future[Any], tuple[m.SharedReceiveRequest, list[str]]] = {}
        self._tasks: set[asyncio.Future[Any]] = set()  # the receives and refreshes under way

    def _spawn(self, aw: Awaitable[Any]) -> asyncio.Future[Any]:
        task = asyncio.ensure_future(aw)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _leader_addresses(self, queue: str) -> dict[int, str]:
        s = self._service
        await s._leaders(queue)
        table = s.table
        return {p: table.brokers[b].address for p, b in table.partition_leaders(queue).items()}

    # -- receive ----------------------------------------------------------------------------

    def start_receive(self, body: m.SharedReceiveRequest) -> asyncio.Future[SharedDeliveries]:
        """Send the receive to every leader of its queue by the table in use (one it does
        not know yet: to the bootstrap broker, the table refreshed meanwhile): the future of
        its answer. Without waiting first, then with its long poll (``phases``)."""
        check_arguments(body)
        s = self._service
        table = s.table
        if s._gate.stale or not table.knows(body.queue):
            s._gate.mark_stale()
            self._spawn(s.refresh(time.monotonic() + s.request_timeout_s))
        addresses = sorted({table.brokers[b].address for b in table.leaders_of(body.queue)}) or [s.address]
        out: asyncio.Future[SharedDeliveries] = asyncio.get_running_loop().create_future()
        first, then = phases(body)
        if then is not None:
            self._then[out] = (then, addresses)
        self._begin(out, first, addresses)
        return out

    def _begin(self, out: asyncio.Future[SharedDeliveries], body: m.SharedReceiveRequest, addresses: list[str]) -> None:
        key = (body.group, body.queue, body.member)
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
            self._spawn(self._ask(str(address), body)).add_done_callback(
                lambda t, a=address: self._answered(key, a, t)  # type: ignore[misc]  # a bound default names the broker
            )

    async def _ask(self, address: str, body: m.SharedReceiveRequest) -> SharedDeliveries:
        link = await self._service._link(address)
        args, kwargs = call_arguments(body)
        result: SharedDeliveries = await link.start_shared_receive(*args, **kwargs)
        return result

    def _answered(self, key: tuple[str, str, str], address: Hashable, task: asyncio.Future[Any]) -> None:
        if task.cancelled():
            error: BaseException | None = UnavailableError("the receive was cancelled (the client is closing)")
        else:
            error = task.exception()
        if isinstance(error, UnavailableError):
            self._service._gate.mark_stale()
        r = self._receives.answered(key, address, None if error is not None else task.result(), error)
        if r is None:
            return
        done = [f for f, x in self._rounds.items() if x is r]
        for fut in done:
            del self._rounds[fut]
        self._finish(done, r)

    def _finish(self, futures: list[asyncio.Future[SharedDeliveries]], r: ReceiveRound) -> None:
        """``r`` is answered: settle ``futures``, or start their long poll when their quick
        round found nothing."""
        for out in futures:
            then = self._then.pop(out, None)
            if then is not None and r.error is None and r.answer is not None and not r.answer.leases and not out.done():
                self._begin(out, *then)
            else:
                self._settle(out, r)

    def _settle(self, fut: asyncio.Future[SharedDeliveries], r: ReceiveRound) -> None:
        if fut.done():  # its caller cancelled it: keep what it got for the next receive
            if r.answer is not None:
                self._receives.keep(r.key, r.answer)
        elif r.error is not None:
            fut.set_exception(r.error)
        else:
            assert r.answer is not None
            fut.set_result(r.answer)

    def withdraw(self, fut: asyncio.Future[Any]) -> bool:
        """A receive whose caller stops waiting: answered empty now, if it had no answer
        (see ``SharedRouter.withdraw``). Always False: the caller takes the answer."""
        self._then.pop(fut, None)
        r = self._rounds.pop(fut, None)
        if r is not None and self._receives.withdraw(r):
            self._settle(fut, r)
        return False

    async def receive(self, body: m.SharedReceiveRequest) -> SharedDeliveries:
        """A receive that waits for its answer."""
        fut = self.start_receive(body)
        timeout_s = self._service.request_timeout_s + body.max_wait_ms / 1000
        done, _ = await asyncio.wait([fut], timeout=timeout_s)
        if not done:
            self.withdraw(fut)  # answered empty, unless its answer came meanwhile
        return await fut

    async def release_held(self) -> None:
        """Give back the deliveries kept for receives that will not come (the client
        closes; see ``SharedRouter.release_held``)."""
        for (group, queue, member), ids in self._receives.drain().items():
            try:
                await self._service.shared_nack(group, queue, member, ids, "released: client closed", 0)
            except HeadwaterError as e:
                log.info("%d kept lease(s) of %s on %s not given back (%s): they time out", len(ids), member, queue, e)

    # -- ack, nack, extend, describe, list -----------------------------------------------

    async def lease_call(self, queue: str, lease_ids: list[str], call: LeaseCall) -> list[LeaseRefusal]:
        """``call`` with each leader's share of ``lease_ids``, at once; refusals merged."""
        s = self._service
        by_broker, leaderless = split_leases(list(lease_ids), await self._leader_addresses(queue))
        if not by_broker and not leaderless:
            return await call(s._home, list(lease_ids))  # the queue unknown: the broker's answer

        async def one(address: str, ids: list[str]) -> list[LeaseRefusal]:
            return await call(await s._link(address), ids)

        got = await asyncio.gather(*(one(a, ids) for a, ids in by_broker.items()), return_exceptions=True)
        answers = dict(zip(by_broker, got, strict=True))
        if any(isinstance(a, UnavailableError) for a in got):
            s._gate.mark_stale()
        return merge_lease_answers(list(lease_ids), by_broker, leaderless, answers)

    async def describe(self, group: str, queue: str) -> SharedGroupInfo:
        """Each leader's partitions of the group, merged."""
        s = self._service
        leaders = await self._leader_addresses(queue)
        if not leaders:
            return await s._home.shared_describe(group, queue)
        addresses = sorted(set(leaders.values()))

        async def one(address: str) -> SharedGroupInfo:
            return await (await s._link(address)).shared_describe(group, queue)

        got = await asyncio.gather(*(one(a) for a in addresses), return_exceptions=True)
        answers: dict[str, SharedGroupInfo] = {}
        missing: BaseException | None = None
        for address, answer in zip(addresses, got, strict=True):
            if isinstance(answer, GroupNotFoundError | UnavailableError):
                if isinstance(answer, UnavailableError):
                    s._gate.mark_stale()
                    log.warning("broker %s did not describe shared group %s (%s)", address, group, answer)
                missing = missing or answer
            elif isinstance(answer, BaseException):
                raise answer
            else:
                answers[address] = answer
        if not answers:
            assert missing is not None
            raise missing
        return merge_shared_describe(answers, leaders)
