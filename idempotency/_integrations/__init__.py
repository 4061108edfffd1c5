"""The framework integrations: how each server framework hands its tool calls to the guard.

Each one describes a call in the guard's terms (`_guard.guard.ToolCall`), says how its framework
runs the tool, renders an exception and answers unguarded, and lists guarded tools as the guard
advertises them. A framework's registration, middleware and result types are known here (and in
the public `idempotency/fastmcp.py`) only: the guard (`_guard/`) speaks the mcp SDK's requests,
results and errors, and the stores (`_stores/`) no framework at all.

- `mcpserver/`: the mcp SDK's `MCPServer`: `@idempotent` (`decorator.py`), `install`
  (`install.py`), the one module that touches `MCPServer` internals (`sdk.py`) and the per-caller
  tools/list answer (`listing.py`);
- `lowlevel.py`: the mcp SDK's low-level `Server` (`idempotent_call_tool`);
- `reconcile_records.py`: `reconcile_unknown(app, store)`, every in-doubt record of a server put
  to its tool's reconciler, found through the guards the app carries (rule 19);
- `fastmcp/`: the internals of the FastMCP middleware, whose public home is
  `idempotency/fastmcp.py` (imported only by those who install the `fastmcp` extra).
"""
