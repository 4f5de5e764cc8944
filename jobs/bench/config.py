"""The benchmarks' settings: `fast bench sampling` (SamplingBenchConfig) and `fast bench train`
(TrainBenchConfig), each default declared once, here; the `fast bench` options take theirs from them.

Kept apart from the benchmarks (jobs/bench/harness.py, jobs/bench/train.py), which load torch, so
that building the `fast` command line does not load it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from broker.dealer import HOLDOUT_EVERY
from broker.samplers import MODE_NAMES
from jobs.external import env_is_an_address, inapplicable, parse_simulators

MODES = MODE_NAMES  # the broker's sampling modes (broker/samplers/), all benchmarked by default
# `fast bench train` also runs `--mode auto` (broker/advisor/auto_mode.py): a run that chooses among the
# modes as it goes, against the fixed modes it chooses from.
TRAIN_MODES = (*MODE_NAMES, "auto")
# The "preset" of measurements on external simulators: their own costs, nothing emulated.
EXTERNAL = "external"


@dataclass(frozen=True)
class SamplingBenchConfig:
    modes: tuple[str, ...] = MODES
    clips: tuple[int, ...] = (5, 10, 20, 30)
    presets: tuple[str, ...] = ("calibrated", "parallel", "vectorized")
    servers: int = 2
    repeats: int = 3
    samples: int = 2048  # valid transitions per measured iteration
    warmup_samples: int = 256
    # ... and at least this many steps per slot, so that the measured iteration starts in steady state:
    # every slot past its first episodes, their phases spread as they are later in a run (a window
    # right after a common start times the start's synchronised resets; DPSA's carry is the mode that
    # would be measured least fairly there, as its rounds then stay in step for a while).
    warmup_steps: int = 200
    alpha: float = 0.5
    t_max: int = 200
    # fast's truncation: carry live episodes past a round's end and/or reset them (rows fast+carry, fast+reset).
    truncations: tuple[str, ...] = ("carry", "reset")
    seed: int = 0
    checkpoint_dir: Path | None = None  # a fast train run's checkpoints/: adds the "trained" policy
    gym_reference: bool = True  # takeover only: the reference wraps the takeover workload
    holdout_every: int = HOLDOUT_EVERY
    env: str = "takeover"  # or gym:<id>, e.g. gym:highway_env:highway-fast-v0 (real costs, cost preset "off")
    # Steady-state episode lengths (jobs/bench/episode_length.py): valid transitions in the window
    # after a warm-up of length_warmup_steps per slot; 0 skips the measurement.
    length_samples: int = 6000
    length_warmup_steps: int = 600
    # Simulator servers that run already (jobs/external.py), measured instead of servers of its own;
    # presets are then (EXTERNAL,) and servers, env and the Gymnasium reference do not apply.
    simulators: tuple[str, ...] = ()
    # Clip dealing without and/or with map locality (broker/dealer.py); a row with it is MODE+locality.
    locality: tuple[bool, ...] = (False, True)
    locality_max_repeat: int = 8
    # Without and/or with prefetch (fast.v1 Prepare, broker/samplers/); a row with it is MODE+prefetch.
    prefetch: tuple[bool, ...] = (False, True)
    # The cost model's prefetch_step_penalty: servers of their own per value (0: the preset's own).
    prefetch_step_penalties: tuple[float, ...] = (0.0, 0.25)
    # Also VER as it was before StepBatcher (one Step call per slot-step): rows "ver+perslot".
    ver_per_slot: bool = False

    def __post_init__(self) -> None:
        unknown = [m for m in self.modes if m not in MODES]
        if unknown:
            raise ValueError(f"modes {unknown} are unknown; use some of {', '.join(MODES)}")
        if not self.clips or min(self.clips) < 1:
            raise ValueError(f"clips {list(self.clips)}: give clip counts >= 1, e.g. 5,10,20,30")
        if self.servers < 1 or self.repeats < 1 or self.samples < 1:
            raise ValueError(
                f"servers={self.servers}, repeats={self.repeats}, samples={self.samples}: each must be >= 1"
            )
        if not self.prefetch:
            raise ValueError("prefetch is empty: give off, on or off,on")
        if not self.truncations or not set(self.truncations) <= {"carry", "reset"}:
            raise ValueError(f"truncations={list(self.truncations)}: give carry, reset or carry,reset")
        if not self.prefetch_step_penalties or not all(0 <= p <= 10 for p in self.prefetch_step_penalties):
            raise ValueError(
                f"prefetch_step_penalties={list(self.prefetch_step_penalties)}: give fractions 0 to 10, e.g. 0,0.25"
            )
        if self.simulators and self.prefetch_step_penalties != (0.0,):
            raise ValueError(inapplicable(["--prefetch-step-penalty"]))
        if not self.locality or self.locality_max_repeat < 1:
            raise ValueError(
                f"locality={self.locality}, locality_max_repeat={self.locality_max_repeat}: give off, on or off,on "
                "and a max repeat >= 1"
            )
        if self.warmup_steps < 0:
            raise ValueError(f"warmup_steps={self.warmup_steps}: give steps per slot >= 0")
        if self.length_samples < 0 or self.length_warmup_steps < 0:
            raise ValueError(
                f"length_samples={self.length_samples}, length_warmup_steps={self.length_warmup_steps}: "
                "each must be >= 0 (length_samples 0 skips the episode-length measurement)"
            )
        object.__setattr__(self, "simulators", parse_simulators(self.simulators))
        if self.simulators:
            if self.presets != (EXTERNAL,) or self.gym_reference:
                raise ValueError(inapplicable(["--preset" if self.presets != (EXTERNAL,) else "--gym-reference"]))
            return
        from sim_server.cost_model import PRESETS

        bad = [p for p in self.presets if p not in PRESETS]
        if bad:
            raise ValueError(f"presets {bad} are unknown; use some of {', '.join(PRESETS)}")
        from sim_server.environments import check_env_spec

        problem = env_is_an_address(self.env)
        if problem:
            raise ValueError(problem)
        check_env_spec(self.env)
        if self.env != "takeover" and self.gym_reference:
            raise ValueError(
                f"env={self.env}: the Gymnasium reference wraps the takeover workload; pass --no-gym-reference"
            )


# What a mode's label may add to it (`fast+locality`, `fast+reset`): the `fast train` setting each gives.
FEATURES = {
    "locality": ("locality", True),
    "prefetch": ("prefetch", True),
    # fast only: what a round's end does with live episodes (broker/samplers/fast.py; carry by default).
    "carry": ("truncation", "carry"),
    "reset": ("truncation", "reset"),
}
# The simulators of every run when no `simulators` are given (None in the config means these).
DEFAULTS = {"clips": 10, "servers": 2, "preset": "calibrated"}


@dataclass(frozen=True)
class TrainBenchConfig:
    modes: tuple[str, ...] = ("sc", "sgr", "ver", "fast")
    clips: int | None = None  # 10; with `simulators`, their slots instead (None)
    seeds: int = 3
    servers: int | None = None  # 2
    preset: str | None = None  # "calibrated"
    iterations: int = 150
    samples_per_iteration: int = 2048
    update_epochs: int = 10
    checkpoint_every: int = 10
    # Held-out return. The initial policy (mean action about 0: coasting straight) scores about 70
    # on the default episodes and random actions about 10; early updates first drop it to about 20.
    target_return: float = 80.0
    smooth: int = 5  # iterations, for the training-return curve only
    eval_episodes_per_clip: int = 2
    eval_seed: int = 1234  # the held-out episodes' seeds, one set for every run
    # Simulator servers that run already, trained and evaluated on (clips, servers, preset do not apply).
    simulators: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "simulators", parse_simulators(self.simulators))
        if self.simulators:
            given = [f"--{name}" for name in DEFAULTS if getattr(self, name) is not None]
            if given:
                raise ValueError(inapplicable(given))
        else:
            for name, default in DEFAULTS.items():
                if getattr(self, name) is None:
                    object.__setattr__(self, name, default)
        unknown = [
            m
            for m in self.modes
            if m.split("+")[0] not in TRAIN_MODES
            or not set(m.split("+")[1:]) <= set(FEATURES)
            or (m.split("+")[0] != "fast" and {"carry", "reset"} & set(m.split("+")[1:]))
        ]
        if unknown:
            raise ValueError(
                f"modes {unknown} are unknown; use some of {', '.join(TRAIN_MODES)}, each optionally with "
                f"{', '.join('+' + f for f in FEATURES)} (e.g. fast+prefetch+locality; +carry and +reset: fast only)"
            )
        counts = {
            "clips": self.clips,
            "seeds": self.seeds,
            "servers": self.servers,
            "iterations": self.iterations,
            "checkpoint_every": self.checkpoint_every,
            "eval_episodes_per_clip": self.eval_episodes_per_clip,
        }
        low = [f"{name}={value}" for name, value in counts.items() if value is not None and value < 1]
        if low:
            raise ValueError(f"{', '.join(low)}: each must be >= 1")
