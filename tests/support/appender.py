"""Child process of the SIGKILL test: append forever until killed.

Usage: appender.py DATA_DIR ACK_FILE SEED THREADS SEGMENT_BYTES

Opens the store with ``flush="sync"`` and appends batches of 1..50 messages (content from
``crashdata.message_for``) to queue ``q``. Thread ``t`` owns the partitions ``p`` with
``p % THREADS == t``, so it knows each batch's offsets before sending. After every
acknowledged batch it appends ``"<partition> <base_offset> <count>\\n"`` to ACK_FILE with a
single write (O_APPEND: lines of several threads never interleave; the page cache keeps them
when the process is killed). ``"ready\\n"`` is written once the store is open.
"""

from __future__ import annotations

import os
import random
import sys
import threading
import time
import traceback

from crashdata import message_for

import headwater

RUN_S_MAX = 60  # a safety net: the parent kills us long before this


def main() -> None:
    data, ack_path, seed = sys.argv[1], sys.argv[2], sys.argv[3]
    threads, seg_bytes = int(sys.argv[4]), int(sys.argv[5])
    hw = headwater.open(data, flush="sync", segment_bytes_max=seg_bytes)
    info = hw.admin.describe_queue("q")
    n_parts = len(info.partitions)
    ack_fd = os.open(ack_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.write(ack_fd, b"ready\n")
    deadline = time.monotonic() + RUN_S_MAX

    def worker(tid: int) -> None:
        try:
            rng = random.Random(f"{seed}:{tid}")
            owned = [p for p in range(n_parts) if p % threads == tid]
            nxt = {p: info.partitions[p].end_offset for p in owned}
            prod = hw.producer(compression=rng.choice([None, None, "zstd", "lz4"]))
            while time.monotonic() < deadline:
                p = rng.choice(owned)
                k = rng.randint(1, 50)
                msgs = [message_for(p, nxt[p] + i) for i in range(k)]
                ids = prod.send_batch("q", msgs, partition=p)
                if ids[0].offset != nxt[p] or len(ids) != k:
                    sys.stderr.write(f"partition {p}: expected base {nxt[p]}, got {ids[0].offset}\n")
                    sys.stderr.flush()
                    os._exit(3)
                nxt[p] += k
                os.write(ack_fd, b"%d %d %d\n" % (p, ids[0].offset, k))
        except BaseException:  # noqa: BLE001 - any failure must end the child loudly
            traceback.print_exc()
            sys.stderr.flush()
            os._exit(2)

    ts = [threading.Thread(target=worker, args=(t,), daemon=True) for t in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    hw.close()


if __name__ == "__main__":
    main()
