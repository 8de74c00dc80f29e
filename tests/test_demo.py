"""The demo pipeline (headwater.demo.pipeline): the generator, the page-view rule and the
arithmetic of the results without Spark; then the whole pipeline end to end in a
subprocess with 20,000 lines (a broker, a JVM, a streaming query and a batch job: 25-55 s
on the 2-core development machine), and Ctrl-C in the middle of a run."""

from __future__ import annotations

import doctest
import os
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from headwater.demo import accesslog, report, stats
from headwater.demo.stats import compare, parse_line, stats_of_messages, stats_of_truth, top_pages

# make test runs these alone, after the rest: the demo runs Spark, whose JVM takes both cores
pytestmark = pytest.mark.serial

ROOT = Path(__file__).resolve().parent.parent


def generated(events: int, **kw) -> tuple[list[accesslog.LogLine], accesslog.Truth]:
    truth = accesslog.Truth()
    lines = [line for chunk in accesslog.generate(events, truth=truth, **kw) for line in chunk]
    return lines, truth


# -- the generator -------------------------------------------------------------------


def test_the_generator_writes_exactly_the_lines_asked_for_and_repeats_with_its_seed():
    lines, truth = generated(12_000)
    assert len(lines) == truth.lines == 12_000
    again, _ = generated(12_000)
    assert [x.text for x in again] == [x.text for x in lines]
    other, _ = generated(12_000, seed=6)
    assert [x.text for x in other] != [x.text for x in lines]
    with pytest.raises(ValueError, match="too few"):
        accesslog.check_settings(500, 10)


def test_the_page_view_rule_finds_exactly_what_the_generator_counted():
    """The generator decides each line's kind and counts it; parsing the text with the
    rule the Spark jobs apply must find the same page views and visitors, all of them."""
    lines, truth = generated(30_000, minutes=3)
    views: Counter = Counter()
    visitors: defaultdict = defaultdict(set)
    page_visitors: defaultdict = defaultdict(set)
    for line in lines:
        p = parse_line(line.text.decode())
        assert p is not None, line.text  # every line is in the combined log format
        assert line.key == p.visitor.encode()  # produced under the client's address
        if p.page is not None:
            w = p.time_s - p.time_s % 60
            views[(w, p.page)] += 1
            visitors[w].add(p.visitor)
            page_visitors[(w, p.page)].add(p.visitor)
    parsed = {k: (n, len(page_visitors[k])) for k, n in views.items()}
    per_window = Counter()
    for (w, _), n in views.items():
        per_window[w] += n
    parsed.update({(w, None): (n, len(visitors[w])) for w, n in per_window.items()})
    assert compare(stats_of_truth(truth), parsed) == []
    # every kind of line that is not a page view is there, and is not counted
    assert {"asset", "post", "missing", "error", "crawler", "health"} <= set(truth.kinds)
    assert truth.total_views == truth.kinds["view"] < truth.lines


def test_the_traffic_is_skewed_nearly_ordered_and_closed_by_the_tail():
    lines, truth = generated(60_000)
    page_views: Counter = Counter()
    for (_, page), n in truth.views.items():
        page_views[page] += n
    ranked = [n for _, n in page_views.most_common()]
    assert sum(ranked[: len(ranked) // 10]) > 0.5 * sum(ranked)  # a tenth of the pages: most views
    per_visitor = Counter(p.visitor for p in map(parse_line, (x.text.decode() for x in lines)) if p.page)
    counts = sorted(per_visitor.values(), reverse=True)
    assert counts[0] > 20 * counts[len(counts) // 2]  # heavy visitors and a long tail

    # no line is more than LATENESS_S_MAX behind the latest before it: a watermark of a
    # minute drops nothing
    latest = 0
    for x in lines:
        t = parse_line(x.text.decode()).time_s
        assert t >= latest - accesslog.LATENESS_S_MAX
        latest = max(latest, t)
    windows = sorted(truth.per_window())
    assert len(windows) == 10 and windows[0] == int(accesslog.START.timestamp())
    # the health checks after the traffic carry event time past the last window's end plus
    # the watermark's minute, so that every window closes
    assert truth.last_time_s - 60 >= windows[-1] + 60


# -- results and their arithmetic ----------------------------------------------------


def test_results_from_page_stats_messages_and_their_comparison():
    bodies = [
        b'{"window_start":"2025-03-04T09:00:00Z","page":"/","views":5,"users":3}',
        b'{"window_start":"2025-03-04T09:00:00Z","page":"/cart","views":2,"users":2}',
        b'{"window_start":"2025-03-04T09:00:00Z","views":7,"users":4}',  # Spark omits a null page
        b'{"window_start":"2025-03-04T09:01:00Z","page":"/","views":1,"users":1}',
        b'{"window_start":"2025-03-04T09:01:00Z","views":1,"users":1}',
    ]
    got, repeated = stats_of_messages(bodies)
    nine = 1741078800
    assert got == {
        (nine, "/"): (5, 3),
        (nine, "/cart"): (2, 2),
        (nine, None): (7, 4),
        (nine + 60, "/"): (1, 1),
        (nine + 60, None): (1, 1),
    }
    assert repeated == 0
    assert stats_of_messages(bodies + bodies[:2])[1] == 2
    assert compare(got, dict(got)) == []
    changed = {**got, (nine, "/cart"): (3, 2)}
    del changed[(nine + 60, "/")]
    assert compare(got, changed) == [
        "09:00 /cart: expected 2 views/2 visitors, got 3 views/2 visitors",
        "09:01 /: expected 1 views/1 visitors, got nothing",
    ]
    assert len(compare(got, {}, limit=2)) == 3  # two, and "... and 3 more"
    windows, top = top_pages(got, 1)
    assert windows == [nine, nine + 60] and top == [("/", 6, [5, 1])]


def test_the_tables_render(capsys):
    from rich.console import Console

    _, truth = generated(8_000, minutes=2)
    results = stats_of_truth(truth)
    console = Console(width=100, force_terminal=False)
    console.print(report.top_pages_table(results))
    console.print(report.minutes_table(results))
    console.print(report.checks_table([("a check", True, "fine"), ("another", False, "off by one")]))
    out = capsys.readouterr().out
    assert "Top pages, 09:00–09:02 UTC" in out and " / " in out and "MISMATCH" in out
    assert "09:01" in out


def test_docstring_examples():
    for module in (stats, report):
        result = doctest.testmod(module)
        assert result.failed == 0 and result.attempted > 0, module.__name__


def test_help_and_bad_arguments_need_no_broker_or_spark():
    run = subprocess.run(
        [sys.executable, "-m", "headwater.demo.pipeline", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0 and "--events" in run.stdout and "--keep" in run.stdout
    run = subprocess.run(
        [sys.executable, "-m", "headwater.demo.pipeline", "--events", "10"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2 and "too few" in run.stderr


# -- end to end ----------------------------------------------------------------------


def _children(pid: int) -> set[int]:
    """Every process descended from ``pid``, now."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _alive(pids: set[int]) -> set[int]:
    alive = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            alive.add(pid)
    return alive


def test_the_pipeline_runs_end_to_end_and_its_totals_match(tmp_path):
    env = {**os.environ, "TMPDIR": str(tmp_path), "COLUMNS": "100"}
    t0 = time.monotonic()
    run = subprocess.run(
        [sys.executable, "-m", "headwater.demo.pipeline", "--events", "20000"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    took = time.monotonic() - t0
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    passed = [line for line in run.stdout.splitlines() if line.startswith("PASS: ")]
    assert passed, run.stdout[-3000:]
    assert "generator = streaming = batch" in passed[0]
    assert "Top pages" in run.stdout and "MISMATCH" not in run.stdout
    assert not list(tmp_path.glob("headwater-demo-*")), "the demo left its directory behind"
    print(f"demo with 20,000 events: {took:.1f} s")


def test_ctrl_c_stops_spark_and_the_broker_and_removes_the_directory(tmp_path):
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    demo = subprocess.Popen(
        [sys.executable, "-m", "headwater.demo.pipeline", "--events", "20000"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not any(p.stat().st_size for p in tmp_path.glob("headwater-demo-*/spark.log")):
            assert demo.poll() is None, demo.stdout.read()
            assert time.monotonic() < deadline, "the demo did not start Spark"
            time.sleep(0.2)
        time.sleep(3)  # the JVM and the broker are up
        family = _children(demo.pid)
        assert any("headwater" in Path(f"/proc/{p}/cmdline").read_text(errors="replace") for p in _alive(family)), (
            "no broker among the demo's processes"
        )
        demo.send_signal(signal.SIGINT)
        out, _ = demo.communicate(timeout=120)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait(30)
    assert demo.returncode == 130, out[-3000:]
    assert "interrupted" in out
    assert not list(tmp_path.glob("headwater-demo-*"))
    deadline = time.monotonic() + 30
    while _alive(family) and time.monotonic() < deadline:
        time.sleep(0.5)
    left = {p: Path(f"/proc/{p}/cmdline").read_text(errors="replace") for p in _alive(family)}
    assert not left, f"still running after the demo exited: {left}"


def test_the_demo_is_documented():
    doc = (ROOT / "docs" / "demo.md").read_text()
    for needle in ("python -m headwater.demo.pipeline", "--events", "--keep", "PASS", "watermark", "exactly once"):
        assert needle in doc, needle
