"""A push subscriber process for the crash tests.

    python tests/support/subscriber_proc.py ADDRESS QUEUE NAME LOG_FILE [CHECKPOINT_MS] [--asyncio]

Attaches to subscriber NAME of QUEUE (with ``--asyncio``: an AsyncSubscriber of
``headwater.aio``, whose listener is a coroutine); its one listener appends ``<partition> <offset>
<body>`` to LOG_FILE and flushes it (the line survives a SIGKILL of this process: it is in
the kernel's page cache), so the test sees exactly what the listener finished. Runs until
killed.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import headwater  # noqa: E402


def main() -> None:
    args = [a for a in sys.argv[1:] if a != "--asyncio"]
    address, queue, name, log_file = args[:4]
    interval = int(args[4]) if len(args) > 4 else 50
    if "--asyncio" in sys.argv:
        asyncio.run(main_asyncio(address, queue, name, log_file, interval))
        return
    hw = headwater.connect(address, connect_timeout_s=30)
    with open(log_file, "a") as log:

        def record(r) -> None:
            log.write(f"{r.partition} {r.offset} {r.body.decode()}\n")
            log.flush()

        sub = hw.subscribe(queue, name, listeners=[record], credit_messages=50, checkpoint_interval_ms=interval)
        print("subscribed", flush=True)
        while sub.running:
            time.sleep(0.05)
        sub.wait()


async def main_asyncio(address: str, queue: str, name: str, log_file: str, interval: int) -> None:
    import headwater.aio

    hw = await headwater.aio.connect(address, connect_timeout_s=30)
    with open(log_file, "a") as log:

        async def record(r) -> None:
            await asyncio.sleep(0)  # a coroutine listener, awaited before the next record
            log.write(f"{r.partition} {r.offset} {r.body.decode()}\n")
            log.flush()

        sub = hw.subscribe(queue, name, listeners=[record], credit_messages=50, checkpoint_interval_ms=interval)
        print("subscribed", flush=True)
        await sub.wait()


if __name__ == "__main__":
    main()
