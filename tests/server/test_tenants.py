"""Rule 7 over a real authenticated transport: keys are scoped by the authenticated principal, so
tenant B sending tenant A's key never receives A's result. Bearer tokens are checked by a
`TokenVerifier` (the SDK's resource-server mode) on streamable HTTP at 127.0.0.1."""

from __future__ import annotations

from typing import Any

import anyio
import httpx2
import pytest
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import MCPServer
from server_kit import SOON, answer, body, caller_gave_up, marker, meta, serve_http

from idempotency import KeyStore, idempotent

pytestmark = pytest.mark.anyio


class Tokens:
    """`Bearer tenant-<name>` authenticates client `<name>`."""

    async def verify_token(self, token: str) -> AccessToken | None:
        if not token.startswith("tenant-"):
            return None
        return AccessToken(token=token, client_id=token.removeprefix("tenant-"), scopes=[])


def bank(store: KeyStore, ledger: list[str]) -> MCPServer:
    server = MCPServer(
        "bank",
        auth=AuthSettings(issuer_url="http://127.0.0.1", resource_server_url=None),
        token_verifier=Tokens(),
    )

    @server.tool()
    @idempotent(store)
    async def open_account(owner: str) -> str:
        ledger.append(owner)
        return f"account #{len(ledger)} for {owner}"

    return server


async def call_as(url: str, tenant: str, key: str | None, **args: Any) -> Any:
    headers = {"Authorization": f"Bearer tenant-{tenant}"}
    async with (
        httpx2.AsyncClient(headers=headers) as http,
        Client(streamable_http_client(url, http_client=http)) as client,
    ):
        return await client.call_tool("open_account", args, meta=None if key is None else meta(key))


async def test_one_tenants_key_never_returns_anothers_result(store: KeyStore) -> None:
    ledger: list[str] = []
    server = bank(store, ledger)
    with anyio.fail_after(SOON):
        async with serve_http(server.streamable_http_app(json_response=True)) as base:
            url = f"{base}/mcp"
            a_first = await call_as(url, "a", "shared-key", owner="same")
            b_same_key = await call_as(url, "b", "shared-key", owner="same")
            a_retry = await call_as(url, "a", "shared-key", owner="same")
            b_retry = await call_as(url, "b", "shared-key", owner="same")
            # Derived keys are scoped too: identical keyless calls from two tenants both run.
            a_keyless = await call_as(url, "a", None, owner="z")
            b_keyless = await call_as(url, "b", None, owner="z")
            # Both gave up on their answers: a's re-send gets a's, never b's (rule 15 merges
            # only re-sends).
            await caller_gave_up(store)
            a_keyless_again = await call_as(url, "a", None, owner="z")
    assert ledger == ["same", "same", "z", "z"]
    assert body(a_first)["content"][0]["text"] == "account #1 for same"
    assert body(b_same_key)["content"][0]["text"] == "account #2 for same"
    assert marker(b_same_key)["status"] == "executed"
    assert answer(a_retry) == answer(a_first)
    assert answer(b_retry) == answer(b_same_key)
    assert marker(b_keyless)["status"] == "executed"
    assert marker(a_keyless)["key"] != marker(b_keyless)["key"]
    assert answer(a_keyless_again) == answer(a_keyless)
