"""RetryPolicy: validated configuration, full-jitter backoff within bounds, testing mode."""

from __future__ import annotations

import anyio
import pytest

import orchestrator
from orchestrator import RetryBudget, RetryPolicy
from orchestrator._testing import is_testing, pause


def test_defaults_are_the_documented_ones() -> None:
    policy = RetryPolicy()
    assert (policy.max_attempts, policy.deadline, policy.attempt_timeout) == (3, 60.0, None)
    assert (policy.wait_initial, policy.wait_max, policy.max_retry_after) == (0.1, 5.0, 30.0)
    assert policy.budget == "per-session" and policy.trust_annotations is True
    assert dict(policy.overrides) == {}


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"max_attempts": 0}, ValueError),
        ({"max_attempts": 11}, ValueError),
        ({"max_attempts": 2.5}, TypeError),
        ({"max_attempts": True}, TypeError),
        ({"deadline": 0}, ValueError),
        ({"deadline": float("inf")}, ValueError),
        ({"deadline": "60"}, TypeError),
        ({"attempt_timeout": -1}, ValueError),
        ({"wait_initial": -0.1}, ValueError),
        ({"wait_initial": 2, "wait_max": 1}, ValueError),
        ({"wait_exp_base": 0.5}, ValueError),
        ({"max_retry_after": -1}, ValueError),
        ({"connect_timeout": 0}, ValueError),
        ({"budget": 10}, TypeError),
        ({"budget": "shared"}, TypeError),
        ({"overrides": {"tool": "sometimes"}}, ValueError),
        ({"overrides": {"": "never"}}, ValueError),
        ({"overrides": ["tool"]}, TypeError),
        ({"trust_annotations": "no"}, TypeError),
    ],
)
def test_bad_policy_is_refused(kwargs: dict[str, object], error: type[Exception]) -> None:
    with pytest.raises(error):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


def test_policy_is_frozen_and_overrides_are_a_private_copy() -> None:
    mine = {"tool": "idempotent"}
    policy = RetryPolicy(overrides=mine)  # type: ignore[arg-type]
    mine["tool"] = "never"
    assert policy.overrides["tool"] == "idempotent"
    with pytest.raises(AttributeError):
        policy.max_attempts = 5  # type: ignore[misc]
    with pytest.raises(TypeError):
        policy.overrides["other"] = "never"  # type: ignore[index]


def test_backoff_is_full_jitter_within_the_window() -> None:
    policy = RetryPolicy(wait_initial=0.1, wait_max=1.0)
    for retry in range(1, 8):
        window = min(1.0, 0.1 * 2 ** (retry - 1))
        samples = [policy.backoff(retry) for _ in range(200)]
        assert all(0 <= s <= window for s in samples)
        assert max(samples) > window / 2  # really spread over the window
    assert RetryPolicy(wait_initial=0, wait_max=0).backoff(3) == 0


def test_hints_are_clamped() -> None:
    policy = RetryPolicy(max_retry_after=2)
    assert policy.clamp_hint(-5) == 0 and policy.clamp_hint(1.5) == 1.5
    assert policy.clamp_hint(3600) == 2


def test_shared_budget_instance_is_kept() -> None:
    budget = RetryBudget()
    assert RetryPolicy(budget=budget).budget is budget


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_testing_mode_skips_sleeps_and_nests(real_waits: None) -> None:
    assert not is_testing()
    with orchestrator.testing():
        with orchestrator.testing():
            assert is_testing()
        assert is_testing()
        start = anyio.current_time()
        await pause(30)
        assert anyio.current_time() - start < 1
    assert not is_testing()
    with anyio.move_on_after(0.05) as scope:
        await pause(30)  # a real, cancellable wait outside testing mode
    assert scope.cancelled_caught
