"""What a routed operation asks its driver to do, and the state both drivers keep (the
sans-I/O shape of h11, or of a generator-based coroutine).

A routed operation of a cluster's client (describe a queue at every leader, send a call
to a partition's leader again after a refusal, ...) is written once, in
:mod:`headwater.client.core.routed_plans`, as a generator: a *plan*. Where it needs the
network it yields an *effect* and gets the effect's answer back as the yield's value, or
its error thrown in at the yield::

    def describe_queue(s, name):
        leaders = yield from leaders_of(s, name)                              # may yield Refresh
        answers = yield Fanout({b: (s.table.brokers[b].address, DescribeQueueRequest(name)) ...})
        return merge_describe(...)                                            # no I/O

Two drivers run plans, :func:`drive` and :func:`adrive`: ``RoutedService._perform`` does
an effect with blocking calls on its ``RemoteService`` per broker, ``AsyncRoutedService.
_perform`` awaits its ``AsyncService`` per broker. The effects are few:

- :class:`Call`: one method of one broker's service (at an address, or :data:`HOME`: the
  bootstrap broker's), its answer or error;
- :class:`Fanout`: requests to several brokers at once, every answer or error gathered
  (``{key: answer or exception}``; a broker that does not answer in time: an
  ``UnavailableError``); the plan decides what is strict and what is tolerated;
- :class:`Refresh`: the routing table asked for again (within a deadline): the new table;
- :class:`Sleep`: a pause between two polls, or a backoff;
- :class:`Open`: a connection to a bootstrap address (connecting, before any service).

>>> Call(HOME, "describe_queue", ("orders",))
Call(at='home', method='describe_queue', args=('orders',), kwargs={})
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Generator, Hashable, Mapping
from typing import Any, NamedTuple, TypeVar

from headwater.client.core.routing import HOME, RefreshGate, RoutingTable
from headwater.errors import ClosedError, NotLeaderError, UnavailableError
from headwater.model.cluster import ClusterMetadata
from headwater.protocol import messages as m

__all__ = [
    "HOME",
    "Call",
    "Effect",
    "Fanout",
    "Plan",
    "Refresh",
    "RoutedState",
    "Sleep",
    "leader_addresses",
    "no_kwargs",
]

log = logging.getLogger(__name__)
T = TypeVar("T")
K = TypeVar("K", bound=Hashable)

#: kwargs of a :class:`Call` that has none (shared: a Call never changes its own)
no_kwargs: Mapping[str, Any] = {}


class Call(NamedTuple):
    """Call ``method(*args, **kwargs)`` of the service of the broker at ``at`` (an
    address, opened if no connection is, or :data:`HOME`); the answer is its result."""

    at: str
    method: str
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = no_kwargs


class Fanout(NamedTuple):
    """Send each request of ``asks`` (key -> (address, request)) at once, without waiting
    for one before the next; the answer is ``{key: its answer, or the exception}``."""

    asks: Mapping[Hashable, tuple[str, m.RequestBody]]


class Refresh(NamedTuple):
    """Ask for the routing table again (waiting out the rate limit, within ``deadline``,
    monotonic seconds; None: no deadline); the answer is the table in use after it."""

    deadline: float | None


class Sleep(NamedTuple):
    """Wait ``seconds``; the answer is None."""

    seconds: float


def leader_addresses(table: RoutingTable, queue: str) -> dict[int, str]:
    """``{partition: leader's address}`` of ``queue`` in ``table`` (partitions with no
    leader left out; an unknown queue: ``{}``)."""
    return table.partition_addresses(queue)


class Open(NamedTuple):
    """Open a service of the broker at ``address`` (``probe_s``: first see, within it,
    whether it takes a connection at all, so that a dead address costs little); the
    answer is the service and its broker's METADATA (a broker still joining its cluster
    refuses it: the next address is tried). For :func:`~headwater.client.core.routed_plans.first_that_answers`."""

    address: str
    connect_timeout_s: float
    probe_s: float | None


Effect = Call | Fanout | Refresh | Sleep | Open

#: A routed operation: yields effects, gets their answers, returns a T
Plan = Generator[Effect, Any, T]

#: name -> the plan of a routed method (its first parameter the RoutedState, then the
#: method's own); the drivers get a method for each (``routed_plans.install``)
PLANS: dict[str, Callable[..., Plan[Any]]] = {}


def plan(fn: Callable[..., Plan[T]]) -> Callable[..., Plan[T]]:
    """Register ``fn`` in :data:`PLANS` under its name."""
    PLANS[fn.__name__] = fn
    return fn


def drive(steps: Plan[T], perform: Callable[[Any], Any]) -> T:
    """Run a plan to its end, each effect done by ``perform`` (blocking); an effect's
    error is thrown in at its yield."""
    answer: Any = None
    error: Exception | None = None
    while True:
        try:
            effect = steps.send(answer) if error is None else steps.throw(error)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]  # the plan's T, which mypy does not carry here
        try:
            answer, error = perform(effect), None
        except Exception as e:  # noqa: BLE001 - the plan's to handle, at its yield
            answer, error = None, e


async def adrive(steps: Plan[T], perform: Callable[[Any], Awaitable[Any]]) -> T:
    """:func:`drive` for asyncio: each effect awaited. A cancellation is not thrown in:
    it ends the plan (its ``finally`` runs when the generator is closed)."""
    answer: Any = None
    error: Exception | None = None
    while True:
        try:
            effect = steps.send(answer) if error is None else steps.throw(error)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]  # the plan's T, as in drive
        try:
            answer, error = await perform(effect), None
        except Exception as e:  # noqa: BLE001 - the plan's to handle, at its yield
            answer, error = None, e


class RoutedState:
    """What a routed service keeps besides its connections: the routing table, when to
    ask for it again, the timeouts, the bootstrap list and the connections by address
    (``home``: the bootstrap broker's service, which answered ``metadata``). Both drivers
    inherit it; the plans read and mark it (no I/O). ``clock``: monotonic seconds (tests
    pass their own)."""

    def __init__(
        self,
        home: Any,
        metadata: ClusterMetadata,
        *,
        bootstrap: list[str],
        connect_timeout_s: float = 10.0,
        request_timeout_s: float = 60.0,
        retries: int = 3,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._home = home
        self.address: str = home.address
        self._links: dict[str, Any] = {home.address: home}
        self._down: dict[str, tuple[float, UnavailableError]] = {}  # address -> when opening it failed, why
        self.bootstrap = bootstrap
        self.connect_timeout_s = connect_timeout_s
        self.request_timeout_s = request_timeout_s
        self._retries = retries
        self._clock = clock
        self._table = RoutingTable(metadata)
        self._gate = RefreshGate()
        self._gate.refreshed(clock())
        self._closed = False

    @property
    def table(self) -> RoutingTable:
        """The routing table in use (the last METADATA answer)."""
        return self._table

    def _install(self, md: ClusterMetadata, asked_at: float) -> None:
        """``md`` (asked for at ``asked_at``) is the table now."""
        self._table = RoutingTable(md)
        self._gate.refreshed(asked_at)

    def _sources(self) -> list[str]:
        """The addresses of the open connections to ask METADATA of, the live ones first
        (the driver's to say: it holds the connections)."""
        raise NotImplementedError

    def _deadline(self) -> float:
        """A call's deadline, from now."""
        return self._clock() + self.request_timeout_s

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError(f"the client of {','.join(self.bootstrap)} is closed")

    def _leader_now(self, queue: str, partition: int) -> tuple[str, Any] | None:
        """The address and open connection of ``queue[partition]``'s leader by a fresh
        table that names one, for a first try without a plan (None: the plan decides)."""
        if self._gate.stale:
            return None
        try:
            address = self._table.leader(queue, partition).address
        except NotLeaderError:
            return None
        link = self._links.get(address)
        return None if link is None else (address, link)

    def _link_now(self, address: str) -> Any | None:
        """The open connection to ``address`` (None: open one); ClosedError once closed,
        and the error of an attempt that failed lately, rather than wait a
        ``connect_timeout_s`` again for each call."""
        self._check_open()
        link = self._links.get(address)
        down = self._down.get(address)
        if link is None and down is not None and self._clock() - down[0] < self.connect_timeout_s:
            raise down[1]
        return link

    def _opened(self, address: str, link: Any, error: UnavailableError | None = None) -> Any:
        """Keep ``link``, just opened to ``address`` (the one already kept if another came
        first), or the ``error`` opening it raised (the table marked stale)."""
        if error is not None:
            self._down[address] = (self._clock(), error)
            self._gate.mark_stale()
            raise error
        self._down.pop(address, None)
        return self._links.setdefault(address, link)

    def _addresses_now(self, queue: str) -> dict[int, str] | None:
        """``{partition: leader's address}`` of ``queue`` by a fresh table that knows it
        (None: ask for the table first)."""
        if self._gate.stale or not self._table.knows(queue):
            return None
        return leader_addresses(self._table, queue)

    def _broker_address(self, broker_id: int) -> str:
        """The address of broker ``broker_id`` of the table; UnavailableError (and the
        table marked stale) if the table does not have it."""
        broker = self._table.brokers.get(broker_id)
        if broker is None:
            self._gate.mark_stale()
            raise UnavailableError(f"broker {broker_id} is not in the cluster's metadata now")
        return broker.address

    def _unreachable(self, error: BaseException) -> None:
        """A done-callback's check of a call sent without waiting: a refusal or a lost
        broker makes the table stale."""
        if isinstance(error, UnavailableError):
            self._gate.mark_stale()


# -- the helpers of several plans ----------------------------------------------------------


def leaders_of(s: RoutedState, queue: str) -> Plan[dict[int, list[int]]]:
    """``{broker id: partitions}`` of ``queue``'s leaders, the table asked for again once
    when it is stale or does not know the queue."""
    if s._gate.stale or not s._table.knows(queue):
        s._gate.mark_stale()
        yield Refresh(s._deadline())
    return s._table.leaders_of(queue)


def addresses_of(s: RoutedState, queue: str) -> Plan[dict[int, str]]:
    """``{partition: leader's address}`` of ``queue`` (the table asked for again once if it
    does not know it; an unknown queue: ``{}``)."""
    found = s._addresses_now(queue)
    if found is None:
        yield from leaders_of(s, queue)
        found = leader_addresses(s._table, queue)
    return found


def fresh_table(s: RoutedState) -> Plan[RoutingTable]:
    """The table, asked for again first if it is stale."""
    if s._gate.stale:
        yield Refresh(s._deadline())
    return s._table


def to_brokers(s: RoutedState, brokers: list[int], body: m.RequestBody) -> Fanout:
    """``body`` to each of ``brokers`` (ids of the table) at once."""
    return Fanout({b: (s._table.brokers[b].address, body) for b in brokers})


def gathered(s: RoutedState, got: Mapping[K, Any], *, strict: bool) -> dict[K, Any]:
    """The answers of a :class:`Fanout`: a broker out of reach marks the table stale and
    is left out (``strict``: its error raised); any other error is raised."""
    out: dict[K, Any] = {}
    for key, answer in got.items():
        if isinstance(answer, UnavailableError):
            s._gate.mark_stale()
            if strict:
                raise answer
            log.warning("broker %s did not answer (%s): its part is left out", key, answer)
        elif isinstance(answer, BaseException):
            raise answer
        else:
            out[key] = answer
    return out
