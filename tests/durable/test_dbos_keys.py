"""`orchestrator.dbos.step_key` inside a real DBOS (SQLite system database, in this process):
the key of a call is fixed by the workflow id, the step id and the call's order in the step.

No MCP server here: the key source is asked directly (`key_from_source`, as `RetryingSession`
asks it). What the keys do against a server after a crash is `test_dbos_crash.py`'s business.
"""

from __future__ import annotations

import os
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator import KeyRequest, key_step, step_key_from
from orchestrator._key import key_from_source

try:
    from dbos import DBOS, SetWorkflowID

    from orchestrator.dbos import KEY_SOURCE, NotInStep, step_key
except ImportError as missing:  # pragma: no cover - the `dbos` group is a default group
    message = f"DBOS NOT INSTALLED — the DBOS key tests cannot run: {missing}"
    if os.environ.get("CI", "").lower() in {"1", "true", "yes"}:
        pytest.fail(message + " (under CI a missing engine is a failure)", pytrace=False)
    warnings.warn(message, stacklevel=1)
    pytest.skip(message, allow_module_level=True)


def ask() -> str | None:
    return key_from_source(step_key, "pay", {"cents": 1})


failures: dict[str, int] = {}


@DBOS.step()
def two_calls() -> tuple[str | None, str | None, int | None]:
    return ask(), ask(), DBOS.step_id


@DBOS.step(retries_allowed=True, max_attempts=3, interval_seconds=0.0)
def flaky_two_calls(workflow: str) -> list[str | None]:
    keys = [ask(), ask()]
    if failures.get(workflow, 0) < 1:  # the first attempt fails after both calls
        failures[workflow] = failures.get(workflow, 0) + 1
        raise ValueError("attempt 0 fails")
    return keys


@DBOS.step()
def inside_a_callers_key_step() -> str | None:
    with key_step("not", "dbos"):
        ask()  # takes ordinal 0 of the caller's block, and the DBOS step's ordinal 0
        return ask()


@DBOS.workflow()
def keyed_workflow() -> dict[str, object]:
    first = two_calls()
    DBOS.sleep(0.01)  # an operation between steps takes a step id too
    second = two_calls()
    try:
        ask()
        in_workflow_code = ""
    except NotInStep as refused:
        in_workflow_code = str(refused)
    return {"first": first, "second": second, "refused": in_workflow_code}


@DBOS.workflow()
def retried_workflow(workflow: str) -> list[str | None]:
    return flaky_two_calls(workflow)


@DBOS.workflow()
def nested_workflow() -> str | None:
    return inside_a_callers_key_step()


@pytest.fixture(scope="module", autouse=True)
def dbos(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    db: Path = tmp_path_factory.mktemp("dbos-keys") / "dbos.sqlite3"
    DBOS(
        config={
            "name": "mcp-once-keys",
            "system_database_url": f"sqlite:///{db}",
            "application_version": "keys-test-1",
        }
    )
    DBOS.launch()
    yield
    DBOS.destroy()


def run_as(workflow_id: str, fn: object, *args: object) -> object:
    with SetWorkflowID(workflow_id):
        return DBOS.start_workflow(fn, *args).get_result()  # type: ignore[arg-type]


def expected(workflow_id: str, step_id: int, ordinal: int) -> str:
    return step_key_from(KEY_SOURCE, workflow_id, str(step_id), ordinal=ordinal)


def test_calls_in_a_step_are_keyed_by_workflow_step_and_order() -> None:
    workflow_id = f"wf-{uuid.uuid4().hex[:8]}"
    out = run_as(workflow_id, keyed_workflow)
    assert isinstance(out, dict)
    a0, a1, first_step = out["first"]
    b0, b1, second_step = out["second"]
    # DBOS numbers the workflow's operations: step 1, the sleep 2, step 3.
    assert (first_step, second_step) == (1, 3)
    assert [a0, a1] == [expected(workflow_id, 1, 0), expected(workflow_id, 1, 1)]
    assert [b0, b1] == [expected(workflow_id, 3, 0), expected(workflow_id, 3, 1)]
    assert len({a0, a1, b0, b1}) == 4
    assert workflow_id not in str(a0)  # hashed: ids do not reach the wire


def test_workflow_code_is_refused_loudly() -> None:
    out = run_as(f"wf-{uuid.uuid4().hex[:8]}", keyed_workflow)
    assert isinstance(out, dict)
    assert "in workflow code" in str(out["refused"]) and "@DBOS.step" in str(out["refused"])


def test_outside_any_workflow_is_refused_before_anything_is_sent() -> None:
    with pytest.raises(NotInStep, match="outside any DBOS workflow"):
        step_key(KeyRequest("pay", {}, 0))


def test_a_retried_step_restarts_its_ordinals() -> None:
    """Attempt 1 of a step (`retries_allowed`) runs it from its top: its calls get attempt 0's
    keys, not the next ordinals."""
    workflow_id = f"wf-{uuid.uuid4().hex[:8]}"
    keys = run_as(workflow_id, retried_workflow, workflow_id)
    assert failures[workflow_id] == 1
    assert keys == [expected(workflow_id, 1, 0), expected(workflow_id, 1, 1)]


def test_a_callers_key_step_does_not_change_the_dbos_identity() -> None:
    workflow_id = f"wf-{uuid.uuid4().hex[:8]}"
    assert run_as(workflow_id, nested_workflow) == expected(workflow_id, 1, 1)


def test_a_finished_workflow_started_again_returns_its_recorded_keys() -> None:
    workflow_id = f"wf-{uuid.uuid4().hex[:8]}"
    assert run_as(workflow_id, keyed_workflow) == run_as(workflow_id, keyed_workflow)
