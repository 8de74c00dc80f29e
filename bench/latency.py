"""End-to-end latency in alternating rounds: every system under the same noise.

``python -m bench.network`` measures each system's latency once, one system after another, so
a few seconds of a noisy host (another tenant's burst, a stolen vCPU) land on whichever
system happens to run then. This benchmark runs the same latency workload (2,000 msgs/s of
100 B, sent one at a time, :meth:`bench.peers.base.Driver.latency`) in short rounds, and in
every round it runs every chosen system and mode once, in a rotating order, right after a
check of the machine's own scheduling noise. The comparison that counts is per round: the
systems of one round ran within the same half minute.

Two yardsticks of the machine come with every round. The lone timer is one thread waking on
the same schedule with nothing else to do; the share of its ticks more than 1 ms late is the
tail a single process gets from the scheduler. ``python floor`` (system ``floor``, on by
default) is :mod:`bench.relay`: a Python relay that writes each message to a file, pushes it
to its subscriber and acknowledges it, with thin socket clients
(:mod:`bench.peers.floor`). It does the least any broker written in Python must do, so its
p99 is about the best three Python processes get here in that minute. It is no one's peer:
the ratios leave it out.

Headwater runs twice: ``headwater`` through the blocking client, ``headwater-aio`` through
the asyncio client (``headwater.aio``; its producer and consumer each on one event loop,
:mod:`bench.peers.latency_run`), both against the same kind of broker.

Run ``python -m bench.latency`` from the repository root (about 4 minutes with the default
systems; ``--rounds`` and ``--seconds`` change that; ``--rate`` runs another schedule, to see
how much of the tail follows the load; ``--spin-us 0`` paces the producer by sleeping alone,
to see how much of it follows the CPU the producer burns spinning to its send times;
``--halt-poll-us 500`` lets idle vCPUs poll that long before they halt, for this run only, to
see how much of it is waking halted vCPUs, for every system alike). It
prints every round, then per system and mode the median, best and worst of the rounds' p99,
and per round Headwater's p99 over the best peer's (async against every peer mode, sync
against the peer modes that fsync before acknowledging, as in :mod:`bench.network`).
``--pool A.json B.json ...`` runs nothing: it reads runs saved with ``--json`` and shows, per
system and mode, the median p99 of the runs in each band of the host's CPU steal, so that runs
of many minutes say together how each system's tail follows the host's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench import machine
from bench.network import LATENCY_RATE, LATENCY_SIZE, cpu_note, cpus_busy, latency_note, parse_systems
from bench.peers import LATENCY_ONLY, REFERENCES, SYSTEMS, Unavailable, driver_class
from bench.peers.base import SPIN_NS, install_signal_handlers, temp_workdir

__all__ = ["main", "run_rounds", "summarize"]

DEFAULT_SYSTEMS = "headwater,headwater-aio,redis,floor"
# a run is "quiet" when the hypervisor took at most this share of the machine's CPU time
# from it (/proc/stat's steal; counted in 10 ms ticks, so 0.2% of a 5 s run on 2 CPUs is 2)
QUIET_STEAL_SHARE = 0.002


def run_rounds(
    entries: list[tuple[str, Any, Any]],
    *,
    rounds: int,
    seconds: float,
    rate: int = LATENCY_RATE,
    spin_ns: int = SPIN_NS,
    log=print,
) -> list[dict[str, Any]]:
    """``entries``: (label, driver, mode), drivers set up. One dict per round: the timer
    check (on the same schedule and pacing) and each label's latency result at ``rate``
    msgs/s, its producer spinning the last ``spin_ns`` before each send (0: sleeping only)."""
    out: list[dict[str, Any]] = []
    for r in range(rounds):
        timer = machine.timer_lateness(rate=rate, seconds=1.0, spin_ns=spin_ns)
        shift = r % len(entries)
        order = entries[shift:] + entries[:shift]  # nobody always runs first or last
        results: dict[str, Any] = {}
        for label, driver, mode in order:
            try:
                driver.use_mode(mode)
                driver.reset(mode, 1)
                results[label] = driver.latency(mode, rate=rate, seconds=seconds, size=LATENCY_SIZE, spin_ns=spin_ns)
            except Exception as e:  # noqa: BLE001 - reported in the table
                results[label] = {"error": f"{type(e).__name__}: {e}"}
        out.append({"round": r + 1, "timer": timer, "order": [label for label, _, _ in order], "results": results})
        log(_round_line(out[-1]))
    return out


def _tail(res: dict[str, Any]) -> str:
    """ " p99.9 X max Y" of a latency result, as far as it has them (the tail the issue asks for)."""
    return "".join(f" {name} {res[key]:.2f}" for name, key in (("p99.9", "p999_ms"), ("max", "max_ms")) if key in res)


def _round_line(rnd: dict[str, Any]) -> str:
    parts = [f"round {rnd['round']}: lone timer {rnd['timer']['over_1ms_share']:.1%} of ticks >1 ms late"]
    for label in rnd["order"]:
        res = rnd["results"][label]
        if "error" in res:
            parts.append(f"{label}: {res['error'][:60]}")
        else:
            cpu = f"; {cpu_note(res['cpu_us_per_msg'], res.get('achieved_rate'))}" if res.get("cpu_us_per_msg") else ""
            parts.append(
                f"{label}: p50 {res['p50_ms']:.2f} p99 {res['p99_ms']:.2f}{_tail(res)} ms "
                f"({res['late_sends']} sent >1 ms late{latency_note(res)}{cpu})"
            )
    return " | ".join(parts)


def summarize(rounds: list[dict[str, Any]], modes: dict[str, Any]) -> dict[str, Any]:
    """Per label the rounds' p99 (median, min, max); per Headwater label and round, its p99
    over the best comparable peer's in that round."""
    labels = list(modes)
    per_label: dict[str, dict[str, float | None]] = {}
    for label in labels:
        runs = [r["results"][label] for r in rounds if "p99_ms" in r["results"].get(label, {})]
        if runs:
            p99s = [res["p99_ms"] for res in runs]
            quiet = [
                res["p99_ms"]
                for res in runs
                if res.get("steal_share") is not None and res["steal_share"] <= QUIET_STEAL_SHARE
            ]
            per_label[label] = {
                "median": statistics.median(p99s),
                "min": min(p99s),
                "max": max(p99s),
                "rounds": len(p99s),
                "quiet_median": statistics.median(quiet) if quiet else None,
                "quiet_rounds": len(quiet),
            }
    ratios: dict[str, list[float | None]] = {}
    compared: dict[str, list[str]] = {}
    for hw in (lb for lb in labels if lb.startswith("headwater")):
        peers = [
            lb
            for lb in labels
            if not lb.startswith("headwater")
            and not modes[lb].reference
            and (modes[lb].fsync_before_ack or not modes[hw].fsync_before_ack)
        ]
        compared[hw] = peers
        series: list[float | None] = []
        for r in rounds:
            mine = r["results"].get(hw, {}).get("p99_ms")
            theirs = [r["results"][p]["p99_ms"] for p in peers if "p99_ms" in r["results"].get(p, {})]
            series.append(mine / min(theirs) if mine is not None and theirs else None)
        ratios[hw] = series
    return {"p99": per_label, "ratio_to_best_peer": ratios, "peers_compared": compared}


# steal bands of --pool: each holds the runs whose steal share is below its bound
STEAL_BANDS = (0.002, 0.01, 0.05, 0.15, 1.0)


def pool_by_steal(saved: list[dict[str, Any]]) -> dict[str, list[list[dict[str, Any]]]]:
    """Per system and mode, the results of every run in ``saved`` (``--json`` files'
    contents), sorted into :data:`STEAL_BANDS` by the host's steal during the run (failed runs
    and runs whose steal is unknown are left out): how each system's tail follows the host's.

    >>> runs = {"rounds": [{"results": {"a": {"p99_ms": 0.9, "steal_share": 0.001},
    ...                                 "b": {"p99_ms": 3.0, "steal_share": 0.2}}}]}
    >>> {label: [len(band) for band in bands] for label, bands in pool_by_steal([runs]).items()}
    {'a': [1, 0, 0, 0, 0], 'b': [0, 0, 0, 0, 1]}
    """
    out: dict[str, list[list[dict[str, Any]]]] = {}
    for doc in saved:
        for rnd in doc["rounds"]:
            for label, res in rnd["results"].items():
                steal = res.get("steal_share")
                if "p99_ms" not in res or steal is None:
                    continue
                band = next(i for i, bound in enumerate(STEAL_BANDS) if steal < bound or bound == STEAL_BANDS[-1])
                out.setdefault(label, [[] for _ in STEAL_BANDS])[band].append(res)
    return out


def render_pool(console, pooled: dict[str, list[list[dict[str, Any]]]], sources: list[str]) -> None:
    """The pooled runs: p99 and p50 per band of steal (median, and in brackets the runs),
    the p99 of each run in the quietest band, and the CPUs each pipeline kept busy."""
    from rich.table import Table

    low = 0.0
    heads = []
    for bound in STEAL_BANDS:
        heads.append(f"< {bound:.1%}" if not low else f"{low:.1%} to {bound:.1%}" if bound < 1 else f"≥ {low:.1%}")
        low = bound
    origin = f"from {len(sources)} saved run(s) of code at {', '.join(sorted(set(sources)))}"
    for key, what in (("p99_ms", "p99"), ("p50_ms", "p50")):
        t = Table(
            title=f"{what} of end-to-end latency by the host's CPU steal during the run, ms: median (runs), {origin}"
        )
        t.add_column("system / mode")
        for head in heads:
            t.add_column(f"steal {head}", justify="right")
        for label, bands in pooled.items():
            t.add_row(label, *(f"{statistics.median(r[key] for r in b):.2f} ({len(b)})" if b else "-" for b in bands))
        console.print(t)
    t = Table(title="the quietest runs, and what each pipeline costs")
    t.add_column("system / mode")
    t.add_column(f"p99 of each run at steal {heads[0]}, ms", justify="right")
    t.add_column("CPUs busy at the runs' rate:\nmedian (runs)", justify="right")
    for label, bands in pooled.items():
        quiet = ", ".join(f"{r['p99_ms']:.2f}" for r in sorted(bands[0], key=lambda r: r["p99_ms"])) or "-"
        busy = [
            x
            for b in bands
            for r in b
            if (x := cpus_busy(r.get("cpu_us_per_msg") or {}, r.get("achieved_rate"))) is not None
        ]
        t.add_row(label, quiet, f"{statistics.median(busy):.2f} ({len(busy)})" if busy else "-")
    console.print(t)


def _p99_cell(res: dict[str, Any]) -> str:
    """ "2.31 (0.4%)": a run's p99 and the host's steal during it."""
    if "p99_ms" not in res:
        return "error"
    share = res.get("steal_share")
    return f"{res['p99_ms']:.2f}" + ("" if share is None else f" ({share:.2%})")


def render(console, rounds: list[dict[str, Any]], summary: dict[str, Any], rate: int = LATENCY_RATE) -> None:
    from rich.table import Table

    t = Table(
        title=f"p99 of end-to-end latency per round ({rate:,} msgs/s of {LATENCY_SIZE} B), ms "
        "(in brackets: the host's CPU steal during the run)"
    )
    t.add_column("round")
    t.add_column("lone timer\n>1 ms late", justify="right")
    labels = list(rounds[0]["results"]) if rounds else []
    for label in labels:
        t.add_column(label, justify="right")
    for hw in summary["ratio_to_best_peer"]:
        t.add_column(f"{hw}\n÷ best peer", justify="right")
    for i, r in enumerate(rounds):
        cells = [str(r["round"]), f"{r['timer']['over_1ms_share']:.1%}"]
        for label in labels:
            res = r["results"][label]
            cells.append(_p99_cell(res))
        for series in summary["ratio_to_best_peer"].values():
            cells.append(f"{series[i]:.2f}" if series[i] is not None else "-")
        t.add_row(*cells)
    console.print(t)
    s = Table(title="p99 over the rounds, ms")
    quiet_head = f"median of quiet runs\n(steal ≤ {QUIET_STEAL_SHARE:.1%})"
    for h in ("system / mode", "median", "best", "worst", "rounds", quiet_head):
        s.add_column(h, justify="left" if h == "system / mode" else "right")
    for label, v in summary["p99"].items():
        quiet = "-" if v.get("quiet_median") is None else f"{v['quiet_median']:.2f} ({v['quiet_rounds']} runs)"
        s.add_row(label, f"{v['median']:.2f}", f"{v['min']:.2f}", f"{v['max']:.2f}", str(v["rounds"]), quiet)
    console.print(s)
    for hw, series in summary["ratio_to_best_peer"].items():
        got = [x for x in series if x is not None]
        if got:
            peers = ", ".join(summary["peers_compared"][hw])
            console.print(
                f"{hw} ÷ best peer ({peers}), per round: median {statistics.median(got):.2f} "
                f"(best {min(got):.2f}, worst {max(got):.2f})"
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.latency",
        description="End-to-end latency at 2,000 msgs/s (or --rate) in alternating rounds: every chosen system "
        "and mode runs once per round, in a rotating order, so they share the host's "
        "noise. Servers are set up as in bench.network.",
    )
    parser.add_argument(
        "--systems",
        metavar="LIST",
        default=DEFAULT_SYSTEMS,
        help=f"comma-separated systems (default: {DEFAULT_SYSTEMS}; "
        f"choose from {', '.join([*SYSTEMS, *LATENCY_ONLY])}; and 'floor', bench.relay: the least a "
        f"Python broker does, a yardstick of the machine and nobody's peer)",
    )
    parser.add_argument("--rounds", type=int, default=5, help="rounds to run (default: 5)")
    parser.add_argument("--seconds", type=float, default=5.0, help="counted seconds of each latency run (default: 5)")
    parser.add_argument(
        "--rate",
        type=int,
        default=LATENCY_RATE,
        help=f"messages per second (default: {LATENCY_RATE:,}, the issue's workload)",
    )
    parser.add_argument(
        "--spin-us",
        type=int,
        default=None,
        metavar="US",
        help=f"the producer (and the lone timer) sleeps until this close to each send time, "
        f"then spins (default: {SPIN_NS // 1000}, at most half the send interval); 0 sleeps "
        f"only, with the kernel's timer slack at 1 ns: no CPU burnt waiting, sends a little late",
    )
    parser.add_argument(
        "--halt-poll-us",
        type=int,
        metavar="US",
        help="for this run, let an idle vCPU poll up to US µs before it halts (the guest "
        "kernel's halt polling, /sys/module/haltpoll/parameters/guest_halt_poll_ns; "
        "root only), then put the setting back; every system gets it alike "
        "(default: leave the machine as it is)",
    )
    parser.add_argument("--json", metavar="PATH", help="also save the rounds as JSON to PATH")
    parser.add_argument(
        "--pool",
        metavar="PATH",
        nargs="+",
        help="run nothing: read runs saved with --json and show each system's p99 by the "
        "host's CPU steal during the run",
    )
    args = parser.parse_args(argv)
    from rich.console import Console

    console = Console() if sys.stdout.isatty() else Console(width=200)
    if args.pool:
        saved = []
        for path in args.pool:
            try:
                saved.append(json.loads(Path(path).read_text()))
            except (OSError, ValueError) as e:
                parser.error(f"cannot read {path}: {e}")
        render_pool(console, pool_by_steal(saved), [doc.get("revision", "unrecorded") for doc in saved])
        return 0
    systems = parse_systems(parser, args.systems, [*SYSTEMS, *LATENCY_ONLY, *REFERENCES])
    if args.rounds < 1 or args.seconds <= 0 or args.rate < 1:
        parser.error("--rounds and --rate must be at least 1 and --seconds above 0")
    if args.spin_us is None:  # at --rate 20000 a send is due every 50 µs: spin for half of it
        args.spin_us = min(SPIN_NS // 1000, 1_000_000 // args.rate // 2)
    if not 0 <= args.spin_us < 1_000_000 // args.rate:
        parser.error(
            f"--spin-us must be from 0 to below the send interval ({1_000_000 // args.rate} µs at --rate {args.rate})"
        )
    if args.halt_poll_us is not None and not 0 <= args.halt_poll_us <= 10_000:
        parser.error("--halt-poll-us must be from 0 to 10000")
    install_signal_handlers()
    command = "python -m bench.latency " + " ".join(argv if argv is not None else sys.argv[1:])
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    rev = machine.revision()
    console.print(f"[bold]{command.strip()}[/]  ({started}, code at {rev})")
    with contextlib.ExitStack() as stack:
        if args.halt_poll_us is not None:
            try:
                before = stack.enter_context(machine.halt_polling(args.halt_poll_us * 1000))
            except OSError as e:
                parser.error(f"--halt-poll-us: {e}")
            console.log(
                f"guest halt polling: up to {args.halt_poll_us} µs for this run (it was "
                f"{before // 1000} µs; put back at the end)"
            )
        entries: list[tuple[str, Any, Any]] = []
        modes: dict[str, Any] = {}
        for name in systems:
            cls = driver_class(name)
            workdir = stack.enter_context(temp_workdir(f"hw-bench-latency-{name}-"))
            driver = cls(workdir, log=lambda msg, name=name: console.log(f"{name}: {msg}"))
            stack.callback(driver.teardown)
            try:
                driver.setup()
            except Unavailable as e:
                console.log(f"[yellow]{name}: skipped: {e}[/]")
                continue
            console.log(f"{name}: {driver.version()} ready")
            for mode in cls.modes:
                entries.append((mode.label, driver, mode))
                modes[mode.label] = mode
        if not entries:
            console.print("[red]no system could be set up[/]")
            return 1
        halt_poll_ns = machine.halt_poll_ns()
        rounds = run_rounds(
            entries,
            rounds=args.rounds,
            seconds=args.seconds,
            rate=args.rate,
            spin_ns=args.spin_us * 1000,
            log=console.log,
        )
    summary = summarize(rounds, modes)
    render(console, rounds, summary, args.rate)
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(
            json.dumps(
                {
                    "command": command.strip(),
                    "started": started,
                    "revision": rev,
                    "spin_us": args.spin_us,
                    "halt_poll_ns": halt_poll_ns,
                    "rounds": rounds,
                    "summary": summary,
                },
                indent=1,
                default=str,
            )
        )
        console.print(f"saved {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
