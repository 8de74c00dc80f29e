"""A standalone ZooKeeper server on this machine, run from Debian's ``zookeeper`` package.

``headwater dev-cluster`` and the tests start one: a single server (no ensemble, no quorum)
listening on one address of this machine, its state in a directory of ours, so that a
second start over the same directory finds the same tree (the same cluster). It is for
trials and tests: a production cluster runs its own ensemble and gives its address with
``--zookeeper``.

The server is Java: ``java -cp /etc/zookeeper/conf:/usr/share/java/zookeeper.jar
org.apache.zookeeper.server.ZooKeeperServerMain zoo.cfg``, the package's log4j settings on
the class path, its output in ``zookeeper.log`` of the state directory. It runs in a process
group of its own, so a Ctrl-C typed at the terminal reaches whoever started it, who stops it
last (after the brokers that use it).
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from headwater.errors import ClusterError

__all__ = ["LocalZooKeeper", "ZOOKEEPER_CONF", "ZOOKEEPER_JAR", "free_port", "installed", "log_tail"]

ZOOKEEPER_JAR = Path("/usr/share/java/zookeeper.jar")
ZOOKEEPER_CONF = Path("/etc/zookeeper/conf")  # the package's log4j settings
# slf4j's binding to log4j, when installed: without it ZooKeeper logs nothing, and a server
# that fails to start could not say why
LOGGING_JARS = (Path("/usr/share/java/slf4j-log4j12.jar"), Path("/usr/share/java/log4j-1.2.jar"))
LOG_TAIL_BYTES = 3000  # of zookeeper.log, shown when the server does not start
_INSTALL = "install it with 'apt install zookeeper', or give --zookeeper HOST:PORT to use a running ensemble"


def installed() -> bool:
    """Whether Debian's ``zookeeper`` package (its jar) and a ``java`` are on this machine."""
    return ZOOKEEPER_JAR.exists() and shutil.which("java") is not None


def log_tail(path: Path, size_bytes: int = LOG_TAIL_BYTES, start: int = 0) -> str:
    """The last ``size_bytes`` of a log file written after offset ``start``, from a line's
    start ('' when there is none)."""
    try:
        with open(path, "rb") as f:
            begin = max(start, f.seek(0, os.SEEK_END) - size_bytes)
            f.seek(begin)
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    return text.split("\n", 1)[1] if begin > start and "\n" in text else text


def free_port(host: str) -> int:
    """A port of ``host`` that nothing listens on now (the server binds it a moment later)."""
    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


class LocalZooKeeper:
    """A standalone ZooKeeper on ``host:port`` (``port`` 0: a free one, chosen when
    started), its state and log in ``data_dir``. ``tick_ms`` is ZooKeeper's tickTime:
    sessions may be as short as 2 ticks and as long as 20. For example::

        zk = LocalZooKeeper(Path("dev-cluster/zookeeper"), port=0).start()
        zk.hosts  # '127.0.0.1:40417'
        zk.stop()
    """

    def __init__(
        self, data_dir: Path, port: int = 0, host: str = "127.0.0.1", *, tick_ms: int = 2000, heap_mb: int = 256
    ) -> None:
        self.data_dir = Path(data_dir)
        self.host = host
        self.port = port
        self.tick_ms = tick_ms
        self.heap_mb = heap_mb
        self.log = self.data_dir / "zookeeper.log"
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def hosts(self) -> str:
        """``HOST:PORT``, as ``--zookeeper`` and kazoo take it."""
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs (None before start and after it exits)."""
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def start(self, timeout_s: float = 30.0) -> LocalZooKeeper:
        """Start the server and wait until it answers ``ruok``; a :class:`ClusterError`
        saying what to do if it cannot (no java, no package, the port taken, the server
        exited: the tail of its log)."""
        java = shutil.which("java")
        if not ZOOKEEPER_JAR.exists():
            raise ClusterError(f"ZooKeeper is not installed (no {ZOOKEEPER_JAR}): {_INSTALL}")
        if java is None:
            raise ClusterError(f"ZooKeeper needs Java, and there is no 'java' on PATH: {_INSTALL}")
        if self.port == 0:
            self.port = free_port(self.host)
        else:
            self._check_port_free()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log_start = self.log.stat().st_size if self.log.exists() else 0
        with open(self.log, "ab") as log_f:  # the child keeps its own copy of the descriptor
            self._proc = subprocess.Popen(
                self._command(java),
                stdin=subprocess.DEVNULL,
                stdout=log_f,
                stderr=subprocess.STDOUT,
                process_group=0,  # a terminal's Ctrl-C is for whoever started it: it stops us last
            )
        try:
            self._wait_answering(timeout_s, log_start)
        except BaseException:
            self.stop()
            raise
        return self

    def _command(self, java: str) -> list[str]:
        cfg = self.data_dir.absolute() / "zoo.cfg"  # its command line names the whole path
        cfg.write_text(
            f"tickTime={self.tick_ms}\n"
            f"dataDir={self.data_dir.resolve() / 'state'}\n"
            f"clientPort={self.port}\n"
            f"clientPortAddress={self.host}\n"
            "admin.enableServer=false\n"  # its HTTP server would take port 8080 too
            "4lw.commands.whitelist=ruok,srvr\n"
            "maxClientCnxns=0\n"
        )
        return [
            java,
            f"-Xmx{self.heap_mb}m",
            "-XX:+UseSerialGC",
            "-Dzookeeper.root.logger=INFO,CONSOLE",
            f"-Dzookeeper.log.dir={self.data_dir.resolve()}",
            "-cp",
            ":".join(str(p) for p in (ZOOKEEPER_CONF, ZOOKEEPER_JAR, *LOGGING_JARS) if p.exists()),
            "org.apache.zookeeper.server.ZooKeeperServerMain",
            str(cfg),
        ]

    def _check_port_free(self) -> None:
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((self.host, self.port))
            except OSError as e:
                why = "is in use (another ZooKeeper, or another program)" if e.errno == errno.EADDRINUSE else str(e)
                raise ClusterError(
                    f"ZooKeeper cannot listen on {self.hosts}: the address {why}; choose another port "
                    f"(--zookeeper-port, 0 for any free one), or use a ZooKeeper already running there "
                    f"with --zookeeper {self.hosts}"
                ) from None

    def _wait_answering(self, timeout_s: float, log_start: int) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + timeout_s
        while not self.answers():
            code = self._proc.poll()
            if code is not None:
                raise ClusterError(
                    f"ZooKeeper exited at start (exit status {code}); its log ({self.log}) ends:\n"
                    f"{log_tail(self.log, start=log_start)}"
                )
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"ZooKeeper did not answer on {self.hosts} within {timeout_s:g} s; its log ({self.log}) "
                    f"ends:\n{log_tail(self.log, start=log_start)}"
                )
            time.sleep(0.1)

    def answers(self) -> bool:
        """Whether the server answers ``ruok`` with ``imok`` now."""
        try:
            with socket.create_connection((self.host, self.port), timeout=1) as s:
                s.sendall(b"ruok")
                return s.recv(16) == b"imok"
        except OSError:
            return False

    def pause(self) -> None:
        """SIGSTOP: the server neither answers nor expires anyone until :meth:`resume`."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT after :meth:`pause`."""
        self._signal(signal.SIGCONT)

    def _signal(self, signum: signal.Signals) -> None:
        if self._proc is None or self._proc.poll() is not None:
            raise ClusterError(f"ZooKeeper on {self.hosts} is not running")
        os.kill(self._proc.pid, signum)

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM, then SIGKILL if the server has not exited within ``grace_s``. Its state
        stays in ``data_dir`` for the next start."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        os.kill(proc.pid, signal.SIGCONT)  # a paused server could not act on the SIGTERM
        proc.terminate()
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
