"""What every command shares: the global options, the one way to get a Client, the consoles.

Commands never call :func:`headwater.open` themselves; they call :func:`open_client`, so
``--server`` is handled here and nowhere else: one broker's ``HOST:PORT``, or a cluster's
bootstrap list ``HOST:PORT,HOST:PORT,...`` (:func:`headwater.connect` takes either).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

import headwater
from headwater.cli.parse import check_server, parse_seconds
from headwater.client import Client
from headwater.errors import InvalidArgumentError, NotADataDirectoryError, UsageError

__all__ = ["CliState", "open_client", "close_client", "out_console", "err_console", "stdin_is_tty"]

DATA_DIR_DEFAULT = "./headwater-data"


@dataclass
class CliState:
    """The global options, kept on the root context (``ctx.obj``)."""

    data_dir: Path = field(default_factory=lambda: Path(DATA_DIR_DEFAULT))
    server: str | None = None
    client: Client | None = None
    # The shell runs many commands on one state: the client it opens outlives each command
    # and is closed by the shell when the session ends, not by the command that opened it.
    keep_open: bool = False


def _state(ctx: typer.Context) -> CliState:
    state = ctx.find_object(CliState)
    if state is None:  # a command invoked without the root callback (only in odd embeddings)
        state = ctx.find_root().ensure_object(CliState)
    return state


#: ``--data DIR`` after the commands that work on a data directory only (``serve``,
#: ``check``): the global ``--data`` before the command, in the place such tools take it.
LocalData = Annotated[
    str | None,
    typer.Option(
        "--data",
        "-d",
        metavar="DIR",
        show_default=False,
        help="The data directory (the same as the global --data, which may come before the command).",
    ),
]


def local_data_state(ctx: typer.Context, data: str | None) -> CliState:
    """The state with ``data`` (a command's own ``--data``, see :data:`LocalData`) as its data
    directory; a different ``--data`` also given before the command is an error."""
    state = _state(ctx)
    if data is None:
        return state
    if state.keep_open:
        raise UsageError(
            "--data is a global option of the shell itself; start another 'headwater --data ... shell' to change it"
        )
    root = ctx.find_root()
    source = root.get_parameter_source("data")
    given = root.params.get("data")
    if source is not None and source.name == "COMMANDLINE" and given is not None and Path(given) != Path(data):
        raise UsageError(f"--data is given twice, {given!r} before the command and {data!r} after it; give it once")
    state.data_dir = Path(data)
    return state


def open_client(ctx: typer.Context, *, create: bool = False, read_only: bool = False) -> Client:
    """The Client for this invocation, opened on first use and closed when the command ends
    (in the shell, where ``state.keep_open`` is set, when the session ends).

    ``create``: make the data directory if it does not exist (only ``queue create`` does;
    every other command reports a missing directory instead of silently making an empty one,
    which is what a mistyped ``--data`` would otherwise do). ``read_only``: a command that
    only reads opens a data directory read-only, so it never changes a file (no recovery
    cut, no index rewritten); what would need repairing is said on stderr. The shell opens
    one store for every command it runs, read-write.
    """
    state = _state(ctx)
    if state.client is not None:
        return state.client
    client = _open(state, create=create, read_only=read_only and not state.keep_open)
    state.client = client
    if not state.keep_open:
        ctx.find_root().call_on_close(_closer(state))
    return client


def _open(state: CliState, *, create: bool, read_only: bool) -> Client:
    if state.server is not None:  # one address, or a cluster's bootstrap list "a:1,b:2"
        return headwater.connect(check_server(state.server), connect_timeout_s=_connect_timeout_s())
    path = state.data_dir
    if not create and not path.exists():
        raise NotADataDirectoryError(
            f"there is no data directory at {str(path)!r}; pass --data DIR or set HEADWATER_DATA "
            f"to an existing one, or create a queue there first with 'headwater queue create NAME'"
        )
    if not read_only:
        return headwater.open(path)
    client = headwater.open(path, read_only=True)
    for line in client.status()["recovery"]:
        if "headwater check --repair" in line:  # what a read-only open left for a repair to do
            err_console().print(f"[yellow]warning:[/] {line}", markup=True, highlight=False)
    return client


def _connect_timeout_s() -> float:
    text = os.environ.get("HEADWATER_CONNECT_TIMEOUT_S", "5")
    timeout_s = parse_seconds(text, "HEADWATER_CONNECT_TIMEOUT_S")
    if timeout_s <= 0:
        raise InvalidArgumentError(
            f"HEADWATER_CONNECT_TIMEOUT_S: {text!r} is out of range; use seconds greater than 0, e.g. 5"
        )
    return timeout_s


def close_client(state: CliState) -> None:
    """Close the state's client, if one is open (the next :func:`open_client` reopens)."""
    client, state.client = state.client, None
    if client is not None:
        client.close()


def _closer(state: CliState):
    return lambda: close_client(state)


TABLE_WIDTH_PIPED = 200  # columns of a table written to a pipe or file (a terminal has its own)


def out_console() -> Console:
    """Rich console on stdout. Made per call: tests swap ``sys.stdout`` between runs."""
    console = Console(file=sys.stdout, highlight=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = TABLE_WIDTH_PIPED  # rich would assume 80 and squeeze the value column
    return console


def err_console() -> Console:
    """Rich console on stderr, for errors, hints and progress bars.

    Soft wrap: an error stays one line in a log file, however narrow rich thinks it is.
    """
    return Console(file=sys.stderr, highlight=False, soft_wrap=True)


def stdin_is_tty() -> bool:
    """Whether a person can answer a prompt (a function so tests can pretend)."""
    try:
        return os.isatty(sys.stdin.fileno())
    except (AttributeError, OSError, ValueError):
        return False


#: SIGINTs closer together than this are one Ctrl-C. ``timeout -s INT`` (and supervisors that
#: stop a process group) signal the process and then its whole group, so it gets the signal
#: twice, milliseconds apart, and Python may run the second handler later still (up to a
#: blocking wait of the main thread); a person's second Ctrl-C comes after this.
CTRL_C_REPEAT_S = 1.0


@contextmanager
def on_ctrl_c(handler: Callable[[int, object], None]) -> Iterator[None]:
    """Call ``handler`` once per Ctrl-C (SIGINT) while the block runs, then restore the
    previous handler. A SIGINT within :data:`CTRL_C_REPEAT_S` of the one before is that same
    Ctrl-C, also just after the block (it would otherwise interrupt what follows it).
    Outside the main thread (the CLI embedded in a program) Ctrl-C keeps its usual meaning."""
    last: list[float] = []  # when the last Ctrl-C was counted

    def once_per_ctrl_c(signum: int, frame: object) -> None:
        now = time.monotonic()
        if last and now - last[0] < CTRL_C_REPEAT_S:
            return
        last[:] = [now]
        handler(signum, frame)

    try:
        previous = signal.signal(signal.SIGINT, once_per_ctrl_c)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        if last and time.monotonic() - last[0] < CTRL_C_REPEAT_S:
            signal.signal(signal.SIGINT, _after_ctrl_c(previous, last[0] + CTRL_C_REPEAT_S))
        else:
            signal.signal(signal.SIGINT, previous)


def _after_ctrl_c(previous: Any, until: float) -> Callable[[int, object], None]:
    """A SIGINT handler that drops the repeats of a Ctrl-C until ``until`` (monotonic), then
    gives SIGINT back to ``previous`` (and the signal with it)."""

    def handler(signum: int, frame: object) -> None:
        if time.monotonic() < until:
            return
        signal.signal(signal.SIGINT, previous)
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_DFL:
            signal.raise_signal(signum)

    handler.repeats_until = until  # type: ignore[attr-defined]  # a mark on the handler function, read back by on_ctrl_c
    return handler


def ignore_ctrl_c_repeats_at_exit() -> None:
    """Called as the process ends: while the repeats of a Ctrl-C may still come, ignore
    SIGINT. (Python gives SIGINT its default action while it shuts down, and a repeat
    arriving then would kill the process, exit status 130, after a clean stop.)"""
    handler = signal.getsignal(signal.SIGINT)
    if getattr(handler, "repeats_until", 0.0) > time.monotonic():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
