"""Small statistics helpers shared by the scenarios."""

from __future__ import annotations

import os
from collections.abc import Sequence


def percentile(values: Sequence[float], p: float) -> float:
    """The p-th percentile (0-100) by linear interpolation; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * p / 100.0
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def ms(seconds: float) -> float:
    """Seconds to milliseconds, rounded to microseconds for the CSV."""
    return round(seconds * 1000.0, 3)


def loadavg() -> float:
    """The machine's 1-minute load average: how busy other work kept it when a run started."""
    return round(os.getloadavg()[0], 2)
