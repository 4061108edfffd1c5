"""A plain `mcp` Python client (`mcp.Client`, the SDK's own; no mcp-once on the client) against
both servers, over stdio (a server subprocess) and streamable HTTP in both protocol eras
(2025-11-25 sessions, and 2026-07-28 where the client negotiates it).

What it can do, and so which legs run: every one. Any JSON as arguments; request `_meta` through
`call_tool(..., meta=...)`; the header through the headers of the `httpx2.AsyncClient` it is
given (changed between calls); the JSON-RPC error as `MCPError` with its code. The header's
bad-value cases run with the raw HTTP client and the TypeScript SDK; here, the same header legs
that any application would meet.
"""

from __future__ import annotations

from typing import cast

import httpx2
import pytest
from mcp import Client, MCPError
from mcp_types import RequestParamsMeta
from real_clients_kit import (
    ARGUMENT_LEGS,
    FLAVORS,
    HEADER_LEGS,
    META_LEGS,
    PYTHON_SETTINGS,
    Call,
    Caller,
    Outcome,
    check_legs,
    outcome_of,
    python_client,
    refusal,
    served_in,
    set_header,
)

pytestmark = pytest.mark.anyio


class PlainCaller(Caller):
    def __init__(self, client: Client, http: httpx2.AsyncClient | None) -> None:
        self.client = client
        self.http = http

    async def send(self, call: Call) -> Outcome:
        set_header(self.http, call.header)
        meta = cast(RequestParamsMeta | None, call.meta)
        try:
            sent = await self.client.call_tool(call.tool, call.arguments, meta=meta)
            return outcome_of(sent)
        except MCPError as error:
            return refusal(error)


@pytest.mark.parametrize("setting", PYTHON_SETTINGS)
@pytest.mark.parametrize("flavor", FLAVORS)
async def test_plain_mcp_client(
    flavor: str,
    setting: str,
    request: pytest.FixtureRequest,
) -> None:
    http = setting != "stdio"
    served = served_in(request, flavor, http=http)
    legs = ARGUMENT_LEGS + META_LEGS + (HEADER_LEGS if http else [])
    async with python_client(served, setting) as (client, http_client):
        await check_legs(legs, PlainCaller(client, http_client), served)
        era = client.protocol_version
    assert era == ERAS.get(setting, era)


#: The era each HTTP setting speaks (both servers speak both over streamable HTTP).
ERAS = {"http-legacy": "2025-11-25", "http-modern": "2026-07-28"}
