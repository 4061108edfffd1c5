"""The key of one MCP tool call made by a LangGraph tool node: stdlib only, on purpose.

This module is a transcription of two things that live in mcp-once proper, which this
distribution cannot import (mcp-once needs `mcp` 2; `langchain-mcp-adapters` 0.3 needs `mcp` < 2,
so the two never share an environment):

- the wire names (`idempotency.wire.KEY_META`, `IDEMPOTENCY_META`), and
- the key derivation (`orchestrator._key.derive_key`): SHA-256 of the JSON list of the source and
  the parts, the first 40 hex digits, prefixed by the source. Same algorithm, so a reader of a key
  store sees one key shape whichever client wrote it, and the key is 50 printable ASCII
  characters, which `idempotency.wire.key_problem` accepts.

mcp-once's own test suite loads this file by path (it needs nothing but the standard library)
and checks both transcriptions against the originals, so they cannot drift apart unnoticed.
"""

from __future__ import annotations

import hashlib
import json
from typing import Final

#: Request `params._meta`: the idempotency key (`idempotency.wire.KEY_META`).
KEY_META: Final = "io.github.mcp-once/idempotency-key"
#: Result `_meta`: how the answer came about, `status` `executed` or `replayed`
#: (`idempotency.wire.IDEMPOTENCY_META`).
IDEMPOTENCY_META: Final = "io.github.mcp-once/idempotency"
#: The prefix of every key this integration makes: whoever reads a key store sees where it came
#: from.
SOURCE: Final = "langgraph"


def derive_key(source: str, *parts: str) -> str:
    """`orchestrator._key.derive_key`, verbatim: the parts are hashed (their JSON list, so no
    two part lists collide by concatenation) and never reach the wire or a server's logs."""
    digest = hashlib.sha256(json.dumps([source, *parts]).encode()).hexdigest()
    return f"{source}-{digest[:40]}"


def checkpoint_key(
    *, thread_id: str, checkpoint_ns: str, checkpoint_id: str, tool_call_id: str, tool: str
) -> str:
    """The key of the MCP call that tool call `tool_call_id` (of the model's message) makes to
    `tool`, in the task `checkpoint_ns` of the step that runs from checkpoint `checkpoint_id` of
    thread `thread_id`. Every part is what LangGraph hands the same task again when it resumes
    the thread from its checkpoint, so a re-run sends the same key."""
    return derive_key(SOURCE, thread_id, checkpoint_ns, checkpoint_id, tool_call_id, tool)
