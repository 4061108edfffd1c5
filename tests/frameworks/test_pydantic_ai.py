"""pydantic-ai 2.68: `MCPToolset(RetryingClient(...), process_tool_call=keyed_tool_calls)`.

A real agent run with pydantic-ai's `FunctionModel` playing the model (no LLM, no network): it
calls one tool, and behaves like a model does with what comes back: a retry prompt makes it call
the tool again (under a new tool-call id, as models do), an answer or a failed result ends the
run with that text. The server is a real process (stdio, streamable HTTP) whose first answer to
the tool is lost; effects are counted in its ledger.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import pytest
from _kit import (
    ATTEMPT_TIMEOUT,
    POLICY,
    Shop,
    executions,
    fastmcp_over,
    lose_first_answer,
    notify_args,
    pay_args,
    replayed_once,
    sent_once,
)
from fastmcp import Client
from pydantic_ai import Agent
from pydantic_ai.mcp import MCPToolset
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    RetryPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from orchestrator import RetryPolicy, key_step, step_key_from, step_keys
from orchestrator.fastmcp import RetryingClient
from orchestrator.pydantic_ai import KEY_SOURCE, keyed_tool_calls, keyed_tool_calls_with

pytestmark = pytest.mark.anyio


@dataclass
class Model:
    """A model that calls `tool` once and reacts to the answer as a model would."""

    tool: str
    args: dict[str, Any]
    #: After a failed result, call the tool again (once) instead of answering: under the same
    #: tool-call id ("same", a model replaying its own call) or a new one ("new").
    recall: Literal["same", "new"] | None = None
    calls: list[str] = field(default_factory=list)
    seen: list[ToolReturnPart | RetryPromptPart] = field(default_factory=list)

    def call(self, call_id: str) -> ModelResponse:
        self.calls.append(call_id)
        return ModelResponse(parts=[ToolCallPart(self.tool, self.args, tool_call_id=call_id)])

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        last = messages[-1]
        assert isinstance(last, ModelRequest)
        answers = [
            part for part in last.parts if isinstance(part, ToolReturnPart | RetryPromptPart)
        ]
        if not answers:
            return self.call("call-1")
        answer = answers[-1]
        self.seen.append(answer)
        if asks_to_retry(answer):  # "fix the errors and try again"
            return self.call(f"call-{len(self.calls) + 1}")
        if answer.outcome == "failed" and self.recall is not None and len(self.calls) < 2:
            same = self.recall == "same"
            return self.call(self.calls[-1] if same else f"call-{len(self.calls) + 1}")
        return ModelResponse(parts=[TextPart(str(answer.content))])


def asks_to_retry(part: ToolReturnPart | RetryPromptPart) -> bool:
    """pydantic-ai's `ModelRetry`, as the model sees it (2.68: a return marked "retried")."""
    return isinstance(part, RetryPromptPart) or part.outcome == "retried"


async def run(model: Model, toolset: MCPToolset[None]) -> str:
    agent = Agent(FunctionModel(model), toolsets=[toolset])
    result = await agent.run("go")
    return result.output


async def test_the_idempotent_tool_is_retried_with_one_key_and_replayed(
    guarded_shop: Shop,
) -> None:
    chaos = lose_first_answer("pay")
    call = guarded_shop.call_id()
    model = Model("pay", pay_args(call))
    client = RetryingClient(fastmcp_over(guarded_shop, chaos), policy=POLICY)
    output = await run(model, MCPToolset(client, process_tool_call=keyed_tool_calls))
    effect = await replayed_once(guarded_shop, call, chaos, key_prefix=KEY_SOURCE)
    assert output == effect.result  # the model got the receipt
    assert model.calls == ["call-1"]  # retried below the model, which never saw the loss


async def test_keyed_tool_calls_with_a_key_source_sends_the_sources_key(
    guarded_shop: Shop,
) -> None:
    """Inside a step the source's key is sent (on both attempts); outside one `step_keys` says
    None and the tool-call-id key is the fallback."""
    chaos = lose_first_answer("pay")
    call = guarded_shop.call_id()
    client = RetryingClient(fastmcp_over(guarded_shop, chaos), policy=POLICY)
    toolset = MCPToolset(client, process_tool_call=keyed_tool_calls_with(step_keys))
    with key_step("wf-1", "run-1", "act-1"):
        output = await run(Model("pay", pay_args(call)), toolset)
    effect = await replayed_once(guarded_shop, call, chaos)
    assert effect.key == step_key_from("wf-1", "run-1", "act-1", ordinal=0)
    assert output == effect.result
    other = guarded_shop.call_id()
    await run(Model("pay", pay_args(other)), toolset)
    (outside,) = guarded_shop.effects(other)
    assert outside.key is not None and outside.key.startswith(f"{KEY_SOURCE}-")


async def test_the_non_idempotent_tool_is_not_resent_and_the_model_is_told(
    plain_shop: Shop,
) -> None:
    chaos = lose_first_answer("notify")
    call = plain_shop.call_id()
    model = Model("notify", notify_args(call))
    client = RetryingClient(fastmcp_over(plain_shop, chaos), policy=POLICY)
    output = await run(model, MCPToolset(client, process_tool_call=keyed_tool_calls))
    await sent_once(plain_shop, call, chaos)
    (told,) = model.seen
    assert isinstance(told, ToolReturnPart) and told.outcome == "failed"
    assert not asks_to_retry(told)
    assert output.startswith("OUTCOME UNKNOWN") and "Do not call it again" in output
    assert model.calls == ["call-1"]


async def test_without_mcp_once_the_timeout_becomes_a_retry_and_a_duplicate(
    plain_shop: Shop,
) -> None:
    """The baseline: FastMCP's timeout is a `ModelRetry`; the model calls again, new id."""
    chaos = lose_first_answer("notify")
    call = plain_shop.call_id()
    model = Model("notify", notify_args(call))
    client = Client(fastmcp_over(plain_shop, chaos), timeout=ATTEMPT_TIMEOUT)
    await run(model, MCPToolset(client))
    assert asks_to_retry(model.seen[0])
    assert model.calls == ["call-1", "call-2"]
    assert len(await executions(plain_shop, call, chaos)) == 2


@pytest.mark.parametrize("recall", ["same", "new"], ids=["same-id", "new-id"])
async def test_a_recall_after_a_timeout_reuses_the_key_when_the_id_repeats(
    guarded_shop: Shop, recall: Literal["same", "new"]
) -> None:
    """One attempt only, so the timeout reaches the model (as "outcome unknown"), which then
    calls again. Under the same tool-call id it sends the same key: the server replays, one
    effect. Under a new id it is a new logical call with a new key, and the tool runs again:
    that is what a model's "try again" means, and why the model is told not to."""
    chaos = lose_first_answer("pay")
    call = guarded_shop.call_id()
    model = Model("pay", pay_args(call), recall=recall)
    policy = RetryPolicy(max_attempts=1, attempt_timeout=ATTEMPT_TIMEOUT)
    client = RetryingClient(fastmcp_over(guarded_shop, chaos), policy=policy)
    output = await run(model, MCPToolset(client, process_tool_call=keyed_tool_calls))
    effects = await executions(guarded_shop, call, chaos)
    (told,) = model.seen[:1]
    assert isinstance(told, ToolReturnPart) and str(told.content).startswith("OUTCOME UNKNOWN")
    if recall == "same":
        assert model.calls == ["call-1", "call-1"]
        assert len(effects) == 1 and output == effects[0].result  # replayed to the model
        assert chaos.requests_seen == 2
    else:
        assert model.calls == ["call-1", "call-2"]
        assert len(effects) == 2 and effects[0].key != effects[1].key


async def test_without_mcp_once_a_guarded_server_merges_only_what_it_can_attribute(
    guarded_shop: Shop,
) -> None:
    """The model's keyless re-call of `pay` after `ModelRetry`: the server merges it by a
    derived key only on the same stdio connection; over streamable HTTP (no caller identity) the
    payment runs twice. mcp-once's key (one per tool-call id) prevents that."""
    chaos = lose_first_answer("pay")
    call = guarded_shop.call_id()
    model = Model("pay", pay_args(call))
    await run(model, MCPToolset(Client(fastmcp_over(guarded_shop, chaos), timeout=ATTEMPT_TIMEOUT)))
    assert model.calls == ["call-1", "call-2"]
    effects = await executions(guarded_shop, call, chaos)
    assert len(effects) == (1 if guarded_shop.transport == "stdio" else 2)
