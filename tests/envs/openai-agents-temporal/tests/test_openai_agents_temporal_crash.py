"""OpenAI Agents x Temporal (#22): a worker killed before, during and after an MCP tool call.

Real parts: a Temporal dev server (`temporal_dev`), the shop server process with its ledger
(`crash_kit.running_shop`, guarded by a SQLite key store), a worker process
(`agents_temporal_worker.py`) running an Agents SDK agent through
`temporalio.contrib.openai_agents` with a scripted model, killed in its window and restarted.
With the workflow-side `temporal_tool_meta`: 1 effect in every window, under the key of the
workflow run and the tool-call id; where the tool had run, the re-run was answered with the
stored result, marked replayed, and the workflow got the first run's receipt. Without it (the
worker's mcp-once mints a key per activity attempt): 2 effects where the tool had run.
The cases run side by side against one dev server and one shop (`crash_kit.side_by_side`).
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import crash_kit as kit
import pytest
from crash_kit import CrashingWorker, DurableShop, Window, running_shop
from temporalio.client import Client

from mcp_once.scenarios._ledger import Effect
from orchestrator.openai_agents import temporal_tool_call_key

WORKER = Path(__file__).with_name("agents_temporal_worker.py")
ROOT = Path(__file__).resolve().parents[4]
#: The worker imports the crash kit and the example's scripted model.
PATH = os.pathsep.join(str(ROOT / part) for part in ("", "tests/durable", "examples"))
TOOL_CALL_ID = "call-pay-1"  # agents_temporal_worker.TOOL_CALL_ID (not imported: no sandbox here)


CASES = [
    pytest.param("before", True, id="before-keyed"),
    pytest.param("during", True, id="during-keyed"),
    pytest.param("after", True, id="after-keyed"),
    # The baseline: "before" proves nothing there (the tool never ran before the crash).
    pytest.param("during", False, id="during-unkeyed"),
    pytest.param("after", False, id="after-unkeyed"),
]


@dataclass
class Crashed:
    """What one crash case left: the workflow's answer, the shop's effects for its call id,
    what the workers were told, the key the workflow was to send, and the workers' output."""

    answer: str
    effects: list[Effect]
    told: list[dict[str, Any]]
    expected_key: str
    output: str


async def crash_and_rerun(
    temporal: str, shop: DurableShop, tmp: Path, window: Window, keyed: bool
) -> Crashed:
    """Start the agent's workflow on a worker that dies in `window`; the restart (started at
    once, held until the first worker is dead) takes over; the workflow's answer."""
    call_id = f"pay-{uuid.uuid4().hex[:8]}"
    queue = f"agents-{call_id}"
    calls = tmp / "calls.jsonl"
    argv = [
        sys.executable, str(WORKER), "--address", temporal, "--task-queue", queue,
        "--shop", shop.url, "--calls", str(calls),
    ]  # fmt: skip
    env = {"PYTHONPATH": PATH}
    worker = CrashingWorker(argv, window=window, tmp=tmp, env=env)
    # The restart: same command and environment, started now but held until the first
    # worker is dead (`--standby`), so that its imports overlap the first run.
    go = tmp / "take-over"
    restart = CrashingWorker(
        [*argv, "--standby", str(go)], window=window, tmp=tmp, name="restart", env=env
    )
    try:
        worker.start()
        restart.start()
        client = await Client.connect(temporal)
        handle = await client.start_workflow(
            "PayAgent",
            {"call_id": call_id, "keyed": keyed},
            id=call_id,
            task_queue=queue,
            result_type=str,
        )
        answer = await kit.result_after_crash(worker, shop.ledger, call_id, handle, go.touch)
    finally:
        worker.stop()
        restart.stop()
    told = [json.loads(line) for line in calls.read_text().splitlines()] if calls.exists() else []
    expected = temporal_tool_call_key(
        "default", call_id, handle.result_run_id or "", "shop", "pay", TOOL_CALL_ID
    )
    output = worker.output() + "\n--- restart ---\n" + restart.output()
    return Crashed(answer, shop.effects(call_id), told, expected, output)


@pytest.fixture(scope="module")
def crashed(temporal: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Every case side by side against the leg's dev server and one shop (each with its own
    task queue, workflow id, call id and crash mark); each test checks its own."""
    with running_shop(tmp_path_factory.mktemp("shop")) as shop:
        yield kit.crash_cases(CASES, tmp_path_factory, crash_and_rerun, temporal, shop)


@pytest.mark.parametrize(("window", "keyed"), CASES)
def test_a_crashed_worker_pays_once_with_the_workflow_key(
    crashed: dict[str, Crashed | Exception],
    request: pytest.FixtureRequest,
    window: Window,
    keyed: bool,
) -> None:
    run = kit.outcome(crashed, request.node.callspec.id)
    effects, told = run.effects, run.told
    tool_ran_first = window in ("during", "after")
    if not keyed:
        assert len(effects) == 2, (effects, run.output)
        assert effects[0].key != effects[1].key  # a fresh key per activity attempt
        return
    assert len(effects) == 1, (effects, run.output)
    assert effects[0].key == run.expected_key  # the workflow's key, kept by the worker's server
    assert told[-1]["key"] == run.expected_key
    assert told[-1]["status"] == ("replayed" if tool_ran_first else "executed")
    if window == "after":
        assert [t["status"] for t in told] == ["executed", "replayed"]
        assert told[0]["text"] == told[1]["text"]
    assert effects[0].result in run.answer, run.answer  # the first run's receipt, replayed
