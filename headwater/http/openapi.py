"""The OpenAPI 3 description of the API, made from the operation table (so it lists exactly
the routes served), and a self-contained docs page that lists the operations (no CDN: it
must work on machines without internet)."""

from __future__ import annotations

import html
import re
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from headwater._version import __version__
from headwater.http.routes import Operation, json_response

__all__ = ["OPERATIONS", "openapi_document"]

_ERROR_SCHEMA = {
    "type": "object",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "code": {"type": "integer", "description": "the binary protocol's error code"},
                "name": {"type": "string"},
                "message": {"type": "string"},
                "retriable": {"type": "boolean"},
            },
            "required": ["code", "name", "message", "retriable"],
        }
    },
}


def openapi_document(operations: list[Operation]) -> dict[str, Any]:
    """The OpenAPI 3.1 document of ``operations`` (request bodies from their msgspec structs)."""
    bodies = sorted({op.request for op in operations if op.request is not None}, key=lambda t: t.__name__)
    _, components = msgspec.json.schema_components(bodies, ref_template="#/components/schemas/{name}")
    components["Error"] = _ERROR_SCHEMA
    paths: dict[str, dict[str, Any]] = {}
    for op in operations:
        item: dict[str, Any] = {
            "summary": op.summary,
            "operationId": op.handler.__name__,
            "tags": [op.tag],
            "parameters": [
                {"name": n, "in": "path", "required": True, "schema": {"type": "string"}}
                for n in re.findall(r"{(\w+)}", op.path)
            ]
            + [
                {
                    "name": p.name,
                    "in": "query",
                    "required": p.required,
                    "description": p.description,
                    "schema": {"type": p.kind},
                }
                for p in op.params
            ],
            "responses": _responses(op),
        }
        if op.request is not None:
            ref = {"$ref": f"#/components/schemas/{op.request.__name__}"}
            item["requestBody"] = {"required": True, "content": {"application/json": {"schema": ref}}}
        paths.setdefault("/v1" + op.path, {})[op.method.lower()] = item
    return {
        "openapi": "3.1.0",
        "info": {"title": "Headwater HTTP API", "version": __version__, "description": "See docs/http.md."},
        "paths": paths,
        "components": {"schemas": components},
    }


def _responses(op: Operation) -> dict[str, Any]:
    kind = "text/event-stream" if op.streams else "application/json"
    ok: dict[str, Any] = {"description": "done"}
    if op.status != 204:
        ok["content"] = {kind: {"schema": {"type": "string"} if op.streams else {"type": "object"}}}
    out: dict[str, Any] = {str(op.status): ok}
    err = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
    for status, why in {400: "a bad argument", **op.responses, 503: "unavailable: retry"}.items():
        out[str(status)] = {"description": why, "content": err}
    return out


async def openapi_json(request: Request) -> Response:
    return json_response(openapi_document(request.app.state.operations))


async def docs_page(request: Request) -> Response:
    rows = "\n".join(
        f"<tr><td><code>{op.method}</code></td><td><code>/v1{html.escape(op.path)}</code></td>"
        f"<td>{html.escape(op.summary)}</td><td>{html.escape(op.request.__name__) if op.request else ''}</td></tr>"
        for op in request.app.state.operations
    )
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>Headwater HTTP API</title>
<style>body{{font-family:sans-serif;margin:2em}}td,th{{padding:.3em .8em;text-align:left;vertical-align:top}}
tr:nth-child(even){{background:#f4f4f4}}</style></head><body>
<h1>Headwater HTTP API {html.escape(__version__)}</h1>
<p>The machine-readable description: <a href="/v1/openapi.json">/v1/openapi.json</a> (OpenAPI 3).
Errors answer <code>{{"error": {{"code", "name", "message", "retriable"}}}}</code>.</p>
<table><tr><th>method</th><th>path</th><th>what</th><th>body</th></tr>
{rows}
</table></body></html>"""
    return HTMLResponse(page)


OPERATIONS = [
    Operation("GET", "/openapi.json", openapi_json, "This API's OpenAPI 3 description", "meta"),
    Operation("GET", "/docs", docs_page, "A page listing the operations", "meta"),
]
