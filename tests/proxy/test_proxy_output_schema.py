"""An upstream whose first answer does not fit the output schema it lists itself: the proxy
runs the effect once, passes that answer on as the upstream sent it (the caller's SDK judges
it), and answers the key's re-send -32014 naming both possible causes (the upstream's own answer,
or an operator's settle) instead of blaming an operator. The upstream is a stdio child with an
effect ledger (`misfit_server.py`); the proxy runs in this process (the slow tier)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from fastmcp import Client
from mcp import MCPError
from proxy_kit import HERE, lines, meta_key

from idempotency import MemoryKeyStore, wire
from mcp_once.proxy import Upstream, build_proxy

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.slow,
    pytest.mark.parametrize("anyio_backend", ["asyncio"]),
]


async def test_a_re_send_of_an_upstream_answer_outside_its_schema_names_the_upstream(
    anyio_backend: str, tmp_path: Path
) -> None:
    ledger = tmp_path / "effects"
    upstream = Upstream.stdio(sys.executable, str(HERE / "misfit_server.py"), str(ledger))
    proxy = build_proxy(upstream, MemoryKeyStore())
    async with proxy.opened(), Client(proxy) as client:
        await client.list_tools()
        key: dict[str, Any] = meta_key("misfit-1")
        with pytest.raises(RuntimeError, match="Invalid structured content"):
            await client.call_tool_mcp("count", {"text": "once"}, meta=key)  # the caller's SDK
        assert lines(ledger) == 1
        with pytest.raises(MCPError) as refused:
            await client.call_tool_mcp("count", {"text": "once"}, meta=key)
        assert refused.value.error.code == wire.CORRUPT_RECORD
        message = refused.value.error.message
        assert "the upstream's own answer" in message and "settled by an operator" in message
        assert "keys settle" in message
        assert lines(ledger) == 1  # nothing ran again
