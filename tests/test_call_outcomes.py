"""What a network call does when its answer is late, lost or never comes, and how it
tells a wrong argument, sync and asyncio alike (headwater.client.transport.remote.Tries, check_arguments).

- A call that is not idempotent (a truncate) is never sent twice once it may have reached
  the broker: its caller hears that the outcome is unknown, and a message another client
  sent meanwhile is not dropped by a second truncate.
- One call takes about ``request_timeout_s`` in all against a hung broker, not one
  timeout per retry.
- A wrong argument is told in the same words embedded and over the network.

The broker is a real one in a thread (conftest's ``server``); between it and the client
under test sits :class:`Proxy`, which passes bytes through and can delay the broker's
answers, hold them back (a hung broker) or cut the connection.
"""

from __future__ import annotations

import asyncio
import queue
import socket
import threading
import time

import pytest

import headwater
import headwater.aio
from headwater.client.transport.remote import CLOSE_TIMEOUT_S, Tries
from headwater.errors import InvalidArgumentError, OutcomeUnknownError, UnavailableError
from headwater.protocol import messages as m


class Proxy:
    """A TCP proxy on 127.0.0.1 in front of ``upstream``. Bytes from the client go through
    at once; the broker's bytes go ``delay_s`` late, and not at all while ``hold`` is set.
    ``cut()`` drops every connection made so far."""

    def __init__(self, upstream: str) -> None:
        host, port = upstream.rsplit(":", 1)
        self.upstream = (host, int(port))
        self.delay_s = 0.0
        self.hold = False
        self.socks: list[socket.socket] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            broker = socket.create_connection(self.upstream)
            self.socks += [client, broker]
            answers: queue.Queue = queue.Queue()
            threading.Thread(target=self._pump, args=(client, broker, None), daemon=True).start()
            threading.Thread(target=self._pump, args=(broker, client, answers), daemon=True).start()
            threading.Thread(target=self._answer, args=(answers, client), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, answers: queue.Queue | None) -> None:
        try:
            while data := src.recv(65536):
                if answers is None:
                    dst.sendall(data)
                else:
                    answers.put((time.monotonic() + self.delay_s, data))
        except OSError:
            pass
        if answers is not None:
            answers.put(None)

    def _answer(self, answers: queue.Queue, client: socket.socket) -> None:
        while (item := answers.get()) is not None:
            due, data = item
            time.sleep(max(0.0, due - time.monotonic()))
            while self.hold:
                time.sleep(0.01)
            try:
                client.sendall(data)
            except OSError:
                return

    def cut(self) -> None:
        socks, self.socks = self.socks, []
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def close(self) -> None:
        self.hold = False
        self.listener.close()
        self.cut()


@pytest.fixture
def proxy(server):
    p = Proxy(server.address)
    yield p
    p.close()


@pytest.fixture
def direct(server):
    """Client B: straight to the broker, with a queue "t"."""
    hw = headwater.connect(server.address)
    hw.admin.create_queue("t")
    yield hw
    hw.close()


def bodies(hw: headwater.Client, queue_name: str) -> list[bytes]:
    return [r.body for r in hw.scanner(queue_name)]


# 1. a call that is not idempotent is not sent twice once it may have reached the broker ---


def truncate_while_another_client_sends(direct, truncate) -> BaseException | None:
    """Run ``truncate()`` in a thread; 0.2 s later (after the broker truncated, before the
    answer is in) client B sends "after", acknowledged. What ``truncate()`` raised."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            truncate()
            outcome.append(None)
        except BaseException as e:  # noqa: BLE001 - the test looks at it
            outcome.append(e)

    t = threading.Thread(target=run)
    t.start()
    time.sleep(0.2)
    direct.send("t", b"after")
    t.join(10)
    assert not t.is_alive()
    return outcome[0]


def assert_outcome_unknown(error: BaseException | None) -> None:
    assert isinstance(error, OutcomeUnknownError) and isinstance(error, UnavailableError), error
    assert not error.retriable  # a loop that retries what is retriable leaves it alone
    text = str(error)
    assert "TRUNCATE_QUEUE" in text and "may or may not have been applied" in text, text
    assert "not sent again" in text and "admin.describe_queue('t')" in text, text


def test_a_truncate_whose_answer_is_late_is_not_sent_again(server, proxy, direct):
    direct.send("t", b"before")
    a = headwater.connect(proxy.address, connect_timeout_s=2, request_timeout_s=0.5)
    try:
        proxy.delay_s = 1.0  # every answer comes after the call's deadline
        error = truncate_while_another_client_sends(direct, lambda: a.admin.truncate_queue("t"))
    finally:
        proxy.delay_s = 0.0
        a.close()
    assert bodies(direct, "t") == [b"after"]  # acknowledged to B after the one truncate: kept
    assert_outcome_unknown(error)
    assert "got no answer in 0.5 s" in str(error)


def test_a_truncate_whose_connection_is_lost_is_not_sent_again(server, proxy, direct):
    a = headwater.connect(proxy.address, connect_timeout_s=2, request_timeout_s=5)
    try:
        proxy.hold = True  # the broker truncates; its answer stays in the proxy

        def lose_the_answer() -> None:  # after B's send; the next connection works
            proxy.cut()
            proxy.hold = False

        def truncate() -> None:
            threading.Timer(0.4, lose_the_answer).start()
            a.admin.truncate_queue("t")

        error = truncate_while_another_client_sends(direct, truncate)
        assert a.admin.describe_queue("t").name == "t"  # a read is sent again on a new connection
    finally:
        proxy.hold = False
        a.close()
    assert bodies(direct, "t") == [b"after"]
    assert_outcome_unknown(error)


def test_asyncio_truncate_whose_answer_is_late_is_not_sent_again(server, proxy, direct):
    async def main() -> BaseException | None:
        a = await headwater.aio.connect(proxy.address, connect_timeout_s=2, request_timeout_s=0.5)
        try:
            proxy.delay_s = 1.0
            truncating = asyncio.ensure_future(a.admin.truncate_queue("t"))
            await asyncio.sleep(0.2)
            await asyncio.to_thread(direct.send, "t", b"after")
            try:
                await truncating
            except UnavailableError as e:
                return e
            return None
        finally:
            proxy.delay_s = 0.0
            await a.close()

    error = asyncio.run(main())
    assert bodies(direct, "t") == [b"after"]
    assert_outcome_unknown(error)


def test_only_a_request_that_never_left_or_is_idempotent_is_sent_again():
    """What may be sent again is its operation's, written once in API_SPECS (ApiSpec.resend)."""

    class Transport:
        address = "127.0.0.1:1"
        request_timeout_s = 30.0

        def gave_up_connecting_since(self, t: float) -> bool:
            return False

    lost = UnavailableError("the connection to 127.0.0.1:1 was lost")

    def tries(body: m.RequestBody) -> Tries:
        t = Tries(Transport(), body, retries=3)  # type: ignore[arg-type] # a stand-in transport
        t.next_timeout_s()
        return t

    truncate = m.TruncateQueueRequest("t")
    assert tries(truncate).after(lost, written=False, closed=False) is None  # never left: safe
    assert "may or may not" in str(tries(truncate).after(lost, written=True, closed=False))
    describe = m.DescribeQueueRequest("t")
    assert tries(describe).after(lost, written=True, closed=False) is None
    assert tries(describe).after(lost, written=True, closed=True) is lost
    produce = m.ProduceRequest("t", 0, b"")  # the producer retries its appends itself
    assert tries(produce).after(lost, written=False, closed=False) is lost
    at_least_once = m.SharedReceiveRequest("g", "t", "m", 1, 1000)
    at_most_once = m.SharedReceiveRequest("g", "t", "m", 1, 1000, at_most_once=True)
    assert tries(at_least_once).after(lost, written=True, closed=False) is None
    assert "may or may not" in str(tries(at_most_once).after(lost, written=True, closed=False))
    # a long poll may take its max_wait_ms longer than any other request
    assert tries(m.FetchRequest("t", 0, 0, 1, max_wait_ms=5000)).timeout_s == 35.0
    assert tries(m.FetchRequest("t", 0, 0, 1)).timeout_s == 30.0


def test_every_operation_says_whether_it_may_be_sent_again():
    """The rule is each spec's: the calls that change state in a way a second one would not
    repeat (create, delete, truncate, add partitions, join, ack/nack/extend, add/delete a
    subscriber, delete a group, plan partition moves) are sent again only if they never left; appends and the
    stream requests never."""
    once = {k.name for k, s in m.API_SPECS.items() if s.resend is m.Resend.IF_UNSENT}
    assert once == {
        "CREATE_QUEUE",
        "DELETE_QUEUE",
        "TRUNCATE_QUEUE",
        "ADD_PARTITIONS",
        "DELETE_GROUP",
        "JOIN_GROUP",
        "SHARED_ACK",
        "SHARED_NACK",
        "SHARED_EXTEND",
        "ADD_SUBSCRIBER",
        "DELETE_SUBSCRIBER",
        "REBALANCE",
        "DECOMMISSION",
    }
    never = {k for k, s in m.API_SPECS.items() if s.resend is m.Resend.NEVER}
    assert never == {m.ApiKey.PRODUCE} | m.STREAM_APIS
    assert {k.name for k, s in m.API_SPECS.items() if s.waits} == {"FETCH", "KEYED_FETCH", "SHARED_RECEIVE"}


# 2. request_timeout_s bounds a whole call, its tries together ------------------------------


def test_a_hung_broker_costs_a_call_one_request_timeout(server, proxy, direct):
    direct.send("t", b"x")
    a = headwater.connect(proxy.address, connect_timeout_s=1, request_timeout_s=0.4)
    consumer = a.consumer(group="g")
    calls = {
        "describe_queue": lambda: a.admin.describe_queue("t"),
        "list_queues": a.admin.list_queues,
        "offset_for_time": lambda: a.offset_for_time("t", 0, 0),
        "commit": lambda: consumer.commit({("t", 0): 1}),
        "committed": lambda: consumer.committed("t", 0),
        "status": a.status,
    }
    try:
        proxy.hold = True  # the broker reads the requests, and its answers never come
        for name, call in calls.items():
            t0 = time.monotonic()
            with pytest.raises(UnavailableError, match=r"got no answer in 0\.4 s"):
                call()
            took = time.monotonic() - t0
            assert 0.35 < took < 0.9, f"{name} took {took:.2f} s"
    finally:
        t0 = time.monotonic()
        consumer.close()
        a.close()
        assert time.monotonic() - t0 < CLOSE_TIMEOUT_S + 1
        proxy.hold = False


def test_asyncio_hung_broker_costs_a_call_one_request_timeout(server, proxy, direct):
    async def main() -> None:
        a = await headwater.aio.connect(proxy.address, connect_timeout_s=1, request_timeout_s=0.4)
        try:
            proxy.hold = True
            for call in (lambda: a.admin.describe_queue("t"), a.admin.list_queues, a.status):
                t0 = time.monotonic()
                with pytest.raises(UnavailableError, match=r"got no answer in 0\.4 s"):
                    await call()
                assert 0.35 < time.monotonic() - t0 < 0.9
        finally:
            await a.close()
            proxy.hold = False

    asyncio.run(main())


@pytest.mark.parametrize(
    "heartbeat_interval_ms, in_flight",
    [(30_000, False), (100, True)],
    ids=["idle-heartbeat", "heartbeat-in-flight"],
)
def test_a_group_member_closing_against_a_hung_broker_waits_one_request_timeout(
    server, proxy, direct, heartbeat_interval_ms, in_flight
):
    """Its closing commit goes unanswered, so it does not try to leave as well: the member
    expires after its session timeout instead (closing used to wait for both calls). A
    heartbeat in flight when the broker hung is not waited for either (it cost close() its
    own request timeout first: 1.94 s); its answer, if one comes, is not applied."""
    queue = f"members-{heartbeat_interval_ms}"
    direct.admin.create_queue(queue, exist_ok=True)
    direct.send(queue, b"x")
    a = headwater.connect(proxy.address, connect_timeout_s=1, request_timeout_s=1)
    c = a.consumer(
        group=f"closing-{heartbeat_interval_ms}",
        subscribe=queue,
        session_timeout_ms=60_000,
        heartbeat_interval_ms=heartbeat_interval_ms,
    )
    try:
        assert wait_for_records(c.poll, 1)
        proxy.hold = True
        if in_flight:
            time.sleep(0.12)  # the next heartbeat is sent (every 0.1 s), and hangs
        t0 = time.monotonic()
        c.close()
        took = time.monotonic() - t0
        assert 0.9 < took < 1.8, f"close took {took:.2f} s"
    finally:
        a.close()
        proxy.hold = False


def test_an_asyncio_group_member_closing_against_a_hung_broker_waits_one_request_timeout(server, proxy, direct):
    direct.admin.create_queue("amembers", exist_ok=True)
    direct.send("amembers", b"x")

    async def main() -> float:
        a = await headwater.aio.connect(proxy.address, connect_timeout_s=1, request_timeout_s=1)
        c = a.consumer(group="aclosing", subscribe="amembers", session_timeout_ms=60_000, heartbeat_interval_ms=30_000)
        try:
            await c.start()
            for _ in range(50):
                if await c.poll(timeout_ms=100):
                    break
            else:
                raise AssertionError("the member read nothing")
            proxy.hold = True
            t0 = time.monotonic()
            await c.close()
            return time.monotonic() - t0
        finally:
            await a.close()
            proxy.hold = False

    took = asyncio.run(main())
    assert 0.9 < took < 1.8, f"close took {took:.2f} s"


def wait_for_records(poll, want: int) -> list:
    got: list = []
    deadline = time.monotonic() + 10
    while len(got) < want and time.monotonic() < deadline:
        got += poll(timeout_ms=100)
    return got


# 3. a wrong argument is told in the same words embedded and over the network -------------


def wrong_arguments(hw) -> dict[str, str]:
    hw.admin.create_queue("c", exist_ok=True)
    consumer = hw.consumer(group="g")
    calls = {
        "describe_queue(None)": lambda: hw.admin.describe_queue(None),
        "add_partitions('c', '4')": lambda: hw.admin.add_partitions("c", "4"),
        "commit({('c', 0): '3'})": lambda: consumer.commit({("c", 0): "3"}),
        "offset_for_time('c', '0', 0)": lambda: hw.offset_for_time("c", "0", 0),
        "truncate_queue(7)": lambda: hw.admin.truncate_queue(7),
    }
    said = {}
    for name, call in calls.items():
        with pytest.raises(InvalidArgumentError) as e:
            call()
        said[name] = str(e.value)
    consumer.close()
    return said


def test_wrong_arguments_are_told_alike_embedded_and_over_the_network(server, tmp_path):
    embedded = headwater.open(tmp_path / "embedded")
    network = headwater.connect(server.address)
    try:
        here, there = wrong_arguments(embedded), wrong_arguments(network)
    finally:
        embedded.close()
        network.close()
    assert there == here
    assert here["describe_queue(None)"] == "a queue name is a string, got NoneType"
    assert here["add_partitions('c', '4')"] == "a partition count is an int, got str"
    assert all("encode" not in said and "Expected" not in said for said in here.values()), here


def test_asyncio_wrong_arguments_are_told_alike_embedded_and_over_the_network(server, tmp_path):
    async def said(hw) -> dict[str, str]:
        await hw.admin.create_queue("c")
        out = {}
        for name, call in {
            "describe_queue(None)": lambda: hw.admin.describe_queue(None),
            "add_partitions('c', '4')": lambda: hw.admin.add_partitions("c", "4"),
            "commit": lambda: hw.consumer(group="g").commit({("c", 0): "3"}),
        }.items():
            with pytest.raises(InvalidArgumentError) as e:
                await call()
            out[name] = str(e.value)
        await hw.close()
        return out

    async def main() -> tuple[dict[str, str], dict[str, str]]:
        return (
            await said(await headwater.aio.open(tmp_path / "embedded")),
            await said(await headwater.aio.connect(server.address)),
        )

    here, there = asyncio.run(main())
    assert there == here
    assert here["describe_queue(None)"] == "a queue name is a string, got NoneType"
    assert here["add_partitions('c', '4')"] == "a partition count is an int, got str"
    assert "encode" not in here["commit"] and "Expected" not in here["commit"]


def test_the_network_services_check_offsets_before_encoding(server, tmp_path):
    """What reaches the service without the consumer's own checks (the CLI, a caller of
    ``hw.service``) is told in the embedded broker's words too."""
    hw = headwater.connect(server.address)
    try:
        hw.admin.create_queue("c")
        with pytest.raises(InvalidArgumentError, match=r"^an offset is an int, got str$"):
            hw.service.commit_offsets("g", "c", {0: "3"})
        with pytest.raises(InvalidArgumentError, match=r"^a partition is an int, got str$"):
            hw.service.commit_offsets("g", "c", {"0": 3})
    finally:
        hw.close()
    embedded = headwater.open(tmp_path / "embedded")
    try:
        embedded.admin.create_queue("c")
        with pytest.raises(InvalidArgumentError, match=r"^an offset is an int, got str$"):
            embedded.service.commit_offsets("g", "c", {0: "3"})
    finally:
        embedded.close()


def test_the_services_have_every_operation_with_the_broker_services_signature():
    """RemoteService, AsyncService and ThreadedService make their calls from API_SPECS: each
    BrokerService method is there, on the class itself (not the Protocol's empty stub), with
    BrokerService's parameters and defaults, and a coroutine in the asyncio services."""
    import inspect

    from headwater.client.aio.service import AsyncBrokerService, AsyncService, ThreadedService
    from headwater.client.transport.remote import RemoteService
    from headwater.model.service import BrokerService

    names = {n for n in vars(BrokerService) if not n.startswith("_") and callable(getattr(BrokerService, n))}
    assert {s.method for s in m.API_SPECS.values() if s.method} == names - {"close"}
    for cls in (RemoteService, AsyncService, ThreadedService):
        for name in names:
            fn = vars(cls).get(name)
            assert fn is not None, f"{cls.__name__}.{name} is missing"
            want = inspect.signature(getattr(BrokerService, name))
            assert list(inspect.signature(fn).parameters.values()) == list(want.parameters.values()), (cls, name)
            assert inspect.iscoroutinefunction(fn) is (cls is not RemoteService), (cls, name)
    # AsyncBrokerService is BrokerService, awaitable, by reference: what it promises is each
    # BrokerService method (checked above) and ping, as coroutines of both asyncio services
    assert "BrokerService" in (AsyncBrokerService.__doc__ or "")
    for cls in (AsyncService, ThreadedService):
        assert inspect.iscoroutinefunction(cls.ping), cls


def test_optional_capabilities_are_the_protocols_next_to_broker_service(server, tmp_path):
    """What a service can do beyond BrokerService is a typed Protocol of
    headwater.model.service, checked with isinstance (not an attribute looked up by name):
    the network services have the futures, leading and streams; the embedded broker shares
    its clock."""
    from headwater.model import service as s

    sync_network = {
        s.Leads,
        s.DescribesAsync,
        s.ProducesAsync,
        s.FetchesAsync,
        s.KeyedFetchesAsync,
        s.StartsSharedReceive,
        s.OpensPushStreams,
        s.OpensFetchStreams,
        s.HasTransport,
    }
    aio_network = {s.ProducesInto, s.AsyncStartsSharedReceive, s.AsyncOpensPushStreams, s.OpensFetchStreams}
    capabilities = sync_network | aio_network | {s.HasClock}

    def has(service) -> set:
        return {p for p in capabilities if isinstance(service, p)}

    network = headwater.connect(server.address)
    embedded = headwater.open(tmp_path / "embedded")
    try:
        assert has(network.service) >= sync_network and s.HasClock not in has(network.service)
        assert has(embedded.service) == {s.HasClock}
    finally:
        network.close()
        embedded.close()

    async def main() -> tuple[set, set]:
        a_network = await headwater.aio.connect(server.address)
        a_embedded = await headwater.aio.open(tmp_path / "aio")
        try:
            return has(a_network.service), has(a_embedded.service)
        finally:
            await a_network.close()
            await a_embedded.close()

    a_network, a_embedded = asyncio.run(main())
    assert a_network >= aio_network and not a_network & {s.ProducesAsync, s.FetchesAsync, s.Leads}
    assert a_embedded == set()  # ThreadedService: the asyncio producer's clock is its service's


def test_a_request_turns_back_into_the_arguments_it_was_built_from():
    """takes_request builds an operation's request from BrokerService's arguments and
    call_arguments gives them back (ThreadedService passes its long polls on that way): for
    every operation, the round trip binds to BrokerService's signature with the same values."""
    import inspect

    from headwater.client.transport.remote import call_arguments, takes_request
    from headwater.model.service import BrokerService

    for spec in m.API_SPECS.values():
        if spec.method is None:
            continue
        sig = inspect.signature(getattr(BrokerService, spec.method))
        params = list(sig.parameters.values())[1:]
        values = {p.name: _a_value(p.name, str(p.annotation)) for p in params}

        class Front:
            @takes_request(spec.method)
            def call(self, request):
                return request

        positional = [values[p.name] for p in params if p.kind is not p.KEYWORD_ONLY]
        keyword = {p.name: values[p.name] for p in params if p.kind is p.KEYWORD_ONLY}
        assert inspect.signature(Front.call).parameters == sig.parameters, spec.method
        args, kwargs = call_arguments(Front().call(*positional, **keyword))
        assert sig.bind(None, *args, **kwargs).arguments == {"self": None, **values}, spec.method


def _a_value(name: str, annotation: str) -> object:
    """A value of a parameter's type, not None (None can mean "the request's default")."""
    if annotation.startswith("list"):
        return [f"v-{name}"]
    if annotation.startswith("dict"):
        return {1: 2}
    return f"v-{name}" if annotation.startswith("str") else True if annotation == "bool" else 7
