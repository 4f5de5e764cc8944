"""`sc`, single clip: one slot plays episode after episode, reset on its own whenever one ends.

The reference every other mode is measured against: whatever slots it is offered, it drives
the first only (lock-step loop: lockstep.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from broker.samplers.lockstep import LockstepRule, LockstepSampler

if TYPE_CHECKING:
    from broker.dealer import ClipDealer
    from broker.policy_runner import PolicyRunner
    from broker.pool import SimulatorPool


class SingleClip(LockstepRule):
    name = "sc"
    rounds = False

    def drives(self, slots: np.ndarray) -> np.ndarray:
        return slots[:1]


def sampler(
    pool: SimulatorPool,
    runner: PolicyRunner,
    dealer: ClipDealer,
    *,
    samples_per_iteration: int,
    alpha: float,
    t_max: int,
    stall_timeout_s: float,
    slots: np.ndarray | None = None,
) -> LockstepSampler:
    """The registry's constructor (broker/samplers/__init__.py); alpha and t_max are DPSA's, unused here."""
    return LockstepSampler(
        pool,
        runner,
        dealer,
        SingleClip(),
        samples_per_iteration=samples_per_iteration,
        stall_timeout_s=stall_timeout_s,
        slots=slots,
    )
