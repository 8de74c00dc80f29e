"""Keep the C allocator from giving a busy broker's freed memory back to the OS.

glibc's ``malloc`` serves a block of 128 KiB or more (a threshold that grows with use, up to
32 MiB) with an ``mmap`` of its own and unmaps it when freed, and it returns the top of its
heap to the OS once more than twice that threshold of it is free. A broker taking 512 KiB
batches allocates and frees several such blocks per batch (the socket reads, the frame, the
batch), so every one of them comes as fresh pages: a page fault and a zeroed page each 4 KiB,
which on a virtual machine can cost the host a fault too (docs/design/storage.md, "The page
cache and the allocator", has the measurements).

:func:`keep_freed_memory` raises both thresholds for the broker process, so blocks below
``MMAP_THRESHOLD_BYTES`` come from the heap and up to ``cache_bytes`` of freed memory stays
mapped for the next request. The price is resident memory: the process keeps its high-water
mark, plus at most ``cache_bytes``, instead of shrinking between bursts. Only the broker
process does this (``headwater serve``); a library must not retune its host application's
allocator, so the client and the embedded store leave it alone.

Nothing is changed when the allocator is not glibc's, or when the environment already tunes
it (``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``, ``GLIBC_TUNABLES``): the
operator's choice wins.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform
from collections.abc import Mapping

__all__ = ["keep_freed_memory", "kept_bytes", "memory_usage", "MMAP_THRESHOLD_BYTES"]

log = logging.getLogger("headwater.server")

MMAP_THRESHOLD_BYTES = 16 * 1024 * 1024  # blocks smaller than this come from the heap (glibc allows 32 MiB)
_M_TRIM_THRESHOLD = -1  # mallopt parameters, from glibc's malloc.h
_M_MMAP_THRESHOLD = -3
_OPERATOR_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")
_kept = 0  # the allocator is the process's: so is what this module did to it


def keep_freed_memory(cache_bytes: int, environ: Mapping[str, str] | None = None) -> bool:
    """Tune glibc's allocator as the module docstring says; True when it was changed.

    ``cache_bytes`` 0 leaves the allocator alone.
    """
    env = os.environ if environ is None else environ
    if cache_bytes <= 0 or any(name in env for name in _OPERATOR_SETTINGS):
        return False
    if platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    keep = min(cache_bytes, 2**31 - 1)  # mallopt takes an int
    # mallopt returns 1 on success, 0 for a value out of range
    done = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
    done = mallopt(_M_TRIM_THRESHOLD, keep) == 1 and done
    if not done:
        log.warning("could not tune the allocator (mallopt refused); freed memory goes back to the OS")
    global _kept
    _kept = keep if done else 0
    return done


def kept_bytes() -> int:
    """The freed memory this process's allocator keeps, as tuned here (0: not tuned)."""
    return _kept


def memory_usage() -> dict[str, int]:
    """This process's resident memory now and at its peak, in bytes (``/proc/self/status``;
    on systems without it, only the peak, from ``getrusage``)."""
    try:
        with open("/proc/self/status") as f:
            kib = {k: int(v.split()[0]) for k, v in (line.split(":", 1) for line in f) if k in ("VmRSS", "VmHWM")}
        return {"memory_rss_bytes": kib["VmRSS"] * 1024, "memory_peak_bytes": kib["VmHWM"] * 1024}
    except (OSError, KeyError, ValueError):
        import resource
        import sys

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
        return {"memory_peak_bytes": peak if sys.platform == "darwin" else peak * 1024}
