"""Frames built by hand, for tests that play a bad or impatient peer below the client."""

from __future__ import annotations

import msgspec

from headwater.protocol.frames import encode_frame
from headwater.protocol.messages import encode_body


def raw(frame_type: int, api: int, rid: int, body: msgspec.Struct | bytes, data=()) -> bytes:
    """A frame built by hand, bypassing the connection's checks (to play a bad peer)."""
    head = body if isinstance(body, bytes) else encode_body(body)[0]
    return b"".join(encode_frame(frame_type, api, rid, head, list(data)))
