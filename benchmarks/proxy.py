"""Benchmark: a keyed call through `mcp-once proxy`, beside FastMCP's bare `create_proxy` and the
upstream called directly, in one run, over streamable HTTP on 127.0.0.1.

    uv run python -m benchmarks.proxy [--calls 300] [--rounds 3]

Every server is a process of its own, as deployed: the upstream (`benchmarks._http_server`, its
unwrapped `plain` tool), `mcp-once proxy --listen --store memory://`, and two bare FastMCP proxies:
`create_proxy(URL)` as the docs show it (a new upstream session per request) and `create_proxy`
over one connected `fastmcp.Client` (the session reused, as ours reuses it: the fair baseline of
the target). One caller issues calls back to back, the targets interleaved round by round; each
call carries a fresh key in `_meta` (every call a first execution through the guard). The replay
row re-sends one key. Reported: p50 and p90 latency per target, and the ratio of medians per round
against the reused-session bare proxy (target: mcp-once proxy / bare <= 1.15 on the memory store).
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import AsyncExitStack, ExitStack, contextmanager
from typing import Any

import anyio
from mcp.client import Client

from ._redis import REPO, free_port
from ._stats import percentile

KEY = "io.github.mcp-once/idempotency-key"
ONCE = "mcp-once proxy"
REPLAY = "mcp-once proxy, replay"
BARE = "FastMCP create_proxy (reused)"
TARGET_RATIO = 1.15


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


async def _serve(mode: str, upstream: str, port: int) -> None:
    """The server processes of this benchmark: the upstream, or a bare FastMCP proxy."""
    from fastmcp import Client as FastMCPClient
    from fastmcp.server import create_proxy

    from idempotency import MemoryKeyStore

    from ._servers import bench_server

    if mode == "upstream":
        await _serve_announced(bench_server(MemoryKeyStore()).streamable_http_app(), port)
    elif mode == "bare":
        await _serve_announced(create_proxy(upstream).http_app(), port)
    else:  # one connected client: the upstream session reused, as mcp-once proxy reuses it
        async with FastMCPClient(upstream) as client:
            await _serve_announced(create_proxy(client).http_app(), port)


async def _interleaved(urls: dict[str, str], calls: int) -> dict[str, list[float]]:
    """`calls` keyed calls per target, interleaved call by call (load on a shared machine falls
    on every target alike); the `replay` row re-sends one key through the last target."""
    async with AsyncExitStack() as stack:
        clients = {name: await stack.enter_async_context(Client(url)) for name, url in urls.items()}
        once = clients[ONCE]
        for client in clients.values():
            await client.list_tools()
            for _ in range(10):  # warm-up
                await client.call_tool("plain", {"text": "x"}, meta={KEY: secrets.token_hex(8)})
        targets = [(name, client, False) for name, client in clients.items()]
        targets.append((REPLAY, once, True))
        found: dict[str, list[float]] = {name: [] for name, _, _ in targets}
        same = secrets.token_hex(8)
        for _ in range(calls):
            for name, client, replay in targets:
                key = same if replay else secrets.token_hex(8)
                start = time.perf_counter()
                await client.call_tool("plain", {"text": "x"}, meta={KEY: key})
                found[name].append(time.perf_counter() - start)
        return found


def _row(name: str, values: list[float], ratio: list[float] | None) -> str:
    p50, p90 = percentile(values, 50) * 1e3, percentile(values, 90) * 1e3
    shown = (
        ""
        if ratio is None
        else f"{statistics.median(ratio):6.3f} ({min(ratio):.3f}-{max(ratio):.3f})"
    )
    return f"{name:<34} {p50:8.3f} {p90:8.3f}   {shown}"


def run(calls: int, rounds: int) -> bool:
    """Run the comparison and print the table; True when the target holds."""
    ports = {name: free_port() for name in ("upstream", "once", "bare", "bare-reused")}
    upstream = f"http://127.0.0.1:{ports['upstream']}/mcp"
    python = sys.executable
    with ExitStack() as stack:
        stack.enter_context(_process(
            [python, "-m", "benchmarks.proxy", "--serve", "upstream", "--upstream", upstream,
             "--port", str(ports["upstream"])], "ready",
        ))  # fmt: skip
        stack.enter_context(_process(
            [python, "-m", "mcp_once", "proxy", "--store", "memory://",
             "--listen", f"127.0.0.1:{ports['once']}", "--upstream", upstream],
            "mcp-once proxy at",
        ))  # fmt: skip
        for name in ("bare", "bare-reused"):
            stack.enter_context(_process(
                [python, "-m", "benchmarks.proxy", "--serve", name, "--upstream", upstream,
                 "--port", str(ports[name])], "ready",
            ))  # fmt: skip
        urls = {
            "upstream directly": upstream,
            "FastMCP create_proxy (per request)": f"http://127.0.0.1:{ports['bare']}/mcp",
            BARE: f"http://127.0.0.1:{ports['bare-reused']}/mcp",
            ONCE: f"http://127.0.0.1:{ports['once']}/mcp",
        }
        found: dict[str, list[float]] = {name: [] for name in [*urls, REPLAY]}
        ratios: dict[str, list[float]] = {name: [] for name in found}
        for _ in range(rounds):
            this = anyio.run(_interleaved, urls, calls)
            base = statistics.median(this[BARE])
            for name, values in this.items():
                found[name].extend(values)
                ratios[name].append(statistics.median(values) / base)
    print(f"{calls} sequential keyed calls x {rounds} rounds, memory store, HTTP, one caller")
    print(f"{'target':<34} {'p50 ms':>8} {'p90 ms':>8}   ratio to reused bare proxy (min-max)")
    for name, values in found.items():
        print(_row(name, values, ratios[name]))
    ratio = statistics.median(ratios[ONCE])
    held = ratio <= TARGET_RATIO
    verdict = "met" if held else "NOT met"
    print(f"target mcp-once proxy / bare <= {TARGET_RATIO}: {ratio:.3f} ({verdict})")
    return held


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--serve", choices=("upstream", "bare", "bare-reused"), help=argparse.SUPPRESS
    )
    parser.add_argument("--upstream", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        anyio.run(_serve, args.serve, args.upstream, args.port)
        return 0
    return 0 if run(args.calls, args.rounds) else 1


if __name__ == "__main__":
    sys.exit(main())
