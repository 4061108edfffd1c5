"""A plain HTTP client (httpx2, the httpx fork the project's HTTP stack uses) speaking streamable
HTTP by hand, against both servers served by uvicorn in processes of their own: `initialize`,
`notifications/initialized`, then `tools/call` POSTs carrying `Mcp-Session-Id` and
`MCP-Protocol-Version` (the 2025-11-25 protocol era), each with whatever `Idempotency-Key` header
the leg sets. Answers are read as the server sends them, JSON or an SSE stream.

What it can do, and so which legs run: every one but stdio (it speaks HTTP only). Any JSON as
arguments and `params._meta`; any header value httpx lets through (an empty value, a tab or
another control character such as 0x01 inside the value; a line break or NUL it refuses itself,
before sending, so those never reach a server); the JSON-RPC error as the server wrote it.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import httpx2
import pytest
from real_clients_kit import (
    ARGUMENT_LEGS,
    EMPTY_HEADER_LEG,
    FLAVORS,
    HEADER,
    HEADER_LEGS,
    META_LEGS,
    Call,
    Caller,
    Outcome,
    Served,
    bad_header,
    charge,
    check_legs,
    fresh,
    invalid_params,
    nothing_written,
)

pytestmark = pytest.mark.anyio

PROTOCOL_VERSION = "2025-11-25"
#: What httpx sends that the fetch-based clients do not: an empty value (also TS) and a control
#: character other than a tab.
RAW_HEADER_LEGS = [EMPTY_HEADER_LEG, bad_header("a\x01b", "printable ASCII")]


def _message(response: httpx2.Response, request_id: int) -> dict[str, Any]:
    """The JSON-RPC answer to `request_id`, from a JSON body or from the SSE stream's events."""
    assert response.status_code == 200, (response.status_code, response.text)
    if response.headers["content-type"].startswith("application/json"):
        answer: dict[str, Any] = response.json()
        return answer
    for line in response.text.splitlines():
        if line.startswith("data:") and line[5:].strip():
            event = json.loads(line[5:])
            if event.get("id") == request_id:
                found: dict[str, Any] = event
                return found
    raise AssertionError(f"no answer to request {request_id} in {response.text!r}")


class RawHttpCaller(Caller):
    def __init__(self, http: httpx2.AsyncClient, url: str) -> None:
        self.http = http
        self.url = url
        self.session: dict[str, str] = {}
        self.next_id = 1

    async def post(
        self,
        method: str,
        params: dict[str, Any],
        header_fields: Sequence[str] = (),
        *,
        notify: bool = False,
    ) -> httpx2.Response:
        """POST one JSON-RPC message; each of `header_fields` is sent as an `Idempotency-Key`
        field of its own (a raw client can send the field twice)."""
        body: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": params}
        if not notify:
            body["id"] = self.next_id
            self.next_id += 1
        headers = [("Accept", "application/json, text/event-stream"), *self.session.items()]
        headers += [(HEADER, value) for value in header_fields]
        return await self.http.post(self.url, json=body, headers=headers)

    async def initialize(self) -> None:
        response = await self.post(
            "initialize",
            {
                "protocolVersion": PROTOCOL_VERSION,
                "capabilities": {},
                "clientInfo": {"name": "raw-httpx", "version": "1.0"},
            },
        )
        answer = _message(response, 1)
        assert answer["result"]["protocolVersion"] == PROTOCOL_VERSION, answer
        self.session = {
            "Mcp-Session-Id": response.headers["mcp-session-id"],
            "MCP-Protocol-Version": PROTOCOL_VERSION,
        }
        initialized = await self.post("notifications/initialized", {}, notify=True)
        assert initialized.status_code == 202, initialized.text

    async def send(self, call: Call) -> Outcome:
        return await self.send_fields(call, [] if call.header is None else [call.header])

    async def send_fields(self, call: Call, header_fields: Sequence[str]) -> Outcome:
        params: dict[str, Any] = {"name": call.tool, "arguments": call.arguments}
        if call.meta is not None:
            params["_meta"] = call.meta
        request_id = self.next_id
        answer = _message(await self.post("tools/call", params, header_fields), request_id)
        if "result" in answer:
            return Outcome(result=answer["result"])
        return Outcome(code=answer["error"]["code"], message=answer["error"]["message"])


@asynccontextmanager
async def raw_client(served: Served) -> AsyncIterator[RawHttpCaller]:
    assert served.url is not None
    async with httpx2.AsyncClient(timeout=30) as http:
        caller = RawHttpCaller(http, served.url)
        await caller.initialize()
        yield caller


@pytest.mark.parametrize("flavor", FLAVORS)
async def test_raw_http_by_hand(flavor: str, http_servers: dict[str, Served]) -> None:
    served = http_servers[flavor]
    async with raw_client(served) as caller:
        legs = [*ARGUMENT_LEGS, *META_LEGS, *HEADER_LEGS, *RAW_HEADER_LEGS]
        await check_legs([*legs, header_field_twice_with_one_value], caller, served)
        await check_legs([header_fields_that_disagree], caller, served)


async def header_field_twice_with_one_value(caller: RawHttpCaller, served: Served) -> None:
    """The header field sent twice with the same value is one key: deduplicated."""
    order, key = fresh("twice"), fresh("h")
    first = await caller.send_fields(Call("charge", charge(order)), [key, key])
    again = await caller.send_fields(Call("charge", charge(order)), [key])
    assert (ran := served.effects(order)) == 1, f"{ran} effects, expected 1"
    assert first.status == "executed" and again.status == "replayed", (first, again)


async def header_fields_that_disagree(caller: RawHttpCaller, served: Served) -> None:
    """The header field sent twice with two values (a gateway adding its own, say): two keys,
    -32602, nothing run."""
    order = fresh("fields")
    before = await served.records()
    refused = await caller.send_fields(Call("charge", charge(order)), [fresh("a"), fresh("b")])
    invalid_params(caller, refused, f"HTTP header '{HEADER}'", "differs")
    await nothing_written(served, before, order)


@pytest.mark.parametrize("value", ["a\nb", "a\rb", "a\x00b"])
async def test_httpx_refuses_line_breaks_and_nul_before_sending(
    value: str, http_servers: dict[str, Served]
) -> None:
    """The control characters no HTTP/1.1 header can carry never reach a server."""
    async with raw_client(http_servers["mcpserver"]) as caller:
        with pytest.raises((httpx2.LocalProtocolError, ValueError)):
            await caller.post("tools/call", {"name": "charge", "arguments": {}}, [value])
