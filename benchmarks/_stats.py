"""Summaries for noisy machines: medians with their spread, never a lone mean."""

from __future__ import annotations

import math
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
