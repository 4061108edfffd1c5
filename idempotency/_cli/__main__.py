"""`python -m idempotency._cli`: the `mcp-once` command without the console script."""

from . import entry

entry()
