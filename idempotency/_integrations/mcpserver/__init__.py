"""The guard on the mcp SDK's `MCPServer`: `@idempotent` for one tool, `install` for every tool.

Both wrap the tool's function (`decorator.py`, `install.py`); `sdk.py` is the one place that
touches `MCPServer` internals (and FastMCP's registration, to refuse guarded functions there);
`listing.py` tells each caller of tools/list what holds for it.
"""
