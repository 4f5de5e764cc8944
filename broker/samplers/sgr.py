"""`sgr`, synchronous global reset: the first episode that ends ends the round for all.

Every live slot is then truncated (bootstrapped) and all slots reset together, one batched
Reset per server (lock-step loop: lockstep.py). With many clips the shortest episode ends
early, so rounds are short and long episodes are cut.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from broker.samplers.lockstep import LockstepRule, LockstepSampler

if TYPE_CHECKING:
    from broker.dealer import ClipDealer
    from broker.policy_runner import PolicyRunner
    from broker.pool import SimulatorPool


class SynchronousGlobalReset(LockstepRule):
    name = "sgr"
    rounds = True

    def round_over(self, *, ended: np.ndarray, live: np.ndarray, done: np.ndarray, steps: int) -> bool:
        # No live slot left also ends it: every member's simulator failed.
        return ended.size > 0 or not live.any()


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
        SynchronousGlobalReset(),
        samples_per_iteration=samples_per_iteration,
        stall_timeout_s=stall_timeout_s,
        slots=slots,
    )
