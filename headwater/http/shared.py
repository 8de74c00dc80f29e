"""Shared groups over HTTP: receive leased messages from any partition, ack or nack them by
lease id, describe the group.

The gateway holds one shared consumer per (group, queue, member); ``member`` defaults to
``"http"``, so every HTTP client of every gateway acts as one member and a lease received
through one gateway can be settled through another. Give distinct members to see them apart
in ``describe``. A consumer ends when deleted (``DELETE .../members/{member}``) or when no
request used it for the idle timeout, giving back the leases it still held
(:mod:`headwater.http.sessions`). The settings of a consumer
(``visibility_timeout_ms``, ``max_attempts``, ``backoff_ms``) are those of the receive that
made it.
"""

from __future__ import annotations

from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from headwater.http.codec import decode_body, plain, record_json
from headwater.http.routes import Operation, gateway_of, json_response

__all__ = ["OPERATIONS", "ReceiveRequest", "SettleRequest"]


class ReceiveRequest(msgspec.Struct, forbid_unknown_fields=True):
    """Receive up to ``max_messages``, waiting up to ``timeout_ms`` for the first."""

    max_messages: int = 32
    timeout_ms: int = 1000
    member: str = "http"
    visibility_timeout_ms: int = 30_000
    max_attempts: int = 5
    backoff_ms: int = 1_000
    encoding: str = "utf-8"


class SettleRequest(msgspec.Struct, forbid_unknown_fields=True):
    """Ack or nack these leases (nack: ``reason`` and ``delay_ms`` before redelivery)."""

    lease_ids: list[str]
    member: str = "http"
    reason: str = ""
    delay_ms: int | None = None


def _consumer_session(gw: Any, group: str, queue: str, req: ReceiveRequest | SettleRequest) -> Any:
    key = ("shared", group, queue, req.member)
    session = gw.sessions.get(key)
    if session is None:
        settings: dict[str, Any] = {"member": req.member}
        if isinstance(req, ReceiveRequest):
            settings.update(
                visibility_timeout_ms=req.visibility_timeout_ms,
                max_attempts=req.max_attempts,
                backoff_ms=req.backoff_ms,
            )
        session = gw.sessions.add(key, gw.client.shared_consumer(group, queue, **settings))
    return session


async def receive(request: Request) -> Response:
    gw = gateway_of(request)
    group, queue = request.path_params["group"], request.path_params["queue"]
    body = await request.body()
    req = decode_body(body, ReceiveRequest) if body.strip() else ReceiveRequest()
    session = _consumer_session(gw, group, queue, req)
    async with gw.sessions.using(session) as c:
        got = await c.receive(req.max_messages, req.timeout_ms)
    b64 = req.encoding == "base64"
    deliveries = [
        {**record_json(d.record, b64), "lease_id": d.lease_id, "attempt": d.attempt, "deadline_ms": d.deadline_ms}
        for d in got
    ]
    return json_response({"member": req.member, "deliveries": deliveries})


async def _settle(request: Request, nack: bool) -> Response:
    gw = gateway_of(request)
    group, queue = request.path_params["group"], request.path_params["queue"]
    req = decode_body(await request.body(), SettleRequest)
    session = _consumer_session(gw, group, queue, req)
    async with gw.sessions.using(session) as c:
        if nack:
            await c.nack(req.lease_ids, req.reason, req.delay_ms)
        else:
            await c.ack(req.lease_ids)
    return json_response({"nacked" if nack else "acked": len(req.lease_ids)})


async def ack(request: Request) -> Response:
    return await _settle(request, nack=False)


async def nack(request: Request) -> Response:
    return await _settle(request, nack=True)


async def end_session(request: Request) -> Response:
    """End the gateway's shared consumer of ``member``: the leases it holds go back to the
    group (delivered again after their visibility timeout), and its place among the
    gateway's sessions is free."""
    gw = gateway_of(request)
    group, queue, member = (request.path_params[k] for k in ("group", "queue", "member"))
    key = ("shared", group, queue, member)
    gw.sessions.require(key, f"shared consumer {member!r} of group {group!r} on queue {queue!r}")
    await gw.sessions.remove(key)
    return Response(status_code=204)


async def describe(request: Request) -> Response:
    gw = gateway_of(request)
    group, queue = request.path_params["group"], request.path_params["queue"]
    return json_response(plain(await gw.client.service.shared_describe(group, queue)))


_BASE = "/shared/{group}/queues/{queue}"
OPERATIONS = [
    Operation(
        "POST",
        _BASE + "/receive",
        receive,
        "Receive leased messages of a shared group",
        "shared",
        request=ReceiveRequest,
    ),
    Operation(
        "POST",
        _BASE + "/ack",
        ack,
        "Ack leased messages: done",
        "shared",
        request=SettleRequest,
        responses={409: "a lease expired or is another member's (the first refusal's error)"},
    ),
    Operation(
        "POST",
        _BASE + "/nack",
        nack,
        "Nack leased messages: deliver again after a backoff",
        "shared",
        request=SettleRequest,
        responses={409: "a lease expired or is another member's"},
    ),
    Operation("GET", _BASE, describe, "A shared group's leases, retries and dead letters", "shared"),
    Operation(
        "DELETE",
        _BASE + "/members/{member}",
        end_session,
        "End the gateway's shared consumer of a member (its leases go back to the group)",
        "shared",
        status=204,
        responses={404: "the gateway holds no consumer of that member (deleted, expired, or never made)"},
    ),
]
