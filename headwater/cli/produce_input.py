"""Where ``headwater produce`` gets its messages: a whole file, or a stream cut at a delimiter,
each piece optionally ``KEY<sep>VALUE`` (kcat's ``-D`` and ``-K``). Everything is bytes:
binary input goes through unchanged.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import BinaryIO

from headwater.errors import InvalidArgumentError

__all__ = ["parse_delimiter", "split_stream", "split_keys", "read_whole", "READ_BYTES", "WHOLE_BYTES_MAX"]

READ_BYTES = 1 << 16  # read the input this much at a time while cutting it
WHOLE_BYTES_MAX = 64 << 20  # --file as one message: past this it cannot be a message anyway

_ESCAPES = {"n": b"\n", "t": b"\t", "r": b"\r", "0": b"\0", "\\": b"\\"}
_ESCAPE_RE = re.compile(r"\\(x[0-9a-fA-F]{2}|.)", re.S)


def parse_delimiter(text: str, what: str) -> bytes:
    r"""A delimiter as bytes: the text, with ``\n``, ``\t``, ``\r``, ``\0``, ``\\`` and
    ``\xHH`` standing for those bytes (a shell passes them as typed).

    >>> parse_delimiter(r"\0", "--delimiter"), parse_delimiter("::", "--key-separator")
    (b'\x00', b'::')
    >>> parse_delimiter(r"\x1e", "--delimiter")
    b'\x1e'
    """

    if not text:
        raise InvalidArgumentError(f"{what}: empty; give one or more characters, e.g. {what} '\\n' or {what} ,")
    out = bytearray()
    at = 0
    for m in _ESCAPE_RE.finditer(text):
        out += text[at : m.start()].encode("utf-8", "surrogateescape")  # typed text, as the shell gave it
        code = m.group(1)
        if code.startswith("x") and len(code) == 3:
            out.append(int(code[1:], 16))
        elif code in _ESCAPES:
            out += _ESCAPES[code]
        else:
            raise InvalidArgumentError(
                f"{what}: unknown escape \\{code} in {text!r}; use \\n \\t \\r \\0 \\\\ or \\xHH"
            )
        at = m.end()
    out += text[at:].encode("utf-8", "surrogateescape")
    return bytes(out)


def split_stream(stream: BinaryIO, delimiter: bytes, *, crlf: bool = False) -> Iterator[bytes]:
    """The pieces of ``stream`` between ``delimiter``\\ s, streamed (the input is read
    :data:`READ_BYTES` at a time). Every delimiter ends a piece, empty pieces too; what
    follows the last delimiter is a piece unless empty (a file that ends in a newline has
    no empty last line). ``crlf``: a ``\\r`` before the delimiter is dropped too (lines)."""
    buffer = b""
    # read1: what has arrived, without waiting for a whole READ_BYTES (a pipe fed slowly, a
    # person typing: each line goes out as it comes, not when 64 KiB have gathered)
    read = getattr(stream, "read1", stream.read)
    while chunk := read(READ_BYTES):
        buffer += chunk
        pieces = buffer.split(delimiter)
        buffer = pieces.pop()
        for piece in pieces:
            yield piece[:-1] if crlf and piece.endswith(b"\r") else piece
    if buffer:
        yield buffer


def read_whole(stream: BinaryIO, what: str) -> bytes:
    """All of ``stream``, as one message; refused past :data:`WHOLE_BYTES_MAX` before it is
    all in memory."""
    data = stream.read(WHOLE_BYTES_MAX + 1)
    if len(data) > WHOLE_BYTES_MAX:
        raise InvalidArgumentError(
            f"{what}: more than {WHOLE_BYTES_MAX:,} bytes, too large for one message; "
            f"split it with --delimiter, or send a reference to it instead"
        )
    return data


def split_keys(pieces: Iterator[bytes], separator: bytes) -> Iterator[tuple[bytes | None, bytes]]:
    """``(key, value)`` of each piece, cut at the first ``separator``; a piece without one
    is a value without a key (as kcat's ``-K``)."""
    for piece in pieces:
        key, sep, value = piece.partition(separator)
        yield (key, value) if sep else (None, piece)
