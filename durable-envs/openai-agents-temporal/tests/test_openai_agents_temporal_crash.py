"""OpenAI Agents x Temporal (#22): a worker killed before, during and after an MCP tool call.

Real parts: a Temporal dev server (`temporal_dev`), the shop server process with its ledger
(`crash_kit.durable_shop`, guarded by a SQLite key store), a worker process
(`agents_temporal_worker.py`) running an Agents SDK agent through
`temporalio.contrib.openai_agents` with a scripted model, killed in its window and restarted.
With the workflow-side `temporal_tool_meta`: 1 effect in every window, under the key of the
workflow run and the tool-call id; where the tool had run, the re-run was answered with the
stored result, marked replayed, and the workflow got the first run's receipt. Without it (the
worker's mcp-once mints a key per activity attempt): 2 effects where the tool had run.
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from pathlib import Path

import anyio
import pytest
from crash_kit import SOON, CrashingWorker, Window, durable_shop
from temporalio.client import Client

from orchestrator.openai_agents import temporal_tool_call_key

pytestmark = pytest.mark.anyio

WORKER = Path(__file__).with_name("agents_temporal_worker.py")
ROOT = Path(__file__).resolve().parents[3]
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


@pytest.mark.parametrize(("window", "keyed"), CASES)
async def test_a_crashed_worker_pays_once_with_the_workflow_key(
    temporal: str, tmp_path: Path, window: Window, keyed: bool
) -> None:
    call_id = f"pay-{uuid.uuid4().hex[:8]}"
    queue = f"agents-{call_id}"
    calls = tmp_path / "calls.jsonl"
    async with durable_shop(tmp_path) as shop:
        argv = [
            sys.executable, str(WORKER), "--address", temporal, "--task-queue", queue,
            "--shop", shop.url, "--calls", str(calls),
        ]  # fmt: skip
        env = {"PYTHONPATH": PATH}
        worker = CrashingWorker(argv, window=window, tmp=tmp_path, env=env)
        # The restart: same command and environment, started now but held until the first
        # worker is dead (`--standby`), so that its imports overlap the first run.
        go = tmp_path / "take-over"
        restart = CrashingWorker(
            [*argv, "--standby", str(go)], window=window, tmp=tmp_path, name="restart", env=env
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
            await worker.crashed(shop.ledger)
            go.touch()
            with anyio.fail_after(SOON):
                answer = await handle.result()
        finally:
            worker.stop()
            restart.stop()
        effects = shop.effects(call_id)
        told = (
            [json.loads(line) for line in calls.read_text().splitlines()] if calls.exists() else []
        )
        tool_ran_first = window in ("during", "after")
        if not keyed:
            assert len(effects) == 2, (effects, worker.output(), restart.output())
            assert effects[0].key != effects[1].key  # a fresh key per activity attempt
            return
        assert len(effects) == 1, (effects, worker.output(), restart.output())
        expected = temporal_tool_call_key(
            "default", call_id, handle.result_run_id or "", "shop", "pay", TOOL_CALL_ID
        )
        assert effects[0].key == expected  # the workflow's key, kept by the worker's server
        assert told[-1]["key"] == expected
        assert told[-1]["status"] == ("replayed" if tool_ran_first else "executed")
        if window == "after":
            assert [t["status"] for t in told] == ["executed", "replayed"]
            assert told[0]["text"] == told[1]["text"]
        assert effects[0].result in answer, answer  # the first run's receipt, replayed
