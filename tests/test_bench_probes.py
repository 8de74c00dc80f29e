"""The follow probe (python -m bench.probes follow) still drives the broker's server the way
the docs say: every one-message produce answered and pushed to the follower."""

from __future__ import annotations

import re

from bench import probes


def test_the_follow_probe_measures_every_produce_pushed_to_its_follower(capsys):
    probes.follow(n=300, rounds=1)  # raises if a produce was not pushed to the follower
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    for line, label in zip(lines, ("default TTL (7 days)", "no TTL")):
        m = re.fullmatch(rf"follow 1, {re.escape(label)}: ([\d.]+) µs of server CPU per one-message produce "
                         r"with a follower; (\d+) Python calls each", line)
        assert m, line
        assert float(m[1]) > 0 and int(m[2]) > 50
