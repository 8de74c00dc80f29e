"""A push subscriber process for the crash tests.

    python tests/support/subscriber_proc.py ADDRESS QUEUE NAME LOG_FILE [CHECKPOINT_MS]

Attaches to subscriber NAME of QUEUE; its one listener appends ``<partition> <offset>
<body>`` to LOG_FILE and flushes it (the line survives a SIGKILL of this process: it is in
the kernel's page cache), so the test sees exactly what the listener finished. Runs until
killed.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import headwater  # noqa: E402


def main() -> None:
    address, queue, name, log_file = sys.argv[1:5]
    interval = int(sys.argv[5]) if len(sys.argv) > 5 else 50
    hw = headwater.connect(address, connect_timeout_s=30)
    with open(log_file, "a") as log:
        def record(r) -> None:
            log.write(f"{r.partition} {r.offset} {r.body.decode()}\n")
            log.flush()

        sub = hw.subscribe(queue, name, listeners=[record], credit_messages=50,
                           checkpoint_interval_ms=interval)
        print("subscribed", flush=True)
        while sub.running:
            time.sleep(0.05)
        sub.wait()


if __name__ == "__main__":
    main()
