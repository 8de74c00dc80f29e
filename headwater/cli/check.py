"""``headwater check``: verify every segment of a data directory and cut what is damaged."""

from __future__ import annotations

import typer
from rich.table import Table

import headwater
from headwater.cli.context import LocalData, local_data_state, out_console
from headwater.errors import NotADataDirectoryError, UsageError

__all__ = ["check"]


def check(ctx: typer.Context, data: LocalData = None) -> None:
    """Verify every batch of every segment (both checksums, offsets) and repair the store.

    Damaged bytes are cut at the first bad batch of their segment and indexes that do not
    match are rebuilt; everything before the damage stays. Run it with the broker stopped:
    it needs the data directory to itself.

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
    for k in ("segments", "bytes", "queues", "partitions"):
        table.add_row(k, f"{st[k]:,}")
    repairs = st["recovery"]
    table.add_row("repairs", "\n".join(repairs) if repairs else "none: every batch is intact")
    out_console().print(table)
