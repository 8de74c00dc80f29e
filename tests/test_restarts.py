"""Every kind of consumer reads on across a broker's restart, without an error.

A broker process is stopped (SIGTERM, or SIGKILL) while a consumer reads in a loop, started
again on its port a second later, and sent one more message. The consumer must get that
message, and none of its reads may fail: a read that the restart broke (its connection lost,
or refused by a broker that is stopping) is tried again for the client's
``connect_timeout_s``, as Kafka's consumer rides through a broker's restart. The fetch
streams of the simple consumer are covered in tests/test_fetch_streams.py; here are the
consumers that fetch: ``consumer(stream=False)`` (sync and asyncio), the keyed consumer and
the shared consumer (sync and asyncio). A broker gone for good is still reported, after
``connect_timeout_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator

import pytest

import headwater
import headwater.aio
from headwater.errors import UnavailableError
from tests.support.broker_process import BrokerProcess, Restart, free_port

READ_FOR_S = 30  # the longest a test reads, waiting for the message sent after the restart


def read_across(restart: Restart, read: Callable[[], list[bytes]]) -> list[bytes]:
    """Read until the restart is done and something came (no read may fail)."""
    restart.start()
    got: list[bytes] = []
    deadline = time.monotonic() + READ_FOR_S
    while not (got and restart.done.is_set()) and time.monotonic() < deadline:
        got += read()
    assert restart.error is None
    return got


async def aread_across(restart: Restart, read: Callable[[], Awaitable[list[bytes]]]) -> list[bytes]:
    """:func:`read_across` for the asyncio consumers."""
    restart.start()
    got: list[bytes] = []
    deadline = time.monotonic() + READ_FOR_S
    while not (got and restart.done.is_set()) and time.monotonic() < deadline:
        got += await read()
    assert restart.error is None
    return got


@pytest.fixture
def broker(tmp_path):
    holder: dict[str, BrokerProcess] = {"broker": BrokerProcess(tmp_path / "data", port=free_port()).start()}
    yield holder
    holder["broker"].kill()


def _restart(broker: dict, stop: str, **kw) -> Restart:
    restart = Restart(broker["broker"], stop, **kw)
    broker["restart"] = restart
    return restart


def _finish(broker: dict) -> None:
    restart = broker.get("restart")
    if restart is not None:
        restart.join(30)
        broker["broker"] = restart.broker


@pytest.mark.parametrize("stop", ["terminate", "kill"])
def test_a_fetching_consumer(broker, stop):
    hw = headwater.connect(broker["broker"].address, request_timeout_s=5)
    try:
        hw.admin.create_queue("q", partitions=1)
        c = hw.consumer(stream=False)
        c.assign("q")
        assert c.poll(timeout_ms=100) == []
        got = read_across(_restart(broker, stop), lambda: [r.body for r in c.poll(timeout_ms=200)])
        assert got == [b"after"]
    finally:
        _finish(broker)
        hw.close()


def read_across_asyncio(broker: dict, make_read, **restart) -> list[bytes]:
    """Connect with ``headwater.aio``, create queue ``q``, make the reader
    (``await make_read(hw)``: an async function returning bodies) and read across a SIGTERM
    restart."""

    async def main() -> list[bytes]:
        hw = await headwater.aio.connect(broker["broker"].address, request_timeout_s=5)
        try:
            await hw.admin.create_queue("q", partitions=1)
            return await aread_across(_restart(broker, "terminate", **restart), await make_read(hw))
        finally:
            await hw.close()

    try:
        return asyncio.run(main())
    finally:
        _finish(broker)


def test_an_asyncio_fetching_consumer(broker):
    async def make_read(hw):
        c = hw.consumer(stream=False)
        await c.assign("q")

        async def read() -> list[bytes]:
            return [r.body for r in await c.poll(timeout_ms=200)]

        return read

    assert read_across_asyncio(broker, make_read) == [b"after"]


@pytest.mark.parametrize("stop", ["terminate", "kill"])
def test_a_keyed_consumer(broker, stop):
    hw = headwater.connect(broker["broker"].address, request_timeout_s=5)
    try:
        hw.admin.create_queue("q", partitions=1)
        k = hw.keyed_consumer("counters", "q", member=0, size=1)
        assert k.poll(timeout_ms=100) == []

        def read() -> list[bytes]:
            records = k.poll(timeout_ms=200)
            k.commit()
            return [r.body for r in records]

        assert read_across(_restart(broker, stop, key=b"k"), read) == [b"after"]
    finally:
        _finish(broker)
        hw.close()


def test_an_asyncio_keyed_consumer(broker):
    async def make_read(hw):
        k = hw.keyed_consumer("counters", "q", member=0, size=1)
        assert await k.poll(timeout_ms=100) == []

        async def read() -> list[bytes]:
            records = await k.poll(timeout_ms=200)
            await k.commit()
            return [r.body for r in records]

        return read

    assert read_across_asyncio(broker, make_read, key=b"k") == [b"after"]


@pytest.mark.parametrize("stop", ["terminate", "kill"])
def test_a_shared_consumer(broker, stop):
    hw = headwater.connect(broker["broker"].address, request_timeout_s=5)
    try:
        hw.admin.create_queue("q", partitions=1)
        s = hw.shared_consumer("mailers", "q", member="w1")
        assert s.receive(timeout_ms=100) == []

        def read() -> list[bytes]:
            deliveries = s.receive(max_messages=10, timeout_ms=200)
            for d in deliveries:
                d.ack()
            return [d.body for d in deliveries]

        assert read_across(_restart(broker, stop), read) == [b"after"]
    finally:
        _finish(broker)
        hw.close()


def test_an_asyncio_shared_consumer(broker):
    async def make_read(hw):
        s = hw.shared_consumer("mailers", "q", member="w1")

        async def read() -> list[bytes]:
            deliveries = await s.receive(max_messages=10, timeout_ms=200)
            for d in deliveries:
                await d.ack()
            return [d.body for d in deliveries]

        return read

    assert read_across_asyncio(broker, make_read) == [b"after"]


@pytest.mark.parametrize("stream", [True, False], ids=["streaming", "fetching"])
def test_a_consumer_reports_a_broker_gone_for_good(broker, stream):
    """Reading again is tried for the client's connect_timeout_s, then the poll says the
    broker cannot be reached."""
    hw = headwater.connect(broker["broker"].address, connect_timeout_s=1, request_timeout_s=5)
    try:
        hw.admin.create_queue("q", partitions=1)
        c = hw.consumer(stream=stream)
        c.assign("q")
        assert c.poll(timeout_ms=100) == []
        broker["broker"].kill()
        began = time.monotonic()
        with pytest.raises(UnavailableError, match="cannot reach the broker"):
            while time.monotonic() - began < 30:
                c.poll(timeout_ms=200)
        assert time.monotonic() - began < 6
    finally:
        hw.close()


class PollClock:
    """Times the polls made from the moment the broker was killed until one raises."""

    def __init__(self) -> None:
        self.began = time.monotonic()
        self.longest = 0.0

    def going(self) -> bool:
        return time.monotonic() - self.began < 30

    @contextlib.contextmanager
    def poll(self) -> Iterator[None]:
        t0 = time.monotonic()
        try:
            yield
        finally:
            self.longest = max(self.longest, time.monotonic() - t0)

    def check(self) -> None:
        """Each poll of 200 ms kept its timeout (within 1.5 s, for a busy machine: one that
        waits for the reconnection took 2.4 s and more); the outage was reported after about
        the client's connect_timeout_s of 3 s (the last connect attempt gives up a little early)."""
        assert self.longest < 1.5, f"a poll of 200 ms took {self.longest:.2f} s"
        assert 2 <= time.monotonic() - self.began < 8


def _reader(hw, kind: str) -> Callable[[], list]:
    """A poll of 200 ms of a consumer of queue ``q`` of that kind."""
    hw.admin.create_queue("q", partitions=1)
    if kind == "keyed":
        keyed = hw.keyed_consumer("counters", "q", member=0, size=1)
        return lambda: keyed.poll(timeout_ms=200)
    if kind == "shared":
        shared = hw.shared_consumer("workers", "q")
        return lambda: shared.receive(timeout_ms=200)
    if kind == "group":
        c = hw.consumer(group="billing", subscribe="q")
    else:
        c = hw.consumer(stream=kind == "streaming")
        c.assign("q")
    return lambda: c.poll(timeout_ms=200)


@pytest.mark.parametrize("kind", ["streaming", "fetching", "keyed", "group", "shared"])
def test_a_read_keeps_its_timeout_while_the_broker_is_down(broker, kind):
    """While the broker is away each poll (a shared consumer's receive) returns after its own
    timeout (Kafka's poll(Duration) too), not after the client's connect_timeout_s; the
    outage is reported once that passed."""
    hw = headwater.connect(broker["broker"].address, connect_timeout_s=3, request_timeout_s=5)
    try:
        read = _reader(hw, kind)
        assert read() == []
        broker["broker"].kill()
        clock = PollClock()
        with pytest.raises(UnavailableError, match="cannot reach the broker"):
            while clock.going():
                with clock.poll():
                    assert read() == []
        clock.check()
    finally:
        hw.close()


@pytest.mark.parametrize("kind", ["streaming", "fetching", "keyed", "shared"])
def test_an_asyncio_read_keeps_its_timeout_while_the_broker_is_down(broker, kind):
    async def main() -> PollClock:
        hw = await headwater.aio.connect(broker["broker"].address, connect_timeout_s=3, request_timeout_s=5)
        try:
            await hw.admin.create_queue("q", partitions=1)
            if kind == "shared":
                shared = hw.shared_consumer("workers", "q")

                def read():
                    return shared.receive(timeout_ms=200)
            else:
                if kind == "keyed":
                    c = hw.keyed_consumer("counters", "q", member=0, size=1)
                else:
                    c = hw.consumer(stream=kind == "streaming")
                    await c.assign("q")

                def read():
                    return c.poll(timeout_ms=200)

            assert await read() == []
            broker["broker"].kill()
            clock = PollClock()
            with pytest.raises(UnavailableError, match="cannot reach the broker"):
                while clock.going():
                    with clock.poll():
                        assert await read() == []
            return clock
        finally:
            await hw.close()

    asyncio.run(main()).check()
