"""The broker's client of another broker (``headwater.broker.peer``), against a real server:
FETCH returns the stored batches as a store's fetch does (what a move's target appends with
``append_copy``), a long poll waits for data, errors the peer answers are raised as theirs,
and a peer that is gone or silent is a PeerError within the deadline."""

from __future__ import annotations

import socket
import time

import pytest

from headwater.broker.peer import PeerClient, PeerError
from headwater.errors import QueueNotFoundError
from headwater.model.batch import decode_header, encode_batch
from headwater.model.config import QueueConfig
from tests.support.broker_process import free_port


def test_fetch_and_describe_return_what_the_store_holds(server):
    server.broker.create_queue("orders", QueueConfig(partitions=2))
    for i in range(3):
        server.broker.produce("orders", 1, bytes(encode_batch([b"m%d" % i, b"n%d" % i])))
    with PeerClient(server.address, name="test-peer") as peer:
        info = peer.describe_queue("orders")
        assert [(p.start_offset, p.end_offset) for p in info.partitions] == [(0, 0), (0, 6)]
        res = peer.fetch("orders", 1, 0, max_bytes=1 << 20)
        assert [decode_header(raw).base_offset for raw in res.batches] == [0, 2, 4] and res.end_offset == 6
        assert [bytes(r) for r in res.batches] == [
            bytes(r) for r in server.broker.store.fetch("orders", 1, 0, max_bytes=1 << 20).batches
        ]
        started = time.monotonic()
        empty = peer.fetch("orders", 0, 0, max_bytes=1024, max_wait_ms=300)
        assert empty.batches == [] and time.monotonic() - started >= 0.25  # a long poll
        with pytest.raises(QueueNotFoundError):
            peer.fetch("nope", 0, 0, max_bytes=1024)
        assert peer.fetch("orders", 1, 6, max_bytes=1024).batches == []  # usable after an error


def test_a_peer_that_is_gone_or_silent_is_a_peer_error():
    with pytest.raises(PeerError, match="cannot be reached"):
        PeerClient(f"127.0.0.1:{free_port()}", connect_timeout_s=2)
    with pytest.raises(ValueError, match="host:port"):
        PeerClient("nowhere")
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(1)  # accepts, never answers the handshake
    try:
        started = time.monotonic()
        with pytest.raises(PeerError, match="did not answer in time"):
            PeerClient(f"127.0.0.1:{silent.getsockname()[1]}", connect_timeout_s=0.5)
        assert time.monotonic() - started < 5
    finally:
        silent.close()
