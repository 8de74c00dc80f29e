"""The machine's own limits, measured the way the store uses the disk.

Every storage figure is reported as a ratio to these, so a result reads the same on a
laptop and on a server:

- raw sequential write bandwidth: write one large file in 1 MiB chunks with ``os.write``,
  then one ``fdatasync``; bytes over the time of both. This is the ceiling for an
  append-only log that is made durable (the log writes with ``pwritev`` and syncs with
  ``fdatasync`` too).
- fsync latency: append 4 KiB and ``fdatasync``, one after the other, ~200 times; p50 and
  p99. A single appender under sync flush cannot beat one of these per send.
- timer lateness: one thread, alone, keeps a fixed schedule (2,000 ticks a second, sleeping
  then spinning to each tick, as the latency benchmarks' producers do) and records how late
  it got to each tick. Nothing of any system under test runs; what it shows is the machine's
  own scheduling noise (other tenants of a virtual machine's host, for one), the floor under
  every end-to-end latency figure of the same run.

Units: MB is 10**6 bytes (as ``dd`` prints), MiB is 2**20. Files are written under the
directory given (a temporary one under /tmp) and removed before returning.
"""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

__all__ = [
    "write_bandwidth",
    "fsync_latency",
    "timer_lateness",
    "sleep_until_ns",
    "exact_sleeps",
    "facts",
    "meminfo_kib",
    "process_cpu_times",
    "context_switches",
    "halt_poll_ns",
    "halt_polling",
]

#: How close to a tick ``sleep_until_ns`` stops sleeping and spins (sleep() overshoots by ~0.1 ms).
SPIN_NS = 150_000
_PR_SET_TIMERSLACK = 29  # <linux/prctl.h>

MB = 1_000_000
MIB = 1 << 20


def write_bandwidth(directory: str | Path, *, total_bytes: int = 1 << 30, chunk_bytes: int = MIB) -> dict[str, float]:
    """Sequential write + one fdatasync of a ``total_bytes`` file; MB/s over both.

    The chunk is random (a virtual disk may compress or deduplicate zeros).
    """
    path = Path(directory) / "hw-bench-raw-write.bin"
    chunk = os.urandom(chunk_bytes)
    chunks = max(1, total_bytes // chunk_bytes)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        start = time.perf_counter()
        for _ in range(chunks):
            view = memoryview(chunk)
            while view:
                view = view[os.write(fd, view) :]
        written_s = time.perf_counter() - start
        os.fdatasync(fd)
        elapsed_s = time.perf_counter() - start
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)
    size = chunks * chunk_bytes
    return {
        "bytes": size,
        "elapsed_s": elapsed_s,
        "write_only_s": written_s,
        "mb_per_s": size / elapsed_s / MB,
    }


def fsync_latency(
    directory: str | Path, *, samples: int = 200, write_bytes: int = 4096, warmup: int = 10
) -> dict[str, float]:
    """Latency of appending ``write_bytes`` and fdatasync-ing, in ms (p50, p99, mean)."""
    path = Path(directory) / "hw-bench-fsync.bin"
    block = os.urandom(write_bytes)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
    times_ms: list[float] = []
    try:
        for i in range(warmup + samples):
            start = time.perf_counter()
            os.write(fd, block)
            os.fdatasync(fd)
            if i >= warmup:
                times_ms.append((time.perf_counter() - start) * 1000)
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)
    times_ms.sort()
    return {
        "samples": samples,
        "p50_ms": _percentile(times_ms, 50),
        "p99_ms": _percentile(times_ms, 99),
        "mean_ms": sum(times_ms) / len(times_ms),
        "max_ms": times_ms[-1],
    }


def sleep_until_ns(tick_ns: int, spin_ns: int = SPIN_NS) -> int:
    """Wait until ``time.monotonic_ns()`` reaches ``tick_ns``: sleep until ``spin_ns`` before
    it (which lets other threads of the process run), then spin the rest. Returns the ns
    spent spinning (CPU the caller burned waiting)."""
    clock = time.monotonic_ns
    ahead = tick_ns - clock()
    if ahead > spin_ns:
        time.sleep((ahead - spin_ns) / 1e9)
    spin_from = clock()
    if spin_from >= tick_ns:
        return 0
    while clock() < tick_ns:
        pass
    return clock() - spin_from


def exact_sleeps() -> bool:
    """Ask Linux to end this thread's sleeps on time: timer slack 1 ns instead of the usual
    50 µs (``prctl(PR_SET_TIMERSLACK)``), for pacing by sleeping alone (``spin_ns=0``). True
    if the kernel took it; elsewhere nothing changes."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        one_ns, unused = ctypes.c_ulong(1), ctypes.c_ulong(0)  # prctl(2) takes unsigned longs after the option
        return ctypes.CDLL(None).prctl(_PR_SET_TIMERSLACK, one_ns, unused, unused, unused) == 0
    except (OSError, AttributeError):
        return False


def timer_lateness(*, rate: int = 2000, seconds: float = 2.0, spin_ns: int = SPIN_NS) -> dict[str, float]:
    """How late one thread, alone, gets to the ticks of a fixed ``rate``, in ms: p50, p99,
    max, and the share of ticks more than 1 ms late. It sleeps until ``spin_ns`` before each
    tick, then spins (with ``spin_ns=0`` it only sleeps, with :func:`exact_sleeps`)."""
    if not spin_ns:
        exact_sleeps()
    clock = time.monotonic_ns
    interval = 1_000_000_000 // rate
    ticks = max(1, int(rate * seconds))
    late_ms: list[float] = []
    t0 = clock() + 10_000_000
    for i in range(ticks):
        tick = t0 + i * interval
        sleep_until_ns(tick, spin_ns)
        late_ms.append((clock() - tick) / 1e6)
    late_ms.sort()
    return {
        "ticks": ticks,
        "p50_ms": _percentile(late_ms, 50),
        "p99_ms": _percentile(late_ms, 99),
        "max_ms": late_ms[-1],
        "over_1ms_share": sum(1 for x in late_ms if x > 1.0) / ticks,
    }


def _percentile(sorted_values: list[float], pct: float) -> float:
    """Nearest-rank percentile of already sorted values."""
    rank = max(1, min(len(sorted_values), round(pct / 100 * len(sorted_values) + 0.5)))
    return sorted_values[rank - 1]


def facts(directory: str | Path) -> dict[str, object]:
    """What the machine is: CPUs, memory, the disk under ``directory``, load right now."""
    directory = Path(directory)
    mount, device, fstype = _mount_of(directory)
    dev_name = Path(device).name
    rotational = _read(f"/sys/block/{dev_name}/queue/rotational")
    usage = shutil.disk_usage(directory)
    return {
        "nproc": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "memory_gib": round(meminfo_kib("MemTotal") / MIB, 1),
        "disk_device": device,
        "disk_mount": mount,
        "disk_fs": fstype,
        "disk_size_gib": round(usage.total / (1 << 30), 1),
        "disk_rotational_flag": rotational,  # as the kernel reports it; virtio often says 1
        "kernel": platform.release(),
        "python": platform.python_version(),
        "loadavg_1m": round(os.getloadavg()[0], 2),
        "cpuidle_driver": _read("/sys/devices/system/cpu/cpuidle/current_driver"),
        "guest_halt_poll_ns": halt_poll_ns(),
    }


#: The guest kernel's halt polling (the ``haltpoll`` cpuidle driver of a KVM guest): an idle
#: vCPU polls for up to this many ns before it halts and gives its core back to the host.
HALT_POLL_PATH = "/sys/module/haltpoll/parameters/guest_halt_poll_ns"


def halt_poll_ns(path: str = HALT_POLL_PATH) -> int | None:
    """The guest's halt polling limit now, in ns (0: an idle vCPU halts at once); None when
    this machine has no such setting (not a KVM guest with the haltpoll driver).

    >>> import tempfile
    >>> with tempfile.NamedTemporaryFile("w") as f:
    ...     _ = f.write("200000\\n"); f.flush()
    ...     halt_poll_ns(f.name), halt_poll_ns(f.name + ".absent")
    (200000, None)
    """
    text = _read(path)
    return int(text) if text is not None and text.isdigit() else None


@contextlib.contextmanager
def halt_polling(ns: int, path: str = HALT_POLL_PATH) -> Iterator[int]:
    """Set the guest's halt polling limit to ``ns`` for the block, and put back what it was.

    Halt polling is the kernel's way of keeping an idle vCPU from halting for a while, so that
    the next interrupt finds it awake; every system under test gets it alike. Needs root, and
    a guest with the haltpoll driver: raises OSError naming the file otherwise.
    """
    before = halt_poll_ns(path)
    if before is None:
        raise OSError(
            f"{path} is missing: this machine has no guest halt polling to set "
            "(the haltpoll cpuidle driver of a KVM guest)"
        )
    Path(path).write_text(f"{ns}\n")
    try:
        yield before
    finally:
        Path(path).write_text(f"{before}\n")


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def _cpu_model() -> str | None:
    text = _read("/proc/cpuinfo") or ""
    for line in text.splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or None


def meminfo_kib(field: str) -> int:
    """A field of /proc/meminfo in KiB (``MemTotal``, ``Cached``, ...); 0 when unknown."""
    for line in (_read("/proc/meminfo") or "").splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def host_cpu_ticks() -> tuple[int, ...]:
    """The machine's CPU time so far, all CPUs, in clock ticks, as /proc/stat's first line
    counts it: (user, nice, system, idle, iowait, irq, softirq, steal); zeros when unknown."""
    first = (_read("/proc/stat") or "").split("\n", 1)[0].split()
    if not first or first[0] != "cpu":
        return (0,) * 8
    return tuple(int(x) for x in (first[1:9] + ["0"] * 8)[:8])


def steal_share(before: tuple[int, ...], after: tuple[int, ...]) -> float | None:
    """The share of CPU time the hypervisor gave to other guests between two
    :func:`host_cpu_ticks` readings (a virtual CPU waiting to run: "steal"); None when
    nothing was counted."""
    spent = [b - a for a, b in zip(before, after)]
    total = sum(spent)
    return spent[7] / total if total > 0 else None


def proc_stat(pid: int | str) -> list[bytes]:
    """Fields 3 (state) on of ``/proc/<pid>/stat``: index 2 is field 5 (process group),
    11 and 12 are fields 14 and 15 (user and system CPU, in clock ticks). Raises OSError
    when the process is gone."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        data = f.read()
    return data[data.rindex(b")") + 2 :].split()  # the command name may hold spaces


def process_cpu_times(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds a live process has used so far (Linux /proc; clock ticks)."""
    fields = proc_stat(pid)
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def context_switches(pid: int) -> tuple[int, int]:
    """(voluntary, involuntary) context switches of all of a live process's threads so far
    (Linux /proc): a thread that blocks switches voluntarily; one the scheduler takes the CPU
    from while it could still run (a woken task preempting it), involuntarily."""
    vol = invol = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches:"):
                        vol += int(line.split()[1])
                    elif line.startswith("nonvoluntary_ctxt_switches:"):
                        invol += int(line.split()[1])
        except FileNotFoundError:  # the thread ended meanwhile
            continue
    return vol, invol


def _mount_of(path: Path) -> tuple[str, str, str]:
    """(mount point, device, filesystem) of the longest mount prefix of ``path``."""
    best = ("/", "?", "?")
    resolved = str(path.resolve())
    for line in (_read("/proc/mounts") or "").splitlines():
        parts = line.split()
        if len(parts) < 3:
            continue
        device, mount, fstype = parts[0], parts[1], parts[2]
        inside = resolved == mount or resolved.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= len(best[0]):
            best = (mount, device, fstype)
    return best


def revision() -> str:
    """The commit of this checkout, as measured: its short hash, with " + uncommitted edits"
    when tracked files differ from it ("unknown" outside a git checkout)."""
    root = Path(__file__).resolve().parent.parent

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return head + (" + uncommitted edits" if git("status", "--porcelain", "--untracked-files=no") else "")
