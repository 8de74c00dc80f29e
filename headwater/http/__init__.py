"""The HTTP/JSON API of Headwater: a gateway over the public asyncio client.

``headwater serve --http-port 8080`` serves it beside a broker; ``python -m headwater.http
--server HOST:PORT --port 8080`` serves it alone, in front of any broker or cluster. The
API lives under ``/v1`` (OpenAPI 3 at ``/v1/openapi.json``, a list of operations at
``/v1/docs``); the guide is docs/http.md.

Needs the ``http`` extra: ``pip install 'headwater[http]'`` (Starlette and uvicorn).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["HttpServer", "GatewaySettings", "create_app", "require_extra", "INSTALL_HINT"]

INSTALL_HINT = "pip install 'headwater[http]'"

if TYPE_CHECKING:
    from headwater.http.app import GatewaySettings, create_app
    from headwater.http.server import HttpServer


def require_extra() -> None:
    """Raise :class:`~headwater.errors.UsageError` naming the extra to install when
    Starlette or uvicorn is missing."""
    import importlib.util

    from headwater.errors import UsageError

    missing = [m for m in ("starlette", "uvicorn") if importlib.util.find_spec(m) is None]
    if missing:
        raise UsageError(f"the HTTP API needs {' and '.join(missing)}, not installed here: {INSTALL_HINT}")


def __getattr__(name: str) -> Any:
    # imported on first use, so that `import headwater.http` (and require_extra) works
    # without the extra installed
    if name in ("GatewaySettings", "create_app"):
        require_extra()
        from headwater.http import app

        return getattr(app, name)
    if name == "HttpServer":
        require_extra()
        from headwater.http.server import HttpServer

        return HttpServer
    raise AttributeError(f"module 'headwater.http' has no attribute {name!r}")
