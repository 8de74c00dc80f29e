"""What every driver shares: modes, servers under /tmp, installs, and the timed loops.

A driver (one module per system) knows how to start its server and how its usual Python client
sends a batch, sends one message and receives messages. Everything that is timed lives here,
once, so every system is measured by the same loop:

- **produce**: P spawned processes, each with its own connection and its own stream
  (partition i, Redis stream i, JetStream subject i, RabbitMQ queue i). Each sends one
  untimed batch, meets the others at a barrier, then sends batches for a fixed time (or until
  ``n`` messages); a send returns when the whole batch is acknowledged. Throughput is all
  messages over (last end - first start), both read from ``time.monotonic_ns`` (CLOCK_MONOTONIC,
  one clock for every process on Linux).
- **consume**: one spawned process fills stream 0 (untimed, batches of 500), then a fresh
  connection reads all of it back, timed from the first poll to the last message.
- **latency**: a consumer process subscribes, then a producer process sends one message at a
  time on a fixed schedule (open loop, ``rate`` per second) through the client's asynchronous
  path: a send does not wait for the previous message's ack (acks are awaited in the
  background, at most ``INFLIGHT_MAX`` outstanding, and all of them at the end). Each body
  starts with the *scheduled* send time, so a producer that falls behind shows as latency
  rather than hiding it (no coordinated omission); after it, the time the send call began,
  which splits each latency into the producer's lateness (the host did not run it on time)
  and the transit from the send call to the consumer. The consumer stamps each message when
  its client hands it over; the first ``LATENCY_WARMUP`` messages are not counted. Over the
  counted messages the run also reports the CPU each side used per message: the server's
  process group (from /proc, between the first and the last counted send), the consumer
  process and the producer process (``getrusage``, all threads), and how much of the
  producer's was this loop's own spinning before each send.

Servers run in their own session (process group) and are stopped by that group's id on
``teardown``, at exit (``atexit``) and on SIGTERM; they bind 127.0.0.1 only and keep data
under a temporary directory in /tmp that is removed afterwards.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import concurrent.futures
import contextlib
import multiprocessing as mp
import os
import random
import resource
import shutil
import signal
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from bench import machine

__all__ = [
    "Mode",
    "Driver",
    "Unavailable",
    "ServerProcess",
    "free_port",
    "wait_until",
    "ensure_debian_packages",
    "package_version",
    "dist_version",
    "port_open",
    "STAMP",
    "SENT",
    "BlockingSender",
    "FutureSender",
    "PipelinedSender",
    "LoopThread",
    "close_loop",
]

HOST = "127.0.0.1"
STAMP = struct.Struct("<qq")  # (scheduled send time ns, sequence) at the head of a latency body
SENT = struct.Struct("<q")  # then, in a latency run's body, when the send call began (ns)
POOL_BATCHES = 4  # distinct lists of random bodies the produce loop rotates through
BARRIER_TIMEOUT_S = 120.0  # producers that cannot connect within this fail the run
JOIN_SLACK_S = 60.0  # beyond the planned time before a worker is declared hung and killed
LATENCY_WARMUP = 200  # first messages of a latency run, not counted (connections warming up)
SPIN_NS = machine.SPIN_NS  # the latency producer sleeps until this close to a send time, then spins
INFLIGHT_MAX = 5000  # sends awaiting their ack in the latency producer


class Unavailable(RuntimeError):
    """The system cannot be set up here; the tables show the reason instead of figures."""


@dataclass(frozen=True)
class Mode:
    """One way of running a system (its durability setting): a row of the tables."""

    label: str  # "redis everysec"
    key: str  # "everysec"
    fsync_before_ack: bool  # does an acknowledged message survive power loss?
    ack_means: str  # what an acknowledgement guarantees, in one line
    reference: bool = False  # a yardstick of the machine (bench.peers.floor), never anyone's peer


class SendBatch(Protocol):
    def __call__(self, bodies: Sequence[bytes]) -> None: ...


class Sender(Protocol):
    def send(self, body: bytes) -> None:
        """Hand one message to the client to send now; do not wait for its ack."""

    def wait_acked(self, timeout_s: float) -> None:
        """Wait until every message sent is acknowledged; raise if one failed."""


class Poll(Protocol):
    def __call__(self, timeout_s: float) -> list[bytes]: ...


# --------------------------------------------------------------------------- servers


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def wait_until(
    ready: Callable[[], bool],
    *,
    timeout_s: float,
    what: str,
    alive: Callable[[], bool] = lambda: True,
    every_s: float = 0.1,
) -> None:
    """Call ``ready`` until it returns true; raise Unavailable after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    last: BaseException | None = None
    while time.monotonic() < deadline:
        if not alive():
            raise Unavailable(f"{what}: the server exited while starting")
        try:
            if ready():
                return
        except Exception as e:  # noqa: BLE001 - not ready yet, whatever the client says
            last = e
        time.sleep(every_s)
    raise Unavailable(f"{what}: not ready after {timeout_s:.0f} s" + (f" ({last!r})" if last else ""))


def port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        return s.connect_ex((HOST, port)) == 0


_LIVE: dict[int, ServerProcess] = {}


def _stop_all_servers() -> None:
    for server in list(_LIVE.values()):
        server.stop()


def _on_sigterm(signum, frame) -> None:  # noqa: ARG001 - signal handler signature
    raise SystemExit(128 + signum)  # unwinds through every finally, which stops the servers


atexit.register(_stop_all_servers)


def install_signal_handlers() -> None:
    """Make SIGTERM unwind like Ctrl-C so servers are stopped (main process only)."""
    signal.signal(signal.SIGTERM, _on_sigterm)


class ServerProcess:
    """A server in its own session, stopped by its process group id (SIGTERM, then SIGKILL)."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        log_path: Path,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        stop_timeout_s: float = 15.0,
    ) -> None:
        self.name = name
        self.log_path = log_path
        self.stop_timeout_s = stop_timeout_s
        full_env = dict(os.environ)
        full_env.update(env or {})
        self._log = open(log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            list(argv),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=full_env,
            cwd=cwd,
            start_new_session=True,
        )
        self.pgid = self.proc.pid  # session leader: its pid is the group id
        _LIVE[self.pgid] = self

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        if _LIVE.pop(self.pgid, None) is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pgid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=self.stop_timeout_s)
        except subprocess.TimeoutExpired:
            pass
        # Children in the group (Erlang's helpers, say) may outlive the leader.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pgid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        self._log.close()


_APT_UPDATED = False


def ensure_debian_packages(binaries: dict[str, str], log: Callable[[str], None] = print) -> None:
    """Install the Debian packages whose binaries are missing (``{binary: package}``).

    Runs ``apt-get update`` at most once per run. Needs root (as on the project's machines);
    services are not started by the install (Debian's policy-rc.d on these machines denies it,
    and a service started anyway would be on its default port, which the benchmark never uses).
    """
    global _APT_UPDATED
    missing = sorted({pkg for binary, pkg in binaries.items() if not _which(binary)})
    if not missing:
        return
    if os.geteuid() != 0:
        raise Unavailable(f"not installed and not root: apt-get install {' '.join(missing)}")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    if not _APT_UPDATED:
        log("apt-get update")
        subprocess.run(
            ["apt-get", "update", "-q"], check=False, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        _APT_UPDATED = True
    log(f"apt-get install -y {' '.join(missing)}")
    done = subprocess.run(["apt-get", "install", "-y", "-q", *missing], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise Unavailable(
            f"apt-get install {' '.join(missing)} failed: " + (done.stderr.strip().splitlines() or ["?"])[-1]
        )
    still = [b for b in binaries if not _which(b)]
    if still:
        raise Unavailable(f"installed {' '.join(missing)} but {', '.join(still)} not found")


def _which(binary: str) -> str | None:
    return shutil.which(binary) or shutil.which(binary, path="/usr/sbin:/usr/lib/rabbitmq/bin")


def dist_version(name: str) -> str:
    """Installed version of a Python distribution, or "?"."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "?"


def package_version(package: str) -> str:
    done = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", package], capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else "?"


# --------------------------------------------------------------------------- drivers


class Driver:
    """One system. Subclasses start its server and wrap its client; this class times them.

    Lifecycle in the benchmark's process: ``setup()`` (install if missing, start, wait until
    ready), then per mode ``use_mode(mode)``, per workload ``reset(mode, streams)`` and one of
    ``produce`` / ``consume`` / ``latency``, finally ``teardown()``. The driver is pickled into
    the spawned worker processes, so it holds only addresses and settings there (servers are
    left out of the pickle).
    """

    system = ""
    modes: tuple[Mode, ...] = ()
    # True: an asyncio client, driven through ``async_sender`` / ``async_consumer`` (async
    # context managers) on one event loop in each latency process (bench.peers.latency_run)
    async_client = False

    def __init__(self, workdir: Path, log: Callable[[str], None] = print) -> None:
        self.workdir = Path(workdir)
        self.log = log
        self.port = 0
        self._servers: list[ServerProcess] = []

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_servers"] = []
        state["log"] = print
        return state

    # -- lifecycle, in the benchmark's process; subclasses override

    def setup(self) -> None:
        raise NotImplementedError

    def version(self) -> str:
        return "?"

    def use_mode(self, mode: Mode) -> None:
        """Switch the running system to ``mode`` (restart or reconfigure)."""

    def reset(self, mode: Mode, streams: int) -> None:
        """Empty, fresh streams 0..streams-1 for the next workload."""
        raise NotImplementedError

    def teardown(self) -> None:
        for server in reversed(self._servers):
            server.stop()
        self._servers.clear()

    def start_server(self, name: str, argv: Sequence[str], **kw) -> ServerProcess:
        server = ServerProcess(name, argv, log_path=self.workdir / f"{name}.log", **kw)
        self._servers.append(server)
        return server

    # -- client hooks, in worker processes; subclasses override

    def producer(self, mode: Mode, stream: int) -> contextlib.AbstractContextManager[SendBatch]:
        """A function sending a batch to ``stream`` that returns once all of it is acknowledged."""
        raise NotImplementedError

    def consumer(self, mode: Mode, stream: int) -> contextlib.AbstractContextManager[Poll]:
        """A function returning the next bodies of ``stream`` (from its start), [] on timeout."""
        raise NotImplementedError

    @contextlib.contextmanager
    def sender(self, mode: Mode, stream: int) -> Iterator[Sender]:
        """Sends single messages without waiting for each ack (the client's async path).

        The default waits for each ack (a blocking ``producer``); drivers override it.
        """
        with self.producer(mode, stream) as send_batch:
            yield BlockingSender(send_batch)

    def async_sender(self, mode: Mode, stream: int) -> contextlib.AbstractAsyncContextManager[Any]:
        """For an asyncio driver: an object whose ``await send(body)`` sends one message
        without waiting for its ack and ``await wait_acked(timeout_s)`` waits for them all."""
        raise NotImplementedError

    def async_consumer(self, mode: Mode, stream: int) -> contextlib.AbstractAsyncContextManager[Any]:
        """For an asyncio driver: a coroutine function returning the next bodies of
        ``stream``, [] on timeout (``consumer``'s twin)."""
        raise NotImplementedError

    # -- workloads, in the benchmark's process (each spawns its workers)

    def produce(self, mode: Mode, *, producers: int, size: int, batch: int, n: int, seconds: float) -> dict[str, Any]:
        """Throughput of ``producers`` processes sending batches of ``batch`` bodies of ``size`` B."""
        ctx = mp.get_context("spawn")
        barrier = ctx.Barrier(producers)
        results = ctx.Queue()
        procs = [
            ctx.Process(
                target=_produce_worker, daemon=True, args=(self, mode, i, size, batch, n, seconds, barrier, results)
            )
            for i in range(producers)
        ]
        outs = _run_workers(procs, results, timeout_s=BARRIER_TIMEOUT_S + seconds + JOIN_SLACK_S)
        errors = [o["error"] for o in outs if "error" in o]
        if errors:
            return {"error": errors[0]}
        msgs = sum(o["msgs"] for o in outs)
        elapsed_s = (max(o["end_ns"] for o in outs) - min(o["start_ns"] for o in outs)) / 1e9
        return {
            "msgs": msgs,
            "elapsed_s": elapsed_s,
            "msgs_per_s": msgs / elapsed_s,
            "mb_per_s": msgs * size / elapsed_s / 1e6,
            "per_producer_msgs_per_s": [o["msgs"] / ((o["end_ns"] - o["start_ns"]) / 1e9) for o in outs],
        }

    def consume(
        self, mode: Mode, *, size: int, batch: int, n: int, fill_seconds: float, seconds: float
    ) -> dict[str, Any]:
        """Fill stream 0 with up to ``n`` messages (untimed), then time reading them all back."""
        ctx = mp.get_context("spawn")
        results = ctx.Queue()
        proc = ctx.Process(
            target=_consume_worker, daemon=True, args=(self, mode, size, batch, n, fill_seconds, seconds, results)
        )
        outs = _run_workers([proc], results, timeout_s=fill_seconds + seconds + JOIN_SLACK_S + 60)
        out = outs[0]
        if "error" in out:
            return out
        out["msgs_per_s"] = out["msgs"] / out["elapsed_s"] if out["elapsed_s"] else None
        out["mb_per_s"] = None if out["msgs_per_s"] is None else out["msgs_per_s"] * size / 1e6
        return out

    def latency(self, mode: Mode, *, rate: int, seconds: float, size: int, spin_ns: int = SPIN_NS) -> dict[str, Any]:
        """End-to-end latencies (ms) of ``rate`` msgs/s sent one at a time for ``seconds``. The
        producer sleeps until ``spin_ns`` before each send time, then spins; 0: it only sleeps
        (with :func:`bench.machine.exact_sleeps`), burning no CPU but sending later."""
        from bench.peers import latency_run  # it imports this module's constants

        if self.async_client:
            consume, produce = latency_run.latency_consumer_aio, latency_run.latency_producer_aio
        else:
            consume, produce = latency_run.latency_consumer, latency_run.latency_producer
        ctx = mp.get_context("spawn")
        results = ctx.Queue()
        ready = ctx.Event()
        window = (ctx.Event(), ctx.Event())  # the producer's counted sends begin, end
        total = LATENCY_WARMUP + int(rate * seconds)
        consumer = ctx.Process(target=consume, daemon=True, args=(self, mode, total, ready, seconds + 30, results))
        producer = ctx.Process(
            target=produce, daemon=True, args=(self, mode, total, rate, size, ready, window, results, spin_ns)
        )
        marks: list[tuple[float, tuple[int, ...]]] = []  # (servers' CPU s, host CPU ticks) at begin, end
        watcher = threading.Thread(target=self._mark_window, args=(window, marks, seconds + 90), daemon=True)
        watcher.start()
        outs = _run_workers([consumer, producer], results, timeout_s=seconds + 90 + JOIN_SLACK_S)
        for ev in window:  # a failed run: let the watcher go
            ev.set()
        watcher.join(timeout=5)
        errors = [o["error"] for o in outs if "error" in o]
        if errors:
            return {"error": errors[0]}
        recv = next(o for o in outs if o["role"] == "consumer")
        sent = next(o for o in outs if o["role"] == "producer")
        figures = latency_figures(recv["stamps"])
        if figures is None:
            return {"error": f"no message received of {total} sent"}
        counted = total - LATENCY_WARMUP
        whole = len(marks) == 2  # the watcher saw the counted sends begin and end
        cpu = {
            "server": (marks[1][0] - marks[0][0]) * 1e6 / counted if whole else None,
            "consumer": recv["cpu_us_per_msg"],
            "producer": sent["cpu_us_per_msg"],
            "producer_spin": sent["spin_us_per_msg"],
        }
        return {
            "sent": sent["sent"],
            "received": len(recv["stamps"]),
            **figures,
            "achieved_rate": sent["achieved_rate"],
            "late_sends": sent["late_sends"],
            "cpu_us_per_msg": cpu,
            "steal_share": machine.steal_share(marks[0][1], marks[1][1]) if whole else None,
        }

    def _mark_window(self, window, marks: list[tuple[float, tuple[int, ...]]], timeout_s: float) -> None:
        """When the counted sends begin and when they end: the CPU seconds of the servers'
        process groups, and the machine's CPU ticks (for the share stolen by the hypervisor)."""
        for ev in window:
            if not ev.wait(timeout_s):
                return
            marks.append((sum(process_group_cpu_s(s.pgid) for s in self._servers), machine.host_cpu_ticks()))


def process_cpu_s() -> float:
    """CPU seconds (user + system) this process has used, all its threads."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def process_group_cpu_s(pgid: int) -> float:
    """CPU seconds (user + system) the live processes of group ``pgid`` have used (Linux
    /proc; clock ticks, 10 ms on most kernels)."""
    ticks = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            fields = machine.proc_stat(entry.name)
        except OSError:
            continue  # gone meanwhile
        if int(fields[2]) == pgid:
            ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def latency_figures(stamps: Sequence[tuple[int, int, int, int]]) -> dict[str, Any] | None:
    """From a latency run's (scheduled, sequence, received, send began) stamps, in ns, of the
    messages past the warm-up: end-to-end latency (from the scheduled time) p50 / p99 / p99.9 / max /
    mean, and p50 / p99 of the transit from the send call on, in ms; None if none arrived.

    >>> f = latency_figures([(0, 200, 3_000_000, 2_000_000), (0, 201, 1_000_000, 0)])
    >>> f["counted"], f["p99_ms"], f["transit_p99_ms"]
    (2, 3.0, 1.0)
    """
    counted = [st for st in stamps if st[1] >= LATENCY_WARMUP]
    if not counted:
        return None
    lat_ms = sorted((r - s) / 1e6 for s, _, r, _ in counted)
    transit_ms = sorted((r - began) / 1e6 for _, _, r, began in counted)
    return {
        "counted": len(lat_ms),
        "p50_ms": percentile(lat_ms, 50),
        "p99_ms": percentile(lat_ms, 99),
        "p999_ms": percentile(lat_ms, 99.9),
        "max_ms": lat_ms[-1],
        "mean_ms": sum(lat_ms) / len(lat_ms),
        "transit_p50_ms": percentile(transit_ms, 50),
        "transit_p99_ms": percentile(transit_ms, 99),
    }


def percentile(sorted_values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile of already sorted values."""
    rank = max(1, min(len(sorted_values), round(pct / 100 * len(sorted_values) + 0.5)))
    return sorted_values[rank - 1]


def _run_workers(procs: list, results, *, timeout_s: float) -> list[dict[str, Any]]:
    """Start ``procs``, collect one result each; kill (by pid) any still running at the deadline."""
    for p in procs:
        p.start()
    outs: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(outs) < len(procs):
            left = deadline - time.monotonic()
            if left <= 0:
                outs.append({"error": f"timed out after {timeout_s:.0f} s"})
                break
            try:
                outs.append(results.get(timeout=min(left, 1.0)))
            except Exception:  # noqa: BLE001 - queue.Empty: check the workers are alive
                dead = [p for p in procs if p.exitcode not in (None, 0)]
                if dead and results.empty():
                    outs.append({"error": f"worker exited with code {dead[0].exitcode}"})
                    break
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
    return outs


def _bodies(size: int, batch: int) -> list[list[bytes]]:
    rng = random.Random(size * 1_000_003 + batch)
    return [[rng.randbytes(size) for _ in range(batch)] for _ in range(POOL_BATCHES)]


def _produce_worker(
    driver: Driver, mode: Mode, index: int, size: int, batch: int, n: int, seconds: float, barrier, results
) -> None:
    try:
        pool = _bodies(size, batch)
        with driver.producer(mode, index) as send_batch:
            send_batch(pool[0])  # connect and warm up, untimed
            barrier.wait(timeout=BARRIER_TIMEOUT_S)
            clock = time.monotonic_ns
            start = clock()
            stop = start + int(seconds * 1e9)
            sent = i = 0
            while sent < n:
                send_batch(pool[i % POOL_BATCHES])
                sent += batch
                i += 1
                if clock() >= stop:
                    break
            end = clock()
        results.put({"index": index, "msgs": sent, "start_ns": start, "end_ns": end})
    except BaseException as e:  # noqa: BLE001 - reported as the run's error
        with contextlib.suppress(Exception):
            barrier.abort()
        results.put({"index": index, "error": f"{type(e).__name__}: {e}"[:300]})


def _consume_worker(
    driver: Driver, mode: Mode, size: int, batch: int, n: int, fill_seconds: float, seconds: float, results
) -> None:
    try:
        pool = _bodies(size, batch)
        filled = 0
        fill_start = time.monotonic()
        with driver.producer(mode, 0) as send_batch:
            while filled < n and (filled == 0 or time.monotonic() - fill_start < fill_seconds):
                send_batch(pool[(filled // batch) % POOL_BATCHES])
                filled += batch
        fill_s = time.monotonic() - fill_start
        got = 0
        with driver.consumer(mode, 0) as poll:
            clock = time.monotonic_ns
            start = clock()
            give_up = start + int((seconds + 30) * 1e9)
            while got < filled and clock() < give_up:
                got += len(poll(1.0))
            end = clock()
        out = {"msgs": got, "filled": filled, "fill_s": fill_s, "elapsed_s": (end - start) / 1e9}
        if got < filled:
            out["note"] = f"read {got} of {filled} within {seconds + 30:.0f} s"
        results.put(out)
    except BaseException as e:  # noqa: BLE001
        results.put({"error": f"{type(e).__name__}: {e}"[:300]})


class BlockingSender:
    """A sender over a blocking ``send_batch``: each send waits for its ack (the fallback)."""

    def __init__(self, send_batch: SendBatch) -> None:
        self._send_batch = send_batch

    def send(self, body: bytes) -> None:
        self._send_batch([body])

    def wait_acked(self, timeout_s: float) -> None:
        pass


class PipelinedSender:
    """Messages written on the caller's thread as they come; a second thread reads the
    acknowledgements, which come in order, and counts them. At most ``INFLIGHT_MAX`` are
    outstanding. For clients that have no asynchronous send of their own (redis-py, the
    floor's sockets); a subclass says how to write one message (:meth:`_write`), how to read
    acknowledgements (:meth:`_read_acks`), and how to let go of the connection."""

    what = "messages"  # what is acknowledged, for the error text

    def __init__(self, reader_name: str) -> None:
        self._sent = self._acked = 0
        self._closing = False
        self._error: BaseException | None = None
        self._cv = threading.Condition()
        self._reader = threading.Thread(target=self._run_reader, name=reader_name, daemon=True)
        self._reader.start()

    def _write(self, body: bytes) -> None:
        raise NotImplementedError

    def _read_acks(self) -> int:
        """Block until acknowledgements arrive; how many (raise if the connection failed)."""
        raise NotImplementedError

    def _interrupt(self) -> None:
        """Closing: wake the reader if it may be blocked reading (by default it is not)."""

    def _disconnect(self) -> None:
        raise NotImplementedError

    def _run_reader(self) -> None:
        try:
            while True:
                with self._cv:
                    while self._acked >= self._sent and not self._closing:
                        self._cv.wait()
                    if self._acked >= self._sent:
                        return
                got = self._read_acks()
                with self._cv:
                    self._acked += got
                    self._cv.notify_all()
        except BaseException as e:  # noqa: BLE001 - surfaced by send / wait_acked
            with self._cv:
                self._error = e
                self._cv.notify_all()

    def send(self, body: bytes) -> None:
        with self._cv:
            while self._sent - self._acked >= INFLIGHT_MAX and self._error is None:
                self._cv.wait()
            if self._error is not None:
                raise self._error
            self._sent += 1
            self._cv.notify_all()
        self._write(body)

    def wait_acked(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        with self._cv:
            while self._acked < self._sent and self._error is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{self._sent - self._acked} {self.what} unanswered")
                self._cv.wait(left)
            if self._error is not None:
                raise self._error

    def close(self) -> None:
        with self._cv:
            self._closing = True
            self._cv.notify_all()
        self._interrupt()
        self._reader.join(timeout=5)
        self._disconnect()


class FutureSender:
    """Keeps the futures of sends in flight (at most ``INFLIGHT_MAX``) and waits for them."""

    def __init__(self, submit: Callable[[bytes], Any]) -> None:
        self._submit = submit
        self._pending: collections.deque = collections.deque()

    def send(self, body: bytes) -> None:
        if len(self._pending) >= INFLIGHT_MAX:
            self._pending.popleft().result(timeout=60)
        while self._pending and self._pending[0].done():
            self._pending.popleft().result()  # raises if the send failed
        fut = self._submit(body)
        if not hasattr(fut, "done"):  # a client whose send returned the result itself
            done: concurrent.futures.Future = concurrent.futures.Future()
            done.set_result(fut)
            fut = done
        self._pending.append(fut)

    def wait_acked(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while self._pending:
            self._pending.popleft().result(timeout=max(0.0, deadline - time.monotonic()))


def close_loop(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel what a client left running on ``loop`` (timers, heartbeats), then close it."""
    tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for t in tasks:
        t.cancel()
    if tasks:
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
    loop.close()


class LoopThread:
    """An asyncio loop in a daemon thread, for asyncio clients driven from plain code."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="bench-loop", daemon=True)
        self._thread.start()

    def submit(self, coro) -> concurrent.futures.Future:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro, timeout_s: float | None = 60):
        return self.submit(coro).result(timeout=timeout_s)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            close_loop(self.loop)


@contextlib.contextmanager
def temp_workdir(prefix: str) -> Iterator[Path]:
    """A fresh directory under /tmp, removed afterwards."""
    import tempfile

    d = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)
