"""The ``headwater`` command line as tests drive it: in-process through typer's CliRunner
(``Cli`` with any global options, ``DataCli`` on a data directory), or as a real subprocess
whose JSON lines are read as they come (``Follower``).

Both see a wide, colourless console and none of the developer's ``HEADWATER_*`` settings.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import threading
import time
from pathlib import Path

from typer.testing import CliRunner

from headwater.cli.main import app
from tests.support.broker_process import HEADWATER

ENV = {
    # a wide, colourless, predictable console whatever the developer's shell exports
    "COLUMNS": "200",
    "FORCE_COLOR": None,
    "TTY_COMPATIBLE": None,
    "HEADWATER_DATA": None,
    "HEADWATER_SERVER": None,
}


class Cli:
    """``headwater <global options> ...`` in-process; returns (exit code, stdout, stderr)."""

    def __init__(self, *global_options: str) -> None:
        self.global_options = list(global_options)
        self.runner = CliRunner(env=ENV)

    def run(self, *args: str, input: str | None = None) -> tuple[int, str, str]:
        result = self.runner.invoke(app, [*self.global_options, *args], input=input)
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            raise result.exception
        assert "Traceback" not in result.output
        return result.exit_code, result.stdout, result.stderr

    def __call__(self, *args: str, input: str | None = None) -> str:
        code, out, err = self.run(*args, input=input)
        assert code == 0, (args, code, out, err)
        return out

    def error(self, *args: str) -> str:
        code, _, err = self.run(*args)
        assert code == 1 and err.startswith("error: "), (args, code, err)
        return err

    def records(self, *args: str) -> list[dict]:
        return [json.loads(line) for line in self(*args, "--json").splitlines()]


class DataCli:
    """``headwater --data DIR ...`` in-process; returns typer's result once it ended with ``code``."""

    def __init__(self, data: Path) -> None:
        self.data = data
        self.runner = CliRunner(env=ENV)

    def __call__(self, *args: str, input: str | bytes | None = None, code: int = 0, data: bool = True):
        argv = (["--data", str(self.data)] if data else []) + list(args)
        result = self.runner.invoke(app, argv, input=input)
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            raise result.exception
        assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
        assert "Traceback" not in result.output
        return result

    def error(self, *args: str, code: int = 1, **kw) -> str:
        """Run a command that must fail; return its stderr (one ``error: ...`` line and hints)."""
        result = self(*args, code=code, **kw)
        if code == 1:
            assert result.stderr.startswith("error: "), result.stderr
        return result.stderr

    def json_lines(self, *args: str) -> list[dict]:
        return [json.loads(line) for line in self(*args, "--json").stdout.splitlines()]


def subprocess_env() -> dict[str, str]:
    """This process's environment for a ``headwater`` child: no HEADWATER_* settings, no forced colour."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEADWATER_") and k != "FORCE_COLOR"}
    return {**env, "COLUMNS": "200", "PYTHONUNBUFFERED": "1"}


class Follower:
    """``headwater ... consume`` as a subprocess whose JSON lines are read as they come."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [HEADWATER, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=subprocess_env()
        )
        self.records: list[dict] = []
        self._lines: queue.Queue[bytes] = queue.Queue()
        self._reader = threading.Thread(target=self._read_lines, daemon=True)
        self._reader.start()

    def _read_lines(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(b"")  # the end

    def read(self, n: int, timeout_s: float = 10.0) -> list[dict]:
        """Wait for ``n`` more records."""
        want = len(self.records) + n
        deadline = time.monotonic() + timeout_s
        while len(self.records) < want:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.proc.kill()
                raise AssertionError(
                    f"only {len(self.records)} record(s) after {timeout_s} s; stderr: {self.finish()[1]}"
                ) from None
            if not line:
                raise AssertionError(f"consume ended early: {self.finish()}")
            self.records.append(json.loads(line))
        return self.records[want - n :]

    def finish(self, timeout_s: float = 10.0) -> tuple[int, str]:
        """Wait for the end; return the exit code and stderr."""
        try:
            code = self.proc.wait(timeout_s)
        finally:
            self.proc.kill()
        self._reader.join(timeout_s)
        while line := self._lines.get_nowait() if not self._lines.empty() else b"":
            self.records.append(json.loads(line))
        assert self.proc.stderr is not None
        return code, self.proc.stderr.read().decode()
