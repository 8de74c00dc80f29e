"""What the crash tests' writers write, and how to read a store's layout back.

Content is a pure function of (partition, offset, generation), so a parent process can
recompute every byte a killed child wrote without talking to it, and a message found at
the wrong offset (or a damaged one) can never look right.

Imported by the test modules (as ``tests.support.crashdata``) and by the child scripts beside it
(as ``crashdata``); keep it free of test-framework imports.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import NamedTuple

from headwater.model.batch import decode_header
from headwater.model.message import Message

__all__ = ["BODY_BYTES_MAX", "message_for", "expected_tuple", "record_tuple", "BatchLoc", "read_layout", "parse_acks"]

BODY_BYTES_MAX = 2000
SEGMENT_HEADER_SIZE = 64


def message_for(partition: int, offset: int, generation: int = 0) -> Message | bytes:
    """The message a writer puts at ``offset`` of ``partition``: 0..2000 bytes, sometimes
    with a key and a tag, all derived from a hash of the three numbers."""
    d = hashlib.blake2b(b"%d:%d:%d" % (partition, offset, generation), digest_size=32).digest()
    n = int.from_bytes(d[:2], "little") % (BODY_BYTES_MAX + 1)
    body = (d * (n // 32 + 1))[:n]
    key = b"key-%d" % (d[3] % 8) if d[2] % 4 == 0 else None
    tag = f"tag-{d[5] % 4}" if d[4] % 3 == 0 else None
    if key is None and tag is None:
        return body
    return Message(body, key=key, tag=tag)


def expected_tuple(partition: int, offset: int, generation: int = 0) -> tuple:
    m = message_for(partition, offset, generation)
    if isinstance(m, bytes):
        return (offset, m, None, None)
    return (offset, m.body, m.key, m.tag)


def record_tuple(r) -> tuple:
    return (r.offset, r.body, r.key, r.tag)


class BatchLoc(NamedTuple):
    """One stored batch: which segment file, where in it, and what it holds."""

    segment: int  # index in the sorted segment list
    start: int  # byte offset in the file
    end: int
    partition: int
    base_offset: int
    count: int


def read_layout(log_dir: Path) -> tuple[list[Path], list[BatchLoc]]:
    """Segment files in order and every batch in them (the store must be intact)."""
    paths = sorted(log_dir.glob("*.log"))
    out: list[BatchLoc] = []
    for i, p in enumerate(paths):
        data = p.read_bytes()
        pos = SEGMENT_HEADER_SIZE
        while pos < len(data):
            h = decode_header(data, pos)
            out.append(BatchLoc(i, pos, pos + h.size, h.partition, h.base_offset, h.count))
            pos += h.size
        assert pos == len(data), f"{p} does not end on a batch boundary"
    return paths, out


def parse_acks(text: str) -> tuple[bool, list[tuple[int, int, int]]]:
    """(ready seen, [(partition, base_offset, count), ...]) from an ack file; a last line
    without its newline was being written when the writer died and is ignored."""
    lines = text.split("\n")[:-1]
    ready = False
    acks = []
    for line in lines:
        if line == "ready":
            ready = True
        else:
            p, base, n = line.split()
            acks.append((int(p), int(base), int(n)))
    return ready, acks
