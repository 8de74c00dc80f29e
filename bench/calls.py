"""The calls probe: the Python function calls each process makes per message
(``python -m bench.probes calls``).

The hops probe's three processes (a ``headwater serve`` broker, a producer and a consumer,
over loopback TCP) run the latency benchmark's message shape, one 100 B message per send
with ``linger_ms=0``, read back through a fetch stream; each process counts, per thread, the
Python-level function calls it makes (``sys.setprofile``: "call" events, so functions of the
standard library count and C functions do not) while the counted messages pass. Calls per
message is what the CPU per message is made of, but it does not move with the host's load:
this probe measures a change to the hot paths exactly where timing it on a shared machine
cannot.

The counting hook slows every process several times over, so the rate is low (500 a second)
and nothing here is a time. Each message is sent and read alone: the producer waits until
the consumer has the previous one, so no frame carries two messages and every count is per
single-message produce, acknowledgement, push and poll. The probe's own loops call only C
functions per message, except ``Consumer.poll`` and ``Producer.send`` themselves.
"""

from __future__ import annotations

import collections
import multiprocessing as mp
import os
import signal
import sys
import tempfile
import threading
import time
from typing import Any

from bench.hops import QUEUE, _get, follow_queue, start_broker, stop_all

__all__ = ["Counter", "calls", "run"]

MESSAGES = 2000
WARMUP = 200
RATE = 500


class Counter:
    """Python calls per thread, counted between :meth:`start` and :meth:`stop` (any thread).

    >>> c = Counter(); c.install(); c.start()
    >>> def f(): pass
    >>> for _ in range(3): f()
    >>> c.stop(); c.uninstall()
    >>> c.by_thread()[threading.current_thread().name] >= 3
    True
    """

    def __init__(self) -> None:
        self.on = False
        self.counts: collections.Counter[int] = collections.Counter()

    def _hook(self, frame: Any, event: str, arg: Any) -> None:
        if self.on and event == "call":
            self.counts[threading.get_ident()] += 1

    def install(self) -> None:
        """Count in this thread and in the threads started after (a client's I/O thread)."""
        threading.setprofile(self._hook)
        sys.setprofile(self._hook)

    def uninstall(self) -> None:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]  # None removes the profiler; typeshed wants a function

    def start(self) -> None:
        self.counts.clear()
        self.on = True

    def stop(self) -> None:
        self.on = False

    def by_thread(self) -> dict[str, int]:
        names = {t.ident: t.name for t in threading.enumerate()}
        out: collections.Counter[str] = collections.Counter()
        for ident, n in self.counts.items():
            out[names.get(ident, f"thread {ident}")] += n
        return dict(out)


def _counted(side: str, start: Any, stop: Any, out: Any) -> threading.Thread:
    """Count this process's calls (its threads started from now on too) while the parent
    says so, by a thread that then reports them on ``out``; that thread."""
    counter = Counter()
    counter.install()

    def watch() -> None:
        start.wait()
        counter.start()
        stop.wait()
        counter.stop()
        out.put((side, counter.by_thread()))

    t = threading.Thread(target=watch, name="probe-watch", daemon=True)
    t.start()
    return t


def _broker(data: str, flush: str, ready: Any, start: Any, stop: Any, out: Any) -> None:
    from headwater.broker.run import run_server
    from headwater.broker.server import ServerConfig
    from headwater.storage.store import StoreConfig

    _counted("broker", start, stop, out)
    run_server(data, StoreConfig(flush=flush), ServerConfig(host="127.0.0.1", port=0), on_ready=ready.put)


def _consumer(address: str, total: int, ready: Any, start: Any, stop: Any, out: Any, seen: Any) -> None:
    import headwater

    watcher = _counted("consumer", start, stop, out)
    hw = headwater.connect(address)
    try:
        c = follow_queue(hw)
        ready.put(os.getpid())
        got, deadline = 0, time.monotonic() + 300
        while got < total and time.monotonic() < deadline:
            got += len(c.poll(max_messages=500, timeout_ms=1000))
            seen.value = got
        watcher.join(timeout=300)
    finally:
        hw.close()


def _producer(address: str, total: int, ready: Any, start: Any, stop: Any, out: Any, seen: Any) -> None:
    import headwater

    watcher = _counted("producer", start, stop, out)
    hw = headwater.connect(address)
    try:
        p = hw.producer(linger_ms=0)
        body = b"x" * 100
        ready.put(os.getpid())
        gap = 1 / RATE
        for seq in range(total):
            if seq == WARMUP:
                ready.put("counting")
                start.wait()
                time.sleep(0.2)  # every process's watcher has turned its counter on
            p.send(QUEUE, body)
            deadline = time.monotonic() + 30
            while seen.value <= seq and time.monotonic() < deadline:  # read alone, then the next
                time.sleep(gap)
        p.flush()
        ready.put("done")
        watcher.join(timeout=300)
    finally:
        hw.close()


def run(flush: str = "async", messages: int = MESSAGES) -> dict[str, Any]:
    """Python calls per counted message: ``{side: {thread name: calls}}`` and the count."""
    ctx = mp.get_context("spawn")
    total = WARMUP + messages
    with tempfile.TemporaryDirectory(prefix="hw-calls-") as d:
        ready, out = ctx.Queue(), ctx.Queue()
        # a Value without a lock: reading it calls no Python function in the counted loops
        start, stop, seen = ctx.Event(), ctx.Event(), ctx.Value("q", 0, lock=False)
        procs: list = []
        try:
            broker, address = start_broker(ctx, _broker, (d, flush, ready, start, stop, out), ready, procs)
            for target in (_consumer, _producer):
                proc = ctx.Process(target=target, args=(address, total, ready, start, stop, out, seen), daemon=True)
                proc.start()
                procs.append(proc)
                _get(ready, procs)
            if _get(ready, procs) != "counting":
                raise RuntimeError("the producer did not start counting")
            start.set()
            if _get(ready, procs, 300) != "done":
                raise RuntimeError("the producer did not finish")
            deadline = time.monotonic() + 60
            while seen.value < total:  # the consumer has the last one: stop counting
                if time.monotonic() > deadline or any(p.exitcode not in (None, 0) for p in procs):
                    raise RuntimeError(f"the consumer read {seen.value} of {total} messages")
                time.sleep(0.01)
            stop.set()
            counts = dict(_get(out, procs) for _ in range(3))
            os.kill(broker.pid, signal.SIGTERM)
        finally:
            stop_all(procs)
    return {"flush": flush, "messages": messages, "counts": counts}


def calls(runs: int = 2) -> None:
    for i in range(runs):
        for flush in ("async", "sync"):
            res = run(flush)
            n = res["messages"]
            parts = []
            total = 0.0
            for side in ("producer", "broker", "consumer"):
                threads = {name: c / n for name, c in res["counts"][side].items() if c / n >= 0.5}
                per = sum(threads.values())
                total += per
                detail = ", ".join(f"{name} {c:.0f}" for name, c in sorted(threads.items(), key=lambda kv: -kv[1]))
                parts.append(f"{side} {per:.0f} ({detail})")
            print(
                f"calls {i + 1}, {flush} flush: Python calls per message: "
                + "; ".join(parts)
                + f"; in all {total:.0f}",
                flush=True,
            )
