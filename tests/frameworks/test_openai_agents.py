"""OpenAI Agents SDK 0.24: `RetryingMCPServerStdio` / `RetryingMCPServerStreamableHttp`.

A real `Runner.run` with a scripted `Model` (no LLM, no network, tracing off): it calls one tool,
then answers with whatever the tool returned. The SDK's server classes connect to a real server
process through the chaos link (their `create_streams` wrapped), which loses the first answer to
the tool; effects are counted in the server's ledger.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from typing import Any

import pytest
from _kit import (
    ATTEMPT_TIMEOUT,
    POLICY,
    SOON,
    Shop,
    executions,
    lose_first_answer,
    notify_args,
    pay_args,
    replayed_once,
    sent_once,
)
from agents import Agent, RunConfig, Runner
from agents.items import ModelResponse, TResponseInputItem, TResponseStreamEvent
from agents.mcp import MCPServer, MCPServerStdio, MCPServerStreamableHttp
from agents.models.interface import Model
from agents.usage import Usage
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

from idempotency import wire
from orchestrator import KeyRequest, RetryPolicy, key_step, step_key_from, step_keys
from orchestrator.chaos import Chaos, FaultPlan
from orchestrator.openai_agents import (
    KEY_SOURCE,
    RetryingMCPServerStdio,
    RetryingMCPServerStreamableHttp,
    tool_call_key,
)

pytestmark = pytest.mark.anyio

#: The SDK's own retry, switched on for the baselines.
SDK_RETRY: dict[str, Any] = {
    "max_retry_attempts": 1,
    "retry_backoff_seconds_base": 0,
    "client_session_timeout_seconds": ATTEMPT_TIMEOUT,
}


class ScriptedModel(Model):
    """Calls `tool` with `args` (tool-call id "call-1"), then answers with the tool's output."""

    def __init__(self, tool: str, args: dict[str, Any]) -> None:
        self.tool = tool
        self.args = args
        self.outputs: list[Any] = []

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        items: list[TResponseInputItem] = args[1] if len(args) > 1 else kwargs["input"]
        outputs = [
            item["output"]
            for item in items
            if isinstance(item, dict) and item.get("type") == "function_call_output"
        ]
        if not outputs:
            call = ResponseFunctionToolCall(
                type="function_call",
                id="fc-1",
                call_id="call-1",
                name=self.tool,
                arguments=json.dumps(self.args),
                status="completed",
            )
            return ModelResponse(output=[call], usage=Usage(), response_id=None)
        self.outputs = outputs
        text = ResponseOutputText(type="output_text", text=json.dumps(outputs), annotations=[])
        message = ResponseOutputMessage(
            type="message", id="msg-1", role="assistant", status="completed", content=[text]
        )
        return ModelResponse(output=[message], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[TResponseStreamEvent]:
        raise NotImplementedError


class ChaosStreams:
    """Puts an SDK server class's connection through a chaos link."""

    chaos: Chaos

    def create_streams(self) -> AbstractAsyncContextManager[Any]:
        return self.chaos.wrap(super().create_streams())  # type: ignore[misc]


class ChaosStdio(ChaosStreams, MCPServerStdio):
    pass


class ChaosHttp(ChaosStreams, MCPServerStreamableHttp):
    pass


class RetryingChaosStdio(ChaosStreams, RetryingMCPServerStdio):
    pass


class RetryingChaosHttp(ChaosStreams, RetryingMCPServerStreamableHttp):
    pass


def server(shop: Shop, chaos: Chaos, *, retrying: bool, **options: Any) -> MCPServer:
    """The SDK's server class for the shop's transport (mcp-once's drop-in if `retrying`)."""
    made: ChaosStdio | ChaosHttp | RetryingChaosStdio | RetryingChaosHttp
    if shop.transport == "stdio":
        assert shop.params is not None
        params = {"command": sys.executable, "args": shop.params.args}
        made = (RetryingChaosStdio if retrying else ChaosStdio)(params, **options)
    else:
        assert shop.url is not None
        made = (RetryingChaosHttp if retrying else ChaosHttp)({"url": shop.url}, **options)
    made.chaos = chaos
    return made


async def run(model: ScriptedModel, mcp_server: MCPServer) -> str:
    async with mcp_server:
        agent = Agent(name="shop", mcp_servers=[mcp_server], model=model)
        result = await Runner.run(agent, "go", run_config=RunConfig(tracing_disabled=True))
    return str(result.final_output)


def told(model: ScriptedModel) -> str:
    """The one tool output the model saw, as text."""
    (output,) = model.outputs
    return json.dumps(output)


async def test_the_idempotent_tool_is_retried_with_one_key_and_replayed(
    guarded_shop: Shop,
) -> None:
    """No attempt timeout in the policy: the SDK's `client_session_timeout_seconds` is it."""
    chaos = lose_first_answer("pay")
    call = guarded_shop.call_id()
    model = ScriptedModel("pay", pay_args(call))
    policy = RetryPolicy(max_attempts=3, deadline=SOON)
    mcp = server(
        guarded_shop,
        chaos,
        retrying=True,
        policy=policy,
        client_session_timeout_seconds=ATTEMPT_TIMEOUT,
    )
    await run(model, mcp)
    effect = await replayed_once(guarded_shop, call, chaos, key_prefix=KEY_SOURCE)
    assert effect.result in told(model)  # the receipt, replayed


async def test_the_non_idempotent_tool_is_not_resent_and_the_model_is_told(
    plain_shop: Shop,
) -> None:
    chaos = lose_first_answer("notify")
    call = plain_shop.call_id()
    model = ScriptedModel("notify", notify_args(call))
    # The SDK's own retry switched on: mcp-once keeps it away from tool calls.
    mcp = server(plain_shop, chaos, retrying=True, policy=POLICY, max_retry_attempts=3)
    await run(model, mcp)
    await sent_once(plain_shop, call, chaos)
    output = told(model)
    assert "OUTCOME UNKNOWN" in output and "Do not call it again" in output
    assert "Please try again" not in output


async def test_without_mcp_once_the_sdks_retry_duplicates(plain_shop: Shop) -> None:
    """The baseline: `max_retry_attempts=1` re-sends the timed-out call; it runs twice."""
    chaos = lose_first_answer("notify")
    call = plain_shop.call_id()
    model = ScriptedModel("notify", notify_args(call))
    await run(model, server(plain_shop, chaos, retrying=False, **SDK_RETRY))
    assert len(await executions(plain_shop, call, chaos)) == 2
    assert chaos.requests_seen == 2


async def test_a_meta_resolver_of_the_users_still_runs_and_its_key_wins(
    guarded_shop: Shop,
) -> None:
    chaos = lose_first_answer("pay")
    call = guarded_shop.call_id()
    seen: list[str] = []

    def resolver(context: Any) -> dict[str, Any]:
        seen.append(context.tool_name)
        return {"io.github.mcp-once/idempotency-key": f"mine-{call}", "trace": "t-1"}

    model = ScriptedModel("pay", pay_args(call))
    mcp = server(guarded_shop, chaos, retrying=True, policy=POLICY, tool_meta_resolver=resolver)
    await run(model, mcp)
    assert seen == ["pay"]
    assert [effect.key for effect in await executions(guarded_shop, call, chaos)] == [
        f"mine-{call}"
    ]


async def test_without_mcp_once_a_guarded_server_merges_only_what_it_can_attribute(
    guarded_shop: Shop,
) -> None:
    """The SDK's keyless re-send of `pay`: the server merges it by a derived key only on the
    same stdio connection; over streamable HTTP (no caller identity, and the SDK re-sends on a
    fresh session) it cannot, and the payment runs twice. mcp-once's key prevents that."""
    chaos = lose_first_answer("pay")
    call = guarded_shop.call_id()
    model = ScriptedModel("pay", pay_args(call))
    await run(model, server(guarded_shop, chaos, retrying=False, **SDK_RETRY))
    effects = await executions(guarded_shop, call, chaos)
    assert len(effects) == (1 if guarded_shop.transport == "stdio" else 2)


async def test_one_tool_call_has_one_key_in_two_processes_of_a_run(guarded_shop: Shop) -> None:
    """The first process sends `pay`, loses the answer and cannot retry (one attempt): the
    outcome is unknown. A second process (a fresh server object: nothing shared but the server's
    configuration) resumes the run and re-issues the same tool call: same key, so the guarded
    server replays the first execution instead of paying twice."""
    chaos = lose_first_answer("pay")
    call = guarded_shop.call_id()
    once = RetryPolicy(max_attempts=1, attempt_timeout=ATTEMPT_TIMEOUT, deadline=SOON)
    first = ScriptedModel("pay", pay_args(call))
    await run(first, server(guarded_shop, chaos, retrying=True, policy=once))
    assert "OUTCOME UNKNOWN" in told(first)
    (effect,) = await executions(guarded_shop, call, chaos)
    second = ScriptedModel("pay", pay_args(call))
    resumed = server(guarded_shop, Chaos(FaultPlan(), seed=1), retrying=True, policy=POLICY)
    await run(second, resumed)
    assert guarded_shop.effects(call) == [effect]  # replayed: one payment
    assert effect.result in told(second)
    assert effect.key == tool_call_key(resumed.name, "pay", "call-1")


def test_derived_keys_keep_two_servers_apart() -> None:
    """No random scope, but the server's name: two servers (say two shops whose models both
    say "call-1") never share a key; the same server's call has one key in every process."""
    assert tool_call_key("shop-a", "pay", "call-1") == tool_call_key("shop-a", "pay", "call-1")
    assert tool_call_key("shop-a", "pay", "call-1") != tool_call_key("shop-b", "pay", "call-1")
    default_a = RetryingMCPServerStreamableHttp({"url": "http://a.example/mcp"})
    default_b = RetryingMCPServerStreamableHttp({"url": "http://b.example/mcp"})
    assert default_a.name != default_b.name  # the SDK's default names differ by URL


async def test_the_key_source_gives_the_key_and_a_meta_key_beats_it(guarded_shop: Shop) -> None:
    chaos = lose_first_answer("pay")
    call = guarded_shop.call_id()
    asked: list[KeyRequest] = []

    def source(request: KeyRequest) -> str | None:
        asked.append(request)
        return step_keys(request)

    mcp = server(guarded_shop, chaos, retrying=True, policy=POLICY, key_source=source)
    with key_step("wf-1", "run-1", "act-1"):
        await run(ScriptedModel("pay", pay_args(call)), mcp)
    effect = await replayed_once(guarded_shop, call, chaos)
    assert effect.key == step_key_from("wf-1", "run-1", "act-1", ordinal=0)
    assert [(r.tool, r.ordinal) for r in asked] == [("pay", 0)]
    # A key already in the call's `_meta` (a workflow-side resolver's) is kept, source or not.
    other = guarded_shop.call_id()
    async with mcp:
        with key_step("wf-1", "run-1", "act-2"):
            await mcp.call_tool("pay", pay_args(other), meta={wire.KEY_META: f"wf-{other}"})
    assert [e.key for e in guarded_shop.effects(other)] == [f"wf-{other}"]
    assert len(asked) == 1
