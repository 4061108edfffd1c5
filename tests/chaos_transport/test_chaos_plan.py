"""FaultPlan is data: validated, JSON round-trippable, and it lays draws out deterministically."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from orchestrator.chaos import Chaos, Fault, FaultPlan, in_memory_transport

pytestmark = pytest.mark.chaos


PLANS = [
    FaultPlan(),
    FaultPlan(lost_ack=0.2, drop_request=0.05, duplicate=0.1, close_after_write=0.01),
    FaultPlan(
        delay_request=0.5,
        delay_response=0.5,
        schedule={3: Fault.LOST_ACK, 1: None, 7: "close_before_write"},  # type: ignore[dict-item]
        methods={"tools/call", "resources/read"},
        tools=["charge", "refund"],  # type: ignore[arg-type]
        delay_min_seconds=0,
        delay_max_seconds=2.5,
    ),
]


@pytest.mark.parametrize("plan", PLANS)
def test_plan_survives_a_json_round_trip(plan: FaultPlan) -> None:
    wire = json.dumps(plan.to_dict())
    back = FaultPlan.from_dict(json.loads(wire))
    assert back == plan
    assert hash(back) == hash(plan)
    assert back.to_dict() == plan.to_dict()


def test_plan_is_normalised_and_frozen() -> None:
    # Loose input shapes (JSON-ish keys and names, lists) are normalised on construction.
    plan = FaultPlan(
        schedule={"3": "lost_ack", 1: None},  # type: ignore[dict-item]
        methods=["tools/call"],  # type: ignore[arg-type]
        tools=("a",),  # type: ignore[arg-type]
    )
    assert dict(plan.schedule) == {1: None, 3: Fault.LOST_ACK}
    assert list(plan.schedule) == [1, 3]
    assert plan.methods == frozenset({"tools/call"})
    assert plan.tools == frozenset({"a"})
    with pytest.raises(AttributeError):
        plan.lost_ack = 1.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        plan.schedule[5] = Fault.DUPLICATE  # type: ignore[index]


def test_default_plan_injects_nothing() -> None:
    plan = FaultPlan()
    assert all(
        plan.choose(index, draw) is None for index in range(1, 20) for draw in (0.0, 0.5, 0.999)
    )


def test_draws_fall_into_the_kinds_in_declaration_order() -> None:
    plan = FaultPlan(lost_ack=0.25, drop_request=0.25, close_after_write=0.25)
    assert plan.choose(1, 0.0) is Fault.LOST_ACK
    assert plan.choose(1, 0.2499) is Fault.LOST_ACK
    assert plan.choose(1, 0.25) is Fault.DROP_REQUEST
    assert plan.choose(1, 0.6) is Fault.CLOSE_AFTER_WRITE
    assert plan.choose(1, 0.75) is None
    assert plan.choose(1, 0.999) is None


def test_schedule_overrides_probabilities() -> None:
    plan = FaultPlan(lost_ack=1.0, schedule={2: None, 3: Fault.DUPLICATE})
    assert [plan.choose(index, 0.0) for index in (1, 2, 3, 4)] == [
        Fault.LOST_ACK,
        None,
        Fault.DUPLICATE,
        Fault.LOST_ACK,
    ]


def test_delay_spans_the_configured_range() -> None:
    plan = FaultPlan(delay_min_seconds=0.5, delay_max_seconds=1.5)
    assert plan.delay(0.0) == 0.5
    assert plan.delay(0.5) == 1.0
    assert plan.delay(0.999999) < 1.5


def test_matching_is_by_method_then_tool() -> None:
    plan = FaultPlan(methods={"tools/call", "tools/list"}, tools={"charge"})
    assert plan.matches("tools/call", "charge")
    assert not plan.matches("tools/call", "refund")
    assert plan.matches("tools/list", None)  # the tool filter only narrows tools/call
    assert not plan.matches("resources/read", None)
    assert FaultPlan().matches("tools/call", "anything")
    assert not FaultPlan().matches("tools/list", None)


BAD_PLANS: list[tuple[dict[str, Any], type[Exception], str]] = [
    ({"lost_ack": -0.1}, ValueError, "lost_ack must be in [0, 1]"),
    ({"duplicate": 1.5}, ValueError, "duplicate must be in [0, 1]"),
    ({"drop_request": math.nan}, ValueError, "drop_request must be in [0, 1]"),
    ({"lost_ack": True}, TypeError, "lost_ack must be a number"),
    ({"lost_ack": "0.2"}, TypeError, "lost_ack must be a number"),
    ({"lost_ack": 0.6, "drop_request": 0.6}, ValueError, "sum to at most 1"),
    ({"schedule": [1, 2]}, TypeError, "schedule must be a mapping"),
    ({"schedule": {0: Fault.LOST_ACK}}, ValueError, "1-based"),
    ({"schedule": {-3: Fault.LOST_ACK}}, ValueError, "1-based"),
    ({"schedule": {True: Fault.LOST_ACK}}, TypeError, "request ordinals"),
    ({"schedule": {"abc": Fault.LOST_ACK}}, TypeError, "request ordinals"),
    ({"schedule": {1.0: Fault.LOST_ACK}}, TypeError, "request ordinals"),
    ({"schedule": {1: "explode"}}, ValueError, "schedule[1] must be a Fault"),
    ({"schedule": {1: 3}}, ValueError, "schedule[1] must be a Fault"),
    ({"schedule": {1: Fault.LOST_ACK, "1": Fault.DUPLICATE}}, ValueError, "names request 1 twice"),
    ({"methods": "tools/call"}, TypeError, "not a single string"),
    ({"methods": []}, ValueError, "methods must not be empty"),
    ({"methods": None}, TypeError, "methods must be a collection"),
    ({"methods": ["tools/call", ""]}, TypeError, "non-empty strings"),
    ({"methods": [1]}, TypeError, "non-empty strings"),
    ({"tools": "charge"}, TypeError, "not a single string"),
    ({"tools": []}, ValueError, "use None to match every tool"),
    ({"delay_min_seconds": -1}, ValueError, "delay_min_seconds must be a finite number >= 0"),
    ({"delay_max_seconds": math.inf}, ValueError, "delay_max_seconds must be a finite number"),
    ({"delay_max_seconds": "1"}, TypeError, "delay_max_seconds must be a number of seconds"),
    ({"delay_min_seconds": 2, "delay_max_seconds": 1}, ValueError, "exceeds delay_max_seconds"),
]


@pytest.mark.parametrize(("kwargs", "error", "fragment"), BAD_PLANS)
def test_bad_plans_are_refused_with_a_clear_error(
    kwargs: dict[str, Any], error: type[Exception], fragment: str
) -> None:
    with pytest.raises(error) as caught:
        FaultPlan(**kwargs)
    assert fragment in str(caught.value)
    # The same input through the JSON door fails the same way.
    with pytest.raises(error):
        FaultPlan.from_dict(kwargs)


def test_from_dict_refuses_unknown_keys_and_non_mappings() -> None:
    with pytest.raises(ValueError, match="unknown keys: lostack, seed"):
        FaultPlan.from_dict({"lostack": 0.1, "seed": 3})
    with pytest.raises(TypeError, match="expects a mapping"):
        FaultPlan.from_dict([("lost_ack", 0.1)])  # type: ignore[arg-type]


def test_chaos_and_helpers_refuse_bad_arguments() -> None:
    with pytest.raises(TypeError, match="must be a FaultPlan"):
        Chaos({"lost_ack": 0.1})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="seed must be an int"):
        Chaos(seed="7")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="seed must be an int"):
        Chaos(seed=True)
    with pytest.raises(TypeError, match="takes an MCP client transport"):
        Chaos().wrap(42)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="takes a Server or MCPServer"):
        in_memory_transport("http://example.invalid/mcp")  # type: ignore[arg-type]
    chaos = Chaos()
    assert chaos.connections == 0  # a refused wrap does not use up a connection number


def test_a_random_seed_is_drawn_and_reported() -> None:
    first, second = Chaos(), Chaos()
    assert isinstance(first.seed, int) and first.seed != second.seed
    assert Chaos(seed=7).report()["seed"] == 7
