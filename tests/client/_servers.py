"""Plain MCP servers for the client tests: they count executions and record what arrived.

No server-side idempotency layer: these servers run a tool again on every attempt, which is what
lets the tests count exactly how often the retry logic sent a call.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import anyio
from mcp import MCPError
from mcp.server.mcpserver import Context, MCPServer
from mcp.types import CallToolResult, TextContent, ToolAnnotations

from idempotency import wire

IDEMPOTENT = ToolAnnotations(idempotent_hint=True)
READ_ONLY = ToolAnnotations(read_only_hint=True)
NOT_IDEMPOTENT = ToolAnnotations(idempotent_hint=False, read_only_hint=False)


@dataclass
class Seen:
    tool: str
    key: Any
    attempt: Any
    meta: dict[str, Any]


@dataclass
class Recorder:
    """What the server saw. Thread-safe enough for a server running in another thread."""

    seen: list[Seen] = field(default_factory=list)
    #: Per tool: a queue of actions for successive executions (see `act`); empty means "ok".
    script: dict[str, list[Any]] = field(default_factory=dict)
    #: Per tool: the action for every execution once `script` is used up.
    always: dict[str, Any] = field(default_factory=dict)
    #: Set each time any tool starts (for a test thread that must act mid-call).
    started: threading.Event = field(default_factory=threading.Event)
    #: How many arrivals `barrier` waits for before answering attempt 1.
    barrier_size: int = 0
    _barrier: anyio.Event | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, tool: str, ctx: Context) -> Seen:
        meta = dict(ctx.request_context.meta or {})
        entry = Seen(tool, meta.get(wire.KEY_META), meta.get(wire.ATTEMPT_META), meta)
        with self._lock:
            self.seen.append(entry)
        self.started.set()
        return entry

    def executions(self, tool: str | None = None) -> int:
        return sum(1 for s in self.seen if tool is None or s.tool == tool)

    def counts(self) -> Counter[str]:
        return Counter(s.tool for s in self.seen)

    def keys(self, tool: str) -> list[Any]:
        return [s.key for s in self.seen if s.tool == tool]

    def attempts(self, tool: str) -> list[Any]:
        return [s.attempt for s in self.seen if s.tool == tool]

    def act(self, tool: str) -> Any:
        with self._lock:
            queue = self.script.get(tool)
            action = queue.pop(0) if queue else self.always.get(tool, "ok")
        if isinstance(action, MCPError):
            raise action
        if action == "is_error":
            raise ValueError("the tool failed")
        return action


def make_server(recorder: Recorder, name: str = "client-tests") -> MCPServer:
    server = MCPServer(name)

    @server.tool(annotations=IDEMPOTENT)
    async def idem(x: int, ctx: Context) -> str:
        recorder.record("idem", ctx)
        recorder.act("idem")
        return f"idem:{x}"

    @server.tool(annotations=READ_ONLY)
    async def reader(x: int, ctx: Context) -> str:
        recorder.record("reader", ctx)
        recorder.act("reader")
        return f"reader:{x}"

    @server.tool()
    async def plain(x: int, ctx: Context) -> str:
        recorder.record("plain", ctx)
        recorder.act("plain")
        return f"plain:{x}"

    @server.tool(annotations=NOT_IDEMPOTENT)
    async def unsafe(x: int, ctx: Context) -> str:
        recorder.record("unsafe", ctx)
        recorder.act("unsafe")
        return f"unsafe:{x}"

    @server.tool(annotations=IDEMPOTENT)
    async def hang(ctx: Context) -> str:
        recorder.record("hang", ctx)
        await anyio.sleep_forever()
        return "never"

    @server.tool(annotations=IDEMPOTENT)
    async def replayed(ctx: Context) -> CallToolResult:
        seen = recorder.record("replayed", ctx)
        record = {"key": seen.key, "keySource": "client", "status": "replayed", "attempts": 1}
        return CallToolResult(
            content=[TextContent(type="text", text="stored")],
            _meta={wire.IDEMPOTENCY_META: record},
        )

    @server.tool(annotations=IDEMPOTENT)
    async def barrier(ctx: Context) -> str:
        seen = recorder.record("barrier", ctx)
        if seen.attempt == 1:
            if recorder._barrier is None:
                recorder._barrier = anyio.Event()
            if recorder.executions("barrier") >= recorder.barrier_size:
                recorder._barrier.set()
            await recorder._barrier.wait()
        return f"barrier:{seen.attempt}"

    @server.tool(annotations=IDEMPOTENT)
    async def slow_first(ctx: Context) -> str:
        """Hangs on attempt 1 (after saying so on `started`); answers any later attempt."""
        seen = recorder.record("slow_first", ctx)
        if seen.attempt == 1:
            await anyio.sleep_forever()
        return f"slow_first:{seen.attempt}"

    @server.tool()
    async def mutate(ctx: Context) -> str:
        recorder.record("mutate", ctx)
        await ctx.session.send_tool_list_changed()
        return "changed"

    return server
