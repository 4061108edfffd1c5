"""Issue #24 in the framework adapters: a key the MODEL fills in the tool's key argument.

A guarded tool keyed by an argument (`@idempotent(key_argument="idempotency_key")`) is listed
with that argument and a description telling the model to reuse its value when it retries the
same action. The model's own retry is a new tool call with a new tool-call id, so the adapter's
derived key (tool-call id, step, key source, a workflow-side resolver's) is new too; only the
model's key says "the same action". The adapters therefore let the model's key be the call's
key, and put their own in the argument only when the model left it out.

Real agent runs (pydantic-ai's `FunctionModel`, the Agents SDK's `Runner` with a scripted
`Model`; no LLM, no network) and a real `temporalio` activity context, against a real
`MCPServer` over streamable HTTP (uvicorn, in this process). The tool body declares the key
argument, so the ledger of what ran records the key the server took, as it arrived.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
from _kit import POLICY
from agents import Agent, RunConfig, Runner
from agents.items import ModelResponse as AgentsResponse
from agents.items import TResponseInputItem, TResponseStreamEvent
from agents.models.interface import Model as AgentsModel
from agents.usage import Usage
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.server.mcpserver import MCPServer
from openai.types import responses
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai import messages as pai
from pydantic_ai.mcp import MCPToolset
from pydantic_ai.models.function import AgentInfo, FunctionModel
from server_kit import serve_http
from temporalio.testing import ActivityEnvironment

from idempotency import MemoryKeyStore, idempotent, wire
from orchestrator import RetryingSession
from orchestrator.fastmcp import RetryingClient
from orchestrator.openai_agents import KEY_SOURCE as AGENTS_KEY_SOURCE
from orchestrator.openai_agents import RetryingMCPServerStreamableHttp
from orchestrator.pydantic_ai import KEY_SOURCE as PAI_KEY_SOURCE
from orchestrator.pydantic_ai import keyed_tool_calls
from orchestrator.temporal import KeyedMCPClient

pytestmark = pytest.mark.anyio

KEY = "idempotency_key"


@dataclass
class Shop:
    """What ran: one `(order, key argument as the body received it)` per execution."""

    ledger: list[tuple[str, str | None]] = field(default_factory=list)


@asynccontextmanager
async def keyed_shop() -> AsyncIterator[tuple[Shop, str]]:
    """A guarded `charge` keyed by its `idempotency_key` argument, over streamable HTTP."""
    shop = Shop()
    server = MCPServer("shop")

    @server.tool()
    @idempotent(MemoryKeyStore(), key_argument=KEY)
    async def charge(order: str, idempotency_key: str | None = None) -> str:
        shop.ledger.append((order, idempotency_key))
        return f"charged {order} (execution {len(shop.ledger)})"

    async with serve_http(server.streamable_http_app()) as base:
        yield shop, f"{base}/mcp"


#: The model's tool arguments, with the key it chose, and without one.
WITH_KEY: dict[str, Any] = {"order": "o-1", KEY: "model-key-1"}
WITHOUT_KEY: dict[str, Any] = {"order": "o-1"}


# --- pydantic-ai ------------------------------------------------------------------------------


@dataclass
class PaiModel:
    """Calls `charge` with each of `calls` in turn, each under a new tool-call id (the model's
    own retry of an action is a new call), then answers with every tool output it saw."""

    calls: list[dict[str, Any]]
    seen: list[str] = field(default_factory=list)

    def __call__(self, messages: list[pai.ModelMessage], info: AgentInfo) -> pai.ModelResponse:
        last = messages[-1]
        assert isinstance(last, pai.ModelRequest)
        self.seen += [str(p.content) for p in last.parts if isinstance(p, pai.ToolReturnPart)]
        made = sum(isinstance(m, pai.ModelResponse) for m in messages)
        if made < len(self.calls):
            call = pai.ToolCallPart("charge", self.calls[made], tool_call_id=f"call-{made + 1}")
            return pai.ModelResponse(parts=[call])
        return pai.ModelResponse(parts=[pai.TextPart(json.dumps(self.seen))])


async def pai_run(url: str, calls: list[dict[str, Any]]) -> list[str]:
    model = PaiModel(calls)
    toolset = MCPToolset(RetryingClient(url, policy=POLICY), process_tool_call=keyed_tool_calls)
    await PydanticAgent(FunctionModel(model), toolsets=[toolset]).run("go")
    return model.seen


async def test_pydantic_ai_a_key_the_model_fills_is_the_calls_key() -> None:
    """The model retries its action (a new tool-call id) with the same key: one effect, the
    retry replayed; the adapter's tool-call-id key gave way instead of being refused."""
    async with keyed_shop() as (shop, url):
        seen = await pai_run(url, [WITH_KEY, WITH_KEY])
    assert shop.ledger == [("o-1", "model-key-1")]
    assert seen == ["charged o-1 (execution 1)"] * 2


async def test_pydantic_ai_without_a_model_key_the_adapters_goes_in_the_argument() -> None:
    """No key from the model: the tool-call-id key travels in the argument (and `_meta`); the
    model's retry is a new tool call, so a new key, and it runs again: only the model's own
    key could have said "the same action"."""
    async with keyed_shop() as (shop, url):
        seen = await pai_run(url, [WITHOUT_KEY, WITHOUT_KEY])
    keys = [key for _, key in shop.ledger]
    assert len(keys) == 2 and keys[0] != keys[1]
    assert all(key is not None and key.startswith(f"{PAI_KEY_SOURCE}-") for key in keys)
    assert seen == ["charged o-1 (execution 1)", "charged o-1 (execution 2)"]


async def pai_outcome(toolset: MCPToolset, calls: list[dict[str, Any]]) -> object:
    """What the run came to: the tool outputs the model saw, or the error the run raised."""
    model = PaiModel(calls)
    try:
        await PydanticAgent(FunctionModel(model), toolsets=[toolset]).run("go")
    except Exception as exc:
        return (type(exc).__name__, str(exc))
    return model.seen


async def test_pydantic_ai_a_malformed_model_key_ends_as_it_would_without_mcp_once() -> None:
    """The model fills the key argument with "" (malformed): with the adapter nothing is sent
    and the run ends exactly as it does with a plain client, where the server refuses it
    (-32602), instead of with a `ValueError` of ours out of the agent run."""
    calls = [{"order": "o-1", KEY: ""}]
    async with keyed_shop() as (shop, url):
        plain = await pai_outcome(MCPToolset(url), calls)
        ours = await pai_outcome(
            MCPToolset(RetryingClient(url, policy=POLICY), process_tool_call=keyed_tool_calls),
            calls,
        )
    assert shop.ledger == []
    assert ours == plain, (ours, plain)


# --- OpenAI Agents SDK ------------------------------------------------------------------------


class AgentsScript(AgentsModel):
    """Calls `charge` with each of `calls` in turn (tool-call ids call-1, call-2, ...), then
    answers with every tool output it saw."""

    def __init__(self, calls: list[dict[str, Any]]) -> None:
        self.calls = calls
        self.outputs: list[Any] = []

    async def get_response(self, *args: Any, **kwargs: Any) -> AgentsResponse:
        items: list[TResponseInputItem] = args[1] if len(args) > 1 else kwargs["input"]
        self.outputs = [
            item["output"]
            for item in items
            if isinstance(item, dict) and item.get("type") == "function_call_output"
        ]
        made = len(self.outputs)
        if made < len(self.calls):
            call = responses.ResponseFunctionToolCall(
                type="function_call",
                id=f"fc-{made + 1}",
                call_id=f"call-{made + 1}",
                name="charge",
                arguments=json.dumps(self.calls[made]),
                status="completed",
            )
            return AgentsResponse(output=[call], usage=Usage(), response_id=None)
        text = responses.ResponseOutputText(
            type="output_text", text=json.dumps(self.outputs), annotations=[]
        )
        message = responses.ResponseOutputMessage(
            type="message", id="msg-1", role="assistant", status="completed", content=[text]
        )
        return AgentsResponse(output=[message], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[TResponseStreamEvent]:
        raise NotImplementedError


async def agents_run(url: str, calls: list[dict[str, Any]], **options: Any) -> list[str]:
    model = AgentsScript(calls)
    server = RetryingMCPServerStreamableHttp({"url": url}, policy=POLICY, **options)
    async with server:
        agent = Agent(name="shop", mcp_servers=[server], model=model)
        await Runner.run(agent, "go", run_config=RunConfig(tracing_disabled=True))
    return [json.dumps(output) for output in model.outputs]


async def test_openai_agents_a_key_the_model_fills_is_the_calls_key() -> None:
    async with keyed_shop() as (shop, url):
        outputs = await agents_run(url, [WITH_KEY, WITH_KEY])
    assert shop.ledger == [("o-1", "model-key-1")]
    assert len(outputs) == 2 and all("charged o-1 (execution 1)" in o for o in outputs)


async def test_openai_agents_a_resolvers_key_gives_way_to_the_models_too() -> None:
    """A user `tool_meta_resolver`'s key (like `temporal_tool_meta`'s, set workflow-side) is
    the framework's, not the model's: the model's key wins; without one, the resolver's key."""
    async with keyed_shop() as (shop, url):
        await agents_run(
            url,
            [WITH_KEY, WITHOUT_KEY],
            tool_meta_resolver=lambda context: {wire.KEY_META: "resolver-key"},
        )
    assert shop.ledger == [("o-1", "model-key-1"), ("o-1", "resolver-key")]


async def test_openai_agents_without_a_model_key_the_adapters_goes_in_the_argument() -> None:
    async with keyed_shop() as (shop, url):
        await agents_run(url, [WITHOUT_KEY, WITHOUT_KEY])
    keys = [key for _, key in shop.ledger]
    assert len(keys) == 2 and keys[0] != keys[1]
    assert all(key is not None and key.startswith(f"{AGENTS_KEY_SOURCE}-") for key in keys)


# --- Temporal (`KeyedMCPClient`, inside a real activity context) -----------------------------


async def test_temporal_a_workflow_side_key_gives_way_to_the_models() -> None:
    """`KeyedMCPClient` in an activity: the `_meta` key a workflow-side resolver sent gives way
    to the model's key in the argument; without one, that key goes in the argument; with
    neither, the activity's key does."""

    async def activity(url: str) -> list[str]:
        results = []
        async with KeyedMCPClient(streamable_http_client(url), policy=POLICY) as client:
            for arguments, meta in [
                (WITH_KEY, {wire.KEY_META: "workflow-key"}),
                (WITH_KEY, {wire.KEY_META: "workflow-key-2"}),
                (WITHOUT_KEY, {wire.KEY_META: "workflow-key"}),
                ({"order": "o-2"}, None),
            ]:
                result = await client.call_tool("charge", arguments, meta=meta)
                results.append((result.meta or {})[wire.IDEMPOTENCY_META]["status"])
        return results

    async with keyed_shop() as (shop, url):
        statuses = await ActivityEnvironment().run(activity, url)
    assert statuses == ["executed", "replayed", "executed", "executed"]
    assert shop.ledger[:2] == [("o-1", "model-key-1"), ("o-1", "workflow-key")]
    order, activity_key = shop.ledger[2]
    assert order == "o-2" and activity_key is not None and activity_key.startswith("step-")


# --- the caller's own keys are not an adapter's ----------------------------------------------


async def test_two_keys_a_caller_passes_itself_still_disagree() -> None:
    """Outside an adapter, a `_meta` key and a different argument key are the caller's own
    mistake: `ValueError` before anything is sent."""
    async with keyed_shop() as (shop, url), Client(streamable_http_client(url)) as client:
        session = RetryingSession(client, policy=POLICY)
        with pytest.raises(ValueError, match="disagree"):
            await session.call_tool("charge", WITH_KEY, meta={wire.KEY_META: "other"})
    assert shop.ledger == []


async def test_a_key_source_is_not_asked_when_the_model_brought_a_key() -> None:
    """`key_source=` (DBOS's `step_key`, Temporal's `activity_key`) keys only the calls that
    bring none: the model's key is the call's, and takes no ordinal of the step."""
    asked: list[str] = []

    def source(request: Any) -> str:
        asked.append(request.tool)
        return f"step-key-{len(asked)}"

    async with keyed_shop() as (shop, url), Client(streamable_http_client(url)) as client:
        session = RetryingSession(client, policy=POLICY, key_source=source)
        await session.call_tool("charge", WITH_KEY)
        await session.call_tool("charge", WITHOUT_KEY)
    assert shop.ledger == [("o-1", "model-key-1"), ("o-1", "step-key-1")]
    assert asked == ["charge"]
