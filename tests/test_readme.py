"""The README's tour works as written on a fresh directory, and again when run a second time.

A new user pastes the tour's blocks in order into one empty directory, and often pastes them
again. Both times every Python block must run (tests/support/doc_examples.py, against a real
``headwater serve`` standing in for the README's ``127.0.0.1:7070``) and every shell line must
succeed (tests/support/doc_shell.py, in one bash with its own ``headwater serve``), and the
output must show the work done: the scanner finds the ``paid`` message of ``customer-3``
(once the first time, twice the second), the group consumer reads what is new, no traceback.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import doc_shell
from tests.support.broker_process import BrokerProcess

# make test runs these alone, after the rest: its shell lines follow a consume for a fixed time
pytestmark = pytest.mark.serial

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
RUNNER = ROOT / "tests" / "support" / "doc_examples.py"
SCANNED = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{8}-[0-9a-f]{16} \d+ \d+ b'\{\"id\": 17", re.M)


def _python_blocks(work: Path, address: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    run = subprocess.run(
        [sys.executable, str(RUNNER), str(README), address],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-6000:]
    assert "Traceback" not in out, out[-6000:]
    return run.stdout


def _shell_blocks(work: Path, log: Path) -> str:
    script, failures = doc_shell.write(README, work)
    code = doc_shell.run_script(script, README.name, work, log, 200, PYTHONPATH=str(ROOT))
    out = log.read_text()
    assert code == 0, out[-8000:]
    assert not doc_shell.check_failures(work, failures, README.name)
    assert "Traceback" not in out, out[-8000:]
    return out


def test_the_tour_runs_twice_in_one_fresh_directory(tmp_path: Path):
    work = tmp_path / "work"
    work.mkdir()
    broker = BrokerProcess(tmp_path / "broker").start()  # the tour's "headwater serve"
    try:
        first = _python_blocks(work, broker.address)
        second = _python_blocks(work, broker.address)
    finally:
        broker.terminate()
    # the scanner reads the partition customer-3 hashes to: its paid message, then both
    assert len(SCANNED.findall(first)) == 1, first[-4000:]
    assert len(SCANNED.findall(second)) == 2, second[-4000:]
    assert "event 999" in first and "event 999" in second, second[-4000:]
    # the group committed: the second run reads only the 1,000 new events
    assert first.count("b'event ") == 1000 and second.count("b'event ") == 1000, second[-2000:]

    shell_first = _shell_blocks(work, tmp_path / "terminal-1.txt")
    shell_second = _shell_blocks(work, tmp_path / "terminal-2.txt")
    for out in (shell_first, shell_second):
        assert "listening 127.0.0.1:" in out and "uptime" in out, out[-6000:]
    # the python tour's 2 x 501 messages and the shell's first, then only the shell's second
    assert "consumed 1,003 message(s)" in shell_first, shell_first[-6000:]
    assert "consumed 1 message(s)" in shell_second, shell_second[-6000:]
