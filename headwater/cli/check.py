"""``headwater check``: verify every segment of a data directory; ``--repair`` mends it."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

import headwater
from headwater.cli.context import LocalData, local_data_state, out_console
from headwater.errors import NotADataDirectoryError, UsageError

__all__ = ["DAMAGE_FOUND", "check"]

#: check's exit status when it found damage that is still there (1: it could not check)
DAMAGE_FOUND = 3

RepairOpt = Annotated[
    bool,
    typer.Option(
        "--repair",
        help="Cut torn tails (copying what is cut to DATA/quarantine/ first), remove half-made "
        "files and rebuild indexes. Without it, check changes nothing.",
    ),
]


def check(ctx: typer.Context, data: LocalData = None, repair: RepairOpt = False) -> None:
    """Verify every batch of every segment (both checksums, offsets); report, or repair.

    Without ``--repair`` the directory is opened read-only and nothing changes: the table
    lists what is damaged and what a repair would do. Damage inside flushed data is never
    cut: it is skipped and reported with the offsets it held, and every other message stays
    readable. ``--repair`` cuts a torn tail (bytes written after the last fsync before a
    crash), copying what it cuts into ``DATA/quarantine/`` first, and rewrites indexes that
    do not match. Run it with the broker stopped: it needs the data directory to itself.

    Exit status: 0 when every batch is intact (or ``--repair`` mended all it found), 3 when
    damage is found and still there (without ``--repair``; with it, damage inside flushed
    data, which is skipped, never cut), 1 when the check could not run.

    Example:

    ```
    headwater check --data /var/lib/headwater
    headwater check --data /var/lib/headwater --repair
    ```
    """
    state = local_data_state(ctx, data)
    if state.server is not None:
        raise UsageError("check works on a data directory; run it where the data is, with --data DIR")
    if not state.data_dir.exists():
        raise NotADataDirectoryError(f"there is no data directory at {str(state.data_dir)!r}")
    with headwater.open(state.data_dir, verify="all", read_only=not repair) as hw:
        st = hw.status()
    table = Table(title=f"check {state.data_dir}" + (" --repair" if repair else ""), show_header=False)
    table.add_column(style="bold")
    table.add_column()
    for k in ("segments", "bytes", "queues", "partitions", "damaged_ranges", "damaged_bytes"):
        table.add_row(k.replace("_", " "), f"{st.get(k, 0):,}")
    found = st["recovery"]
    if found:
        table.add_row("repairs" if repair else "found", "\n".join(found))
    else:
        table.add_row("found", "nothing: every batch is intact")
    out_console().print(table)
    # a script or a cron job tells by the exit status: damage found (and not mended) is 3
    if st.get("damaged_ranges", 0) or (found and not repair):
        raise typer.Exit(DAMAGE_FOUND)
