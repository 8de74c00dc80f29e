"""Global options in any place: ``headwater queue list --server h:7070`` as well as
``headwater --server h:7070 queue list``, and ``headwater --json queue list``.

Click takes a group's options only before its subcommand; operators type them where their
fingers go (kcat, rpk and kubectl accept them anywhere). Before click parses, the root
command reorders the arguments: a global option found after the command (and not one the
command defines itself: ``serve --data``, ``dev-cluster --data``) moves in front of it, and
``--json`` found before the command moves after it. Nothing after ``--`` moves.
"""

from __future__ import annotations

from typing import Any

from headwater.errors import UsageError

__all__ = ["reorder", "GLOBAL_VALUE_OPTIONS"]

#: Root options that take a value, by every name they have.
GLOBAL_VALUE_OPTIONS = {"--server": "--server", "--data": "--data", "-d": "--data", "--profile": "--profile"}


def _leaf_and_path(root: Any, tokens: list[str]) -> tuple[Any, list[str], int]:
    """The command the tokens name, its path, and the index just after its name."""
    command, path, end = root, [], 0
    i = 0
    while i < len(tokens):
        token = tokens[i]
        name, eq, _ = token.partition("=")
        if token == "--":
            break
        if name in GLOBAL_VALUE_OPTIONS and command is root:
            i += 1 if eq else 2
            continue
        if token.startswith("-"):
            i += 1
            continue
        sub = getattr(command, "commands", {}).get(token)
        if sub is None:
            break
        command, end = sub, i + 1
        path.append(token)
        if not hasattr(sub, "commands"):
            break
        i += 1
    return command, path, end


def _own_options(command: Any) -> set[str]:
    return {opt for param in getattr(command, "params", []) for opt in getattr(param, "opts", [])}


def reorder(root: Any, args: list[str]) -> list[str]:
    """``args`` with the global options moved to where click takes them (see the module).

    >>> import typer
    >>> from headwater.cli.main import app
    >>> root = typer.main.get_command(app)
    >>> reorder(root, ["queue", "list", "--server", "h:1", "--json"])
    ['--server', 'h:1', 'queue', 'list', '--json']
    >>> reorder(root, ["--json", "queue", "list", "--data=d"])
    ['--data=d', 'queue', 'list', '--json']
    >>> reorder(root, ["serve", "--data", "d"])
    ['serve', '--data', 'd']
    """
    command, path, end = _leaf_and_path(root, args)
    if not path:
        return args
    own = _own_options(command)
    head, rest = args[:end], args[end:]
    cut = rest.index("--") if "--" in rest else len(rest)
    after, tail = rest[:cut], rest[cut:]
    moved: list[str] = []
    kept: list[str] = []
    i = 0
    while i < len(after):
        token = after[i]
        name, eq, _ = token.partition("=")
        if name in GLOBAL_VALUE_OPTIONS and name not in own:
            if not eq and i + 1 >= len(after):
                raise UsageError(f"{name} needs a value, e.g. {name} {_example(name)}")
            moved += [token] if eq else [token, after[i + 1]]
            i += 1 if eq else 2
            continue
        kept.append(token)
        i += 1
    json_before = "--json" in head[: end - len(path)]
    if json_before:
        head = [t for j, t in enumerate(head) if not (t == "--json" and j < end - len(path))]
        if "--json" not in own:
            raise UsageError(
                f"'headwater {' '.join(path)}' has no --json output; see docs/cli.md, 'JSON output', "
                f"for the commands that have one"
            )
        if "--json" not in kept:
            kept.append("--json")
    return moved + head + kept + tail


def _example(name: str) -> str:
    return {"--server": "127.0.0.1:7070", "--data": "./data", "-d": "./data", "--profile": "local"}[name]
