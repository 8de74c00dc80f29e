"""Errors as JSON, with the binary protocol's codes and a fitting HTTP status.

Every error answer has one shape::

    {"error": {"code": 7, "name": "QueueNotFoundError", "message": "...", "retriable": false}}

``code`` and ``retriable`` are those of :mod:`headwater.errors` (the codes the binary
protocol carries); the status follows the kind of error: 400 a bad argument or request,
404 something named is not there, 409 it exists already or the state moved on, 413 too
large, 503 unavailable (retriable), 504 sent but no answer, 500 the broker's storage.
"""

from __future__ import annotations

from typing import Any

import msgspec
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from headwater import errors as e

__all__ = ["status_for", "error_response", "handle_error", "handle_http_exception"]

# most specific first: the first class an error is an instance of decides
_STATUSES: tuple[tuple[type[e.HeadwaterError], int], ...] = (
    (e.MessageTooLargeError, 413),
    (e.QueueNotFoundError, 404),
    (e.MessageNotFoundError, 404),
    (e.SubscriberNotFoundError, 404),
    (e.GroupNotFoundError, 404),
    (e.UnknownMemberError, 404),
    (e.QueueExistsError, 409),
    (e.SubscriberExistsError, 409),
    (e.QueueDisabledError, 409),
    (e.InvalidArgumentError, 400),
    (e.UsageError, 400),
    (e.ClosedError, 503),
    (e.StateConflictError, 409),
    (e.OutcomeUnknownError, 504),
    (e.UnavailableError, 503),
    (e.DataDirectoryError, 500),
    (e.StorageError, 500),
)


def status_for(error: e.HeadwaterError) -> int:
    """The HTTP status that answers ``error``."""
    for cls, status in _STATUSES:
        if isinstance(error, cls):
            return status
    return 500


def error_response(status: int, code: int, name: str, message: str, retriable: bool = False) -> Response:
    """The JSON error answer (see the module docstring)."""
    body = {"error": {"code": code, "name": name, "message": message, "retriable": retriable}}
    headers = {"Retry-After": "1"} if status == 503 else None
    return Response(
        msgspec.json.encode(body) + b"\n", status_code=status, media_type="application/json", headers=headers
    )


async def handle_error(request: Request, exc: Exception) -> Response:
    """Starlette's handler for any error an endpoint raised: Headwater's with their code,
    anything else as 500 with code 0 (the message says what broke; the log has the trace)."""
    if isinstance(exc, e.HeadwaterError):
        return error_response(status_for(exc), exc.code, type(exc).__name__, str(exc), exc.retriable)
    return error_response(500, 0, "InternalError", f"{type(exc).__name__}: {exc}")


# statuses Starlette itself answers (no route, wrong method): as the same JSON shape
_HTTP_NAMES = {404: "NotFound", 405: "MethodNotAllowed"}


async def handle_http_exception(request: Request, exc: Any) -> Response:
    """Starlette's own refusals (an unknown path, a method a path does not take) in the
    error shape, with code 1 (a usage error)."""
    assert isinstance(exc, HTTPException)
    what = f"{request.method} {request.url.path}"
    message = {404: f"no such endpoint: {what} (see /v1/docs)", 405: f"{what}: method not allowed"}.get(
        exc.status_code, str(exc.detail)
    )
    return error_response(exc.status_code, e.UsageError.code, _HTTP_NAMES.get(exc.status_code, "HTTPError"), message)
