"""Rule 7 for keys the server derives: a keyless call's stored result goes back only to the caller
that produced it, conversations with the client are never replayed to someone else, and the
listing tells each caller what it really gets.

A server without authentication, every tool guarded by `install()` with default options. In
every setting: what the caller is told when it lists (`idempotentHint`, `keys`) must match what
happens when it re-sends an identical keyless call, and a second, independent client making the
same call must run the tool itself and never see the first client's result.
"""

from __future__ import annotations

import sqlite3
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp.client import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import Context, MCPServer
from mcp_types import (
    CallToolResult,
    CreateMessageRequestParams,
    CreateMessageResult,
    ElicitRequest,
    ElicitRequestFormParams,
    ElicitRequestParams,
    ElicitResult,
    InputRequiredResult,
    LoggingMessageNotificationParams,
    TextContent,
    Tool,
)
from pydantic import BaseModel
from server_kit import SOON, answer, caller_gave_up, marker, serve_http

from idempotency import MemoryKeyStore, SQLiteKeyStore, install, wire
from orchestrator.chaos import in_memory_transport

pytestmark = pytest.mark.anyio

STDIO_SERVER = Path(__file__).with_name("effect_server.py")


class Answer(BaseModel):
    text: str


@dataclass
class Talk:
    """What the tools did, counted outside the answers they give."""

    notes: int = 0
    completions: int = 0
    store: MemoryKeyStore = field(default_factory=MemoryKeyStore)


def talk_server(talk: Talk, *, auth: bool = False) -> MCPServer:
    """Tools with an effect, and tools that talk back to their caller; all guarded, defaults."""
    kwargs: dict[str, Any] = {}
    if auth:
        kwargs = {
            "auth": AuthSettings(issuer_url="http://127.0.0.1", resource_server_url=None),
            "token_verifier": Tokens(),
        }
    server = MCPServer("talk", **kwargs)

    @server.tool()
    async def note(text: str) -> str:
        talk.notes += 1
        return f"noted {text!r} as note {talk.notes}"

    @server.tool()
    async def interview(question: str, ctx: Context) -> str:
        """Handshake era: asks the caller through elicitation, then through sampling, and logs."""
        await ctx.info(f"asking {question!r}")
        reply = await ctx.elicit(question, Answer)
        assert reply.action == "accept" and reply.data is not None
        sampled = await ctx.request_context.session.create_message(
            [], max_tokens=5, system_prompt=question
        )
        assert isinstance(sampled.content, TextContent)
        return f"{reply.data.text} / {sampled.content.text}"

    asked = 0

    @server.tool()
    async def survey(topic: str, ctx: Context) -> CallToolResult | InputRequiredResult:
        """2026-07-28 era: asks through an input round, with a new question every time."""
        nonlocal asked
        if ctx.input_responses is None:
            asked += 1
            form = ElicitRequestFormParams(
                message=f"question {asked} about {topic}",
                requested_schema={"type": "object", "properties": {"text": {"type": "string"}}},
            )
            return InputRequiredResult(
                input_requests={"q": ElicitRequest(params=form)}, request_state=f"q{asked}"
            )
        talk.completions += 1
        response = ctx.input_responses["q"]
        assert isinstance(response, ElicitResult) and response.content is not None
        text = f"{ctx.request_state}: {response.content['text']}"
        return CallToolResult(content=[TextContent(type="text", text=text)])

    install(server, talk.store)
    return server


class Tokens:
    """`Bearer user-<name>` authenticates client `<name>`."""

    async def verify_token(self, token: str) -> AccessToken | None:
        if not token.startswith("user-"):
            return None
        return AccessToken(token=token, client_id=token.removeprefix("user-"), scopes=[])


OpenClient = Callable[[], AbstractAsyncContextManager[Client]]


@asynccontextmanager
async def http_client(url: str, mode: str, user: str | None = None) -> AsyncIterator[Client]:
    headers = {} if user is None else {"Authorization": f"Bearer user-{user}"}
    async with (
        httpx2.AsyncClient(headers=headers) as http,
        Client(streamable_http_client(url, http_client=http), mode=mode) as client,
    ):
        yield client


@asynccontextmanager
async def setting(name: str, server: MCPServer) -> AsyncIterator[tuple[OpenClient, OpenClient]]:
    """Two ways to open independent clients to `server` in this setting: (first, second)."""
    if name == "memory-legacy":
        yield (lambda: Client(server, mode="legacy")), (lambda: Client(server, mode="legacy"))
    elif name == "memory-modern":
        yield (
            (lambda: Client(in_memory_transport(server))),
            (lambda: Client(in_memory_transport(server))),
        )
    elif name == "direct-modern":
        yield (lambda: Client(server)), (lambda: Client(server))
    else:
        stateless = name == "http-legacy-stateless"
        app = server.streamable_http_app(stateless_http=stateless)
        async with serve_http(app) as base:
            url = f"{base}/mcp"
            mode = "auto" if name.startswith("http-modern") else "legacy"
            if name.endswith("-auth"):
                yield (
                    (lambda: http_client(url, mode, "ann")),
                    (lambda: http_client(url, mode, "bob")),
                )
            else:
                yield (lambda: http_client(url, mode)), (lambda: http_client(url, mode))


#: setting -> does it have a caller identity (so keyless re-sends are merged for that caller)?
SETTINGS = {
    "memory-legacy": True,
    "memory-modern": True,
    "direct-modern": False,
    "http-legacy": True,
    "http-legacy-stateless": False,
    "http-modern": False,
    "http-legacy-auth": True,
    "http-modern-auth": True,
}


def advertised(tool: Tool) -> tuple[bool, str]:
    hint = tool.annotations is not None and tool.annotations.idempotent_hint is True
    return hint, (tool.meta or {})[wire.IDEMPOTENCY_META]["keys"]


@pytest.mark.parametrize("name", SETTINGS)
async def test_listing_matches_what_a_keyless_resend_gets_and_clients_stay_apart(
    name: str,
) -> None:
    talk = Talk()
    server = talk_server(talk, auth=name.endswith("-auth"))
    merged = SETTINGS[name]
    with anyio.fail_after(SOON):
        async with setting(name, server) as (first, second):
            async with first() as ann:
                tools = {t.name: t for t in (await ann.list_tools()).tools}
                sent = await ann.call_tool("note", {"text": "hello"})
                # A delivered answer's repeat runs; once its caller gave up on the answer, the
                # identical call is a re-send (rule 15).
                repeat = await ann.call_tool("note", {"text": "hello"})
                await caller_gave_up(talk.store)
                resent = await ann.call_tool("note", {"text": "hello"})
            async with second() as bob:
                bobs_tools = {t.name: t for t in (await bob.list_tools()).tools}
                bobs = await bob.call_tool("note", {"text": "hello"})
    # The listing is the truth about a keyless re-send from this caller.
    assert advertised(tools["note"]) == (merged, "derived" if merged else "optional")
    assert advertised(bobs_tools["note"]) == advertised(tools["note"])
    if merged:
        assert marker(repeat)["status"] == "executed" and repeat.content != sent.content
        assert marker(resent)["status"] == "replayed" and answer(resent) == answer(repeat)
        assert marker(sent)["keySource"] == "derived"
    else:
        assert wire.IDEMPOTENCY_META not in (resent.meta or {})
        assert resent.content != repeat.content != sent.content
    # Another client never receives the first one's result: it runs the tool itself.
    assert talk.notes == (3 if merged else 4)
    assert isinstance(bobs.content[0], TextContent)
    assert bobs.content[0].text == f"noted 'hello' as note {talk.notes}"
    if merged:
        assert marker(bobs)["status"] == "executed"
        assert marker(bobs)["key"] != marker(sent)["key"]


async def test_one_principal_is_one_caller_across_connections() -> None:
    """With authentication the caller is the user, whichever connection it comes over."""
    talk = Talk()
    server = talk_server(talk, auth=True)
    with anyio.fail_after(SOON):
        async with serve_http(server.streamable_http_app()) as base:
            url = f"{base}/mcp"
            async with http_client(url, "auto", "ann") as first:
                sent = await first.call_tool("note", {"text": "hi"})
            await caller_gave_up(talk.store)
            async with http_client(url, "legacy", "ann") as again:
                resent = await again.call_tool("note", {"text": "hi"})
            async with http_client(url, "auto", "bob") as other:
                bobs = await other.call_tool("note", {"text": "hi"})
    assert talk.notes == 2
    assert marker(resent)["status"] == "replayed" and answer(resent) == answer(sent)
    assert marker(bobs)["status"] == "executed"


class Person:
    """A client's user: answers elicitation and sampling, and reads log messages."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.asked: list[str] = []
        self.logs = 0

    async def elicit(self, context: Any, params: ElicitRequestParams) -> ElicitResult:
        self.asked.append(params.message)
        return ElicitResult(action="accept", content={"text": f"{self.name} answers"})

    async def sample(self, context: Any, params: CreateMessageRequestParams) -> CreateMessageResult:
        self.asked.append(f"sampled {params.system_prompt}")
        return CreateMessageResult(
            role="assistant",
            content=TextContent(type="text", text=f"{self.name}'s model"),
            model="m",
        )

    async def log(self, params: LoggingMessageNotificationParams) -> None:
        self.logs += 1

    def client(self, target: Any, **kwargs: Any) -> Client:
        return Client(
            target,
            elicitation_callback=self.elicit,
            sampling_callback=self.sample,
            logging_callback=self.log,
            **kwargs,
        )


@asynccontextmanager
async def two_people(
    transport: str, server: MCPServer, ann: Person, bob: Person
) -> AsyncIterator[tuple[Client, Client]]:
    """Ann's and Bob's clients, each on its own connection (handshake era)."""
    if transport == "memory":
        async with (
            ann.client(server, mode="legacy") as a,
            bob.client(server, mode="legacy") as b,
        ):
            yield a, b
        return
    async with (
        serve_http(server.streamable_http_app()) as base,
        ann.client(f"{base}/mcp", mode="legacy") as a,
        bob.client(f"{base}/mcp", mode="legacy") as b,
    ):
        yield a, b


@pytest.mark.filterwarnings("ignore:The (logging|sampling) capability is deprecated")
@pytest.mark.parametrize("transport", ["memory", "http"])
async def test_a_conversation_is_never_replayed_to_someone_else(transport: str) -> None:
    talk = Talk()
    server = talk_server(talk)
    ann, bob = Person("ann"), Person("bob")
    args = {"question": "name?"}
    with anyio.fail_after(SOON):
        async with two_people(transport, server, ann, bob) as (a, b):
            first = await a.call_tool("interview", args)
            await caller_gave_up(talk.store)
            again = await a.call_tool("interview", args)
            bobs = await b.call_tool("interview", args)
    # Both users were asked and logged to; each got their own answer.
    assert ann.asked == ["name?", "sampled name?"] and ann.logs == 1
    assert bob.asked == ["name?", "sampled name?"] and bob.logs == 1
    assert _text(first) == "ann answers / ann's model"
    assert _text(bobs) == "bob answers / bob's model"
    # Ann's own identical re-send (she gave up on the first answer) is a replay: nobody is
    # asked, nothing is logged again.
    assert marker(again)["status"] == "replayed" and answer(again) == answer(first)


def _text(result: CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, TextContent)
    return block.text


async def test_each_input_round_conversation_asks_afresh() -> None:
    """2026-07-28: a completing round is stored under its own key, so a later identical call's
    first round runs the tool and asks again; a re-sent completing round is a replay."""
    talk = Talk()
    server = talk_server(talk)
    ann = Person("ann")
    with anyio.fail_after(SOON):
        async with ann.client(in_memory_transport(server)) as client:
            first = await client.call_tool("survey", {"topic": "tea"})
            second = await client.call_tool("survey", {"topic": "tea"})
            # Driven by hand: the completing round re-sent as is (its answer was lost) is a
            # replay, not a second run.
            question = await client.session.call_tool(
                "survey", {"topic": "tea"}, allow_input_required=True
            )
            assert isinstance(question, InputRequiredResult)
            replies = {"q": ElicitResult(action="accept", content={"text": "ann again"})}
            rounds = []
            for _ in "12":
                rounds.append(
                    await client.session.call_tool(
                        "survey",
                        {"topic": "tea"},
                        input_responses=replies,
                        request_state=question.request_state,
                    )
                )
                await caller_gave_up(talk.store)  # its answer lost: the next send is a re-send
    assert ann.asked == ["question 1 about tea", "question 2 about tea"]
    assert _text(first) == "q1: ann answers" and _text(second) == "q2: ann answers"
    assert marker(first)["status"] == marker(second)["status"] == "executed"
    done, resent = rounds
    assert isinstance(done, CallToolResult) and isinstance(resent, CallToolResult)
    assert _text(done) == "q3: ann again" and marker(done)["status"] == "executed"
    assert marker(resent)["status"] == "replayed" and answer(resent) == answer(done)
    assert talk.completions == 3


def _stdio(store: Path, ledger: Path) -> StdioServerParameters:
    args = [str(STDIO_SERVER), "--store", str(store), "--ledger", str(ledger)]
    return StdioServerParameters(command=sys.executable, args=args, env={"PYTHONUNBUFFERED": "1"})


def _executions(ledger: Path) -> int:
    with sqlite3.connect(ledger) as db:
        (count,) = db.execute("SELECT COUNT(*) FROM effects WHERE phase = 'done'").fetchone()
    return int(count)


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_two_stdio_clients_sharing_one_store_stay_apart(tmp_path: Path, mode: str) -> None:
    """Two clients, each with its own server process, one shared SQLite store and ledger: each
    connection's keyless re-send is replayed, and neither sees the other's result."""
    params = _stdio(tmp_path / "keys.db", tmp_path / "ledger.db")
    results: list[tuple[Tool, CallToolResult, CallToolResult]] = []
    store = SQLiteKeyStore(tmp_path / "keys.db")
    with anyio.fail_after(4 * SOON):
        for _ in range(2):
            async with Client(params, mode=mode) as client:
                tools = {t.name: t for t in (await client.list_tools()).tools}
                sent = await client.call_tool("effect", {"order": "same"})
                await caller_gave_up(store)  # the answer lost: the next send is a re-send
                resent = await client.call_tool("effect", {"order": "same"})
                results.append((tools["effect"], sent, resent))
    await store.aclose()
    assert _executions(tmp_path / "ledger.db") == 2
    (tool_a, sent_a, resent_a), (tool_b, sent_b, resent_b) = results
    assert advertised(tool_a) == advertised(tool_b) == (True, "derived")
    assert marker(resent_a)["status"] == marker(resent_b)["status"] == "replayed"
    assert answer(resent_a) == answer(sent_a) and answer(resent_b) == answer(sent_b)
    assert marker(sent_b)["status"] == "executed"
    assert _text(sent_a) != _text(sent_b)
