"""The Python floor: a relay that does the least a Python broker must do, for bench.latency.

It accepts producers and subscribers on TCP. Each message a producer sends is written to one
file with write(2) (no fsync, like Redis's ``appendfsync everysec`` between its fsyncs), pushed
to every subscriber, then acknowledged, on one asyncio loop (uvloop when installed, as
``headwater serve`` uses). It keeps no index, checks no checksum, assigns no offsets and
applies no flow control: the latency of a message through it is what this machine charges
for three Python processes talking over loopback, with nothing of a real broker's work. The
latency benchmark runs it beside Headwater and its peers, to show how much of a tail is the
host's (``docs/benchmarks.md``).

Frames, both ways: a 4-byte little-endian length ``n``, then ``n`` bytes, the first of which
says what the frame is: ``0`` a message (the rest is its body), ``1`` subscribe (a client that
wants every message from now on), ``2`` an acknowledgement (sent by the relay, one per
message, in order). A frame of any other kind, or longer than ``FRAME_BYTES_MAX``, closes
that connection and nothing else.

Run ``python -m bench.relay --port PORT --log FILE``; it prints ``ready`` once it listens on
127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Iterator

__all__ = ["FRAME_BYTES_MAX", "MESSAGE", "SUBSCRIBE", "ACK", "frame", "frames_in", "main"]

MESSAGE, SUBSCRIBE, ACK = 0, 1, 2
FRAME_BYTES_MAX = 1 << 20
_LEN = 4


def frame(kind: int, body: bytes = b"") -> bytes:
    """One frame: the length, the kind, the body."""
    return (len(body) + 1).to_bytes(_LEN, "little") + bytes((kind,)) + body


def frames_in(buf: bytes | bytearray, kinds: tuple[int, ...]) -> Iterator[tuple[int, int, int]]:
    """``(kind, start, stop)`` of each whole frame at the head of ``buf``, in order
    (``buf[start:stop]`` is the frame, its length included); it stops at a frame not yet whole.
    Raises ValueError at a frame whose kind is not one of ``kinds`` or whose length is out of
    bounds: the stream is garbage from there on.

    >>> buf = frame(MESSAGE, b"ab") + frame(SUBSCRIBE) + frame(MESSAGE, b"c")[:-1]
    >>> list(frames_in(buf, (MESSAGE, SUBSCRIBE)))
    [(0, 0, 7), (1, 7, 12)]
    """
    end = len(buf)
    i = 0
    while end - i >= _LEN + 1:
        n = int.from_bytes(buf[i : i + _LEN], "little")
        kind = buf[i + _LEN]
        if not 1 <= n <= FRAME_BYTES_MAX or kind not in kinds:
            raise ValueError(f"a frame of kind {kind} and length {n} at byte {i}")
        if end - i - _LEN < n:
            return
        yield kind, i, i + _LEN + n
        i += _LEN + n


_ACK_FRAME = frame(ACK)
_FROM_CLIENTS = (MESSAGE, SUBSCRIBE)


class _Relay:
    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.subscribers: set[_Peer] = set()


class _Peer(asyncio.Protocol):
    def __init__(self, relay: _Relay) -> None:
        self.relay = relay
        self.transport: asyncio.Transport | None = None
        self.held = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a TCP connection's transport is an asyncio.Transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.relay.subscribers.discard(self)

    def data_received(self, data: bytes) -> None:
        buf = self.held + data if self.held else data
        relay = self.relay
        taken = 0
        try:
            for kind, start, taken in frames_in(buf, _FROM_CLIENTS):
                if kind == MESSAGE:
                    whole = buf[start:taken]
                    os.write(relay.fd, whole)
                    for sub in relay.subscribers:  # pushed before the ack, as headwater serve does
                        sub.transport.write(whole)
                    self.transport.write(_ACK_FRAME)
                else:
                    relay.subscribers.add(self)
        except ValueError:
            self.transport.close()  # garbage: this connection goes, the others stay
            return
        self.held = buf[taken:]


async def serve(port: int, log: str) -> None:
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    relay = _Relay(fd)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Peer(relay), "127.0.0.1", port)
    print("ready", flush=True)
    try:
        await server.serve_forever()
    finally:
        os.close(fd)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.relay",
        description="A relay that writes each message to a file, pushes it to every subscriber and acknowledges "
        "it, and does nothing else: the floor of a Python broker's latency on this machine "
        "(python -m bench.latency runs it as 'python floor').",
    )
    parser.add_argument("--port", type=int, required=True, help="port to listen on, on 127.0.0.1")
    parser.add_argument("--log", required=True, help="file each message is appended to")
    args = parser.parse_args(argv)
    try:
        import uvloop
    except ImportError:
        runner = asyncio.run
    else:
        runner = uvloop.run
    try:
        runner(serve(args.port, args.log))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
