"""mcp-once for LangGraph: each MCP tool call keyed from the checkpoint it runs under.

A LangGraph thread resumed from its checkpoint after a crash runs the interrupted tool node
again. With `CheckpointKeys` as the last of `langchain-mcp-adapters`' tool interceptors, the
call it makes again carries the same idempotency key (thread, checkpoint namespace, checkpoint
id, the model's `tool_call_id`, tool), so a server guarded by mcp-once replays the stored result
instead of running the tool a second time. The graph must run with `durability="sync"`: see
`CheckpointKeys`.

A separate distribution (`mcp-once-langgraph`) because `langchain-mcp-adapters` 0.3 needs
`mcp` < 2 and mcp-once needs `mcp` 2: it depends on neither mcp-once nor `mcp` 2, and talks to
the server only through the wire contract (the key in the request's `_meta`).
"""

from __future__ import annotations

from ._interceptor import CallIdentity, CheckpointKeys, DurabilityError, OnUnsafe, call_identity
from ._key import IDEMPOTENCY_META, KEY_META, checkpoint_key

__all__ = [
    "IDEMPOTENCY_META",
    "KEY_META",
    "CallIdentity",
    "CheckpointKeys",
    "DurabilityError",
    "OnUnsafe",
    "call_identity",
    "checkpoint_key",
]
