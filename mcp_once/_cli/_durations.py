"""Durations as an operator types and reads them: `10m`, `2h`, `3d`, or plain seconds.

One job: `--older-than` takes a duration, and `keys list` shows each record's age in the same
units, so that what the table says can be typed back as a filter.
"""

from __future__ import annotations

import argparse
import math
import re

#: Seconds per unit. Lower case only: `10M` could mean months, so it is refused, not guessed.
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)([smhd]?)")


def duration(text: str) -> float:
    """`text` in seconds, for argparse's `type=`: a bad value is argparse's own clear error
    ("argument --older-than: ..."), exit 2, before any store is opened."""
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a duration: write seconds (90) or a number with a unit,"
            " s, m, h or d (10m, 2h, 3d)"
        )
    seconds = float(match[1]) * UNITS.get(match[2], 1)
    if not math.isfinite(seconds):
        raise argparse.ArgumentTypeError(f"{text!r} is too long a duration")
    return seconds


def age(seconds: float) -> str:
    """A compact age in the two largest units, no spaces (one table cell): `42s`, `12m05s`,
    `3h07m`, `4d03h`. A negative age (the store's clock a little ahead of ours) shows as `0s`."""
    whole = max(0, int(seconds))
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours:02d}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"
