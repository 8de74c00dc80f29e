"""Network benchmark: Headwater's broker against Redis Streams, NATS JetStream and RabbitMQ.

Run ``python -m bench.network`` from the repository root (about 3 minutes; ``--quick`` about
1.5). ``--render saved.json --markdown`` prints the tables of a saved run again, as markdown
too. Every system runs in the same invocation, on this machine, each server on a free
127.0.0.1 port with its data in a temporary directory under /tmp (removed afterwards), each
driven by its usual Python client from a separate process. Missing servers are installed from
Debian's packages (``apt-get``); missing clients are listed in ``bench/requirements.txt``.

Workloads, for every mode of every system (a mode is a durability setting, see
:mod:`bench.peers`):

- produce: 1 and 4 producer processes (spawned), 100 B and 1 KiB bodies, batches of 500, each
  batch acknowledged before the next; for a fixed time. Figures are messages (and payload MB,
  10**6 bytes) per second over the run.
- consume: stream 0 filled with 100 B messages (batches of 500, untimed), then one fresh
  consumer reads them all; messages per second.
- latency: 2,000 msgs/s of 100 B sent one at a time on a fixed schedule (acks awaited in the
  background) to one consumer in another process; p50 / p99 / max of (time the consumer got
  it - time it was scheduled), CLOCK_MONOTONIC on both sides; and the CPU per message of the
  server, the consumer process and the producer process.

Headwater's ratio to the best peer: ``headwater async`` is compared with the best peer in any
mode, ``headwater sync`` with the best peer among the modes that fsync before acknowledging
(a peer is never held to a weaker guarantee than the Headwater figure it is compared with).
For latency the ratio is Headwater ÷ best (lower is better); for throughput higher is better.
The machine's own limits (raw sequential write, fsync latency, the lateness of a lone thread keeping
the latency schedule; :mod:`bench.machine`) are
measured at the start and the end of the run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench import machine
from bench.peers import SYSTEMS, Mode, Unavailable, driver_class
from bench.peers.base import SPIN_NS, install_signal_handlers, temp_workdir

__all__ = ["Settings", "FULL", "QUICK", "TARGETS", "main"]

BATCH = 500
SIZES = (100, 1024)
PRODUCERS = (1, 4)
LATENCY_RATE = 2000
LATENCY_SIZE = 100
CONSUME_SIZE = 100


@dataclass(frozen=True)
class Settings:
    """How long each workload runs; ``QUICK`` is a smoke run, ``FULL`` the recorded one."""

    name: str
    produce_s: float  # each produce workload, timed
    produce_msgs_max: int  # ... or until this many messages per producer
    consume_msgs_max: int  # messages written for the consume workload
    consume_fill_s: float  # ... or for this long
    consume_read_s: float  # give up reading after this (plus slack)
    latency_s: float  # counted part of each latency run
    raw_write_bytes: int
    fsync_samples: int


FULL = Settings(
    "full",
    produce_s=3.0,
    produce_msgs_max=20_000_000,
    consume_msgs_max=2_000_000,
    consume_fill_s=3.0,
    consume_read_s=30.0,
    latency_s=5.0,
    raw_write_bytes=1 << 30,
    fsync_samples=200,
)
QUICK = Settings(
    "quick",
    produce_s=1.0,
    produce_msgs_max=5_000_000,
    consume_msgs_max=500_000,
    consume_fill_s=1.0,
    consume_read_s=15.0,
    latency_s=2.0,
    raw_write_bytes=256 * machine.MIB,
    fsync_samples=100,
)


def produce_key(producers: int, size: int) -> str:
    return f"produce-p{producers}-{size}B"


CONSUME_KEY = f"consume-{CONSUME_SIZE}B"
LATENCY_KEY = f"latency-{LATENCY_RATE}"


# --------------------------------------------------------------------------- running


def run_system(name: str, settings: Settings, console) -> dict[str, Any]:
    """Set up one system, run every workload in every mode, tear it down (always)."""
    out: dict[str, Any] = {"modes": {}, "version": None, "unavailable": None}
    cls = driver_class(name)
    out["mode_info"] = [asdict(m) for m in cls.modes]
    with temp_workdir(f"hw-bench-{name}-") as workdir:
        driver = cls(workdir, log=lambda msg: console.log(f"{name}: {msg}"))
        try:
            t0 = time.monotonic()
            try:
                driver.setup()
                out["version"] = driver.version()
            except Unavailable as e:
                out["unavailable"] = str(e)
                console.log(f"[yellow]{name}: skipped: {e}[/]")
                return out
            console.log(f"{name}: {out['version']} ready in {time.monotonic() - t0:.1f} s")
            for mode in cls.modes:
                try:
                    driver.use_mode(mode)
                except Unavailable as e:
                    out["modes"][mode.label] = {"unavailable": str(e)}
                    console.log(f"[yellow]{mode.label}: skipped: {e}[/]")
                    continue
                out["modes"][mode.label] = run_mode(driver, mode, settings, console)
        except Exception as e:  # noqa: BLE001 - one system failing must not stop the others
            out["unavailable"] = out["unavailable"] or f"{type(e).__name__}: {e}"
            console.log(f"[red]{name}: failed: {type(e).__name__}: {e}[/]")
        finally:
            driver.teardown()
    return out


def run_mode(driver, mode: Mode, settings: Settings, console) -> dict[str, Any]:
    results: dict[str, Any] = {}

    def record(key: str, fn) -> None:
        try:
            res = fn()
        except Exception as e:  # noqa: BLE001 - reported in the table
            res = {"error": f"{type(e).__name__}: {e}"}
        results[key] = res
        console.log(f"{mode.label} {key}: {_brief(res)}")

    for producers in PRODUCERS:
        for size in SIZES:

            def produce(producers=producers, size=size):
                driver.reset(mode, producers)
                return driver.produce(
                    mode,
                    producers=producers,
                    size=size,
                    batch=BATCH,
                    n=settings.produce_msgs_max,
                    seconds=settings.produce_s,
                )

            record(produce_key(producers, size), produce)

    def consume():
        driver.reset(mode, 1)
        return driver.consume(
            mode,
            size=CONSUME_SIZE,
            batch=BATCH,
            n=settings.consume_msgs_max,
            fill_seconds=settings.consume_fill_s,
            seconds=settings.consume_read_s,
        )

    record(CONSUME_KEY, consume)

    def latency():
        driver.reset(mode, 1)
        return driver.latency(mode, rate=LATENCY_RATE, seconds=settings.latency_s, size=LATENCY_SIZE)

    record(LATENCY_KEY, latency)
    return results


def parse_systems(parser: argparse.ArgumentParser, text: str, known: Iterable[str] = SYSTEMS) -> list[str]:
    """The systems of a comma-separated ``--systems`` value; one not in ``known`` is a usage error."""
    known = list(known)
    systems = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [s for s in systems if s not in known]
    if unknown:
        parser.error(f"unknown system(s) {', '.join(unknown)}; choose from {', '.join(known)}")
    return systems


def cpu_note(cpu: dict[str, float | None], rate: float | None = None) -> str:
    """The CPU a latency run used per message, each side (see :mod:`bench.peers.base`); with
    the ``rate`` the messages went at, also how many of the machine's CPUs the three sides
    kept busy together. On two vCPUs, a pipeline that needs more than one CPU cannot keep up
    on the one left while the hypervisor takes the other, so the host's steal weighs on its
    tail more than on a lighter one's.

    >>> note = cpu_note({"server": 190, "consumer": 120, "producer": 230, "producer_spin": 50}, rate=2000)
    >>> print(note.replace("; ", ";\\n"))
    CPU µs/msg: server 190, consumer 120, producer 230 (of it the benchmark's spin 50);
    in all 540, 1.08 CPUs at 2,000/s
    """

    def us(x: float | None) -> str:
        return "?" if x is None else f"{x:,.0f}"

    out = (
        f"CPU µs/msg: server {us(cpu['server'])}, consumer {us(cpu['consumer'])}, "
        f"producer {us(cpu['producer'])} (of it the benchmark's spin {us(cpu['producer_spin'])})"
    )
    busy = cpus_busy(cpu, rate)
    if busy is not None:
        out += f"; in all {busy * 1e6 / rate:,.0f}, {busy:.2f} CPUs at {rate:,.0f}/s"  # type: ignore[operator]  # rate is a number whenever busy is
    return out


def cpus_busy(cpu: dict[str, float | None], rate: float | None) -> float | None:
    """How many CPUs the three sides of a latency run kept busy together at ``rate`` msgs/s;
    None when a side's figure (or the rate) is unknown."""
    parts = [cpu.get("server"), cpu.get("consumer"), cpu.get("producer")]
    if not rate or any(x is None for x in parts):
        return None
    return sum(parts) * rate / 1e6  # type: ignore[arg-type]  # no part is None past the check above


def latency_note(res: dict[str, Any]) -> str:
    """ "; from the send call p99 1.03 ms; host steal 0.4%": of a latency run, the p99 of the
    time from the producer's send call to the consumer (without the producer's lateness),
    and the share of the machine's CPU time the hypervisor gave to other guests during the
    run (a stolen moment stalls whichever process was running)."""
    out = ""
    if res.get("transit_p99_ms") is not None:
        out += f"; from the send call p99 {res['transit_p99_ms']:.2f} ms"
    share = res.get("steal_share")
    return out if share is None else out + f"; host steal {share:.1%}"


def _brief(res: dict[str, Any]) -> str:
    if "error" in res:
        return f"[red]{res['error']}[/]"
    if "p99_ms" in res:
        return (
            f"p50 {res['p50_ms']:.2f} ms, p99 {res['p99_ms']:.2f} ms, max {res['max_ms']:.2f} ms "
            f"({res['counted']:,} msgs, {res['late_sends']:,} sent >1 ms late"
            + latency_note(res)
            + (f"; {cpu_note(res['cpu_us_per_msg'], res.get('achieved_rate'))}" if res.get("cpu_us_per_msg") else "")
            + ")"
        )
    return f"{res['msgs_per_s']:,.0f} msgs/s, {res['mb_per_s']:,.1f} MB/s ({res['msgs']:,} msgs)"


def measure_machine(settings: Settings) -> dict[str, Any]:
    with temp_workdir("hw-bench-machine-") as d:
        return {
            "write": machine.write_bandwidth(d, total_bytes=settings.raw_write_bytes),
            "fsync": machine.fsync_latency(d, samples=settings.fsync_samples),
            "timer": machine.timer_lateness(rate=LATENCY_RATE, spin_ns=SPIN_NS),
        }


# --------------------------------------------------------------------------- figures


@dataclass
class Column:
    """One figure of a workload: where it comes from and how it reads."""

    header: str
    key: str  # result key
    field: str  # field in the result
    fmt: str
    higher_is_better: bool = True


PRODUCE_COLUMNS = [
    Column("1 prod 100 B\nmsgs/s", produce_key(1, 100), "msgs_per_s", ",.0f"),
    Column("1 prod 1 KiB\nMB/s", produce_key(1, 1024), "mb_per_s", ",.1f"),
    Column("4 prod 100 B\nmsgs/s", produce_key(4, 100), "msgs_per_s", ",.0f"),
    Column("4 prod 1 KiB\nMB/s", produce_key(4, 1024), "mb_per_s", ",.1f"),
]
CONSUME_COLUMNS = [
    Column("100 B\nmsgs/s", CONSUME_KEY, "msgs_per_s", ",.0f"),
    Column("100 B\nMB/s", CONSUME_KEY, "mb_per_s", ",.1f"),
]
LATENCY_COLUMNS = [
    Column("p50 ms", LATENCY_KEY, "p50_ms", ".2f", higher_is_better=False),
    Column("p99 ms", LATENCY_KEY, "p99_ms", ".2f", higher_is_better=False),
    Column("max ms", LATENCY_KEY, "max_ms", ".2f", higher_is_better=False),
]


def figure(results: dict[str, Any], mode_label: str, col: Column) -> float | None:
    res = results.get("modes", {}).get(mode_label, {}).get(col.key)
    if not res or "error" in res:
        return None
    return res.get(col.field)


def all_modes(runs: dict[str, dict[str, Any]]) -> list[tuple[str, Mode, dict[str, Any]]]:
    """(system, mode, that system's results) for every mode of every system run, in order."""
    out = []
    for name, res in runs.items():
        for info in res["mode_info"]:
            out.append((name, Mode(**info), res))
    return out


def best_peer(runs, col: Column, *, fsync_only: bool) -> tuple[float | None, str | None]:
    """The best peer figure of a column (and whose), over all peer modes or fsync-before-ack ones."""
    best: tuple[float | None, str | None] = (None, None)
    for name, mode, res in all_modes(runs):
        if name == "headwater" or (fsync_only and not mode.fsync_before_ack):
            continue
        x = figure(res, mode.label, col)
        if x is None:
            continue
        better = best[0] is None or (x > best[0] if col.higher_is_better else x < best[0])
        if better:
            best = (x, mode.label)
    return best


def headwater_ratio(runs, col: Column, hw_mode: str) -> tuple[float | None, float | None, str | None]:
    """(Headwater's figure, its ratio to the best comparable peer, that peer's mode)."""
    hw = runs.get("headwater")
    hw_x = None if hw is None else figure(hw, hw_mode, col)
    peer_x, peer = best_peer(runs, col, fsync_only=hw_mode == "headwater sync")
    ratio = None if hw_x is None or not peer_x else hw_x / peer_x
    return hw_x, ratio, peer


@dataclass
class Target:
    tid: str
    text: str
    mode: str
    col: Column
    floor: float | None = None  # absolute bound (>= for throughput, <= for latency)
    peer_factor: float | None = None  # also >= this × best peer


TARGETS = [
    Target(
        "N1",
        "1 producer, 100 B ×500, async ≥ 1,000,000 msgs/s and ≥ 3× best peer",
        "headwater async",
        PRODUCE_COLUMNS[0],
        1_000_000,
        3.0,
    ),
    Target("N2", "1 producer, 100 B ×500, sync ≥ 300,000 msgs/s", "headwater sync", PRODUCE_COLUMNS[0], 300_000),
    Target("N3", "1 producer, 1 KiB ×500, async ≥ 300 MB/s", "headwater async", PRODUCE_COLUMNS[1], 300),
    Target("N4", "consume 100 B ≥ 1,000,000 msgs/s", "headwater async", CONSUME_COLUMNS[0], 1_000_000),
    Target("N5", "e2e latency at 2,000 msgs/s, async: p99 ≤ 1 ms", "headwater async", LATENCY_COLUMNS[1], 1.0),
    Target("N6", "e2e latency at 2,000 msgs/s, sync: p99 ≤ 2 ms", "headwater sync", LATENCY_COLUMNS[1], 2.0),
]


def judge(runs, t: Target) -> dict[str, Any]:
    """PASS / MISS / n/a of one target, with the figures it was judged on."""
    hw_x, ratio, peer = headwater_ratio(runs, t.col, t.mode)
    out: dict[str, Any] = {"id": t.tid, "target": t.text, "figure": hw_x, "ratio": ratio, "peer": peer, "verdict": None}
    if hw_x is None:
        return out
    ok = hw_x >= t.floor if t.col.higher_is_better else hw_x <= t.floor
    if t.peer_factor is not None:
        ok = ok and ratio is not None and ratio >= t.peer_factor
    out["verdict"] = ok
    return out


# --------------------------------------------------------------------------- printing


def _fmt(x: float | None, spec: str) -> str:
    return "—" if x is None else format(x, spec)


def render(console, runs: dict[str, dict[str, Any]]) -> None:
    from rich.table import Table

    groups = [
        ("Produce (batches of 500, each acknowledged before the next)", PRODUCE_COLUMNS),
        (f"Consume ({CONSUME_SIZE} B, one consumer, data written beforehand)", CONSUME_COLUMNS),
        (f"End-to-end latency ({LATENCY_RATE:,} msgs/s of {LATENCY_SIZE} B, one at a time)", LATENCY_COLUMNS),
    ]
    for title, cols in groups:
        table = Table(title=title, title_justify="left")
        table.add_column("system / mode")
        table.add_column("fsync\nbefore ack")
        for col in cols:
            table.add_column(col.header, justify="right")
        table.add_column("notes")
        for _name, mode, res in all_modes(runs):
            if res.get("unavailable") and not res["modes"]:
                continue
            cells = [_fmt(figure(res, mode.label, c), c.fmt) for c in cols]
            table.add_row(mode.label, "yes" if mode.fsync_before_ack else "no", *cells, _notes(res, mode.label, cols))
        for name, res in runs.items():
            if res.get("unavailable"):
                table.add_row(name, "", *["—"] * len(cols), f"not run: {res['unavailable']}")
        table.add_section()
        for fsync_only, label in ((False, "best peer (any mode)"), (True, "best peer (fsync before ack)")):
            bests = [best_peer(runs, c, fsync_only=fsync_only) for c in cols]
            table.add_row(
                label,
                "",
                *[_fmt(b[0], c.fmt) for b, c in zip(bests, cols)],
                ", ".join(sorted({b[1] for b in bests if b[1]})),
            )
        for hw_mode, vs in (("headwater async", "best peer"), ("headwater sync", "best fsync peer")):
            ratios = [headwater_ratio(runs, c, hw_mode)[1] for c in cols]
            lower = "" if cols[0].higher_is_better else " (lower is better)"
            table.add_row(
                f"{hw_mode} ÷ {vs}", "", *[_fmt(r, ".2f") + ("×" if r else "") for r in ratios], lower.strip(" ()")
            )
        console.print(table)


def _notes(res: dict[str, Any], mode_label: str, cols: list[Column]) -> str:
    mode_res = res.get("modes", {}).get(mode_label, {})
    if "unavailable" in mode_res:
        return f"not run: {mode_res['unavailable']}"
    notes = []
    for key in dict.fromkeys(c.key for c in cols):
        r = mode_res.get(key) or {}
        if "error" in r:
            notes.append(f"{key}: {r['error']}")
        elif key == LATENCY_KEY and r:
            notes.append(
                f"{r['late_sends']:,} of {r['sent']:,} sent >1 ms late; {r['achieved_rate']:,.0f}/s" + latency_note(r)
            )
            if r.get("cpu_us_per_msg"):
                notes.append(cpu_note(r["cpu_us_per_msg"], r.get("achieved_rate")))
        elif key == CONSUME_KEY and r:
            notes.append(f"{r['msgs']:,} msgs read" + (f"; {r['note']}" if r.get("note") else ""))
    return "; ".join(notes)


def render_targets(console, runs) -> list[dict[str, Any]]:
    from rich.table import Table

    judged = [judge(runs, t) for t in TARGETS]
    table = Table(title="Targets (Headwater over the network)", title_justify="left")
    for col in ("id", "target", "Headwater", "÷ best comparable peer", "verdict"):
        table.add_column(col)
    for t, j in zip(TARGETS, judged):
        verdict = "[yellow]n/a[/]" if j["verdict"] is None else "[green]PASS[/]" if j["verdict"] else "[red]MISS[/]"
        table.add_row(
            t.tid,
            t.text,
            _fmt(j["figure"], t.col.fmt),
            "—" if j["ratio"] is None else f"{j['ratio']:.2f}× ({j['peer']})",
            verdict,
        )
    console.print(table)
    return judged


def markdown(runs: dict[str, dict[str, Any]], judged: list[dict[str, Any]]) -> str:
    """The same tables as GitHub markdown, for docs/benchmarks.md."""
    lines: list[str] = []
    groups = [("Produce", PRODUCE_COLUMNS), ("Consume", CONSUME_COLUMNS), ("End-to-end latency", LATENCY_COLUMNS)]
    for title, cols in groups:
        heads = [c.header.replace("\n", " ") for c in cols]
        lines += [
            f"**{title}**",
            "",
            "| system / mode | fsync before ack | " + " | ".join(heads) + " | notes |",
            "|---|---|" + "---:|" * len(cols) + "---|",
        ]
        for _name, mode, res in all_modes(runs):
            if res.get("unavailable") and not res["modes"]:
                continue
            cells = [_fmt(figure(res, mode.label, c), c.fmt) for c in cols]
            lines.append(
                f"| {mode.label} | {'yes' if mode.fsync_before_ack else 'no'} | "
                + " | ".join(cells)
                + f" | {_notes(res, mode.label, cols)} |"
            )
        for name, res in runs.items():
            if res.get("unavailable"):
                lines.append(f"| {name} | | " + " | ".join("—" for _ in cols) + f" | not run: {res['unavailable']} |")
        for fsync_only, label in ((False, "best peer (any mode)"), (True, "best peer (fsync before ack)")):
            bests = [best_peer(runs, c, fsync_only=fsync_only) for c in cols]
            lines.append(
                f"| *{label}* | | "
                + " | ".join(_fmt(b[0], c.fmt) for b, c in zip(bests, cols))
                + " | "
                + ", ".join(sorted({b[1] for b in bests if b[1]}))
                + " |"
            )
        for hw_mode, vs in (("headwater async", "best peer"), ("headwater sync", "best fsync peer")):
            ratios = [headwater_ratio(runs, c, hw_mode)[1] for c in cols]
            lower = "" if cols[0].higher_is_better else "lower is better"
            lines.append(
                f"| **{hw_mode} ÷ {vs}** | | "
                + " | ".join(_fmt(r, ".2f") + ("×" if r else "") for r in ratios)
                + f" | {lower} |"
            )
        lines.append("")
    lines += ["| target | Headwater | ÷ best comparable peer | verdict |", "|---|---:|---|---|"]
    for t, j in zip(TARGETS, judged):
        verdict = "n/a" if j["verdict"] is None else "**PASS**" if j["verdict"] else "**MISS**"
        ratio = "—" if j["ratio"] is None else f"{j['ratio']:.2f}× ({j['peer']})"
        lines.append(f"| {t.tid}: {t.text} | {_fmt(j['figure'], t.col.fmt)} | {ratio} | {verdict} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.network",
        description="Produce, consume and end-to-end latency of Headwater's broker against Redis "
        "Streams, NATS JetStream and RabbitMQ, all on 127.0.0.1 with data under /tmp. "
        "Missing servers are installed from Debian packages (needs root); clients come "
        "from bench/requirements.txt.",
    )
    parser.add_argument("--quick", action="store_true", help="shorter workloads (a smoke run, not for the record)")
    parser.add_argument(
        "--systems",
        metavar="LIST",
        default=",".join(SYSTEMS),
        help=f"comma-separated systems to run (default: {','.join(SYSTEMS)})",
    )
    parser.add_argument("--json", metavar="PATH", help="also save every measurement as JSON to PATH")
    parser.add_argument(
        "--markdown", action="store_true", help="also print the tables as markdown (for docs/benchmarks.md)"
    )
    parser.add_argument("--render", metavar="JSON", help="run nothing: print the tables of a run saved with --json")
    parser.add_argument(
        "--halt-poll-us",
        type=int,
        metavar="US",
        help="for this run, let an idle vCPU poll up to US µs before it halts (the guest "
        "kernel's halt polling; root only), then put the setting back; every system "
        "gets it alike (default: leave the machine as it is)",
    )
    args = parser.parse_args(argv)
    if args.render:
        return _render_saved(Path(args.render), markdown_too=args.markdown)
    systems = parse_systems(parser, args.systems)
    settings = QUICK if args.quick else FULL
    if args.halt_poll_us is not None and not 0 <= args.halt_poll_us <= 10_000:
        parser.error("--halt-poll-us must be from 0 to 10000")
    install_signal_handlers()
    with contextlib.ExitStack() as stack:
        if args.halt_poll_us is not None:
            try:
                stack.enter_context(machine.halt_polling(args.halt_poll_us * 1000))
            except OSError as e:
                parser.error(f"--halt-poll-us: {e}")
        return _run(args, argv, systems, settings)


def _run(args: argparse.Namespace, argv: list[str] | None, systems: list[str], settings: Any) -> int:

    from rich.console import Console

    console = Console() if sys.stdout.isatty() else Console(width=220)
    command = "python -m bench.network " + " ".join(argv if argv is not None else sys.argv[1:])
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    console.print(f"[bold]{command.strip()}[/]  ({settings.name} run, {started}, code at {machine.revision()})")
    with temp_workdir("hw-bench-facts-") as d:
        facts = machine.facts(d)
    console.print(", ".join(f"{k}={v}" for k, v in facts.items()))
    if args.halt_poll_us is not None:
        console.log(f"guest halt polling: up to {args.halt_poll_us} µs for this run (put back at the end)")
    limits = {"start": measure_machine(settings)}
    console.log(_limits_line("machine at start", limits["start"]))

    runs: dict[str, dict[str, Any]] = {}
    t0 = time.monotonic()
    for name in systems:
        runs[name] = run_system(name, settings, console)
    limits["end"] = measure_machine(settings)
    console.log(_limits_line("machine at end", limits["end"]))
    console.log(f"all systems ran in {time.monotonic() - t0:.0f} s")

    render(console, runs)
    judged = render_targets(console, runs)
    console.print(
        _limits_line("machine limits: at start", limits["start"])
        + "; "
        + _limits_line("at end", limits["end"])
        + f"; load average (1 min) at start "
        f"{facts['loadavg_1m']}"
    )
    for name, res in runs.items():
        if res.get("version"):
            console.print(f"{name}: {res['version']}")
    if args.markdown:
        console.print(markdown(runs, judged), markup=False, highlight=False, soft_wrap=True)
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(
            json.dumps(
                {
                    "command": command.strip(),
                    "settings": asdict(settings),
                    "started": started,
                    "revision": machine.revision(),
                    "facts": facts,
                    "limits": limits,
                    "systems": runs,
                    "targets": judged,
                },
                indent=1,
                default=str,
            )
        )
        console.print(f"saved {path}")
    return 0


def _render_saved(path: Path, *, markdown_too: bool) -> int:
    from rich.console import Console

    saved = json.loads(path.read_text())
    console = Console() if sys.stdout.isatty() else Console(width=220)
    console.print(
        f"[bold]{saved['command']}[/]  ({saved['settings']['name']} run, {saved['started']}, "
        f"code at {saved['revision']})"
    )
    halt = saved.get("facts", {}).get("guest_halt_poll_ns")
    if halt is not None:
        console.print(
            f"guest halt polling during the run: up to {halt // 1000} µs"
            + (" (idle vCPUs halt at once)" if halt == 0 else "")
        )
    render(console, saved["systems"])
    judged = render_targets(console, saved["systems"])
    console.print(
        _limits_line("machine limits: at start", saved["limits"]["start"])
        + "; "
        + _limits_line("at end", saved["limits"]["end"])
    )
    if markdown_too:
        console.print(markdown(saved["systems"], judged), markup=False, highlight=False, soft_wrap=True)
    return 0


def _limits_line(label: str, lim: dict[str, Any]) -> str:
    line = (
        f"{label}: raw sequential write {lim['write']['mb_per_s']:,.1f} MB/s, fsync 4 KiB "
        f"p50 {lim['fsync']['p50_ms']:.2f} ms / p99 {lim['fsync']['p99_ms']:.2f} ms"
    )
    timer = lim.get("timer")  # runs saved before it was measured have none
    if timer:
        line += (
            f", a lone {LATENCY_RATE:,}/s schedule p99 {timer['p99_ms']:.2f} ms late "
            f"({timer['over_1ms_share']:.1%} of ticks >1 ms late)"
        )
    return line


if __name__ == "__main__":
    sys.exit(main())
