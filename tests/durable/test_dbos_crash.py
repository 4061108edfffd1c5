"""DBOS (SQLite system database) killed mid-step and recovered by `DBOS.launch()`: one payment.

Two legs, each a real worker process (`dbos_worker.py`) paying through the real shop server over
streamable HTTP, killed in one of three windows (`crash_kit.WINDOWS`) and restarted; the restarted
worker starts nothing, `DBOS.launch()` recovers the workflow:
- `session`: a `@DBOS.step` calling through `RetryingSession(client, key_source=step_key)`;
- `agent`: pydantic-ai's `DBOSDurability` (scripted model) with `keyed_tool_calls` as the MCP
  toolset's `process_tool_call`.
With the adapter: 1 effect, the recovered step ran under the crashed one's workflow id and
step id, its result was the server's replay where the tool had run, and the workflow's result is
the first run's receipt. Without it (the same worker, `MCP_ONCE_ADAPTER=0`): 2 effects where the
tool ran before the crash, proof the harness sees duplicates. Starting the finished workflow id
again (in the recovering worker, `after` window) runs nothing.
"""

from __future__ import annotations

import json
import os
import sys
import uuid
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.from_thread
import pytest
from crash_kit import CrashingWorker, DurableShop, Window, crash_cases, durable_shop, outcome

from orchestrator import step_key_from

try:
    import dbos  # noqa: F401

    from orchestrator.dbos import KEY_SOURCE
except ImportError as missing:  # pragma: no cover - the `dbos` group is a default group
    message = f"DBOS NOT INSTALLED — the DBOS crash tests cannot run: {missing}"
    if os.environ.get("CI", "").lower() in {"1", "true", "yes"}:
        pytest.fail(message + " (under CI a missing engine is a failure)", pytrace=False)
    warnings.warn(message, stacklevel=1)
    pytest.skip(message, allow_module_level=True)

WORKER = Path(__file__).with_name("dbos_worker.py")

#: (leg, window, adapter): every window with the adapter; without it, `after` (the window the
#: adapter exists for: the tool ran and its answer was lost with the worker). Without the adapter
#: `during` duplicates too, and `before` cannot (nothing ran); each worker costs seconds.
CASES = [
    pytest.param(leg, window, adapter, id=f"{leg}-{window}-{'adapter' if adapter else 'bare'}")
    for leg in ("session", "agent")
    for window, adapter in [("before", True), ("during", True), ("after", True), ("after", False)]
]


@pytest.fixture(scope="module")
def shop(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DurableShop]:
    """One guarded shop for the module (each test pays under its own call id)."""
    tmp = tmp_path_factory.mktemp("dbos-shop")
    with (
        anyio.from_thread.start_blocking_portal() as portal,
        portal.wrap_async_context_manager(durable_shop(tmp)) as started,
    ):
        yield started


@dataclass
class Run:
    """What the workers of one test did: the workflow's result and each paying execution."""

    workflow_id: str
    call_id: str
    worker: CrashingWorker
    out: Path
    steps: Path

    def result(self) -> dict[str, Any]:
        outcome: dict[str, Any] = json.loads(self.out.read_text())
        return outcome

    def lines(self, event: str) -> list[dict[str, Any]]:
        text = self.steps.read_text() if self.steps.exists() else ""
        return [line for line in map(json.loads, text.splitlines()) if line["event"] == event]


def start_run(shop: DurableShop, tmp: Path, leg: str, window: Window, adapter: bool) -> Run:
    workflow_id = f"wf-{leg}-{window}-{uuid.uuid4().hex[:8]}"
    call_id = f"call-{uuid.uuid4().hex[:8]}"
    out, steps = tmp / "out.json", tmp / "steps.jsonl"
    env = {
        "MCP_ONCE_SHOP_URL": shop.url,
        "MCP_ONCE_CALL_ID": call_id,
        "MCP_ONCE_WORKFLOW_ID": workflow_id,
        "MCP_ONCE_ADAPTER": "1" if adapter else "0",
        "MCP_ONCE_DBOS_DB": str(tmp / "dbos.sqlite3"),
        "MCP_ONCE_STEPS": str(steps),
        "MCP_ONCE_OUT": str(out),
        "MCP_ONCE_AGAIN": "1" if window == "after" and adapter else "0",
    }
    worker = CrashingWorker(
        [sys.executable, str(WORKER), leg], window=window, tmp=tmp, name=leg, env=env
    )
    return Run(workflow_id, call_id, worker, out, steps)


async def crash_and_recover(
    shop: DurableShop, tmp: Path, leg: str, window: Window, adapter: bool
) -> Run:
    """The worker dies in its window; the restarted one lets `DBOS.launch()` recover."""
    run = start_run(shop, tmp, leg, window, adapter)
    try:
        run.worker.start()
        await run.worker.crashed(shop.ledger, call_id=run.call_id)
        run.worker.start()
        code = await run.worker.wait()
        assert code == 0, f"the recovering worker exited {code}:\n{run.worker.output()}"
    finally:
        run.worker.stop()
    return run


@pytest.fixture(scope="module")
def recovered(
    shop: DurableShop, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Run | Exception]:
    """Every case, crashed and recovered, side by side (4 at once: most of a case is worker
    start-up and waiting on the other processes): each test then checks its own."""
    return crash_cases(CASES, tmp_path_factory, crash_and_recover, shop, at_once=4)


@pytest.mark.parametrize(("leg", "window", "adapter"), CASES)
def test_a_recovered_step_pays_once_with_the_adapter_and_twice_without(
    recovered: dict[str, Run | Exception],
    shop: DurableShop,
    request: pytest.FixtureRequest,
    leg: str,
    window: Window,
    adapter: bool,
) -> None:
    run = outcome(recovered, request.node.callspec.id)
    effects = shop.effects(run.call_id)
    starts, ends = run.lines("start"), run.lines("end")
    # Recovery by DBOS.launch(): the crashed execution and the recovered one, in two processes,
    # under one workflow id and one step id; only the recovered one got an answer.
    assert len(starts) == 2 and len({line["pid"] for line in starts}) == 2, starts
    assert {(line["workflow_id"], line["step_id"]) for line in starts} == {
        (run.workflow_id, starts[0]["step_id"])
    }
    (end,) = ends
    if not adapter:
        assert len(effects) == 2, effects
        assert end["replayed"] is False
        return
    assert len(effects) == 1, effects
    (effect,) = effects
    assert run.result()["recovered"] == effect.result  # the first (only) run's receipt
    assert end["replayed"] is (window != "before")  # the tool had run: the server replayed
    assert effect.key is not None
    if leg == "session":
        step_id = str(starts[0]["step_id"])
        assert effect.key == step_key_from(KEY_SOURCE, run.workflow_id, step_id, ordinal=0)
    else:
        assert effect.key.startswith("pydantic-ai-")
    if window == "after":
        # The recovering worker then started the finished workflow id again (SetWorkflowID):
        # DBOS returned the recorded result and ran nothing.
        assert run.result()["again"] == effect.result
        assert len(run.lines("start")) == 2
        assert len(shop.effects(run.call_id)) == 1
