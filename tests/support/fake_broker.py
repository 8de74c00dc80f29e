"""A broker stand-in driven by hand (``FakeBroker``), for the tests of the client's transport
below the service: deadlines, a lost connection, a late answer, the in-flight limit. A pytest
plugin (``pytest_plugins`` in tests/conftest.py): the ``fake_broker`` fixture makes them."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from headwater.protocol import (
    NEED_DATA,
    SERVER,
    Connection,
    ConnectionClosed,
    Handshake,
    HandshakeAccepted,
    Request,
    Response,
    choose_version,
)
from headwater.protocol import messages as m


class FakeBroker:
    """A broker stand-in on 127.0.0.1, driven by hand: it accepts the handshake, then
    answers pings and hands every other request to ``answer`` (None: no answer), which it
    sends ``answer_delay_s`` later, one thread per connection. ``requests`` lists
    (connection number, request body) in arrival order."""

    def __init__(
        self, answer=lambda body: None, *, requests_in_flight_max: int = 256, answer_delay_s: float = 0.0, port: int = 0
    ) -> None:
        self.answer = answer
        self.requests_in_flight_max = requests_in_flight_max
        self.answer_delay_s = answer_delay_s
        self.requests: list[tuple[int, m.RequestBody]] = []
        self.errors: list[BaseException] = []
        self.conns: list[socket.socket] = []
        self.listener = socket.create_server(("127.0.0.1", port))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                s, _ = self.listener.accept()
            except OSError:
                return
            self.conns.append(s)
            threading.Thread(target=self._serve, args=(s, len(self.conns)), daemon=True).start()

    def _serve(self, s: socket.socket, number: int) -> None:
        conn = Connection(SERVER, requests_in_flight_max=self.requests_in_flight_max)
        try:
            while True:
                data = s.recv(65536)
                conn.receive_data(data)
                while (ev := conn.next_event()) is not NEED_DATA:
                    if isinstance(ev, Handshake):
                        s.sendall(conn.send(HandshakeAccepted(choose_version(ev), "fake")))
                    elif isinstance(ev, Request):
                        self.requests.append((number, ev.body))
                        if isinstance(ev.body, m.PingRequest):
                            body = m.PingResponse()
                        else:
                            body = self.answer(ev.body)
                            time.sleep(self.answer_delay_s)
                        if body is not None:
                            s.sendall(conn.send(Response(ev.request_id, body)))
                    elif isinstance(ev, ConnectionClosed):
                        return
        except OSError:
            return  # dropped by the test
        except Exception as e:  # noqa: BLE001 - the test looks at them
            self.errors.append(e)
            s.close()

    def drop_connections(self) -> None:
        for s in self.conns:
            with_suppress(s.shutdown, socket.SHUT_RDWR)
            s.close()

    def close(self) -> None:
        with_suppress(self.listener.shutdown, socket.SHUT_RDWR)  # wakes the accept()
        self.listener.close()
        self.drop_connections()


def with_suppress(fn, *args) -> None:
    """``fn(*args)``, an OSError ignored (a socket closed already)."""
    try:
        fn(*args)
    except OSError:
        pass


@pytest.fixture
def fake_broker():
    """Makes FakeBrokers (``fake_broker(answer, ...)``), closed after the test."""
    brokers: list[FakeBroker] = []

    def make(*args, **kw) -> FakeBroker:
        brokers.append(FakeBroker(*args, **kw))
        return brokers[-1]

    yield make
    for b in brokers:
        b.close()


def produced(offset: int) -> m.ProduceResponse:
    """A ProduceResponse of a one-message batch stored at ``offset``."""
    return m.ProduceResponse(1, 0, offset, 1, 0)
