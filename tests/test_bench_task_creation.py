"""`benchmarks/task_creation.py` (issue 44's task creation cost), run at the smoke scale: every
store measured with the six variants side by side, one task created per creation (the module
checks it, and would raise), and the verdict rows `bench --check` reads; a task creation over its
bound is a missed target, and so is a plain call from a declaring client that costs more Redis
round trips than one from a client that does not."""

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
    assert isinstance(rows, list) and len(rows) == 4
    for row, figures in zip(rows[:3], measured["by_store"].values(), strict=True):  # type: ignore[attr-defined]
        assert row["measured"] == figures["task_added_ms"]["median"]
        assert row["met"] == (row["measured"] <= figures["bound_ms"])
    over = copy.deepcopy(measured)
    for figures in over["by_store"].values():  # type: ignore[attr-defined]
        figures["task_added_ms"]["median"] = figures["bound_ms"] + 0.001
    assert [row["met"] for row in task_creation.verdicts(over)] == [False] * 3 + [True]


def test_a_plain_call_from_a_declaring_client_costs_a_plain_calls_round_trips(
    measured: dict[str, object],
) -> None:
    """Counted by Redis (`INFO`): two round trips for every guarded variant, none unguarded; the
    verdict row fails where a declaring client's plain call costs more (as it did: four)."""
    trips = measured["redis_round_trips_per_call"]
    assert trips == {v: (2.0 if v.endswith("_guarded") else 0.0) for v in task_creation.VARIANTS}
    row = measured["targets"][-1]  # type: ignore[index]
    assert row["measured"] == 2.0 and row["met"] is True
    over = copy.deepcopy(measured)
    over["redis_round_trips_per_call"]["call_declaring_guarded"] = 4.0  # type: ignore[index]
    assert task_creation.verdicts(over)[-1]["met"] is False
