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

    def apply_settings(self, *, samples_per_iteration: int, alpha: float, t_max: int) -> None:
        """Between iterations: sample with these settings from the next iteration on, keeping the
        sampler's state (its live episodes); a mode that does not read alpha or t_max ignores them."""
        ...

    async def sample(self) -> tuple[dict[str, np.ndarray], IterationStats]:
        """One iteration: the batch (arrays [T, N, ...] with valid_mask) and what it cost."""
        ...
