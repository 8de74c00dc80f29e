"""A member of a shared group in its own process, for the multi-process tests and the benchmark.

    python shared_member.py ADDRESS GROUP QUEUE OUT_FILE STOP_FILE [JSON_OPTIONS]

Receives until STOP_FILE exists (and nothing more comes) or ``deadline_s`` passes. Every
message body is ``kind:number``; what the member does depends on the kind and the attempt:

- ``ok``: ack (the benchmark sleeps ``work_ms`` first)
- ``nack1``: nack on the first attempt, ack later ones
- ``timeout1``: on the first attempt do nothing (the lease runs out), ack later ones
- ``poison``: always nack with reason "poison pill"

Each line of OUT_FILE is an event, flushed at once so a SIGKILL loses at most the line being
written: ``D partition offset attempt body`` when a message is delivered, ``A partition
offset attempt`` after its ack returned, ``N ...`` after a nack returned, ``U ...`` when an
ack's fate is unknown (the connection broke), ``R ...`` when an ack was refused.
"""

from __future__ import annotations

import json
import os
import sys
import time

import headwater
from headwater.errors import LeaseError, UnavailableError


def main() -> None:
    address, group, queue, out_path, stop_path = sys.argv[1:6]
    opts = json.loads(sys.argv[6]) if len(sys.argv) > 6 else {}
    work_s = opts.get("work_ms", 0) / 1000
    deadline = time.monotonic() + opts.get("deadline_s", 120)
    idle_after_stop_s = opts.get("idle_after_stop_s", 0.5)
    batch = opts.get("max_messages", 16)
    out = open(out_path, "a", buffering=1)  # noqa: SIM115 - line-buffered, flushed per event
    hw = _connect(address, deadline)
    c = hw.shared_consumer(
        group,
        queue,
        visibility_timeout_ms=opts.get("visibility_timeout_ms", 30_000),
        max_attempts=opts.get("max_attempts", 5),
        backoff_ms=opts.get("backoff_ms", 100),
        at_most_once=opts.get("at_most_once", False),
    )
    last_got = time.monotonic()
    while time.monotonic() < deadline:
        try:
            msgs = c.receive(max_messages=batch, timeout_ms=200)
        except UnavailableError:
            time.sleep(0.1)  # the broker is restarting: the client reconnects on the next call
            continue
        if msgs:
            last_got = time.monotonic()
        elif os.path.exists(stop_path) and time.monotonic() - last_got > idle_after_stop_s:
            break
        to_ack = []
        for m in msgs:
            r = m.record
            out.write(f"D {r.partition} {r.offset} {m.attempt} {r.body.decode()}\n")
            kind = r.body.split(b":")[0]
            if work_s:
                time.sleep(work_s)
            if kind == b"poison" or (kind == b"nack1" and m.attempt == 1):
                _settle(out, "N", [m], lambda ms: c.nack(ms, "poison pill" if kind == b"poison" else "try again"))  # noqa: B023 (called at once, within this iteration)
            elif kind == b"timeout1" and m.attempt == 1:
                pass  # let the lease run out
            else:
                to_ack.append(m)
        if to_ack and not opts.get("at_most_once"):
            _settle(out, "A", to_ack, c.ack)
    out.close()
    os._exit(0)  # no goodbyes: the test reads the file


def _settle(out, tag: str, msgs, fn) -> None:
    try:
        fn(msgs)
    except UnavailableError:
        for m in msgs:
            out.write(f"U {m.record.partition} {m.record.offset} {m.attempt}\n")
        return
    except LeaseError as e:
        refused = {x.lease_id for x in getattr(e, "refused", [])}
        for m in msgs:
            ok = m.lease_id not in refused
            out.write(f"{tag if ok else 'R'} {m.record.partition} {m.record.offset} {m.attempt}\n")
        return
    for m in msgs:
        out.write(f"{tag} {m.record.partition} {m.record.offset} {m.attempt}\n")


def _connect(address: str, deadline: float) -> headwater.Client:
    while True:
        try:
            return headwater.connect(address, connect_timeout_s=2)
        except UnavailableError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


if __name__ == "__main__":
    main()
