"""The MCP servers the call-level benchmarks talk to: one guarded tool and its unwrapped twin.

Both tools do the same work (return the text they are given, optionally after a pause), so the
difference between calling `keyed` and `plain` is exactly what `@idempotent` adds. A third twin,
`floor`, is the guard's floor: the same store work by hand (see `bench_server`).
"""

from __future__ import annotations

import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Annotated, Any, cast

import anyio
import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp_types import CallToolResult, RequestParamsMeta, TextContent, ToolAnnotations
from pydantic import BaseModel

from idempotency import (
    DEFAULT_LEASE,
    CallScope,
    KeyStore,
    Policy,
    default_scope,
    encode_result,
    fingerprint,
    idempotent,
    rfc3339,
    store_key,
    wire,
)

SERVER_NAME = "bench"
#: How long a benchmark's hand-made guard keeps a record: the guard's own default.
RETENTION: float = Policy().retention


# The floor's output schema: the shape the SDK gives `plain` and `keyed` (a `str` result wrapped
# as `{"result": ...}`), so the floor's structured content is validated as theirs is, by the
# server's output check and by the client against the advertised schema. (No docstring: it
# would become the schema's description, which theirs do not have.)
class FloorOutput(BaseModel):
    result: str


async def guard_by_hand(
    store: KeyStore,
    scope: str,
    tool: str,
    key: str,
    arguments: dict[str, Any],
    run: Callable[[], Awaitable[CallToolResult]],
    retention: float,
) -> CallToolResult:
    """The least a guard can do for a first execution with `store`: name the call's record,
    fingerprint the call, claim the record, run the body, store the encoded result, answer with
    the result marker. No policy, no lease renewal, no cancellation shield, no telemetry, no error
    handling: any other answer than "claimed" fails the benchmark. The guard floor of `bench`
    (`bench_server`'s `floor`) and of the proxy hop (`_hop_floor`, with a store)."""
    record = store_key(scope, tool, key)
    claimed = await store.claim(
        record, fingerprint(tool, arguments), lease=DEFAULT_LEASE, takeover=False
    )
    if claimed.token is None:
        raise RuntimeError(f"the floor guard expects first executions only: {claimed}")
    result = await run()
    executed_at = time.time()
    stored = encode_result(result, executed_at)
    if not await store.complete(record, claimed.token, stored, retention=retention):
        raise RuntimeError("the floor guard lost its claim")
    marker = {
        "key": key,
        "keySource": "client",
        "status": "executed",
        "executedAt": rfc3339(executed_at),
        "attempts": 1,
    }
    return result.model_copy(
        update={"meta": {**(result.meta or {}), wire.IDEMPOTENCY_META: marker}}
    )


def bench_server(store: KeyStore, **options: Any) -> MCPServer:
    """Tools: `plain` (unwrapped), `keyed` (guarded), `floor` (hand-guarded), `slow` (guarded,
    sleeps `seconds`).

    `plain`, `keyed` and `floor` return `text` followed by `size` filler characters, so the
    result size is chosen by the caller without a large argument.

    `floor` is `guard_by_hand` around the body, with the same store: the least a guard can do for
    a first execution. It declares the output schema `plain` and `keyed` get and builds the text
    content the SDK would, so its result is validated as theirs is (by the server, and by the
    client against the advertised schema): until 2026-12-02 it declared none, skipped both
    checks, and read ~34 µs of CPU cheaper than a fair floor. The gap between `floor` and `plain`
    is the store work and the marker, the gap between `keyed` and `floor` is the guard's own
    machinery."""
    server = MCPServer(SERVER_NAME, log_level="WARNING")
    hint = ToolAnnotations(idempotent_hint=True)

    @server.tool(annotations=hint)
    async def plain(text: str, size: int = 0) -> str:
        return text + "x" * size

    @server.tool(annotations=hint)
    @idempotent(store, **options)
    async def keyed(text: str, size: int = 0) -> str:
        return text + "x" * size

    scope = default_scope(CallScope(server.name, "floor", None, None, None))
    retention = float(options.get("retention", RETENTION))

    @server.tool(annotations=hint)
    async def floor(
        text: str, ctx: Context, size: int = 0
    ) -> Annotated[CallToolResult, FloorOutput]:
        key = ctx.request_context.meta[wire.KEY_META]  # type: ignore[index,literal-required]

        async def run() -> CallToolResult:  # as `keyed` answers: text and structured content
            out = text + "x" * size
            return CallToolResult(
                content=[TextContent(type="text", text=out)], structured_content={"result": out}
            )

        arguments = {"text": text, "size": size}
        return await guard_by_hand(store, scope, "floor", key, arguments, run, retention)

    @server.tool(annotations=hint)
    @idempotent(store, **options)
    async def slow(text: str, seconds: float) -> str:
        await anyio.sleep(seconds)
        return text

    return server


def key_meta(key: str) -> RequestParamsMeta:
    return cast(RequestParamsMeta, {wire.KEY_META: key})


@asynccontextmanager
async def serve_http(
    server: MCPServer, *, app_wrapper: Callable[[Any], Any] | None = None, **app_options: Any
) -> AsyncIterator[str]:
    """Serve `server` over streamable HTTP with uvicorn on 127.0.0.1 in this event loop; yields
    the endpoint URL. `app_wrapper` wraps the ASGI app (e.g. an outage switch)."""
    app = server.streamable_http_app(**app_options)
    if app_wrapper is not None:
        app = app_wrapper(app)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(512)
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        app, log_level="warning", lifespan="on", timeout_graceful_shutdown=2, access_log=False
    )
    web = uvicorn.Server(config)
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: web.serve(sockets=[sock]))
        try:
            yield f"http://127.0.0.1:{port}/mcp"
        finally:
            web.should_exit = True
    sock.close()
