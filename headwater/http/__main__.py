"""``python -m headwater.http --server HOST:PORT --port 8080``: the HTTP API alone, in front
of a broker or a cluster (a bootstrap list ``h1:p1,h2:p2``), until Ctrl-C or SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from headwater.errors import HeadwaterError, UsageError
from headwater.http import require_extra


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m headwater.http", description=__doc__)
    parser.add_argument("--server", default="127.0.0.1:7070", help="the broker (or bootstrap list) to serve")
    parser.add_argument("--host", default="127.0.0.1", help="the address to listen on")
    parser.add_argument("--port", type=int, default=8080, help="the port to listen on (0: any free port)")
    parser.add_argument("--idle-timeout-ms", type=int, default=300_000, help="close group members idle this long")
    parser.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a Host name to answer to besides localhost, IP addresses and --host (repeatable; "
        ".example.org: the domain and its subdomains; *: any); docs/http.md",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level="INFO", stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        require_extra()
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    import headwater.aio
    from headwater.http.app import GatewaySettings
    from headwater.http.server import HttpServer

    def ready(port: int) -> None:
        print(f"http listening {args.host}:{port}", flush=True)

    settings = GatewaySettings(idle_timeout_ms=args.idle_timeout_ms, allowed_hosts=tuple(args.allowed_host))
    server = HttpServer(
        args.server,
        host=args.host,
        port=args.port,
        settings=settings,
        on_ready=ready,
    )

    async def run() -> int:
        # the broker first: unreachable, it is one line and exit 1, as the CLI says it, not
        # uvicorn's startup tracebacks (the gateway connects again as the app starts)
        try:
            probe = await headwater.aio.connect(args.server, connect_timeout_s=settings.connect_timeout_s)
        except HeadwaterError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        await probe.close()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, server.stop_soon)
        await server.serve()
        return 0

    return asyncio.run(run())


if __name__ == "__main__":
    sys.exit(main())
