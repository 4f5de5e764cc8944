"""What every sampler is, whatever its mode: `sample()` gives one iteration's batch and its stats."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import numpy as np

    from broker.metrics import IterationStats


class SamplingError(RuntimeError):
    """Sampling cannot go on (e.g. no simulator answered within the stall timeout)."""


class Sampler(Protocol):
    # Valid transitions an iteration collects (at least); callers may change it between iterations.
    samples_per_iteration: int

    async def sample(self) -> tuple[dict[str, np.ndarray], IterationStats]:
        """One iteration: the batch (arrays [T, N, ...] with valid_mask) and what it cost."""
        ...
