"""An upstream that honours idempotency keys itself: a Python MCP server guarded by mcp-once (the
low-level handler), over stdio, on a SQLite key store that outlives the process.

    python guarded_upstream.py STORE LEDGER_DIR

Files in LEDGER_DIR, each appended with one line and fsynced before anything else happens, so
what a test counts is what the upstream saw and did, whatever the proxy says:

- `calls`: one JSON line per `tools/call` of a guarded tool received, `{"order", "key"}` (the
  key in its `_meta`), written before the guard sees the call: a call the upstream's guard
  replays is counted here too;
- `effects`: one JSON line per effect, `{"order", "key", "fence"}`, written by the guarded body
  (the key and fence of the upstream's claim).

`charge(order, crash_at=0, hold=False)`: guarded. `hold` waits (bounded) for `open_gate` before
the effect. `crash_at=N` SIGKILLs this process right after its guard stored the result of the
N-th effect of `order`, before the answer is written: the upstream's record is complete, its
answer lost (a re-sent call finds the record and replays it). `top_up` is the same tool under
another name, for a proxy policy that declares it `upstream_idempotent`. `wait_started(count)`
returns once `count` guarded calls have started here; it and `open_gate` are listed read-only,
so the proxy passes them through.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import anyio
from mcp.server import Server
from mcp.server.stdio import stdio_server
from mcp_types import (
    CallToolRequestParams,
    CallToolResult,
    ListToolsResult,
    PaginatedRequestParams,
    TextContent,
    Tool,
    ToolAnnotations,
)

from idempotency import SQLiteKeyStore, current_claim, idempotent_call_tool, wire

NAME = "guarded-upstream"
GUARDED = ("charge", "top_up")
#: Bounds a held call: a test that forgets to open the gate fails instead of hanging.
HOLD = 60.0


class Ledger:
    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def append(self, file: str, entry: dict[str, Any]) -> None:
        with open(self.folder / file, "a", encoding="utf-8") as f:
            f.write(json.dumps(entry) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def count(self, file: str, order: str) -> int:
        path = self.folder / file
        if not path.exists():
            return 0
        return sum(json.loads(line)["order"] == order for line in path.read_text().splitlines())


def _tools() -> list[Tool]:
    charge = {
        "type": "object",
        "properties": {
            "order": {"type": "string"},
            "crash_at": {"type": "integer"},
            "hold": {"type": "boolean"},
        },
        "required": ["order"],
    }
    control = ToolAnnotations(read_only_hint=True)
    counted = {"type": "object", "properties": {"count": {"type": "integer"}}}
    return [
        *(Tool(name=name, input_schema=charge) for name in GUARDED),
        Tool(name="wait_started", input_schema=counted, annotations=control),
        Tool(name="open_gate", input_schema={"type": "object"}, annotations=control),
    ]


async def serve(store_path: Path, ledger: Ledger) -> None:
    store = SQLiteKeyStore(store_path)
    gate = anyio.Event()
    started = 0
    progressed = anyio.Event()

    async def charge(arguments: dict[str, Any]) -> CallToolResult:
        nonlocal started, progressed
        claim = current_claim()
        assert claim is not None  # the proxy always sends a key
        order = str(arguments["order"])
        started += 1
        progressed.set()
        progressed = anyio.Event()
        if arguments.get("hold"):
            with anyio.fail_after(HOLD):
                await gate.wait()
        ledger.append("effects", {"order": order, "key": claim.key, "fence": claim.fence})
        made = ledger.count("effects", order)
        return CallToolResult(content=[TextContent(type="text", text=f"{order}: effect {made}")])

    async def wait_started(count: int) -> str:
        while started < count:
            with anyio.fail_after(HOLD):
                await progressed.wait()
        return str(started)

    async def call_tool(ctx: Any, params: CallToolRequestParams) -> CallToolResult:
        arguments = params.arguments or {}
        if params.name in GUARDED:
            return await charge(arguments)
        if params.name == "wait_started":
            text = await wait_started(int(arguments.get("count", 1)))
        else:
            gate.set()
            text = "open"
        return CallToolResult(content=[TextContent(type="text", text=text)])

    guarded = idempotent_call_tool(store, call_tool, tools=GUARDED, server_name=NAME)

    async def received(ctx: Any, params: CallToolRequestParams) -> CallToolResult:
        arguments = params.arguments or {}
        if params.name not in GUARDED:
            return await guarded(ctx, params)
        order = str(arguments.get("order"))
        key = (params.meta or {}).get(wire.KEY_META)
        ledger.append("calls", {"order": order, "key": key})
        result = await guarded(ctx, params)
        crash_at = arguments.get("crash_at")
        marker = (result.meta or {}).get(wire.IDEMPOTENCY_META) or {}
        if (
            crash_at
            and marker.get("status") == "executed"
            and ledger.count("effects", order) == crash_at
        ):
            os.kill(os.getpid(), signal.SIGKILL)  # stored here, the answer never written
        return result

    async def list_tools(ctx: Any, params: PaginatedRequestParams | None) -> ListToolsResult:
        return ListToolsResult(tools=_tools())

    server = Server(NAME, on_list_tools=guarded.advertise(list_tools), on_call_tool=received)
    try:
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())
    finally:
        with anyio.CancelScope(shield=True):
            await store.aclose()


def command(store: Path, ledger: Path) -> list[str]:
    """The command line that runs this server (for the proxy to start as its stdio child)."""
    return [sys.executable, str(Path(__file__).resolve()), str(store), str(ledger)]


if __name__ == "__main__":
    store_path, folder = sys.argv[1:]
    anyio.run(serve, Path(store_path), Ledger(Path(folder)))
