"""`sc`, single clip: one slot plays episode after episode, reset on its own whenever one ends.

The reference every other mode is measured against: whatever slots it is offered, it drives
the first only (lock-step loop: lockstep.py).
"""

from __future__ import annotations

import numpy as np

from broker.samplers.lockstep import LockstepRule


class SingleClip(LockstepRule):
    name = "sc"
    rounds = False

    def drives(self, slots: np.ndarray) -> np.ndarray:
        return slots[:1]
