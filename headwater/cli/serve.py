"""``headwater serve``: run a broker over a data directory.

Settings come from, in rising priority: defaults, a TOML file (``--config``), environment
variables ``HEADWATER_<SETTING>`` (e.g. ``HEADWATER_PORT=7171``, ``HEADWATER_FLUSH=sync``),
and flags. The TOML file has a ``[server]`` table (ServerConfig) and a ``[store]`` table
(StoreConfig); any of their settings may also be given as ``--set name=value``.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import os
import re
import shutil
import socket
import sys
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NamedTuple

import msgspec
import typer
from rich.markup import escape
from rich.table import Table

from headwater.cli.context import LocalData, err_console, local_data_state, out_console
from headwater.cli.parse import parse_pairs
from headwater.cli.settings import settings_rows
from headwater.errors import InvalidArgumentError

if TYPE_CHECKING:  # the broker is imported when a broker starts: every other command starts faster
    from headwater import StoreConfig  # lazy (headwater.__getattr__): the storage loads here
    from headwater.broker.server import ServerConfig

__all__ = ["serve", "load_settings"]

log = logging.getLogger("headwater.server")

# settings that once did something and are now accepted, with a warning, and ignored, so
# that config files and environments written for an older broker still start it
RETIRED = {
    "read_bytes": "the event loop reads each connection (up to 256 KiB at a time); remove it",
}


def _retired(name: str, where: str) -> bool:
    why = RETIRED.get(name)
    if why is not None:
        log.warning("%s: the setting %s is no longer used (%s)", where, name, why)
    return why is not None


# HEADWATER_* variables the CLI itself reads (not broker settings)
CLI_VARIABLES = frozenset(
    {"HEADWATER_DATA", "HEADWATER_SERVER", "HEADWATER_CONNECT_TIMEOUT_S", "HEADWATER_HISTORY"}
    | {"HEADWATER_PROFILE", "HEADWATER_CONFIG"}
)


_BOOLS = {"true": True, "1": True, "yes": True, "on": True, "false": False, "0": False, "no": False, "off": False}


def _coerce(cls: type[msgspec.Struct], name: str, raw: Any, where: str) -> Any:
    typ = cls.__annotations__[name]
    if isinstance(raw, str) and typ in ("bool", bool):
        try:
            return _BOOLS[raw.strip().lower()]
        except KeyError:
            raise InvalidArgumentError(f"{where}: {name} must be true or false, got {raw!r}") from None
    if isinstance(raw, str) and typ in ("int", "float", int, float):
        whole = typ in ("int", int)
        try:
            return int(raw) if whole else float(raw)
        except ValueError:
            kind = "a whole number" if whole else "a number"
            raise InvalidArgumentError(f"{where}: {name} must be {kind}, got {raw!r}") from None
    return raw


def _settings_from_flags(options: dict[str, Any], pairs: dict[str, Any]) -> dict[str, Any]:
    """``--host``/``--port``/``--flush`` and ``--set`` pairs as one dict; the same setting
    given both ways with different values is an error (neither silently wins)."""
    merged = {k: v for k, v in options.items() if v is not None}
    for k, v in pairs.items():
        if k in merged and str(merged[k]) != str(v):
            raise InvalidArgumentError(f"--{k} {merged[k]} and --set {k}={v} disagree: give one of them")
        merged[k] = v
    return merged


def load_settings(
    config_file: Path | None, env: dict[str, str], overrides: dict[str, Any]
) -> tuple[ServerConfig, StoreConfig]:
    """Merge defaults, the TOML file, HEADWATER_* variables and flags, in that order."""
    from headwater import StoreConfig  # lazy (headwater.__getattr__): the storage loads here
    from headwater.broker.server import ServerConfig

    values: dict[type, dict[str, Any]] = {ServerConfig: {}, StoreConfig: {}}
    origin: dict[str, str] = {}  # where each setting's value came from, for errors
    if config_file is not None:
        try:
            doc = tomllib.loads(config_file.read_text())
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise InvalidArgumentError(f"cannot read the config file {config_file}: {e}") from None
        for table, cls in (("server", ServerConfig), ("store", StoreConfig)):
            for k, v in doc.get(table, {}).items():
                if table == "server" and _retired(k, str(config_file)):
                    continue
                if k not in cls.__struct_fields__:
                    raise InvalidArgumentError(
                        f"{config_file}: unknown setting [{table}] {k}; known: {', '.join(cls.__struct_fields__)}"
                    )
                values[cls][k] = v
                origin[k] = f"{config_file} [{table}]"
        unknown = set(doc) - {"server", "store"}
        if unknown:
            raise InvalidArgumentError(f"{config_file}: unknown table(s) {sorted(unknown)}; use [server] and [store]")
    for source, items in (
        ("environment", {k[10:].lower(): v for k, v in env.items() if k.startswith("HEADWATER_")}),
        ("flags", overrides),
    ):
        for k, v in items.items():
            if v is None or _retired(k, source):
                continue
            where = f"HEADWATER_{k.upper()}" if source == "environment" else source
            for cls in (ServerConfig, StoreConfig):
                if k in cls.__struct_fields__:
                    values[cls][k] = _coerce(cls, k, v, where)
                    origin[k] = where
                    break
            else:
                if source == "flags":
                    raise InvalidArgumentError(
                        f"unknown setting {k!r}; known: "
                        f"{', '.join(ServerConfig.__struct_fields__ + StoreConfig.__struct_fields__)}"
                    )
                if where not in CLI_VARIABLES:  # a misspelt variable would otherwise change nothing, silently
                    log.warning(
                        "environment: %s is not a setting, and is ignored (headwater serve --settings lists them)",
                        where,
                    )
    try:
        server = msgspec.convert(values[ServerConfig], ServerConfig).validated()
        store = msgspec.convert(values[StoreConfig], StoreConfig).validated()
    except (msgspec.ValidationError, InvalidArgumentError) as e:
        name = _setting_named(str(e))
        where = origin.get(name, "default") if name else None
        raise InvalidArgumentError(f"bad setting ({where}): {e}" if where else f"bad setting: {e}") from None
    return server, store


def _setting_named(message: str) -> str | None:
    """The setting an error message is about: msgspec's ``at `$.name` `` or ours, which
    begin with the name."""
    found = re.search(r"at `\$\.(\w+)`", message) or re.match(r"(\w+) must ", message)
    return found.group(1) if found else None


def serve(
    ctx: typer.Context,
    data: LocalData = None,
    host: Annotated[str | None, typer.Option(help="Address to listen on.", show_default="127.0.0.1")] = None,
    port: Annotated[
        int | None, typer.Option(help="Port to listen on (0: any free port).", show_default="7070", min=0, max=65535)
    ] = None,
    flush: Annotated[
        str | None, typer.Option(help="Default flush policy: sync or async.", show_default="async")
    ] = None,
    zookeeper: Annotated[
        str | None,
        typer.Option(
            help="Join a cluster: ZooKeeper's HOST:PORT[,HOST:PORT...][/chroot] (chroot /headwater when none).",
            show_default="none: run alone",
        ),
    ] = None,
    broker_id: Annotated[
        int | None, typer.Option(help="This broker's id in the cluster (with --zookeeper), unique, 0 or more.")
    ] = None,
    config: Annotated[
        Path | None, typer.Option("--config", help="A TOML file with [server] and [store] tables.")
    ] = None,
    settings: Annotated[
        list[str] | None,
        typer.Option("--set", metavar="NAME=VALUE", help="Any server or store setting, repeatable."),
    ] = None,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
    http_port: Annotated[
        int | None,
        typer.Option(
            help="Also serve the HTTP/JSON API on this port (0: any free port); docs/http.md.", min=0, max=65535
        ),
    ] = None,
    http_host: Annotated[
        str | None, typer.Option(help="Address the HTTP API listens on.", show_default="--host")
    ] = None,
    http_allowed_hosts: Annotated[
        list[str] | None,
        typer.Option(
            "--http-allowed-host",
            metavar="NAME",
            help="A Host name the HTTP API answers to besides localhost, IP addresses and --http-host "
            "(repeatable; .example.org: the domain and its subdomains; *: any); docs/http.md.",
        ),
    ] = None,
    log_format: Annotated[
        str,
        typer.Option(
            help="text, or json: one JSON object per line (ts, level, logger, message and extra fields; "
            "docs/metrics.md)."
        ),
    ] = "text",
    list_settings: Annotated[
        bool, typer.Option("--settings", help="List every setting (meaning, default, environment variable) and exit.")
    ] = False,
) -> None:
    """Run a broker over the data directory (--data) until SIGTERM or Ctrl-C. A directory
    that does not exist is made (and removed again if the broker cannot start).

    On SIGTERM it stops accepting connections, finishes requests in flight, flushes and
    closes; a restart over the same directory continues where it stopped.

    Examples:

    ```
    headwater serve --data /var/lib/headwater --host 127.0.0.1 --port 7070
    headwater --data ./data serve --flush sync --set flush_interval_ms=50
    HEADWATER_PORT=7171 headwater --data ./data serve --config headwater.toml
    headwater --data ./b1 serve --port 7071 --zookeeper 127.0.0.1:2181/headwater --broker-id 1
    headwater --data ./data serve --http-port 8080
    headwater serve --log-format json --set metrics=false
    headwater serve --settings
    ```
    """
    if list_settings:
        _print_settings()
        return
    state = local_data_state(ctx, data)
    from headwater.broker.logs import LOG_FORMATS, configure_logging  # the broker's modules only when one runs

    if log_format not in LOG_FORMATS:
        raise InvalidArgumentError(f"--log-format {log_format!r}: use one of {', '.join(LOG_FORMATS)}")
    configure_logging(log_level, log_format, sys.stderr)
    overrides = _settings_from_flags(
        {"host": host, "port": port, "flush": flush, "zookeeper": zookeeper, "broker_id": broker_id},
        parse_pairs(settings or [], "--set"),
    )
    server_cfg, store_cfg = load_settings(config, dict(os.environ), overrides)

    started = False
    http = (
        _http_server(http_host or server_cfg.host, http_port, tuple(http_allowed_hosts or ()), log_format)
        if http_port is not None
        else None
    )

    def ready(bound: int) -> None:
        nonlocal started
        started = True
        connect = connect_address(server_cfg.host, server_cfg.advertised_host, bound)
        if log_format == "json":  # every line of stderr is a JSON object
            log.info("ready", extra={"data_dir": str(state.data_dir), "address": connect})
            if not _is_loopback(server_cfg.host or "0.0.0.0"):
                log.warning("listening beyond loopback without authentication", extra={"host": server_cfg.host})
        else:
            err_console().print(f"headwater serving {state.data_dir} on {server_cfg.host}:{bound}")
            _say_how_to_connect(server_cfg.host, server_cfg.advertised_host, bound)
        print(f"listening {server_cfg.host}:{bound}", flush=True)
        if http is not None:
            http(server_cfg.host, bound)

    new_directory = not state.data_dir.exists()
    # which listener a failed bind is about: its address, and the flags that choose it
    broker_listener = listener = _Listener(server_cfg.host, server_cfg.port, "--port", "--host")
    try:
        _check_listen(server_cfg.host, server_cfg.port)  # before the data directory is opened
        if http_port is not None:
            listener = _Listener(http_host or server_cfg.host, http_port, "--http-port", "--http-host", "the HTTP API ")
            _check_listen(listener.host, listener.port)
            listener = broker_listener  # run_server binds the broker's port again
        from headwater.broker.run import run_server

        run_server(state.data_dir, store_cfg, server_cfg, on_ready=ready)
    except OSError as e:
        if isinstance(e, socket.gaierror):
            why = (
                f"the host {listener.host!r} is not an address of this machine nor a name it can resolve ({e.strerror})"
            )
        else:
            why = _BIND_ERRORS.get(e.errno)
            if why is None:
                raise
        raise InvalidArgumentError(
            f"{listener.what}cannot listen on {listener.host}:{listener.port}: {why}; choose another with "
            f"{listener.port_flag} or {listener.host_flag}"
        ) from None
    finally:
        if new_directory and not started:
            # serve makes a missing data directory, as queue create does; one that never
            # served (it could not listen) is removed again, so a failed start leaves nothing
            shutil.rmtree(state.data_dir, ignore_errors=True)


def _http_server(host: str, port: int, allowed_hosts: tuple[str, ...], log_format: str) -> Any:
    """A function that starts the HTTP API (headwater.http) once the broker listens, in a
    thread of its own, as a client of the broker's address; checked now that the ``http``
    extra is installed, so that a missing one stops the start with the pip command to run.
    Once it listens it says so, and warns as the broker does when that is beyond loopback:
    the API has no authentication either."""
    from headwater.http import require_extra

    require_extra()
    from headwater.http.app import GatewaySettings
    from headwater.http.server import HttpServer

    def listening(bound: int) -> None:
        if not _is_loopback(host or "0.0.0.0"):
            if log_format == "json":
                log.warning(
                    "HTTP API listening beyond loopback without authentication", extra={"host": host, "port": bound}
                )
            else:
                err_console().print(
                    f"[yellow]warning:[/] the HTTP API listens on {host or '0.0.0.0'}, beyond loopback, without "
                    f"authentication: anyone who can reach port {bound} can read, write and delete every queue; "
                    f"listen on 127.0.0.1 (--http-host) or keep the port behind a firewall",
                    markup=True,
                )
        print(f"http listening {host}:{bound}", flush=True)

    def start(broker_host: str, broker_port: int) -> None:
        target = "127.0.0.1" if broker_host in ("0.0.0.0", "::", "") else broker_host  # a wildcard is not dialable
        target = f"[{target}]" if ":" in target else target
        server = HttpServer(
            f"{target}:{broker_port}",
            host=host,
            port=port,
            settings=GatewaySettings(allowed_hosts=allowed_hosts),
            on_ready=listening,
        )
        server.start()

    return start


def connect_address(host: str, advertised_host: str, port: int) -> str:
    """The address ``--server`` takes for a broker listening on ``host``: a wildcard
    (``0.0.0.0``, ``::``, empty) is no address to connect to, so the advertised host, else
    loopback; an IPv6 address in brackets.

    >>> connect_address("0.0.0.0", "", 7070), connect_address("::1", "", 7070)
    ('127.0.0.1:7070', '[::1]:7070')
    """
    if host in ("", "0.0.0.0", "::"):
        host = advertised_host or "127.0.0.1"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _is_loopback(host: str) -> bool:
    try:
        return all(ipaddress.ip_address(info[4][0]).is_loopback for info in socket.getaddrinfo(host, None))
    except (OSError, ValueError):
        return False


def _say_how_to_connect(host: str, advertised_host: str, port: int) -> None:
    """On stderr: the --server address to use, and a warning when the broker listens beyond
    loopback, since it has no authentication: whoever reaches the port can read, write and
    delete every queue."""
    console = err_console()
    address = connect_address(host, advertised_host, port)
    console.print(f"connect with: headwater --server {address} ...", style="dim")
    if not _is_loopback(host or "0.0.0.0"):
        console.print(
            f"[yellow]warning:[/] listening on {host or '0.0.0.0'}, beyond loopback, without authentication: "
            f"anyone who can reach port {port} can read, write and delete every queue; listen on "
            f"127.0.0.1 (--host) or keep the port behind a firewall",
            markup=True,
        )


def _check_listen(host: str, port: int) -> None:
    """Resolve ``host`` and bind ``port`` once, as the server will (an OSError if it cannot),
    so that a port in use or an unknown host is reported before anything is opened or made.
    The server binds again: this only catches what is wrong now, not a race."""
    for family, kind, proto, _, address in socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    ):
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as asyncio's server does
            probe.bind(address)


class _Listener(NamedTuple):
    """An address ``serve`` listens on, and the flags that choose it, for its errors."""

    host: str
    port: int
    port_flag: str
    host_flag: str
    what: str = ""  # what listens there, when not the broker itself: "the HTTP API "


_BIND_ERRORS = {  # errors only binding the listening socket gives
    errno.EADDRINUSE: "the address is in use (another broker, or another program)",
    errno.EADDRNOTAVAIL: "that address is not one of this machine's",
}


def _print_settings() -> None:
    table = Table(
        title=escape("headwater serve settings: --set NAME=VALUE, HEADWATER_NAME, or [server] / [store] in --config"),
        title_justify="left",
    )
    for column in ("table", "setting", "default", "environment", "meaning"):
        table.add_column(column, justify="right" if column == "default" else "left")
    for row in settings_rows():
        table.add_row(escape(f"[{row.table}]"), row.name, row.default, row.variable, escape(row.meaning))
    out_console().print(table)
