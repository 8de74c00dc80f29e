"""Run the shell examples of a Markdown guide as a reader would paste them into one terminal:
``python -m tests.support.doc_shell GUIDE.md WORKDIR`` writes the script for a look.

Every ```` ```sh ```` block that runs a ``headwater`` command is taken, top to bottom, into one
bash script run with ``set -e -o pipefail`` in WORKDIR: variables, ``export`` and brokers
started with ``&`` carry on from block to block, as in a terminal. Each block keeps its lines
at the guide's own line numbers, so a failure is reported as ``[failed at GUIDE:LINE: ...]``.

What a reader does by hand, the script does for them:

- **A command that follows until Ctrl-C** (``consume`` without ``--timeout``, ``serve`` not
  sent to the background, ``status --watch``) gets Ctrl-C (SIGINT) after ``FOLLOW_S``
  seconds and must then end with exit code 0, as the guide says.
- **A command whose next lines are ``# error: ...``** (and ``# hint: ...``) must fail with
  exit code 1 and print that text on stderr; ``...`` in the text stands for anything.
- **Addresses and directories** of the guide are made the run's own: each of the ports
  7070-7079 (``127.0.0.1:7071``, ``--port 7071``) becomes a free port of its own, and
  ``/var/lib/headwater`` and ``/tmp/headwater-*`` folders in WORKDIR; a ``serve`` without
  ``--port`` takes ``HEADWATER_PORT``, which the caller sets to another free port.

The caller runs the script in a process group of its own and ends the group afterwards,
which stops the brokers the guide started with ``&``.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

from tests.support.broker_process import free_port

FOLLOW_S = 4  # how long a command that follows runs before its Ctrl-C (it starts in about 0.5 s)

_FENCE = re.compile(r"^```\s*([\w+-]*)\s*$")
_SCRIPT_LANGS = {"sh", "bash", "shell", ""}  # blocks of commands, run as they are
_TRANSCRIPT_LANGS = {"console"}  # a session: '$ ' before each command, its output after
# transcripts only shown (they need what a guide's test cannot give, e.g. a ZooKeeper at a
# fixed port): their commands are still parsed, their output is not compared
_SHOWN_LANGS = {"text"}
_GUIDE_PORT = re.compile(r"(127\.0\.0\.1:|--port )(707\d)\b")
_GUIDE_DIRS = re.compile(r"(/var/lib/headwater|/tmp/headwater-[\w.-]+)")

#: sourced by the script: the two wrappers that stand in for the reader's hands
PRELUDE = r"""
hw_follow() {  # a command that runs until Ctrl-C: give it one after $HW_FOLLOW_S seconds
    local rc=0
    timeout --preserve-status -s INT "$HW_FOLLOW_S" "$@" || rc=$?
    if [ "$rc" -ne 0 ]; then
        echo "[a command that follows ended with exit code $rc after Ctrl-C, not 0: $*]" >&2
        return 1
    fi
}
hw_fails() {  # a command the guide shows failing: exit code 1, its stderr kept for the check
    local n=$1 rc=0
    shift
    "$@" 2> "$HW_WORK/.stderr-$n" || rc=$?
    cat "$HW_WORK/.stderr-$n" >&2
    echo "$rc" > "$HW_WORK/.rc-$n"
    if [ "$rc" -ne 1 ]; then
        echo "[a command the guide shows failing ended with exit code $rc, not 1: $*]" >&2
        return 1
    fi
}
trap 'echo "[failed at $HW_GUIDE:$LINENO: $BASH_COMMAND]" >&2' ERR
"""


def command_of(line: str) -> str | None:
    """The ``headwater ...`` command of a shell line, with environment assignments,
    ``ID=$(...)``, a pipe into it or out of it, a trailing ``&`` and a ``# comment`` taken
    off; None when the line runs no headwater command.

    >>> command_of("ID=$(headwater produce q 'x y')")
    "headwater produce q 'x y'"
    >>> command_of("seq 3 | headwater produce q --quiet &") is None, command_of("ls") is None
    (False, True)
    >>> command_of("headwater shell <<'END'")
    'headwater shell'

    """
    s = re.sub(r"^\S+=\$\((.*)\)$", r"\1", line.strip())
    s = re.sub(r"^(\w+=\S+\s+)+", "", s)
    if "| headwater " in s:
        s = "headwater " + s.split("| headwater ", 1)[1]
    if not s.startswith("headwater "):
        return None
    return re.split(r"\s+#\s|\s+<", s.split(" | ")[0])[0].rstrip(" &")


def shell_blocks(text: str, langs: frozenset[str] | set[str] = _SCRIPT_LANGS) -> list[tuple[int, list[str]]]:
    """``(line, lines)`` of each block of a Markdown text in one of ``langs`` (by default the
    scripts: ```` ```sh ````, ``bash``, ``shell`` or no language), ``line`` being the line of
    the block's first source line.

    >>> shell_blocks("```text\\n$ x\\n```\\nprose\\n```sh\\nls\\n```\\n")
    [(6, ['ls'])]
    """
    blocks: list[tuple[int, list[str]]] = []
    lang: str | None = None  # the open fence's language; None: outside a block
    for number, line in enumerate(text.splitlines(), 1):
        m = _FENCE.match(line)
        if lang is None:
            if m:
                lang, first, lines = m.group(1), number + 1, []
        elif m and not m.group(1):
            if lang in langs:
                blocks.append((first, lines))
            lang = None
        else:
            lines.append(line)
    return blocks


def command_lines(text: str) -> list[tuple[int, str]]:
    """``(line, command)`` for each ``headwater ...`` command in a Markdown text's shell
    blocks (see :func:`command_of`), and in its ``console`` transcripts and ``text`` blocks
    (the lines after a ``$`` prompt).

    >>> command_lines("```console\\n$ headwater queue list\\nname\\n```\\n")
    [(2, 'headwater queue list')]
    """
    found = [
        (first + i, command)
        for first, lines in shell_blocks(text)
        for i, line in enumerate(lines)
        if (command := command_of(line)) is not None
    ]
    found += [
        (first + i, command)
        for first, lines in shell_blocks(text, _TRANSCRIPT_LANGS | _SHOWN_LANGS)
        for i, line in enumerate(lines)
        if line.startswith("$ ") and (command := command_of(line[2:]))
    ]
    return sorted(found)


def runs_headwater(lines: list[str]) -> bool:
    return any(command_of(line) is not None for line in lines)


def follows(line: str) -> bool:
    """Whether a line's headwater command runs until Ctrl-C.

    >>> follows("headwater consume orders --group billing"), follows("headwater consume o --timeout 0")
    (True, False)
    >>> follows("headwater --data d serve --port 7070 &"), follows("X=1 headwater --data d serve")
    (False, True)
    """
    command = command_of(line)
    if command is None or line.rstrip().split("#")[0].rstrip().endswith("&"):
        return False
    words = shlex.split(command)
    return (
        ("consume" in words and "--timeout" not in words)
        or "--watch" in words
        or ("serve" in words and not {"--settings", "--help"} & set(words))
    )


def expected_failures(lines: list[str]) -> dict[int, str]:
    """``{index: text}``: the command lines followed by ``# error: ...`` comment lines (and
    ``# hint: ...``), with the text those comments say it prints."""
    found: dict[int, str] = {}
    for i, line in enumerate(lines):
        if command_of(line) is None:
            continue
        said = []
        for nxt in lines[i + 1 :]:
            m = re.match(r"#\s((?:error|hint): .*)$", nxt.strip())
            if not m:
                break
            said.append(m.group(1))
        if said:
            found[i] = "\n".join(said)
    return found


def matches(said: str, printed: str) -> bool:
    """Whether ``printed`` shows each line of ``said`` in order, ``...`` standing for anything.

    >>> matches("error: cannot reach (...); is it on?", "error: cannot reach (refused); is it on?\\n")
    True
    >>> matches("error: gone", "error: here")
    False
    """
    pattern = ".*?".join(re.escape(part) for part in re.split(r"\.\.\.", said.replace("\n", " ")))
    return re.search(pattern, " ".join(printed.split()), re.S) is not None


def _insert_before_headwater(line: str, word: str) -> str:
    """``X=1 headwater ...`` -> ``X=1 WORD headwater ...`` (the command's first ``headwater``)."""
    m = re.search(r"(^|[\s(|])headwater\s", line)
    assert m is not None, line
    at = m.start() + len(m.group(1))
    return line[:at] + word + " " + line[at:]


def build_script(guide: Path, work: Path) -> tuple[str, dict[int, tuple[int, str]]]:
    """The bash script of a guide's shell examples, and what its expected failures must
    print: ``{n: (guide line, text)}``, ``n`` naming the ``.stderr-n`` and ``.rc-n`` files."""
    text = guide.read_text()
    ports: dict[str, int] = {}  # the guide's port -> the run's

    def port(m: re.Match) -> str:
        return m.group(1) + str(ports.setdefault(m.group(2), free_port()))

    out = ['source "$HW_WORK/.prelude.sh"']  # line 1; every block sits on its guide lines
    failures: dict[int, tuple[int, str]] = {}
    for first, lines in shell_blocks(text):
        if not runs_headwater(lines):
            continue
        out += [""] * (first - 1 - len(out))
        failing = expected_failures(lines)
        for i, line in enumerate(lines):
            line = _GUIDE_PORT.sub(port, line)
            line = _GUIDE_DIRS.sub(lambda m: str(work / m.group(1).strip("/").replace("/", "-")), line)
            if i in failing:
                n = len(failures)
                failures[n] = (first + i, failing[i])
                line = _insert_before_headwater(line, f"hw_fails {n}")
            elif follows(lines[i]):
                line = _insert_before_headwater(line, "hw_follow")
            out.append(line)
    return "\n".join(out) + "\n", failures


def write(guide: Path, work: Path) -> tuple[Path, dict[int, tuple[int, str]]]:
    """Write the script and its prelude into ``work``; the script's path and the failures."""
    script, failures = build_script(guide, work)
    (work / ".prelude.sh").write_text(PRELUDE)
    path = work / f".{guide.stem}.sh"
    path.write_text(script)
    return path, failures


def check_failures(work: Path, failures: dict[int, tuple[int, str]], guide: str) -> list[str]:
    """What is wrong with the expected failures once the script ran: each ran, exited with
    1, and printed what the guide says."""
    wrong = []
    for n, (line, said) in failures.items():
        stderr, rc = work / f".stderr-{n}", work / f".rc-{n}"
        if not rc.exists():
            wrong.append(f"{guide}:{line}: never ran")
        elif not matches(said, stderr.read_text()):
            wrong.append(f"{guide}:{line}: the guide says it prints\n{said}\nbut it printed\n{stderr.read_text()}")
    return wrong


if __name__ == "__main__":  # write the script for a look: python -m tests.support.doc_shell GUIDE WORKDIR
    g, w = Path(sys.argv[1]), Path(sys.argv[2]).resolve()
    p, _ = write(g, w)
    print(p)


def run_script(script: Path, guide: str, work: Path, log: Path, timeout_s: float, **env_extra: str) -> int:
    """Run a script :func:`write` made, in ``work`` with its own HOME, a free HEADWATER_PORT and
    no HEADWATER_* from this process, the terminal into ``log`` (a file, not a pipe: brokers
    started with '&' keep it open); then stop what it left running (its process group). The
    script's exit code."""
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
        "PYTHONUNBUFFERED": "1",
        "HW_WORK": str(work),
        "HW_GUIDE": guide,
        "HW_FOLLOW_S": str(FOLLOW_S),
        "HEADWATER_PORT": str(free_port()),
        "HOME": str(work),
        **env_extra,
    }
    for name in ("HEADWATER_DATA", "HEADWATER_SERVER", "HEADWATER_CONFIG", "HEADWATER_PROFILE"):
        env.pop(name, None)
    with open(log, "w") as out_f:
        proc = subprocess.Popen(
            ["bash", "-e", "-o", "pipefail", str(script)],
            cwd=work,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out_f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        proc.wait(timeout=timeout_s)
    finally:  # the brokers the script started with '&'
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode
