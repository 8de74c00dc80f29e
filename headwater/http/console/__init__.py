"""The web console: a few static files (HTML, CSS, ES modules) served at ``/`` beside the
API, which the page reads and drives with ``fetch()`` of ``/v1``.

There is no build step and nothing is fetched from elsewhere: the files ship as package data
and run as they are in any current browser. The page puts every value from the API into the
document as text, never as markup, and its Content-Security-Policy allows only its own
scripts and styles, so a message body cannot run in an operator's browser.
"""

from __future__ import annotations

from importlib import resources

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

__all__ = ["routes", "CONTENT_SECURITY_POLICY"]

#: Own scripts, styles and images only; ``data:`` images for the screenshot checks of the
#: tests (a PNG drawn into a canvas), nothing inline, no frames.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
    "object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'self'"
)


def _index_html() -> bytes:
    return resources.files(__name__).joinpath("static", "index.html").read_bytes()


async def index(request: Request) -> Response:
    """The console's page; its modules load from ``/console/``."""
    return Response(
        _index_html(),
        media_type="text/html; charset=utf-8",
        headers={
            "content-security-policy": CONTENT_SECURITY_POLICY,
            "x-content-type-options": "nosniff",
            "cache-control": "no-cache",
        },
    )


def routes() -> list[BaseRoute]:
    """The console's routes: the page at ``/`` and its files under ``/console/``."""
    static = StaticFiles(packages=[(__name__, "static")])
    return [Route("/", index, methods=["GET", "HEAD"]), Mount("/console", app=static, name="console")]
