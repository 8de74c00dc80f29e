"""What keeps a web page from acting through the gateway: an ASGI middleware in front of
every route (the API, ``/metrics`` and the console).

The gateway has no login, and a browser lets any page it shows send "simple" requests
(a POST with ``Content-Type: text/plain``, say) to any address, the operator's localhost
included, and a page whose name an attacker re-points at 127.0.0.1 (DNS rebinding) may
even read the answers. As Jupyter and Django do, a request is refused when:

- its ``Host`` is not a name the gateway answers to (403): ``localhost``, an IP address
  (a rebinding page reaches the gateway under its own name, never under an address), the
  name it listens on, or one the operator allowed (``--http-allowed-host``);
- it carries an ``Origin`` (browsers send one with every cross-origin request and every
  POST, PUT, PATCH and DELETE) that is not the gateway itself, i.e. not the scheme-less
  ``host:port`` of its ``Host`` (403): the console, served by this app, passes;
- it carries a body that is not declared ``Content-Type: application/json`` (415): a
  browser cannot send that type to another site without asking first (a CORS preflight,
  which the gateway never grants).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any
from urllib.parse import urlsplit

from headwater import errors as e
from headwater.http.errors import error_response

__all__ = ["RequestGuard", "host_allowed", "split_host", "LOOPBACK_NAMES"]

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

#: Names that always mean this machine.
LOOPBACK_NAMES = ("localhost",)
_WILDCARDS = ("", "0.0.0.0", "::", "*")
_DEFAULT_PORTS = {"http": 80, "https": 443}


def split_host(text: str) -> tuple[str, int | None]:
    """A ``Host`` header (or the netloc of an origin) as (lower-case name, port or None);
    an IPv6 address loses its brackets.

    >>> split_host("LocalHost:8080"), split_host("[::1]:80"), split_host("example.org")
    (('localhost', 8080), ('::1', 80), ('example.org', None))
    """
    text = text.strip().lower()
    if text.startswith("["):
        name, _, rest = text[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    else:
        name, _, port = text.rpartition(":") if text.count(":") == 1 else (text, "", "")
    return name.rstrip("."), int(port) if port.isdigit() else None


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def host_allowed(name: str, allowed: Iterable[str]) -> bool:
    """Whether the gateway answers to ``name`` (a Host without its port): localhost and its
    subdomains, any IP address, or a name in ``allowed`` (``*`` allows any, ``.example.org``
    that domain and its subdomains).

    >>> host_allowed("localhost", []), host_allowed("10.0.0.7", []), host_allowed("evil.example", [])
    (True, True, False)
    >>> host_allowed("hw.corp.example", [".corp.example"]), host_allowed("hw.corp.example", ["hw.corp.example"])
    (True, True)
    """
    if name in LOOPBACK_NAMES or name.endswith(".localhost") or _is_ip(name):
        return True
    for a in allowed:
        a = a.strip().lower().rstrip(".")
        if a == "*" or a == name or (a.startswith(".") and (name == a[1:] or name.endswith(a))):
            return True
    return False


def _header(scope: Scope, name: bytes) -> str | None:
    for k, v in scope.get("headers", ()):
        if k == name:
            return str(v.decode("latin-1"))
    return None


def _origin_matches(origin: str, host: str) -> bool:
    """Whether the ``Origin`` header names the site ``Host`` names (the same name and port;
    a port left out is the scheme's default)."""
    parts = urlsplit(origin.strip())
    if parts.scheme not in _DEFAULT_PORTS or not parts.netloc:
        return False  # "null" (a sandboxed frame, a file: page) or nonsense
    o_name, o_port = split_host(parts.netloc)
    h_name, h_port = split_host(host)
    default = _DEFAULT_PORTS[parts.scheme]
    return o_name == h_name and (o_port or default) == (h_port or default)


def _is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


class RequestGuard:
    """The ASGI middleware: refuses what the module docstring lists, with the API's error
    shape, before any route sees the request."""

    def __init__(self, app: Any, allowed_hosts: Iterable[str] = (), listen_host: str | None = None) -> None:
        self.app = app
        self.allowed = [h.strip().lower() for h in allowed_hosts if h.strip()]
        if listen_host is not None and listen_host.strip("[]").lower() not in _WILDCARDS:
            self.allowed.append(listen_host.strip("[]").lower())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            refusal = self._refusal(scope)
            if refusal is not None:
                await refusal(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _refusal(self, scope: Scope) -> Any:
        host = _header(scope, b"host")
        if host is None:  # HTTP/1.0 without Host: the server's own address, as uvicorn sees it
            server = scope.get("server") or ("", None)
            host = f"{server[0]}:{server[1]}" if server[1] else str(server[0])
        name, _ = split_host(host)
        if not host_allowed(name, self.allowed):
            return _forbidden(
                "HostNotAllowed",
                f"Host {host!r} is not a name this gateway answers to (localhost, an IP address"
                f"{', ' + ', '.join(repr(a) for a in self.allowed) if self.allowed else ''}); a web page may be "
                f"trying to reach it under another name (DNS rebinding). If {name!r} is this gateway's own name, "
                f"start it with --http-allowed-host {name} (python -m headwater.http: --allowed-host {name})",
            )
        origin = _header(scope, b"origin")
        if origin is not None and not _origin_matches(origin, host):
            return _forbidden(
                "OriginNotAllowed",
                f"a request from the web page at {origin!r} to {host!r}: the gateway answers only its own "
                f"pages (the console) and clients that send no Origin (curl, programs); call it from the "
                f"server side, or open the console at http://{host}/",
            )
        content_type = _header(scope, b"content-type")
        length = _header(scope, b"content-length")
        has_body = (length is not None and length.strip() not in ("", "0")) or (
            _header(scope, b"transfer-encoding") is not None
        )
        if (has_body or content_type is not None) and not _is_json(content_type or ""):
            return error_response(
                415,
                e.UsageError.code,
                "UnsupportedMediaType",
                f"the request body is {'declared ' + repr(content_type) if content_type else 'not declared'}: "
                "the API takes JSON; send the header 'Content-Type: application/json' (curl: "
                "-H 'Content-Type: application/json' or --json)",
            )
        return None


def _forbidden(name: str, message: str) -> Any:
    return error_response(403, e.UsageError.code, name, message)
