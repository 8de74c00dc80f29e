"""The ASGI application: a :class:`Gateway` (one asyncio client of the broker, the sessions
HTTP clients hold through it) and the routes of every endpoint module under ``/v1``.

The gateway talks to the broker only through the public asyncio client
(:mod:`headwater.aio`), routed: on a cluster it sends each call to the broker that leads the
partition or coordinates the group, so the API behaves the same whichever broker serves it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

import headwater.aio
from headwater.errors import HeadwaterError
from headwater.http import admin, console, events, groups, openapi, produce, reads, shared
from headwater.http.errors import handle_error, handle_http_exception
from headwater.http.guard import RequestGuard
from headwater.http.routes import Operation, checked
from headwater.http.sessions import Sessions

__all__ = ["Gateway", "GatewaySettings", "create_app", "OPERATIONS"]

log = logging.getLogger("headwater.http")

#: Every operation of the API, in the order the docs page lists them.
OPERATIONS: list[Operation] = [
    *produce.OPERATIONS,
    *reads.OPERATIONS,
    *groups.OPERATIONS,
    *shared.OPERATIONS,
    *events.OPERATIONS,
    *admin.OPERATIONS,
    *openapi.OPERATIONS,
]


class GatewaySettings:
    """The gateway's bounds, each named with its unit."""

    def __init__(
        self,
        *,
        body_bytes_max: int = 64 << 20,
        idle_timeout_ms: int = 300_000,
        sessions_max: int = 1000,
        connect_timeout_s: float = 10.0,
        allowed_hosts: tuple[str, ...] = (),
    ) -> None:
        #: the largest request body (413 beyond)
        self.body_bytes_max = body_bytes_max
        #: a group member or shared consumer no request used for this long is closed
        self.idle_timeout_ms = idle_timeout_ms
        #: group members and shared consumers held at once (503 beyond)
        self.sessions_max = sessions_max
        self.connect_timeout_s = connect_timeout_s
        #: Host names the gateway answers to besides localhost, IP addresses and the name it
        #: listens on (``*``: any; ``.example.org``: that domain and its subdomains);
        #: headwater/http/guard.py
        self.allowed_hosts = allowed_hosts


class Gateway:
    """What the endpoints share: the client, its producer, and the sessions."""

    def __init__(self, broker_address: str, settings: GatewaySettings) -> None:
        self.broker_address = broker_address
        self.settings = settings
        self.body_bytes_max = settings.body_bytes_max
        self.client: Any = None
        self.producer: Any = None
        self.sessions = Sessions(settings.idle_timeout_ms, settings.sessions_max)

    async def open(self) -> None:
        """Connect to the broker (or cluster) and start the sessions' reaper."""
        self.client = await headwater.aio.connect(
            self.broker_address, connect_timeout_s=self.settings.connect_timeout_s
        )
        self.producer = self.client.producer()
        self.sessions.start()

    async def close(self) -> None:
        """Close every session (members leave their groups), then the client."""
        await self.sessions.close()
        if self.client is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.client.close(), 10)


async def _metrics(request: Request) -> Response:
    """The Prometheus metrics of the broker this gateway was started with (docs/metrics.md);
    on a cluster each broker's gateway serves its own broker's, as each broker is scraped."""
    exposition = await request.app.state.gateway.client.admin.metrics_exposition()
    return Response(exposition.text, media_type=exposition.content_type)


def create_app(
    broker_address: str, settings: GatewaySettings | None = None, *, listen_host: str | None = None
) -> Starlette:
    """The HTTP API of the broker (or cluster) at ``broker_address`` (``"host:port"``, or a
    bootstrap list ``"h1:p1,h2:p2"``) as an ASGI app; it connects when the server starts
    (the ASGI lifespan) and closes when it stops. ``listen_host``: the address it is served
    on, a name its requests' ``Host`` may carry (headwater/http/guard.py)."""
    gateway = Gateway(broker_address, settings or GatewaySettings())

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await gateway.open()
        try:
            yield
        finally:
            await gateway.close()

    routes = [Route("/v1" + op.path, checked(op), methods=[op.method]) for op in OPERATIONS]
    # where Prometheus looks by default, outside /v1: the broker's own exposition, unchanged
    routes.append(Route("/metrics", _metrics, methods=["GET"]))
    # the web console at / (docs/console.md): static files that drive the API above
    routes.extend(console.routes())
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        # before any route: refuse what a web page (not the console) would send
        middleware=[Middleware(RequestGuard, allowed_hosts=gateway.settings.allowed_hosts, listen_host=listen_host)],
        # HeadwaterError is answered as an error of the caller's or the broker's; any other
        # exception goes to ServerErrorMiddleware (Exception), which answers 500 and logs it
        exception_handlers={
            HeadwaterError: handle_error,
            HTTPException: handle_http_exception,
            Exception: handle_error,
        },
    )
    app.state.gateway = gateway
    app.state.operations = OPERATIONS
    return app
