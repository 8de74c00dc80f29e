"""The broker keeps freed memory for reuse (headwater.broker.allocator), checked in fresh
interpreters through glibc's own count of mmapped blocks (mallinfo2)."""

from __future__ import annotations

import json
import platform
import subprocess
import sys

import pytest

from headwater.broker.allocator import keep_freed_memory
from headwater.broker.server import ServerConfig
from headwater.errors import InvalidArgumentError

glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="tunes glibc's malloc only")

# allocate and free 1 MiB buffers (a big batch's size); report whether each was mmapped
PROBE = """
import ctypes, json, sys
from headwater.broker.allocator import keep_freed_memory, kept_bytes

class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost").split()]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
tuned = keep_freed_memory(int(sys.argv[1]), environ=json.loads(sys.argv[2]))
mapped = []
for _ in range(20):
    before = libc.mallinfo2().hblks
    buf = bytearray(1 << 20)
    mapped.append(libc.mallinfo2().hblks - before)
    del buf
print(json.dumps({"tuned": tuned, "mapped": mapped, "kept": kept_bytes()}))
"""


def probe(cache_bytes: int, environ: dict[str, str] | None = None) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(cache_bytes), json.dumps(environ or {})],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return json.loads(out.stdout)


@glibc
def test_big_buffers_come_from_the_heap_once_tuned():
    before = probe(0)
    assert not before["tuned"]
    # the control: glibc mmaps the first 1 MiB block (then raises its threshold past it)
    assert before["mapped"][0] == 1
    after = probe(128 * 1024 * 1024)
    assert after["tuned"] and after["kept"] == 128 * 1024 * 1024 and before["kept"] == 0
    assert max(after["mapped"]) == 0, f"1 MiB blocks were still mmapped: {after['mapped']}"


@glibc
@pytest.mark.parametrize("name", ["MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES"])
def test_the_operators_own_tuning_wins(name):
    got = probe(128 * 1024 * 1024, {name: "1"})
    assert not got["tuned"] and got["mapped"][0] == 1


def test_zero_leaves_the_allocator_alone():
    assert keep_freed_memory(0, environ={}) is False


@pytest.mark.parametrize("value", [-1, 2**31])
def test_allocator_cache_bytes_is_checked(value):
    with pytest.raises(InvalidArgumentError, match="allocator_cache_bytes"):
        ServerConfig(allocator_cache_bytes=value).validated()
