"""``headwater profile``: named places to work on (rpk profiles, nats contexts).

A profile names a broker (``--server``) or a data directory (``--data``). They are kept in
``$HEADWATER_CONFIG``, else ``~/.config/headwater/profiles.toml``::

    current = "prod"

    [profiles.prod]
    server = "10.0.0.5:7070,10.0.0.6:7070"

    [profiles.scratch]
    data = "/tmp/scratch"

Every command uses the profile named by ``--profile NAME`` (or ``HEADWATER_PROFILE``), else
the current one (``profile use``); an explicit ``--server``/``--data`` (or their variables)
wins over both.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from pathlib import Path
from typing import Annotated, Any

import typer

from headwater.cli.output import print_json
from headwater.cli.parse import check_server
from headwater.errors import InvalidArgumentError, UsageError

__all__ = ["profile_app", "config_path", "load_profiles", "resolve_profile"]

_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}\Z")

profile_app = typer.Typer(
    name="profile",
    help="Named profiles: a broker (--server) or a data directory (--data) to work on, kept in "
    "~/.config/headwater/profiles.toml (or $HEADWATER_CONFIG).",
    no_args_is_help=True,
)


def config_path() -> Path:
    """Where profiles are kept: ``$HEADWATER_CONFIG``, else ``~/.config/headwater/profiles.toml``."""
    explicit = os.environ.get("HEADWATER_CONFIG")
    return Path(explicit) if explicit else Path.home() / ".config" / "headwater" / "profiles.toml"


def load_profiles() -> dict[str, Any]:
    """The file's contents (``current``, ``profiles``), empty when there is no file."""
    path = config_path()
    try:
        doc = tomllib.loads(path.read_text())
    except FileNotFoundError:
        return {"profiles": {}}
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise InvalidArgumentError(f"cannot read the profiles in {path}: {e}") from None
    doc.setdefault("profiles", {})
    return doc


def _save(doc: dict[str, Any]) -> None:
    lines = []
    if doc.get("current"):
        lines += [f"current = {json.dumps(doc['current'])}", ""]
    for name, fields in sorted(doc["profiles"].items()):
        lines.append(f"[profiles.{json.dumps(name)}]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in sorted(fields.items())]  # a JSON string is a TOML one
        lines.append("")
    path = config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n".join(lines))
    tmp.replace(path)  # a crash leaves the old file or the new one, never half of one


def resolve_profile(name: str | None) -> dict[str, str]:
    """The settings of profile ``name`` (None: the current one, if any)."""
    doc = load_profiles()
    chosen = name or doc.get("current")
    if not chosen:
        return {}
    if chosen not in doc["profiles"]:
        known = ", ".join(sorted(doc["profiles"])) or "none yet"
        raise UsageError(
            f"no profile {chosen!r} in {config_path()} (profiles: {known}); add it with "
            f"'headwater profile add {chosen} --server HOST:PORT'"
        )
    return dict(doc["profiles"][chosen])


@profile_app.command("add")
def add(
    name: Annotated[str, typer.Argument(metavar="NAME", help="The profile's name.", show_default=False)],
    server: Annotated[
        str | None, typer.Option("--server", metavar="HOST:PORT[,...]", help="A broker or cluster.", show_default=False)
    ] = None,
    data: Annotated[
        str | None, typer.Option("--data", "-d", metavar="DIR", help="A data directory.", show_default=False)
    ] = None,
    use: Annotated[bool, typer.Option("--use", help="Make it the current profile too.")] = False,
) -> None:
    """Add (or replace) a profile.

    Examples:

    ```
    headwater profile add prod --server 10.0.0.5:7070,10.0.0.6:7070 --use
    headwater profile add scratch --data /tmp/scratch
    ```
    """
    if not _NAME_RE.match(name):
        raise InvalidArgumentError(f"profile name {name!r}: use 1-64 letters, digits, '.', '_' or '-'")
    if (server is None) == (data is None):
        raise UsageError("a profile names a broker or a data directory: give one of --server HOST:PORT, --data DIR")
    fields = {"server": check_server(server)} if server is not None else {"data": str(data)}
    doc = load_profiles()
    doc["profiles"][name] = fields
    if use:
        doc["current"] = name
    _save(doc)
    typer.echo(f"added profile {name!r}" + (" (current)" if use else f"; use it with 'headwater profile use {name}'"))


@profile_app.command("use")
def use(name: Annotated[str, typer.Argument(metavar="NAME", help="The profile.", show_default=False)]) -> None:
    """Make a profile the current one: every command uses it unless told otherwise.

    Example:

    ```
    headwater profile use prod
    ```
    """
    doc = load_profiles()
    resolve_profile(name)  # refuses a name that is not there, listing those that are
    doc["current"] = name
    _save(doc)
    typer.echo(f"now using profile {name!r}")


@profile_app.command("list")
def list_(as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of lines.")] = False) -> None:
    """The profiles, the current one marked with *.

    Examples:

    ```
    headwater profile list
    headwater profile list --json
    ```
    """
    doc = load_profiles()
    if as_json:
        print_json({"current": doc.get("current"), "file": str(config_path()), "profiles": doc["profiles"]})
        return
    if not doc["profiles"]:
        typer.echo(f"no profiles in {config_path()}; add one with 'headwater profile add NAME --server HOST:PORT'")
    for name, fields in sorted(doc["profiles"].items()):
        mark = "*" if name == doc.get("current") else " "
        where = ", ".join(f"{k} {v}" for k, v in fields.items())
        typer.echo(f"{mark} {name}  {where}")


@profile_app.command("delete")
def delete(name: Annotated[str, typer.Argument(metavar="NAME", help="The profile.", show_default=False)]) -> None:
    """Delete a profile (the current one too: then no profile is current).

    Example:

    ```
    headwater profile delete scratch
    ```
    """
    doc = load_profiles()
    resolve_profile(name)
    del doc["profiles"][name]
    if doc.get("current") == name:
        doc.pop("current")
    _save(doc)
    typer.echo(f"deleted profile {name!r}")
