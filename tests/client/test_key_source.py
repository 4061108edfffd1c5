"""Keys from where the call runs: `key_source`, `key_step` ordinals, `step_key_from` (in-process).

Each test drives a real MCP session to a server that records the key of every execution, so what
is checked is the key that reached the server, and that nothing reached it when a key was refused.
"""

from __future__ import annotations

import json

import anyio
import pytest
from _servers import Recorder, make_server
from mcp import Client, MCPError

from idempotency import wire
from orchestrator import (
    KeyRequest,
    RetryingSession,
    RetryPolicy,
    derive_key,
    key_step,
    step_key_from,
    step_keys,
)

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])]


class Source:
    """A key source that records what it was asked and answers `answer` (or raises it)."""

    def __init__(self, answer: object = "from-source") -> None:
        self.answer = answer
        self.asked: list[KeyRequest] = []

    def __call__(self, request: KeyRequest) -> str | None:
        self.asked.append(request)
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer  # type: ignore[return-value]


async def test_precedence_explicit_then_meta_then_source_then_fresh() -> None:
    recorder = Recorder()
    source = Source()
    async with Client(make_server(recorder)) as client:
        rs = RetryingSession(client, key_source=source)
        await rs.call_tool("idem", {"x": 1}, idempotency_key="explicit")
        await rs.call_tool("idem", {"x": 2}, meta={wire.KEY_META: "in-meta"})
        await rs.call_tool("idem", {"x": 3})
        source.answer = None
        await rs.call_tool("idem", {"x": 4})
        await rs.call_tool("idem", {"x": 5})
        await RetryingSession(client).call_tool("idem", {"x": 6})
    explicit, in_meta, sourced, fresh_1, fresh_2, unsourced = recorder.keys("idem")
    assert (explicit, in_meta, sourced) == ("explicit", "in-meta", "from-source")
    # A caller's key takes precedence and is never even asked for: the source saw two calls.
    assert [(r.tool, dict(r.arguments)) for r in source.asked] == [
        ("idem", {"x": 3}),
        ("idem", {"x": 4}),
        ("idem", {"x": 5}),
    ]
    # None falls back to a fresh key per call, as without a source.
    assert len({fresh_1, fresh_2, unsourced}) == 3
    assert all(wire.key_problem(k) is None for k in (fresh_1, fresh_2, unsourced))
    assert recorder.executions("idem") == 6


async def test_the_source_is_asked_once_per_call_and_its_key_is_kept_across_retries() -> None:
    recorder = Recorder()
    recorder.script["idem"] = [MCPError(wire.STORE_UNAVAILABLE, "store down", {"key": "k"})]
    source = Source()
    async with Client(make_server(recorder)) as client:
        rs = RetryingSession(client, key_source=source, policy=RetryPolicy(max_attempts=3))
        _, report = await rs.call_tool_with_report("idem", {"x": 1})
    assert recorder.keys("idem") == ["from-source", "from-source"]
    assert recorder.attempts("idem") == [1, 2]
    assert report.key == "from-source" and len(source.asked) == 1


async def test_ordinals_number_a_steps_calls_the_same_way_on_every_run() -> None:
    recorder = Recorder()
    source = Source(None)

    def keyed(request: KeyRequest) -> str | None:
        source(request)
        return step_keys(request)

    async def step(activity: str) -> None:
        with key_step("wf-1", "run-1", activity):
            await rs.call_tool("idem", {"x": 1})
            await rs.call_tool("reader", {"x": 1})

    async with Client(make_server(recorder)) as client:
        rs = RetryingSession(client, key_source=keyed)
        await step("act-1")
        first_run = [s.key for s in recorder.seen]
        await step("act-1")  # the same step, run again (a durable engine's replay)
        await step("act-2")  # the next step starts again at ordinal 0
    keys = [s.key for s in recorder.seen]
    assert keys[2:4] == first_run
    assert first_run == [step_key_from("wf-1", "run-1", "act-1", ordinal=n) for n in (0, 1)]
    assert keys[4:] == [step_key_from("wf-1", "run-1", "act-2", ordinal=n) for n in (0, 1)]
    assert len(set(keys)) == 4
    assert [r.ordinal for r in source.asked] == [0, 1, 0, 1, 0, 1]
    assert source.asked[0].step == ("wf-1", "run-1", "act-1")
    assert source.asked[-1].step == ("wf-1", "run-1", "act-2")


async def test_steps_nest_and_tasks_of_a_step_share_its_count() -> None:
    recorder = Recorder()
    source = Source(None)
    async with Client(make_server(recorder)) as client:
        rs = RetryingSession(client, key_source=source)
        await rs.call_tool("idem", {"x": 0})  # outside any step: ordinal 0, no step
        with key_step("outer"):
            await rs.call_tool("idem", {"x": 1})
            with key_step("inner"):
                await rs.call_tool("idem", {"x": 2})
            with key_step("outer"):  # the current step again: its count continues
                await rs.call_tool("idem", {"x": 3})
            async with anyio.create_task_group() as tg:
                for x in (4, 5):
                    tg.start_soon(rs.call_tool, "idem", {"x": x})
            await rs.call_tool("idem", {"x": 6})
        await rs.call_tool("idem", {"x": 7})
    asked = {r.arguments["x"]: (r.step, r.ordinal) for r in source.asked}
    assert asked[0] == (None, 0) and asked[7] == (None, 0)
    assert asked[1] == (("outer",), 0) and asked[2] == (("inner",), 0)
    assert asked[3] == (("outer",), 1)
    assert {asked[4][1], asked[5][1]} == {2, 3} and asked[6] == (("outer",), 4)


async def test_step_keys_are_hashed_so_run_ids_never_reach_the_server() -> None:
    recorder = Recorder()
    secret = "customer-4711-run-7e3a"
    async with Client(make_server(recorder)) as client:
        rs = RetryingSession(client, key_source=step_keys)
        with key_step("wf", secret, "act"):
            await rs.call_tool("idem", {"x": 1})
            await rs.call_tool("idem", {"x": 2})
    (first, second) = recorder.keys("idem")
    assert first != second and first.startswith("step-")
    assert all(secret not in json.dumps(seen.meta) for seen in recorder.seen)
    assert first == derive_key("step", "wf", secret, "act", "0")
    assert all(wire.key_problem(k) is None for k in (first, second))


async def test_a_raising_source_propagates_and_nothing_is_sent() -> None:
    recorder = Recorder()

    class EngineDown(Exception):
        pass

    async with Client(make_server(recorder)) as client:
        rs = RetryingSession(client, key_source=Source(EngineDown("no step context")))
        with pytest.raises(EngineDown, match="no step context"):
            await rs.call_tool("idem", {"x": 1})
    assert recorder.executions() == 0


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (42, TypeError),
        (b"bytes-key", TypeError),
        ("", ValueError),
        ("x" * 256, ValueError),
        ("tab\there", ValueError),
        ("naïve", ValueError),
    ],
)
async def test_a_bad_key_from_the_source_is_refused_before_anything_is_sent(
    answer: object, error: type[Exception]
) -> None:
    recorder = Recorder()
    async with Client(make_server(recorder)) as client:
        rs = RetryingSession(client, key_source=Source(answer))
        with pytest.raises(error, match="key_source"):
            await rs.call_tool("idem", {"x": 1})
    assert recorder.executions() == 0


async def test_bad_key_source_arguments_are_refused() -> None:
    async with Client(make_server(Recorder())) as client:
        with pytest.raises(TypeError):
            RetryingSession(client, key_source="step")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        step_key_from("wf", ordinal=-1)
    with pytest.raises(ValueError):
        step_key_from(ordinal=0)
    with pytest.raises(TypeError), key_step("wf", 7):  # type: ignore[arg-type]
        pass
    with pytest.raises(ValueError), key_step():
        pass
