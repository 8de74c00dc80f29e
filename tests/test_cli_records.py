"""``scan``/``consume --from`` positions, ``--format``/``--raw`` templates and the ways
``produce`` takes its input (a whole file, a delimiter, a key per line), through the real
CLI (typer's CliRunner) on a fresh data directory per test."""

from __future__ import annotations

import pytest

from tests.support.command_line import DataCli


@pytest.fixture
def cli(tmp_path) -> DataCli:
    return DataCli(tmp_path / "data")


@pytest.fixture
def q(cli) -> str:
    """A queue of 3 partitions: 10 messages a0..a9 with key a, 4 messages b0..b3 with key b."""
    cli("queue", "create", "events", "--partitions", "3")
    cli("produce", "events", "--key", "a", *[f"a{i}" for i in range(10)])
    cli("produce", "events", "--key", "b", *[f"b{i}" for i in range(4)])
    return "events"


def _lines(out: str) -> list[str]:
    return out.splitlines()


# --- positions ------------------------------------------------------------------------


def test_scan_from_last_n_per_partition(cli, q):
    out = cli("scan", q, "--from", "-2", "--format", "%k=%v\\n").stdout
    assert sorted(_lines(out)) == ["a=a8", "a=a9", "b=b2", "b=b3"]
    # more than a partition holds: all of it
    assert len(_lines(cli("scan", q, "--from", "-100", "--raw").stdout)) == 14


def test_scan_from_earliest_latest_and_offset(cli, q):
    assert len(_lines(cli("scan", q, "--from", "earliest", "--raw").stdout)) == 14
    assert cli("scan", q, "--from", "latest", "--raw").stdout == ""
    assert sorted(_lines(cli("scan", q, "--from", "8", "--raw").stdout)) == ["a8", "a9"]


def test_consume_from_takes_the_same_positions(cli, q):
    last = cli("consume", q, "--from", "-1", "--timeout", "0", "--raw").stdout
    assert sorted(_lines(last)) == ["a9", "b3"]
    offset = cli("consume", q, "--from", "2", "--timeout", "0", "--raw").stdout
    assert sorted(_lines(offset)) == [f"a{i}" for i in range(2, 10)] + ["b2", "b3"]
    mid = cli("scan", q, "--from", "-3", "--format", "%i %v\\n").stdout.splitlines()
    first_id = next(line.split()[0] for line in mid if line.endswith("a7"))
    from_id = cli("consume", q, "--from", first_id, "--timeout", "0", "--raw").stdout
    assert _lines(from_id) == ["a7", "a8", "a9"]


def test_consume_group_from_last_n_moves_the_group_first(cli, q):
    out = cli("consume", q, "--group", "g", "--from", "-1", "--timeout", "0", "--raw").stdout
    assert sorted(_lines(out)) == ["a9", "b3"]
    # committed: the next run has nothing new
    assert cli("consume", q, "--group", "g", "--timeout", "0", "--raw").stdout == ""


def test_bad_positions_say_what_is_accepted(cli, q):
    err = cli.error("scan", q, "--from", "-0")
    assert "--from: '-0' asks for the last 0 messages; use -N with N from 1" in err
    err = cli.error("consume", q, "--from", "soon", "--timeout", "0")
    assert "--from: 'soon' is not a position; use 'earliest', 'latest', -N (the last N messages" in err
    err = cli.error("scan", q, "--from", "yesterday")
    assert "a message id (e.g. 00000001-00000002-0000000000000064)" in err
    err = cli.error("consume", q, "--group", "g", "--from", "00000001-00000002-0000000000000003", code=1)
    assert "--from MESSAGE_ID and --group do not go together" in err


# --- formats --------------------------------------------------------------------------


def test_format_tokens(cli, tmp_path):
    cli("queue", "create", "t")
    cli("produce", "t", "--key", "k1", "--tag", "paid", "--property", "src=web", "hello")
    out = cli("scan", "t", "-f", "%t|%p|%o|%k|%K|%v|%S|%g|%h|%T|%I|%i|%%\\t\\n").stdout
    fields = out.rstrip("\n").split("|")
    assert fields[:9] == ["t", "0", "0", "k1", "2", "hello", "5", "paid", "src=web"]
    assert fields[9].isdigit() and fields[10].endswith("Z")
    assert len(fields[11]) == len("00000001-00000000-0000000000000000")
    assert fields[12] == "%\t"
    # no key: %K is -1, %k empty
    cli("produce", "t", "nokey")
    assert cli("scan", "t", "--from", "-1", "-f", "[%k][%K]").stdout == "[][-1]"


def test_raw_values_are_written_as_bytes(cli):
    cli("queue", "create", "bin")
    cli("produce", "bin", "--file", "-", input=b"\xff\x00\xfe")
    result = cli("scan", "bin", "--raw")
    assert result.stdout_bytes == b"\xff\x00\xfe\n"


def test_bad_formats_say_what_is_accepted(cli, q):
    err = cli.error("scan", q, "--format", "%q")
    assert "--format: unknown token %q in '%q'; use %v" in err and "%%" in err
    err = cli.error("scan", q, "--format", "\\x")
    assert "unknown escape \\x" in err
    err = cli.error("scan", q, "--format", "%v%")
    assert "ends with a lone '%'" in err
    err = cli.error("scan", q, "--raw", "--json", code=1)
    assert "--json and --raw do not go together" in err
    err = cli.error("consume", q, "--raw", "--format", "%v", "--timeout", "0")
    assert "--format and --raw do not go together" in err


# --- produce: files, delimiters, keys -------------------------------------------------


def test_produce_a_whole_file_as_one_message(cli, tmp_path):
    cli("queue", "create", "files")
    blob = bytes(range(256)) * 40 + b"\n\r\n\0"
    path = tmp_path / "blob.bin"
    path.write_bytes(blob)
    cli("produce", "files", "--key", "blob", "--file", str(path))
    assert cli("scan", "files", "-f", "%v").stdout_bytes == blob
    cli("produce", "files", "--file", "-", input=b"line 1\nline 2\n")
    assert cli("scan", "files", "--from", "-1", "-f", "%v").stdout_bytes == b"line 1\nline 2\n"


def test_produce_splits_on_a_delimiter_binary_safe(cli):
    cli("queue", "create", "d")
    cli("produce", "d", "--delimiter", "\\0", input=b"a\nb\0\xff\xfe\0\0last")
    assert cli("scan", "d", "-f", "[%v]").stdout_bytes == b"[a\nb][\xff\xfe][][last]"
    cli("queue", "create", "d2")
    cli("produce", "d2", "-D", "||", input=b"x||y||")
    assert cli("scan", "d2", "-f", "[%v]").stdout == "[x][y]"


def test_produce_key_per_line(cli):
    cli("queue", "create", "k", "--partitions", "2")
    cli("produce", "k", "--key-separator", ":", input="order-17:paid:card\nno separator\n:empty key\n")
    out = cli("scan", "k", "-f", "%K|%k|%v\\n").stdout
    assert sorted(out.splitlines()) == sorted(["8|order-17|paid:card", "-1||no separator", "0||empty key"])


def test_bad_produce_inputs_say_what_to_do(cli, tmp_path):
    cli("queue", "create", "p")
    err = cli.error("produce", "p", "--file", str(tmp_path / "missing.bin"))
    assert "No such file or directory" in err and "missing.bin" in err
    err = cli.error("produce", "p", "--file", "x", "body")
    assert "--file and MESSAGE arguments do not go together" in err
    err = cli.error("produce", "p", "--key", "k", "--key-separator", ":", input="a:b\n")
    assert "--key and --key-separator do not go together" in err
    err = cli.error("produce", "p", "--delimiter", "", input="a")
    assert "--delimiter: empty; give one or more characters" in err
    err = cli.error("produce", "p", "--delimiter", "\\q", input="a")
    assert "--delimiter: unknown escape \\q" in err and "\\xHH" in err
    assert cli("scan", "p", "--raw").stdout == ""  # nothing was sent


# --- safety: truncate confirms, reset plans -------------------------------------------


def test_truncate_confirms_like_delete(cli, q):
    err = cli.error("queue", "truncate", q)
    assert "refusing to truncate queue 'events' without confirmation" in err and "pass --yes" in err
    assert len(cli("scan", q, "--raw").stdout.splitlines()) == 14  # nothing dropped
    assert "truncated queue 'events'" in cli("queue", "truncate", q, "--yes").stdout
    assert cli("scan", q, "--raw").stdout == ""


def test_group_reset_shows_the_plan_unless_execute(cli, q):
    import json

    cli("consume", q, "--group", "g", "--from", "earliest", "--timeout", "0", "--raw")
    plan = cli("group", "reset", "g", "--queue", q, "--to", "-3").stdout
    assert "lag change" in plan and "plan only, nothing changed: pass --execute" in plan
    doc = json.loads(cli("group", "reset", "g", "--queue", q, "--to", "earliest", "--json").stdout)
    assert doc["executed"] is False
    rows = {r["partition"]: r for r in doc["partitions"]}
    assert rows[0]["current"] == rows[0]["lag_new"] + rows[0]["new"] and rows[0]["lag_current"] == 0
    # nothing moved: the group still has nothing to read
    assert cli("consume", q, "--group", "g", "--timeout", "0", "--raw").stdout == ""
    done = cli("group", "reset", "g", "--queue", q, "--to", "-1", "--execute").stdout
    assert "reset group 'g' on queue 'events'" in done
    assert sorted(cli("consume", q, "--group", "g", "--timeout", "0", "--raw").stdout.split()) == ["a9", "b3"]


def test_group_reset_past_the_log_end_plans_the_end_and_says_so(cli):
    # the plan used to show 'new 99 ... (lag -98)' and --execute then failed: beyond the log end
    import json

    cli("queue", "create", "gq", "--partitions", "2")
    cli("produce", "gq", "--partition", "0", "m")
    cli("produce", "gq", "--partition", "1", "m", "m", "m")
    plan = " ".join(cli("group", "reset", "hg", "--queue", "gq", "--to", "2").stdout.split())
    assert "1 (log end)" in plan and "lag -" not in plan, plan
    assert (
        "note: offset 2 is past the log end of partition(s) 0: each is set to its log end instead, "
        "as kafka-consumer-groups does"
    ) in plan
    doc = json.loads(cli("group", "reset", "hg", "--queue", "gq", "--to", "99", "--json").stdout)
    assert [(r["requested"], r["new"], r["lag_new"]) for r in doc["partitions"]] == [(99, 1, 0), (99, 3, 0)]
    done = cli("group", "reset", "hg", "--queue", "gq", "--to", "2", "--execute").stdout
    assert "reset group 'hg' on queue 'gq' (2 partition(s))" in done
    rows = json.loads(cli("group", "describe", "hg", "--json").stdout)["partitions"]
    assert [(r["partition"], r["committed"]) for r in rows] == [(0, 1), (1, 2)]  # what the plan showed
    cli("queue", "truncate", "gq", "--yes")  # both logs now start at their end
    plan = " ".join(cli("group", "reset", "hg", "--queue", "gq", "--to", "0").stdout.split())
    assert "1 (log start)" in plan and "3 (log start)" in plan
    assert "note: offset 0 is before the log start of partition(s) 0, 1: each is set to its log start" in plan
