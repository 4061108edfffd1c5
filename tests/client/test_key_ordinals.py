"""`orchestrator._key.Ordinals`: the per-execution call count of key sources that cannot open a
`key_step` (`orchestrator.dbos.step_key`)."""

from __future__ import annotations

import gc
from dataclasses import dataclass

from orchestrator._key import Ordinals


@dataclass
class Status:
    """Like DBOS's `StepStatus`: a dataclass with `eq`, so unhashable."""

    attempt: int | None = None


def test_each_owner_counts_from_zero() -> None:
    ordinals = Ordinals()
    first, second = Status(), Status()
    assert [ordinals.take(first), ordinals.take(first), ordinals.take(second)] == [0, 1, 0]
    assert ordinals.take(first) == 2


def test_a_new_epoch_restarts_the_count() -> None:
    ordinals = Ordinals()
    status = Status(0)
    assert [ordinals.take(status, 0), ordinals.take(status, 0)] == [0, 1]
    assert [ordinals.take(status, 1), ordinals.take(status, 1)] == [0, 1]


def test_an_entry_goes_with_its_owner() -> None:
    ordinals = Ordinals()
    status = Status()
    ordinals.take(status)
    assert len(ordinals) == 1
    del status
    gc.collect()
    assert len(ordinals) == 0
    assert ordinals.take(Status()) == 0  # a new owner (even at a reused address) starts at 0
