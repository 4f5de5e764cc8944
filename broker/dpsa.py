"""DPSA, dynamic parallel sampling alignment: when does a round end? (docs/metrics.md, DESIGN.md)

N slots step in lock-step. A slot whose episode ended is not reset; it is padded with masked
virtual steps. After every step the global termination rate

    tau_t = (1/N) * sum_i done_i(t)

is computed (done_i: slot i's episode ended in this round, or its simulator failed). A global
truncation ends the round when tau_t >= alpha or the round has run t_max steps.
"""

from __future__ import annotations

import numpy as np


def termination_rate(done: np.ndarray) -> float:
    """tau_t: the fraction of the round's slots that are done (bool [N])."""
    return float(np.count_nonzero(done)) / done.size


def round_ends(done: np.ndarray, steps_in_round: int, alpha: float, t_max: int) -> bool:
    """True when the round must end after `steps_in_round` lock-step steps (DPSA's trigger)."""
    return termination_rate(done) >= alpha or steps_in_round >= t_max
