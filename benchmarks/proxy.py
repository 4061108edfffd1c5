"""Benchmark: a keyed call through `mcp-once proxy`, beside FastMCP's bare `create_proxy` and the
upstream called directly, in one run, over streamable HTTP and over stdio on 127.0.0.1.

    uv run python -m benchmarks.proxy [--calls 300] [--rounds 3] [--fronts http,stdio]

Every server is a process of its own, as deployed. Over HTTP: the upstream
(`benchmarks._http_server`'s `plain` tool, unwrapped), `mcp-once proxy --listen` on each store
(`memory://`, an SQLite file, a private redis-server), and three bare FastMCP proxies:
`create_proxy(URL)` as the docs show it (a new upstream session per request), and `create_proxy`
over one connected client, the session reused as ours reuses it: a plain `fastmcp.Client`
(`create_proxy(client)`), and FastMCP's `ProxyClient` (`FastMCPProxy(client_factory=lambda:
client)`, since `create_proxy` opens a fresh session per request for a `ProxyClient`), the client
class ours links with (the handshake era for a 2025-era caller; this caller speaks 2026-07-28, so
ours links to the HTTP upstream in that era, as the plain client does). Over stdio
the caller starts each server as a child and each proxy starts its own upstream child (no
per-request row there: a new child per call). One caller issues calls back to back, the targets
interleaved call by call; each call carries a fresh key in `_meta` (every call a first execution
through the guard); the replay rows re-send one key. Reported per front: p50 and p90 latency per
target and the ratio of medians per round against the reused-`ProxyClient` bare proxy (median,
min-max over rounds), with the ratio against the reused plain `fastmcp.Client` beside it for the
target; and Redis round trips per call through the proxy (first execution, replay), read from
Redis's own counters. Target: mcp-once proxy / bare <= 1.15 on the memory store over HTTP,
against both reused bare proxies.
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import AsyncExitStack, ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import redis
from mcp import StdioServerParameters
from mcp.client import Client

from ._redis import REPO, RedisServer, free_port, read_counters
from ._servers import bench_server, key_meta
from ._stats import percentile

BARE = "bare, reused ProxyClient"
BARE_CLIENT = "bare, reused fastmcp.Client"
TARGET = "mcp-once proxy, memory"
REPLAY = "mcp-once proxy, memory, replay"
STORES = ("memory", "SQLite", "Redis")
TARGET_RATIO = 1.15
#: Calls per phase for the Redis round-trip count (exact counts: a few suffice).
COUNTED = 50

Target = str | StdioServerParameters


@contextmanager
def _process(command: list[str], ready: str) -> Iterator[None]:
    """Run `command` until the block ends, once a line starting with `ready` is on its stderr."""
    process = subprocess.Popen(
        command, cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True, env=dict(os.environ),
    )  # fmt: skip
    try:
        assert process.stderr is not None
        for line in process.stderr:
            if line.startswith(ready):
                break
        else:
            raise RuntimeError(f"{command[:4]} exited before it was ready")
        yield
    finally:
        process.kill()
        process.wait(timeout=30)


async def _serve_announced(app: Any, port: int) -> None:
    """Serve `app` on 127.0.0.1:`port`, saying "ready" on stderr once the socket listens."""
    import uvicorn

    from ._http_server import uvicorn_options

    server = uvicorn.Server(uvicorn.Config(app, **uvicorn_options(port, uvloop=False)))

    async def announce() -> None:
        while not server.started:  # noqa: ASYNC110 (uvicorn offers no event for it)
            await anyio.sleep(0.01)
        print("ready", file=sys.stderr, flush=True)

    async with anyio.create_task_group() as tg:
        tg.start_soon(announce)
        await server.serve()


def _upstream_stdio() -> list[str]:
    return [sys.executable, "-m", "benchmarks.proxy", "--serve", "upstream"]


async def _serve(mode: str, upstream: str | None, port: int | None) -> None:
    """The server processes of this benchmark: the upstream, or a bare FastMCP proxy. Without a
    port they speak stdio (a bare proxy then starts the upstream as its own child)."""
    from fastmcp import Client as FastMCPClient
    from fastmcp.client.transports import StdioTransport
    from fastmcp.server import create_proxy
    from fastmcp.server.providers.proxy import FastMCPProxy, ProxyClient

    from idempotency import MemoryKeyStore

    if mode == "upstream":
        server = bench_server(MemoryKeyStore())
        if port is None:
            await server.run_stdio_async()
        else:
            await _serve_announced(server.streamable_http_app(), port)
        return
    target: Any = upstream
    if upstream is None:
        command, *args = _upstream_stdio()
        target = StdioTransport(command, args, env=dict(os.environ), keep_alive=False)
    if mode == "bare":  # as the docs show it: a new upstream session per request
        assert port is not None
        await _serve_announced(create_proxy(target).http_app(), port)
        return
    # One connected client: the upstream session reused, as mcp-once proxy reuses it.
    client = ProxyClient(target) if mode == "bare-proxyclient" else FastMCPClient(target)
    async with client:
        # `create_proxy` reuses a connected plain client, but opens a fresh session per request
        # for a connected `ProxyClient`: FastMCP's own `FastMCPProxy` over that one client is
        # what reuses it (as mcp-once proxy's provider does).
        proxy = (
            FastMCPProxy(client_factory=lambda: client)
            if mode == "bare-proxyclient"
            else create_proxy(client)
        )
        if port is None:
            await proxy.run_async(transport="stdio", show_banner=False)
        else:
            await _serve_announced(proxy.http_app(), port)


async def _interleaved(targets: dict[str, Target], calls: int) -> dict[str, list[float]]:
    """`calls` keyed calls per target, interleaved call by call (load on a shared machine falls
    on every target alike); the `replay` row re-sends one key through the memory-store proxy."""
    async with AsyncExitStack() as stack:
        clients = {name: await stack.enter_async_context(Client(t)) for name, t in targets.items()}
        for client in clients.values():
            await client.list_tools()
            for _ in range(10):  # warm-up
                await client.call_tool("plain", {"text": "x"}, meta=key_meta(secrets.token_hex(8)))
        order = [(name, client, False) for name, client in clients.items()]
        order.append((REPLAY, clients[TARGET], True))
        found: dict[str, list[float]] = {name: [] for name, _, _ in order}
        same = secrets.token_hex(8)
        for _ in range(calls):
            for name, client, replay in order:
                key = same if replay else secrets.token_hex(8)
                start = time.perf_counter()
                await client.call_tool("plain", {"text": "x"}, meta=key_meta(key))
                found[name].append(time.perf_counter() - start)
        return found


async def _round_trips(target: Target, admin: redis.Redis) -> dict[str, float]:
    """Redis round trips per call through the Redis-store proxy: `COUNTED` first executions,
    then the same keys again (replays), read from Redis's `total_reads_processed`."""
    keys = [secrets.token_hex(8) for _ in range(COUNTED)]
    found: dict[str, float] = {}
    async with Client(target) as client:
        await client.call_tool("plain", {"text": "x"}, meta=key_meta(secrets.token_hex(8)))
        for phase in ("first", "replay"):
            before = read_counters(admin)
            for key in keys:
                await client.call_tool("plain", {"text": "x"}, meta=key_meta(key))
            found[phase] = read_counters(admin).minus(before)["round_trips"] / COUNTED
    return found


@dataclass
class Measured:
    """One front's figures: latencies of every call, ratios per round, Redis round trips."""

    front: str
    latencies: dict[str, list[float]]
    ratios: dict[str, list[float]]
    versus_client: list[float]
    round_trips: dict[str, float]


def _measure(
    front: str, targets: dict[str, Target], calls: int, rounds: int, redis_url: str
) -> Measured:
    found: dict[str, list[float]] = {name: [] for name in [*targets, REPLAY]}
    ratios: dict[str, list[float]] = {name: [] for name in found}
    versus_client: list[float] = []
    for _ in range(rounds):
        this = anyio.run(_interleaved, targets, calls)
        base = statistics.median(this[BARE])
        for name, values in this.items():
            found[name].extend(values)
            ratios[name].append(statistics.median(values) / base)
        versus_client.append(statistics.median(this[TARGET]) / statistics.median(this[BARE_CLIENT]))
    admin = redis.Redis.from_url(redis_url)
    try:
        trips = anyio.run(_round_trips, targets["mcp-once proxy, Redis"], admin)
    finally:
        admin.close()
    return Measured(front, found, ratios, versus_client, trips)


def store_urls(folder: str, redis_url: str, front: str) -> dict[str, str]:
    """Each store's URL for the proxies of one front (also `proxy_hop.py`'s)."""
    return {
        "memory": "memory://",
        "SQLite": f"sqlite:///{folder}/proxy-{front}.sqlite3",
        "Redis": f"{redis_url}?prefix=bench-proxy-{front}:",
    }


def _http(stack: ExitStack, folder: str, redis_url: str) -> dict[str, Target]:
    """Start the HTTP servers; their URLs by target name."""
    python = sys.executable
    ports = {name: free_port() for name in ("upstream", "bare", "bare-client", "bare-proxyclient")}
    upstream = f"http://127.0.0.1:{ports['upstream']}/mcp"
    for mode, port in ports.items():
        stack.enter_context(_process(
            [python, "-m", "benchmarks.proxy", "--serve", mode, "--upstream", upstream,
             "--port", str(port)], "ready",
        ))  # fmt: skip
    targets: dict[str, Target] = {
        "upstream directly": upstream,
        "bare, per request": f"http://127.0.0.1:{ports['bare']}/mcp",
        BARE_CLIENT: f"http://127.0.0.1:{ports['bare-client']}/mcp",
        BARE: f"http://127.0.0.1:{ports['bare-proxyclient']}/mcp",
    }
    for store, url in store_urls(folder, redis_url, "http").items():
        port = free_port()
        stack.enter_context(_process(
            [python, "-m", "mcp_once", "proxy", "--store", url,
             "--listen", f"127.0.0.1:{port}", "--upstream", upstream],
            "mcp-once proxy at",
        ))  # fmt: skip
        targets[f"mcp-once proxy, {store}"] = f"http://127.0.0.1:{port}/mcp"
    return targets


def _stdio(folder: str, redis_url: str) -> dict[str, Target]:
    """The stdio children by target name (each client starts its own)."""

    def child(*args: str) -> StdioServerParameters:
        quiet = {**os.environ, "FASTMCP_LOG_LEVEL": "WARNING"}  # no start-up banners on our tty
        return StdioServerParameters(command=sys.executable, args=list(args), env=quiet)

    targets: dict[str, Target] = {
        "upstream directly": child(*_upstream_stdio()[1:]),
        BARE_CLIENT: child("-m", "benchmarks.proxy", "--serve", "bare-client"),
        BARE: child("-m", "benchmarks.proxy", "--serve", "bare-proxyclient"),
    }
    for store, url in store_urls(folder, redis_url, "stdio").items():
        targets[f"mcp-once proxy, {store}"] = child(
            "-m", "mcp_once", "proxy", "--store", url, "--", *_upstream_stdio()
        )
    return targets


def _row(name: str, values: list[float], ratio: list[float]) -> str:
    p50, p90 = percentile(values, 50) * 1e3, percentile(values, 90) * 1e3
    shown = f"{statistics.median(ratio):6.3f} ({min(ratio):.3f}-{max(ratio):.3f})"
    return f"{name:<34} {p50:8.3f} {p90:8.3f}   {shown}"


def _print(measured: Measured, calls: int, rounds: int) -> None:
    print(f"\n{measured.front}: {calls} sequential keyed calls x {rounds} rounds, one caller")
    print(f"{'target':<34} {'p50 ms':>8} {'p90 ms':>8}   ratio to {BARE} (min-max)")
    for name, values in measured.latencies.items():
        print(_row(name, values, measured.ratios[name]))
    for name, per_round in ((BARE, measured.ratios[TARGET]), (BARE_CLIENT, measured.versus_client)):
        rounds_shown = ", ".join(f"{r:.3f}" for r in per_round)
        print(f"{TARGET} / {name}, per round: {rounds_shown}")
    trips = measured.round_trips
    print(
        f"Redis round trips per call through the proxy: first execution {trips['first']:.2f},"
        f" replay {trips['replay']:.2f} (the guard's own: 2 and 1)"
    )


def run(calls: int, rounds: int, fronts: Sequence[str]) -> bool:
    """Run the comparison and print the tables; True when the target holds."""
    held = True
    with tempfile.TemporaryDirectory() as folder, RedisServer() as server:
        for front in fronts:
            with ExitStack() as stack:
                if front == "HTTP":
                    targets = _http(stack, folder, server.url)
                else:
                    targets = _stdio(folder, server.url)
                measured = _measure(front, targets, calls, rounds, server.url)
            _print(measured, calls, rounds)
            if front == "HTTP":
                ratio = statistics.median(measured.ratios[TARGET])
                versus_client = statistics.median(measured.versus_client)
                held = ratio <= TARGET_RATIO and versus_client <= TARGET_RATIO
                verdict = "met" if held else "NOT met"
                print(
                    f"target {TARGET} <= {TARGET_RATIO} over HTTP, against {BARE}: {ratio:.3f};"
                    f" against {BARE_CLIENT}: {versus_client:.3f} ({verdict})"
                )
    return held


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--fronts", default="http,stdio", help="http, stdio or both (%(default)s)")
    parser.add_argument(
        "--serve",
        choices=("upstream", "bare", "bare-client", "bare-proxyclient"),
        help=argparse.SUPPRESS,
    )
    parser.add_argument("--upstream", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        anyio.run(_serve, args.serve, args.upstream, args.port)
        return 0
    names = {"http": "HTTP", "stdio": "stdio"}
    fronts = [names[f.strip().lower()] for f in args.fronts.split(",") if f.strip()]
    return 0 if run(args.calls, args.rounds, fronts) else 1


if __name__ == "__main__":
    sys.exit(main())
