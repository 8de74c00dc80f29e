"""A keyed group member process for the resize tests.

    python tests/support/keyed_member.py ADDRESS MEMBER SIZE LOG_FILE

Joins keyed group ``g`` of queue ``clicks`` as ``MEMBER`` of ``SIZE``; for every record it
processes it appends ``<CLOCK_MONOTONIC ns> <key> <seq> <member>`` to LOG_FILE (flushed), and
commits after each poll. Exits 0 once the group retired it (a resize below its index).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import headwater  # noqa: E402


def main() -> None:
    address, member, size, log_file = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    hw = headwater.connect(address, connect_timeout_s=30)
    c = hw.keyed_consumer("g", "clicks", member=member, size=size, refresh_ms=20)
    deadline = time.monotonic() + 180
    with open(log_file, "a") as log:
        while not c.retired and time.monotonic() < deadline:
            for r in c.poll(timeout_ms=200):
                key, _, seq = r.body.rpartition(b":")
                log.write(f"{time.monotonic_ns()} {key.decode()} {int(seq)} {member}\n")
            log.flush()
            c.commit()
    c.close()
    hw.close()
    sys.exit(0 if c.retired else 3)


if __name__ == "__main__":
    main()
