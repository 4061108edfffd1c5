"""The conformance harness itself, without Node: the fixture is fully guarded by `install()` (its
argument-keyed tool by its own policy), and the runner reads the suite's results and compares the
two servers as `.ci/conformance` relies on.

The suites themselves run in `.ci/conformance` (Node and npm), not here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fixture_server import KEY_ARGUMENT, KEYED_TOOL, build_server, guarded_tools
from fixture_tasks import TasksFixture
from mcp.client import Client
from mcp_types import TextContent
from run_conformance import (
    PROXY_EXCEPTIONS,
    Allowance,
    PassResult,
    Scenario,
    compare,
    read_results,
)

from idempotency import MemoryKeyStore, install, wire
from mcp_once.proxy.tasks import producing_tasks

pytestmark = pytest.mark.anyio


async def test_install_guards_every_fixture_tool() -> None:
    bare = build_server()
    assert await guarded_tools(bare) == (0, 29)
    store = MemoryKeyStore()
    guarded = build_server(store)
    assert await guarded_tools(guarded) == (1, 29)  # the argument-keyed tool, by its own policy
    install(guarded, store)
    assert await guarded_tools(guarded) == (29, 29)


async def test_the_argument_keyed_tool_is_listed_retry_safe_with_its_key_place() -> None:
    """What the suites list in guarded mode: `idempotentHint: true`, the key's place in `_meta`,
    the key argument in the schema (optional: keys="derived"); and the key works."""
    store = MemoryKeyStore()
    server = build_server(store)
    install(server, store)
    async with Client(server, mode="legacy") as client:
        listed = {tool.name: tool for tool in (await client.list_tools()).tools}
        sent: dict[str, Any] = {"note": "n", KEY_ARGUMENT: "k-1"}
        first = await client.call_tool(KEYED_TOOL, sent)
        again = await client.call_tool(KEYED_TOOL, sent)
    tool = listed[KEYED_TOOL].model_dump(by_alias=True, mode="json", exclude_none=True)
    assert tool["annotations"]["idempotentHint"] is True
    entry = tool["_meta"][wire.IDEMPOTENCY_META]
    assert entry[wire.DEFINITION_KEY_ARGUMENT] == KEY_ARGUMENT and entry["keys"] == "derived"
    assert tool["inputSchema"]["properties"][KEY_ARGUMENT]["type"] == "string"
    assert tool["inputSchema"]["required"] == ["note"]
    others = [t for name, t in listed.items() if name != KEYED_TOOL]
    assert all(  # install()'s default options: no other tool gained a key place
        wire.DEFINITION_KEY_ARGUMENT not in (t.meta or {})[wire.IDEMPOTENCY_META] for t in others
    )
    texts = []
    for result in (first, again):
        block = result.content[0]
        assert isinstance(block, TextContent)
        texts.append(block.text)
    assert texts == ["recorded n (execution 1)"] * 2
    assert (again.meta or {})[wire.IDEMPOTENCY_META]["status"] == "replayed"


async def test_unguarded_the_keyed_tool_is_a_plain_tool() -> None:
    server = build_server()
    async with Client(server, mode="legacy") as client:
        listed = {tool.name: tool for tool in (await client.list_tools()).tools}
        sent = {"note": "n"}
        results = [await client.call_tool(KEYED_TOOL, sent) for _ in range(2)]
    tool = listed[KEYED_TOOL]
    assert KEY_ARGUMENT not in tool.input_schema["properties"] and tool.meta is None
    block = results[1].content[0]
    assert isinstance(block, TextContent) and block.text == "recorded n (execution 2)"


def _write(root: Path, scenario: str, checks: object) -> None:
    folder = root / f"server-{scenario}-2026-01-02T03-04-05-678Z"
    folder.mkdir()
    (folder / "checks.json").write_text(json.dumps(checks), encoding="utf-8")


def test_results_are_read_per_scenario(tmp_path: Path) -> None:
    _write(tmp_path, "ping", [{"id": "ping", "status": "SUCCESS"}])
    _write(
        tmp_path,
        "server-sse-polling",
        [{"id": "a", "status": "INFO"}, {"id": "b", "status": "WARNING", "errorMessage": "meh"}],
    )
    _write(
        tmp_path,
        "tools-call-sampling",
        [{"id": "tools-call-sampling", "status": "FAILURE", "errorMessage": "no sampling"}],
    )
    _write(tmp_path, "empty", [])
    results = read_results(tmp_path, ["ping", "crashed"])
    assert results["ping"] == Scenario(True)
    assert results["server-sse-polling"] == Scenario(True, [], ["b: meh"])
    assert results["tools-call-sampling"] == Scenario(
        False,
        ["tools-call-sampling: no sampling"],
        failed_checks=frozenset({"tools-call-sampling"}),
    )
    assert not results["empty"].passed
    assert not results["crashed"].passed  # started, but wrote nothing


def test_only_scenarios_passing_unguarded_are_held_against_the_guard() -> None:
    ok, failed = Scenario(True), Scenario(False, ["x: broken"], failed_checks=frozenset({"x"}))
    unguarded: list[PassResult] = [{"a": ok, "b": failed}, {"a": ok, "b": failed}]
    guarded: list[PassResult] = [{"a": ok, "b": failed}, {"a": failed, "b": failed}]
    comparisons, bare_failures = compare({"unguarded": unguarded, "guarded": guarded})
    assert [str(f) for f in comparisons["guarded"].regressions] == ["a (pass 2): x: broken"]
    assert [f.scenario for f in bare_failures] == ["b", "b"]


def test_the_proxy_may_fail_only_the_checks_its_allowances_name() -> None:
    """An allowance excuses the checks it names, never another check of the same scenario; an
    allowed scenario that passes in every pass is reported stale; other modes get none."""
    ok = Scenario(True)

    def failing(*checks: str) -> Scenario:
        return Scenario(False, [f"{c}: no" for c in checks], failed_checks=frozenset(checks))

    allowances = {
        "proxied": {
            "a": Allowance(frozenset({"a-1"}), "why"),
            "c": Allowance(frozenset({"c-1"}), "why"),
        }
    }
    baseline: list[PassResult] = [{"a": ok, "b": ok, "c": ok}] * 2
    proxied: list[PassResult] = [
        {"a": failing("a-1"), "b": ok, "c": ok},
        {"a": failing("a-1", "a-2"), "b": ok, "c": ok},
    ]
    guarded: list[PassResult] = [
        {"a": failing("a-1"), "b": ok, "c": ok},
        {"a": ok, "b": ok, "c": ok},
    ]
    runs = {"unguarded": baseline, "guarded": guarded, "proxied": proxied}
    comparisons, bare_failures = compare(runs, allowances)
    assert bare_failures == []
    proxy = comparisons["proxied"]
    assert [str(f) for f in proxy.allowed] == ["a (pass 1): a-1: no"]
    assert [str(f) for f in proxy.regressions] == ["a (pass 2): a-1: no; a-2: no"]
    assert proxy.stale == ["c"]
    assert [str(f) for f in comparisons["guarded"].regressions] == ["a (pass 1): a-1: no"]


def test_every_allowance_names_checks_and_a_reason() -> None:
    assert PROXY_EXCEPTIONS and all(a.checks and a.why for a in PROXY_EXCEPTIONS.values())


@pytest.mark.parametrize("guarded", [True, False])
async def test_a_keyed_task_creation_on_the_fixture_makes_one_task_when_guarded(
    guarded: bool,
) -> None:
    """Guarded mode wraps the fixture's tasks extension with `idempotent_tasks`: a keyed re-send
    of a task-augmented call gets the first call's task (rule 23); bare, a second task."""
    from task_wire import ClientTask, TasksClient, create  # tests/task_wire.py

    store = MemoryKeyStore() if guarded else None
    tasks = TasksFixture()
    server = build_server(store, tasks)
    with producing_tasks():
        async with tasks.running(), Client(server, extensions=[TasksClient()]) as client:
            key = {wire.KEY_META: "k-1"}
            answers = [await create(client, "slow_compute", {"seconds": 0}, key) for _ in "12"]
    assert all(isinstance(a, ClientTask) for a in answers)
    ids = [a.task_id for a in answers if isinstance(a, ClientTask)]
    assert len(tasks.tasks) == (1 if guarded else 2)
    assert (ids[0] == ids[1]) is guarded
