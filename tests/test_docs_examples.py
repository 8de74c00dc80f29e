"""The Python examples in README.md and docs/*.md, and the scripts in examples/, run as written.

Each guide's examples run in order in one fresh interpreter (tests/support/doc_examples.py),
in an empty directory, against a real broker process of their own (a ``headwater serve`` on a
free port, standing in for the guides' ``127.0.0.1:7070``); the Spark guide's start a real
``local[2]`` session. A guide passes when every block ran and the output shows that the
examples did their work (the lines in ``SHOWS``), not only that nothing raised. The Spark
scripts in examples/ start a broker of their own, as a reader runs them. Every
``headwater ...`` command line of the guides, and of the commands' own ``--help``
examples, goes through the CLI's parser: no command or option in them is unknown.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.broker_process import BrokerProcess
from tests.support.doc_examples import examples

ROOT = Path(__file__).resolve().parent.parent
RUNNER = ROOT / "tests" / "support" / "doc_examples.py"
SCRIPTS = sorted((ROOT / "examples").glob("spark_*.py"))
GUIDES = sorted(p for p in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")] if examples(p.read_text()))

#: What each guide's examples print when they work (a guide not named here must print nothing
#: in particular, but still run every block).
SHOWS: dict[str, list[str]] = {
    "README.md": ['b\'{"id": 17, "total": 42.5}\'', "event 999"],
    "asyncio.md": ["[b'late']"],
    "consumer-groups.md": ["now reading", "charged 300 orders", "cache-invalidation read 3"],
    "keyed-groups.md": ["user-3 clicked 4 times", "'resizing_to': 4"],
    "producing.md": ["10000 ids, the last 0000", "True\n", "µs from send() to poll()"],
    "shared-groups.md": ["sent 18 emails, 2 in the dead-letter queue: no such mailbox, yet"],
    "spark.md": ["rows in the ranges: 4000", "paid orders in the hour: 3", "events counted: 1000", "clicks written: 3"],
    "subscriptions.md": ["stored 5 orders"],
    "testing.md": ["billing: ok", "retention: ok", "delay: ok"],
}

#: The last words of each example script's work.
SCRIPT_SHOWS: dict[str, str] = {
    "spark_batch_read.py": "paid since ",
    "spark_batch_write.py": "messages in clicks: 10000",
    "spark_streaming.py": "events-upper holds 1500",
}


def test_every_guide_and_script_is_covered():
    assert {g.name for g in GUIDES} == set(SHOWS), "add the new guide's telling output to SHOWS"
    assert {s.name for s in SCRIPTS if s.name != "spark_common.py"} == set(SCRIPT_SHOWS)


def _spark_env() -> dict[str, str]:
    pytest.importorskip("pyspark", reason="the Spark examples need pyspark: pip install 'headwater[spark]'")
    return {"SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}


@pytest.mark.parametrize("guide", GUIDES, ids=lambda p: p.name)
def test_the_guide_examples_run(guide: Path, tmp_path: Path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    if guide.name == "spark.md":
        env |= _spark_env()
    work = tmp_path / "work"
    work.mkdir()
    broker = BrokerProcess(tmp_path / "broker").start()
    try:
        run = subprocess.run([sys.executable, str(RUNNER), str(guide), broker.address], cwd=work, env=env,
                             capture_output=True, text=True, timeout=400)
    finally:
        broker.terminate()
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-6000:]
    assert out.count(f"[example at {guide.name}:") == len(examples(guide.read_text())), out[-6000:]
    for line in SHOWS[guide.name]:
        assert line in run.stdout, f"{guide.name}: expected {line!r} in\n{run.stdout[-4000:]}"


@pytest.mark.parametrize("script", [s for s in SCRIPTS if s.name in SCRIPT_SHOWS], ids=lambda p: p.name)
def test_the_example_scripts_run(script: Path, tmp_path: Path):
    env = {**os.environ, **_spark_env(), "PYTHONUNBUFFERED": "1"}
    run = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=400)
    assert run.returncode == 0, (run.stdout + run.stderr)[-6000:]
    assert SCRIPT_SHOWS[script.name] in run.stdout, run.stdout[-4000:]


# -- the command lines of the guides -----------------------------------------------------------

_SHELL_BLOCK = re.compile(r"^```(?:sh|bash|console)?\n(.*?)^```", re.S | re.M)


def command_of(line: str) -> str | None:
    """The ``headwater ...`` command of a shell line, with environment assignments,
    ``ID=$(...)``, a pipe into it or out of it, a trailing ``&`` and a ``# comment`` taken
    off; None when the line runs no headwater command."""
    s = re.sub(r"^\S+=\$\((.*)\)$", r"\1", line.strip())
    s = re.sub(r"^(\w+=\S+\s+)+", "", s)
    if "| headwater " in s:
        s = "headwater " + s.split("| headwater ", 1)[1]
    if not s.startswith("headwater "):
        return None
    return re.split(r"\s+#\s", s.split(" | ")[0])[0].rstrip(" &")


def command_lines(text: str) -> list[tuple[int, str]]:
    """``(line, command)`` for each ``headwater ...`` command in a Markdown text's shell
    blocks (see :func:`command_of`)."""
    found = []
    for m in _SHELL_BLOCK.finditer(text):
        first = text.count("\n", 0, m.start(1)) + 1
        for i, line in enumerate(m.group(1).splitlines()):
            if (command := command_of(line)) is not None:
                found.append((first + i, command))
    return found


@functools.cache
def _root_command():
    import typer

    from headwater.cli.main import app

    return typer.main.get_command(app)


def _parse_error(args: list[str]) -> str | None:
    """What the CLI's parser says of ``headwater ARGS`` (an unknown command or option, a
    missing argument, a bad value), without running it; None when it parses."""
    import contextlib
    import io

    root = _root_command()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            ctx = root.make_context("headwater", list(args))
            command, rest = root, list(getattr(ctx, "_protected_args", [])) + ctx.args
            while hasattr(command, "resolve_command") and rest:
                name, command, rest = command.resolve_command(ctx, rest)
                ctx = command.make_context(name, rest, parent=ctx)
                rest = list(getattr(ctx, "_protected_args", [])) + ctx.args if hasattr(command, "resolve_command") else []
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

    assert command_lines("```sh\nseq 3 | headwater produce q --quiet   # three\nls\n```\n") == \
        [(2, "headwater produce q --quiet")]
    assert "No such option" in _parse_error(["queue", "create", "q", "--partition", "4"])  # the check can fail
    assert _parse_error(["queue", "create", "q", "--partitions", "4"]) is None
    errors, seen = [], 0
    for guide in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for line, command in command_lines(guide.read_text()):
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
            if (example := command_of(line)) is None:
                continue
            seen += 1
            said = _parse_error(shlex.split(example)[1:])
            if said:
                errors.append(f"{path} --help: {example}: {said}")
    assert seen > 40 and not errors, "\n".join(errors)
