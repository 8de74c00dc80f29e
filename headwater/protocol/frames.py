"""Frames: the length-prefixed, checksummed unit of the wire protocol.

Every frame, in both directions, is a 20-byte header and a body. All integers are
little-endian, like the record batch format, so one byte order holds from disk to wire::

    offset size field       notes
     0      4   length      bytes after this field: 16 + body size
     4      4   crc         CRC32C (Castagnoli) of bytes [8, 4 + length): all that follows
     8      1   frame_type  see FrameType
     9      1   flags       0 in protocol version 1; any other value is an error
    10      2   api_key     the operation (REQUEST, RESPONSE, ERROR); 0 otherwise
    12      4   request_id  chosen by the client, echoed in the answer; 0: the connection
    16      4   data_size   bytes of record batch data at the end of the body
    20      -   body        head: one msgpack array (16 + body - data_size - 16 bytes),
                            then data: record batches exactly as stored (data_size bytes)

The whole frame (``4 + length`` bytes) may not exceed the receiver's ``frame_bytes_max``;
a reader rejects an oversized frame from its first four bytes, before buffering the body.
Record batches travel after the head, outside msgpack, so the broker appends a produced
batch and serves stored batches without re-encoding them, and a sender can hand the
transport a list of buffers (:func:`encode_frame`) instead of one joined copy.

Thread-safety: :class:`FrameReader` is for one connection in one thread; the functions
are pure.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from enum import IntEnum
from typing import NamedTuple

import crc32c as _crc32c

from headwater.protocol.errors import FrameTooLargeError, RemoteProtocolError

__all__ = [
    "HEADER",
    "HEADER_SIZE",
    "FRAME_BYTES_MAX_DEFAULT",
    "FRAME_BYTES_MIN",
    "FrameType",
    "FrameHeader",
    "Frame",
    "FrameReader",
    "encode_frame",
    "encode_frame_sized",
    "Buffer",
    "encode_plain_frame",
]

Buffer = bytes | bytearray | memoryview

HEADER = struct.Struct("<IIBBHII")  # length, crc, frame_type, flags, api_key, request_id, data_size
HEADER_SIZE = HEADER.size
assert HEADER_SIZE == 20
_AFTER_LENGTH = HEADER_SIZE - 4  # header bytes counted by ``length``
_CRC_START = 8  # the crc covers everything from here to the end of the frame
_U32_MAX = 2**32 - 1
_LENGTH = struct.Struct("<I")

#: Default bound on a whole frame: the largest record batch (64 MiB) plus room for the
#: header and the msgpack head around it.
FRAME_BYTES_MAX_DEFAULT = 64 * 1024 * 1024 + 64 * 1024
#: No peer may announce a limit below this: every handshake and error frame must fit.
FRAME_BYTES_MIN = 4096


class FrameType(IntEnum):
    HANDSHAKE = 1  # client -> server, first frame of a connection
    HANDSHAKE_ACCEPTED = 2  # server -> client, answer to the handshake
    REQUEST = 3  # client -> server
    RESPONSE = 4  # server -> client, the answer to one request
    ERROR = 5  # an error answer to one request, or (request id 0) to the whole connection
    PUSH = 6  # server -> client, a delivery on a stream the client opened (subscriptions)


class FrameHeader(NamedTuple):
    length: int
    crc: int
    frame_type: int
    flags: int
    api_key: int
    request_id: int
    data_size: int

    @property
    def size(self) -> int:
        """Bytes of the whole frame."""
        return 4 + self.length

    @property
    def head_size(self) -> int:
        """Bytes of the msgpack head of the body."""
        return self.length - _AFTER_LENGTH - self.data_size


class Frame(NamedTuple):
    """One received frame: its header, its msgpack head and its batch data."""

    header: FrameHeader
    head: bytes
    data: bytes


# plain ints for the per-frame checks: constructing or comparing FrameType members is slower
_HANDSHAKE, _HANDSHAKE_ACCEPTED, _REQUEST, _RESPONSE, _ERROR, _PUSH = (int(t) for t in FrameType)
assert (_HANDSHAKE, _PUSH) == (1, 6) and len(FrameType) == 6
_TAIL = struct.Struct("<BBHII")  # the header after length and crc: what the crc starts with
#: Frames up to this size are copied out of the buffer in one piece, which costs less than
#: the memoryviews that spare bigger frames (record batches) a second copy.
_SMALL_FRAME_BYTES = 1024
_new_tuple = tuple.__new__  # FrameHeader._make, Frame(...) without their Python-level calls


def encode_frame(
    frame_type: int, api_key: int, request_id: int, head: bytes, data: Sequence[Buffer] = ()
) -> list[Buffer]:
    """The frame as a list of buffers to write in order: header, head, then each data buffer.

    The data buffers are not copied; their checksum is computed in place.
    """
    return encode_frame_sized(frame_type, api_key, request_id, head, data)[0]


def encode_frame_sized(
    frame_type: int, api_key: int, request_id: int, head: bytes, data: Sequence[Buffer] = ()
) -> tuple[list[Buffer], int]:
    """:func:`encode_frame`, and the size of the whole frame in bytes."""
    data_size = 0
    for d in data:
        # len() is the byte count only for bytes and bytearray; a store's batches are memoryviews
        if isinstance(d, memoryview):
            data_size += d.nbytes
        else:
            data_size += len(d) if type(d) is bytes or type(d) is bytearray else memoryview(d).nbytes
    length = _AFTER_LENGTH + len(head) + data_size
    if length > _U32_MAX - 4:
        raise OverflowError(f"a frame of {length + 4} bytes cannot be framed")
    crc = _crc32c.crc32c(_TAIL.pack(frame_type, 0, api_key, request_id, data_size))
    crc = _crc32c.crc32c(head, crc)
    for d in data:
        crc = _crc32c.crc32c(d, crc)
    header = HEADER.pack(length, crc, frame_type, 0, api_key, request_id, data_size)
    return [header, head, *data], length + 4


def encode_plain_frame(frame_type: int, api_key: int, request_id: int, head: bytes) -> tuple[list[Buffer], int]:
    """:func:`encode_frame_sized` of a frame without data (one Python call, where that
    makes two more for its data loop's generality: a one-message produce's answer)."""
    length = _AFTER_LENGTH + len(head)
    if length > _U32_MAX - 4:
        raise OverflowError(f"a frame of {length + 4} bytes cannot be framed")
    crc = _crc32c.crc32c(head, _crc32c.crc32c(_TAIL.pack(frame_type, 0, api_key, request_id, 0)))
    return [HEADER.pack(length, crc, frame_type, 0, api_key, request_id, 0), head], length + 4


class FrameReader:
    """Cuts a byte stream into frames, checking each header as soon as it is complete.

    ``check_header`` is called with every complete header before its body is buffered; it
    raises :class:`RemoteProtocolError` to refuse the frame. Partial input is not an error:
    :meth:`next_frame` returns None until a whole frame is there. Only the buffered tail of
    one frame plus what the caller fed since is ever held.
    """

    def __init__(self, frame_bytes_max: int, check_header: Callable[[FrameHeader], None]) -> None:
        self.frame_bytes_max = frame_bytes_max
        self._check_header = check_header
        #: The bytes fed and not yet cut into frames. The same bytearray for the reader's
        #: life (consumed in place), so a caller may keep it and test it for emptiness
        #: without a call; only the reader writes it.
        self.buffer = self._buf = bytearray()
        self._header: FrameHeader | None = None  # the checked header of the frame in progress
        self.eof = False

    @property
    def frame_bytes_max(self) -> int:
        return self._length_max + 4

    @frame_bytes_max.setter
    def frame_bytes_max(self, value: int) -> None:
        self._length_max = value - 4  # the largest ``length`` field allowed

    @property
    def buffered_bytes(self) -> int:
        return len(self._buf)

    @property
    def frame_in_progress_bytes(self) -> int:
        """The size its length field announces of the frame begun but not whole yet; 0 when
        the buffer holds no frame's length (call it after :meth:`next_frame` returned None).
        A server reserves memory for a big frame from this before its body arrives."""
        buf = self._buf
        return _LENGTH.unpack_from(buf, 0)[0] + 4 if len(buf) >= 4 else 0

    def feed(self, data: Buffer) -> None:
        if data:
            self._buf += data
        else:
            self.eof = True

    def next_frame(self) -> Frame | None:
        """The next whole frame, or None if more bytes are needed (or the stream ended
        cleanly between frames: see :attr:`eof`). Raises :class:`RemoteProtocolError`."""
        buf = self._buf
        if not buf:
            return None  # the usual answer after the last frame; not even EOF is an error here
        h = self._header
        if h is None:
            if len(buf) < HEADER_SIZE:
                if len(buf) >= 4:
                    self._check_length(_LENGTH.unpack_from(buf, 0)[0])
                self._need(HEADER_SIZE)
                return None
            h = _new_tuple(FrameHeader, HEADER.unpack_from(buf, 0))
            if not _AFTER_LENGTH < h[0] <= self._length_max:
                self._check_length(h[0])
            _check_structure(h)
            self._check_header(h)
            self._header = h
        length, crc_expected, _, _, _, _, data_size = h
        size = 4 + length
        if len(buf) < size:
            self._need(size)
            return None
        head_end = size - data_size
        if size <= _SMALL_FRAME_BYTES:
            covered = bytes(buf[_CRC_START:size])
            crc = _crc32c.crc32c(covered)
            if crc == crc_expected:
                head = covered[HEADER_SIZE - _CRC_START : head_end - _CRC_START]
                data = covered[head_end - _CRC_START :] if data_size else b""
        else:
            with memoryview(buf) as mv:
                crc = _crc32c.crc32c(mv[_CRC_START:size])
                if crc == crc_expected:
                    head = mv[HEADER_SIZE:head_end].tobytes()
                    data = mv[head_end:size].tobytes() if data_size else b""
        if crc != crc_expected:
            raise RemoteProtocolError(
                f"frame checksum mismatch (header says {crc_expected:#010x}, the bytes give "
                f"{crc:#010x}): the stream is damaged or out of step"
            )
        del buf[:size]
        self._header = None
        return _new_tuple(Frame, (h, head, data))

    def _check_length(self, length: int) -> None:
        if length < _AFTER_LENGTH + 1:
            raise RemoteProtocolError(
                f"frame length {length} is too small: a frame holds at least a "
                f"{HEADER_SIZE}-byte header and a one-byte head"
            )
        if length + 4 > self.frame_bytes_max:
            raise FrameTooLargeError(
                f"a frame of {length + 4} bytes was announced; the limit is "
                f"{self.frame_bytes_max} bytes (setting frame_bytes_max)"
            )

    def _need(self, size: int) -> None:
        """More bytes are needed; an error if none will come."""
        if self.eof and self._buf:
            raise RemoteProtocolError(
                f"the connection closed in the middle of a frame ({len(self._buf)} of {size} bytes received)"
            )


def _check_structure(h: FrameHeader) -> None:
    """What a header alone must satisfy, whatever the connection's state."""
    length, _, ftype, flags, api_key, request_id, data_size = h
    if not _HANDSHAKE <= ftype <= _PUSH:
        raise RemoteProtocolError(f"unknown frame type {ftype}")
    if ftype == _PUSH and (request_id or not api_key):
        raise RemoteProtocolError(
            "PUSH frames have request id 0 and the api key of the operation that opened the stream"
        )
    if flags:
        raise RemoteProtocolError(f"unknown frame flags {flags:#04x} (version 1 defines none)")
    if length - _AFTER_LENGTH - data_size < 1:
        raise RemoteProtocolError(
            f"data_size {data_size} leaves no room for the msgpack head in a body of {length - _AFTER_LENGTH} bytes"
        )
    connection_level = ftype <= _HANDSHAKE_ACCEPTED
    if connection_level and (api_key or request_id):
        raise RemoteProtocolError(f"{FrameType(ftype).name} frames have api key 0 and request id 0")
    if ftype == _ERROR and request_id == 0 and api_key:
        raise RemoteProtocolError("a connection-level error frame (request id 0) has api key 0")
    if (connection_level or ftype == _ERROR) and data_size:
        raise RemoteProtocolError(f"{FrameType(ftype).name} frames carry no batch data (data_size {data_size})")
    if (ftype == _REQUEST or ftype == _RESPONSE) and request_id == 0:
        raise RemoteProtocolError(f"{FrameType(ftype).name} frames need a request id other than 0")
