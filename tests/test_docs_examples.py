"""The Python examples in README.md and docs/*.md, and the scripts in examples/, run as written.

Each guide's examples run in order in one fresh interpreter (tests/support/doc_examples.py),
in an empty directory, against a real broker process of their own (a ``headwater serve`` on a
free port, standing in for the guides' ``127.0.0.1:7070``); the Spark guide's start a real
``local[2]`` session. A guide passes when every block ran and the output shows that the
examples did their work (the lines in ``SHOWS``), not only that nothing raised. The Spark
scripts in examples/ start a broker of their own, as a reader runs them.

The shell examples of the guides that run ``headwater`` commands (README.md, docs/cli.md,
docs/subscriptions.md) run too, each guide's blocks in order in one bash script, as if pasted
into one terminal (tests/support/doc_shell.py): every line must succeed, a command the guide
shows failing must fail with what the guide says it prints, and a command that follows until
Ctrl-C gets one and must end cleanly. Every ``headwater ...`` command line of the guides, and
of the commands' own ``--help`` examples, also goes through the CLI's parser: no command or
option in them is unknown.
"""

from __future__ import annotations

import contextlib
import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import doc_shell
from tests.support.broker_process import BrokerProcess
from tests.support.cluster import Cluster
from tests.support.doc_examples import examples

# make test runs these alone, after the rest: Spark's JVM; followed commands get Ctrl-C after a fixed time
pytestmark = pytest.mark.serial

ROOT = Path(__file__).resolve().parent.parent
RUNNER = ROOT / "tests" / "support" / "doc_examples.py"
SCRIPTS = sorted((ROOT / "examples").glob("spark_*.py"))
SLOW_SCRIPTS = {"spark_batch_read.py", "spark_batch_write.py"}  # run by make test-all
GUIDES = sorted(p for p in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")] if examples(p.read_text()))

#: What each guide's examples print when they work (a guide not named here must print nothing
#: in particular, but still run every block).
SHOWS: dict[str, list[str]] = {
    "README.md": ['b\'{"id": 17, "total": 42.5}\'', "event 999"],
    "cluster.md": [
        "1000 orders kept",
        "20 orders of customer-7",
        "1000 read, from 6 partitions",
        "billing is coordinated by broker",
        "billing committed True",
    ],
    "asyncio.md": ["[b'late']", "charged 3 orders; checkpoint stored: True"],
    "consumer-groups.md": [
        "now reading",
        "charged 300 orders",
        "woken: closing",
        "cache-invalidation read 3",
        "ledger read 300, committed 300, failed commits: 0",
        "[b'c', b'd'] [('orders', 0)]\n[b'a', b'b']",
    ],
    "keyed-groups.md": ["user-3 clicked 4 times", "'resizing_to': 4", "shared by two members: 0"],
    "metrics.md": ["billing lag on orders[0]: 40"],
    "producing.md": ["10000 ids, the last 0000", "True\n", "µs from send() to poll()"],
    "shared-groups.md": [
        "sent 18 emails, 2 in the dead-letter queue: no such mailbox, yet",
        "woken by SIGTERM: closing",
    ],
    "spark.md": ["rows in the ranges: 4000", "paid orders in the hour: 3", "events counted: 1000", "clicks written: 3"],
    "subscriptions.md": ["stored 5 orders", "push {-1: [0, 1, 2, 3]}"],
    "testing.md": ["billing: ok", "retention: ok", "delay: ok", "asyncio: ok"],
}

#: The last words of each example script's work.
SCRIPT_SHOWS: dict[str, str] = {
    "spark_batch_read.py": "paid since ",
    "spark_batch_write.py": "messages in clicks: 10000",
    "spark_streaming.py": "events-upper holds 1500",
}


def test_the_runners_own_examples():
    import doctest

    from tests.support import doc_examples

    for module in (doc_examples, doc_shell):
        result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
        assert result.attempted > 0 and result.failed == 0, module.__name__


def test_every_guide_and_script_is_covered():
    assert {g.name for g in GUIDES} == set(SHOWS), "add the new guide's telling output to SHOWS"
    assert {s.name for s in SCRIPTS if s.name != "spark_common.py"} == set(SCRIPT_SHOWS)


def _spark_env() -> dict[str, str]:
    pytest.importorskip("pyspark", reason="the Spark examples need pyspark: pip install 'headwater[spark]'")
    return {"SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}


@pytest.mark.parametrize("guide", GUIDES, ids=lambda p: p.name)
def test_the_guide_examples_run(guide: Path, tmp_path: Path, request):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    if guide.name == "spark.md":
        env |= _spark_env()
    work = tmp_path / "work"
    work.mkdir()
    if guide.name == "cluster.md":  # its examples talk to a cluster of three
        cluster = Cluster(request.getfixturevalue("zk_server"), tmp_path, 3)
        address, stop = ",".join(cluster.address(i) for i in (1, 2, 3)), cluster.stop
    else:
        broker = BrokerProcess(tmp_path / "broker").start()
        address, stop = broker.address, broker.terminate
    try:
        run = subprocess.run(
            [sys.executable, str(RUNNER), str(guide), address],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=400,
        )
    finally:
        stop()
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-6000:]
    assert out.count(f"[example at {guide.name}:") == len(examples(guide.read_text())), out[-6000:]
    for line in SHOWS[guide.name]:
        assert line in run.stdout, f"{guide.name}: expected {line!r} in\n{run.stdout[-4000:]}"


@pytest.mark.parametrize(
    "script",
    [
        # the batch scripts start a JVM each (~13 s) for what docs/spark.md's examples also do
        pytest.param(s, marks=pytest.mark.slow) if s.name in SLOW_SCRIPTS else s
        for s in SCRIPTS
        if s.name in SCRIPT_SHOWS
    ],
    ids=lambda p: p.name,
)
def test_the_example_scripts_run(script: Path, tmp_path: Path):
    env = {**os.environ, **_spark_env(), "PYTHONUNBUFFERED": "1"}
    run = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400
    )
    assert run.returncode == 0, (run.stdout + run.stderr)[-6000:]
    assert SCRIPT_SHOWS[script.name] in run.stdout, run.stdout[-4000:]


# -- the shell examples of the guides ----------------------------------------------------------

SHELL_GUIDES = sorted(
    p
    for p in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]
    if any(doc_shell.runs_headwater(lines) for _, lines in doc_shell.shell_blocks(p.read_text()))
)

#: What each guide's shell examples print when they work.
SHELL_SHOWS: dict[str, list[str]] = {
    "README.md": ['"value": "{\\"id\\": 17}"', "listening 127.0.0.1:", "consumed 1 message(s)", "uptime"],
    "cli.md": [
        "created queue 'payments' with 4 partition(s)",
        "no queue 'clicks'; nothing to delete",
        "sent 100,000 message(s) to queue 'orders'",
        "scheduled   ",
        "cancelled 0000",
        " b'caf\\xe9'",
        "value       look me up",
        "consumed 100,011 message(s)",
        "reset group 'billing' on queue 'jobs' (1 partition(s))",
        "leased",
        "worker-1 (2)",
        "kind        keyed",
        "deleted subscriber 'replay' of queue 'orders'",
        "fetch streams",
        "messages           100,013",
    ],
    "metrics.md": ['headwater_messages_in_total{queue="invoices"} 2.0', '"message":"ready"'],
    "subscriptions.md": [
        "added subscriber 'billing' to queue 'orders', starting at 0:0, 1:0, 2:0, 3:0",
        "deleted subscriber 'replay' of queue 'orders'",
    ],
}


def test_every_guide_with_shell_examples_is_covered():
    assert {g.name for g in SHELL_GUIDES} == set(SHELL_SHOWS), "add the new guide's telling output to SHELL_SHOWS"


def _run_shell_examples(guide: Path, tmp_path: Path) -> tuple[int, str, list[str]]:
    """Run a guide's shell examples as tests/support/doc_shell.py describes: the script's
    exit code, what the terminal showed, and what is wrong with the failures it shows."""
    work = tmp_path / "work"
    work.mkdir(parents=True)
    script, failures = doc_shell.write(guide, work)
    log = tmp_path / "terminal.txt"
    code = doc_shell.run_script(script, guide.name, work, log, 400, HEADWATER_HISTORY=str(work / ".history"))
    return code, log.read_text(), doc_shell.check_failures(work, failures, guide.name)


@pytest.mark.parametrize("guide", SHELL_GUIDES, ids=lambda p: p.name)
def test_the_guide_shell_examples_run(guide: Path, tmp_path: Path):
    """A guide's ``sh`` blocks, pasted into one terminal in order (tests/support/doc_shell.py):
    every line succeeds, or fails as the guide shows it failing."""
    code, out, wrong = _run_shell_examples(guide, tmp_path)
    assert code == 0, out[-8000:]
    assert not wrong, "\n".join(wrong)
    for text in SHELL_SHOWS[guide.name]:
        assert text in out, f"{guide.name}: expected {text!r} in\n{out[-6000:]}"


def test_the_shell_examples_check_can_fail(tmp_path: Path):
    """A command that fails, and a failure that prints other than the guide says, are caught,
    each with the guide's line."""
    broken = tmp_path / "broken.md"
    broken.write_text("# b\n\n```sh\nheadwater --data d queue create q\nheadwater --data d queue list --bogus\n```\n")
    code, out, _ = _run_shell_examples(broken, tmp_path / "one")
    assert code != 0 and "[failed at broken.md:5: headwater --data d queue list --bogus]" in out, out
    wrong_text = tmp_path / "wrong.md"
    wrong_text.write_text(
        "```sh\nheadwater --data d queue create q\nheadwater --data d scan nope\n"
        "# error: queue 'nope' is ... fine\n```\n"
    )
    code, out, wrong = _run_shell_examples(wrong_text, tmp_path / "two")
    assert code == 0, out
    assert len(wrong) == 1 and wrong[0].startswith("wrong.md:3: the guide says it prints"), wrong


# -- the command lines of the guides -----------------------------------------------------------


@functools.cache
def _root_command():
    import typer

    from headwater.cli.main import app

    return typer.main.get_command(app)


def _parse_error(args: list[str]) -> str | None:
    """What the CLI's parser says of ``headwater ARGS`` (an unknown command or option, a
    missing argument, a bad value), without running it; None when it parses."""
    import io

    root = _root_command()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            ctx = root.make_context("headwater", list(args))
            command, rest = root, list(getattr(ctx, "_protected_args", [])) + ctx.args
            while hasattr(command, "resolve_command") and rest:
                name, command, rest = command.resolve_command(ctx, rest)
                ctx = command.make_context(name, rest, parent=ctx)
                rest = (
                    list(getattr(ctx, "_protected_args", [])) + ctx.args if hasattr(command, "resolve_command") else []
                )
        except Exception as e:  # the parser's own classes are typer's copy of click's
            if type(e).__name__ == "Exit":  # --help, --version
                return None
            if hasattr(e, "format_message"):
                return e.format_message()
            raise
    return None


def test_every_command_line_in_the_guides_parses():
    """Each ``headwater ...`` line in README.md and docs/*.md names commands and options the
    CLI has, with the arguments they need (checked by the CLI's own parser, nothing run)."""
    import shlex

    assert doc_shell.command_lines("```sh\nseq 3 | headwater produce q --quiet   # three\nls\n```\n") == [
        (2, "headwater produce q --quiet")
    ]
    assert "No such option" in _parse_error(["queue", "create", "q", "--partition", "4"])  # the check can fail
    assert _parse_error(["queue", "create", "q", "--partitions", "4"]) is None
    errors, seen = [], 0
    for guide in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for line, command in doc_shell.command_lines(guide.read_text()):
            seen += 1
            said = _parse_error(shlex.split(command)[1:])
            if said:
                errors.append(f"{guide.name}:{line}: {command}: {said}")
    assert seen > 60 and not errors, "\n".join(errors)


def test_every_example_in_the_commands_help_parses():
    import shlex

    def commands(command, path):
        yield path, command
        for name, sub in getattr(command, "commands", {}).items():
            yield from commands(sub, f"{path} {name}")

    errors, seen = [], 0
    for path, command in commands(_root_command(), "headwater"):
        for line in (command.help or "").splitlines():
            if (example := doc_shell.command_of(line)) is None:
                continue
            seen += 1
            said = _parse_error(shlex.split(example)[1:])
            if said:
                errors.append(f"{path} --help: {example}: {said}")
    assert seen > 40 and not errors, "\n".join(errors)
