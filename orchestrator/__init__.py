"""mcp-once, client side: annotation-gated, keyed retries for MCP tool calls."""

__all__: list[str] = []
