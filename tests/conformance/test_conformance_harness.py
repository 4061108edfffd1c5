"""The conformance harness itself, without Node: the fixture is fully guarded by `install()`, and
the runner reads the suite's results and compares the two servers as `.ci/conformance` relies on.

The suites themselves run in `.ci/conformance` (Node and npm), not here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fixture_server import build_server, guarded_tools
from run_conformance import PassResult, Scenario, compare, read_results

from idempotency import MemoryKeyStore, install

pytestmark = pytest.mark.anyio


async def test_install_guards_every_fixture_tool() -> None:
    bare = build_server()
    assert await guarded_tools(bare) == (0, 28)
    guarded = build_server()
    install(guarded, MemoryKeyStore())
    assert await guarded_tools(guarded) == (28, 28)


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
    assert results["tools-call-sampling"] == Scenario(False, ["tools-call-sampling: no sampling"])
    assert not results["empty"].passed
    assert not results["crashed"].passed  # started, but wrote nothing


def test_only_scenarios_passing_unguarded_are_held_against_the_guard() -> None:
    ok, failed = Scenario(True), Scenario(False, ["x: broken"])
    unguarded: list[PassResult] = [{"a": ok, "b": failed}, {"a": ok, "b": failed}]
    guarded: list[PassResult] = [{"a": ok, "b": failed}, {"a": failed, "b": failed}]
    regressions, bare_failures = compare({"unguarded": unguarded, "guarded": guarded})
    assert [str(f) for f in regressions] == ["a (pass 2): x: broken"]
    assert [f.scenario for f in bare_failures] == ["b", "b"]
