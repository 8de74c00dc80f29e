"""Child process of the lock test: open a store, append one message, then hold it open.

Usage: holder.py DATA_DIR READY_FILE

Writes ``"<offset>\\n"`` to READY_FILE once the message is acknowledged, then sleeps until
killed (at most a minute).
"""

from __future__ import annotations

import os
import sys
import time

import headwater


def main() -> None:
    data, ready = sys.argv[1], sys.argv[2]
    hw = headwater.open(data, flush="sync")
    if "q" not in {q.name for q in hw.admin.list_queues()}:
        hw.admin.create_queue("q", partitions=1, ttl_s=None)
    mid = hw.send("q", b"held", partition=0)  # returns once stored
    fd = os.open(ready, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.write(fd, b"%d\n" % mid.offset)
    time.sleep(60)


if __name__ == "__main__":
    main()
