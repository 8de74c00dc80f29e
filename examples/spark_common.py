"""Shared by the spark_*.py examples: a broker to talk to and a SparkSession that knows
format("headwater").

Each example takes ``--servers HOST:PORT`` to use a running broker (``headwater serve``);
without it, the example starts a broker of its own on a free port over a temporary data
directory, and stops it at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path


def arguments(description: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--servers", help="a running broker, HOST:PORT (default: start one)")
    return parser.parse_args()


@contextlib.contextmanager
def broker(servers: str | None) -> Iterator[str]:
    """The address of a broker: ``servers`` as given, or one started here for the example."""
    if servers:
        yield servers
        return
    data = Path(tempfile.mkdtemp(prefix="headwater-example-"))
    exe = Path(sys.executable).with_name("headwater")
    proc = subprocess.Popen(
        [str(exe), "--data", str(data / "data"), "serve", "--port", "0"], stdout=subprocess.PIPE, text=True
    )
    try:
        for line in proc.stdout:  # type: ignore[union-attr]  # started with stdout=PIPE
            if line.startswith("listening "):
                port = line.split()[1].rsplit(":", 1)[1]
                break
        else:
            raise RuntimeError("the broker did not start")
        # keep reading what the broker prints, so a full pipe never blocks it
        threading.Thread(target=proc.stdout.read, daemon=True).start()  # type: ignore[union-attr]  # started with stdout=PIPE
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(data, ignore_errors=True)


def spark_session(app: str):
    """A local SparkSession with format("headwater") registered.

    Spark's Python workers must run this interpreter (where headwater is installed), and on
    a laptop Spark should bind to loopback: both are set before the JVM starts."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    import headwater.spark

    spark = (
        SparkSession.builder.appName(app)
        .master("local[2]")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    headwater.spark.register(spark)
    return spark
