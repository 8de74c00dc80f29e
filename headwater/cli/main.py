"""The ``headwater`` command: global options, command table, and how errors are shown.

Errors Headwater raises on purpose (:class:`~headwater.errors.HeadwaterError`) and
operating-system errors (a permission denied on the data directory) are printed as one red
``error: <message>`` line on stderr, sometimes followed by a hint, with exit code 1. Usage
errors found by the parser (an unknown option, a missing argument) keep typer's format and
exit code 2. Anything else is a bug and shows its traceback.
"""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text
from typer.core import TyperGroup

import headwater
from headwater.cli import records
from headwater.cli.argv import reorder
from headwater.cli.check import check
from headwater.cli.cluster import cluster_app
from headwater.cli.consume import consume
from headwater.cli.context import DATA_DIR_DEFAULT, CliState, err_console, ignore_ctrl_c_repeats_at_exit
from headwater.cli.delay import delay_app
from headwater.cli.dev_cluster import dev_cluster
from headwater.cli.group_delete import delete_group
from headwater.cli.group_reset import reset_group
from headwater.cli.groups import group_app, queue_lag
from headwater.cli.metrics import metrics
from headwater.cli.produce import produce
from headwater.cli.profiles import profile_app, resolve_profile
from headwater.cli.queue_alter import alter
from headwater.cli.queues import queue_app
from headwater.cli.serve import serve
from headwater.cli.shell import shell
from headwater.cli.status import status
from headwater.cli.subscribers import subscriber_app
from headwater.errors import (
    GroupNotFoundError,
    HeadwaterError,
    MessageNotFoundError,
    NotADataDirectoryError,
    PartitionOutOfRangeError,
    QueueDisabledError,
    QueueExistsError,
    QueueNotFoundError,
    SubscriberExistsError,
    UsageError,
)

__all__ = ["app", "main"]

_HINTS: list[tuple[type[HeadwaterError], str]] = [
    (QueueNotFoundError, "see the queues with 'headwater queue list'"),
    (QueueExistsError, "see it with 'headwater queue describe NAME', pick another name, or pass --if-not-exists"),
    (QueueDisabledError, "enable it with 'headwater queue enable NAME'"),
    (PartitionOutOfRangeError, "see the partitions with 'headwater queue describe NAME'"),
    (
        MessageNotFoundError,
        "it may have expired (ttl), been truncated or deleted; 'headwater scan QUEUE' shows what is kept",
    ),
    (NotADataDirectoryError, "point --data (or HEADWATER_DATA) at a Headwater data directory"),
    (GroupNotFoundError, "see the groups with 'headwater group list'"),
    (SubscriberExistsError, "see it with 'headwater subscriber describe QUEUE NAME'"),
]


def hint_for(error: HeadwaterError) -> str | None:
    """A next step for the user, unless the message already names one."""
    for cls, hint in _HINTS:
        if isinstance(error, cls):
            text = str(error)
            return None if "headwater " in text or "--data" in text else hint
    return None


def report_error(message: str, hint: str | None = None) -> None:
    console = err_console()
    console.print(Text(f"error: {message}", style="red"))
    if hint:
        console.print(Text(f"hint: {hint}", style="dim"))


class HeadwaterGroup(TyperGroup):
    """The root group: takes global options in any place (:mod:`headwater.cli.argv`), and
    turns expected errors into one readable line and exit code 1."""

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:  # type: ignore[override]  # click's ctx type
        try:
            args = reorder(self, args)
        except HeadwaterError as e:
            report_error(str(e))
            raise typer.Exit(2) from None
        return super().parse_args(ctx, args)

    def invoke(self, ctx: typer.Context):  # type: ignore[override]  # click's invoke returns Any; typer's stub narrows it
        try:
            return super().invoke(ctx)
        except HeadwaterError as e:
            report_error(str(e), hint_for(e))
            raise typer.Exit(1) from None
        except OSError as e:
            if e.errno == errno.EPIPE:
                raise  # typer ends quietly when the reader of stdout went away (| head)
            where = f": {e.filename}" if e.filename else ""
            report_error(f"{e.strerror or e}{where}")
            raise typer.Exit(1) from None


app = typer.Typer(
    cls=HeadwaterGroup,
    name="headwater",
    help=(
        "Headwater: a persistent, partitioned message queue.\n\n"
        "Works on a local data directory (--data, or HEADWATER_DATA; default "
        f"{DATA_DIR_DEFAULT}) or on a running broker or cluster (--server HOST:PORT[,...], or "
        "HEADWATER_SERVER). Global options may go before or after the command.\n\n"
        "Examples:\n\n"
        "```\n"
        "headwater queue create orders --partitions 4\n"
        "headwater produce orders 'order 17 paid'\n"
        "seq 1000 | headwater produce orders --quiet\n"
        "headwater scan orders --from -15m\n"
        "headwater --data /var/lib/headwater queue list\n"
        "```"
    ),
    no_args_is_help=True,
    rich_markup_mode="markdown",
    pretty_exceptions_enable=False,  # only bugs reach here: a plain traceback pastes best
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"headwater {headwater.__version__}")
        raise typer.Exit()


@app.callback()
def root(
    ctx: typer.Context,
    data: Annotated[
        str,
        typer.Option(
            "--data",
            "-d",
            envvar="HEADWATER_DATA",
            metavar="DIR",
            help="The data directory to work on.",
        ),
    ] = DATA_DIR_DEFAULT,
    server: Annotated[
        str | None,
        typer.Option(
            "--server",
            envvar="HEADWATER_SERVER",
            metavar="HOST:PORT[,HOST:PORT...]",
            help="Talk to a running broker (headwater serve) instead of a data directory; for a "
            "cluster, any of its brokers (a list: the first that answers).",
            show_default=False,
        ),
    ] = None,
    profile: Annotated[
        str | None,
        typer.Option(
            "--profile",
            envvar="HEADWATER_PROFILE",
            metavar="NAME",
            help="Use this profile's --server or --data ('headwater profile list'); default: the "
            "current profile, if any. An explicit --server or --data wins.",
            show_default=False,
        ),
    ] = None,
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_print_version,
            is_eager=True,
            help="Print the version and exit.",
        ),
    ] = False,
) -> None:
    if isinstance(ctx.obj, CliState) and ctx.obj.keep_open:
        # a line typed in 'headwater shell': the session's state and client stay as they are
        for name in ("data", "server"):
            source = ctx.get_parameter_source(name)
            if source is not None and source.name == "COMMANDLINE":
                raise UsageError(
                    f"--{name} is a global option of the shell itself; start "
                    f"another 'headwater --{name} ... shell' to change it"
                )
        return
    if ctx.invoked_subcommand != "profile":
        server, data = _with_profile(ctx, profile, server, data)
    ctx.obj = CliState(data_dir=Path(data), server=server)


def _with_profile(ctx: typer.Context, profile: str | None, server: str | None, data: str) -> tuple[str | None, str]:
    """Where to work, in falling priority: ``--server``/``--data`` on the command line, the
    profile ``--profile`` (or ``HEADWATER_PROFILE``) names, ``HEADWATER_SERVER`` /
    ``HEADWATER_DATA``, the current profile, the default data directory."""

    def source(name: str) -> str:
        src = ctx.get_parameter_source(name)
        return "DEFAULT" if src is None else src.name

    typed = [n for n in ("server", "data") if source(n) == "COMMANDLINE"]
    if typed and source("profile") == "COMMANDLINE":
        raise UsageError(f"--profile and --{typed[0]} do not go together: the profile names where to work; give one")
    if typed or (profile is None and any(source(n) == "ENVIRONMENT" for n in ("server", "data"))):
        return server, data
    fields = resolve_profile(profile)
    if not fields:
        return server, data
    return fields.get("server"), fields.get("data", DATA_DIR_DEFAULT)


queue_app.command("lag")(queue_lag)
queue_app.command("alter")(alter)
app.add_typer(queue_app, name="queue")
group_app.command("reset")(reset_group)
group_app.command("delete")(delete_group)
app.add_typer(group_app, name="group")
app.add_typer(subscriber_app, name="subscriber")
app.add_typer(delay_app, name="delay")
app.add_typer(cluster_app, name="cluster")
app.add_typer(profile_app, name="profile")
app.command("produce")(produce)
app.command("scan")(records.scan)
app.command("get")(records.get)
app.command("find")(records.find)
app.command("consume")(consume)
app.command("status")(status)
app.command("metrics")(metrics)
app.command("check")(check)
app.command("serve")(serve)
app.command("shell")(shell)
app.command("dev-cluster")(dev_cluster)


def main() -> None:
    """Console-script entry point (``headwater = headwater.cli.main:main``)."""
    try:
        app(prog_name="headwater")
    finally:
        ignore_ctrl_c_repeats_at_exit()


if __name__ == "__main__":
    main()
