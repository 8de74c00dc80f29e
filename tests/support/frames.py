"""Frames built by hand, for tests that play a bad or impatient peer below the client."""

from __future__ import annotations

import struct

import msgspec

from headwater.protocol.frames import encode_frame
from headwater.protocol.messages import encode_body


def raw(frame_type: int, api: int, rid: int, body: msgspec.Struct | bytes, data=()) -> bytes:
    """A frame built by hand, bypassing the connection's checks (to play a bad peer)."""
    head = body if isinstance(body, bytes) else encode_body(body)[0]
    return b"".join(encode_frame(frame_type, api, rid, head, list(data)))


def bomb_batch(expands_to_bytes: int, *, codec: str = "zstd", state_size: bool = True) -> bytes:
    """A record batch of one message, a body of zeros, whose compressed payload (a few KiB)
    expands to about ``expands_to_bytes``: a decompression bomb. With ``state_size=False``
    the payload hides how far it expands, so only decoding it (with a limit) can tell."""
    import lz4.frame
    import zstandard
    from crc32c import crc32c

    from headwater.model.batch import COMPRESSION_LZ4, COMPRESSION_ZSTD, HEADER, HEADER_SIZE, MAGIC, BatchPayload

    zeros = msgspec.msgpack.encode(BatchPayload([bytes(expands_to_bytes)], None, None, None))
    if codec == "zstd":
        flag, payload = COMPRESSION_ZSTD, zstandard.ZstdCompressor(write_content_size=state_size).compress(zeros)
    else:
        flag, payload = COMPRESSION_LZ4, lz4.frame.compress(zeros, store_size=state_size)
    fields = [HEADER_SIZE - 4 + len(payload), 0, 0, 0, 0, 0, 0, 0, MAGIC, flag, HEADER_SIZE, 1, len(payload)]
    head = HEADER.pack(*fields, 0, -1, -1, -1, 0, 0, 0)
    body = head[44:] + payload
    return head[:40] + struct.pack("<I", crc32c(body)) + body
