"""Operator habits: global options after the command, ``--json`` on the commands that change
things, clear errors for ``--server`` values, and what ``serve`` says about how to reach it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from headwater.cli.main import app
from tests.support.broker_process import free_port
from tests.support.command_line import ENV, DataCli


@pytest.fixture
def cli(tmp_path) -> DataCli:
    return DataCli(tmp_path / "data")


def test_global_options_after_the_command(cli):
    cli("queue", "create", "orders", "--partitions", "2")
    after = cli("queue", "list", "--data", str(cli.data), "--json", data=False).stdout
    assert json.loads(after)[0]["name"] == "orders"
    short = cli("queue", "describe", "orders", "-d", str(cli.data), data=False).stdout
    assert "orders" in short
    # --json before the command goes to the command
    before = cli("--json", "queue", "describe", "orders", "--data", str(cli.data), data=False).stdout
    assert json.loads(before)["name"] == "orders"
    err = cli.error("--json", "shell", code=2)
    assert "'headwater shell' has no --json output; see docs/cli.md, 'JSON output'" in err
    err = cli.error("queue", "list", "--server", code=2)
    assert "--server needs a value, e.g. --server 127.0.0.1:7070" in err


def test_the_commands_that_change_things_print_json(cli):
    doc = json.loads(cli("queue", "create", "q", "--partitions", "2", "--json").stdout)
    assert doc["action"] == "created" and doc["queue"] == "q" and len(doc["info"]["partitions"]) == 2
    again = json.loads(cli("queue", "create", "q", "--if-not-exists", "--json").stdout)
    assert again["action"] == "exists"
    sent = [json.loads(line) for line in cli("produce", "q", "a", "b", "--json").stdout.splitlines()]
    assert [set(s) for s in sent] == [{"message_id", "partition", "offset"}] * 2
    count = json.loads(cli("produce", "q", "c", "--quiet", "--json").stdout)
    assert count["queue"] == "q" and count["sent"] == 1
    for args, action in (
        (["queue", "disable", "q"], "disabled"),
        (["queue", "enable", "q"], "enabled"),
        (["queue", "truncate", "q", "--yes"], "truncated"),
        (["queue", "add-partitions", "q", "--to", "3"], "added-partitions"),
        (["queue", "delete", "q", "--yes"], "deleted"),
        (["queue", "delete", "q", "--yes", "--if-exists"], "absent"),
    ):
        doc = json.loads(cli(*args, "--json").stdout)
        assert doc["action"] == action and doc["queue"] == "q", doc


@pytest.mark.parametrize(
    ("server", "says"),
    [
        ("http://127.0.0.1:7070", "is a URL; Headwater speaks its own protocol, not http: give HOST:PORT"),
        ("localhost", "'localhost' has no port; give HOST:PORT, e.g. 127.0.0.1:7070"),
        ("localhost:http", "the port 'http' is not a number from 1 to 65535"),
        ("a:7070,b", "'b' has no port"),
        ("h:70700", "the port '70700' is not a number from 1 to 65535"),
    ],
)
def test_bad_server_values_say_what_is_expected(cli, server, says):
    err = cli.error("queue", "list", "--server", server, data=False)
    assert says in err, err


def test_serve_prints_an_address_server_takes_and_warns_beyond_loopback(tmp_path):
    port = free_port()
    env = {k: v for k, v in ENV.items() if v is not None}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "headwater.cli.main",
            "serve",
            "--host",
            "0.0.0.0",
            "--port",
            str(port),
            "--data",
            str(tmp_path / "d"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **env},
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # 'listening HOST:PORT' once it is up
        assert line.startswith("listening"), line
        deadline = time.monotonic() + 20
        cli = DataCli(tmp_path / "unused")
        while True:
            result = cli.runner.invoke(app, ["--server", f"127.0.0.1:{port}", "queue", "list", "--json"])
            if result.exit_code == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert result.exit_code == 0 and json.loads(result.stdout) == []
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=20)
    assert f"connect with: headwater --server 127.0.0.1:{port}" in err
    assert "warning: listening on 0.0.0.0, beyond loopback, without authentication" in err


def test_named_profiles(tmp_path):
    from typer.testing import CliRunner

    config = tmp_path / "conf" / "profiles.toml"
    cli = DataCli(tmp_path / "data")
    cli.runner = CliRunner(env={**ENV, "HEADWATER_CONFIG": str(config), "HEADWATER_PROFILE": None})
    cli("queue", "create", "orders")
    assert "added profile 'here' (current)" in cli("profile", "add", "here", "--data", str(cli.data), "--use").stdout
    cli("profile", "add", "far", "--server", "127.0.0.1:9")
    listed = json.loads(cli("profile", "list", "--json", data=False).stdout)
    assert listed["current"] == "here" and listed["profiles"]["far"] == {"server": "127.0.0.1:9"}
    # the current profile's data directory, with no --data
    assert json.loads(cli("queue", "list", "--json", data=False).stdout)[0]["name"] == "orders"
    err = cli.error("queue", "list", "--profile", "far", data=False)
    assert "cannot reach the broker at 127.0.0.1:9" in err
    cli("profile", "use", "far", data=False)
    assert "* far" in cli("profile", "list", data=False).stdout
    err = cli.error("queue", "list", "--profile", "nope", data=False)
    assert "no profile 'nope' in" in err and "(profiles: far, here)" in err
    err = cli.error("profile", "add", "bad", "--server", "http://h:1", data=False)
    assert "is a URL" in err
    err = cli.error("profile", "add", "both", data=False)
    assert "give one of --server HOST:PORT, --data DIR" in err
    err = cli.error("queue", "list", "--profile", "here", "--server", "127.0.0.1:9", data=False)
    assert "--profile and --server do not go together" in err
    cli("profile", "delete", "far", data=False)
    assert "far" not in cli("profile", "list", data=False).stdout


def test_a_command_does_not_import_the_broker():
    """Start time (bench/cli_start.py): only 'serve' needs the broker, so the CLI imports it
    when a broker starts, not for every command."""
    code = (
        "import sys\n"
        "from headwater.cli.main import app\n"
        "print(sorted(m for m in sys.modules if m.startswith(('headwater.broker', 'headwater.cluster.controller'))))\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]", run.stdout


def test_subscriber_delete_and_delay_cancel_print_json(cli):
    cli("queue", "create", "q")
    cli("subscriber", "add", "q", "audit")
    doc = json.loads(cli("subscriber", "delete", "q", "audit", "--json").stdout)
    assert doc == {"action": "deleted", "queue": "q", "subscriber": "audit"}
    ids = cli("produce", "q", "--delay", "1h", "a", "b").stdout.split()
    lines = [json.loads(line) for line in cli("delay", "cancel", *ids, "--json").stdout.splitlines()]
    assert lines == [{"action": "cancelled", "message_id": i} for i in ids]


def test_delay_cancel_tries_every_id_and_says_which_failed(cli):
    cli("queue", "create", "q")
    first, second = cli("produce", "q", "--delay", "1h", "a", "b").stdout.split()
    plain = cli("produce", "q", "c").stdout.strip()
    err = cli.error("delay", "cancel", first, plain, second)  # one failure in the middle
    assert plain in err and "not of a delayed message" in err
    assert json.loads(cli("delay", "stats", "--json").stdout)["pending_messages"] == 0  # both cancelled
    third = cli("produce", "q", "--delay", "1h", "d").stdout.strip()
    assert "not a message id" in cli.error("delay", "cancel", third, "oops")
    assert json.loads(cli("delay", "stats", "--json").stdout)["pending_messages"] == 1  # nothing cancelled


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_serve_warns_when_the_http_api_listens_beyond_loopback(tmp_path, log_format):
    # the broker's port warned beyond loopback, the HTTP API's (no authentication either) did not
    env = {k: v for k, v in ENV.items() if v is not None}
    command = [sys.executable, "-m", "headwater.cli.main", "serve", "--port", "0", "--data", str(tmp_path / "d")]
    command += ["--http-port", "0", "--http-host", "0.0.0.0", "--log-format", log_format]
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **env}
    )
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(2)]  # 'listening ...', then 'http listening 0.0.0.0:PORT'
        assert lines[1].startswith("http listening 0.0.0.0:"), lines
        http_port = int(lines[1].rsplit(":", 1)[1])
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=20)
    if log_format == "json":
        warnings = [doc for doc in map(json.loads, err.splitlines()) if doc["level"] == "warning"]
        assert [(w["message"], w["host"], w["port"]) for w in warnings] == [
            ("HTTP API listening beyond loopback without authentication", "0.0.0.0", http_port)
        ], err
    else:
        err = " ".join(err.split())
        assert (
            f"warning: the HTTP API listens on 0.0.0.0, beyond loopback, without authentication: anyone who can "
            f"reach port {http_port} can read, write and delete every queue; listen on 127.0.0.1 (--http-host)"
        ) in err, err
        assert "warning: listening on" not in err  # the broker's own port is on loopback
