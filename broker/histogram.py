"""Cumulative histograms of a value since the run started, Prometheus-style (fast.v1.Histogram).

Bucket i counts the observations <= upper_bounds[i]; a last bucket to +inf counts them all.
Counts are kept per bucket and summed on reading, so an observation costs one search.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

# Episode lengths in steps, and undiscounted episode returns (GetRunStatus).
EPISODE_LENGTH_BOUNDS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000)
EPISODE_RETURN_BOUNDS = (-100, -50, -20, -10, -5, 0, 5, 10, 20, 50, 100, 150, 200, 300, 500)


class CumulativeHistogram:
    def __init__(self, upper_bounds: Sequence[float]) -> None:
        bounds = np.asarray(upper_bounds, dtype=float)
        if bounds.ndim != 1 or bounds.size == 0 or not np.all(np.diff(bounds) > 0):
            raise ValueError(f"upper_bounds must be a non-empty increasing sequence; got {list(upper_bounds)}")
        self.upper_bounds: tuple[float, ...] = tuple(float(b) for b in bounds)
        self._bounds = bounds
        self._counts = np.zeros(bounds.size + 1, dtype=np.int64)  # per bucket, the last one to +inf
        self.sum = 0.0

    def observe(self, values: Iterable[float]) -> None:
        """Count `values`; NaN is not a value and is skipped."""
        array = np.asarray([v for v in values if not math.isnan(v)], dtype=float)
        if array.size == 0:
            return
        # side="left": the first bound >= v, so v == bound falls in that bound's bucket (<=).
        buckets = np.searchsorted(self._bounds, array, side="left")
        self._counts += np.bincount(buckets, minlength=self._counts.size)
        self.sum += float(array.sum())

    @property
    def count(self) -> int:
        return int(self._counts.sum())

    @property
    def cumulative_counts(self) -> list[int]:
        """len(upper_bounds) + 1 counts: observations <= each bound, then the total."""
        return [int(c) for c in np.cumsum(self._counts)]
