"""The alternating-rounds latency benchmark's arithmetic (the runs themselves need servers)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.latency import summarize
from bench.peers.base import SPIN_NS, Mode

MODES = {
    "headwater async": Mode("headwater async", "async", False, ""),
    "headwater sync": Mode("headwater sync", "sync", True, ""),
    "redis everysec": Mode("redis everysec", "everysec", False, ""),
    "redis always": Mode("redis always", "always", True, ""),
}


def rnd(n: int, **p99: float | None) -> dict:
    results = {
        label.replace("_", " "): ({"p99_ms": v} if v is not None else {"error": "boom"}) for label, v in p99.items()
    }
    return {"round": n, "results": results}


def test_each_round_compares_headwater_with_that_rounds_best_comparable_peer():
    rounds = [
        rnd(1, headwater_async=2.0, headwater_sync=3.0, redis_everysec=1.0, redis_always=2.0),
        rnd(2, headwater_async=1.0, headwater_sync=1.5, redis_everysec=4.0, redis_always=0.5),
    ]
    s = summarize(rounds, MODES)
    # async is held to every peer mode; sync only to those that fsync before acknowledging
    assert s["ratio_to_best_peer"]["headwater async"] == pytest.approx([2.0, 2.0])
    assert s["ratio_to_best_peer"]["headwater sync"] == pytest.approx([1.5, 3.0])
    assert s["peers_compared"] == {
        "headwater async": ["redis everysec", "redis always"],
        "headwater sync": ["redis always"],
    }
    assert s["p99"]["redis everysec"] == {
        "median": 2.5,
        "min": 1.0,
        "max": 4.0,
        "rounds": 2,
        "quiet_median": None,
        "quiet_rounds": 0,
    }


def test_a_failed_run_counts_in_no_median_and_leaves_its_rounds_ratio_empty():
    rounds = [
        rnd(1, headwater_async=None, headwater_sync=2.0, redis_everysec=1.0, redis_always=None),
        rnd(2, headwater_async=3.0, headwater_sync=2.0, redis_everysec=1.5, redis_always=1.0),
    ]
    s = summarize(rounds, MODES)
    assert s["p99"]["headwater async"]["rounds"] == 1
    assert s["ratio_to_best_peer"]["headwater async"] == [None, pytest.approx(3.0)]
    assert s["ratio_to_best_peer"]["headwater sync"] == [None, pytest.approx(2.0)]  # no durable peer in round 1


def test_quiet_runs_are_those_the_hypervisor_took_little_from():
    def run(p99: float, steal: float | None) -> dict:
        return {"p99_ms": p99, "steal_share": steal}

    rounds = [
        {"round": 1, "results": {"headwater async": run(3.0, 0.02)}},
        {"round": 2, "results": {"headwater async": run(0.8, 0.0)}},
        {"round": 3, "results": {"headwater async": run(0.9, 0.002)}},
        {"round": 4, "results": {"headwater async": run(0.5, None)}},
    ]  # steal unknown: not quiet
    p99 = summarize(rounds, MODES)["p99"]["headwater async"]
    assert p99["median"] == pytest.approx(0.85)
    assert p99["quiet_median"] == pytest.approx(0.85) and p99["quiet_rounds"] == 2


def test_the_steal_share_is_the_hypervisors_part_of_the_cpu_time_between_two_readings():
    from bench.machine import host_cpu_ticks, steal_share

    before = (100, 0, 50, 800, 0, 0, 0, 10)
    after = (200, 0, 100, 1640, 0, 0, 0, 20)  # 1,000 ticks in all, 10 of them stolen
    assert steal_share(before, after) == pytest.approx(0.01)
    assert steal_share(before, before) is None
    now = host_cpu_ticks()
    assert len(now) == 8 and sum(now) > 0  # Linux: the machine has run


def test_a_latency_splits_into_the_producers_lateness_and_the_transit_from_the_send_call():
    from bench.peers.base import LATENCY_WARMUP, latency_figures

    ms = 1_000_000
    stamps = [(0, LATENCY_WARMUP - 1, 50 * ms, 0)]  # warm-up: not counted
    # 99 messages sent on time, 0.2 ms in transit; one sent 4 ms late, then 0.3 ms in transit
    stamps += [(i * ms, LATENCY_WARMUP + i, i * ms + ms // 5, i * ms) for i in range(99)]
    stamps += [(99 * ms, LATENCY_WARMUP + 99, 103 * ms + 3 * ms // 10, 103 * ms)]
    f = latency_figures(stamps)
    assert f["counted"] == 100
    assert f["p50_ms"] == pytest.approx(0.2) and f["p99_ms"] == pytest.approx(4.3)  # the 100th of 100
    assert f["transit_p50_ms"] == pytest.approx(0.2) and f["transit_p99_ms"] == pytest.approx(0.3)
    assert latency_figures(stamps[:1]) is None


def test_the_cpu_of_a_process_group_is_counted_and_nobody_elses():
    import subprocess
    import sys
    import time

    from bench.peers.base import process_group_cpu_s

    busy = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.5: pass\ntime.sleep(30)",
        ],
        start_new_session=True,
    )
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        while process_group_cpu_s(busy.pid) < 0.45 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert 0.45 <= process_group_cpu_s(busy.pid) < 5
        assert process_group_cpu_s(idle.pid) < 0.3  # its start-up only
        assert process_group_cpu_s(2**22 + 12345) == 0  # no such group
    finally:
        busy.kill()
        idle.kill()
        busy.wait()
        idle.wait()


def test_the_rounds_run_at_the_rate_asked_for():
    from bench.latency import main, run_rounds

    class Driver:
        def __init__(self) -> None:
            self.rates: list[tuple[int, int]] = []

        def use_mode(self, mode) -> None: ...

        def reset(self, mode, streams: int) -> None: ...

        def latency(self, mode, *, rate: int, seconds: float, size: int, spin_ns: int) -> dict:
            self.rates.append((rate, spin_ns))
            return {"p50_ms": 0.1, "p99_ms": 0.2, "late_sends": 0}

    d = Driver()
    rounds = run_rounds([("x", d, None)], rounds=2, seconds=0.1, rate=500, log=lambda line: None)
    assert d.rates == [(500, SPIN_NS), (500, SPIN_NS)] and len(rounds) == 2
    run_rounds([("x", d, None)], rounds=1, seconds=0.1, rate=500, spin_ns=0, log=lambda line: None)
    assert d.rates[-1] == (500, 0)  # paced by sleeping alone
    for bad in (["--rate", "0"], ["--spin-us", "-1"], ["--spin-us", "500"]):  # 500 µs: the whole interval at 2,000/s
        with pytest.raises(SystemExit):
            main(bad)


def test_pacing_by_sleep_alone_asks_the_kernel_for_exact_wakeups():
    import subprocess
    import sys

    code = (
        "from bench import machine; ok = machine.exact_sleeps(); "
        "print(ok, open('/proc/self/timerslack_ns').read().strip())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parent.parent,
    ).stdout.split()
    assert out == ["True", "1"]  # 50,000 ns before
    from bench import machine

    t = machine.timer_lateness(rate=2000, seconds=0.05, spin_ns=0)
    assert t["ticks"] == 100 and 0 <= t["p50_ms"] <= t["max_ms"]


def test_the_python_floor_is_shown_but_is_nobodys_best_peer():
    modes = {**MODES, "python floor": Mode("python floor", "write", False, "", reference=True)}
    rounds = [rnd(1, headwater_async=2.0, headwater_sync=3.0, redis_everysec=1.0, redis_always=2.0, python_floor=0.5)]
    s = summarize(rounds, modes)
    assert s["ratio_to_best_peer"]["headwater async"] == pytest.approx([2.0])  # not 4.0
    assert "python floor" not in s["peers_compared"]["headwater async"]
    assert s["p99"]["python floor"]["median"] == 0.5


def test_the_relay_pushes_every_message_in_order_acknowledges_it_and_drops_only_a_garbled_connection(tmp_path):
    import doctest
    import socket

    import bench.relay
    from bench.peers.base import STAMP
    from bench.peers.floor import PythonFloor
    from bench.relay import frame

    assert doctest.testmod(bench.relay).failed == 0  # frames_in, which the relay and the floor's clients share

    d = PythonFloor(tmp_path, log=lambda msg: None)
    d.setup()
    try:
        mode = d.modes[0]
        with d.consumer(mode, 0) as poll:
            assert poll(0.05) == []  # subscribed; nothing yet
            bad = socket.create_connection(("127.0.0.1", d.port), timeout=5)
            bad.sendall(b"\xff\xff\xff\x7fgarbage")  # a length over the limit
            assert bad.recv(10) == b""  # that connection closed
            bad.close()
            with d.sender(mode, 0) as sender:
                bodies = [STAMP.pack(i, i) + bytes(80) for i in range(300)]
                for b in bodies:
                    sender.send(b)
                got: list[bytes] = []
                while len(got) < len(bodies):
                    more = poll(5.0)
                    assert more, f"only {len(got)} of {len(bodies)} pushed"
                    got += more
                assert got == bodies
                sender.wait_acked(timeout_s=10)
        assert (tmp_path / "relay-messages.bin").stat().st_size == sum(len(frame(0, b)) for b in bodies)
    finally:
        d.teardown()


def test_a_latency_run_through_the_relay_counts_every_message():
    import tempfile
    from pathlib import Path

    from bench.peers.floor import PythonFloor

    with tempfile.TemporaryDirectory() as tmp:
        d = PythonFloor(Path(tmp), log=lambda msg: None)
        d.setup()
        try:
            res = d.latency(d.modes[0], rate=1000, seconds=0.5, size=100)
            slept = d.latency(d.modes[0], rate=1000, seconds=0.5, size=100, spin_ns=0)
        finally:
            d.teardown()
    for r in (res, slept):
        assert "error" not in r, r
        assert r["received"] == r["sent"] and r["counted"] == r["sent"] - 200
        assert 0 < r["p50_ms"] <= r["p99_ms"] <= r["max_ms"]
    assert slept["cpu_us_per_msg"]["producer_spin"] < 1  # µs per message: it never spun


def test_saved_runs_pool_into_bands_of_the_hosts_steal(tmp_path, capsys):
    import doctest
    import json

    import bench.latency
    from bench.latency import STEAL_BANDS, main, pool_by_steal

    assert doctest.testmod(bench.latency).failed == 0

    def run(p99: float, steal: float | None, p50: float = 0.1, server: float | None = 100.0) -> dict:
        return {
            "p99_ms": p99,
            "p50_ms": p50,
            "steal_share": steal,
            "achieved_rate": 2000,
            "cpu_us_per_msg": {"server": server, "consumer": 50.0, "producer": 100.0, "producer_spin": 40.0},
        }

    a = {
        "rounds": [
            {"results": {"headwater async": run(0.8, 0.0, p50=0.3), "python floor": run(0.9, 0.004)}},
            {"results": {"headwater async": run(3.0, 0.03), "python floor": {"error": "boom"}}},
        ]
    }
    b = {
        "revision": "abc1234",
        "rounds": [
            {"results": {"headwater async": run(1.0, 0.0019, p50=0.5, server=None), "python floor": run(40.0, 0.5)}},
            {"results": {"headwater async": run(9.0, None)}},
        ],
    }  # steal unknown: left out
    pooled = pool_by_steal([a, b])
    assert len(pooled["headwater async"]) == len(STEAL_BANDS)
    assert [[r["p99_ms"] for r in band] for band in pooled["headwater async"]] == [[0.8, 1.0], [], [3.0], [], []]
    assert [[r["p99_ms"] for r in band] for band in pooled["python floor"]] == [[], [0.9], [], [], [40.0]]
    paths = []
    for i, doc in enumerate((a, b)):
        paths.append(tmp_path / f"{i}.json")
        paths[-1].write_text(json.dumps(doc))
    assert main(["--pool", *map(str, paths)]) == 0
    out = capsys.readouterr().out
    assert "0.90 (2)" in out and "40.00 (1)" in out  # p99: median (runs) per band
    assert "0.40 (2)" in out  # p50 of the two quietest headwater runs
    assert "0.80, 1.00" in out  # each quietest run's p99
    assert "0.50 (2)" in out  # CPUs busy: 250 µs per message at 2,000/s, of the runs whose sides are all known
    assert "from 2 saved run(s)" in out and "abc1234" in out and "unrecorded" in out  # the code each run measured


def test_a_latency_runs_cpu_adds_up_to_a_share_of_the_machine():
    import doctest

    import bench.network
    from bench.network import cpu_note

    assert doctest.testmod(bench.network).failed == 0
    cpu = {"server": 100.0, "consumer": 50.0, "producer": 100.0, "producer_spin": 40.0}
    assert cpu_note(cpu, 2000).endswith("in all 250, 0.50 CPUs at 2,000/s")
    assert "in all" not in cpu_note(cpu)  # no rate, no share
    assert "in all" not in cpu_note({**cpu, "server": None}, 2000)  # a side unknown


def test_halt_polling_is_set_for_the_run_and_put_back_even_after_an_error(tmp_path):
    from bench import machine

    knob = tmp_path / "guest_halt_poll_ns"
    knob.write_text("0\n")
    with pytest.raises(RuntimeError):
        with machine.halt_polling(500_000, path=str(knob)) as before:
            assert before == 0 and machine.halt_poll_ns(str(knob)) == 500_000
            raise RuntimeError("the run failed")
    assert machine.halt_poll_ns(str(knob)) == 0
    with pytest.raises(OSError, match="no guest halt polling"):
        with machine.halt_polling(1, path=str(tmp_path / "absent")):
            pass


def test_halt_polling_out_of_range_is_refused_before_anything_runs(capsys):
    from bench.latency import main

    with pytest.raises(SystemExit):
        main(["--halt-poll-us", "20000", "--systems", "floor"])
    assert "--halt-poll-us must be from 0 to 10000" in capsys.readouterr().err


@pytest.mark.parametrize("system", ["headwater", "headwater-aio", "headwater-1inflight"])
def test_a_short_latency_run_of_each_headwater_client_receives_every_message(system, tmp_path):
    """The runs' plumbing (not a figure): the blocking and the asyncio client's producer and
    consumer processes against a real ``headwater serve``, every message counted once."""
    from bench.peers import driver_class
    from bench.peers.base import LATENCY_WARMUP

    driver = driver_class(system)(tmp_path)
    mode = driver.modes[0]
    try:
        driver.setup()
        driver.use_mode(mode)
        driver.reset(mode, 1)
        if not driver.async_client:  # the setting each blocking system is measured with
            hw = driver._connect()
            try:
                assert driver.latency_producer(hw).max_in_flight == (1 if system == "headwater-1inflight" else 5)
            finally:
                hw.close()
        out = driver.latency(mode, rate=500, seconds=0.6, size=100)
    finally:
        driver.teardown()
    assert "error" not in out, out
    assert out["received"] == out["sent"] == LATENCY_WARMUP + 300  # the warm-up, then the counted sends
    assert out["p50_ms"] > 0 and out["p99_ms"] >= out["p50_ms"]
