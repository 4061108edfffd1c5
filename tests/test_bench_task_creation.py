"""`benchmarks/task_creation.py` (issue 44's task creation cost), run at the smoke scale: every
store measured with the four variants side by side, one task created per creation (the module
checks it, and would raise), and the verdict rows `bench --check` reads; a task creation over its
bound is a missed target."""

from __future__ import annotations

import copy

import pytest

from benchmarks import task_creation
from benchmarks._scale import SMOKE

pytestmark = pytest.mark.redis


@pytest.fixture(scope="module")
def measured() -> dict[str, object]:
    return task_creation.measure(SMOKE)


def test_every_store_is_measured_side_by_side(measured: dict[str, object]) -> None:
    by_store = measured["by_store"]
    assert isinstance(by_store, dict) and set(by_store) == {"memory", "sqlite", "redis"}
    for figures in by_store.values():
        for variant in (*task_creation.VARIANTS, "write"):
            assert figures[variant]["p50_ms"]["median"] > 0
        bound = figures["call_added_ms"]["median"] + figures["write"]["p50_ms"]["median"]
        assert figures["bound_ms"] == pytest.approx(bound, abs=1e-3)


def test_the_verdict_rows_follow_the_figures(measured: dict[str, object]) -> None:
    rows = measured["targets"]
    assert isinstance(rows, list) and len(rows) == 3
    for row, figures in zip(rows, measured["by_store"].values(), strict=True):  # type: ignore[attr-defined]
        assert row["measured"] == figures["task_added_ms"]["median"]
        assert row["met"] == (row["measured"] <= figures["bound_ms"])
    over = copy.deepcopy(measured)
    for figures in over["by_store"].values():  # type: ignore[attr-defined]
        figures["task_added_ms"]["median"] = figures["bound_ms"] + 0.001
    assert [row["met"] for row in task_creation.verdicts(over)] == [False] * 3
