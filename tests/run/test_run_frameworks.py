"""`run=` through the framework adapters, and the Redis journal through `Run`: a run killed in
the middle and resumed, in process, against the shop server process (HTTP, a SQLite key store,
its ledger the count of effects).

The kill: the first run's journal (`Dying`) stops the run at a chosen point of a chosen
position (W1: the intent is written, then the process is gone, nothing sent; W3: the tool ran
and answered, the done mark never written, then the process is gone) and, being dead, never
releases its lease. The resume is a second `Run` with the same run id over a second journal
object on the same data (what a restarted process opens), after the dead holder's lease ran out
on the fake clock, with a new client and a new agent.

- pydantic-ai (`keyed_tool_calls_with(run=...)`, `response_turn`): a model response of three
  tool calls, run concurrently and made to finish in an order other than the response's; the
  positions follow the response.
- The Agents SDK (`RetryingMCPServerStreamableHttp(..., run=run)`): the SDK does not tell a tool
  its index in the response, so calls are numbered as they reach the server object. With
  `ToolExecutionConfig(max_function_tool_concurrency=1)` the SDK starts them one at a time in
  response order, which is what is tested; with its default (every call of a response started
  at once) the order they reach the server is the SDK's scheduling, not a promise.
- `orchestrator.fastmcp.RetryingClient(run=...)` and `RedisJournal`: the same resume, calls one
  after another.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import anyio
import pytest
from agents import Agent as SDKAgent
from agents import RunConfig, Runner, ToolExecutionConfig
from agents.items import ModelResponse as SDKResponse
from agents.items import TResponseInputItem, TResponseStreamEvent
from agents.models.interface import Model as SDKModel
from agents.usage import Usage
from crash_kit import DurableShop, durable_shop
from fake_clock import FakeClock
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)
from pydantic_ai import Agent, RunContext
from pydantic_ai.mcp import CallToolFunc, MCPToolset, ProcessToolCallback, ToolResult
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from orchestrator import (
    Journal,
    JournalUnavailable,
    OutcomeUnknown,
    RetryPolicy,
    Run,
    SQLiteJournal,
    run_key,
)
from orchestrator._journal import Entry, RunSummary, fingerprint_arguments
from orchestrator.fastmcp import RetryingClient
from orchestrator.openai_agents import RetryingMCPServerStreamableHttp
from orchestrator.pydantic_ai import keyed_tool_calls_with

pytestmark = pytest.mark.anyio

#: Bound for anything that ends as soon as the awaited thing happens.
SOON = 60.0
POLICY = RetryPolicy(max_attempts=3, attempt_timeout=10.0, deadline=SOON)
#: Past the default lease (30 s): a dead holder's run can be taken.
PAST_LEASE = 31.0

Window = Literal["W1", "W3"]
Call = tuple[str, dict[str, Any]]


def pipeline(tag: str) -> list[list[Call]]:
    """The model's responses, in order: one call (position 0), then one response of three calls
    (positions 1, 2, 3 by their index in it). Call ids (tool arguments) carry `tag`."""
    return [
        [("pay", {"call_id": f"{tag}-a", "account": "acme", "cents": 100})],
        [
            ("pay", {"call_id": f"{tag}-b", "account": "acme", "cents": 200}),
            ("set_value", {"call_id": f"{tag}-c", "name": "status", "value": 2}),
            ("pay", {"call_id": f"{tag}-d", "account": "zeta", "cents": 300}),
        ],
    ]


def positions(steps: list[list[Call]]) -> list[Call]:
    """The calls in run order: each response's calls by their index in it."""
    return [call for step in steps for call in step]


class Killed(Exception):
    """The first process is gone (stands in for a SIGKILL)."""


class Dying:
    """The first process's journal: it dies at `kill` = (position, window) and, dead, never
    releases the run (so the lease must run out). Everything else is `inner`'s.

    W1: the intent is written, then `Killed` (raised out of the run: nothing was sent). W3: the
    done mark is not written (`JournalUnavailable`, which the run swallows: the answer is in
    hand); `lost` says so, and the caller (or `scope`) ends the process there.
    """

    def __init__(
        self,
        inner: Journal,
        kill: tuple[int, Window],
        scope: anyio.CancelScope | None = None,
    ) -> None:
        self.inner = inner
        self.retention = inner.retention
        self.kill = kill
        self.scope = scope
        self.recorded: list[int] = []
        self.lost = False

    async def acquire(self, run_id: str, holder: str, lease: float, **proof: Any) -> int:
        return await self.inner.acquire(run_id, holder, lease, **proof)

    async def renew(self, run_id: str, fence: int, lease: float) -> None:
        await self.inner.renew(run_id, fence, lease)

    async def release(self, run_id: str, fence: int) -> bool:
        return False  # a killed process releases nothing

    async def entries(self, run_id: str) -> list[Entry]:
        return await self.inner.entries(run_id)

    async def record_intent(self, run_id: str, fence: int, entry: Entry) -> None:
        await self.inner.record_intent(run_id, fence, entry)
        self.recorded.append(entry.position)
        if self.kill == (entry.position, "W1"):
            raise Killed(f"killed after the intent of position {entry.position}")

    async def mark_done(self, run_id: str, fence: int, position: int) -> None:
        if self.kill == (position, "W3"):
            self.lost = True
            if self.scope is not None:
                self.scope.cancel()
            raise JournalUnavailable("killed before the done mark was written")
        await self.inner.mark_done(run_id, fence, position)

    async def finish(self, run_id: str, fence: int) -> None:
        raise AssertionError("a killed run does not finish")

    async def run(self, run_id: str) -> RunSummary | None:
        return await self.inner.run(run_id)

    async def runs(self) -> list[RunSummary]:
        return await self.inner.runs()

    async def purge(self, run_id: str, *, force: bool = False) -> bool:
        return await self.inner.purge(run_id, force=force)

    async def sweep(self, now: float | None = None) -> int:
        return await self.inner.sweep(now)

    async def aclose(self) -> None:
        await self.inner.aclose()


def was_killed(error: BaseException) -> bool:
    """`Killed`, however a framework wrapped it (exception groups, chained causes)."""
    if isinstance(error, Killed):
        return True
    if isinstance(error, BaseExceptionGroup):
        return any(was_killed(inner) for inner in error.exceptions)
    return error.__cause__ is not None and was_killed(error.__cause__)


@asynccontextmanager
async def shop(tmp: Path) -> AsyncIterator[DurableShop]:
    async with durable_shop(tmp, hold=0) as opened:
        yield opened


async def journal_holds(journal: Journal, run_id: str, calls: Sequence[Call]) -> None:
    """Every position holds the call at that place of the run, done, under the run's key."""
    entries = await journal.entries(run_id)
    assert [(e.position, e.tool, e.fingerprint, e.key, e.state) for e in entries] == [
        (n, tool, fingerprint_arguments(arguments), run_key(run_id, n), "done")
        for n, (tool, arguments) in enumerate(calls)
    ]


def ran_once_each(s: DurableShop, run_id: str, calls: Sequence[Call]) -> dict[str, str]:
    """One effect per call, under the key of its position; the results by call id."""
    results = {}
    for n, (_, arguments) in enumerate(calls):
        effects = s.effects(arguments["call_id"])
        assert len(effects) == 1, (n, effects)
        assert effects[0].key == run_key(run_id, n)
        results[arguments["call_id"]] = effects[0].result
    return results


# -- pydantic-ai -------------------------------------------------------------------------------


@dataclass
class ScriptedModel:
    """Asks for each response of `steps` in turn (tool-call ids `c<step>-<index>`, the same in
    every process), then answers "done"; keeps what each tool call returned."""

    steps: list[list[Call]]
    seen: dict[str, str] = field(default_factory=dict)

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        for message in messages:
            if isinstance(message, ModelRequest):
                for part in message.parts:
                    if isinstance(part, ToolReturnPart):
                        self.seen[part.tool_call_id] = str(part.content)
        step = sum(isinstance(message, ModelResponse) for message in messages)
        if step == len(self.steps):
            return ModelResponse(parts=[TextPart("done")])
        return ModelResponse(
            parts=[
                ToolCallPart(tool, arguments, tool_call_id=f"c{step}-{index}")
                for index, (tool, arguments) in enumerate(self.steps[step])
            ]
        )


class InOrder:
    """A `process_tool_call` around `inner` that lets the calls of the parallel response (step 1)
    run one at a time in `order` (their indexes), whatever order pydantic-ai started them in;
    and, in the first process, dies after a W3 kill, once the answer is back."""

    def __init__(
        self, order: Sequence[int], inner: ProcessToolCallback, dying: Dying | None = None
    ) -> None:
        self.order = list(order)
        self.inner = inner
        self.dying = dying
        self.finished = {index: anyio.Event() for index in order}
        self.started: list[int] = []

    async def __call__(
        self, ctx: RunContext[Any], call_tool: CallToolFunc, name: str, args: dict[str, Any]
    ) -> ToolResult:
        assert ctx.tool_call_id is not None
        step, index = (int(n) for n in ctx.tool_call_id[1:].split("-"))
        if step != 1:
            return await self.inner(ctx, call_tool, name, args)
        rank = self.order.index(index)
        if rank > 0:
            with anyio.fail_after(SOON):
                await self.finished[self.order[rank - 1]].wait()
        self.started.append(index)
        try:
            result = await self.inner(ctx, call_tool, name, args)
        finally:
            self.finished[index].set()
        if self.dying is not None and self.dying.lost:
            raise Killed("killed after the answer came back, before the done mark")
        return result


async def agent_run(
    url: str, run: Run, steps: list[list[Call]], order: Sequence[int], dying: Dying | None = None
) -> tuple[ScriptedModel, InOrder]:
    model = ScriptedModel(steps)
    hook = InOrder(order, keyed_tool_calls_with(run=run), dying)
    client = RetryingClient(url, policy=POLICY)
    agent = Agent(FunctionModel(model), toolsets=[MCPToolset(client, process_tool_call=hook)])
    with anyio.fail_after(SOON):
        await agent.run("go")
    return model, hook


@pytest.mark.parametrize("window", ["W1", "W3"])
async def test_pydantic_ai_a_parallel_turn_killed_mid_gather_resumes_by_response_order(
    tmp_path: Path, window: Window
) -> None:
    """The three calls of one response finish in the order 2, 0, 1; the process dies in the
    last of them (index 1, position 2). The resumed process runs them in the order 1, 2, 0:
    every position still holds the call at that index of the response, nothing diverges, and
    each call ran once; the calls that had run are replayed (the model sees the result of
    their one execution)."""
    run_id = f"pai-{window}"
    steps = pipeline(run_id)
    calls = positions(steps)
    clock = FakeClock()
    path = tmp_path / "journal.db"
    async with shop(tmp_path) as s:
        dying = Dying(SQLiteJournal(path, clock=clock), (2, window))
        with pytest.raises(Exception) as raised:  # the kill, however wrapped
            async with Run(run_id, journal=dying, clock=clock) as run:
                await agent_run(s.url, run, steps, order=(2, 0, 1), dying=dying)
        assert was_killed(raised.value), raised.value
        await dying.aclose()
        # Started (and recorded) in the order 0, then 3, 1, 2: numbered by the response.
        assert dying.recorded == [0, 3, 1, 2]
        first = SQLiteJournal(path, clock=clock)
        entries = {e.position: e for e in await first.entries(run_id)}
        await first.aclose()
        assert entries[3].fingerprint == fingerprint_arguments(calls[3][1])
        assert entries[2].state == "intent" and entries[3].state == "done"
        ran_before = [len(s.effects(arguments["call_id"])) for _, arguments in calls]
        assert ran_before == [1, 1, 1 if window == "W3" else 0, 1]

        clock.advance(PAST_LEASE)
        journal = SQLiteJournal(path, clock=clock)
        try:
            async with Run(run_id, journal=journal, clock=clock) as run:
                assert run.resumed
                model, hook = await agent_run(s.url, run, steps, order=(1, 2, 0))
            assert hook.started == [1, 2, 0]
            await journal_holds(journal, run_id, calls)
        finally:
            await journal.aclose()
        results = ran_once_each(s, run_id, calls)
    seen = {
        arguments["call_id"]: model.seen[f"c{step}-{index}"]
        for step, response in enumerate(steps)
        for index, (_, arguments) in enumerate(response)
    }
    assert seen == results  # replayed: the one execution's result, every call


# -- the OpenAI Agents SDK -------------------------------------------------------------------


class SDKScripted(SDKModel):
    """Asks for each response of `steps` in turn (call ids `c<step>-<index>`), then answers;
    keeps every tool output it was given, by call id."""

    def __init__(self, steps: list[list[Call]]) -> None:
        self.steps = steps
        self.seen: dict[str, str] = {}

    async def get_response(self, *args: Any, **kwargs: Any) -> SDKResponse:
        items: list[TResponseInputItem] = args[1] if len(args) > 1 else kwargs["input"]
        answered = 0
        for item in items:
            fields: dict[str, Any] = dict(item) if isinstance(item, dict) else {}
            if fields.get("type") == "function_call_output":
                self.seen[str(fields["call_id"])] = str(fields["output"])
                answered += 1
        sizes = [len(step) for step in self.steps]
        step = next(
            (n for n in range(len(sizes)) if sum(sizes[:n]) == answered),
            len(sizes),
        )
        if step < len(self.steps) and answered < sum(sizes):
            calls = [
                ResponseFunctionToolCall(
                    type="function_call",
                    id=f"fc{step}-{index}",
                    call_id=f"c{step}-{index}",
                    name=tool,
                    arguments=json.dumps(arguments),
                    status="completed",
                )
                for index, (tool, arguments) in enumerate(self.steps[step])
            ]
            return SDKResponse(output=list(calls), usage=Usage(), response_id=None)
        text = ResponseOutputText(type="output_text", text="done", annotations=[])
        message = ResponseOutputMessage(
            type="message", id="msg-1", role="assistant", status="completed", content=[text]
        )
        return SDKResponse(output=[message], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[TResponseStreamEvent]:
        raise NotImplementedError


class Recording(RetryingMCPServerStreamableHttp):
    """Remembers the order calls reach the server object (by their `call_id` argument)."""

    reached: list[str]

    async def call_tool(
        self, tool_name: str, arguments: dict[str, Any] | None, meta: dict[str, Any] | None = None
    ) -> Any:
        self.reached.append(str((arguments or {}).get("call_id")))
        return await super().call_tool(tool_name, arguments, meta)


async def sdk_run(url: str, run: Run, steps: list[list[Call]]) -> tuple[SDKScripted, list[str]]:
    model = SDKScripted(steps)
    server = Recording({"url": url}, run=run, policy=POLICY, name="shop")
    server.reached = []
    config = RunConfig(
        tracing_disabled=True,
        tool_execution=ToolExecutionConfig(max_function_tool_concurrency=1),
    )
    try:
        with anyio.fail_after(SOON):
            async with server:
                agent = SDKAgent(name="shop", mcp_servers=[server], model=model)
                await Runner.run(agent, "go", run_config=config)
    finally:
        reached = list(server.reached)
    return model, reached


async def test_agents_sdk_server_with_run_resumes_a_killed_turn(tmp_path: Path) -> None:
    """The response of three calls, one at a time in response order; the process dies in the
    second (position 2) after the tool answered, before the done mark: the third never
    started. The resumed process resends positions 0–2 under their keys (replayed) and runs the
    third once."""
    run_id = "sdk-W3"
    steps = pipeline(run_id)
    calls = positions(steps)
    ids = [arguments["call_id"] for _, arguments in calls]
    clock = FakeClock()
    path = tmp_path / "journal.db"
    async with shop(tmp_path) as s:
        with anyio.CancelScope() as killer:
            dying = Dying(SQLiteJournal(path, clock=clock), (2, "W3"), scope=killer)
            async with Run(run_id, journal=dying, clock=clock) as run:
                await sdk_run(s.url, run, steps)
        assert killer.cancelled_caught and dying.lost
        await dying.aclose()
        assert dying.recorded == [0, 1, 2]
        assert [len(s.effects(call_id)) for call_id in ids] == [1, 1, 1, 0]

        clock.advance(PAST_LEASE)
        journal = SQLiteJournal(path, clock=clock)
        try:
            async with Run(run_id, journal=journal, clock=clock) as run:
                model, reached = await sdk_run(s.url, run, steps)
            assert reached == ids  # response order, one at a time
            await journal_holds(journal, run_id, calls)
        finally:
            await journal.aclose()
        results = ran_once_each(s, run_id, calls)
    for step, response in enumerate(steps):
        for index, (_, arguments) in enumerate(response):
            assert results[arguments["call_id"]] in model.seen[f"c{step}-{index}"]


# -- FastMCP's client, and the Redis journal ---------------------------------------------------


async def run_calls(url: str, run: Run, calls: Sequence[Call], dying: Dying | None) -> list[str]:
    """`calls` one after another through `RetryingClient(run=run)`; the results' texts. Dies
    (raises `Killed`) after a call whose done mark `dying` lost."""
    texts = []
    async with RetryingClient(url, policy=POLICY, run=run) as client:
        for tool, arguments in calls:
            result = await client.call_tool_mcp(tool, arguments)
            texts.append(str(getattr(result.content[0], "text", "")))
            if dying is not None and dying.lost:
                raise Killed
    return texts


async def resume_through_retrying_client(
    tmp: Path, run_id: str, opened: Callable[[], Journal], clock: FakeClock
) -> None:
    """`resumed_through_retrying_client` with two journals `opened` over the same data (the
    first process's, the second's), closed after."""
    first, second = opened(), opened()
    try:
        async with shop(tmp) as s:
            await resumed_through_retrying_client(s, run_id, first, second, clock)
    finally:
        await first.aclose()
        await second.aclose()


async def resumed_through_retrying_client(
    s: DurableShop, run_id: str, first: Journal, second: Journal, clock: FakeClock
) -> None:
    """Four guarded calls, one after another, killed in W3 of position 1. The resume replays
    positions 0 and 1 (the results of their one execution) and runs 2 and 3 once. Then an
    unguarded `notify` in a run of its own, finished: entering that run again refuses to resend
    it (`OutcomeUnknown`, nothing sent)."""
    calls = positions(pipeline(run_id))
    dying = Dying(first, (1, "W3"))
    with pytest.raises(Killed):
        async with Run(run_id, journal=dying, clock=clock) as run:
            await run_calls(s.url, run, calls, dying)
    clock.advance(PAST_LEASE)
    async with Run(run_id, journal=second, clock=clock) as run:
        assert run.resumed
        after = await run_calls(s.url, run, calls, None)
    await journal_holds(second, run_id, calls)
    results = ran_once_each(s, run_id, calls)
    assert after == [results[arguments["call_id"]] for _, arguments in calls]
    # An unguarded call, done in a finished run: resuming it is refused, nothing sent.
    note: Call = ("notify", {"call_id": f"{run_id}-n", "message": "hi"})
    async with Run(f"{run_id}-n", journal=second, clock=clock) as run:
        await run_calls(s.url, run, [note], None)
    with pytest.raises(OutcomeUnknown) as unknown:
        async with Run(f"{run_id}-n", journal=second, clock=clock) as run:
            await run_calls(s.url, run, [note], None)
    assert unknown.value.reason == "resumed_done"
    assert len(s.effects(f"{run_id}-n")) == 1


async def test_fastmcp_retrying_client_with_run_resumes_a_killed_run(tmp_path: Path) -> None:
    clock = FakeClock()
    path = tmp_path / "journal.db"
    await resume_through_retrying_client(
        tmp_path, "fmcp", lambda: SQLiteJournal(path, clock=clock), clock
    )


@pytest.mark.redis
async def test_a_run_resumes_from_a_redis_journal(
    tmp_path: Path, redis_url: str, redis_namespace: str
) -> None:
    """The same resume, journalled in a real redis-server: the second journal is a new client
    (another process's)."""
    from orchestrator._journal.redis import RedisJournal

    clock = FakeClock()
    prefix = f"{redis_namespace}:journal:"
    await resume_through_retrying_client(
        tmp_path,
        "redis",
        lambda: RedisJournal.from_url(redis_url, prefix=prefix, clock=clock),
        clock,
    )
