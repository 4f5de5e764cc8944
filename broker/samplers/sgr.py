"""`sgr`, synchronous global reset: the first episode that ends ends the round for all.

Every live slot is then truncated (bootstrapped) and all slots reset together, one batched
Reset per server (lock-step loop: lockstep.py). With many clips the shortest episode ends
early, so rounds are short and long episodes are cut.
"""

from __future__ import annotations

import numpy as np

from broker.samplers.lockstep import LockstepRule


class SynchronousGlobalReset(LockstepRule):
    name = "sgr"
    rounds = True

    def round_over(self, *, ended: np.ndarray, live: np.ndarray, done: np.ndarray, steps: int) -> bool:
        # No live slot left also ends it: every member's simulator failed.
        return ended.size > 0 or not live.any()
