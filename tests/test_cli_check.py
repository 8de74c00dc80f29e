"""``headwater check`` verifies every segment and reports what is damaged, changing nothing;
``check --repair`` repairs, keeping what it cuts in quarantine."""

import json
import os
import subprocess
import sys
from pathlib import Path

HEADWATER = str(Path(sys.executable).with_name("headwater"))


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [HEADWATER, *args], capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "200"}
    )


def _files(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def test_check_reports_intact_then_repairs_damage_only_when_asked(tmp_path):
    d = str(tmp_path / "d")
    assert run("--data", d, "queue", "create", "q").returncode == 0
    assert run("--data", d, "produce", "q", "a", "b", "c").returncode == 0
    ok = run("--data", d, "check")
    assert ok.returncode == 0 and "every batch is intact" in ok.stdout
    seg = next((tmp_path / "d" / "log").glob("*.log"))
    with open(seg, "ab") as f:
        f.write(b"torn write")
    before = _files(tmp_path / "d")
    # read-only commands and check without --repair change no file, and say what repairs
    for args in (["check"], ["queue", "list"], ["scan", "q", "--json"], ["status"]):
        r = run("--data", d, *args)
        # check says so by its exit status too (3: damage found), for scripts and cron jobs
        assert r.returncode == (3 if args == ["check"] else 0), r.stderr
        said = r.stdout + r.stderr
        assert "10 bytes at the end of" in said and "headwater check --repair" in said, (args, said)
        assert _files(tmp_path / "d") == before, args
    scan = run("--data", d, "scan", "q", "--json")
    assert [line.count('"value"') for line in scan.stdout.splitlines()] == [1, 1, 1]
    fixed = run("--data", d, "check", "--repair")
    assert fixed.returncode == 0 and "cut 10 bytes" in fixed.stdout, fixed.stdout
    assert f"copied to quarantine/{seg.stem}." in fixed.stdout
    (kept,) = (tmp_path / "d" / "quarantine").iterdir()
    assert kept.read_bytes() == b"torn write"
    again = run("--data", d, "check")
    assert again.returncode == 0 and "every batch is intact" in again.stdout
    scan = run("--data", d, "scan", "q", "--json")
    assert [line.count('"value"') for line in scan.stdout.splitlines()] == [1, 1, 1]


def test_check_on_missing_dir(tmp_path):
    r = run("--data", str(tmp_path / "nope"), "check")
    assert r.returncode == 1 and "no data directory" in r.stderr and "Traceback" not in r.stderr


def test_check_takes_data_after_the_command_as_its_error_messages_say(tmp_path):
    """Damaged-data errors tell users to run 'headwater check --data DIR': it works, as
    'headwater --data DIR check' does; two different directories are refused."""
    d = str(tmp_path / "d")
    assert run("--data", d, "queue", "create", "q").returncode == 0
    with open(next((tmp_path / "d" / "log").glob("*.log")), "ab") as f:
        f.write(b"torn write")
    cut = run("check", "--data", d, "--repair")  # it checks that directory, not ./headwater-data
    assert cut.returncode == 0 and "cut 10 bytes" in cut.stdout
    assert run("--data", d, "check", "-d", d).returncode == 0  # the same directory twice is fine (and mended)
    both = run("--data", str(tmp_path / "other"), "check", "--data", d)
    assert both.returncode != 0 and "--data is given twice" in both.stderr and "Traceback" not in both.stderr
    over_network = run("--server", "127.0.0.1:1", "check", "--data", d)
    assert over_network.returncode != 0 and "check works on a data directory" in over_network.stderr


def test_check_exits_3_while_damage_inside_flushed_data_stays(tmp_path):
    """Damage inside flushed data is skipped, never cut: ``check`` exits 3 before a repair
    and after it (a cron job sees it every time until retention removes it); an intact
    store exits 0. Before, check exited 0 whatever it found."""
    d = str(tmp_path / "d")
    assert run("--data", d, "queue", "create", "q").returncode == 0
    for body in ("first", "second", "third"):
        assert run("--data", d, "produce", "q", body).returncode == 0
    seg = next((tmp_path / "d" / "log").glob("*.log"))
    raw = bytearray(seg.read_bytes())
    at = raw.find(b"second")
    raw[at] ^= 0xFF  # a flipped bit in the middle of the log, behind an fsync
    seg.write_bytes(bytes(raw))
    found = run("--data", d, "check")
    assert found.returncode == 3 and "damaged" in found.stdout, found.stdout + found.stderr
    mended = run("--data", d, "check", "--repair")
    assert mended.returncode == 3, mended.stdout + mended.stderr
    scan = run("--data", d, "scan", "q", "--json")
    assert scan.returncode == 0, scan.stderr
    values = [json.loads(line)["value"] for line in scan.stdout.splitlines()]
    assert values == ["first", "third"], values  # every other message stays readable
