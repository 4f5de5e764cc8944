"""`fast`: DPSA, dynamic parallel sampling alignment: when does a round end? (docs/metrics.md)

N slots step in lock-step (lockstep.py). A slot whose episode ended is not reset; it is padded
with masked virtual steps. After every step the global termination rate

    tau_t = (1/N) * sum_i done_i(t)

is computed (done_i: slot i's episode ended in this round, or its simulator failed). A global
truncation ends the round when tau_t >= alpha or the round has run t_max steps; live slots are
then truncated (bootstrapped) and all slots reset in one batched Reset per server.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from broker.samplers.lockstep import LockstepRule


def termination_rate(done: np.ndarray) -> float:
    """tau_t: the fraction of the round's slots that are done (bool [N])."""
    return float(np.count_nonzero(done)) / done.size


def round_ends(done: np.ndarray, steps_in_round: int, alpha: float, t_max: int) -> bool:
    """True when the round must end after `steps_in_round` lock-step steps (DPSA's trigger)."""
    return termination_rate(done) >= alpha or steps_in_round >= t_max


@dataclass(frozen=True)
class Dpsa(LockstepRule):
    name = "fast"
    rounds = True

    alpha: float  # truncate when the termination rate reaches alpha ...
    t_max: int  # ... or when the round reaches t_max steps

    @classmethod
    def configured(cls, *, alpha: float, t_max: int) -> Dpsa:
        return cls(alpha, t_max)

    def round_over(self, *, ended: np.ndarray, live: np.ndarray, done: np.ndarray, steps: int) -> bool:
        # A round without members (every reset failed) is over at once.
        return round_ends(done, steps, self.alpha, self.t_max) if done.size else True
