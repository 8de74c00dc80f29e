"""``headwater dev-cluster``: a whole cluster on one machine, from one command.

It starts a standalone ZooKeeper (:mod:`headwater.cluster.local_zookeeper`; its state in
``DATA/zookeeper``, so the next run finds the same cluster) unless ``--zookeeper`` names a
running one, then N brokers as ``headwater serve`` processes (``DATA/broker-<id>``, their
logs in ``DATA/broker-<id>.log``), and keeps them running until Ctrl-C or SIGTERM. The
children run in process groups of their own: a Ctrl-C typed at the terminal reaches this
command only, which stops the brokers first (each removes its registration while
ZooKeeper still runs) and ZooKeeper last.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from headwater.cli.context import err_console, on_ctrl_c
from headwater.cli.parse import parse_pairs
from headwater.cli.serve import load_settings
from headwater.cluster.local_zookeeper import LocalZooKeeper, log_tail
from headwater.cluster.records import DEFAULT_CHROOT
from headwater.errors import ClusterError, InvalidArgumentError, UsageError

__all__ = ["dev_cluster"]

HOST = "127.0.0.1"
DATA_DEFAULT = "./dev-cluster"
LOCK_FILE = "dev-cluster.lock"
BROKER_START_TIMEOUT_S = 60.0  # a broker waits up to its session timeout for a stale registration
STOP_GRACE_S = 20.0  # after SIGTERM, before SIGKILL
WATCH_INTERVAL_S = 0.2
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)  # besides Ctrl-C
# what dev-cluster sets on each broker itself; a --set of one of them would contradict it
OWN_SETTINGS = {"host", "port", "zookeeper", "broker_id"}


@dataclass
class Broker:
    """One ``headwater serve`` child."""

    broker_id: int
    data_dir: Path
    log: Path
    port: int
    http_port: int | None = None  # its HTTP API's (serve --http-port), when it serves one
    proc: subprocess.Popen[bytes] | None = None
    log_start: int = 0  # where this run's lines begin in the (appended) log
    reported: bool = False  # its unexpected exit was said already

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def http_address(self) -> str | None:
        return None if self.http_port is None else f"{HOST}:{self.http_port}"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@dataclass
class Running:
    """What one dev-cluster started, so that everything is stopped whatever happens."""

    zookeeper: LocalZooKeeper | None = None
    brokers: list[Broker] = field(default_factory=list)


def dev_cluster(
    ctx: typer.Context,
    brokers: Annotated[int, typer.Option(help="How many brokers (ids 1..N).", min=1, max=64)] = 3,
    data: Annotated[
        Path | None,
        typer.Option(
            "--data",
            "-d",
            metavar="DIR",
            help="Where the brokers' and ZooKeeper's state lives.",
            show_default=DATA_DEFAULT,
        ),
    ] = None,
    port: Annotated[
        int,
        typer.Option(
            help="The first broker's port; the others take the next ones (0: any free ports).", min=0, max=65535
        ),
    ] = 7071,
    http_port: Annotated[
        int | None,
        typer.Option(
            help="Also serve the HTTP/JSON API (and /metrics) on each broker: broker i on this port + i - 1 "
            "(0: any free ports); docs/http.md.",
            min=0,
            max=65535,
            show_default="none",
        ),
    ] = None,
    zookeeper: Annotated[
        str | None,
        typer.Option(
            metavar="HOST:PORT",
            help="Use this running ZooKeeper (the cluster lives under /headwater) instead of starting one.",
            show_default="start one",
        ),
    ] = None,
    zookeeper_port: Annotated[
        int, typer.Option(help="The port of the ZooKeeper it starts (0: any free port).", min=0, max=65535)
    ] = 2181,
    zookeeper_tick_ms: Annotated[
        int, typer.Option(help="The started ZooKeeper's tickTime (sessions last 2 to 20 ticks).", min=10, hidden=True)
    ] = 2000,
    settings: Annotated[
        list[str] | None,
        typer.Option("--set", metavar="NAME=VALUE", help="A server or store setting for every broker, repeatable."),
    ] = None,
) -> None:
    """Run a whole cluster on this machine: ZooKeeper and N brokers, until Ctrl-C or SIGTERM.

    It prints each broker's address, data directory and log, and the --server list that
    clients use; then a line `ready ADDRESSES` on stdout. With --http-port each broker also
    serves the HTTP API, whose addresses come on the line `http ADDRESSES` just before. A broker that exits while the
    cluster runs is reported and the others keep running. Ctrl-C stops the brokers, then
    ZooKeeper; a second run over the same --data finds the same cluster.

    Examples:

    ```
    headwater dev-cluster
    headwater dev-cluster --brokers 5 --data /tmp/hw-cluster --port 9001
    headwater dev-cluster --port 0 --zookeeper-port 0 --set flush=sync
    headwater dev-cluster --http-port 8081
    headwater dev-cluster --zookeeper 127.0.0.1:2181
    ```
    """
    data = _data_dir(ctx, data)
    if port and port + brokers - 1 > 65535:
        raise InvalidArgumentError(f"--port {port} with --brokers {brokers} runs past port 65535; choose a lower one")
    _check_http_ports(http_port, port, brokers)
    extra = _checked_settings(settings or [])
    # here, not at the top: membership loads the storage, which other commands do not need
    from headwater.cluster.membership import ZooKeeperAddress

    where = str(ZooKeeperAddress.parse(zookeeper)) if zookeeper is not None else None
    data.mkdir(parents=True, exist_ok=True)
    # SIGTERM (or the terminal closing: SIGHUP) while starting stops what started, as Ctrl-C
    # does (the children, in process groups of their own, would otherwise outlive us)
    previous = {signum: signal.signal(signum, signal.default_int_handler) for signum in STOP_SIGNALS}
    lock = _LockFile(data)
    try:
        lock.acquire()
        running = Running()
        try:
            ports = (port, http_port)
            _start(running, data, brokers, ports, where, zookeeper_port, zookeeper_tick_ms, extra, lock)
            _announce(running, data)
            _watch_until_stopped(running)
        finally:
            _stop(running)
    finally:
        lock.close()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    _say("dev-cluster stopped")


def _data_dir(ctx: typer.Context, data: Path | None) -> Path:
    """``--data`` after the command, or the global one before it when given, or
    ``./dev-cluster`` (not the global default: a cluster's state is many directories)."""
    root = ctx.find_root()
    source = root.get_parameter_source("data")
    given = root.params.get("data") if source is not None and source.name == "COMMANDLINE" else None
    if data is not None and given is not None and Path(given) != data:
        raise UsageError(
            f"--data is given twice, {given!r} before the command and {str(data)!r} after it; give it once"
        )
    return data or (Path(given) if given is not None else Path(DATA_DEFAULT))


def _check_http_ports(http_port: int | None, port: int, brokers: int) -> None:
    """--http-port's range fits below 65536 and misses the brokers' own ports, and the
    ``http`` extra the HTTP API needs is installed: all before anything starts."""
    if http_port is None:
        return
    if http_port and http_port + brokers - 1 > 65535:
        raise InvalidArgumentError(
            f"--http-port {http_port} with --brokers {brokers} runs past port 65535; choose a lower one"
        )
    if http_port and port and http_port < port + brokers and port < http_port + brokers:
        raise InvalidArgumentError(
            f"--http-port {http_port} and --port {port} with --brokers {brokers} give port "
            f"{max(port, http_port)} to both a broker and an HTTP API; choose ports at least {brokers} apart "
            f"(or 0: any free ports)"
        )
    from headwater.http import require_extra  # here: the other commands need not load it

    require_extra()


def _checked_settings(pairs: list[str]) -> list[str]:
    """The ``--set`` pairs, as ``serve`` arguments, once they are known to be good: an
    unknown name or a bad value fails here, before anything starts."""
    parsed = parse_pairs(pairs, "--set")
    own = sorted(OWN_SETTINGS & set(parsed))
    if own:
        raise UsageError(
            f"--set {', '.join(own)}: dev-cluster sets it for each broker itself; use --port (or --zookeeper)"
        )
    load_settings(None, {}, parsed)
    args: list[str] = []
    for name, value in parsed.items():
        args += ["--set", f"{name}={value}"]
    return args


class _LockFile:
    """``DATA/dev-cluster.lock``, held (flock) while a run lasts: it names this process and
    the children it started, so that the next run can tell a second dev-cluster (the lock
    is held) from one that was SIGKILLed and left its children running (the lock is free,
    and processes it names still run over DATA)."""

    def __init__(self, data: Path) -> None:
        self.data = data
        self.f = open(data / LOCK_FILE, "a+")  # closed by close(), when the run ends

    def acquire(self) -> None:
        try:
            fcntl.flock(self.f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = self._read().get("pid", "another process")
            self.close()
            raise ClusterError(
                f"{self.data} is in use by another dev-cluster (pid {holder}); stop it (Ctrl-C in its "
                f"terminal, or kill {holder}), or give another --data"
            ) from None
        left = {name: pid for name, pid in self._read().items() if name != "pid" and self._runs_here(pid)}
        if left:
            self.close()
            raise ClusterError(
                f"a dev-cluster over {self.data} was killed and left "
                f"{', '.join(f'{name} (pid {pid})' for name, pid in left.items())} running; "
                f"stop them with 'kill {' '.join(left.values())}', then start again"
            )
        self.record(Running())

    def _read(self) -> dict[str, str]:
        self.f.seek(0)
        lines = (line.rsplit(" ", 1) for line in self.f.read().splitlines())
        return {parts[0]: parts[1] for parts in lines if len(parts) == 2 and parts[1].isdigit()}

    def _runs_here(self, pid: str) -> bool:
        """Whether process ``pid`` runs over this DATA (not a later process given its id)."""
        try:
            return str(self.data.absolute()).encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return False

    def record(self, running: Running) -> None:
        lines = [f"pid {os.getpid()}"]
        if running.zookeeper is not None and running.zookeeper.pid is not None:
            lines.append(f"zookeeper {running.zookeeper.pid}")
        lines += [f"broker-{b.broker_id} {b.proc.pid}" for b in running.brokers if b.proc is not None]
        self.f.seek(0)
        self.f.truncate()
        self.f.write("\n".join(lines) + "\n")
        self.f.flush()

    def close(self) -> None:
        self.f.close()  # and the lock with it


def _start(
    running: Running,
    data: Path,
    count: int,
    ports: tuple[int, int | None],  # the first broker's, and its HTTP API's (None: no HTTP API)
    zookeeper: str | None,  # HOSTS/chroot, or None to start one
    zookeeper_port: int,
    tick_ms: int,
    extra: list[str],
    lock: _LockFile,
) -> None:
    console = err_console()
    port, http_port = ports
    planned = [
        Broker(
            i,
            data / f"broker-{i}",
            data / f"broker-{i}.log",
            port + i - 1 if port else 0,
            None if http_port is None else http_port + i - 1 if http_port else 0,
        )
        for i in range(1, count + 1)
    ]
    for b in planned:
        if b.port:
            _check_broker_port(b, b.port, "--port")
        if b.http_port:
            _check_broker_port(b, b.http_port, "--http-port")
    if zookeeper is None:
        running.zookeeper = LocalZooKeeper(data / "zookeeper", zookeeper_port, HOST, tick_ms=tick_ms)
        on = f"{HOST}:{zookeeper_port}" if zookeeper_port else f"a free port of {HOST}"
        console.print(f"starting ZooKeeper on {on} (state in {data / 'zookeeper'})", markup=False)
        running.zookeeper.start()
        lock.record(running)
        zookeeper = running.zookeeper.hosts + DEFAULT_CHROOT
    console.print(f"starting {count} broker{'s' if count > 1 else ''} in {zookeeper}")
    for b in planned:  # all at once: each start waits on ZooKeeper more than on the machine
        _spawn(b, zookeeper, extra)
        running.brokers.append(b)
    lock.record(running)
    deadline = time.monotonic() + BROKER_START_TIMEOUT_S
    for b in running.brokers:
        _wait_listening(b, deadline)


def _check_broker_port(b: Broker, port: int, flag: str) -> None:
    """Bind one of the broker's ports (``flag`` chooses it) once, so a port in use fails
    before anything starts (the broker binds again: this catches what is wrong now, not a
    race)."""
    try:
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the broker's server does
            probe.bind((HOST, port))
    except OSError as e:
        what = "'s HTTP API" if flag == "--http-port" else ""
        raise InvalidArgumentError(
            f"broker {b.broker_id}{what} cannot listen on {HOST}:{port}: {e.strerror}; choose other ports with "
            f"{flag} (0: any free ports)"
        ) from None


def _spawn(b: Broker, zookeeper: str, extra: list[str]) -> None:
    b.log_start = b.log.stat().st_size if b.log.exists() else 0
    command = [
        sys.executable,
        "-m",
        "headwater",
        "serve",
        "--data",
        str(b.data_dir.absolute()),  # the next run finds the brokers a killed run left by it
        "--host",
        HOST,
        "--port",
        str(b.port),
        "--zookeeper",
        zookeeper,
        "--broker-id",
        str(b.broker_id),
        *([] if b.http_port is None else ["--http-port", str(b.http_port)]),
        *extra,
    ]
    with open(b.log, "ab") as log_f:  # the child keeps its own copy of the descriptor
        b.proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log_f,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            process_group=0,  # Ctrl-C at the terminal is ours: we stop the brokers in order
        )


def _wait_listening(b: Broker, deadline: float) -> None:
    """Wait for the broker's ``listening HOST:PORT`` line (``serve`` prints it once it
    serves), and its ``http listening HOST:PORT`` when it serves the HTTP API; a
    ClusterError with the tail of its log if it exits, its HTTP API fails, or it takes too
    long."""
    assert b.proc is not None
    while True:
        port = http_port = None
        http_failed = False
        for line in log_tail(b.log, size_bytes=1 << 20, start=b.log_start).splitlines():
            if line.startswith("listening "):
                port = int(line.rsplit(":", 1)[1])
            elif line.startswith("http listening "):
                http_port = int(line.rsplit(":", 1)[1])
            elif "the HTTP API stopped:" in line:  # headwater.http.server logs it when it fails
                http_failed = True
        if port is not None and (b.http_port is None or http_port is not None):
            b.port = port
            b.http_port = http_port
            return
        code = b.proc.poll()
        if code is not None or http_failed or time.monotonic() > deadline:
            if code is not None:
                why = f"exited at start ({_exit_text(code)})"
            else:
                why = "could not start its HTTP API" if http_failed else "did not start in time"
            raise ClusterError(
                f"broker {b.broker_id} {why}; everything started was stopped. Its log ({b.log}) ends:\n"
                f"{log_tail(b.log, start=b.log_start)}"
            )
        time.sleep(0.05)


def _exit_text(code: int | None) -> str:
    if code is None:
        return "running"
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit status {code}"


def _announce(running: Running, data: Path) -> None:
    """The brokers (a table on a terminal, a line each otherwise), how clients reach them,
    and the ``ready`` line on stdout that scripts wait for."""
    console = err_console()
    http = [b.http_address for b in running.brokers if b.http_address is not None]
    if console.is_terminal:
        table = Table(title=escape(f"dev-cluster in {data}"), title_justify="left")
        widest = max(len(a) for b in running.brokers for a in (b.address, b.http_address or ""))
        table.add_column("broker")
        for column in ("address", *(["http"] if http else [])):  # whole, whatever the terminal's width
            table.add_column(column, no_wrap=True, min_width=widest)
        for column in ("data", "log"):
            table.add_column(column, overflow="fold")
        for b in running.brokers:
            cells = [str(b.broker_id), b.address, *([b.http_address or "-"] if http else [])]
            table.add_row(*cells, escape(str(b.data_dir)), escape(str(b.log)))
        console.print(table)
    else:
        for b in running.brokers:
            on_http = f" http {b.http_address}" if b.http_address else ""
            console.print(f"broker {b.broker_id} {b.address}{on_http} data {b.data_dir} log {b.log}", markup=False)
    zk = running.zookeeper
    if zk is not None:
        console.print(f"ZooKeeper {zk.hosts} (pid {zk.pid}, log {zk.log})", markup=False)
    addresses = ",".join(b.address for b in running.brokers)
    console.print(f"clients: --server {addresses}")
    if http:
        console.print(f"HTTP API (docs/http.md; Prometheus scrapes /metrics on each): {' '.join(http)}")
    console.print("Ctrl-C stops the cluster")
    if http:
        print(f"http {','.join(http)}", flush=True)
    print(f"ready {addresses}", flush=True)


def _watch_until_stopped(running: Running) -> None:
    """Wait for Ctrl-C or SIGTERM, saying so when a broker exits meanwhile."""
    stop = threading.Event()
    previous = {signum: signal.signal(signum, lambda *_: stop.set()) for signum in STOP_SIGNALS}
    try:
        with on_ctrl_c(lambda *_: stop.set()):
            while not stop.wait(WATCH_INTERVAL_S):
                _check_children(running)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _check_children(running: Running) -> None:
    for b in running.brokers:
        if not b.reported and not b.alive():
            b.reported = True
            _report_exit(b)
    zk = running.zookeeper
    if zk is not None and zk.pid is None:
        console = err_console()
        console.print(
            f"ZooKeeper {escape(zk.hosts)} exited; the brokers keep trying to reach it. Its log "
            f"({escape(str(zk.log))}) ends:\n{escape(log_tail(zk.log))}"
        )  # one print: a reader of the output sees the report whole
        running.zookeeper = None  # said once


def _report_exit(b: Broker) -> None:
    code = b.proc.poll() if b.proc is not None else None
    console = err_console()
    console.print(
        f"[red]broker {b.broker_id} ({b.address}) exited ({_exit_text(code)})[/]; the others keep running. "
        f"Its log ({escape(str(b.log))}) ends:\n{escape(log_tail(b.log, start=b.log_start))}"
    )  # one print: a reader of the output sees the report whole


def _stop(running: Running) -> None:
    """SIGTERM every broker, wait (SIGKILL after a grace), then stop ZooKeeper. Ctrl-C,
    SIGTERM and SIGHUP are ignored meanwhile: the stop is bounded by the grace."""
    previous = {signum: signal.signal(signum, signal.SIG_IGN) for signum in STOP_SIGNALS}
    try:
        with on_ctrl_c(lambda *_: None):
            _stop_brokers([b for b in running.brokers if b.alive()])
            if running.zookeeper is not None:
                _say("stopping ZooKeeper")
                running.zookeeper.stop()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _say(text: str) -> None:
    """A line on stderr while stopping, which goes on if nobody can read it any more (the
    terminal was closed: SIGHUP)."""
    with contextlib.suppress(OSError):
        err_console().print(text, markup=False)


def _stop_brokers(live: list[Broker]) -> None:
    if live:
        _say(f"stopping {len(live)} broker{'s' if len(live) > 1 else ''}")
    for b in live:
        assert b.proc is not None
        os.kill(b.proc.pid, signal.SIGCONT)  # a paused broker could not act on the SIGTERM
        b.proc.terminate()
    deadline = time.monotonic() + STOP_GRACE_S
    for b in live:
        assert b.proc is not None
        try:
            b.proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _say(f"broker {b.broker_id} did not stop within {STOP_GRACE_S:g} s: killing it")
            b.proc.kill()
            b.proc.wait()
