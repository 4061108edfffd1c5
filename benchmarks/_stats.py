"""Summaries for noisy machines: medians with their spread, never a lone mean."""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of an unsorted sample."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(q / 100 * len(ordered))))
    return ordered[rank - 1]


def spread(values: Sequence[float], digits: int = 3) -> dict[str, float | int]:
    """Median, min and max of the rounds (each round one measurement)."""
    if not values:
        raise ValueError("no values")
    return {
        "median": round(statistics.median(values), digits),
        "min": round(min(values), digits),
        "max": round(max(values), digits),
        "rounds": len(values),
    }


def pooled(rounds: Sequence[Sequence[float]]) -> list[float]:
    """Every round's values in one list (what a median over the whole run reads)."""
    return [x for values in rounds for x in values]


def ratio_interval(
    ours: Sequence[Sequence[float]],
    theirs: Sequence[Sequence[float]],
    *,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 46,
) -> dict[str, float]:
    """The ratio of `ours`' median to `theirs'` (each a list of rounds, each round its values,
    the two measured side by side in the same rounds), with a percentile bootstrap interval at
    `confidence`: each resample redraws every round's values from that round alone, so the
    interval carries the noise within rounds and does not mix one round's load into another's.

    Why: two medians 1 % apart say nothing on their own where single windows spread ±20 %; the
    interval says whether this run tells them apart (a fixed seed: the same figures give the same
    interval)."""
    if len(ours) != len(theirs) or not ours or not all(ours) or not all(theirs):
        raise ValueError("both sides need values in the same rounds")
    rng = random.Random(seed)

    def redrawn(rounds: Sequence[Sequence[float]]) -> float:
        return statistics.median(pooled([rng.choices(values, k=len(values)) for values in rounds]))

    ratios = sorted(redrawn(ours) / redrawn(theirs) for _ in range(resamples))
    tail = (1 - confidence) / 2
    ratio = statistics.median(pooled(ours)) / statistics.median(pooled(theirs))
    return {
        "ratio": round(ratio, 4),
        "low": round(ratios[int(tail * resamples)], 4),
        "high": round(ratios[min(resamples - 1, int((1 - tail) * resamples))], 4),
    }


def interval_text(interval: dict[str, float]) -> str:
    """A `ratio_interval` as printed beside a verdict."""
    return f"{interval['ratio']} [{interval['low']}, {interval['high']}]"
