"""A broker SIGKILLed under load loses nothing acknowledged and duplicates nothing retried."""

from __future__ import annotations

import random
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

import headwater
from tests.support.broker_process import BrokerProcess, free_port

ROOT = Path(__file__).resolve().parent.parent


def crash_round(tmp: Path, seed: int, producers: int = 3, batches: int = 150, kills: int = 2) -> None:
    rng = random.Random(seed)
    port = free_port()
    data = tmp / "data"
    broker = BrokerProcess(data, "--flush", "sync", port=port).start()
    with headwater.connect(broker.address) as hw:
        hw.admin.create_queue("crash", partitions=4, ttl_s=None)
    acks = [tmp / f"acks-{k}.txt" for k in range(producers)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.support.producer_proc", broker.address, f"p{k}", str(batches), str(acks[k])],
            cwd=ROOT,
        )
        for k in range(producers)
    ]
    try:
        for _ in range(kills):
            time.sleep(rng.uniform(0.3, 1.2))
            broker.kill()  # SIGKILL mid-stream
            time.sleep(rng.uniform(0.05, 0.5))
            broker = BrokerProcess(data, "--flush", "sync", port=port).start()
        for p in procs:
            assert p.wait(180) == 0, f"a producer failed (seed {seed})"
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    with headwater.connect(broker.address) as hw:
        bodies = Counter(r.body.decode() for r in hw.scanner("crash"))
    broker.terminate()
    dupes = {b: n for b, n in bodies.items() if n > 1}
    assert not dupes, f"duplicated after retries (seed {seed}): {list(dupes)[:5]}"
    acked = [line.strip() for f in acks for line in f.read_text().splitlines()]
    assert len(acked) == producers * batches  # every producer finished every batch
    missing = [f"{b}-{j}" for b in acked for j in range(10) if f"{b}-{j}" not in bodies]
    assert not missing, f"acknowledged but lost (seed {seed}): {missing[:5]}"


def test_broker_sigkill_under_load(tmp_path):
    crash_round(tmp_path, seed=random.randrange(1 << 30))


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(8))
def test_broker_sigkill_soak(tmp_path, seed):
    crash_round(tmp_path, seed, producers=4, batches=400, kills=5)
