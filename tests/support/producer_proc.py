"""A producer process for crash tests: sends numbered batches, records each acknowledgement.

    python -m tests.support.producer_proc ADDRESS NAME BATCHES ACK_FILE

Each batch holds 10 messages ``NAME-i-j``; after ``send_batch`` returns (acknowledged, so
durable under sync flush) the line ``NAME-i`` is appended to ACK_FILE and flushed.
"""

from __future__ import annotations

import sys

import headwater


def main() -> None:
    address, name, batches, ack_file = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    hw = headwater.connect(address, connect_timeout_s=60, request_timeout_s=30)
    p = hw.producer(retries=100, retry_backoff_ms=50, delivery_timeout_ms=120_000)
    with open(ack_file, "a") as acks:
        for i in range(batches):
            p.send_batch("crash", [f"{name}-{i}-{j}".encode() for j in range(10)], partition=i % 4)
            acks.write(f"{name}-{i}\n")
            acks.flush()
    p.close()
    hw.close()


if __name__ == "__main__":
    main()
