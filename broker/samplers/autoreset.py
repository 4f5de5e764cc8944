"""`autoreset`: every slot resets on its own the moment its episode ends, as each env of a
Gymnasium vector env does; no slot ever waits for another's reset (lock-step loop: lockstep.py).
"""

from __future__ import annotations

from broker.samplers.lockstep import LockstepRule


class Autoreset(LockstepRule):
    name = "autoreset"
    rounds = False
