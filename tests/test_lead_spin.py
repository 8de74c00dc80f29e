"""The leading caller's bounded spin (``lead_spin_us``): its checks, 0 disables it, and a
connection lost while a caller spins still fails its call."""

from __future__ import annotations

import time

import pytest

from headwater.client.transport.async_transport import AsyncTransport
from headwater.client.transport.leading import LEAD_SPIN_US_DEFAULT, SPIN_PAUSE_LEADS
from headwater.client.transport.remote import RemoteService
from headwater.errors import InvalidArgumentError, UnavailableError
from headwater.model.batch import encode_batch
from tests.support.fake_broker import produced


class RecordingPoller:
    """A leader's poll() object that records each timeout it was given (ms)."""

    def __init__(self, poller) -> None:
        self.poller = poller
        self.timeouts_ms: list[int] = []

    def poll(self, timeout_ms: int):
        self.timeouts_ms.append(timeout_ms)
        return self.poller.poll(timeout_ms)


@pytest.mark.parametrize("bad", [-1, 10_001, 2.5, True, "50"])
def test_a_bad_spin_is_refused_naming_the_setting(bad):
    with pytest.raises(InvalidArgumentError, match="lead_spin_us must be a whole number of microseconds"):
        AsyncTransport("127.0.0.1:1", lead_spin_us=bad)
    with pytest.raises(InvalidArgumentError, match="lead_spin_us"):  # before it starts a thread
        RemoteService("127.0.0.1:1", lead_spin_us=bad)


def test_the_environment_sets_the_default_and_a_bad_value_is_named(monkeypatch):
    monkeypatch.delenv("HEADWATER_LEAD_SPIN_US", raising=False)
    assert AsyncTransport("127.0.0.1:1").lead_spin_us == LEAD_SPIN_US_DEFAULT
    monkeypatch.setenv("HEADWATER_LEAD_SPIN_US", "0")
    assert AsyncTransport("127.0.0.1:1").lead_spin_us == 0
    assert AsyncTransport("127.0.0.1:1", lead_spin_us=20).lead_spin_us == 20  # the argument wins
    monkeypatch.setenv("HEADWATER_LEAD_SPIN_US", "fifty")
    with pytest.raises(InvalidArgumentError, match="HEADWATER_LEAD_SPIN_US .* got 'fifty': fix or unset it"):
        AsyncTransport("127.0.0.1:1")


def _polls_of_one_produce(fake_broker, spin_us: int) -> list[int]:
    fake = fake_broker(lambda body: produced(3), answer_delay_s=0.02)  # answers after the spin ends
    svc = RemoteService(fake.address, lead_spin_us=spin_us)
    try:
        svc.produce("q", 0, encode_batch([b"x"]))  # the leader's poller exists from here
        link = svc.transport._link
        recording = link.poller = RecordingPoller(link.poller)
        assert svc.produce("q", 0, encode_batch([b"y"])).base_offset == 3
        return recording.timeouts_ms
    finally:
        svc.close()


def test_zero_disables_the_spin_and_a_spin_polls_without_blocking_first(fake_broker):
    without = _polls_of_one_produce(fake_broker, 0)
    assert without and 0 not in without  # it blocked in poll() at once
    spun = _polls_of_one_produce(fake_broker, 1000)
    assert spun[0] == 0 and any(t > 0 for t in spun)  # spun, then blocked: the answer came late


def test_a_connection_lost_while_the_caller_spins_fails_its_call(fake_broker):
    fake = fake_broker()

    def drop(body):
        fake.drop_connections()  # on the produce, while its caller spins
        return None

    fake.answer = drop
    svc = RemoteService(fake.address, request_timeout_s=30, lead_spin_us=10_000)
    try:
        t0 = time.monotonic()
        with pytest.raises(UnavailableError, match="lost"):
            svc.produce("q", 0, encode_batch([b"x"]))
        assert time.monotonic() - t0 < 10  # the loss, not the request's 30 s deadline
        svc.ping()  # the next call reconnects
    finally:
        svc.close()


def test_spins_that_keep_finding_nothing_pause_and_one_that_finds_its_answer_resumes_them():
    t = AsyncTransport("127.0.0.1:1", lead_spin_us=50)
    for _ in range(20):  # three in four found: spinning pays
        for found in (True, True, True, False):
            t._spin_gate.spun(found)
    assert t._spin_gate.paused == 0
    misses = 0
    while not t._spin_gate.paused:  # a broker now further than a spin reaches
        t._spin_gate.spun(False)
        misses += 1
    assert 5 <= misses <= 12 and t._spin_gate.paused == SPIN_PAUSE_LEADS  # about the last eight spins
    assert [t._spin_gate.may_spin() for _ in range(SPIN_PAUSE_LEADS + 1)] == [False] * SPIN_PAUSE_LEADS + [True]
    t._spin_gate.spun(True)  # the one that looks again finds its answer: the spins go on
    assert t._spin_gate.paused == 0


def test_a_far_broker_soon_gets_leads_that_block_at_once(fake_broker):
    fake = fake_broker(lambda body: produced(3), answer_delay_s=0.005)  # every answer after the spin
    svc = RemoteService(fake.address, lead_spin_us=1000)
    try:
        svc.produce("q", 0, encode_batch([b"x"]))  # the leader's poller exists from here
        link = svc.transport._link
        recording = link.poller = RecordingPoller(link.poller)
        firsts = []
        for _ in range(30):
            recording.timeouts_ms.clear()
            svc.produce("q", 0, encode_batch([b"y"]))
            firsts.append(recording.timeouts_ms[0])
        assert firsts[0] == 0  # spun first
        assert firsts[-1] > 0 and firsts.count(0) <= 12  # then blocked at once: no CPU burnt in spins
    finally:
        svc.close()
