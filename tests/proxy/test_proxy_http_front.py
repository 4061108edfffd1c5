"""The `--listen` front answers a request JSON when its answer is its first message
(`mcp_once/proxy/http_front.py`), and SSE, as the SDK does, when anything comes first.

The proxy's own HTTP app under uvicorn in this process (so a test can shorten the hold), in front
of the conformance fixture over HTTP (a real process that logs, reports progress and samples):
raw POSTs show the wire (content type, events, status codes, sessions), and the SDK's and
FastMCP's clients show that callers still get every message. The last test goes through the
`mcp-once proxy --listen` command itself.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import httpx2 as httpx
import mcp_types
import pytest
from fastmcp import Client as FastMCPClient
from mcp.client import Client
from mcp.server.streamable_http import StreamableHTTPServerTransport
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from proxy_kit import (
    conformance_fixture,
    initialize_request,
    meta_key,
    proxied_fixture,
    source_hashes,
    status,
)
from server_kit import serve_http

from idempotency import MemoryKeyStore
from mcp_once.proxy import Upstream, build_proxy, http_front
from mcp_once.proxy.upstream import UpstreamLink

pytestmark = pytest.mark.anyio

BOTH = "application/json, text/event-stream"
ERA = "2025-06-18"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # uvicorn serves the front in this process


@pytest.fixture(scope="module")
def upstream() -> Iterator[str]:
    with conformance_fixture() as url:
        yield url


@pytest.fixture
async def front(upstream: str) -> AsyncIterator[str]:
    """The proxy (memory store) in front of the fixture, served by uvicorn here: its URL."""
    proxy = build_proxy(Upstream.http(upstream), MemoryKeyStore())
    async with proxy.opened(), serve_http(proxy.http_app(host_origin_protection="auto")) as base:
        yield f"{base}/mcp"


class Wire:
    """A handshake-era session spoken as raw HTTP."""

    def __init__(self, http: httpx.AsyncClient, url: str, era: str = ERA) -> None:
        self.http, self.url, self.era = http, url, era
        self.headers: dict[str, str] = {"Content-Type": "application/json", "Accept": BOTH}
        self.ids = iter(range(2, 1000))

    async def open(self) -> httpx.Response:
        opening = initialize_request()
        opening["params"]["protocolVersion"] = self.era
        opened = await self.http.post(self.url, json=opening, headers=self.headers)
        self.headers["Mcp-Session-Id"] = opened.headers["mcp-session-id"]
        self.headers["MCP-Protocol-Version"] = self.era
        note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        assert (await self.post(note)).status_code == 202
        return opened

    async def post(self, body: dict[str, Any], **headers: str) -> httpx.Response:
        return await self.http.post(self.url, json=body, headers={**self.headers, **headers})

    async def call(self, tool: str, arguments: dict[str, Any], **meta: Any) -> httpx.Response:
        params: dict[str, Any] = {"name": tool, "arguments": arguments}
        if meta:
            params["_meta"] = meta
        body = {"jsonrpc": "2.0", "id": next(self.ids), "method": "tools/call", "params": params}
        return await self.post(body)


def content_type(answer: httpx.Response) -> str:
    return answer.headers["content-type"].split(";")[0]


def events(answer: httpx.Response) -> list[dict[str, Any]]:
    """The JSON-RPC messages of an SSE answer, in order (the priming and ping events skipped)."""
    found = []
    for line in answer.text.splitlines():
        if line.startswith("data:") and line.removeprefix("data:").strip():
            found.append(json.loads(line.removeprefix("data:")))
    return found


async def test_an_answer_that_comes_first_is_json_and_anything_else_opens_the_stream(
    front: str,
) -> None:
    """initialize and a plain call answer `application/json`; a call that reports progress, or
    logs, before its answer gets SSE with every one of those messages, then the answer."""
    async with httpx.AsyncClient(timeout=30) as http:
        wire = Wire(http, front)
        opened = await wire.open()
        assert (opened.status_code, content_type(opened)) == (200, "application/json")
        assert opened.json()["result"]["protocolVersion"] == ERA

        plain = await wire.call("test_simple_text", {})
        assert (plain.status_code, content_type(plain)) == (200, "application/json")
        assert plain.headers["mcp-session-id"] == wire.headers["Mcp-Session-Id"]
        assert plain.json()["result"]["content"][0]["type"] == "text"

        progress = await wire.call("test_tool_with_progress", {}, progressToken="p-1")
        assert (progress.status_code, content_type(progress)) == (200, "text/event-stream")
        sent = events(progress)
        assert [m["params"]["progress"] for m in sent[:-1]] == [0, 50, 100]
        assert all(m["params"]["progressToken"] == "p-1" for m in sent[:-1])
        assert "result" in sent[-1]

        logged = await wire.call("test_tool_with_logging", {})
        assert content_type(logged) == "text/event-stream"
        sent = events(logged)
        assert [m["method"] for m in sent[:-1]] == ["notifications/message"] * 3
        assert "result" in sent[-1]


async def test_an_authenticated_front_answers_json_too(upstream: str) -> None:
    """Behind FastMCP's auth (the endpoint wrapped in its RequireAuthMiddleware) the front is
    found and held all the same; a caller without a token is refused as before."""
    from fastmcp.server.auth.providers.jwt import StaticTokenVerifier

    auth = StaticTokenVerifier({"t-1": {"client_id": "ann", "sub": "ann", "scopes": []}})
    proxy = build_proxy(Upstream.http(upstream), MemoryKeyStore(), auth=auth)
    app = proxy.http_app(host_origin_protection="auto")
    async with proxy.opened(), serve_http(app) as base, httpx.AsyncClient(timeout=30) as http:
        wire = Wire(http, f"{base}/mcp")
        refused = await http.post(wire.url, json=initialize_request(), headers=wire.headers)
        wire.headers["Authorization"] = "Bearer t-1"
        opened = await wire.open()
        answer = await wire.call("test_simple_text", {})
    assert refused.status_code == 401
    assert [content_type(a) for a in (opened, answer)] == ["application/json"] * 2


async def test_a_guarded_call_and_its_replay_answer_json(front: str) -> None:
    """A keyed call goes through the guard and answers JSON; its replay too."""
    async with httpx.AsyncClient(timeout=30) as http:
        wire = Wire(http, front)
        await wire.open()
        answers = [await wire.call("test_simple_text", {}, **meta_key("k-1")) for _ in range(2)]
    assert [content_type(a) for a in answers] == ["application/json"] * 2
    marks = [a.json()["result"]["_meta"]["io.github.mcp-once/idempotency"] for a in answers]
    assert [m["status"] for m in marks] == ["executed", "replayed"]


async def test_errors_answer_json_with_their_id(front: str) -> None:
    """A JSON-RPC error for the request (an unknown method) is its answer too: JSON, its id."""
    async with httpx.AsyncClient(timeout=30) as http:
        wire = Wire(http, front)
        await wire.open()
        answer = await wire.post({"jsonrpc": "2.0", "id": 7, "method": "no/such"})
    assert (answer.status_code, content_type(answer)) == (200, "application/json")
    assert answer.json()["id"] == 7 and answer.json()["error"]["code"] == -32601


@pytest.mark.parametrize(
    ("accept", "expected"),
    [
        ("text/event-stream", 406),  # the SDK's transport needs both types listed
        ("application/json", 406),
        ("*/*", 200),
        ("application/*, text/*", 200),
    ],
)
async def test_accept_is_checked_as_the_sdk_checks_it(
    front: str, accept: str, expected: int
) -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        wire = Wire(http, front)
        await wire.open()
        answer = await wire.post({"jsonrpc": "2.0", "id": 3, "method": "tools/list"}, Accept=accept)
    assert answer.status_code == expected
    if expected == 200:
        assert content_type(answer) == "application/json"


async def test_sessions_behave_as_the_sdk_s(front: str) -> None:
    """An unknown session is 404, a request without one 400; DELETE ends the session (404
    after); a GET opens the session's own stream."""
    async with httpx.AsyncClient(timeout=30) as http:
        wire = Wire(http, front)
        await wire.open()
        listing = {"jsonrpc": "2.0", "id": 3, "method": "tools/list"}
        assert (await wire.post(listing, **{"Mcp-Session-Id": "nope"})).status_code == 404
        headers = {k: v for k, v in wire.headers.items() if k != "Mcp-Session-Id"}
        missing = await http.post(front, json=listing, headers=headers)
        assert missing.status_code == 400
        get_headers = {**wire.headers, "Accept": "text/event-stream"}
        async with http.stream("GET", front, headers=get_headers) as stream:
            assert (stream.status_code, content_type(stream)) == (200, "text/event-stream")
        assert (await http.delete(front, headers=wire.headers)).status_code == 200
        assert (await wire.post(listing)).status_code == 404


async def test_a_call_quiet_past_the_hold_gets_the_stream(
    front: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call that sends nothing within `HOLD` gets its SSE stream (and pings) then, its answer
    an event on it: an idle-read timeout sees headers no later than the SDK's stream's ping."""
    monkeypatch.setattr(http_front, "HOLD", 0.0)
    async with httpx.AsyncClient(timeout=30) as http:
        wire = Wire(http, front)
        await wire.open()
        answer = await wire.call("test_simple_text", {})
    assert (answer.status_code, content_type(answer)) == (200, "text/event-stream")
    assert [("result" in m) for m in events(answer)] == [True]


@pytest.mark.parametrize("hold", [http_front.HOLD, 0.0])
async def test_a_call_cancelled_during_the_hold_gets_its_error_as_the_sdk_s_stream_would(
    front: str, hold: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A caller cancels a call while the front holds its headers: the call's one message, the
    SDK's -32800 for its id, is its answer (JSON), as it is the one event of the SDK's stream
    (the hold already over: SSE). The guard lets the upstream's run end first, in both."""
    monkeypatch.setattr(http_front, "HOLD", hold)
    upstream_sent = anyio.Event()  # the guarded call is sent upstream: it is running there
    original = UpstreamLink.sent

    async def sending(self: UpstreamLink, *args: Any, **kwargs: Any) -> Any:
        upstream_sent.set()
        return await original(self, *args, **kwargs)

    monkeypatch.setattr(UpstreamLink, "sent", sending)
    answers: list[httpx.Response] = []
    async with httpx.AsyncClient(timeout=30) as http:
        wire = Wire(http, front)
        await wire.open()
        slow = {"name": "slow_compute", "arguments": {"seconds": 1}}

        async def call() -> None:
            body = {"jsonrpc": "2.0", "id": 91, "method": "tools/call", "params": slow}
            answers.append(await wire.post(body))

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            with anyio.fail_after(10):
                await upstream_sent.wait()
            cancel = {"requestId": 91, "reason": "the caller gave up"}
            note = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": cancel}
            assert (await wire.post(note)).status_code == 202
    (answer,) = answers
    expected = "application/json" if hold else "text/event-stream"
    assert (answer.status_code, content_type(answer)) == (200, expected)
    (message,) = [answer.json()] if hold else events(answer)
    assert (message["id"], message["error"]["code"]) == (91, -32800)


async def test_a_resumable_stream_starts_with_its_priming_event_as_the_sdk_s(
    upstream: str,
) -> None:
    """With an event store, a 2025-11-25 caller's request stream starts with the priming event
    (its cursor to resume from), so it is the SDK's SSE answer at once, the result after it."""
    from fastmcp.server.event_store import EventStore

    proxy = build_proxy(Upstream.http(upstream), MemoryKeyStore())
    app = proxy.http_app(event_store=EventStore(), host_origin_protection="auto")
    async with proxy.opened(), serve_http(app) as base, httpx.AsyncClient(timeout=30) as http:
        wire = Wire(http, f"{base}/mcp", era="2025-11-25")
        await wire.open()
        answer = await wire.call("test_simple_text", {})
    assert content_type(answer) == "text/event-stream"
    priming, *_ = answer.text.split("\r\n\r\n")
    assert priming.startswith("id:") and "data: \r\n" in priming + "\r\n"
    assert [("result" in m) for m in events(answer)] == [True]


async def test_sdk_client_gets_progress_logs_and_sampling_in_both_eras(front: str) -> None:
    """The SDK's client, handshake era and 2026-07-28 (served by the SDK's own path, which
    defers the same way): a plain call and progress; in the handshake era log lines and the
    upstream's sampling question during a call, answered by the caller."""
    progress: list[float] = []
    logs: list[Any] = []
    prompts: list[str] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(value)

    async def on_log(params: mcp_types.LoggingMessageNotificationParams) -> None:
        logs.append(params.data)

    async def sample(context: Any, params: mcp_types.CreateMessageRequestParams) -> Any:
        prompts.append(str(params.messages[0].content.text))  # type: ignore[union-attr]
        content = mcp_types.TextContent(type="text", text="sampled")
        return mcp_types.CreateMessageResult(role="assistant", content=content, model="m")

    for mode in ("legacy", "2026-07-28"):
        progress.clear()
        logs.clear()
        async with Client(
            front, mode=mode, logging_callback=on_log, sampling_callback=sample
        ) as client:
            plain = await client.call_tool("test_simple_text", {})
            assert plain.content[0].type == "text"
            await client.call_tool("test_tool_with_progress", {}, progress_callback=on_progress)
            assert progress == [0, 50, 100], mode
            if mode == "legacy":  # 2026-07-28: log lines only when a call asks (SEP-2577)
                await client.call_tool("test_tool_with_logging", {})
                assert len(logs) == 3
                sampled = await client.call_tool("test_sampling", {"prompt": "p-1"})
                assert sampled.content[0].text == "LLM response: sampled"  # type: ignore[union-attr]
    assert prompts == ["p-1"]


async def test_fastmcp_client_gets_its_answers_logs_and_sampling(front: str) -> None:
    logs: list[Any] = []
    prompts: list[str] = []

    async def log(message: mcp_types.LoggingMessageNotificationParams) -> None:
        logs.append(message)

    async def sample(messages: list[Any], params: Any, context: Any) -> str:
        prompts.append(str(messages[0].content.text))
        return "sampled"

    client = FastMCPClient(front, log_handler=log, sampling_handler=sample, mode="legacy")
    async with client:
        keyed = [
            await client.call_tool_mcp("test_simple_text", {}, meta=meta_key("f-1"))
            for _ in range(2)
        ]
        assert [status(c) for c in keyed] == ["executed", "replayed"]
        await client.call_tool_mcp("test_tool_with_logging", {})
        sampled = await client.call_tool_mcp("test_sampling", {"prompt": "p-2"})
    assert len(logs) == 3
    assert prompts == ["p-2"]
    assert sampled.content[0].text == "LLM response: sampled"  # type: ignore[union-attr]


@pytest.mark.slow  # two processes started for this one test
async def test_the_listen_command_answers_a_plain_call_json() -> None:
    """`mcp-once proxy --listen` itself (the CLI builds its app the same way)."""
    with proxied_fixture("memory://") as url:
        async with httpx.AsyncClient(timeout=30) as http:
            wire = Wire(http, url)
            assert content_type(await wire.open()) == "application/json"
            assert content_type(await wire.call("test_simple_text", {})) == "application/json"
            progress = await wire.call("test_tool_with_progress", {}, progressToken=1)
            assert content_type(progress) == "text/event-stream"


#: sha256 of the pinned SDK's (mcp 2.3.0) methods that `http_front` copies or relies on.
PINNED = {
    "StreamableHTTPServerTransport._handle_post_request": (
        "cc4f2cd0c9e317a21143498e9439365cce6a147fbb88661a3e997ccefc2a0139"
    ),
    "StreamableHTTPServerTransport._run_sse_writer": (
        "886892073c4e09e1a672a285a53c044f11e83972fc439a45b07591a1064db0b8"
    ),
    "StreamableHTTPSessionManager._admit_session": (
        "be70a49c7998add896e005f478d84fb33c29778fd5f479c66cf7df50d9bf5a4f"
    ),
}


def test_the_copied_sdk_code_is_the_pinned_sdk_s() -> None:
    """`HeldFrontTransport._handle_post_request` is a copy of the SDK's with its SSE branch
    replaced, its SSE answers go through the SDK's `_run_sse_writer`, and `HeldFrontManager`
    re-types the transport `_admit_session` builds: a new SDK that changes any of them fails
    here, to re-check `mcp_once/proxy/http_front.py` against it and then update the pin."""
    owners = {
        "StreamableHTTPServerTransport": StreamableHTTPServerTransport,
        "StreamableHTTPSessionManager": StreamableHTTPSessionManager,
    }
    assert source_hashes(owners, PINNED) == PINNED, (
        "the SDK's code that mcp_once/proxy/http_front.py copies or relies on changed:"
        " re-check HeldFrontTransport/HeldFrontManager against it, then update PINNED"
    )
