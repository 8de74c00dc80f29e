"""The broker's bounded spin before its loop blocks (``idle_spin_us``): the setting's checks,
what ends a spin, the pause while spins find nothing, and the server watching each client's
socket from its admission to its end."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest

import headwater
from headwater.broker.idle_spin import IDLE_SPIN_US_DEFAULT, SPIN_PAUSE_SERVES, CountedExecutor, IdleSpin
from headwater.broker.server_config import ServerConfig
from headwater.errors import InvalidArgumentError
from tests.support.server_thread import ServerThread
from tests.support.waiting import poll_until, wait_for


@pytest.mark.parametrize("bad", [-1, 1001, 2.5, True, "100"])
def test_a_bad_spin_is_refused_naming_the_setting(bad):
    with pytest.raises(InvalidArgumentError, match=r"idle_spin_us must be a whole number from 0 to 1,000, got"):
        ServerConfig(idle_spin_us=bad).validated()


def test_the_default_spins_and_zero_turns_it_off():
    assert ServerConfig().validated().idle_spin_us == IDLE_SPIN_US_DEFAULT > 0
    off = IdleSpin(0)
    assert not off.enabled
    off.watch(0, object())  # nothing to watch with: no poller at all
    off.after_serve(asyncio.new_event_loop())
    assert off.spins == 0


@pytest.fixture
def pair():
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


def test_bytes_waiting_on_a_watched_socket_end_the_spin_as_a_hit(pair):
    a, b = pair
    spin = IdleSpin(1000)
    owner = object()
    spin.watch(b.fileno(), owner)
    a.send(b"request")
    spin._spin()
    assert (spin.spins, spin.hits) == (1, 1)
    b.recv(64)
    spin._spin()  # nothing waits now: the whole spin, a miss
    assert (spin.spins, spin.hits) == (2, 1)
    spin.close()


def test_spins_that_find_nothing_pause_then_one_looks_again(pair):
    a, b = pair
    spin = IdleSpin(50)
    spin.watch(b.fileno(), object())
    misses = 0
    while not spin.gate.paused:
        spin._spin()
        misses += 1
    assert misses == 11  # the share falls below a quarter (0.875 ** 11 < 0.25 <= 0.875 ** 10)
    for _ in range(SPIN_PAUSE_SERVES):
        spin._spin()  # paused: no spin at all
    assert spin.spins == 11
    a.send(b"x")
    spin._spin()  # the one that looks again finds a request: the spins go on
    assert (spin.spins, spin.hits, spin.gate.paused) == (12, 1, 0)
    spin.close()


def test_a_socket_number_taken_again_is_forgotten_only_by_its_owner(pair):
    a, b = pair
    spin = IdleSpin(50)
    old, new = object(), object()
    spin.watch(b.fileno(), old)
    spin.watch(b.fileno(), new)  # the number reused before the old owner was forgotten
    spin.forget(old)
    a.send(b"x")
    spin._spin()
    assert spin.hits == 1  # still watched for its new owner
    spin.forget(new)
    spin._spin()
    assert spin.hits == 1  # not watched: bytes waiting on it do not end the spin
    spin.close()


def test_no_spin_while_the_loops_work_runs_on_other_threads(pair):
    a, b = pair
    busy = [True]
    spin = IdleSpin(50, lambda: busy[0])
    spin.watch(b.fileno(), object())
    spin._spin()
    assert spin.spins == 0 and not spin.gate.paused  # not a miss either: it did not look
    busy[0] = False
    spin._spin()
    assert spin.spins == 1
    spin.close()


def test_the_counted_pool_knows_its_unfinished_jobs():
    pool = CountedExecutor(2, thread_name_prefix="test-counted")
    gate = threading.Event()
    try:
        jobs = [pool.submit(gate.wait, 10) for _ in range(3)]  # two run, one queued
        assert pool.busy == 3
        gate.set()
        for job in jobs:
            job.result(timeout=10)
        wait_for(lambda: pool.busy == 0, what="the finished jobs counted")
        cancelled = [pool.submit(time.sleep, 0.2) for _ in range(4)]
        assert cancelled[-1].cancel()  # queued behind two running: cancelled, counted as finished
        wait_for(lambda: pool.busy == 0, what="the cancelled job counted")
    finally:
        pool.shutdown(wait=True)
    with pytest.raises(RuntimeError):
        pool.submit(print)  # refused after shutdown: not counted
    assert pool.busy == 0


def test_one_spin_per_turn_of_the_loop_after_what_is_queued():
    loop = asyncio.new_event_loop()
    spin = IdleSpin(20)
    ran = []
    try:
        loop.call_soon(ran.append, "queued first")
        spin.after_serve(loop)
        spin.after_serve(loop)  # a second connection served in the same turn
        loop.call_soon(loop.stop)
        loop.run_forever()
    finally:
        loop.close()
        spin.close()
    assert ran == ["queued first"] and spin.spins == 1


def test_the_server_watches_each_client_from_admission_to_its_end(tmp_path):
    st = ServerThread(tmp_path / "data", server_settings={"idle_spin_us": 1000})
    spin = st.server.idle_spin
    try:
        first, second = headwater.connect(st.address), headwater.connect(st.address)
        first.admin.create_queue("q", partitions=1)
        producer = first.producer()
        for i in range(20):
            producer.send_and_wait("q", b"%d" % i, partition=0)
        assert second.admin.list_queues()
        assert len(st.call(lambda: dict(spin._watched))) == 2
        assert not st.call(st.server._threads_busy)  # nothing of the loop runs elsewhere: it may spin
        assert spin.spins + spin.gate.paused > 0  # it spun after serving (a hit or not is the machine's)
        second.close()
        wait_for(lambda: len(st.call(lambda: dict(spin._watched))) == 1, what="the closed client forgotten")
        assert len(st.call(lambda: dict(spin._fds))) == 1  # nothing of it kept
        consumer = first.consumer()
        consumer.assign("q")
        assert [r.body for r in poll_until(consumer, 20)] == [b"%d" % i for i in range(20)]
        consumer.close()
        producer.close()
        first.close()
    finally:
        st.stop()
    assert not spin.enabled  # closed with the server
