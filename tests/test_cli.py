"""The ``headwater`` command line, run in-process (typer's CliRunner) on a fresh data
directory per test, plus a few runs of the installed entry point as a real subprocess."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import headwater
from headwater.cli import queues
from headwater.cli.main import app
from headwater.cli.output import iso_utc
from tests.support.command_line import ENV, DataCli

ID_LEN = len("00000001-00000000-0000000000000000")


@pytest.fixture
def cli(tmp_path) -> DataCli:
    return DataCli(tmp_path / "data")


@pytest.fixture
def q(cli) -> str:
    cli("queue", "create", "events", "--partitions", "3")
    return "events"


# --- queues ---------------------------------------------------------------------------


def test_create_list_describe(cli):
    out = cli(
        "queue",
        "create",
        "orders",
        "-p",
        "4",
        "--ttl",
        "3600",
        "--flush",
        "sync",
        "--message-bytes-max",
        "2048",
        "--set",
        "owner=web",
        "--set",
        "note=a=b",
    ).stdout
    assert "created queue 'orders' with 4 partition(s), ttl 1h" in out
    cli("queue", "create", "audit", "--ttl", "forever")
    cli("queue", "create", "zero", "--ttl", "0")
    table = cli("queue", "list").stdout
    assert "orders" in table and "audit" in table and "forever" in table and "sync" in table
    listed = json.loads(cli("queue", "list", "--json").stdout)
    assert [x["name"] for x in listed] == ["audit", "orders", "zero"]
    assert listed[0]["ttl_s"] is None and listed[2]["ttl_s"] is None
    d = json.loads(cli("queue", "describe", "orders", "--json").stdout)
    assert d["ttl_s"] == 3600 and d["flush"] == "sync" and d["message_bytes_max"] == 2048
    assert d["settings"] == {"owner": "web", "note": "a=b"}
    assert d["partitions"] == [{"partition": p, "start_offset": 0, "end_offset": 0} for p in range(4)]
    text = cli("queue", "describe", "orders").stdout
    assert "setting owner" in text and "start offset" in text and "1h (3600 s)" in text


def test_queue_locations_names_each_partitions_broker(cli, q):
    rows = json.loads(cli("queue", "locations", q, "--json").stdout)
    assert rows == [
        {"partition": p, "leader": -1, "address": None, "leader_epoch": 0, "replicas": [-1]} for p in range(3)
    ]
    table = cli("queue", "locations", q).stdout
    assert "this broker (alone)" in table and "this process (embedded)" in table and table.count("alone") == 3
    assert "queue 'nope' does not exist" in cli.error("queue", "locations", "nope")


def test_cluster_status_of_a_broker_alone_says_so(cli, q):
    assert "this broker runs alone (no cluster)" in cli("cluster", "status").stdout
    doc = json.loads(cli("cluster", "status", "--json").stdout)
    assert doc == {
        "cluster_id": None,
        "controller": -1,
        "brokers": [{"broker_id": -1, "address": None, "epoch": 0, "leads": 3}],
        "queues": 1,
        "partitions": 3,
        "leaderless": 0,
        "moves": [],
    }
    for args in (("rebalance",), ("rebalance", "--dry-run"), ("decommission", "1")):
        assert "this broker runs alone" in cli.error("cluster", *args)


def test_create_if_not_exists_leaves_the_queue_there_as_it_is(cli):
    cli("queue", "create", "orders", "-p", "4")
    err = cli.error("queue", "create", "orders", "-p", "8")
    assert "already exists" in err and "--if-not-exists" in err
    out = cli("queue", "create", "orders", "-p", "8", "--if-not-exists").stdout
    assert "queue 'orders' exists already, with 4 partition(s), ttl 7d; left as it is" in out
    assert len(json.loads(cli("queue", "describe", "orders", "--json").stdout)["partitions"]) == 4
    assert "created queue 'new'" in cli("queue", "create", "new", "--if-not-exists").stdout


def test_delete_if_exists_succeeds_when_the_queue_is_not_there(cli):
    cli("queue", "create", "scratch")
    assert "no queue 'nope'; nothing to delete" in cli("queue", "delete", "nope", "--yes", "--if-exists").stdout
    assert "does not exist" in cli.error("queue", "delete", "nope", "--yes")
    assert "deleted queue 'scratch'" in cli("queue", "delete", "scratch", "--yes", "--if-exists").stdout
    assert json.loads(cli("queue", "list", "--json").stdout) == []


def test_default_ttl_is_seven_days_and_empty_list_says_how_to_start(cli):
    cli("queue", "create", "a")
    assert json.loads(cli("queue", "describe", "a", "--json").stdout)["ttl_s"] == 7 * 86400
    cli("queue", "delete", "a", "--yes")
    assert "no queues yet" in cli("queue", "list").stdout


def test_truncate_disable_enable(cli, q):
    cli("produce", q, "a", "b", "c")
    assert "truncated" in cli("queue", "truncate", q, "--yes").stdout
    assert cli.json_lines("scan", q) == []
    parts = json.loads(cli("queue", "describe", q, "--json").stdout)["partitions"]
    assert all(p["start_offset"] == p["end_offset"] for p in parts)
    assert sum(p["end_offset"] for p in parts) == 3  # offsets keep counting up

    cli("queue", "disable", q)
    assert json.loads(cli("queue", "list", "--json").stdout)[0]["enabled"] is False
    err = cli.error("scan", q)
    assert "disabled" in err and "headwater queue enable" in err
    assert "disabled" in cli.error("produce", q, "x")
    cli("queue", "enable", q)
    cli("produce", q, "x")
    assert [r["value"] for r in cli.json_lines("scan", q)] == ["x"]


def test_delete_needs_yes_without_a_terminal(cli, q):
    err = cli.error("queue", "delete", q)
    assert "--yes" in err
    cli("queue", "describe", q)  # still there
    assert "deleted queue 'events'" in cli("queue", "delete", q, "--yes").stdout
    assert "does not exist" in cli.error("queue", "describe", q)


def test_delete_asks_on_a_terminal(cli, q, monkeypatch):
    monkeypatch.setattr(queues, "stdin_is_tty", lambda: True)
    result = cli("queue", "delete", q, input="n\n", code=1)
    assert "not deleted" in result.stderr
    cli("queue", "describe", q)
    cli("queue", "delete", q, input="y\n")
    assert json.loads(cli("queue", "list", "--json").stdout) == []


def test_add_partitions(cli, q):
    assert "now has 5 partitions" in cli("queue", "add-partitions", q, "--to", "5").stdout
    assert len(json.loads(cli("queue", "describe", q, "--json").stdout)["partitions"]) == 5
    cli("produce", q, "--partition", "4", "late")
    assert "must be larger" in cli.error("queue", "add-partitions", q, "--to", "2")


# --- produce ----------------------------------------------------------------------------


def test_produce_arguments_print_ids(cli, q):
    out = cli("produce", q, "one", "two", "--partition", "1").stdout.split()
    assert len(out) == 2 and all(len(i) == ID_LEN for i in out)
    recs = cli.json_lines("scan", q)
    assert [(r["message_id"], r["partition"], r["value"]) for r in recs] == [
        (out[0], 1, "one"),
        (out[1], 1, "two"),
    ]


def test_produce_stdin_lines_in_batches(cli, q):
    lines = "".join(f"line {i}\n" for i in range(1234)) + "crlf\r\n\nlast-without-newline"
    out = cli("produce", q, "--batch-size", "100", input=lines).stdout.split("\n")
    assert len([x for x in out if x]) == 1237
    values = [r["value"] for r in cli.json_lines("scan", q)]
    assert sorted(values) == sorted([f"line {i}" for i in range(1234)] + ["crlf", "", "last-without-newline"])
    # one partition per batch of 100 (round robin), so all three partitions get some
    counts = [p["end_offset"] for p in json.loads(cli("queue", "describe", q, "--json").stdout)["partitions"]]
    assert sum(counts) == 1237 and all(c > 0 for c in counts)


def test_produce_quiet_summary_key_tag_properties(cli, q):
    out = cli(
        "produce", q, "--quiet", "-k", "user-1", "-t", "greeting", "-P", "a=1", "-P", "b=x=y", input="hi\nho\n"
    ).stdout
    assert out.startswith("sent 2 message(s) to queue 'events' (partitions ")
    recs = cli.json_lines("scan", q)
    assert {r["partition"] for r in recs} == {headwater.client.key_partition(b"user-1", 3)}
    assert all(
        r["key"] == "user-1" and r["tag"] == "greeting" and r["properties"] == {"a": "1", "b": "x=y"} for r in recs
    )


# --- scan, get, find --------------------------------------------------------------------


def test_scan_json_keys_and_values(cli, q):
    [mid] = cli("produce", q, "-p", "2", "-k", "k", "-t", "t", "-P", "s=web", "héllo").stdout.split()
    [rec] = cli.json_lines("scan", q)
    assert list(rec) == [
        "message_id",
        "partition",
        "offset",
        "timestamp",
        "key",
        "tag",
        "properties",
        "value",
        "scheduled",
    ]  # the keys of before, in their places, and 'scheduled' last
    assert rec["scheduled"] is None  # sent without a delay
    assert rec["message_id"] == mid and rec["partition"] == 2 and rec["offset"] == 0
    assert rec["key"] == "k" and rec["tag"] == "t" and rec["properties"] == {"s": "web"}
    assert rec["value"] == "héllo"
    stored = cli_record(cli, mid)
    assert rec["timestamp"] == iso_utc(stored.timestamp_ms) and rec["timestamp"].endswith("Z")
    cli("produce", q, "-p", "0", "plain")
    plain = cli.json_lines("scan", q, "--partitions", "0")[0]
    assert plain["key"] is None and plain["tag"] is None and plain["properties"] == {}


def cli_record(cli: DataCli, mid: str):
    with headwater.open(cli.data) as hw:
        return hw.get(mid)


def test_scan_binary_is_base64(cli, q):
    cli("produce", q, "-p", "0", "--key", "\udcff\udcfe", input=b"\xff\x00\xfe\nok\n")
    recs = cli.json_lines("scan", q)
    assert recs[0]["value_encoding"] == "base64" and base64.b64decode(recs[0]["value"]) == b"\xff\x00\xfe"
    assert recs[0]["key_encoding"] == "base64" and base64.b64decode(recs[0]["key"]) == b"\xff\xfe"
    assert recs[1]["value"] == "ok" and "value_encoding" not in recs[1]
    assert "(base64) /wD+" in cli("scan", q).stdout


def test_scan_table(cli, q):
    ids = cli("produce", q, "-p", "1", *[f"m{i}" for i in range(150)]).stdout.split()
    result = cli("scan", q)
    rows = [line for line in result.stdout.splitlines() if line.strip().startswith(ids[0][:9])]
    assert len(rows) == 100 and ids[0] in rows[0] and "m0" in rows[0]
    assert "timestamp (UTC)" in result.stdout
    assert "showing the first 100" in result.stderr
    result = cli("scan", q, "--limit", "5")
    assert sum(i in result.stdout for i in ids) == 5 and "showing" not in result.stderr
    assert len(cli.json_lines("scan", q)) == 150  # --json streams everything
    assert len(cli.json_lines("scan", q, "-n", "7")) == 7


def test_scan_partitions_offsets_and_ids(cli, q):
    for p in range(3):
        cli("produce", q, "-p", str(p), *[f"p{p}-{i}" for i in range(10)])
    got = cli.json_lines("scan", q, "--partitions", "0,2", "--from", "3", "--to", "5")
    assert [r["value"] for r in got] == ["p0-3", "p0-4", "p2-3", "p2-4"]
    got = cli.json_lines("scan", q, "--partitions", "1-2", "--from", "8")
    assert [r["value"] for r in got] == ["p1-8", "p1-9", "p2-8", "p2-9"]
    mid = cli.json_lines("scan", q, "--partitions", "1")[6]["message_id"]
    got = cli.json_lines("scan", q, "--from", mid, "--limit", "2")
    assert [r["value"] for r in got] == ["p1-6", "p1-7"]  # an id pins its partition
    got = cli.json_lines("scan", q, "--to", mid)
    assert [r["value"] for r in got] == [f"p1-{i}" for i in range(6)]  # --to is exclusive


def test_scan_time_range(cli, q):
    cli("produce", q, "-p", "0", "old-1", "old-2")
    time.sleep(0.01)  # the next batch gets a later millisecond
    cli("produce", q, "-p", "1", "new-1")
    recs = cli.json_lines("scan", q)
    boundary = next(r["timestamp"] for r in recs if r["value"] == "new-1")
    assert [r["value"] for r in cli.json_lines("scan", q, "--from", boundary)] == ["new-1"]
    assert [r["value"] for r in cli.json_lines("scan", q, "--to", boundary)] == ["old-1", "old-2"]
    assert len(cli.json_lines("scan", q, "--from", "-1h", "--to", "now")) == 3
    assert cli.json_lines("scan", q, "--to", "-1d") == []
    assert len(cli.json_lines("scan", q, "--from=-15m")) == 3
    assert len(cli.json_lines("scan", q, "--from", "2000-01-01")) == 3
    assert "no messages in this range" in cli("scan", q, "--from", "2999-01-01T00:00:00+01:00").stdout


def test_scan_tags(cli, q):
    cli("produce", q, "-t", "paid", "a")
    cli("produce", q, "-t", "refunded", "b")
    cli("produce", q, "c")
    assert [r["value"] for r in cli.json_lines("scan", q, "--tag", "paid")] == ["a"]
    got = cli.json_lines("scan", q, "-t", "paid", "-t", "refunded")
    assert sorted(r["value"] for r in got) == ["a", "b"]


def test_get(cli, q):
    [mid] = cli("produce", q, "-k", "k1", "-P", "x=1", "value one").stdout.split()
    [rec] = cli.json_lines("get", mid)
    assert rec["message_id"] == mid and rec["value"] == "value one" and rec["properties"] == {"x": "1"}
    text = cli("get", mid).stdout
    assert mid in text and "value one" in text and "x=1" in text
    assert "not a message id" in cli.error("get", "nope")
    beyond = mid[:-4] + "ffff"  # same queue and partition, an offset not written yet
    assert "is not retained" in cli.error("get", beyond)
    assert "no queue has id 255" in cli.error("get", "000000ff" + mid[8:])


def _delivered(cli: DataCli, q: str, value: str, timeout_s: float = 10.0) -> dict:
    """The JSON line of the delayed message ``value`` once it was delivered. A data
    directory delivers what came due when a process opens it read-write (a broker, a
    program, a writing command); ``scan`` opens it read-only and changes nothing, so the
    loop opens it the way a program would."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = [r for r in cli.json_lines("scan", q) if r["value"] == value]
        if found:
            return found[0]
        time.sleep(0.05)
        with headwater.open(cli.data):
            pass  # opening delivers what is due (closing waits for the dispatcher's round)
    raise AssertionError(f"{value!r} was not delivered in {timeout_s} s")


def test_delayed_messages_show_their_scheduled_time(cli, q):
    cli("produce", q, "-p", "1", "plain")
    [delayed_id] = cli("produce", q, "-p", "1", "--delay", "300ms", "late").stdout.split()
    waiting = cli("get", delayed_id).stdout
    assert "1 (once delivered)" in waiting and "(waiting for it)" in waiting and "(accepted)" in waiting
    [pending] = cli.json_lines("get", delayed_id)
    assert pending["scheduled"].endswith("Z") and pending["scheduled"] > pending["timestamp"]

    rec = _delivered(cli, q, "late")
    assert rec["scheduled"] == pending["scheduled"] and rec["timestamp"] >= rec["scheduled"]
    assert list(rec)[-1] == "scheduled" and rec["partition"] == 1
    [plain] = [r for r in cli.json_lines("scan", q) if r["value"] == "plain"]
    assert plain["scheduled"] is None
    for args in (["scan", q], ["consume", q, "--from", "earliest", "--timeout", "0"]):
        table = cli(*args).stdout
        assert "scheduled (UTC)" in table, args
        late_row = next(line for line in table.splitlines() if "late" in line)
        assert rec["scheduled"] in late_row and rec["timestamp"] in late_row
    assert rec["scheduled"] in cli("get", rec["message_id"]).stdout
    assert "ms after it" in cli("get", rec["message_id"]).stdout
    assert "ms after it" in cli("get", delayed_id).stdout  # the delayed id now finds the delivered message
    # JSON of get and find carry it too; a table without delayed messages has no such column
    assert cli.json_lines("get", rec["message_id"])[0]["scheduled"] == rec["scheduled"]
    cli("produce", q, "-p", "0", "-k", "k", "keyed")
    assert cli.json_lines("find", q, "-k", "k")[0]["scheduled"] is None
    assert "scheduled" not in cli("scan", q, "--partitions", "0").stdout


def test_records_table_drops_repeated_columns_first_on_a_narrow_terminal():
    from headwater.cli.output import records_table
    from headwater.model.message import Record

    recs = [Record("q", 0, 5, 1_000_000, b"v", scheduled_ms=999_000), Record("q", 0, 6, 1_000_000, b"w")]

    def headers(width: int) -> list[str]:
        return [str(c.header) for c in records_table(recs, width).columns]

    assert headers(200) == ["message id", "p", "offset", "timestamp (UTC)", "scheduled (UTC)", "value"]
    assert headers(120) == ["message id", "timestamp (UTC)", "scheduled (UTC)", "value"]  # p, offset: in the id
    assert headers(90) == ["message id", "timestamp (UTC)", "value"]
    assert headers(60) == ["message id", "value"]
    assert "scheduled (UTC)" not in [str(c.header) for c in records_table(recs[1:], 200).columns]


def test_find(cli, q):
    cli("produce", q, "-k", "order-17", "placed")
    cli("produce", q, "-k", "order-18", "other")
    cli("produce", q, "-k", "order-17", "paid")
    assert [r["value"] for r in cli.json_lines("find", q, "--key", "order-17")] == ["placed", "paid"]
    assert [r["value"] for r in cli.json_lines("find", q, "-k", "order-17", "--limit", "1")] == ["placed"]
    assert len(cli.json_lines("find", q, "-k", "order-17", "--from", "-1h", "--to", "now")) == 2
    assert cli.json_lines("find", q, "-k", "order-17", "--to", "-1h") == []
    assert "paid" in cli("find", q, "-k", "order-17").stdout
    assert "not a time" in cli.error("find", q, "-k", "x", "--from", "12")


# --- errors -----------------------------------------------------------------------------


def test_unknown_queue(cli, q):
    for args in (
        ["scan", "nope"],
        ["produce", "nope", "x"],
        ["queue", "describe", "nope"],
        ["find", "nope", "-k", "x"],
        ["queue", "delete", "nope", "--yes"],
    ):
        err = cli.error(*args)
        assert "queue 'nope' does not exist" in err and "headwater queue list" in err


def test_bad_values(cli, q):
    assert "invalid queue name" in cli.error("queue", "create", "bad name")
    assert "already exists" in cli.error("queue", "create", q)
    assert "--ttl" in cli.error("queue", "create", "x", "--ttl", "soon")
    assert "key=value" in cli.error("queue", "create", "x", "--set", "novalue")
    assert "no partition 7" in cli.error("produce", q, "-p", "7", "x")
    assert "no partition 9" in cli.error("scan", q, "--partitions", "9")
    assert "partition list" in cli.error("scan", q, "--partitions", "a,b")
    err = cli.error("scan", q, "--from", "yesterday")
    assert "--from" in err and "ISO-8601" in err and "-15m" in err
    assert "--to" in cli.error("scan", q, "--to", "2026-13-45")
    assert "key=value" in cli.error("produce", q, "-P", "oops", "x")
    ids = [f"00000001-0000000{p}-0000000000000000" for p in (0, 1)]
    assert "different partitions" in cli.error("scan", q, "--from", ids[0], "--to", ids[1])


def test_usage_errors_exit_2(cli):
    assert cli("queue", "create", code=2).exit_code == 2
    cli("scan", "q", "--limit", "0", code=2)
    cli("queue", "create", "x", "--flush", "sometimes", code=2)
    cli("no-such-command", code=2)


def test_data_directory_problems(cli, tmp_path):
    err = cli.error("queue", "list")  # nothing at --data yet: do not create an empty store
    assert "no data directory" in err and not cli.data.exists()
    other = tmp_path / "photos"
    other.mkdir()
    (other / "cat.jpg").write_bytes(b"\xff\xd8")
    err = DataCli(other).error("queue", "create", "x")
    assert "not a Headwater data directory" in err and "cat.jpg" in err
    assert not (other / "headwater.json").exists()


def test_reading_commands_on_an_empty_directory_leave_it_empty(tmp_path):
    """An empty directory reads as a store with no queues, as a new broker's, and stays
    empty: only 'queue create' and 'serve' make a store. Before, a reading command opened
    it read-write, which wrote a new store there (catalog, log, lock and recovery point)."""
    empty = tmp_path / "empty"
    empty.mkdir()
    cli = DataCli(empty)
    assert "no queues yet" in cli("queue", "list").stdout
    assert json.loads(cli("queue", "list", "--json").stdout) == []
    status = json.loads(cli("status", "--interval", "0", "--json").stdout)
    assert status["mode"] == "embedded" and status["data_dir"] == str(empty) and status["queues"] == 0
    cli("group", "list")
    cli("delay", "stats")
    assert "does not exist" in cli.error("scan", "orders")
    assert list(empty.iterdir()) == []
    cli("queue", "create", "orders")  # a write makes the store
    assert (empty / "headwater.json").exists()


def test_data_directory_locked(cli, q):
    with headwater.open(cli.data):
        assert "in use in this process already" in cli.error("queue", "list")  # the CLI runs in-process here


def test_data_from_environment_and_unreachable_server(cli, q, monkeypatch):
    result = cli.runner.invoke(app, ["queue", "list", "--json"], env={**ENV, "HEADWATER_DATA": str(cli.data)})
    assert result.exit_code == 0 and json.loads(result.stdout)[0]["name"] == q
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("HEADWATER_CONNECT_TIMEOUT_S", "0.5")
    err = cli.error("--server", f"127.0.0.1:{port}", "queue", "list", data=False)
    assert "cannot reach the broker" in err and "headwater serve" in err


def _command_paths(command, words=()) -> list[tuple[list[str], object]]:
    """Every command and group under ``command``, with the words that name it."""
    out = [(list(words), command)]
    for name, sub in getattr(command, "commands", {}).items():
        out += _command_paths(sub, (*words, name))
    return out


def test_help_everywhere(cli):
    import typer.main

    paths = _command_paths(typer.main.get_command(app))
    assert len(paths) > 25  # the walk did find the subcommands
    for words, command in paths:
        out = cli(*words, "--help", data=False).stdout
        assert "Usage:" in out and "headwater" in out, words
        assert (command.help or "").strip(), f"{words}: no help text"
        if hasattr(command, "commands"):
            continue  # a group: its help lists the commands, each with its line
        assert "Example" in out, f"{words}: no examples"
        for param in command.params:
            assert getattr(param, "help", None), f"{words}: {param.name} has no help"
    scan_help = cli("scan", "--help", data=False).stdout
    assert "value_encoding" in scan_help and "base64" in scan_help and "scheduled" in scan_help
    assert headwater.__version__ in cli("--version", data=False).stdout


# --- the installed entry point ----------------------------------------------------------


def _headwater_exe() -> str:
    exe = Path(sys.executable).parent / "headwater"
    if not exe.exists():
        pytest.skip("the headwater entry point is not installed in this environment")
    return str(exe)


def test_entry_point_subprocess(tmp_path):
    exe = _headwater_exe()
    env = {k: v for k, v in os.environ.items() if k not in ("HEADWATER_DATA", "HEADWATER_SERVER", "FORCE_COLOR")}
    env["HEADWATER_DATA"] = str(tmp_path / "data")

    def run(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([exe, *args], input=stdin, capture_output=True, env=env, timeout=60)

    assert run("queue", "create", "logs", "--partitions", "2").returncode == 0
    lines = b"".join(b"log line %d\n" % i for i in range(5000))
    done = run("produce", "logs", "--quiet", stdin=lines)
    assert done.returncode == 0, done.stderr
    assert b"sent 5,000 message(s)" in done.stdout
    scanned = run("scan", "logs", "--json")
    assert scanned.returncode == 0
    assert len(scanned.stdout.splitlines()) == 5000
    failed = run("scan", "missing")
    assert failed.returncode == 1
    assert failed.stderr.decode().startswith("error: queue 'missing' does not exist")
    assert b"Traceback" not in failed.stderr
    usage = run("scan")
    assert usage.returncode == 2 and b"Traceback" not in usage.stderr


def test_produce_failure_midway_says_what_was_sent(cli):
    cli("queue", "create", "small", "--message-bytes-max", "10")
    result = cli("produce", "small", "--batch-size", "2", input="a\nb\nc\nthis line is too long\n", code=1)
    assert len(result.stdout.split()) == 2  # the ids of the batch that went out
    assert result.stderr.startswith("error: ") and "the 2 message(s) before this batch were sent" in result.stderr
