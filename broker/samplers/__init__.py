"""The five sampling modes, in one registry: a mode's name, its module, one constructor for all.

    sc         sc.py         one slot, reset on its own (the reference)
    autoreset  autoreset.py  every slot resets on its own when its episode ends
    sgr        sgr.py        the first episode that ends resets every slot
    ver        ver.py        every slot runs on its own, inference batched over those waiting
    fast       fast.py       DPSA: ended slots are padded; when alpha of them ended, they are reset
                             together and the live episodes carry on (or, `reset`, are cut too)

sc, autoreset, sgr and fast are one lock-step loop (lockstep.py) with the mode's rule; ver has a
loop of its own. Each lock-step mode module holds only its rule (a `LockstepRule`); `make_sampler`
is the one constructor, and every list of modes (configs, flags, benchmarks) is MODE_NAMES.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from broker.samplers.autoreset import Autoreset
from broker.samplers.base import Sampler, SamplingError
from broker.samplers.fast import Dpsa
from broker.samplers.lockstep import LockstepRule, LockstepSampler
from broker.samplers.sc import SingleClip
from broker.samplers.sgr import SynchronousGlobalReset
from broker.samplers.ver import VerSampler

if TYPE_CHECKING:
    import numpy as np

    from broker.dealer import ClipDealer
    from broker.policy_runner import PolicyRunner
    from broker.slots import SlotPool

__all__ = ["MODE_NAMES", "ModeName", "Sampler", "SamplingError", "make_sampler", "mode_calls"]

# The lock-step modes by name; ver runs a loop of its own.
LOCKSTEP_RULES: dict[str, type[LockstepRule]] = {
    rule.name: rule for rule in (SingleClip, Autoreset, SynchronousGlobalReset, Dpsa)
}
# Every list of modes (configs, flags, benchmark tables) is this one, in this order.
MODE_NAMES: tuple[str, ...] = ("sc", "autoreset", "sgr", "ver", "fast")
# The same names as a type for config models: pydantic refuses any other value and lists these.
ModeName = Literal.__getitem__(MODE_NAMES)


def mode_calls(mode: str) -> tuple[bool, bool]:
    """(stream, batched): whether the mode asks the pool for StepStream steps (the lock-step modes;
    ver steps its slots on their own, unary) and for batched resets (the modes with rounds).

    What the pool then does with each server also depends on its Capabilities (broker/pool.py).
    """
    rule = LOCKSTEP_RULES.get(mode)
    return rule is not None, rule is not None and rule.rounds


def make_sampler(
    mode: str,
    pool: SlotPool,
    runner: PolicyRunner,
    dealer: ClipDealer,
    *,
    samples_per_iteration: int,
    alpha: float = 1.0,  # DPSA only; 1.0 and a long t_max: a round waits for every episode
    t_max: int = 1000,
    truncation: str = "carry",  # DPSA only: live episodes at a round's end carry on, or are reset (fast.py)
    stall_timeout_s: float = 60.0,
    slots: np.ndarray | None = None,
    prefetch: bool = False,
    ver_step_batching: bool = True,  # ver: step the ready slots of a server in one call (False: one per slot)
    pipeline: bool = False,  # sgr, fast: a server that answered steps its next row speculatively (rounds.py)
) -> Sampler:
    """A fresh sampler of `mode` over `slots` (global ids; all the pool's by default), with its own state."""
    if mode not in MODE_NAMES:
        raise ValueError(f"mode {mode!r} is unknown; use one of {', '.join(MODE_NAMES)}")
    common = dict(
        samples_per_iteration=samples_per_iteration, stall_timeout_s=stall_timeout_s, slots=slots, prefetch=prefetch
    )
    if mode == "ver":
        return VerSampler(pool, runner, dealer, step_batching=ver_step_batching, **common)
    rule = LOCKSTEP_RULES[mode].configured(alpha=alpha, t_max=t_max, truncation=truncation)
    return LockstepSampler(pool, runner, dealer, rule, pipeline=pipeline, **common)
