"""How fast a ``headwater`` command starts: ``headwater --version`` and ``queue list`` against
a live broker, each run as a fresh process ``--runs`` times (default 20), alternated so that
the machine's load falls on both alike. Prints median and p90 of each and PASS/MISS against
the target (a command starts in under 0.3 s, issue 33), and the modules the slowest import
chain goes through (``python -X importtime``), which is where to make imports lazy.

    python -m bench.cli_start [--runs 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET_S = 0.3
ROOT = Path(__file__).resolve().parent.parent


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    for name in ("HEADWATER_DATA", "HEADWATER_SERVER"):
        env.pop(name, None)
    return env


def _headwater(*args: str) -> list[str]:
    # the console script's own entry point, as `headwater ...` runs it
    return [sys.executable, "-c", "from headwater.cli.main import main; main()", *args]


def _time_s(argv: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, env=_env(), check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def _start_broker(data: Path) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        _headwater("serve", "--data", str(data), "--port", "0"),
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("listening "):
        proc.kill()
        raise SystemExit(f"the broker did not start: {line!r}")
    return proc, line.split()[1].replace("0.0.0.0", "127.0.0.1")


def _slowest_imports(top: int = 8) -> list[tuple[int, str]]:
    run = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "from headwater.cli.main import main"],
        env=_env(),
        capture_output=True,
        text=True,
    )
    rows = []
    for line in run.stderr.splitlines():
        parts = line.split("|")
        if len(parts) == 3 and parts[1].strip().isdigit():
            rows.append((int(parts[1]), parts[2].rstrip()))
    return sorted(rows, reverse=True)[:top]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        broker, address = _start_broker(Path(tmp) / "data")
        try:
            cases = {
                "headwater --version": _headwater("--version"),
                "headwater queue list (broker)": _headwater("--server", address, "queue", "list"),
            }
            times: dict[str, list[float]] = {name: [] for name in cases}
            for _ in range(args.runs):
                for name, argv in cases.items():  # alternated: load falls on both alike
                    times[name].append(_time_s(argv))
        finally:
            broker.terminate()
            broker.wait(20)
    print(f"{'command':32} {'median s':>9} {'p90 s':>7}  target {TARGET_S} s")
    for name, samples in times.items():
        median = statistics.median(samples)
        p90 = statistics.quantiles(samples, n=10)[-1]
        verdict = "PASS" if median < TARGET_S else "MISS"
        print(f"{name:32} {median:9.3f} {p90:7.3f}  {verdict}")
    print("\nslowest imports of 'headwater.cli.main' (cumulative µs):")
    for us, module in _slowest_imports():
        print(f"  {us:>9,} {module}")


if __name__ == "__main__":
    main()
