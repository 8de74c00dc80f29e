"""Consumer group members over HTTP, as Confluent's REST proxy has them: join (the gateway
makes a member and holds it), poll records with long polling, commit offsets, leave.

A member joined here is a real member of the group (an
:class:`~headwater.client.aio.group_consumer.AsyncGroupConsumer` in the gateway): it
heartbeats from the gateway and gets partitions as any other member. It expires when no
request used it for its ``idle_timeout_ms`` (default: the gateway's, 300 s), and then leaves
its group without committing (:mod:`headwater.http.sessions`).
"""

from __future__ import annotations

import uuid

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from headwater.errors import InvalidArgumentError
from headwater.http.codec import decode_body, record_json
from headwater.http.routes import Operation, Param, base64_param, gateway_of, int_param, json_response

__all__ = ["OPERATIONS", "JoinRequest", "CommitRequest"]

POLL_TIMEOUT_MS_MAX = 60_000


class JoinRequest(msgspec.Struct, forbid_unknown_fields=True):
    """Join consumer group ``{group}`` reading ``queues``. ``auto_offset_reset``: where a
    partition without a committed offset starts (``earliest`` or ``latest``)."""

    queues: list[str]
    mode: str = "clustering"
    strategy: str = "average"
    auto_offset_reset: str = "earliest"
    tags: list[str] | None = None
    session_timeout_ms: int = 10_000
    idle_timeout_ms: int | None = None


class OffsetIn(msgspec.Struct, forbid_unknown_fields=True):
    queue: str
    partition: int
    offset: int


class CommitRequest(msgspec.Struct, forbid_unknown_fields=True):
    """Offsets to commit (the next offset to read, per partition); none: every partition's
    position after the records polled so far."""

    offsets: list[OffsetIn] | None = None


def _member_doc(group: str, instance: str, consumer) -> dict:
    return {
        "group": group,
        "member": instance,
        "member_id": consumer.member_id,
        "generation": consumer.generation,
        "assignment": [{"queue": q, "partition": p} for q, p in sorted(consumer.assignment())],
    }


async def join(request: Request) -> Response:
    gw = gateway_of(request)
    group = request.path_params["group"]
    body = await request.body()
    req = decode_body(body, JoinRequest) if body.strip() else None
    if req is None:
        raise InvalidArgumentError('the request needs a JSON body: {"queues": [...]}')
    if req.idle_timeout_ms is not None and req.idle_timeout_ms < 1000:
        raise InvalidArgumentError(f"idle_timeout_ms must be at least 1000, got {req.idle_timeout_ms}")
    idle_ms = req.idle_timeout_ms or gw.settings.idle_timeout_ms
    instance = uuid.uuid4().hex[:16]
    consumer = gw.client.consumer(
        group=group,
        subscribe=req.queues,
        mode=req.mode,
        strategy=req.strategy,
        auto_offset_reset=req.auto_offset_reset,
        tags=req.tags,
        session_timeout_ms=req.session_timeout_ms,
        max_poll_interval_ms=max(idle_ms, req.session_timeout_ms),
        client_id=f"http-{instance}",
    )
    try:
        await consumer.start()
    except BaseException:
        await consumer.close(commit=False)
        raise
    session = gw.sessions.add(("group", group, instance), consumer, idle_ms)
    async with gw.sessions.using(session) as c:
        doc = _member_doc(group, instance, c)
    return json_response(doc, 201)


def _session(request: Request):
    gw = gateway_of(request)
    group, instance = request.path_params["group"], request.path_params["member"]
    return gw, gw.sessions.require(("group", group, instance), f"member {instance} of group {group!r}")


async def records(request: Request) -> Response:
    gw, session = _session(request)
    timeout_ms = int_param(request, "timeout_ms", 1000, low=0, high=POLL_TIMEOUT_MS_MAX)
    limit = int_param(request, "max", None, low=1, high=10_000)
    b64 = base64_param(request)
    async with gw.sessions.using(session) as c:
        got = await c.poll(max_messages=limit, timeout_ms=timeout_ms)
        for r in got:  # what a commit without offsets commits, to say so in its answer
            session.positions[(r.queue, r.partition)] = r.offset + 1
    return json_response({"records": [record_json(r, b64) for r in got]})


async def commit(request: Request) -> Response:
    gw, session = _session(request)
    body = await request.body()
    req = decode_body(body, CommitRequest) if body.strip() else CommitRequest()
    offsets = None if req.offsets is None else {(o.queue, o.partition): o.offset for o in req.offsets}
    async with gw.sessions.using(session) as c:
        await c.commit(offsets)
        held = set(c.assignment())
    # without offsets, what commit() committed: the positions after the records polled of the
    # partitions still held (one lost in a rebalance is another member's to commit now)
    done = {tp: o for tp, o in session.positions.items() if tp in held} if offsets is None else offsets
    return json_response(
        {"committed": [{"queue": q, "partition": p, "offset": o} for (q, p), o in sorted(done.items())]}
    )


async def describe_member(request: Request) -> Response:
    gw, session = _session(request)
    group, instance = request.path_params["group"], request.path_params["member"]
    async with gw.sessions.using(session) as c:
        return json_response(_member_doc(group, instance, c))


async def leave(request: Request) -> Response:
    gw = gateway_of(request)
    group, instance = request.path_params["group"], request.path_params["member"]
    gw.sessions.require(("group", group, instance), f"member {instance} of group {group!r}")
    await gw.sessions.remove(("group", group, instance), commit=False)
    return Response(status_code=204)


_MEMBER = "/groups/{group}/members/{member}"
OPERATIONS = [
    Operation(
        "POST",
        "/groups/{group}/members",
        join,
        "Join a consumer group with a new member held by the gateway (expires when idle)",
        "consume",
        request=JoinRequest,
        status=201,
    ),
    Operation(
        "GET",
        _MEMBER + "/records",
        records,
        "Poll the member's next records, waiting up to timeout_ms for some (long polling)",
        "consume",
        params=(
            Param(
                "timeout_ms", "integer", f"how long to wait for records (default 1000, at most {POLL_TIMEOUT_MS_MAX})"
            ),
            Param("max", "integer", "the most records to answer"),
            Param("encoding", "string", "base64: every value and key as base64"),
        ),
        responses={404: "no such member (deleted or expired): join again"},
    ),
    Operation(
        "POST",
        _MEMBER + "/offsets",
        commit,
        "Commit offsets (given, or the positions after what was polled)",
        "consume",
        request=CommitRequest,
        responses={404: "no such member", 409: "the group rebalanced: poll, then commit again"},
    ),
    Operation("GET", _MEMBER, describe_member, "The member's id, generation and partitions", "consume"),
    Operation("DELETE", _MEMBER, leave, "Leave the group (without committing)", "consume", status=204),
]
