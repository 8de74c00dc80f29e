"""``POST /v1/queues/{queue}/messages``: produce one message or a batch."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from headwater.errors import InvalidArgumentError, MessageTooLargeError
from headwater.http.codec import MessageIn, ProduceBatch, bytes_of
from headwater.http.routes import Operation, gateway_of, json_response
from headwater.model.delay import SECONDS_LOOK
from headwater.model.message import Message, MessageId

__all__ = ["OPERATIONS", "BATCH_MESSAGES_MAX"]

#: The most messages one request may carry (a bound on what one request holds in memory).
BATCH_MESSAGES_MAX = 10_000


def _messages(raw: bytes) -> list[MessageIn]:
    """The messages of a produce body: ``{"messages": [...]}`` or one message object."""
    try:
        doc = msgspec.json.decode(raw)
    except msgspec.DecodeError as e:
        raise InvalidArgumentError(f"the request body is not valid JSON: {e}") from None
    try:
        if isinstance(doc, dict) and "messages" in doc:
            batch = msgspec.convert(doc, ProduceBatch).messages
        else:
            batch = [msgspec.convert(doc, MessageIn)]
    except msgspec.ValidationError as e:
        raise InvalidArgumentError(f"bad request body: {e}") from None
    if not batch:
        raise InvalidArgumentError("messages is empty: send at least one message")
    if len(batch) > BATCH_MESSAGES_MAX:
        raise InvalidArgumentError(f"messages holds {len(batch)} messages; at most {BATCH_MESSAGES_MAX} a request")
    return batch


def _deliver_at_ms(m: MessageIn, i: int, now_ms: int, warnings: list[str]) -> int | None:
    if m.delay_ms is not None and m.deliver_at_ms is not None:
        raise InvalidArgumentError(f"$.messages[{i}]: give delay_ms or deliver_at_ms, not both")
    if m.delay_ms is not None:
        if m.delay_ms < 0:
            raise InvalidArgumentError(f"$.messages[{i}].delay_ms must be 0 or more, got {m.delay_ms}")
        return now_ms + m.delay_ms if m.delay_ms else None
    at = m.deliver_at_ms
    if at is not None and SECONDS_LOOK[0] <= at < SECONDS_LOOK[1]:
        # told to the caller, who made the mistake (the client's warning would go to this
        # process's log), and the time taken as past, so the client warns no more
        warnings.append(
            f"$.messages[{i}].deliver_at_ms={at} looks like epoch seconds: it is taken as epoch "
            f"milliseconds, a moment in January 1970, so the message went at once; send milliseconds, "
            f"or delay_ms"
        )
        return None
    return at


def _receipt(mid: MessageId) -> dict[str, Any]:
    """What a produce answers per message: where it went. A delayed message has no offset
    in its partition yet: its id (for lookups and cancel) names its place in the schedule."""
    if mid.is_delayed:
        return {"partition": mid.target_partition, "offset": None, "id": str(mid), "delayed": True}
    return {"partition": mid.partition, "offset": mid.offset, "id": str(mid)}


async def produce(request: Request) -> Response:
    gw = gateway_of(request)
    queue = request.path_params["queue"]
    raw = await request.body()
    if len(raw) > gw.body_bytes_max:
        raise MessageTooLargeError(f"the request body is {len(raw)} bytes; at most {gw.body_bytes_max}")
    batch = _messages(raw)
    now_ms = int(time.time() * 1000)
    # messages that share a partition choice and a delivery time go in one send_batch (one
    # record batch per partition); the groups are sent concurrently
    groups: dict[tuple[int | None, int | None], list[int]] = {}
    messages: list[Message] = []
    warnings: list[str] = []
    for i, m in enumerate(batch):
        where = f"$.messages[{i}]" if len(batch) > 1 else "$"
        key = None if m.key is None else bytes_of(m.key, m.key_encoding, f"{where}.key")
        body = bytes_of(m.value, m.encoding, f"{where}.value")
        messages.append(Message(body, key, m.tag, m.properties))
        groups.setdefault((m.partition, _deliver_at_ms(m, i, now_ms, warnings)), []).append(i)
    producer = gw.producer
    sends = [
        producer.send_batch(queue, [messages[i] for i in idx], partition=part, deliver_at=at)
        for (part, at), idx in groups.items()
    ]
    results = await asyncio.gather(*sends)
    receipts: list[dict[str, Any]] = [{}] * len(batch)
    for idx, ids in zip(groups.values(), results):
        for i, mid in zip(idx, ids):
            receipts[i] = _receipt(mid)
    return json_response({"results": receipts, "warnings": warnings} if warnings else {"results": receipts})


OPERATIONS = [
    Operation(
        "POST",
        "/queues/{queue}/messages",
        produce,
        'Produce one message (a message object) or a batch ({"messages": [...]}); answers each '
        "message's partition, offset and id, in order",
        "produce",
        request=ProduceBatch,
        responses={400: "a bad body or field", 404: "no such queue", 413: "a message or the body is too large"},
    )
]
