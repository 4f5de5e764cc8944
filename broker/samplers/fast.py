"""`fast`: DPSA, dynamic parallel sampling alignment: when does a round end? (docs/metrics.md)

N slots step in lock-step (lockstep.py). A slot whose episode ended is not reset; it is padded
with masked virtual steps. After every step the global termination rate

    tau_t = (1/N) * sum_i done_i(t)

is computed (done_i: slot i's episode ended in this round, or its simulator failed). A global
truncation ends the round when tau_t >= alpha or the round has run t_max steps. What then
happens to the episodes still running is the `truncation` setting:

    carry   they are truncated in the batch (bootstrapped from V of their next observation) and
            go on into the next round on the same simulator state; only the done slots are reset,
            in one batched Reset per server. An episode ends only where its clip ends it, so the
            episode lengths are those of SC (the article: "the long-horizon trajectories of
            surviving environments are kept whole").
    reset   they are truncated (bootstrapped) and every slot is reset: the literal reading, kept
            to compare against; it cuts every live episode at every round's end.

The truncation exists to close the round's tensors for GAE, not to end episodes: `carry` is the
default (docs/metrics.md, "carry against reset", has the figures).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from broker.samplers.lockstep import LockstepRule

# What a global truncation does with the episodes still running (module docstring).
Truncation = Literal["carry", "reset"]
TRUNCATIONS: tuple[str, ...] = ("carry", "reset")


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
    truncation: Truncation = "carry"  # ... and then carry the live episodes on, or reset them

    @classmethod
    def configured(cls, *, alpha: float, t_max: int, truncation: str = "carry") -> Dpsa:
        if truncation not in TRUNCATIONS:
            raise ValueError(f"truncation {truncation!r} is unknown; use one of {', '.join(TRUNCATIONS)}")
        return cls(alpha, t_max, truncation)

    @property
    def carries(self) -> bool:
        return self.truncation == "carry"

    def round_over(self, *, ended: np.ndarray, live: np.ndarray, done: np.ndarray, steps: int) -> bool:
        # A round without members (every reset failed) is over at once.
        return round_ends(done, steps, self.alpha, self.t_max) if done.size else True
