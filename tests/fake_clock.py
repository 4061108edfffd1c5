"""The clock tests hand to a key store (`clock=`), so that time moves when the test says so."""

from __future__ import annotations

#: An arbitrary fixed instant (June 2025): far from zero, so no deadline arithmetic goes negative.
EPOCH = 1_750_000_000.0


class FakeClock:
    """Seconds since the epoch, moved only by `advance` (or by assigning `now`)."""

    def __init__(self, now: float = EPOCH) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
