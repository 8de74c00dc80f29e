"""The embedded tour: what ``make demo`` runs until the Spark pipeline lands.

Creates a queue, produces 100,000 access-log events with a progress bar, scans a time
range with a tag filter, looks messages up by id and by key, and prints a summary table.
Run it with ``python -m headwater.demo.tour [--messages N] [--data DIR]``.
"""

from __future__ import annotations

import argparse
import random
import shutil
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

import headwater
from headwater import Message

PAGES = ["/", "/search", "/cart", "/checkout", "/product/17", "/product/42", "/help", "/login"]
METHODS = ["GET"] * 9 + ["POST"]


def make_event(rng: random.Random, i: int) -> Message:
    user = f"user-{int(rng.paretovariate(1.2)) % 5000}"
    page = PAGES[min(int(rng.expovariate(0.6)), len(PAGES) - 1)]
    status = 200 if rng.random() > 0.03 else rng.choice([404, 500, 503])
    tag = "error" if status >= 500 else ("miss" if status == 404 else "ok")
    line = f'{i} {user} "{rng.choice(METHODS)} {page}" {status} {rng.randint(200, 20000)}'
    return Message(line.encode(), key=user.encode(), tag=tag, properties={"page": page})


def run(messages: int, data: Path, console: Console) -> dict[str, object]:
    rng = random.Random(7)
    summary: dict[str, object] = {}
    with headwater.open(data) as hw:
        hw.admin.create_queue("access-log", partitions=8, ttl_s=86400)
        producer = hw.producer()  # key hash: one user's events stay in order in one partition
        batch = 500
        first_ids = []
        t0 = time.perf_counter()
        marks: list[int] = []
        with Progress(
            TextColumn("[bold]producing"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(), console=console
        ) as bar:
            task = bar.add_task("produce", total=messages)
            for start in range(0, messages, batch):
                n = min(batch, messages - start)
                ids = producer.send_batch("access-log", [make_event(rng, start + j) for j in range(n)])
                if start == 0:
                    first_ids = list(ids[:3])
                if start == messages // 2 // batch * batch:
                    marks.append(int(time.time() * 1000))
                bar.advance(task, n)
        produce_s = time.perf_counter() - t0
        summary["produced"] = messages
        summary["produce rate"] = f"{messages / produce_s:,.0f} msgs/s"

        # scan the second half of the run by time, keeping only server errors
        t0 = time.perf_counter()
        errors = list(hw.scanner("access-log", start_time=marks[0], tags="error"))
        scan_s = time.perf_counter() - t0
        summary["errors in 2nd half (tag scan)"] = len(errors)
        summary["tag scan time"] = f"{scan_s * 1000:.0f} ms"

        t0 = time.perf_counter()
        total = sum(1 for _ in hw.scanner("access-log"))
        full_s = time.perf_counter() - t0
        summary["full scan"] = f"{total:,} msgs in {full_s:.2f} s ({total / full_s:,.0f} msgs/s)"

        rec = hw.get(first_ids[1])
        summary["lookup by id"] = f"{first_ids[1]} -> {rec.body.decode()[:40]}"
        who = rec.key
        assert who is not None
        t0 = time.perf_counter()
        mine = hw.find("access-log", who, limit=100_000)
        summary[f"lookup by key {who.decode()}"] = (
            f"{len(mine)} events in {(time.perf_counter() - t0) * 1000:.1f} ms, all in partition "
            f"{sorted({r.partition for r in mine})}"
        )
        info = hw.admin.describe_queue("access-log")
        summary["partitions (messages each)"] = ", ".join(str(p.end_offset - p.start_offset) for p in info.partitions)
        return summary


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=100_000, help="events to produce (default 100000)")
    ap.add_argument("--data", type=Path, help="data directory (default: a temporary one, removed after)")
    args = ap.parse_args(argv)
    console = Console()
    data = args.data or Path(tempfile.mkdtemp(prefix="headwater-tour-"))
    console.rule("[bold]Headwater embedded tour")
    console.print(f"data directory: {data}")
    try:
        summary = run(args.messages, data, console)
    finally:
        if args.data is None:
            shutil.rmtree(data, ignore_errors=True)
    table = Table(title="Summary", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    for k, v in summary.items():
        table.add_row(k, str(v))
    console.print(table)


if __name__ == "__main__":
    main()
