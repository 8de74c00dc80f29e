"""``headwater shell``: the same commands, typed one after another in one session.

In the manner of the HBase and HQueue shells: a prompt, the commands of ``headwater``
without the word ``headwater`` (``queue list``, ``produce orders hello``, ``scan orders``),
history kept between sessions, Tab completion of commands, subcommands, options and queue
names, and errors that are printed and leave the session running.

How a line runs: it is split like a POSIX shell would (:mod:`shlex`) and handed to the very
command object the ``headwater`` entry point runs, with the session's
:class:`~headwater.cli.context.CliState` as the context object. That state carries the
client opened when the session started and is marked ``keep_open``, so every command reuses
one connection (or one embedded broker) and none of them closes it; the shell closes it when
the session ends. Parsing, output, error lines and exit codes are therefore exactly those of
the command line.

Completion walks that command tree by duck typing (a group has ``commands``, a parameter
says ``param_type_name``), which holds for click's classes and for the copy of click that
newer typer versions carry inside.

Without a terminal on stdin (``headwater shell < script.hw``) there is no prompt, no
history and no completion; the shell exits 1 if any command failed.
"""

from __future__ import annotations

import cmd
import os
import shlex
import sys
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any

import typer
from rich.text import Text

import headwater
from headwater.cli.context import CliState, _state, close_client, err_console, open_client, stdin_is_tty
from headwater.errors import HeadwaterError, UsageError

__all__ = ["shell", "ShellSession", "HISTORY_FILE_DEFAULT", "HISTORY_LINES_MAX"]

HISTORY_FILE_DEFAULT = "~/.headwater_history"  # $HEADWATER_HISTORY overrides it
HISTORY_LINES_MAX = 1000

# Commands that make no sense inside a session, and why.
NOT_IN_SHELL = {
    "shell": "you are in the shell already",
    "serve": "run a broker from your system shell: headwater --data DIR serve",
    "dev-cluster": "run it from your system shell: it runs ZooKeeper and brokers until Ctrl-C",
    "profile": "the session works where it was started; manage profiles from your system shell, "
    "then start 'headwater --profile NAME shell'",
    "check": "it needs the data directory to itself; run 'headwater --data DIR check' from your "
    "system shell with every broker and shell on it stopped",
}
EXIT_WORDS = ("exit", "quit")
HELP_WORDS = ("help", "?")


def _readline() -> ModuleType | None:
    try:
        import readline
    except ImportError:  # Python built without it: no history, no completion, still a shell
        return None
    return readline


class ShellSession(cmd.Cmd):
    """A read-eval-print loop over the root ``headwater`` command.

    ``root`` is the command group of ``headwater`` (its ``main`` runs one command line);
    ``state`` the session's global options and client. :meth:`run_line` runs one command
    and returns its exit code.
    """

    def __init__(self, root: Any, state: CliState, *, interactive: bool) -> None:
        super().__init__()
        self.completekey = ""  # not cmd's readline setup: preloop's, which also knows libedit
        self.root = root
        self.state = state
        self.interactive = interactive
        self.use_rawinput = interactive  # input() only on a terminal: it is what uses readline
        where = state.server or str(state.data_dir)
        self.prompt = f"headwater({where})> " if interactive else ""
        self.failures = 0
        self._queue_names: list[str] | None = None
        self._matches: list[str] = []
        self._readline = _readline() if interactive else None
        self._completer_installed = False
        self._old_completer: Any = None

    # --- the loop -----------------------------------------------------------------------

    def preloop(self) -> None:
        rl = self._readline
        if rl is None or self._completer_installed:  # cmdloop starts again after a Ctrl-C
            return
        self._completer_installed = True
        self._old_completer = rl.get_completer()
        rl.set_completer(self.complete)
        rl.set_completer_delims(" \t\n\"'")  # queue names and options hold '-' and '.'
        if "libedit" in (rl.__doc__ or ""):
            rl.parse_and_bind("bind ^I rl_complete")
        else:
            rl.parse_and_bind("tab: complete")

    def postloop(self) -> None:
        if self._readline is not None and self._completer_installed:
            self._readline.set_completer(self._old_completer)
            self._completer_installed = False

    def emptyline(self) -> bool:
        return False  # cmd's default repeats the last command: surprising for 'produce'

    def onecmd(self, line: str) -> bool:
        """Run one line; True ends the session."""
        if line == "EOF":  # what cmd hands over on Ctrl-D or the end of the input
            if self.interactive:
                self.stdout.write("\n")
            return True
        line = line.strip()
        self._tidy_history(line)
        if not line or line.startswith("#"):
            return False
        try:
            args = shlex.split(line)
        except ValueError as e:  # an unclosed quote
            self._error(f"cannot split the line into words: {e}")
            return False
        if args[0] in EXIT_WORDS:
            return True
        self.run_line(args)
        return False

    def run_line(self, args: list[str]) -> int:
        """Run one command (``args`` without the word headwater); return its exit code."""
        if args[0] in HELP_WORDS:
            args = [*args[1:], "--help"]
        elif args[0] in NOT_IN_SHELL:
            self._error(f"'{args[0]}' is not available in the shell: {NOT_IN_SHELL[args[0]]}")
            return 1
        history_len = self._history_length()
        try:
            self.root.main(args=args, prog_name="headwater", standalone_mode=True, obj=self.state)
            code = 0  # standalone mode always ends in SystemExit; this is for safety only
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except Exception:  # noqa: BLE001 - a bug in a command must not take the session down
            traceback.print_exc()
            err_console().print(
                Text("this is a bug in headwater; please report it with the command that caused it", style="red")
            )
            code = 1
        self._forget_answers(history_len)  # a "delete? [y/N]" answer is not a command
        if args[0] == "queue":
            self._queue_names = None  # created, deleted or renamed: ask the broker again
        sys.stdout.flush()
        if code != 0:
            self.failures += 1
        return code

    def _error(self, message: str) -> None:
        self.failures += 1
        err_console().print(Text(f"error: {message}", style="red"))

    # --- history ------------------------------------------------------------------------

    def _history_length(self) -> int:
        return self._readline.get_current_history_length() if self._readline else 0

    def _tidy_history(self, line: str) -> None:
        """Keep the line just typed without its edge spaces, and once when typed twice."""
        rl = self._readline
        n = rl.get_current_history_length() if rl else 0
        last = rl.get_history_item(n) if rl and n else None  # items count from 1 here...
        if rl is None or last is None or last.strip() != line:
            return  # an empty line is not added to the history: the last item is older
        if not line or (n > 1 and rl.get_history_item(n - 1) == line):
            rl.remove_history_item(n - 1)  # ...and from 0 here
        elif last != line:
            rl.replace_history_item(n - 1, line)

    def _forget_answers(self, length: int) -> None:
        rl = self._readline
        if rl is None:
            return
        while rl.get_current_history_length() > length:
            rl.remove_history_item(rl.get_current_history_length() - 1)

    def load_history(self, path: Path) -> None:
        if self._readline is None:
            return
        self._readline.set_history_length(HISTORY_LINES_MAX)
        try:
            self._readline.read_history_file(path)
        except FileNotFoundError:
            pass
        except OSError as e:
            err_console().print(f"history not loaded from {path}: {e.strerror or e}", style="dim")

    def save_history(self, path: Path) -> None:
        if self._readline is None:
            return
        try:
            self._readline.write_history_file(path)
        except OSError as e:
            err_console().print(f"history not saved to {path}: {e.strerror or e}", style="dim")

    # --- completion ---------------------------------------------------------------------

    def complete(self, text: str, state: int) -> str | None:
        """readline's completer: the ``state``-th candidate for the word being typed."""
        if state == 0:
            rl = self._readline
            line = rl.get_line_buffer() if rl else ""
            begidx = rl.get_begidx() if rl else len(line)
            # Python's readline appends nothing to a completed word: the space is ours
            self._matches = [m + " " for m in self.completions(line[:begidx], text)]
        return self._matches[state] if state < len(self._matches) else None

    def completions(self, before: str, text: str) -> list[str]:
        """Candidates for the word ``text``, given the line ``before`` it."""
        try:
            words = shlex.split(before)
        except ValueError:  # inside an open quote
            return []
        help_mode = bool(words) and words[0] in HELP_WORDS
        if help_mode:
            words = words[1:]
        command = self.root
        for i, word in enumerate(words):
            if not _is_group(command):
                return [] if help_mode else self._argument_completions(command, words[i:], text)
            sub = command.commands.get(word)
            if sub is None:
                return []
            command = sub
        if _is_group(command):
            names = [n for n, c in command.commands.items() if not c.hidden]
            if command is self.root:
                names = [n for n in names if n not in NOT_IN_SHELL]
                if not help_mode:
                    names += [*EXIT_WORDS, "help"]
            return sorted(n for n in names if n.startswith(text))
        return [] if help_mode else self._argument_completions(command, [], text)

    def _argument_completions(self, command: Any, words: list[str], text: str) -> list[str]:
        valued: dict[str, Any] = {}
        for p in command.params:
            if _is_option(p) and not p.is_flag and not p.count:
                valued.update({o: p for o in p.opts})
        positional, pending = 0, None
        only_positional = False
        for w in words:
            if pending is not None:
                pending = None
            elif w == "--":
                only_positional = True
            elif w.startswith("-") and len(w) > 1 and not only_positional:
                pending = valued.get(w) if "=" not in w else None
            else:
                positional += 1
        if pending is not None:  # the value of an option: what the option itself offers
            try:
                items = pending.shell_complete(None, text)  # choices need no context
            except Exception:  # noqa: BLE001 - a completer must never break the line being typed
                return []
            return sorted(i.value for i in items if getattr(i, "type", "plain") == "plain")
        if text.startswith("-") and not only_positional:
            opts = {
                o for p in command.params if _is_option(p) for o in (*p.opts, *p.secondary_opts) if o.startswith("--")
            }
            return sorted(o for o in opts | {"--help"} if o.startswith(text))
        arguments = [p for p in command.params if p.param_type_name == "argument"]
        if positional < len(arguments) and self._names_a_queue(command, arguments[positional]):
            return [n for n in self.queue_names() if n.startswith(text)]
        return []

    @staticmethod
    def _names_a_queue(command: Any, argument: Any) -> bool:
        # 'queue create NAME' names a queue that does not exist yet: nothing to offer
        return argument.name == "queue" or (argument.name == "name" and command.name != "create")

    def queue_names(self) -> list[str]:
        """The broker's queue names, fetched once and again after any 'queue' command."""
        if self._queue_names is None:
            client = self.state.client
            if client is None:
                return []
            try:
                self._queue_names = sorted(q.name for q in client.admin.list_queues())
            except (HeadwaterError, OSError):
                return []  # completion must never break the line being typed
        return self._queue_names


def _is_group(command: Any) -> bool:
    return isinstance(getattr(command, "commands", None), dict)


def _is_option(param: Any) -> bool:
    return param.param_type_name == "option"


def _history_path() -> Path:
    return Path(os.environ.get("HEADWATER_HISTORY") or HISTORY_FILE_DEFAULT).expanduser()


def shell(ctx: typer.Context) -> None:
    """An interactive shell: type headwater commands one after another, on one connection.

    Commands are those of headwater without the word headwater (queue list, scan orders,
    consume orders --group g). Tab completes commands, options and queue names; Up and Down
    walk the history, kept in ~/.headwater_history (or $HEADWATER_HISTORY). An error is
    printed and the session goes on. help [COMMAND] shows help; exit, quit or Ctrl-D leave.
    With commands piped in instead of typed, it runs them and exits 1 if any failed.

    Examples:

    ```
    headwater --server 127.0.0.1:7070 shell
    headwater --data ./data shell
    printf 'queue create orders\\nproduce orders hello\\nscan orders\\n' | headwater shell
    ```
    """
    state = _state(ctx)
    if state.keep_open:
        raise UsageError("you are in the shell already")
    root = ctx.find_root().command
    assert _is_group(root), "the shell runs under the headwater command group"
    state.keep_open = True
    interactive = stdin_is_tty()
    session = ShellSession(root, state, interactive=interactive)
    try:
        # Connect now, so a broker that is down is reported before the first prompt. A data
        # directory that does not exist yet is opened by the 'queue create' that makes it.
        if state.server is not None or state.data_dir.exists():
            open_client(ctx)
        if interactive:
            history = _history_path()
            session.load_history(history)
            where = state.server or str(state.data_dir)
            intro = (
                f"headwater {headwater.__version__} shell on {where}; 'help' lists the "
                f"commands, Tab completes, 'exit' or Ctrl-D leaves"
            )
        else:
            history, intro = None, None
        try:
            while True:
                try:
                    session.cmdloop(intro)
                    break
                except KeyboardInterrupt:  # Ctrl-C at the prompt drops the line, as in bash
                    session.stdout.write("^C\n")
                    intro = session.intro = None  # cmdloop(None) would show the kept intro again
        finally:
            if history is not None:
                session.save_history(history)
    finally:
        state.keep_open = False
        close_client(state)
    if not interactive and session.failures:
        raise typer.Exit(1)
