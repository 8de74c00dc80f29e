"""The key hash: the partition a keyed message goes to, and the keyed-group member that reads it.

``key_hash(key)`` is CRC32C of the key's bytes followed by MurmurHash3's 32-bit finalizer
(``fmix32``); a producer sends a keyed message to partition ``key_hash(key) % partitions``,
and member ``key_hash(key) % size`` of a keyed group reads it. CRC alone is linear: keys that
differ in a few bits (``user-0`` .. ``user-9``) have CRCs that differ in a few bits too, so
their CRCs modulo a power of two take only some of the values (those ten keys filled two of
four partitions, and eight keys ``0`` .. ``7`` four of eight). The finalizer makes every
output bit depend on every input bit, so the remainders spread like random choices, at the
cost of five integer operations.

The hash is part of the contract between clients in any language (docs/protocol.md gives
the same steps and these test vectors), stable across processes, machines and versions:

>>> key_hash(b""), key_hash(b"123456789"), key_hash(b"user-1")
(0, 2893054412, 2692158969)
>>> sorted({key_hash(f"user-{i}".encode()) % 4 for i in range(10)})
[0, 1, 2, 3]
"""

from __future__ import annotations

from headwater.model.batch import crc32c

__all__ = ["key_hash", "fmix32"]

_M32 = 0xFFFFFFFF


def fmix32(h: int) -> int:
    """MurmurHash3's finalizer: a bijection of 32-bit integers in which each output bit
    depends on every input bit.

    >>> fmix32(0), fmix32(1)
    (0, 1364076727)
    """
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & _M32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & _M32
    return h ^ (h >> 16)


def key_hash(key: bytes) -> int:
    """``fmix32(crc32c(key))``, an unsigned 32-bit integer; 0 for the empty key."""
    return fmix32(crc32c(key))
