"""Reads without group state: scans by offset, id or time, lookups by id and by key, and the
offset for a time."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from headwater.errors import InvalidArgumentError, MessageNotFoundError
from headwater.http.codec import bytes_of, record_json
from headwater.http.routes import (
    Operation,
    Param,
    base64_param,
    gateway_of,
    int_param,
    json_response,
    path_int,
    str_param,
)
from headwater.model.message import MessageId

__all__ = ["OPERATIONS", "SCAN_MESSAGES_MAX"]

#: The most records one read answers (``max`` is capped to it).
SCAN_MESSAGES_MAX = 10_000

_MAX = Param("max", "integer", f"the most records to answer (default 100, at most {SCAN_MESSAGES_MAX})")
_TAGS = Param("tags", "string", "only messages with one of these tags (comma-separated)")
_ENCODING = Param("encoding", "string", "base64: every value and key as base64 (default: text when UTF-8)")


def _tags(request: Request) -> list[str] | None:
    raw = str_param(request, "tags")
    return None if raw is None else [t for t in raw.split(",") if t]


async def _take(scanner: Any, limit: int) -> list[Any]:
    out = []
    async with scanner:
        async for r in scanner:
            out.append(r)
            if len(out) >= limit:
                break
    return out


async def scan_partition(request: Request) -> Response:
    """Records of one partition from ``offset``, a message ``id`` or ``time_ms``."""
    gw = gateway_of(request)
    queue, partition = request.path_params["queue"], path_int(request, "partition")
    limit = int_param(request, "max", 100, low=1, high=SCAN_MESSAGES_MAX)
    offset = int_param(request, "offset", None, low=0)
    start_id = str_param(request, "id")
    time_ms = int_param(request, "time_ms", None, low=0)
    if sum(x is not None for x in (offset, start_id, time_ms)) > 1:
        raise InvalidArgumentError("give one of offset, id and time_ms")
    start: Any = offset
    if start_id is not None:
        mid = MessageId.parse(start_id)
        if mid.partition != partition:
            raise InvalidArgumentError(f"id {start_id} is of partition {mid.partition}, not {partition}")
        start = mid
    scanner = gw.client.scanner(queue, partitions=[partition], start=start, start_time=time_ms, tags=_tags(request))
    records = await _take(scanner, limit)
    b64 = base64_param(request)
    doc: dict[str, Any] = {"records": [record_json(r, b64) for r in records]}
    if records:
        doc["next_offset"] = records[-1].offset + 1
    else:  # read to the end and found nothing (or began past it): the end is where to ask again
        info = await gw.client.admin.describe_queue(queue)
        doc["next_offset"] = next((p.end_offset for p in info.partitions if p.partition == partition), offset)
    return json_response(doc)


async def scan_queue(request: Request) -> Response:
    """Records of a queue by time range (every partition, or ``partitions``), or with a key."""
    gw = gateway_of(request)
    queue = request.path_params["queue"]
    limit = int_param(request, "max", 100, low=1, high=SCAN_MESSAGES_MAX)
    start_ms = int_param(request, "start_time_ms", None, low=0)
    end_ms = int_param(request, "end_time_ms", None, low=0)
    key = str_param(request, "key")
    if key is not None:
        found = await gw.client.find(
            queue,
            bytes_of(key, str_param(request, "key_encoding", "utf-8") or "utf-8", "key"),
            start_time=start_ms,
            end_time=end_ms,
            limit=limit,
        )
        records = list(found)
    else:
        parts_raw = str_param(request, "partitions")
        try:
            parts = None if parts_raw is None else [int(p) for p in parts_raw.split(",") if p]
        except ValueError:
            raise InvalidArgumentError(f"partitions must be numbers separated by commas, got {parts_raw!r}") from None
        scanner = gw.client.scanner(queue, partitions=parts, start_time=start_ms, end_time=end_ms, tags=_tags(request))
        records = await _take(scanner, limit)
    b64 = base64_param(request)
    return json_response({"records": [record_json(r, b64) for r in records]})


async def get_message(request: Request) -> Response:
    """One message by its id."""
    gw = gateway_of(request)
    queue, text = request.path_params["queue"], request.path_params["id"]
    record = await gw.client.get(text)
    if record.queue != queue:
        raise MessageNotFoundError(f"message {text} is not in queue {queue!r} (it is in {record.queue!r})")
    return json_response(record_json(record, base64_param(request)))


async def offset_for_time(request: Request) -> Response:
    """The first offset of a partition appended at or after ``time_ms``."""
    gw = gateway_of(request)
    queue, partition = request.path_params["queue"], path_int(request, "partition")
    time_ms = int_param(request, "time_ms", None, low=0)
    if time_ms is None:
        raise InvalidArgumentError("query parameter time_ms is required (epoch ms)")
    offset = await gw.client.offset_for_time(queue, partition, time_ms)
    return json_response({"partition": partition, "offset": offset})


OPERATIONS = [
    Operation(
        "GET",
        "/queues/{queue}/partitions/{partition}/messages",
        scan_partition,
        "Scan one partition from an offset, a message id or a time",
        "read",
        params=(
            Param("offset", "integer", "the first offset to read (default: the first retained)"),
            Param("id", "string", "start at this message id (of this partition)"),
            Param("time_ms", "integer", "start at the first message appended at or after this time (epoch ms)"),
            _MAX,
            _TAGS,
            _ENCODING,
        ),
        responses={404: "no such queue", 400: "a bad parameter or a partition out of range"},
    ),
    Operation(
        "GET",
        "/queues/{queue}/messages",
        scan_queue,
        "Scan a queue by time range, or find the messages with a key",
        "read",
        params=(
            Param("key", "string", "find the messages with this key (newest retained, oldest first)"),
            Param("key_encoding", "string", "base64 if the key is given as base64"),
            Param("start_time_ms", "integer", "appended at or after (epoch ms)"),
            Param("end_time_ms", "integer", "appended before (epoch ms)"),
            Param("partitions", "string", "only these partitions (comma-separated; default all)"),
            _MAX,
            _TAGS,
            _ENCODING,
        ),
    ),
    Operation(
        "GET",
        "/queues/{queue}/messages/{id}",
        get_message,
        "Look up one message by its id",
        "read",
        params=(_ENCODING,),
        responses={404: "no message with that id is retained in the queue", 400: "not a message id"},
    ),
    Operation(
        "GET",
        "/queues/{queue}/partitions/{partition}/offset",
        offset_for_time,
        "The first offset of a partition appended at or after a time",
        "read",
        params=(Param("time_ms", "integer", "the time (epoch ms)", required=True),),
    ),
]
