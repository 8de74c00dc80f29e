"""``headwater metrics``: the broker's Prometheus metrics, as a scrape of ``/metrics`` sees them.

Over the network (``--server``) it prints what the broker has counted since it started. On a
data directory (``--data``) it opens the store, turns its metrics on for this one reading and
prints them: the counters are then zero, but the figures computed when read (consumer lag,
shared groups, delayed messages, partitions) are the directory's own.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from headwater.cli.context import open_client

__all__ = ["metrics"]


def metrics(
    ctx: typer.Context,
    prefix: Annotated[
        str | None,
        typer.Option(
            "--prefix",
            metavar="NAME",
            show_default=False,
            help="Only the metrics whose name begins with this (e.g. headwater_consumer_lag).",
        ),
    ] = None,
) -> None:
    """Print the broker's metrics in the Prometheus text format (docs/metrics.md).

    Examples:

    ```
    headwater --server 127.0.0.1:7070 metrics
    headwater --server 127.0.0.1:7070 metrics --prefix headwater_consumer_lag
    ```
    """
    hw = open_client(ctx, read_only=True)
    enable = getattr(hw.service, "enable_metrics", None)  # an embedded broker: metrics for this reading
    if enable is not None:
        enable()
    text = hw.admin.metrics()
    if prefix:
        text = "".join(line + "\n" for line in text.splitlines() if _named(line, prefix))
    sys.stdout.write(text)


def _named(line: str, prefix: str) -> bool:
    """Whether an exposition line (a sample, or its # HELP / # TYPE) is of a metric named ``prefix...``."""
    if line.startswith("# "):
        parts = line.split(" ", 3)
        return len(parts) > 2 and parts[2].startswith(prefix)
    return line.startswith(prefix)
