"""The HTTP/JSON API beside the binary protocol and beside Redis Streams, in one run.

``python -m bench.http [--seconds 3] [--rounds 2]`` starts ``headwater serve --http-port``
and ``redis-server`` (AOF, ``appendfsync everysec``) under a temporary directory on
127.0.0.1, and measures in one process, alternating the systems round by round:

- **produce**: ``--senders`` concurrent senders, each sending batches of ``--batch`` messages
  of ``--size`` bytes for ``--seconds``: HTTP ``POST /v1/queues/q/messages`` with httpx (the
  JSON body built once), the asyncio client's ``send_batch``, and a redis-py pipeline of
  XADDs. Messages per second, and the p99 of one batch's round trip.
- **consume**: ``--messages`` messages stored beforehand, read back as fast as they come:
  the SSE stream (``/events?from=earliest``), the asyncio consumer, XREAD COUNT 500.
- **latency**: one message at a time at ``--rate`` per second (through the binary protocol
  for Headwater, XADD for Redis), the send time in the body; the p99 from the send to the
  reader: the SSE stream, the asyncio consumer, XREAD BLOCK.

``http`` is the gateway inside the broker's process (``serve --http-port``), ``http-alone`` the
same gateway run apart (``python -m headwater.http``). Ratios are HTTP over each of the others.
The clients run in this process, on the same cores as the servers: figures are indicative;
rerun on a quiet machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.peers.base import HOST, ServerProcess, free_port, percentile, port_open, wait_until

WARMUP_S = 1.0


def _bodies(n: int, size: int) -> list[bytes]:
    return [(b"%08d" % i).ljust(size, b"x") for i in range(n)]


async def _timed_senders(send, senders: int, seconds: float) -> dict[str, float]:
    """Run ``senders`` loops of ``send(i)`` (one batch each call) for ``seconds``."""
    lat_ms: list[float] = []
    count = [0]
    deadline = time.perf_counter() + seconds

    async def loop(i: int) -> None:
        while time.perf_counter() < deadline:
            t = time.perf_counter()
            sent = await send(i)  # not `count[0] += await ...`: that reads count[0] before waiting
            count[0] += sent
            lat_ms.append((time.perf_counter() - t) * 1000)

    t0 = time.perf_counter()
    await asyncio.gather(*(loop(i) for i in range(senders)))
    elapsed = time.perf_counter() - t0
    lat_ms.sort()
    return {"msgs_s": count[0] / elapsed, "p99_ms": percentile(lat_ms, 99)}


#: the gateway takes bodies declared JSON only (docs/http.md, "Who may call it")
JSON_TYPE = {"content-type": "application/json"}


async def produce_round(sys_: str, env: dict[str, Any], a: argparse.Namespace) -> dict[str, float]:
    bodies = _bodies(a.batch, a.size)
    if sys_.startswith("http"):
        payload = json.dumps({"messages": [{"value": b.decode()} for b in bodies]}).encode()
        http = env[sys_]

        async def send(i: int) -> int:
            r = await http.post("/v1/queues/bench/messages", content=payload, headers=JSON_TYPE)
            r.raise_for_status()
            return a.batch
    elif sys_ == "binary":
        hw = env["hw"]

        async def send(i: int) -> int:
            await hw.send_batch("bench", bodies)
            return a.batch
    else:
        redis = env["redis"]

        async def send(i: int) -> int:
            pipe = redis.pipeline(transaction=False)
            for b in bodies:
                pipe.xadd(f"bench-{i}", {"v": b})
            await pipe.execute()
            return a.batch

    # warm up, untimed: connections, metadata, and the first seconds of a fresh server, which
    # ran several times slower than the rest in trial runs
    await _timed_senders(send, a.senders, WARMUP_S)
    return await _timed_senders(send, a.senders, a.seconds)


async def consume_round(sys_: str, env: dict[str, Any], a: argparse.Namespace) -> dict[str, float]:
    n, got = a.messages, 0
    t0 = time.perf_counter()
    if sys_.startswith("http"):
        url = f"/v1/queues/fill/events?from=earliest&max_events={n}"
        async with env[sys_].stream("GET", url) as r:
            async for line in r.aiter_lines():
                got += line.startswith("data: ")
    elif sys_ == "binary":
        async with env["hw"].consumer() as c:
            await c.assign("fill")
            await c.seek_to_beginning("fill")
            while got < n:
                got += len(await c.poll(max_messages=500, timeout_ms=1000))
    else:
        last = "0"
        while got < n:
            for _, entries in await env["redis"].xread({"fill": last}, count=500):
                got += len(entries)
                last = entries[-1][0]
    assert got == n, f"{sys_} read {got} of {n}"
    return {"msgs_s": n / (time.perf_counter() - t0)}


async def latency_round(sys_: str, env: dict[str, Any], a: argparse.Namespace) -> dict[str, float]:
    total = int(a.rate * a.seconds)
    lat_ms: list[float] = []
    queue = f"lat-{sys_}-{time.monotonic_ns()}"
    if sys_ != "redis":
        await env["hw"].admin.create_queue(queue)

    async def reader() -> None:
        if sys_.startswith("http"):
            async with env[sys_].stream("GET", f"/v1/queues/{queue}/events?from=earliest&max_events={total}") as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: "):
                        body = json.loads(line[6:])["value"]
                        lat_ms.append((time.perf_counter_ns() - int(body)) / 1e6)
        elif sys_ == "binary":
            async with env["hw"].consumer() as c:
                await c.assign(queue)
                while len(lat_ms) < total:
                    for r in await c.poll(timeout_ms=1000):
                        lat_ms.append((time.perf_counter_ns() - int(r.body)) / 1e6)
        else:
            last = "$"
            while len(lat_ms) < total:
                for _, entries in await env["redis_read"].xread({queue: last}, count=500, block=1000):
                    for eid, fields in entries:
                        lat_ms.append((time.perf_counter_ns() - int(fields[b"v"])) / 1e6)
                        last = eid

    task = asyncio.create_task(reader())
    await asyncio.sleep(0.5)  # the reader is listening
    producer = env["hw"].producer() if sys_ != "redis" else None
    start = time.perf_counter()
    for i in range(total):
        await asyncio.sleep(max(0.0, start + i / a.rate - time.perf_counter()))
        stamp = str(time.perf_counter_ns()).encode()
        if producer is not None:
            producer.send_nowait(queue, stamp)
        else:
            await env["redis"].xadd(queue, {"v": stamp})
    if producer is not None:
        await producer.flush()
    await asyncio.wait_for(task, 60)
    lat_ms = sorted(lat_ms[int(total * 0.1) :])  # the first tenth warms up
    return {"p50_ms": percentile(lat_ms, 50), "p99_ms": percentile(lat_ms, 99)}


def start_servers(work: Path) -> tuple[list[ServerProcess], dict[str, int]]:
    ports = {"hw": free_port(), "http": free_port(), "http-alone": free_port(), "redis": free_port()}
    servers = [
        ServerProcess(
            "headwater",
            [
                sys.executable,
                "-m",
                "headwater.cli.main",
                "--data",
                str(work / "data"),
                "serve",
                "--host",
                HOST,
                "--port",
                str(ports["hw"]),
                "--http-port",
                str(ports["http"]),
                "--log-level",
                "warning",
            ],
            log_path=work / "headwater.log",
        ),
        ServerProcess(  # the same gateway in a process of its own, in front of the same broker
            "headwater-http",
            [
                sys.executable,
                "-m",
                "headwater.http",
                "--server",
                f"{HOST}:{ports['hw']}",
                "--port",
                str(ports["http-alone"]),
            ],
            log_path=work / "headwater-http.log",
        ),
    ]
    if shutil.which("redis-server"):
        servers.append(
            ServerProcess(
                "redis",
                [
                    "redis-server",
                    "--bind",
                    HOST,
                    "--port",
                    str(ports["redis"]),
                    "--dir",
                    str(work),
                    "--appendonly",
                    "yes",
                    "--appendfsync",
                    "everysec",
                    "--save",
                    "",
                    "--logfile",
                    "",
                ],
                log_path=work / "redis.log",
            )
        )
    for name in ("hw", "http", "http-alone", "redis")[: 1 + len(servers)]:
        wait_until(lambda p=ports[name]: port_open(p), timeout_s=30, what=name)
    return servers, ports


async def run(a: argparse.Namespace, ports: dict[str, int], with_redis: bool) -> dict[str, dict[str, list]]:
    import httpx

    import headwater.aio

    env: dict[str, Any] = {"hw": await headwater.aio.connect(f"{HOST}:{ports['hw']}")}
    for name in ("http", "http-alone"):
        env[name] = httpx.AsyncClient(base_url=f"http://{HOST}:{ports[name]}", timeout=60)
    systems = ["http", "http-alone", "binary"]
    if with_redis:
        import redis.asyncio

        env["redis"] = redis.asyncio.Redis(host=HOST, port=ports["redis"])
        env["redis_read"] = redis.asyncio.Redis(host=HOST, port=ports["redis"])
        systems.append("redis")
        await env["redis"].xadd("fill", {"v": b"x"})  # XREAD below starts after id 0
        await env["redis"].delete("fill")
    await env["hw"].admin.create_queue("bench", partitions=a.senders)
    await env["hw"].admin.create_queue("fill")
    bodies = _bodies(500, a.size)
    for i in range(0, a.messages, 500):
        await env["hw"].send_batch("fill", bodies[: min(500, a.messages - i)])
        if with_redis:
            pipe = env["redis"].pipeline(transaction=False)
            for b in bodies[: min(500, a.messages - i)]:
                pipe.xadd("fill", {"v": b})
            await pipe.execute()
    results: dict[str, dict[str, list]] = {k: {s: [] for s in systems} for k in ("produce", "consume", "latency")}
    for r in range(a.rounds):
        order = systems if r % 2 == 0 else systems[::-1]
        for s in order:
            results["produce"][s].append(await produce_round(s, env, a))
            results["consume"][s].append(await consume_round(s, env, a))
            results["latency"][s].append(await latency_round(s, env, a))
    await env["http"].aclose()
    await env["http-alone"].aclose()
    await env["hw"].close()
    return results


def _median(rows: list[dict[str, float]], key: str) -> float:
    xs = sorted(r[key] for r in rows)
    return xs[len(xs) // 2]


def report(results: dict[str, dict[str, list]], a: argparse.Namespace) -> None:
    print(f"bench.http: batch {a.batch} x {a.size} B, {a.senders} senders, {a.seconds} s, {a.rounds} rounds (medians)")
    for kind, keys in (("produce", ("msgs_s", "p99_ms")), ("consume", ("msgs_s",)), ("latency", ("p50_ms", "p99_ms"))):
        rows = {s: {k: _median(v, k) for k in keys} for s, v in results[kind].items()}
        for s, row in rows.items():
            figures = "  ".join(f"{k} {v:,.2f}" if k.endswith("ms") else f"{k} {v:,.0f}" for k, v in row.items())
            print(f"  {kind:8} {s:10} {figures}")
        for peer in ("http-alone", "binary", "redis"):
            if peer in rows:
                ratios = "  ".join(f"{k} {rows['http'][k] / rows[peer][k]:.2f}x" for k in keys)
                print(f"  {kind:8} http / {peer}: {ratios}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.http", description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--batch", type=int, default=100)
    p.add_argument("--size", type=int, default=100)
    p.add_argument("--senders", type=int, default=4)
    p.add_argument("--messages", type=int, default=50_000, help="messages read back by the consume runs")
    p.add_argument("--rate", type=int, default=1000, help="messages per second of the latency runs")
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-http-") as tmp:
        servers, ports = start_servers(Path(tmp))
        try:
            results = asyncio.run(run(a, ports, with_redis=len(servers) > 1))
        finally:
            for s in servers:
                s.stop()
    report(results, a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
