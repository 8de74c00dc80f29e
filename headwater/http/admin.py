"""Admin over HTTP: queues (create, describe, list, delete, truncate, grow, alter,
enable/disable), consumer groups (list, describe, committed offsets, reset, delete), subscribers, delayed messages,
and the broker's status: what the client's admin offers, as JSON."""

from __future__ import annotations

from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from headwater.errors import InvalidArgumentError
from headwater.http.codec import decode_body, plain
from headwater.http.routes import Operation, Param, flag_param, gateway_of, json_response, str_param
from headwater.model.positions import parse_from

__all__ = ["OPERATIONS", "CreateQueue", "AddPartitions", "AlterQueue", "ResetOffsets", "AddSubscriber"]


class CreateQueue(msgspec.Struct, forbid_unknown_fields=True):
    """A queue to create; ``ttl_s`` null keeps messages forever (default 7 days)."""

    name: str
    partitions: int = 1
    ttl_s: int | None = 7 * 24 * 3600
    flush: str | None = None
    message_bytes_max: int = 1024 * 1024
    settings: dict[str, str] | None = None
    exist_ok: bool = False


class AddPartitions(msgspec.Struct, forbid_unknown_fields=True):
    partitions: int


class AlterQueue(msgspec.Struct, forbid_unknown_fields=True):
    """The settings to change (the others keep their values); ``ttl_s`` null keeps messages
    forever, ``flush`` null follows the store's default."""

    ttl_s: int | None | msgspec.UnsetType = msgspec.UNSET
    message_bytes_max: int | msgspec.UnsetType = msgspec.UNSET
    flush: str | None | msgspec.UnsetType = msgspec.UNSET


class ResetOffsets(msgspec.Struct, forbid_unknown_fields=True):
    """Reset a group's committed offsets on ``queue`` (the group must have no members) to
    ``to``, in the forms of ``headwater group reset --to`` and meaning the same: ``earliest``,
    ``latest``, ``-N`` (N before each partition's end), an offset (``5`` or ``"5"``), a message
    id, or a time (ISO-8601, ``-15m``, ``now``); or to ``offsets`` per partition.
    ``partitions``: only these (default all). An offset ``to`` names outside a partition's
    log goes to its end (or start), as the CLI's; ``offsets`` are committed as given.
    Executes unless ``dry_run`` is true (which answers the plan and commits nothing)."""

    queue: str
    to: str | int | None = None
    offsets: dict[int, int] | None = None
    partitions: list[int] | None = None
    dry_run: bool = False


class AddSubscriber(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    partitions: list[int] | None = None
    tags: list[str] | None = None
    start: str | int = "latest"


def _q(request: Request) -> str:
    return request.path_params["queue"]


async def list_queues(request: Request) -> Response:
    return json_response({"queues": plain(await gateway_of(request).client.admin.list_queues())})


async def create_queue(request: Request) -> Response:
    req = decode_body(await request.body(), CreateQueue)
    info = await gateway_of(request).client.admin.create_queue(
        req.name,
        partitions=req.partitions,
        ttl_s=req.ttl_s,
        flush=req.flush,
        message_bytes_max=req.message_bytes_max,
        settings=req.settings,
        exist_ok=req.exist_ok,
    )
    return json_response(plain(info), 201)


async def describe_queue(request: Request) -> Response:
    return json_response(plain(await gateway_of(request).client.admin.describe_queue(_q(request))))


async def delete_queue(request: Request) -> Response:
    await gateway_of(request).client.admin.delete_queue(_q(request), missing_ok=flag_param(request, "missing_ok"))
    return Response(status_code=204)


async def truncate_queue(request: Request) -> Response:
    return json_response(plain(await gateway_of(request).client.admin.truncate_queue(_q(request))))


async def add_partitions(request: Request) -> Response:
    req = decode_body(await request.body(), AddPartitions)
    return json_response(plain(await gateway_of(request).client.admin.add_partitions(_q(request), req.partitions)))


async def alter_queue(request: Request) -> Response:
    req = decode_body(await request.body(), AlterQueue)
    changes = {k: v for k, v in msgspec.structs.asdict(req).items() if v is not msgspec.UNSET}
    return json_response(plain(await gateway_of(request).client.admin.alter_queue(_q(request), **changes)))


async def enable_queue(request: Request) -> Response:
    return json_response(plain(await gateway_of(request).client.admin.enable_queue(_q(request))))


async def disable_queue(request: Request) -> Response:
    return json_response(plain(await gateway_of(request).client.admin.disable_queue(_q(request))))


async def list_groups(request: Request) -> Response:
    return json_response({"groups": plain(await gateway_of(request).client.service.list_groups())})


async def describe_group(request: Request) -> Response:
    return json_response(plain(await gateway_of(request).client.service.describe_group(request.path_params["group"])))


async def delete_group(request: Request) -> Response:
    queue = str_param(request, "queue") or None
    await gateway_of(request).client.admin.delete_group(request.path_params["group"], queue=queue)
    return Response(status_code=204)


async def group_offsets(request: Request) -> Response:
    queue = str_param(request, "queue")
    if not queue:
        raise InvalidArgumentError("query parameter queue is required: the queue whose offsets to show")
    committed = await gateway_of(request).client.service.fetch_offsets(request.path_params["group"], queue)
    return json_response({"queue": queue, "offsets": {str(p): o for p, o in sorted(committed.items())}})


async def _reset_plan(client: Any, req: ResetOffsets) -> dict[int, int]:
    """Where ``to`` puts each partition, as ``headwater group reset --to`` puts it (one
    parser: :func:`headwater.model.positions.parse_from`)."""
    if (req.to is None) == (req.offsets is None):
        raise InvalidArgumentError(
            "give to (earliest, latest, -N, an offset, a message id or a time) or offsets, one of them"
        )
    info = await client.admin.describe_queue(req.queue)
    if req.offsets is not None:
        return dict(req.offsets)
    where = parse_from(str(req.to), "to")
    by_part = {p.partition: p for p in info.partitions}
    chosen = sorted(by_part) if req.partitions is None else req.partitions
    if where.message_id is not None:
        if req.partitions is not None and req.partitions != [where.message_id.partition]:
            raise InvalidArgumentError(
                f"to names a message of partition {where.message_id.partition}, and partitions others; "
                f"leave out partitions (the id picks its own)"
            )
        chosen = [where.message_id.partition]
    for p in chosen:
        if p not in by_part:
            raise InvalidArgumentError(
                f"queue {req.queue!r} has partitions 0..{len(by_part) - 1}; there is no partition {p}"
            )
    if where.message_id is not None:
        return {where.message_id.partition: where.message_id.offset}
    info.require_online(chosen, f"reset the group's offsets of {req.queue!r} to {req.to}")
    if where.offset is not None:  # outside a partition's log: its end (or start), as the CLI's reset
        return {p: min(max(where.offset, by_part[p].start_offset), by_part[p].end_offset) for p in chosen}
    if where.time_ms is not None:
        return {p: await client.offset_for_time(req.queue, p, where.time_ms) for p in chosen}
    return where.offsets([by_part[p] for p in chosen]) or {}


def _requested(to: str | int | None) -> int | None:
    """The offset ``to`` names, where it names one: a row's ``after`` differs from it where
    the offset lay outside the partition's log (brought to its end or start)."""
    if to is None:
        return None
    where = parse_from(str(to), "to")
    return where.offset if where.message_id is None else None


async def reset_group(request: Request) -> Response:
    client = gateway_of(request).client
    group = request.path_params["group"]
    req = decode_body(await request.body(), ResetOffsets)
    plan = await _reset_plan(client, req)
    before = await client.service.fetch_offsets(group, req.queue)
    if not req.dry_run:
        await client.service.commit_offsets(group, req.queue, plan)
    asked = _requested(req.to)
    rows = [
        {"partition": p, "before": before.get(p), "after": o, "requested": o if asked is None else asked}
        for p, o in sorted(plan.items())
    ]
    return json_response({"group": group, "queue": req.queue, "dry_run": req.dry_run, "offsets": rows})


async def list_subscribers(request: Request) -> Response:
    found = await gateway_of(request).client.admin.list_subscribers(str_param(request, "queue"))
    return json_response({"subscribers": plain(found)})


async def add_subscriber(request: Request) -> Response:
    req = decode_body(await request.body(), AddSubscriber)
    start: Any = req.start
    info = await gateway_of(request).client.admin.add_subscriber(
        _q(request), req.name, partitions=req.partitions, tags=req.tags, start=start
    )
    return json_response(plain(info), 201)


async def describe_subscriber(request: Request) -> Response:
    admin = gateway_of(request).client.admin
    return json_response(plain(await admin.describe_subscriber(_q(request), request.path_params["name"])))


async def delete_subscriber(request: Request) -> Response:
    await gateway_of(request).client.admin.delete_subscriber(_q(request), request.path_params["name"])
    return Response(status_code=204)


async def delay_stats(request: Request) -> Response:
    return json_response(plain(await gateway_of(request).client.delay_stats()))


async def cancel_delayed(request: Request) -> Response:
    await gateway_of(request).client.cancel(request.path_params["id"])
    return Response(status_code=204)


async def cluster(request: Request) -> Response:
    queues_raw = str_param(request, "queues")
    queues = None if queues_raw is None else [q for q in queues_raw.split(",") if q]
    return json_response(plain(await gateway_of(request).client.admin.cluster_metadata(queues)))


async def status(request: Request) -> Response:
    return json_response(plain(await gateway_of(request).client.status()))


_QUEUE, _GROUP, _SUB = "/queues/{queue}", "/groups/{group}", "/queues/{queue}/subscribers"
_NOQ = {404: "no such queue"}
OPERATIONS = [
    Operation("GET", "/queues", list_queues, "List every queue, described", "admin"),
    Operation(
        "POST",
        "/queues",
        create_queue,
        "Create a queue",
        "admin",
        request=CreateQueue,
        status=201,
        responses={409: "a queue of that name exists (unless exist_ok)"},
    ),
    Operation(
        "GET", _QUEUE, describe_queue, "Describe a queue: settings, partitions, offsets", "admin", responses=_NOQ
    ),
    Operation(
        "DELETE",
        _QUEUE,
        delete_queue,
        "Delete a queue and its messages",
        "admin",
        status=204,
        params=(Param("missing_ok", "boolean", "a queue that is not there is not an error"),),
        responses=_NOQ,
    ),
    Operation(
        "PATCH",
        _QUEUE,
        alter_queue,
        "Change a queue's ttl_s, message_bytes_max or flush (only those given)",
        "admin",
        request=AlterQueue,
        responses=_NOQ,
    ),
    Operation(
        "POST", _QUEUE + "/truncate", truncate_queue, "Drop every message, keep the queue", "admin", responses=_NOQ
    ),
    Operation(
        "POST",
        _QUEUE + "/partitions",
        add_partitions,
        "Grow the queue to this many partitions",
        "admin",
        request=AddPartitions,
        responses=_NOQ,
    ),
    Operation("POST", _QUEUE + "/enable", enable_queue, "Accept reads and writes again", "admin", responses=_NOQ),
    Operation("POST", _QUEUE + "/disable", disable_queue, "Refuse reads and writes", "admin", responses=_NOQ),
    Operation("GET", "/groups", list_groups, "List consumer groups", "admin"),
    Operation("GET", _GROUP, describe_group, "Describe a consumer group: members, partitions, offsets", "admin"),
    Operation(
        "DELETE",
        _GROUP,
        delete_group,
        "Delete a consumer group's committed offsets (refused while it has members)",
        "admin",
        status=204,
        params=(Param("queue", "string", "only the offsets on this queue"),),
        responses={404: "the group has no committed offsets (on that queue)", 409: "the group has members"},
    ),
    Operation(
        "GET",
        _GROUP + "/offsets",
        group_offsets,
        "A group's committed offsets on a queue",
        "admin",
        params=(Param("queue", "string", "the queue", required=True),),
    ),
    Operation(
        "POST",
        _GROUP + "/reset",
        reset_group,
        "Reset a group's offsets on a queue, as 'headwater group reset --to' (executes unless dry_run)",
        "admin",
        request=ResetOffsets,
        responses={409: "the group has members: stop them first"},
    ),
    Operation(
        "GET",
        "/subscribers",
        list_subscribers,
        "List push subscribers",
        "admin",
        params=(Param("queue", "string", "only this queue's"),),
    ),
    Operation("POST", _SUB, add_subscriber, "Add a push subscriber", "admin", request=AddSubscriber, status=201),
    Operation("GET", _SUB + "/{name}", describe_subscriber, "Describe a subscriber and its checkpoint", "admin"),
    Operation("DELETE", _SUB + "/{name}", delete_subscriber, "Delete a subscriber", "admin", status=204),
    Operation("GET", "/delays/stats", delay_stats, "The schedule of delayed messages", "admin"),
    Operation(
        "DELETE",
        "/delays/{id}",
        cancel_delayed,
        "Cancel a delayed message by its id",
        "admin",
        status=204,
        responses={404: "no delayed message with that id waits"},
    ),
    Operation(
        "GET",
        "/cluster",
        cluster,
        "The brokers, the controller and each partition's leader (a broker alone names itself)",
        "admin",
        params=(Param("queues", "string", "only these queues (comma-separated; default all)"),),
    ),
    Operation("GET", "/status", status, "The broker's version, uptime and storage figures", "admin"),
]
