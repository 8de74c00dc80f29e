"""The hops probe: where a message's end-to-end time goes, hop by hop (``python -m bench.probes hops``).

A ``headwater serve`` broker, a producer and a consumer, each in its own process and
connected over loopback TCP, run the latency benchmark's workload: one 100 B message at a
time, 2,000 a second, paced as bench.latency paces it, read back through a fetch stream. Each
process notes when each message passes its hops, on the wall clock the three share:

=========  ==================================================================
hop        when
=========  ==================================================================
sent       the producer calls ``Producer.send``
written    its request is handed to the socket (``send``/``sendmsg``)
read       the broker's loop gets the bytes (``data_received``)
parsed     the broker serves the parsed request
appended   the batch is in the log (its ``write`` done)
pushed     the PUSH frame carrying it is handed to the consumer's socket
received   the consumer's thread has read those bytes
handed     ``Consumer.poll`` returns the record
=========  ==================================================================

It prints each step's p50, p90 and p99 in µs, and the mean of each step over the slowest 1 %
of messages (where the tail comes from), with each process's CPU per message and the
host's CPU steal during the run. The steps are measured by wrapping a handful of methods in
the three processes (the wrappers cost a few µs, so the total is a little above what
bench.latency sees). A message is found in the bytes by a marker in its body, so a frame that
carries two messages stamps both.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import signal
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from bench import machine

__all__ = ["HOPS", "Stamps", "awake", "hops", "summarize"]

HOPS = ("sent", "written", "read", "parsed", "appended", "pushed", "received", "handed")
MARK = b"HOPSMARK"
_KEY = struct.Struct(">Q")
QUEUE = "hops"
RATE = 2000
SECONDS = 8.0
WARMUP = 200  # messages sent before the counted ones (connections, caches, first pushes)


class Stamps:
    """When each message (by its sequence number) passed each hop, in one process."""

    def __init__(self) -> None:
        self.at: dict[str, dict[int, int]] = {hop: {} for hop in HOPS}

    def mark(self, hop: str, buf: Any, t_ns: int) -> None:
        """Stamp ``t_ns`` on every message whose body is in ``buf`` (any bytes-like), the
        first time each passes ``hop``.

        >>> s = Stamps(); s.mark("read", body(7) + body(8), 100); s.mark("read", body(7), 200)
        >>> s.at["read"]
        {7: 100, 8: 100}
        """
        data = bytes(buf)
        seen = self.at[hop]
        i = data.find(MARK, _KEY.size)
        while i >= 0:
            seen.setdefault(_KEY.unpack_from(data, i - _KEY.size)[0], t_ns)
            i = data.find(MARK, i + len(MARK))


def body(seq: int, size: int = 100) -> bytes:
    """A message body of ``size`` bytes that :meth:`Stamps.mark` finds as ``seq``."""
    return _KEY.pack(seq) + MARK + b"x" * (size - _KEY.size - len(MARK))


def _wrap(cls: type, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    setattr(cls, name, make(getattr(cls, name)))


# the three processes -------------------------------------------------------------------


def _pin(cpus: set[int] | None) -> None:
    if cpus:
        os.sched_setaffinity(0, cpus)


def _broker(data: str, flush: str, ready: Any, out: Any, cpus: set[int] | None = None) -> None:
    _pin(cpus)
    from headwater.broker.connection import ClientConnection
    from headwater.broker.run import run_server
    from headwater.broker.server import BrokerServer, ServerConfig
    from headwater.protocol.messages import ProduceRequest
    from headwater.storage.store import LogStore, StoreConfig

    stamps, clock = Stamps(), time.time_ns

    def data_received(orig):
        def wrapper(self, data):
            stamps.mark("read", data, clock())
            return orig(self, data)

        return wrapper

    def serve(orig):
        def wrapper(self, st, ev):
            if type(ev.body) is ProduceRequest:
                stamps.mark("parsed", ev.body.batch, clock())
            return orig(self, st, ev)

        return wrapper

    def append_locked(orig):
        def wrapper(self, q, partition, h, batch, *args):
            result = orig(self, q, partition, h, batch, *args)
            stamps.mark("appended", batch, clock())
            return result

        return wrapper

    def send(orig):  # the PUSH frames (answers served inline go out by _flush)
        def wrapper(self, chunks, *args):
            t = clock()
            for chunk in chunks:
                stamps.mark("pushed", chunk, t)
            return orig(self, chunks, *args)

        return wrapper

    _wrap(ClientConnection, "data_received", data_received)
    _wrap(BrokerServer, "serve", serve)
    _wrap(LogStore, "_append_locked", append_locked)
    _wrap(ClientConnection, "send", send)
    run_server(data, StoreConfig(flush=flush), ServerConfig(host="127.0.0.1", port=0), on_ready=ready.put)
    out.put(("broker", stamps.at))  # after SIGTERM's clean stop


def _stamp_writes(stamps: Stamps) -> None:
    """Stamp "written" in this process's client when a request's bytes go to the socket."""
    from headwater.client.transport.async_transport import AsyncTransport

    def write_locked(orig):
        def wrapper(self, link, chunks):
            t = time.time_ns()
            for chunk in chunks:
                stamps.mark("written", chunk, t)
            return orig(self, link, chunks)

        return wrapper

    _wrap(AsyncTransport, "_write_locked", write_locked)


def _stamp_reads(stamps: Stamps) -> None:
    """Stamp "received" in this process's client when bytes read from the socket are parsed."""
    from headwater.client.transport.async_transport import AsyncTransport

    def parse_locked(orig):
        def wrapper(self, link, data, outcomes):
            stamps.mark("received", data, time.time_ns())
            return orig(self, link, data, outcomes)

        return wrapper

    _wrap(AsyncTransport, "_parse_locked", parse_locked)


def follow_queue(hw: Any) -> Any:
    """A consumer of the probe's queue, its fetch stream open."""
    c = hw.consumer()
    c.assign(QUEUE, partitions=[0])
    c.poll(timeout_ms=0)  # opens the fetch stream
    return c


def _consumer(address: str, total: int, ready: Any, out: Any, cpus: set[int] | None = None) -> None:
    import headwater

    _pin(cpus)

    stamps = Stamps()
    _stamp_reads(stamps)
    hw = headwater.connect(address)
    try:
        c = follow_queue(hw)
        ready.put(os.getpid())
        handed, got, deadline = stamps.at["handed"], 0, time.monotonic() + 120
        while got < total and time.monotonic() < deadline:
            for r in c.poll(max_messages=500, timeout_ms=1000):
                t = time.time_ns()
                if r.body[_KEY.size : _KEY.size + len(MARK)] == MARK:  # not the producer's warm-up message
                    handed.setdefault(_KEY.unpack_from(r.body)[0], t)
                    got += 1
    finally:
        hw.close()
    out.put(("consumer", stamps.at))


def _producer(address: str, rate: int, total: int, ready: Any, go: Any, out: Any, cpus: set[int] | None = None) -> None:
    import headwater

    _pin(cpus)

    stamps = Stamps()
    _stamp_writes(stamps)
    hw = headwater.connect(address)
    try:
        p = hw.producer(linger_ms=0)
        p.send(QUEUE, b"warm").result(timeout=30)
        ready.put(os.getpid())
        go.wait()
        sent, gap = stamps.at["sent"], 1_000_000_000 // rate
        futures = []
        sched = time.monotonic_ns()
        for seq in range(total):
            sched += gap
            machine.sleep_until_ns(sched)
            msg = body(seq)
            sent[seq] = time.time_ns()
            futures.append(p.send(QUEUE, msg))
            if seq == WARMUP:
                ready.put("counting")
        ready.put("done")
        for f in futures:
            f.result(timeout=60)
    finally:
        hw.close()
    out.put(("producer", stamps.at))


# the parent ----------------------------------------------------------------------------


def _cpu_s(pid: int) -> float:
    user, system = machine.process_cpu_times(pid)
    return user + system


def run(
    flush: str = "async", *, rate: int = RATE, seconds: float = SECONDS, cpus: dict[str, set[int]] | None = None
) -> dict[str, Any]:
    """One run: the three processes' stamps merged, CPU seconds per process over the counted
    messages, the host's steal share meanwhile, and the CPUs each process may run on. ``cpus``
    pins a process (``"broker"``, ``"producer"``, ``"consumer"``) to those CPUs."""
    ctx = mp.get_context("spawn")
    total = WARMUP + int(rate * seconds)
    cpus = cpus or {}
    with tempfile.TemporaryDirectory(prefix="hw-hops-") as d:
        ready, out, go = ctx.Queue(), ctx.Queue(), ctx.Event()
        procs: list = []
        try:
            broker, address = start_broker(ctx, _broker, (d, flush, ready, out, cpus.get("broker")), ready, procs)
            consumer = ctx.Process(
                target=_consumer, args=(address, total, ready, out, cpus.get("consumer")), daemon=True
            )
            consumer.start()
            procs.append(consumer)
            _get(ready, procs)
            producer = ctx.Process(
                target=_producer, args=(address, rate, total, ready, go, out, cpus.get("producer")), daemon=True
            )
            producer.start()
            procs.append(producer)
            _get(ready, procs)
            go.set()
            if _get(ready, procs) != "counting":
                raise RuntimeError("the producer did not start counting")
            pids = {"broker": broker.pid, "producer": producer.pid, "consumer": consumer.pid}
            affinity = {k: sorted(os.sched_getaffinity(pid)) for k, pid in pids.items()}  # each pinned itself by now
            cpu0 = {k: _cpu_s(pid) for k, pid in pids.items()}
            ticks0 = machine.host_cpu_ticks()
            if _get(ready, procs, seconds + 60) != "done":
                raise RuntimeError("the producer did not finish")
            cpu = {k: _cpu_s(pid) - cpu0[k] for k, pid in pids.items()}
            steal = machine.steal_share(ticks0, machine.host_cpu_ticks())
            stamps: dict[str, dict[int, int]] = {}
            for _ in range(2):  # consumer and producer
                stamps.update(_take(out, procs))
            os.kill(broker.pid, signal.SIGTERM)
            stamps.update(_take(out, procs))
        finally:  # on success all three have ended by now; after a failure, stop the rest
            stop_all(procs)
    counted = total - WARMUP
    return {
        "flush": flush,
        "stamps": stamps,
        "counted": counted,
        "affinity": affinity,
        "cpu_us_per_msg": {k: v * 1e6 / counted for k, v in cpu.items()},
        "steal_share": steal,
    }


def start_broker(ctx: Any, target: Callable[..., None], args: tuple, ready: Any, procs: list) -> tuple[Any, str]:
    """Spawn the broker process (``target(*args)`` puts its port on ``ready``), add it to
    ``procs``, and create the probe's one-partition queue on it: the process and its address."""
    import headwater

    broker = ctx.Process(target=target, args=args, daemon=True)
    broker.start()
    procs.append(broker)
    address = f"127.0.0.1:{_get(ready, procs)}"
    hw = headwater.connect(address)
    try:
        hw.admin.create_queue(QUEUE, partitions=1, ttl_s=None)
    finally:
        hw.close()
    return broker, address


def stop_all(procs: list) -> None:
    """Join the probe's processes; stop those still running (after a failure)."""
    for proc in procs:
        proc.join(timeout=5)
        if proc.is_alive():
            proc.terminate()
            proc.join(timeout=10)
        if proc.is_alive():
            proc.kill()


def _get(q: Any, procs: list, timeout_s: float = 90) -> Any:
    """The next item of ``q``; raises as soon as one of ``procs`` failed (it sends nothing more)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return q.get(timeout=1)
        except queue.Empty:
            failed = [p.name for p in procs if p.exitcode not in (None, 0)]
            if failed or time.monotonic() > deadline:
                raise RuntimeError(
                    f"the hops probe's processes stalled (failed: {failed or 'none, timed out'})"
                ) from None


def _take(out: Any, procs: list) -> dict[str, dict[int, int]]:
    _, at = _get(out, procs)
    return {hop: seen for hop, seen in at.items() if seen}


def summarize(stamps: dict[str, dict[int, int]], first: int = WARMUP) -> dict[str, Any]:
    """Per step between hops (and in all): p50, p90 and p99 in µs, and the mean over the
    slowest 1 % of messages (by the whole trip), over the messages stamped at every hop from
    sequence ``first`` on.

    >>> at = {hop: {s: s * 1000 + i * 10_000 for s in range(100)} for i, hop in enumerate(HOPS)}
    >>> at["handed"][99] += 500_000  # one slow hand-out
    >>> r = summarize(at, first=0)
    >>> r["messages"], r["steps"][0]["p50_us"], r["total"]["p50_us"], r["steps"][-1]["slowest_mean_us"]
    (100, 10.0, 70.0, 510.0)
    """
    keys = sorted(set.intersection(*(set(stamps.get(hop, ())) for hop in HOPS)))
    keys = [k for k in keys if k >= first]
    if not keys:
        raise RuntimeError("no message was stamped at every hop")
    trip = [stamps[HOPS[-1]][k] - stamps[HOPS[0]][k] for k in keys]
    cut = sorted(trip)[int(len(trip) * 0.99)]
    slowest = [k for k, t in zip(keys, trip) if t >= cut]

    def row(values: list[int], slow: list[int]) -> dict[str, float]:
        s = sorted(values)
        return {
            "p50_us": s[len(s) // 2] / 1e3,
            "p90_us": s[int(len(s) * 0.9)] / 1e3,
            "p99_us": s[int(len(s) * 0.99)] / 1e3,
            "slowest_mean_us": sum(slow) / len(slow) / 1e3,
        }

    steps = []
    for a, b in zip(HOPS, HOPS[1:]):
        at_a, at_b = stamps[a], stamps[b]
        steps.append(
            {"from": a, "to": b, **row([at_b[k] - at_a[k] for k in keys], [at_b[k] - at_a[k] for k in slowest])}
        )
    total = row(trip, [stamps[HOPS[-1]][k] - stamps[HOPS[0]][k] for k in slowest])
    return {"messages": len(keys), "steps": steps, "total": total}


def hops(runs: int = 2) -> None:
    for i in range(runs):
        for flush in ("async", "sync"):
            _report(f"hops {i + 1}, {flush} flush", run(flush))


def _report(title: str, res: dict[str, Any]) -> None:
    """Print one run of :func:`run`: its CPU per message, then each hop's percentiles."""
    s = summarize(res["stamps"])
    steal = res["steal_share"]
    cpu = res["cpu_us_per_msg"]
    print(
        f"{title}: {s['messages']:,} of {res['counted']:,} messages stamped at every "
        f"hop; host steal {'unknown' if steal is None else f'{steal:.1%}'}; CPU µs per message: "
        + ", ".join(f"{k} {v:.0f}" for k, v in cpu.items())
        + f" (in all {sum(cpu.values()):.0f})"
    )
    print(f"  {'step':<22} {'p50':>6} {'p90':>6} {'p99':>6} {'slowest 1%':>11}   µs")
    for st in [*s["steps"], {"from": "sent", "to": "handed", **s["total"]}]:
        print(
            f"  {st['from'] + ' -> ' + st['to']:<22} {st['p50_us']:6.0f} {st['p90_us']:6.0f} "
            f"{st['p99_us']:6.0f} {st['slowest_mean_us']:11.0f}"
        )


#: Runs on CPU 0 at the lowest priority there is (SCHED_IDLE): any other task that wants the
#: CPU preempts it at once, but the CPU itself never goes idle, so it never halts.
_SPINNER = (
    "import os; os.sched_setaffinity(0, {0}); os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))\n"
    "while True: pass"
)


def awake(runs: int = 2) -> None:
    """The hops probe's async run with the broker alone on CPU 0 and the producer and the
    consumer on CPU 1, alternately as it is and with CPU 0 kept from going idle between
    messages by a spinning process of the lowest priority (:data:`_SPINNER`): how much of
    the broker's cost and of the tail is its CPU waking from a halt (on a virtual machine,
    a halted vCPU gives its physical core back to the host until an interrupt wakes it)."""
    if not {0, 1} <= os.sched_getaffinity(0):
        print("awake: needs CPUs 0 and 1; skipped")
        return
    print(f"awake: guest halt polling {_halt_poll()}")
    cpus = {"broker": {0}, "producer": {1}, "consumer": {1}}
    for i in range(runs):
        for spin in (False, True):
            spinner = subprocess.Popen([sys.executable, "-c", _SPINNER]) if spin else None
            try:
                res = run("async", cpus=cpus)
            finally:
                if spinner is not None:
                    spinner.kill()
                    spinner.wait()
            what = "CPU 0 kept awake by an idle-priority spinner" if spin else "CPU 0 left to halt when idle"
            _report(f"awake {i + 1}, async flush, broker on CPU 0, clients on CPU 1, {what}", res)


def _halt_poll() -> str:
    """What the guest does before halting an idle vCPU (Linux's haltpoll cpuidle driver)."""
    try:
        with open("/sys/module/haltpoll/parameters/guest_halt_poll_ns") as f:
            ns = int(f.read())
    except (OSError, ValueError):
        return "unknown (no haltpoll driver)"
    return "off (guest_halt_poll_ns 0: an idle vCPU halts at once)" if ns == 0 else f"up to {ns:,} ns"


if __name__ == "__main__":
    sys.exit(hops())
