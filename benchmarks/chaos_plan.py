"""The chaos benchmark's settings and its seeded fault schedule (benchmarks/chaos.py says what each fault does)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ChaosConfig:
    iterations: int = 80
    samples: int = 512  # valid transitions per iteration (at least)
    servers: int = 3
    slots: int = 4  # per server
    preset: str = "step-only"  # simulator cost model: step latency only, resets free
    seed: int = 0
    update_epochs: int = 2
    num_minibatches: int = 4
    checkpoint_every: int = 1
    # Faults of the chaos run.
    kills: int = 12
    stops: int = 4
    # A stop lasts this many times the longest deadline of a call to the simulator (Step, Reset), drawn:
    # whatever call is in flight when it freezes times out.
    stop_factor: tuple[float, float] = (1.2, 2.0)
    garbage_s: float = 6.0  # the garbage window; 0: none
    garbage_rate: float = 0.5  # share of the window's Step answers corrupted
    learner_kills: int = 1
    # The learner is killed while it serves a SubmitBatch (a drawn 0-50 ms after the batch reached its
    # proxy): the update in flight is lost and the broker must send the same batch again. False: at
    # its drawn time, wherever the run is.
    learner_kill_in_update: bool = True
    recovery_wait_s: float = 30.0  # a target's next fault waits this long at most for it to recover
    # The broker's deadlines (broker/config.py), short so that waits do not dominate the run.
    step_timeout_s: float = 1.0
    reset_timeout_s: float = 2.0
    describe_timeout_s: float = 1.0
    stall_timeout_s: float = 15.0
    learner_wait_s: float = 60.0
    update_timeout_s: float = 60.0
    max_bad_answers: int = 5
    run_timeout_s: float = 300.0  # a run whose broker has not exited by then is stopped (and reported)
    baseline: bool = True  # the same run without faults first, for the throughput ratio

    def __post_init__(self) -> None:
        low = {k: getattr(self, k) for k in ("iterations", "samples", "servers", "slots") if getattr(self, k) < 1}
        if low:
            raise ValueError(f"{low}: each must be >= 1")
        if self.iterations < 3 and (self.kills or self.stops or self.learner_kills or self.garbage_s):
            raise ValueError("faults need at least 3 iterations to land inside the run")


@dataclass(frozen=True)
class Fault:
    kind: str  # sim-kill, sim-stop, garbage, learner-kill
    target: int  # simulator index; -1 the learner
    at_iteration: int  # fires once the learner accepted this many batches ...
    delay_s: float  # ... and this long after
    duration_s: float = 0.0  # sim-stop: frozen this long; garbage: the window


def make_plan(cfg: ChaosConfig) -> list[Fault]:
    """The seeded fault schedule: trigger iterations spread over the run, targets drawn."""
    rng = np.random.default_rng(cfg.seed + 7919)
    last = max(1, cfg.iterations - 3)  # room for the last faults to recover inside the run
    plan: list[Fault] = []

    def at(low: float = 0.0, high: float = 1.0) -> int:
        return int(rng.integers(max(1, int(low * last)), max(2, int(high * last) + 1)))

    for _ in range(cfg.kills):
        plan.append(Fault("sim-kill", int(rng.integers(cfg.servers)), at(), float(rng.uniform(0, 1.0))))
    for _ in range(cfg.stops):
        lo, hi = cfg.stop_factor
        duration = float(rng.uniform(lo, hi)) * max(cfg.step_timeout_s, cfg.reset_timeout_s)
        plan.append(Fault("sim-stop", int(rng.integers(cfg.servers)), at(), float(rng.uniform(0, 1.0)), duration))
    if cfg.garbage_s > 0:
        plan.append(Fault("garbage", int(rng.integers(cfg.servers)), at(0.2, 0.6), 0.0, cfg.garbage_s))
    for _ in range(cfg.learner_kills):
        # duration_s: the wait after a SubmitBatch reached the learner's proxy (learner_kill_in_update).
        plan.append(Fault("learner-kill", -1, at(0.3, 0.7), float(rng.uniform(0, 1.0)), float(rng.uniform(0, 0.05))))
    return sorted(plan, key=lambda f: (f.at_iteration, f.delay_s))
