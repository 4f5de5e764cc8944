"""The five sampling modes, in one registry: a mode's name, its module, one constructor for all.

    sc         sc.py         one slot, reset on its own (the reference)
    autoreset  autoreset.py  every slot resets on its own when its episode ends
    sgr        sgr.py        the first episode that ends resets every slot
    ver        ver.py        every slot runs on its own, inference batched over those waiting
    fast       fast.py       DPSA: ended slots are padded; all reset when alpha of them ended

sc, autoreset, sgr and fast are one lock-step loop (lockstep.py) with the mode's rule; ver has a
loop of its own. Each mode module offers `sampler(...)`, the signature of `make_sampler` after
the mode; the registry maps the name to it, and every list of modes (configs, flags, benchmarks)
is MODE_NAMES.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

from broker.samplers import autoreset, fast, sc, sgr, ver
from broker.samplers.base import Sampler, SamplingError

if TYPE_CHECKING:
    import numpy as np

    from broker.dealer import ClipDealer
    from broker.policy_runner import PolicyRunner
    from broker.pool import SimulatorPool

__all__ = ["MODE_NAMES", "SAMPLERS", "ModeName", "Sampler", "SamplingError", "make_sampler"]

# In the order modes are listed in messages, flags and benchmark tables.
SAMPLERS: dict[str, Callable[..., Sampler]] = {
    "sc": sc.sampler,
    "autoreset": autoreset.sampler,
    "sgr": sgr.sampler,
    "ver": ver.sampler,
    "fast": fast.sampler,
}
MODE_NAMES: tuple[str, ...] = tuple(SAMPLERS)
# The same names as a type for config models: pydantic refuses any other value and lists these.
ModeName = Literal.__getitem__(MODE_NAMES)


def make_sampler(
    mode: str,
    pool: SimulatorPool,
    runner: PolicyRunner,
    dealer: ClipDealer,
    *,
    samples_per_iteration: int,
    alpha: float = 1.0,  # DPSA only; 1.0 and a long t_max: a round waits for every episode
    t_max: int = 1000,
    stall_timeout_s: float = 60.0,
    slots: np.ndarray | None = None,
) -> Sampler:
    """A fresh sampler of `mode` over `slots` (global ids; all the pool's by default), with its own state."""
    if mode not in SAMPLERS:
        raise ValueError(f"mode {mode!r} is unknown; use one of {', '.join(MODE_NAMES)}")
    return SAMPLERS[mode](
        pool,
        runner,
        dealer,
        samples_per_iteration=samples_per_iteration,
        alpha=alpha,
        t_max=t_max,
        stall_timeout_s=stall_timeout_s,
        slots=slots,
    )
