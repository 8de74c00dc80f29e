"""``headwater shell``: commands piped in, commands typed on a pseudo-terminal (prompt, Tab
completion, history), and the completion logic on its own."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest
import typer

import headwater
from headwater.cli.context import CliState
from headwater.cli.main import app
from headwater.cli.shell import ShellSession
from tests.support.broker_process import BrokerProcess

HEADWATER = str(Path(sys.executable).with_name("headwater"))


@pytest.fixture
def broker(tmp_path):
    b = BrokerProcess(tmp_path / "served").start()
    yield b
    assert b.terminate() == 0, b.log.read_text()[-2000:]


def env(**extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("HEADWATER_") and k != "FORCE_COLOR"}
    return {**base, "COLUMNS": "200", "NO_COLOR": "1", **extra}


def piped(*global_options: str, script: str, **extra_env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [HEADWATER, *global_options, "shell"],
        input=script.encode(),
        capture_output=True,
        env=env(**extra_env),
        timeout=60,
    )


# --- commands piped in ------------------------------------------------------------------


SCRIPT = """\
status --interval 0 --json
queue create orders --partitions 2
# a comment, and an empty line

produce orders 'order 1' "order 2"
scan orders --json
scan nope
queue describe orders --bogus
frobnicate
'unclosed
serve
--data /elsewhere queue list
queue list --json
status --interval 0 --json
exit
produce orders never
"""


def test_piped_commands_share_one_connection_and_survive_errors(broker):
    result = piped("--server", broker.address, script=SCRIPT)
    out, err = result.stdout.decode(), result.stderr.decode()
    assert result.returncode == 1, (out, err)  # some commands failed
    assert "Traceback" not in out + err
    lines = out.splitlines()
    first_status, last_status = json.loads(lines[0]), json.loads(lines[-1])
    # one client for the whole session: no new connection was made after the first
    assert first_status["connections_total"] == last_status["connections_total"]
    assert first_status["requests_total"] < last_status["requests_total"]
    assert "created queue 'orders' with 2 partition(s)" in out
    values = [json.loads(line)["value"] for line in lines if '"message_id"' in line]
    assert values == ["order 1", "order 2"]
    assert [q["name"] for q in json.loads(lines[-2])] == ["orders"]
    # every failure is reported the way the command line reports it, and the session goes on
    assert "error: queue 'nope' does not exist" in err
    assert "No such option: --bogus" in err and "No such command 'frobnicate'" in err
    assert "error: cannot split the line into words" in err
    assert "error: 'serve' is not available in the shell" in err
    assert "error: --data is a global option of the shell itself" in err
    assert "never" not in out  # nothing runs after exit


def test_piped_commands_that_all_succeed_exit_0_and_help_works(broker):
    result = piped("--server", broker.address, script="help\nhelp queue create\nqueue list\n")
    out = result.stdout.decode()
    assert result.returncode == 0, result.stderr.decode()
    assert "Usage: headwater [OPTIONS] COMMAND" in out and "consume" in out and "shell" in out
    assert "Usage: headwater queue create" in out
    assert "no queues yet" in out


def test_shell_on_a_new_data_directory(tmp_path):
    data = tmp_path / "new"
    script = "queue list\nqueue create q\nproduce q hello\nconsume q --from earliest --limit 1 --json\ncheck\n"
    result = piped("--data", str(data), script=script)
    out, err = result.stdout.decode(), result.stderr.decode()
    assert "no data directory" in err  # the first command, before any queue exists
    assert json.loads(out.splitlines()[-1])["value"] == "hello"
    assert "error: 'check' is not available in the shell" in err
    assert result.returncode == 1
    with headwater.open(data) as hw:  # the shell closed the store: it can be opened again
        assert [q.name for q in hw.admin.list_queues()] == ["q"]


def test_shell_reports_an_unreachable_broker_before_any_prompt():
    result = piped("--server", "127.0.0.1:9", script="queue list\n", HEADWATER_CONNECT_TIMEOUT_S="0.3")
    assert result.returncode == 1
    assert result.stderr.decode().startswith("error: cannot reach the broker at 127.0.0.1:9")


# --- on a terminal ----------------------------------------------------------------------


class Terminal:
    """A child process on a pseudo-terminal, driven by what it prints."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))
        # a session of its own with the terminal as its controlling tty, so that Ctrl-C
        # typed on it reaches the child as SIGINT, as in a real terminal
        self.proc = subprocess.Popen(
            argv,
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env=env,
            start_new_session=True,
            preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0),
        )
        os.close(slave)
        self.fd = master
        self.seen = ""
        self.log = ""

    def expect(self, pattern: str, timeout_s: float = 15.0) -> re.Match:
        """Read until ``pattern`` (a regex) appears in what was printed since the last match."""
        deadline = time.monotonic() + timeout_s
        while True:
            m = re.search(pattern, self.seen)
            if m:
                self.seen = self.seen[m.end() :]
                return m
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(
                    f"{pattern!r} not seen; the terminal shows:\n{self.seen[-3000:]}\n"
                    f"--- the whole session so far ---\n{self.log[-3000:]}"
                )
            ready, _, _ = select.select([self.fd], [], [], left)
            if ready:
                try:
                    chunk = os.read(self.fd, 65536)
                except OSError:  # the child closed the terminal
                    chunk = b""
                if not chunk:
                    raise AssertionError(f"{pattern!r} not seen before the end:\n{self.seen[-3000:]}")
                # drop colour and cursor sequences, keep the text
                text = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", chunk.decode(errors="replace"))
                self.seen += text
                self.log += text

    def type(self, text: str) -> None:
        # a person never types in the same millisecond the prompt appears; keystrokes sent
        # before readline has taken the terminal would be seen by the tty driver instead
        time.sleep(0.15)
        os.write(self.fd, text.encode())

    def close(self) -> int:
        try:
            return self.proc.wait(15)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            os.close(self.fd)


def test_terminal_prompt_completion_and_history(broker, tmp_path):
    with headwater.connect(broker.address) as hw:
        hw.admin.create_queue("orders")
        hw.admin.create_queue("audit-log")
        hw.send("orders", b"typed on a terminal")
    history = tmp_path / "history"
    term = Terminal([HEADWATER, "--server", broker.address, "shell"], env(TERM="xterm", HEADWATER_HISTORY=str(history)))
    prompt = re.escape(f"headwater({broker.address})> ")
    try:
        term.expect(r"'help' lists the commands")
        term.expect(prompt)
        term.type("sc\tord\t--json\n")  # Tab completes the command, then the queue name
        term.expect(r"scan orders --json")
        term.expect(r'"value": "typed on a terminal"')
        term.expect(prompt)
        term.type("queue describe au\t\n")
        term.expect(r"queue describe audit-log")
        term.expect(r"queue\s+audit-log")
        term.expect(prompt)
        term.type("queue create fresh\n")  # a new queue is offered at once
        term.expect(r"created queue 'fresh'")
        term.expect(prompt)
        term.type("produce fr\tx\n")
        term.expect(r"produce fresh x")
        term.expect(r"[0-9a-f]{8}-00000000-0{16}")  # the id of the message sent
        term.expect(prompt)
        term.type("scan nope\n")  # an error, and the session goes on
        term.expect(r"error: queue 'nope' does not exist")
        term.expect(prompt)
        term.type("\n")  # an empty line does nothing, and is not history
        term.expect(prompt)
        term.type("unfinished line\x03")  # Ctrl-C drops the line, not the session
        term.expect(prompt)
        for _ in range(2):  # twice in a row: once in the history
            term.type("  queue list --json\n")
            term.expect(r'"name": "fresh"')
            term.expect(prompt)
        term.type("\x04")  # Ctrl-D leaves
        assert term.close() == 0
    finally:
        if term.proc.poll() is None:
            term.proc.kill()
    saved = [line for line in history.read_text().splitlines() if not line.startswith("_HiStOrY_")]
    assert saved == [
        "scan orders --json",
        "queue describe audit-log",
        "queue create fresh",
        "produce fresh x",
        "scan nope",
        "queue list --json",
    ]


def test_terminal_ctrl_c_stops_consume_and_keeps_the_session(broker, tmp_path):
    with headwater.connect(broker.address) as hw:
        hw.admin.create_queue("q")
        hw.send("q", b"one")
    term = Terminal(
        [HEADWATER, "--server", broker.address, "shell"], env(TERM="xterm", HEADWATER_HISTORY=str(tmp_path / "history"))
    )
    try:
        term.expect(r"> ")
        term.type("consume q --from earliest --group g --json\n")
        term.expect(r"Ctrl-C to stop")
        term.expect(r'"value": "one"')
        term.type("\x03")
        term.expect(r"consumed 1 message\(s\)")
        term.expect(r"> ")
        term.type("consume q --group g --timeout 0.2 --json\n")  # committed: nothing again
        term.expect(r"> ")
        assert '"value"' not in term.seen
        term.type("exit\n")
        assert term.close() == 0
    finally:
        if term.proc.poll() is None:
            term.proc.kill()


def test_terminal_ctrl_c_at_the_prompt_does_not_repeat_the_banner(broker, tmp_path):
    term = Terminal(
        [HEADWATER, "--server", broker.address, "shell"], env(TERM="xterm", HEADWATER_HISTORY=str(tmp_path / "history"))
    )
    try:
        term.expect(r"> ")
        for _ in range(2):
            term.type("\x03")
            term.expect(r"\^C")
            term.expect(r"> ")
        term.type("exit\n")
        assert term.close() == 0
    finally:
        if term.proc.poll() is None:
            term.proc.kill()
    assert term.log.count("'help' lists the commands") == 1, term.log


# --- completion, without a terminal ---------------------------------------------------


@pytest.fixture
def session(tmp_path):
    hw = headwater.open(tmp_path / "data")
    for name in ("orders", "audit", "audit-log"):
        hw.admin.create_queue(name)
    state = CliState(data_dir=tmp_path / "data", client=hw, keep_open=True)
    yield ShellSession(typer.main.get_command(app), state, interactive=False)
    hw.close()


def test_completion_of_commands_subcommands_options_and_queues(session):
    c = session.completions
    assert c("", "") == sorted(
        [
            "queue",
            "produce",
            "scan",
            "get",
            "find",
            "consume",
            "status",
            "metrics",
            "delay",
            "subscriber",
            "group",
            "cluster",
            "exit",
            "quit",
            "help",
        ]
    )  # shell, serve, dev-cluster and check are not offered
    assert c("", "q") == ["queue", "quit"]
    assert c("queue ", "d") == ["delete", "describe", "disable"]
    assert c("queue ", "add") == ["add-partitions"]
    assert c("scan ", "") == ["audit", "audit-log", "orders"]
    assert c("queue describe ", "audit") == ["audit", "audit-log"]
    assert c("queue create ", "") == []  # a new name: nothing to offer
    assert c("scan orders ", "--p") == ["--partitions"]
    assert c("scan orders ", "") == []  # one queue per scan
    assert c("consume --group g ", "or") == ["orders"]  # an option's value is not the queue
    assert c("consume orders --group ", "") == []
    assert c("queue create q --flush ", "") == ["async", "sync"]
    assert c("produce orders -- ", "") == []
    assert c("help ", "qu") == ["queue"] and c("help queue ", "cr") == ["create"]
    assert c("nonsense ", "") == [] and c("'open quote ", "") == []


def test_completion_knows_every_command_and_option(session):
    """Whatever command is added, Tab offers it, its subcommands and its options."""
    from headwater.cli.shell import NOT_IN_SHELL

    def walk(command, words):
        if hasattr(command, "commands"):
            offered = session.completions(" ".join(words) + (" " if words else ""), "")
            expected = {n for n in command.commands if not (not words and n in NOT_IN_SHELL)}
            assert expected <= set(offered), (words, expected - set(offered))
            for name, sub in command.commands.items():
                if words or name not in NOT_IN_SHELL:
                    walk(sub, [*words, name])
            return
        options = {o for p in command.params if p.param_type_name == "option" for o in p.opts if o.startswith("--")}
        assert options | {"--help"} == set(session.completions(" ".join(words) + " ", "--")), words

    walk(session.root, [])
    assert "delay" in session.completions("", "d") and "cancel" in session.completions("delay ", "")
    assert session.completions("subscriber ", "") == ["add", "delete", "describe", "list"]
    assert "--queue" in session.completions("group describe g ", "--q")


def test_completion_refreshes_queue_names_after_queue_commands(session):
    assert "fresh" not in session.completions("scan ", "")
    assert session.run_line(["queue", "create", "fresh"]) == 0
    assert "fresh" in session.completions("scan ", "")
    assert session.run_line(["queue", "delete", "fresh", "--yes"]) == 0
    assert "fresh" not in session.completions("scan ", "")
    assert session.run_line(["scan", "nope"]) == 1 and session.failures == 1
