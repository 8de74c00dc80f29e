"""The Python floor: :mod:`bench.relay` as a subprocess, driven by plain sockets.

Not a peer but a reference for the latency benchmark (``python -m bench.latency`` runs it as
``python floor``): the relay writes each message to a file, pushes it to the subscribers and
acknowledges it, with nothing else a broker does. Its client is as thin as its server: the
sender writes a frame with ``sendall`` from the caller's thread and a second thread reads the
acknowledgements (as the Redis driver's sender does), and the consumer is one thread in
``recv``. So it shows what three Python processes on this machine need to hand a message on
over loopback, in the same minutes as the systems measured, and a tail it shares with them
is the host's. Only the latency workload is defined for it.
"""

from __future__ import annotations

import contextlib
import socket
import sys
from collections.abc import Iterator

from bench.peers.base import HOST, Driver, Mode, PipelinedSender, Unavailable, free_port, port_open, wait_until
from bench.relay import ACK, MESSAGE, SUBSCRIBE, frame, frames_in

__all__ = ["PythonFloor"]

READ_BYTES = 1 << 16
_ACK_BYTES = len(frame(ACK))
_HEAD_BYTES = len(frame(MESSAGE))  # the length and the kind, before a message's body


class PythonFloor(Driver):
    system = "floor"
    modes = (Mode("python floor", "write", False, "after write(2) to a file; nothing else stored", reference=True),)

    def setup(self) -> None:
        self.port = free_port()
        server = self.start_server(
            "relay",
            [
                sys.executable,
                "-m",
                "bench.relay",
                "--port",
                str(self.port),
                "--log",
                str(self.workdir / "relay-messages.bin"),
            ],
        )
        try:
            wait_until(lambda: port_open(self.port), timeout_s=20, what="bench.relay", alive=server.alive)
        except Unavailable as e:
            raise Unavailable(f"{e}; log: {server.log_tail(5)}") from None

    def version(self) -> str:
        return f"bench.relay on Python {sys.version.split()[0]}"

    def reset(self, mode: Mode, streams: int) -> None:
        """Nothing to empty: a subscriber gets the messages sent after it subscribed."""

    def sender(self, mode: Mode, stream: int) -> contextlib.closing:
        return contextlib.closing(_Sender(self.port))

    @contextlib.contextmanager
    def consumer(self, mode: Mode, stream: int) -> Iterator:
        sock = _connect(self.port)
        sock.sendall(frame(SUBSCRIBE))
        held = bytearray()

        def poll(timeout_s: float) -> list[bytes]:
            """The bodies of the messages sent since the subscription, as they come."""
            sock.settimeout(max(timeout_s, 0.001))
            out: list[bytes] = []
            while not out:
                try:
                    data = sock.recv(READ_BYTES)
                except TimeoutError:
                    return out
                if not data:
                    raise ConnectionError("the relay closed the connection")
                held.extend(data)
                taken = 0
                for _, start, taken in frames_in(held, (MESSAGE,)):
                    out.append(bytes(held[start + _HEAD_BYTES : taken]))
                del held[:taken]
            return out

        try:
            yield poll
        finally:
            sock.close()


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection((HOST, port), timeout=30)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


class _Sender(PipelinedSender):
    """Messages written as they come; a second thread counts the acknowledgements."""

    def __init__(self, port: int) -> None:
        self._sock = _connect(port)
        self._held = 0  # bytes of an acknowledgement read in part
        super().__init__("floor-acks")

    def _read_acks(self) -> int:
        data = self._sock.recv(READ_BYTES)
        if not data:
            raise ConnectionError("the relay closed the connection")
        got, self._held = divmod(self._held + len(data), _ACK_BYTES)
        return got

    def _write(self, body: bytes) -> None:
        self._sock.sendall(frame(MESSAGE, body))

    def _interrupt(self) -> None:
        with contextlib.suppress(OSError):  # (a connection already lost)
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the reader if it waits in recv

    def _disconnect(self) -> None:
        self._sock.close()
