"""`mcp-once proxy` (the guard in front of a server you did not write) and `mcp-once tools` (what
the proxy would do with each of its tools, and why).

The upstream is named in one of three ways: `-- COMMAND ARGS...` (a stdio child), `--upstream URL`
(streamable HTTP), or `--config FILE --server NAME` (a desktop client's `mcpServers` entry). Both
commands import FastMCP only when run, so the rest of the CLI works without the `fastmcp` extra.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
from typing import TYPE_CHECKING, Any

import anyio

from ._common import (
    DEFAULT_STORE_URL,
    EXIT_OK,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    STORE_VARIABLE,
    add_store_option,
    fail,
    open_or_fail,
    redacted,
)
from ._serve import serve_on

if TYPE_CHECKING:
    from mcp_once.proxy import ProxyPolicy, Upstream

#: The commands whose arguments after `--` are the upstream's command line.
TAKES_COMMAND = frozenset({"proxy", "tools"})


def _add_upstream_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--upstream", metavar="URL", help="the upstream's streamable HTTP URL")
    parser.add_argument("--config", metavar="FILE", help="a desktop client's mcpServers JSON")
    parser.add_argument("--server", metavar="NAME", help="the server of --config to proxy")
    parser.add_argument(
        "--policy", metavar="FILE", help='per-tool policy (TOML, [tools."<name or glob>"] tables)'
    )


def add_parser(commands: Any) -> None:
    proxy = commands.add_parser(
        "proxy",
        help="serve an MCP server you did not write, its tools guarded (-- COMMAND, --upstream)",
        description="An MCP server that forwards to one upstream and runs its tools under the"
        " idempotency guard. Upstream: -- COMMAND ARGS... (a stdio child, restarted on the next"
        " call when it dies), --upstream URL, or --config FILE --server NAME. Front: stdio, or"
        " streamable HTTP with --listen (the Idempotency-Key header is read there).",
    )
    _add_upstream_options(proxy)
    proxy.add_argument(
        "--listen", metavar="HOST:PORT", help="serve streamable HTTP at http://HOST:PORT/mcp"
    )
    add_store_option(proxy)
    proxy.set_defaults(run=run_proxy)
    tools = commands.add_parser(
        "tools",
        help="list an upstream's tools, their annotations and what the proxy does with each",
        description="What mcp-once proxy would do with each tool of an upstream, and why; flags"
        " contradicting annotations and tools with none.",
    )
    _add_upstream_options(tools)
    tools.add_argument("--json", action="store_true", help="one JSON object per tool, in a list")
    tools.set_defaults(run=run_tools)


def _upstream(args: argparse.Namespace) -> Upstream:
    from mcp_once.proxy import Upstream, UpstreamConfigError

    command: list[str] = args.command_line
    named = [bool(command), args.upstream is not None, args.config is not None]
    if sum(named) != 1:
        fail("name one upstream: -- COMMAND ARGS..., --upstream URL, or --config FILE", EXIT_USAGE)
    if (args.config is None) != (args.server is None):
        fail("--config and --server go together", EXIT_USAGE)
    try:
        if command:
            return Upstream.stdio(*command)
        if args.upstream is not None:
            return Upstream.http(args.upstream)
        return Upstream.from_config(args.config, args.server)
    except UpstreamConfigError as exc:
        fail(str(exc), EXIT_USAGE)


def _policy(args: argparse.Namespace) -> ProxyPolicy:
    from mcp_once.proxy import PolicyError, ProxyPolicy, load_policy

    if args.policy is None:
        return ProxyPolicy()
    try:
        return load_policy(args.policy)
    except PolicyError as exc:
        fail(str(exc), EXIT_USAGE)


def _need_fastmcp() -> None:
    try:
        import mcp_once.proxy  # noqa: F401
    except ImportError as exc:
        fail(str(exc), EXIT_USAGE)


def _listen(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        fail(f"--listen takes HOST:PORT, not {value!r}", EXIT_USAGE)
    return host.strip("[]"), int(port)


def _store_url(args: argparse.Namespace, upstream: Upstream) -> str:
    """`--store`, else `$MCP_ONCE_STORE`, else an SQLite file under .mcp-once/ named after the
    upstream, so a restarted proxy keeps its records and two upstreams never share a file."""
    if args.store != DEFAULT_STORE_URL or os.environ.get(STORE_VARIABLE):
        return str(args.store)
    os.makedirs(".mcp-once", exist_ok=True)
    return f"sqlite:///.mcp-once/proxy-{upstream.name}.sqlite3"


def run_proxy(args: argparse.Namespace) -> int:
    _need_fastmcp()
    from mcp_once.proxy import PolicyError, UpstreamStartFailed, build_proxy

    upstream = _upstream(args)
    policy = _policy(args)
    listen = _listen(args.listen) if args.listen else None
    url = _store_url(args, upstream)
    store = open_or_fail(url)
    logging.basicConfig(level=logging.WARNING)  # to stderr: stdout is the MCP channel in stdio
    options: dict[str, Any] = {"key_header": "Idempotency-Key"} if listen else {}
    try:
        server = build_proxy(upstream, store, policy=policy, **options)
    except (PolicyError, TypeError, ValueError) as exc:
        fail(f"the policy cannot be applied: {exc}", EXIT_USAGE)

    async def serve() -> None:
        try:
            if listen is None:
                await server.run_async(transport="stdio", show_banner=False)
                return
            host, port = listen
            async with server.opened():
                # Host and Origin are checked when the proxy listens on a loopback address (DNS
                # rebinding: a web page must not reach a local proxy), as MCP's transports say;
                # FastMCP's default checks nothing.
                app = server.http_app(host_origin_protection="auto")
                await serve_on(app, host, port, "mcp-once proxy", redacted(url))
        finally:
            with anyio.CancelScope(shield=True):
                await store.aclose()

    # uvicorn re-raises the Ctrl-C it handled, after a clean shutdown.
    with contextlib.suppress(KeyboardInterrupt):
        try:
            anyio.run(serve)
        except UpstreamStartFailed as exc:
            fail(str(exc), EXIT_USAGE)
    return EXIT_OK


def run_tools(args: argparse.Namespace) -> int:
    _need_fastmcp()
    from mcp_once.proxy import UpstreamLink
    from mcp_once.proxy.failures import UpstreamUnreachable
    from mcp_once.proxy.report import rows, table

    upstream = _upstream(args)
    policy = _policy(args)

    async def listed() -> list[Any]:
        async with UpstreamLink(upstream) as link:
            client = await link.client()
            return list(await client.list_tools())

    try:
        tools = anyio.run(listed)
    except UpstreamUnreachable as exc:
        fail(f"cannot reach the upstream {upstream.name}: {exc.__cause__ or exc}", EXIT_UNREACHABLE)
    found = rows(tools, policy)
    if args.json:
        print(json.dumps([r.as_json() for r in found], indent=2))
    else:
        print(table(found))
    for pattern in policy.unmatched(t.name for t in tools):
        print(f"mcp-once: policy pattern {pattern!r} matches no tool", file=sys.stderr)
    return EXIT_OK
