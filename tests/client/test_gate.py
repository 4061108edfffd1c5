"""The gate, against a real MCP server whose link loses answers (both protocol eras).

The server has no idempotency layer, so every attempt that reaches it runs the tool: execution
counts show exactly what the retry logic sent.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TypeVar, cast

import pytest
from _faults import Faults, faulty_transport
from _servers import Recorder, make_server
from mcp import Client

from idempotency import wire
from orchestrator import OutcomeUnknown, Override, RetryingSession, RetryPolicy

pytestmark = pytest.mark.anyio
TestT = TypeVar("TestT", bound=Callable[..., object])


def every_era_and_backend(test: TestT) -> TestT:
    test = pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])(test)
    return cast(TestT, pytest.mark.parametrize("mode", ["auto", "legacy"])(test))


# Secondary behaviour: each era and each backend once, to keep the suite fast.
each_era_once = pytest.mark.parametrize(
    ("anyio_backend", "mode"), [("asyncio", "auto"), ("trio", "legacy")]
)

# A dropped answer is noticed by timeout: keep it short, the tools answer at once.
FAST = RetryPolicy(attempt_timeout=0.2, deadline=10)


def connector(
    recorder: Recorder, faults: Faults, mode: str
) -> Callable[[], AbstractAsyncContextManager[Client]]:
    server = make_server(recorder)

    def connect() -> AbstractAsyncContextManager[Client]:
        return Client(faulty_transport(server, faults), mode=mode)

    return connect


@asynccontextmanager
async def retrying(
    mode: str,
    faults: Faults,
    recorder: Recorder,
    policy: RetryPolicy = FAST,
    overrides: Mapping[str, Override] | None = None,
) -> AsyncIterator[RetryingSession]:
    async with RetryingSession(
        policy=policy, connect=connector(recorder, faults, mode), overrides=overrides
    ) as session:
        yield session


@every_era_and_backend
@pytest.mark.parametrize("tool", ["idem", "reader"])
async def test_lost_answer_of_safe_tool_is_retried_with_same_key(mode: str, tool: str) -> None:
    recorder, faults = Recorder(), Faults(plan={tool: ["drop"]})
    async with retrying(mode, faults, recorder) as rs:
        result, report = await rs.call_tool_with_report(tool, {"x": 7})
    assert result.is_error is False and result.content[0].text == f"{tool}:7"  # type: ignore[union-attr]
    assert recorder.executions(tool) == 2  # ran, answer lost, ran again
    keys = recorder.keys(tool)
    assert keys[0] == keys[1] == report.key and wire.key_problem(keys[0]) is None
    assert recorder.attempts(tool) == [1, 2]
    assert [a.failure for a in report.attempts] == ["maybe_executed", None]
    assert report.attempts[0].code == -32001 and report.outcome == "result"


@every_era_and_backend
async def test_lost_answer_of_unsafe_tool_is_outcome_unknown_after_one_run(mode: str) -> None:
    for tool in ("plain", "unsafe"):
        recorder, faults = Recorder(), Faults(plan={tool: ["drop"]})
        async with retrying(mode, faults, recorder) as rs:
            with pytest.raises(OutcomeUnknown) as caught:
                await rs.call_tool(tool, {"x": 1})
        assert recorder.executions(tool) == 1
        err = caught.value
        assert err.tool == tool and err.attempts == 1 and err.reason == "not_idempotent"
        assert err.key == recorder.keys(tool)[0]
        assert err.report is not None and err.report.outcome == "outcome_unknown"
        assert getattr(err.last_error, "code", None) == -32001


@every_era_and_backend
async def test_lost_connection_reconnects_and_retries_same_key(mode: str) -> None:
    recorder, faults = Recorder(), Faults(plan={"idem": ["kill"]})
    async with retrying(mode, faults, recorder) as rs:
        result, report = await rs.call_tool_with_report("idem", {"x": 3})
        assert rs.connects == 2 and faults.links == 2 and faults.kills == 1
    assert result.content[0].text == "idem:3"  # type: ignore[union-attr]
    assert recorder.attempts("idem") == [1, 2]
    assert len(set(recorder.keys("idem"))) == 1
    assert [(a.failure, a.generation) for a in report.attempts] == [
        ("maybe_executed", 1),
        (None, 2),
    ]
    assert report.attempts[0].code == -32000 and report.connects == 2


@each_era_once
async def test_lost_connection_of_unsafe_tool_is_outcome_unknown(mode: str) -> None:
    recorder, faults = Recorder(), Faults(plan={"plain": ["kill"]})
    async with retrying(mode, faults, recorder) as rs:
        with pytest.raises(OutcomeUnknown) as caught:
            await rs.call_tool("plain", {"x": 3})
        # The next call goes to a fresh session and is not affected.
        assert (await rs.call_tool("plain", {"x": 4})).content[0].text == "plain:4"  # type: ignore[union-attr]
    assert recorder.executions("plain") == 2
    assert caught.value.attempts == 1 and caught.value.reason == "not_idempotent"


@each_era_once
async def test_overrides_correct_annotations(mode: str) -> None:
    recorder = Recorder()
    faults = Faults(plan={"plain": ["drop"], "idem": ["drop"]})
    policy = RetryPolicy(attempt_timeout=0.2, overrides={"plain": "idempotent"})
    async with retrying(mode, faults, recorder, policy, overrides={"idem": "never"}) as rs:
        assert (await rs.call_tool("plain", {"x": 1})).content[0].text == "plain:1"  # type: ignore[union-attr]
        with pytest.raises(OutcomeUnknown):
            await rs.call_tool("idem", {"x": 1})
    assert recorder.counts() == {"plain": 2, "idem": 1}


@each_era_once
async def test_untrusted_annotations_only_overrides_open_the_gate(mode: str) -> None:
    recorder = Recorder()
    faults = Faults(plan={"idem": ["drop"], "reader": ["drop"]})
    policy = RetryPolicy(
        attempt_timeout=0.2, trust_annotations=False, overrides={"reader": "idempotent"}
    )
    async with retrying(mode, faults, recorder, policy) as rs:
        with pytest.raises(OutcomeUnknown) as caught:
            await rs.call_tool("idem", {"x": 1})
        assert (await rs.call_tool("reader", {"x": 2})).content[0].text == "reader:2"  # type: ignore[union-attr]
    assert caught.value.reason == "not_idempotent"
    assert recorder.counts() == {"idem": 1, "reader": 2}


@each_era_once
async def test_caller_meta_and_key_travel_on_every_attempt(mode: str) -> None:
    recorder, faults = Recorder(), Faults(plan={"idem": ["drop", "drop"]})
    async with retrying(mode, faults, recorder) as rs:
        await rs.call_tool("idem", {"x": 1}, meta={"trace": "t-1"}, idempotency_key="order-42")
        await rs.call_tool("idem", {"x": 2}, meta={wire.KEY_META: "from-meta"})
    seen = recorder.seen
    assert [(s.key, s.attempt) for s in seen] == [
        ("order-42", 1),
        ("order-42", 2),
        ("order-42", 3),
        ("from-meta", 1),
    ]
    assert all(s.meta["trace"] == "t-1" for s in seen[:3])
