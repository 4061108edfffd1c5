"""`python -m mcp_once`: the `mcp-once` command without the console script."""

from mcp_once._cli import entry

entry()
