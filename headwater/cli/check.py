"""``headwater check``: verify every segment of a data directory and report what is damaged."""

from __future__ import annotations

import typer
from rich.table import Table

import headwater
from headwater.cli.context import LocalData, local_data_state, out_console
from headwater.errors import NotADataDirectoryError, UsageError

__all__ = ["check"]


def check(ctx: typer.Context, data: LocalData = None) -> None:
    """Verify every batch of every segment (both checksums, offsets) and repair the store.

    Damage inside flushed data is skipped and reported with the offsets it held; every
    other message stays readable. A torn tail (bytes written after the last fsync before a
    crash) is cut, and indexes that do not match are rebuilt. Run it with the broker
    stopped: it needs the data directory to itself.

    Example:

    ```
    headwater check --data /var/lib/headwater
    ```
    """
    state = local_data_state(ctx, data)
    if state.server is not None:
        raise UsageError("check works on a data directory; run it where the data is, with --data DIR")
    if not state.data_dir.exists():
        raise NotADataDirectoryError(f"there is no data directory at {str(state.data_dir)!r}")
    with headwater.open(state.data_dir, verify="all") as hw:
        st = hw.status()
    table = Table(title=f"check {state.data_dir}", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    for k in ("segments", "bytes", "queues", "partitions", "damaged_ranges", "damaged_bytes"):
        table.add_row(k.replace("_", " "), f"{st.get(k, 0):,}")
    repairs = st["recovery"]
    table.add_row("repairs", "\n".join(repairs) if repairs else "none: every batch is intact")
    out_console().print(table)
