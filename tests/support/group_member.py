"""A consumer group member in its own process, for multi-process tests and the benchmark.

    python -m tests.support.group_member ADDRESS GROUP QUEUE MODE LOG [options]

It polls, writes one line per record to LOG (``R partition offset body``), flushes, commits,
and writes ``C partition offset`` per committed position; assignment changes are logged as
``A``/``V`` lines (``+`` assigned, ``-`` revoked), each line prefixed with a monotonic
timestamp in seconds (``time.monotonic()`` is the same clock in every process of a machine).
It stops cleanly (revoking, committing and leaving) when the file STOP (``--stop``) exists.
"""

from __future__ import annotations

import argparse
import os
import time

import headwater


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("address")
    ap.add_argument("group")
    ap.add_argument("queue")
    ap.add_argument("mode", choices=["clustering", "broadcast"])
    ap.add_argument("log")
    ap.add_argument("--strategy", default="sticky")
    ap.add_argument("--session-ms", type=int, default=3000)
    ap.add_argument("--heartbeat-ms", type=int, default=300)
    ap.add_argument("--handle-ms", type=float, default=0.0, help="time each record takes to handle")
    ap.add_argument("--offsets", default=None, help="broadcast: the local offsets file")
    ap.add_argument("--stop", default=None, help="stop when this file exists")
    ap.add_argument("--max-poll", type=int, default=100)
    args = ap.parse_args()

    hw = headwater.connect(args.address, connect_timeout_s=30)
    log = open(args.log, "a", buffering=1)

    def note(kind: str, tps) -> None:
        log.write(f"{time.monotonic():.6f} {kind} {' '.join(f'{q}:{p}' for q, p in tps)}\n")

    c = hw.consumer(
        group=args.group,
        subscribe=args.queue,
        mode=args.mode,
        strategy=args.strategy,
        session_timeout_ms=args.session_ms,
        heartbeat_interval_ms=args.heartbeat_ms,
        offsets_path=args.offsets,
        client_id=f"proc-{os.getpid()}",
        max_poll_messages=args.max_poll,
        on_assign=lambda tps: note("A", tps),
        on_revoke=lambda tps: note("V", tps),
    )
    log.write(f"{time.monotonic():.6f} M {c.member_id}\n")
    while not (args.stop and os.path.exists(args.stop)):
        recs = c.poll(timeout_ms=100)
        for r in recs:
            if args.handle_ms:
                time.sleep(args.handle_ms / 1000)
            log.write(f"{time.monotonic():.6f} R {r.partition} {r.offset} {r.body.decode()}\n")
        if recs and (args.mode == "clustering" or args.offsets):
            log.flush()
            os.fsync(log.fileno())  # what we commit is on disk first
            c.commit()
            for q, p in c.assignment():
                log.write(f"{time.monotonic():.6f} C {p} {c.position(q, p)}\n")
    c.close()
    log.write(f"{time.monotonic():.6f} E\n")
    log.close()
    hw.close()


if __name__ == "__main__":
    main()
