"""The demo's tables: top pages, minute by minute, and the checks."""

from __future__ import annotations

from datetime import UTC, datetime

from rich.table import Table
from rich.text import Text

from headwater.demo.stats import Stats, top_pages

__all__ = ["sparkline", "top_pages_table", "minutes_table", "checks_table"]

_BARS = "▁▂▃▄▅▆▇█"


def sparkline(values: list[int]) -> str:
    """One character per value, scaled to the largest.

    >>> sparkline([0, 1, 2, 4, 8])
    ' ▁▂▄█'
    """
    top = max(values, default=0)
    if top <= 0:
        return " " * len(values)
    return "".join(" " if v <= 0 else _BARS[min(len(_BARS) - 1, (v * len(_BARS) - 1) // top)] for v in values)


def _hhmm(epoch_s: int) -> str:
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%H:%M")


def top_pages_table(stats: Stats, n: int = 10) -> Table:
    """The most viewed pages over the whole log, with their views minute by minute."""
    windows, top = top_pages(stats, n)
    total = sum(v for (w, page), (v, _) in stats.items() if page is None)
    first, last = (_hhmm(windows[0]), _hhmm(windows[-1] + 60)) if windows else ("", "")
    table = Table(title=f"Top pages, {first}–{last} UTC (from queue page-stats)", title_style="bold")
    table.add_column("#", justify="right", style="dim")
    table.add_column("page", style="bold cyan", no_wrap=True)
    table.add_column("views", justify="right")
    table.add_column("share", justify="right")
    table.add_column("per minute", style="green", no_wrap=True)
    table.add_column("peak minute", justify="right", no_wrap=True)
    for rank, (page, views, series) in enumerate(top, 1):
        peak = max(range(len(series)), key=lambda i: series[i])
        table.add_row(
            str(rank),
            page,
            f"{views:,}",
            f"{views / total:.1%}" if total else "-",
            sparkline(series),
            f"{_hhmm(windows[peak])} ({series[peak]:,})",
        )
    return table


def minutes_table(stats: Stats) -> Table:
    """Page views and distinct visitors per one-minute window, with the window's top page."""
    table = Table(title="Minute by minute", title_style="bold")
    table.add_column("minute (UTC)")
    table.add_column("page views", justify="right")
    table.add_column("visitors", justify="right")
    table.add_column("top page", style="cyan")
    best: dict[int, tuple[int, str]] = {}
    for (w, page), (views, _) in stats.items():
        if page is not None and (views, page) > best.get(w, (-1, "")):
            best[w] = (views, page)
    for (w, page), (views, users) in sorted(stats.items(), key=lambda kv: kv[0][0]):
        if page is None:
            top_views, top_page = best.get(w, (0, "-"))
            table.add_row(_hhmm(w), f"{views:,}", f"{users:,}", f"{top_page} ({top_views:,})")
    return table


def checks_table(rows: list[tuple[str, bool, str]]) -> Table:
    """(what, passed, detail) as a table of checks."""
    table = Table(title="Cross-checks", title_style="bold")
    table.add_column("check", no_wrap=True)
    table.add_column("result", justify="center")
    table.add_column("detail")
    for what, ok, detail in rows:
        table.add_row(what, Text("ok", style="bold green") if ok else Text("MISMATCH", style="bold red"), detail)
    return table
