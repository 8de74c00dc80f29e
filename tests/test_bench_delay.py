"""The delay benchmark's plumbing, on a small run: a window of times longer than the watch
is sent whole, delivered for its first seconds, and some of the rest cancelled
(docs/benchmarks.md, "Delayed messages")."""

from __future__ import annotations

from bench.delay import _print, run


def test_a_wide_window_is_accepted_whole_and_watched_for_its_first_seconds(capsys):
    r = run(2_000, 2, "async", "random", 1.0, window_s=3_600, watch_s=2, cancels=3)
    assert r["window_s"] == 3_600 and r["watched_s"] == 2
    assert 0 < r["due_watched"] < 2_000 and r["delivered"] == r["due_watched"]  # all those due in the watch
    assert r["plain_msgs_per_s"] > 0 and r["delayed_msgs_per_s"] > 0 and r["lateness_ms"] is not None
    assert len(r["cancel_ms"]) == 3 and len(r["delay_stats_ms"]) == 3
    _print(r)
    out = capsys.readouterr().out
    assert "due within 3600 s" in out and f"delivered {r['delivered']:,} of {r['due_watched']:,}" in out
    assert "cancels of messages due later: 3" in out and "ms a call)" in out
