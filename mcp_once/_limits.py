"""The front's default bounds, where both the CLI (without FastMCP) and `mcp_once.proxy.limits`
read them: one request body, and one principal's calls in flight."""

#: A request body's bound: far above any tool call a model writes, far below what hurts a
#: server's memory.
DEFAULT_MAX_BODY = 4 * 1024 * 1024
#: One principal's calls running at once.
DEFAULT_MAX_IN_FLIGHT = 64
