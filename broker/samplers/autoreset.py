"""`autoreset`: every slot resets on its own the moment its episode ends, as each env of a
Gymnasium vector env does; no slot ever waits for another's reset (lock-step loop: lockstep.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from broker.samplers.lockstep import LockstepRule, LockstepSampler

if TYPE_CHECKING:
    from broker.dealer import ClipDealer
    from broker.policy_runner import PolicyRunner
    from broker.pool import SimulatorPool


class Autoreset(LockstepRule):
    name = "autoreset"
    rounds = False


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
        Autoreset(),
        samples_per_iteration=samples_per_iteration,
        stall_timeout_s=stall_timeout_s,
        slots=slots,
    )
