"""RemoteService: the BrokerService of a broker across the network, for synchronous code.

An event loop runs in a daemon thread and owns one :class:`AsyncTransport`; every method
submits its request to that loop and waits for the answer. Calls from many threads share
the connection and are pipelined. ``*_async`` variants return a
``concurrent.futures.Future`` instead of waiting, which is how the producer keeps several
batches in flight.

What is sent again, and when (``docs/design/client.md``, "What a blocking call sends again"):

- A call has one deadline, ``request_timeout_s`` from when it is first sent (a long poll:
  plus its ``max_wait_ms``); its tries share it, and when it passes the call fails with
  :class:`~headwater.errors.UnavailableError` ("got no answer in N s"). A request that
  was written and got no answer by then is not sent again: the broker is hung or slow,
  not gone, and would only be asked twice.
- A request that never left this process (the connection was lost while it waited to be
  written) is sent again on the next connection, whatever it does: the broker never saw it.
- A request that was written when its connection was lost is sent again only if doing it
  twice is the same as once (reads; commits and checkpoints of offsets; enabling a queue;
  cancelling a delayed message; ...). The others (create, delete and truncate a queue, add
  partitions, join a group, ack/nack/extend leases, add or delete a subscriber) fail with
  :class:`~headwater.errors.OutcomeUnknownError` (an UnavailableError whose ``retriable``
  is False), whose message says how to look.
- Appends are not sent again here: the producer retries them, and its idempotent batches
  make that safe.
- Nothing is sent again once an attempt to connect for it has given up (nothing answered
  for ``connect_timeout_s``): a broker that is down costs a caller one
  ``connect_timeout_s``, not one per retry.

Which rule a request follows is its operation's, written once in ``API_SPECS``
(``ApiSpec.resend``; ``ApiSpec.waits`` for a long poll's longer deadline), not at each
call: the methods of :class:`RemoteService` and of the asyncio services that just send a
request and wait for its answer are made from that table by :func:`define_calls`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
import threading
import time
import types
import typing
from collections.abc import Callable
from typing import Any

import msgspec

from headwater.client.transport.async_transport import AsyncTransport
from headwater.client.transport.leading import check_lead_spin_us, default_lead_spin_us
from headwater.client.transport.polling import retrieve
from headwater.client.transport.send_future import LazyFuture
from headwater.errors import ClosedError, NotCoordinatorError, NotLeaderError, OutcomeUnknownError, UnavailableError
from headwater.model.checks import check_int_arg, check_offsets_arg, check_queue_arg, mapping_copy
from headwater.model.service import BrokerService, ProduceResult, PushHandler, PushStreamSpec
from headwater.model.subscription import SubscriberInfo, validate_subscriber_name
from headwater.protocol import messages as m

__all__ = [
    "CLOSE_TIMEOUT_S",
    "RemoteService",
    "StreamCalls",
    "Tries",
    "answer_timeout_s",
    "call_arguments",
    "check_arguments",
    "define_calls",
    "new_event_loop",
    "takes_request",
]

#: The longest close() waits for the client's event loop to shut the connection down.
CLOSE_TIMEOUT_S = 5.0


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's loop when installed (the ``server`` extra), else asyncio's."""
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:
        return asyncio.new_event_loop()


def _queue_and(field: str, check: Callable[[Any], None]) -> tuple[tuple[str, Callable[[Any], None]], ...]:
    return (("queue", check_queue_arg), (field, check))


def _an_int(what: str) -> Callable[[Any], None]:
    return lambda value: check_int_arg(value, what)


def _queue_or_none(name: object) -> None:
    if name is not None:
        check_queue_arg(name)


#: a request naming a subscriber: its queue, then its name (checked as the broker does)
_SUBSCRIBER: tuple[tuple[str, Callable[[Any], None]], ...] = (
    ("queue", check_queue_arg),
    ("name", validate_subscriber_name),
)


#: The fields of a request that callers pass straight through, and their checks (see
#: ``headwater.client.sync.client``): run before encoding, so a value of the wrong type is told
#: in the embedded broker's words, not the encoder's.
_ARGUMENT_CHECKS: dict[type, tuple[tuple[str, Callable[[Any], None]], ...]] = {
    m.DescribeQueueRequest: (("name", check_queue_arg),),
    m.ListQueuesRequest: (("partitions_max", _an_int("partitions_max (the most partitions on a page)")),),
    m.DeleteQueueRequest: (("name", check_queue_arg),),
    m.TruncateQueueRequest: (("name", check_queue_arg),),
    m.SetQueueEnabledRequest: (("name", check_queue_arg),),
    m.AddPartitionsRequest: (("name", check_queue_arg), ("partitions", _an_int("a partition count"))),
    m.FetchRequest: (
        ("queue", check_queue_arg),
        ("partition", _an_int("a partition")),
        ("offset", _an_int("an offset")),
    ),
    m.LookupKeyRequest: (("queue", check_queue_arg),),
    m.OffsetForTimeRequest: _queue_and("partition", _an_int("a partition")),
    m.CommitOffsetsRequest: _queue_and("offsets", check_offsets_arg),
    m.FetchOffsetsRequest: (("queue", check_queue_arg),),
    m.KeyedGroupRequest: (("queue", check_queue_arg),),
    m.KeyedCommitRequest: _queue_and("offsets", check_offsets_arg),
    m.KeyedResizeRequest: _queue_and("size", _an_int("a keyed group's size")),
    m.AddSubscriberRequest: _SUBSCRIBER,
    m.DeleteSubscriberRequest: _SUBSCRIBER,
    m.DescribeSubscriberRequest: _SUBSCRIBER,
    m.ListSubscribersRequest: (("queue", _queue_or_none),),
    m.CheckpointSubscriberRequest: _SUBSCRIBER + (("offsets", check_offsets_arg),),
    m.SharedDescribeRequest: (("queue", check_queue_arg),),
}


def check_arguments(body: m.RequestBody) -> None:
    """Raise InvalidArgumentError if a caller's value in ``body`` is of the wrong type, as
    the embedded broker would (the network services, sync and asyncio, call it before
    sending)."""
    for field, check in _ARGUMENT_CHECKS.get(type(body), ()):
        check(getattr(body, field))


def _list_copy(value: Any) -> Any:
    """A list copy of a list a caller passed (None stays None): the request is encoded
    later, maybe on another thread, and the caller's list may change meanwhile."""
    return None if value is None else list(value)


def _container_of(tp: Any) -> type | None:
    """dict or list if a request field of type ``tp`` (or ``tp | None``) holds one."""
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        found = {_container_of(t) for t in typing.get_args(tp)} - {None}
        return found.pop() if len(found) == 1 else None
    origin = typing.get_origin(tp) or tp
    return origin if origin in (dict, list) else None


def define_calls(send: str) -> Callable[[type], type]:
    """A class decorator: give the class a method for each operation of ``API_SPECS`` that
    names a :class:`~headwater.model.service.BrokerService` method and that the class does
    not define itself: same name, parameters, defaults and docstring, that builds the
    operation's request from its arguments (as :func:`takes_request` does) and returns
    ``self.<send>(request)`` (awaited, if ``send`` is a coroutine function). So a new
    operation needs no code in the network and asyncio services: its spec and its
    BrokerService method say it."""

    def define(cls: type) -> type:
        fn = getattr(cls, send)
        for spec in m.API_SPECS.values():
            if spec.method is not None and spec.method not in cls.__dict__:
                proto = getattr(BrokerService, spec.method)
                method = _front(spec, fn, {}, f"{cls.__name__}.{spec.method}", cls.__module__, proto.__doc__)
                method.__annotations__ = dict(proto.__annotations__)
                setattr(cls, spec.method, method)
        return cls

    return define


def _unset_value(field: msgspec.structs.FieldInfo) -> Callable[[], Any] | None:
    """What makes a field's default, for a parameter whose None means "not given" (a
    ``settings`` of None is the request's ``{}``); None if the field has none but None."""
    if field.default_factory is not msgspec.NODEFAULT:
        return field.default_factory
    if field.default is msgspec.NODEFAULT or field.default is None:
        return None
    default = field.default
    return lambda: default


def _parameters(spec: m.ApiSpec, namespace: dict[str, Any]) -> tuple[list[str], list[str]]:
    """BrokerService's parameters of ``spec``'s method, as source: the parameter list (with
    ``self``), and the request's fields from them (a caller's lists and mappings copied).
    Their defaults go into ``namespace``."""
    assert spec.method is not None
    proto = getattr(BrokerService, spec.method)
    fields = {f.name: f for f in msgspec.structs.fields(spec.request)}
    params, fields_given = ["self"], []
    star = False
    for p in list(inspect.signature(proto).parameters.values())[1:]:
        name, field = p.name, fields[p.name]
        if p.kind is p.KEYWORD_ONLY and not star:
            params.append("*")
            star = True
        if p.default is p.empty:
            params.append(name)
        else:
            namespace[f"_default_{name}"] = p.default
            params.append(f"{name}=_default_{name}")
        container = _container_of(field.type)
        copied = name if container is None else f"{'_mapping_copy' if container is dict else '_list_copy'}({name})"
        unset = _unset_value(field) if p.default is None else None
        if unset is not None:  # None means "not given" here, and the field has a default
            namespace[f"_unset_{name}"] = unset
            copied = f"({copied} if {name} is not None else _unset_{name}())"
        fields_given.append(f"{name}={copied}")
    return params, fields_given


def _front(
    spec: m.ApiSpec, fn: Callable[..., Any], extra: dict[str, Any], qualname: str, module: str, doc: str | None
) -> Callable[..., Any]:
    """A method with BrokerService's parameters of ``spec``'s method (and ``extra``'s
    keyword-only ones after them, with their defaults) that calls ``fn(self, request,
    **extra)`` with the request built from them: compiled from source, as :mod:`dataclasses`
    does, so a call costs what a hand-written one does (binding arguments with
    :mod:`inspect` would add about 5 µs to every call, a fetch's included)."""
    assert spec.method is not None
    namespace = {"_request": spec.request, "_list_copy": _list_copy, "_mapping_copy": mapping_copy, "_fn": fn}
    params, fields_given = _parameters(spec, namespace)
    if extra and "*" not in params:
        params.append("*")
    for name, default in extra.items():
        namespace[f"_default_{name}"] = default
        params.append(f"{name}=_default_{name}")
    forwarded = "".join(f", {name}={name}" for name in extra)
    is_async = inspect.iscoroutinefunction(fn)
    call = f"{'await ' if is_async else ''}_fn(self, _request({', '.join(fields_given)}){forwarded})"
    name = qualname.rpartition(".")[2]
    source = f"{'async ' if is_async else ''}def {name}({', '.join(params)}):\n    return {call}\n"
    # the source is built from API_SPECS and BrokerService alone, as dataclasses does
    exec(compile(source, f"<{name} from API_SPECS>", "exec"), namespace)
    front = namespace[name]
    front.__qualname__, front.__module__, front.__doc__ = qualname, module, doc
    proto = getattr(BrokerService, spec.method)
    front.__annotations__ = {**proto.__annotations__, **{k: type(v).__name__ for k, v in extra.items()}}
    front.__annotations__["return"] = fn.__annotations__.get("return", proto.__annotations__.get("return"))
    return front


def takes_request(method: str, **extra: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A method decorator: the method ``fn(self, request, **extra)`` is called with the
    request of BrokerService's ``method`` built from BrokerService's arguments (lists and
    mappings copied, since it is encoded later, maybe on another thread), and is seen by its
    callers with those parameters, ``extra``'s keyword-only ones after them (with their
    defaults). So a service that sends a request in its own way, or reads its fields, keeps
    one copy of the signature and of the request's building: BrokerService's and
    ``API_SPECS``'s. A coroutine stays a coroutine; a call costs one more function call than
    ``fn`` itself.

    >>> class Service:
    ...     @takes_request("describe_queue")
    ...     def ask(self, request):
    ...         return request
    >>> Service().ask("orders")
    DescribeQueueRequest(name='orders')
    """
    spec = next(s for s in m.API_SPECS.values() if s.method == method)
    return lambda fn: _front(spec, fn, extra, fn.__qualname__, fn.__module__, fn.__doc__)


@functools.cache
def _argument_names(request_type: type) -> tuple[tuple[str, ...], tuple[str, ...]]:
    spec = next(s for s in m.API_SPECS.values() if s.request is request_type)
    assert spec.method is not None
    params = list(inspect.signature(getattr(BrokerService, spec.method)).parameters.values())[1:]
    keyword = tuple(p.name for p in params if p.kind is p.KEYWORD_ONLY)
    return tuple(p.name for p in params if p.kind is not p.KEYWORD_ONLY), keyword


def call_arguments(request: m.RequestBody) -> tuple[list[Any], dict[str, Any]]:
    """The positional and keyword arguments of the BrokerService call that ``request`` is
    (the inverse of :func:`takes_request`'s building), for a service that passes a request on
    to an in-process BrokerService."""
    positional, keyword = _argument_names(type(request))
    return [getattr(request, n) for n in positional], {n: getattr(request, n) for n in keyword}


def answer_timeout_s(transport: AsyncTransport, body: m.RequestBody) -> float:
    """How long a request may wait for its answer: ``request_timeout_s``, and a long poll's
    ``max_wait_ms`` besides (its operation's ``ApiSpec.waits``)."""
    return transport.request_timeout_s + m.API_SPECS[body.api].wait_s(body)


_LEASE_SETTLED = (
    "a lease it finished would be refused a second time; a lease left unacked expires and its message comes again"
)

#: For the calls not sent twice once they may have reached the broker: why, and how to
#: find out whether the one sent was applied.
_HOW_TO_LOOK: dict[type, Callable[[Any], str]] = {
    m.CreateQueueRequest: lambda b: (
        f"admin.describe_queue({b.name!r}) tells whether the queue exists (create_queue(..., "
        f"exist_ok=True) is safe to repeat)"
    ),
    m.DeleteQueueRequest: lambda b: (
        f"a second delete could remove a queue {b.name!r} created meanwhile; admin.list_queues() "
        f"tells whether it is still there"
    ),
    m.TruncateQueueRequest: lambda b: (
        f"a second truncate would also drop what was sent to the queue since; "
        f"admin.describe_queue({b.name!r}) tells whether it was applied: a truncated partition's "
        f"start offset moved up to where its end offset was"
    ),
    m.AddPartitionsRequest: lambda b: f"admin.describe_queue({b.name!r}) tells how many partitions the queue has",
    m.JoinGroupRequest: lambda b: "a member it added without telling expires after its session timeout; join again",
    m.SharedAckRequest: lambda b: _LEASE_SETTLED,
    m.SharedNackRequest: lambda b: _LEASE_SETTLED,
    m.SharedReceiveRequest: lambda b: "at most once, messages it leased are not delivered again",
    m.AddSubscriberRequest: lambda b: f"admin.describe_subscriber({b.queue!r}, {b.name!r}) tells whether it exists",
    m.DeleteSubscriberRequest: lambda b: f"admin.list_subscribers({b.queue!r}) tells whether {b.name!r} is still there",
}


class Tries:
    """The tries of one blocking call (:class:`RemoteService` and the asyncio
    :class:`~headwater.client.aio.service.AsyncService` alike): the time each may take,
    and after a failure whether to send it again, or what to raise (see the module's
    docstring for the rules).

    Whether the request may be sent again is its operation's (``ApiSpec.resend``), and so
    is whether it may wait on the broker (``ApiSpec.waits``: a long poll may rightly take
    its ``max_wait_ms`` longer than any other request). ``timeout_s``: the call's own, in
    place of ``request_timeout_s``.
    """

    __slots__ = ("body", "deadline", "left", "resend", "sent_at", "timeout_s", "transport", "tries")

    def __init__(
        self, transport: AsyncTransport, body: m.RequestBody, *, retries: int, timeout_s: float | None = None
    ) -> None:
        self.transport = transport
        self.body = body
        spec = m.API_SPECS[body.api]
        self.resend = spec.resend_of(body)
        self.left = 0 if self.resend is m.Resend.NEVER else retries
        self.timeout_s = transport.request_timeout_s + spec.wait_s(body) if timeout_s is None else timeout_s
        self.sent_at = time.monotonic()
        self.deadline = self.sent_at + self.timeout_s
        self.tries = 0

    def next_timeout_s(self) -> float:
        """The time the next try may take: what is left of the call's."""
        self.tries += 1
        if self.tries == 1:
            return self.timeout_s
        self.sent_at = now = time.monotonic()
        return max(0.001, self.deadline - now)

    def after(self, error: UnavailableError, written: bool, closed: bool) -> UnavailableError | None:
        """The try failed with ``error``: None to send it again, else the error to raise.
        ``written``: the failed try may have reached the broker."""
        if self.resend is m.Resend.NEVER or isinstance(error, NotLeaderError | NotCoordinatorError):
            return error  # a refusal is the broker's answer: the same broker refuses again
        late = time.monotonic() >= self.deadline
        if written and self.resend is m.Resend.IF_UNSENT:
            return self._outcome_unknown(error, late)
        if late:  # written in time, no answer by the deadline: the broker is hung, not gone
            if self.tries > 1:  # the last try had what was left: say the whole wait
                return UnavailableError(
                    f"{self.body.api.name} to {self.transport.address} got no answer in {self.timeout_s} s"
                )
            return error
        if self.left <= 0 or closed or self.transport.gave_up_connecting_since(self.sent_at):
            return error
        self.left -= 1
        return None

    def again(self, error: UnavailableError, written: bool, closed: bool) -> None:
        """After a failed try (see :meth:`after`): return to send it again, else raise
        ``error`` itself or the error that says why it is not sent again."""
        final = self.after(error, written, closed)
        if final is error:
            raise error
        if final is not None:
            raise final from error

    def _outcome_unknown(self, error: UnavailableError, late: bool) -> OutcomeUnknownError:
        body = self.body
        why = f"got no answer in {self.timeout_s} s" if late else f"then {error}"
        look = _HOW_TO_LOOK.get(type(body))
        return OutcomeUnknownError(
            f"{body.api.name} was sent to {self.transport.address} and {why}: it may or may not have been "
            f"applied, and it is not sent again{'; ' + look(body) if look else ''}"
        )


class _Waiter:
    """The sink of one blocking call: a lock its caller waits on, released with the outcome
    (a concurrent.futures.Future costs a Condition and its lock besides)."""

    __slots__ = ("_error", "_lock", "_result")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()
        self._result: Any = None
        self._error: BaseException | None = None

    def done(self) -> bool:
        return not self._lock.locked()

    def set_result(self, result: Any) -> None:
        if not self._lock.locked():  # settled already: as a Future would, refuse
            raise concurrent.futures.InvalidStateError("this call has its outcome already")
        self._result = result
        self._lock.release()

    def set_exception(self, error: BaseException) -> None:
        if not self._lock.locked():
            raise concurrent.futures.InvalidStateError("this call has its outcome already")
        self._error = error
        self._lock.release()

    def wait(self) -> Any:
        self._lock.acquire()
        if self._error is not None:
            raise self._error
        return self._result


class StreamCalls:
    """The calls :class:`RemoteService` and the asyncio ``AsyncService`` send alike, without
    waiting: each kind's ``_submit(body)`` sends a request and returns the future of its
    answer (a ``concurrent.futures`` or an ``asyncio`` one)."""

    transport: AsyncTransport
    _closed: bool
    _submit: Callable[[m.RequestBody], Any]
    _new_future: Callable[[], Any]  # a future the transport settles
    _pushes_any_thread: bool  # fetch streams' pushes are handled on whichever thread reads them

    def open_fetch_stream(
        self,
        queue: str,
        positions: dict[int, int],
        handler: Callable[[m.PushBody | None], None],
        *,
        credit_bytes: int,
        tag_mask: int = 0,
        push_bytes_max: int = 1 << 20,
        on_loop: bool = False,
    ) -> tuple[int, Any]:
        """Start opening a fetch stream over ``positions`` (``{partition: offset}``) of
        ``queue``, without waiting (while the broker is away, the request waits for the next
        connection): the stream's id and the future of the broker's answer (None, or the
        reason it refused).

        ``handler`` gets each PUSH body, and None once if the connection is lost: on the
        event loop (asyncio), or on the thread that reads the connection (sync: the client's
        event loop, or a caller that leads; keep it quick and thread-safe). ``on_loop``: on
        the client's event loop always (a cluster's consumer streams over several
        connections, and leads none of them)."""
        if self._closed:
            raise ClosedError(f"the client of {self.transport.address} is closed")

        def request(sid: int) -> m.RequestBody:
            return m.FetchStreamRequest(sid, queue, dict(positions), credit_bytes, tag_mask, push_bytes_max)

        answer = self._new_future()
        return self.transport.start_stream(
            request, handler, answer, any_thread=self._pushes_any_thread and not on_loop
        ), answer

    def withdraw(self, fut: Any) -> bool:
        """Take back a request sent with a ``start_`` call if it is not written yet (True)."""
        return self.transport.withdraw(fut)

    def credit_fetch_stream(self, stream_id: int, credit_bytes: int) -> Any:
        """Let a fetch stream push ``credit_bytes`` more, without waiting."""
        return self._submit(m.StreamCreditRequest(stream_id, credit_bytes))

    def close_fetch_stream(self, stream_id: int) -> None:
        """Stop routing the stream's pushes here and ask the broker to end it, without waiting."""
        self.transport.unregister_push(stream_id)
        if not self._closed:  # the answer says nothing worth waiting for
            self._submit(m.CloseStreamRequest(stream_id)).add_done_callback(retrieve)

    def ack_push_stream(self, stream_id: int, offsets: dict[int, int], credit_messages: int, credit_bytes: int) -> Any:
        """Grant a stream more credit and checkpoint ``offsets`` (if any), without waiting."""
        return self._submit(m.SubscriptionAckRequest(stream_id, dict(offsets), credit_messages, credit_bytes))


@define_calls("_call")
class RemoteService(StreamCalls, BrokerService):
    """A BrokerService over TCP. Thread-safe.

    Each BrokerService method not written out here is made from its operation's entry in
    ``API_SPECS`` (:func:`define_calls`): it sends the request and waits for the answer,
    sending it again as the spec's ``resend`` allows."""

    _new_future = LazyFuture
    _pushes_any_thread = True  # a consumer's poll reads them

    def __init__(
        self,
        address: str,
        *,
        connect_timeout_s: float = 10.0,
        request_timeout_s: float = 60.0,
        retries: int = 3,
        lead_spin_us: int | None = None,
    ) -> None:
        # checked before the loop's thread starts; see AsyncTransport for what it does
        lead_spin_us = default_lead_spin_us() if lead_spin_us is None else check_lead_spin_us(lead_spin_us)
        self._loop = new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="headwater-client", daemon=True)
        self._thread.start()
        self.transport = AsyncTransport(
            address,
            connect_timeout_s=connect_timeout_s,
            request_timeout_s=request_timeout_s,
            loop=self._loop,
            lead_spin_us=lead_spin_us,
        )
        self.address = self.transport.address
        self._retries = retries
        self._closed = False
        self._call(m.PingRequest())  # fail fast, with a clear error, if nobody is there

    def _submit(
        self, body: m.RequestBody, timeout_s: float | None = None, *, lead: bool = False
    ) -> concurrent.futures.Future:
        # no task and no hop to the loop: this thread writes the request (in submission
        # order) and the loop's reader settles the future (or this thread, if it leads).
        # A LazyFuture: no condition until a thread waits on it (most never are, one by one)
        fut = LazyFuture()
        if self._closed:
            fut.set_exception(ClosedError(f"the client of {self.address} is closed"))
            return fut
        self.transport.submit(body, fut, timeout_s, lead=lead)
        return fut

    def lead(
        self, futures: list, timeout_s: float | None, *, interrupt: concurrent.futures.Future | None = None
    ) -> concurrent.futures.Future | None:
        """Read the connection on this thread until one of ``futures`` is done or
        ``timeout_s`` passes, if no other thread reads it (see :meth:`AsyncTransport.lead`);
        then wait on the futures as usual. For callers that asked ``lead=True``."""
        return self.transport.lead(futures, timeout_s, interrupt=interrupt)

    def _call(self, body: m.RequestBody) -> Any:
        """Send ``body`` and wait for its answer, within ``request_timeout_s`` (a long poll:
        plus its ``max_wait_ms``) in all, sending it again as :class:`Tries` allows."""
        check_arguments(body)
        tries = Tries(self.transport, body, retries=self._retries)
        while True:
            if self._closed:
                raise ClosedError(f"the client of {self.address} is closed")
            waiter = _Waiter()
            sent = self.transport.submit(body, waiter, tries.next_timeout_s(), lead=True)
            try:
                self.transport.lead([waiter])  # read the answer on this thread when nobody else reads
                return waiter.wait()
            except UnavailableError as e:
                tries.again(e, sent.written, self._closed)

    def produce(self, queue: str, partition: int, batch: bytes) -> ProduceResult:
        """Append one encoded batch and wait for its ProduceResult (BrokerService.produce).

        Written out rather than made from ``API_SPECS``: a sync producer's ``send_and_wait``
        comes here once per message, and an append is never sent again by the service (its
        producer retries it, idempotently), so it needs no :class:`Tries`, only the one
        deadline, ``request_timeout_s``. The request is written and its answer read on this
        thread (unless another thread reads the connection already)."""
        if self._closed:
            raise ClosedError(f"the client of {self.address} is closed")
        waiter = _Waiter()
        transport = self.transport
        transport.submit(m.ProduceRequest(queue, partition, batch), waiter, None, lead=True)
        transport.lead([waiter])
        return waiter.wait()

    # the calls that do not wait, for the producers and consumers that keep several in flight
    def describe_queue_async(self, name: str) -> concurrent.futures.Future:
        """Ask for a queue's metadata without waiting; the future holds the QueueInfo."""
        return self._submit(m.DescribeQueueRequest(name))

    def produce_async(self, queue: str, partition: int, batch: bytes) -> concurrent.futures.Future:
        """Send a batch without waiting; the future holds the ProduceResult."""
        return self._submit(m.ProduceRequest(queue, partition, batch))

    @takes_request("fetch", lead=False)
    def fetch_async(self, request: m.FetchRequest, lead: bool) -> concurrent.futures.Future:
        """Fetch without waiting (BrokerService.fetch's arguments); the future holds the
        FetchResult. ``lead=True``: the caller will call :meth:`lead` for it (a consumer's
        poll does)."""
        # a long poll: its wait on top of the deadline (answer_timeout_s, inlined on this hot path)
        return self._submit(request, self.transport.request_timeout_s + request.max_wait_ms / 1000, lead=lead)

    @takes_request("shared_receive")
    def start_shared_receive(self, request: m.SharedReceiveRequest) -> concurrent.futures.Future:
        """Send SHARED_RECEIVE (BrokerService.shared_receive's arguments) without waiting (at
        once, or when connected): the future of its answer, for the caller to :meth:`lead` on
        next. While it is not written yet, :meth:`withdraw` takes it back, so a consumer's
        receive keeps its own timeout while the client connects again."""
        return self._submit(request, answer_timeout_s(self.transport, request), lead=True)

    @takes_request("keyed_fetch", lead=False)
    def keyed_fetch_async(self, request: m.KeyedFetchRequest, lead: bool) -> concurrent.futures.Future:
        """A keyed fetch without waiting (BrokerService.keyed_fetch's arguments); the future
        holds the KeyedFetchResult. ``lead=True``: the caller will call :meth:`lead` for it
        (a keyed consumer's poll does)."""
        # a long poll: its wait on top of the deadline (answer_timeout_s, inlined on this hot path)
        return self._submit(request, self.transport.request_timeout_s + request.max_wait_ms / 1000, lead=lead)

    # push streams (headwater.client.sync.subscriber drives them)
    def open_push_stream(self, spec: PushStreamSpec, handler: PushHandler) -> tuple[int, SubscriberInfo]:
        """Open a push stream: its id and the subscriber as it starts. ``handler`` gets each
        PUSH body, on the client's event loop thread (keep it quick), and None once if the
        connection is lost."""
        opening = self.transport.open_stream(lambda sid: m.SubscribeRequest.opening(sid, spec), handler)
        return asyncio.run_coroutine_threadsafe(opening, self._loop).result()

    def close_push_stream(self, stream_id: int) -> None:
        """Stop routing the stream's pushes here and ask the broker to end it."""

        async def close_() -> None:
            self.transport.unregister_push(stream_id)
            await self.transport.call(m.UnsubscribeRequest(stream_id))

        if not self._closed:
            try:
                asyncio.run_coroutine_threadsafe(close_(), self._loop).result(timeout=10)
            except UnavailableError:
                pass  # the connection is gone, and the stream with it

    def ping(self) -> None:
        self._call(m.PingRequest())

    async def _shutdown(self) -> None:
        """Close the transport, then cancel and await every task left on the loop, so none
        is destroyed while pending when the loop stops."""
        await self.transport.close()
        me = asyncio.current_task()
        rest = [t for t in asyncio.all_tasks() if t is not me]
        for t in rest:
            t.cancel()
        await asyncio.gather(*rest, return_exceptions=True)

    def close(self) -> None:
        """Fail the calls in flight and close the connection, without asking the broker
        anything: a hung broker costs close() at most the transport's CLOSE_FLUSH_S (its wait
        for bytes the socket has not taken); a client's event loop that does not finish
        shutting down is given up on after CLOSE_TIMEOUT_S."""
        if self._closed:
            return
        self._closed = True
        fut = asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop)
        try:
            fut.result(timeout=CLOSE_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - closing: nothing left to tell anyone
            pass
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=CLOSE_TIMEOUT_S)
        self._loop.close()
