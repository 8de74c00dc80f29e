"""What every endpoint module shares: the operation table (routes and their OpenAPI
description in one place, so the schema cannot drift from the routes) and the reading of
path and query parameters with errors that name the parameter."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from headwater.errors import InvalidArgumentError

__all__ = [
    "Operation",
    "Param",
    "json_response",
    "int_param",
    "str_param",
    "flag_param",
    "base64_param",
    "checked",
    "path_int",
    "gateway_of",
    "INT_PARAM_MAX",
]

Handler = Callable[[Request], Awaitable[Response]]


@dataclass(frozen=True)
class Param:
    """A query parameter (path parameters are read from the path itself)."""

    name: str
    kind: str  # "integer", "string" or "boolean"
    description: str
    required: bool = False


@dataclass(frozen=True)
class Operation:
    """One endpoint: its method, path (under /v1), handler, and what OpenAPI says of it."""

    method: str
    path: str
    handler: Handler
    summary: str
    tag: str
    request: type | None = None  # a msgspec struct: the JSON body it takes
    params: tuple[Param, ...] = ()
    status: int = 200
    responses: dict[int, str] = field(default_factory=dict)  # other statuses it answers on purpose
    streams: bool = False  # text/event-stream


def json_response(doc: Any, status: int = 200) -> Response:
    """``doc`` as a JSON answer (msgspec encodes it: fast, and plain types only)."""
    # a line end, so that answers printed by curl one after another stay one per line
    return Response(msgspec.json.encode(doc) + b"\n", status_code=status, media_type="application/json")


def str_param(request: Request, name: str, default: str | None = None) -> str | None:
    """A query parameter as text, or ``default`` when absent."""
    return request.query_params.get(name, default)


#: The largest whole number a query parameter may carry: offsets, times and counts are int64
#: on the wire, so a larger one is refused here, naming the parameter.
INT_PARAM_MAX = 2**63 - 1


def int_param(
    request: Request,
    name: str,
    default: int | None = None,
    *,
    low: int | None = None,
    high: int | None = INT_PARAM_MAX,
) -> int | None:
    """A query parameter as an integer in [low, high]; InvalidArgumentError naming it."""
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise InvalidArgumentError(f"query parameter {name} must be a whole number, got {raw!r}") from None
    if low is not None and value < low:
        raise InvalidArgumentError(f"query parameter {name} must be at least {low}, got {value}")
    if high is not None and value > high:
        raise InvalidArgumentError(f"query parameter {name} must be at most {high}, got {value}")
    return value


def base64_param(request: Request, name: str = "encoding") -> bool:
    """Whether a read answers every value and key as base64: ``encoding=base64``; absent or
    ``utf-8`` is text where it is text. Anything else is refused, naming the parameter."""
    raw = request.query_params.get(name)
    if raw in (None, "", "utf-8"):
        return False
    if raw == "base64":
        return True
    raise InvalidArgumentError(f"query parameter {name} must be base64 or utf-8, got {raw!r}")


def checked(op: Operation) -> Handler:
    """``op``'s handler, refusing first a query parameter ``op`` does not take (a typo such as
    ``ofset=5`` would otherwise be ignored, and the answer look right)."""
    known = {p.name for p in op.params}

    async def handler(request: Request) -> Response:
        unknown = sorted(set(request.query_params) - known)
        if unknown:
            takes = f"it takes {', '.join(sorted(known))}" if known else "it takes none"
            raise InvalidArgumentError(
                f"unknown query parameter{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} for "
                f"{op.method} /v1{op.path}: {takes} (see /v1/docs)"
            )
        return await op.handler(request)

    handler.__name__ = handler.__qualname__ = getattr(op.handler, "__name__", "handler")
    return handler


def flag_param(request: Request, name: str) -> bool:
    """A boolean query parameter: true/1/yes, or false/0/no (absent: false)."""
    raw = request.query_params.get(name, "false").lower()
    if raw in ("true", "1", "yes", ""):
        return raw != ""
    if raw in ("false", "0", "no"):
        return False
    raise InvalidArgumentError(f"query parameter {name} must be true or false, got {raw!r}")


def path_int(request: Request, name: str) -> int:
    """A path parameter that must be a whole number (a partition)."""
    raw = request.path_params[name]
    try:
        return int(raw)
    except ValueError:
        raise InvalidArgumentError(f"{name} in the path must be a whole number, got {raw!r}") from None


def gateway_of(request: Request) -> Any:
    """The :class:`~headwater.http.app.Gateway` serving this request."""
    return request.app.state.gateway
