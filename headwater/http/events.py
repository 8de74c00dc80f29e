"""``GET /v1/queues/{queue}/events``: a queue's records as Server-Sent Events.

Each record is one event (``event: record``, ``data:`` its JSON). Its ``id`` is the position
after it in every partition streamed, ``0:12,1:40`` (partition:next offset, comma-separated),
so a client that reconnects with ``Last-Event-ID`` (browsers' EventSource do it by
themselves) resumes exactly after the last event it got: no gap, no repeat. Without it,
``from`` says where to start: ``earliest`` (default), ``latest``, a time in epoch ms, or
positions ``p:offset,...`` (partitions not named start at ``earliest``). While nothing
arrives, a comment line is sent every ``keepalive_ms`` so proxies keep the stream open.
``max_events`` ends the stream after that many records (for scripts and tests).

A start the queue cannot have (a partition it lacks, a negative offset, an offset past a
partition's end, as a Last-Event-ID of a queue deleted and made again carries) is refused
with 400 before the stream starts; a browser's EventSource does not retry a refusal. An
error once the stream has started (the queue deleted meanwhile) is sent as ``event: error``
with the API's error object as data, and the stream ends.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from headwater.errors import HeadwaterError, InvalidArgumentError
from headwater.http.codec import record_json
from headwater.http.routes import Operation, Param, base64_param, gateway_of, int_param, str_param

__all__ = ["OPERATIONS", "parse_positions", "event_id"]

POLL_MESSAGES = 500

log = logging.getLogger("headwater.http")


def parse_positions(text: str, what: str) -> dict[int, int]:
    """``"0:12,1:40"`` as ``{0: 12, 1: 40}``; InvalidArgumentError naming ``what``.

    >>> parse_positions("0:12, 1:40", "from")
    {0: 12, 1: 40}
    """
    out: dict[int, int] = {}
    for part in text.split(","):
        p, sep, off = part.strip().partition(":")
        try:
            if not sep:
                raise ValueError
            out[int(p)] = int(off)
        except ValueError:
            raise InvalidArgumentError(
                f"{what}: {text!r} is not a list of partition:offset pairs like 0:12,1:40"
            ) from None
    return out


def event_id(positions: dict[int, int]) -> str:
    """The id of an event: every partition's next offset.

    >>> event_id({1: 40, 0: 12})
    '0:12,1:40'
    """
    return ",".join(f"{p}:{o}" for p, o in sorted(positions.items()))


async def _start_positions(client: Any, queue: str, parts: list[int] | None, start: str, what: str) -> dict[int, int]:
    """Where the stream starts in each partition streamed; InvalidArgumentError, before any
    byte is sent, for positions the queue cannot have (a partition it lacks, an offset below
    0 or past a partition's end)."""
    info = await client.admin.describe_queue(queue)
    edges = {p.partition: (p.start_offset, p.end_offset) for p in info.partitions}
    chosen = sorted(edges) if parts is None else parts
    for p in chosen:
        if p not in edges:
            raise InvalidArgumentError(f"partition {p} out of range: {queue!r} has {len(edges)} partitions")
    offline = set(info.offline)  # on a cluster, a leader out of reach: its edges are not known
    if start == "latest" or start.isdigit():
        info.require_online(chosen, f"start streaming {queue!r} from {start}")
    named: dict[int, int] = {}
    if start == "earliest":
        return {p: edges[p][0] for p in chosen}
    if start == "latest":
        return {p: edges[p][1] for p in chosen}
    if start.isdigit():
        return {p: await client.offset_for_time(queue, p, int(start)) for p in chosen}
    named = parse_positions(start, what)
    for p, off in sorted(named.items()):
        if p not in edges:
            raise InvalidArgumentError(
                f"{what} names partition {p}, and {queue!r} has partitions 0..{len(edges) - 1}; "
                f"name only those (or start from earliest)"
            )
        if off < 0:
            raise InvalidArgumentError(f"{what}: offset {off} of partition {p} is negative; offsets start at 0")
        if off > edges[p][1] and p not in offline:  # an offline one's first read at its leader checks
            raise InvalidArgumentError(
                f"{what}: offset {off} of partition {p} is past its end ({edges[p][1]}); the queue may have been "
                f"deleted and made again since: start from earliest or latest, or from an offset up to "
                f"{edges[p][1]}"
            )
    # an offset the partition no longer keeps (retention, truncate) starts at its first kept
    # (an offline partition: where named, else 0; the reads at its leader skip what it lacks)
    return {p: named.get(p, 0) if p in offline else max(edges[p][0], named.get(p, 0)) for p in chosen}


async def events(request: Request) -> Response:
    gw = gateway_of(request)
    queue = request.path_params["queue"]
    parts_raw = str_param(request, "partitions")
    try:
        parts = None if parts_raw is None else [int(p) for p in parts_raw.split(",") if p]
    except ValueError:
        raise InvalidArgumentError(f"partitions must be numbers separated by commas, got {parts_raw!r}") from None
    resume = request.headers.get("last-event-id") or str_param(request, "last_event_id")
    start = resume or str_param(request, "from", "earliest") or "earliest"
    what = "from" if not resume else "Last-Event-ID"
    positions = await _start_positions(gw.client, queue, parts, start, what)
    keepalive_ms = int_param(request, "keepalive_ms", 15_000, low=100, high=300_000)
    max_events = int_param(request, "max_events", None, low=1)
    tags_raw = str_param(request, "tags")
    tags = None if tags_raw is None else [t for t in tags_raw.split(",") if t]
    b64 = base64_param(request)
    consumer = gw.client.consumer(tags=tags)
    try:
        await consumer.assign(queue, list(positions))
        for p, off in positions.items():
            consumer.seek(queue, p, off)
    except BaseException:
        await consumer.close()
        raise
    stream = _stream(consumer, queue, positions, keepalive_ms, max_events, b64)
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(stream, media_type="text/event-stream", headers=headers)


def _error_event(error: Exception, queue: str) -> bytes:
    """An ``event: error`` whose data is the API's error object: what ends a stream that has
    started (its status, 200, is sent already). A Headwater error (the queue deleted, say)
    is the client's to act on; anything else is logged with its trace, as a 500 would be."""
    if isinstance(error, HeadwaterError):
        log.info("the events of %r end: %s", queue, error)
        doc = {"code": error.code, "name": type(error).__name__, "message": str(error), "retriable": error.retriable}
    else:
        log.error("the events of %r end", queue, exc_info=error)
        doc = {"code": 0, "name": "InternalError", "message": f"{type(error).__name__}: {error}", "retriable": False}
    return b"event: error\ndata: %s\n\n" % msgspec.json.encode({"error": doc})


async def _stream(
    consumer: Any, queue: str, positions: dict[int, int], keepalive_ms: int, max_events: int | None, b64: bool
) -> AsyncIterator[bytes]:
    sent = 0
    encode = msgspec.json.encode
    try:
        yield f"retry: 1000\nid: {event_id(positions)}\n\n".encode()
        while max_events is None or sent < max_events:
            want = POLL_MESSAGES if max_events is None else min(POLL_MESSAGES, max_events - sent)
            try:
                got = await consumer.poll(max_messages=want, timeout_ms=keepalive_ms)
            except Exception as e:  # noqa: BLE001 - the answer has started: say it in the stream, end it
                yield _error_event(e, queue)
                return
            if not got:
                yield b": keepalive\n\n"
                continue
            chunks = []
            for r in got:
                positions[r.partition] = r.offset + 1
                chunks.append(
                    b"id: %s\nevent: record\ndata: %s\n\n" % (event_id(positions).encode(), encode(record_json(r, b64)))
                )
            sent += len(got)
            yield b"".join(chunks)
    finally:
        await consumer.close()


OPERATIONS = [
    Operation(
        "GET",
        "/queues/{queue}/events",
        events,
        "Stream a queue's records as Server-Sent Events; the event id resumes (Last-Event-ID)",
        "consume",
        params=(
            Param("from", "string", "earliest (default), latest, a time (epoch ms), or p:offset,..."),
            Param("partitions", "string", "only these partitions (comma-separated)"),
            Param("tags", "string", "only messages with one of these tags (comma-separated)"),
            Param("max_events", "integer", "end the stream after this many records"),
            Param("keepalive_ms", "integer", "a comment this often while nothing arrives (default 15000)"),
            Param("last_event_id", "string", "as the Last-Event-ID header, for clients that cannot set it"),
            Param("encoding", "string", "base64: every value and key as base64"),
        ),
        streams=True,
    )
]
