"""A protocol fuzz run against a real broker process over TCP (issue 30): random bytes,
mutated valid frames, checksummed random bodies, deep nesting, wrong frame types and
pipelines. Every input is either served or refused with an error frame that says why;
none closes a connection silently, hangs it, or writes a traceback; the broker goes on
serving a well-behaved client. ``make test`` runs a 20,000-input slice, ``make test-all``
a million inputs."""

from __future__ import annotations

import os

import pytest

import headwater
from tests.support import wire_fuzz
from tests.support.broker_process import BrokerProcess

KEPT = "kept-by-the-test"


def fuzz_against_a_broker(tmp_path, count: int, seed: int) -> None:
    b = BrokerProcess(
        tmp_path / "data",
        "--set",
        f"frame_bytes_max={wire_fuzz.FRAME_BYTES_MAX}",
        "--set",
        "frame_timeout_s=5",
        "--set",
        f"fetch_bytes_max={wire_fuzz.FRAME_BYTES_MAX // 2}",
    ).start()
    try:
        with headwater.connect(b.address) as hw:
            hw.admin.create_queue(wire_fuzz.FUZZ_QUEUE, partitions=2)
            # a queue whose name no fuzzed request can hold (a fuzzed DELETE_QUEUE of "fuzz" is
            # a valid request, and served)
            hw.admin.create_queue(KEPT, partitions=2)
            hw.send_batch(KEPT, [b"before"] * 10, partition=0)
        report = wire_fuzz.run(b.port, seed=seed, count=count)
        print(f"{report.inputs:,} inputs in {report.seconds:.0f} s")
        for outcome, n in sorted(report.outcomes.items()):
            print(f"{n:>9,}  {outcome}")
        assert report.inputs == count
        assert not report.failures, "\n".join(report.failures[:20])
        assert b.alive(), "the broker died"
        with headwater.connect(b.address) as hw:  # it still serves, and nothing it held is lost
            hw.send_batch(KEPT, [b"after"] * 10, partition=1)
            assert [r.body for r in hw.scanner(KEPT, partitions=0)] == [b"before"] * 10
            assert [r.body for r in hw.scanner(KEPT, partitions=1)] == [b"after"] * 10
        served = sum(n for o, n in report.outcomes.items() if o.endswith(": served"))
        refused = sum(n for o, n in report.outcomes.items() if o.endswith("error frame"))
        assert served > count // 5 and refused > count // 5, report.outcomes  # the fuzz reached both sides
    finally:
        alive = b.alive()
        if alive:
            assert b.terminate() == 0
        log = b.log.read_text(errors="replace")
    assert "Traceback" not in log, log[log.index("Traceback") - 500 :][:3000]
    assert log.count("malformed") < 50, f"protocol errors must be logged once per interval: {log[-2000:]}"


def test_twenty_thousand_fuzzed_inputs(tmp_path):
    fuzz_against_a_broker(tmp_path, 20_000, seed=int(os.environ.get("HEADWATER_FUZZ_SEED", "30")))


@pytest.mark.slow
def test_a_million_fuzzed_inputs(tmp_path):
    fuzz_against_a_broker(tmp_path, 1_000_000, seed=int(os.environ.get("HEADWATER_FUZZ_SEED", "1030")))
