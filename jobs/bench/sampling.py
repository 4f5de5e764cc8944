"""`fast bench sampling`: every sampling mode at every clip count, side by side, on the real
multi-process stack (simulator servers as processes, the broker's samplers in this process).

For each cost preset, `servers` simulator server processes are started with enough slots for
the largest clip count; a configuration with N clips drives N of those slots spread evenly
over the servers. Policies are fixed during the benchmark: a freshly initialised network
("random") and, when a checkpoint is given, a trained one ("trained"); validity depends on
how long the policy survives, so both matter. Each measurement builds a fresh sampler, runs
one short warm-up iteration (initial resets, map cache), then one measured iteration of
`samples` valid transitions. Episode lengths are measured apart, in steady state and without
emulated costs (jobs/bench/episode_length.py): a short timed window right after a common start
only sees the episodes short enough to end inside it. All configurations are measured in one run, interleaved repeat
by repeat in a shuffled order, so that the machine's drift hits them alike; medians over
repeats are reported. `sc` is one slot whatever N and is the reference for speedups.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
import json
import math
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from broker.dealer import ClipDealer
from broker.lockstep import LockstepSampler
from broker.policy_runner import PolicyRunner
from broker.pool import SimulatorPool
from broker.ver import VerSampler

MODES = ("sc", "autoreset", "sgr", "ver", "fast")
GYM_REFERENCE = "gym-async"  # Gymnasium AsyncVectorEnv with per-env autoreset (jobs/bench/gym_reference.py)
# The figures a table row carries, from IterationStats.summary().
METRICS = (
    "sampling_time_s", "raw_throughput", "validity", "time_efficiency", "effective_throughput",
    "episode_length_mean", "global_resets_per_1k_valid", "slot_resets_per_1k_valid",
)


@dataclass(frozen=True)
class SamplingBenchConfig:
    modes: tuple[str, ...] = MODES
    clips: tuple[int, ...] = (5, 10, 20, 30)
    presets: tuple[str, ...] = ("calibrated", "parallel")
    servers: int = 2
    repeats: int = 3
    samples: int = 2048  # valid transitions per measured iteration
    warmup_samples: int = 256
    alpha: float = 0.5
    t_max: int = 200
    seed: int = 0
    checkpoint_dir: Path | None = None  # a fast train run's checkpoints/: adds the "trained" policy
    gym_reference: bool = True  # takeover only: the reference wraps the takeover workload
    holdout_every: int = 10
    env: str = "takeover"  # or gym:<id>, e.g. gym:highway_env:highway-fast-v0 (real costs, cost preset "off")
    # Steady-state episode lengths (jobs/bench/episode_length.py): valid transitions in the window
    # after a warm-up of length_warmup_steps per slot; 0 skips the measurement.
    length_samples: int = 6000
    length_warmup_steps: int = 600

    def __post_init__(self) -> None:
        unknown = [m for m in self.modes if m not in MODES]
        if unknown:
            raise ValueError(f"modes {unknown} are unknown; use some of {', '.join(MODES)}")
        if not self.clips or min(self.clips) < 1:
            raise ValueError(f"clips {list(self.clips)}: give clip counts >= 1, e.g. 5,10,20,30")
        if self.servers < 1 or self.repeats < 1 or self.samples < 1:
            raise ValueError(f"servers={self.servers}, repeats={self.repeats}, samples={self.samples}: each must be >= 1")
        if self.length_samples < 0 or self.length_warmup_steps < 0:
            raise ValueError(f"length_samples={self.length_samples}, length_warmup_steps={self.length_warmup_steps}: "
                             "each must be >= 0 (length_samples 0 skips the episode-length measurement)")
        from sim_server.cost_model import PRESETS

        bad = [p for p in self.presets if p not in PRESETS]
        if bad:
            raise ValueError(f"presets {bad} are unknown; use some of {', '.join(PRESETS)}")
        from sim_server.environments import check_env_spec

        check_env_spec(self.env)
        if self.env != "takeover" and self.gym_reference:
            raise ValueError(f"env={self.env}: the Gymnasium reference wraps the takeover workload; pass --no-gym-reference")


@dataclass
class Measurement:
    preset: str
    policy: str
    mode: str
    clips: int
    repeat: int
    summary: dict = field(default_factory=dict)


def spread_slots(pool: SimulatorPool, count: int) -> np.ndarray:
    """`count` global slot ids dealt round-robin over the servers (so load is even)."""
    per_server = [list(range(s.slot_offset, s.slot_offset + s.num_slots)) for s in pool.servers]
    chosen: list[int] = []
    while len(chosen) < count:
        for slots in per_server:
            if slots and len(chosen) < count:
                chosen.append(slots.pop(0))
        if not any(per_server) and len(chosen) < count:
            raise ValueError(f"{count} clips need {count} slots; the servers have {pool.num_slots}")
    return np.array(sorted(chosen), dtype=np.int64)


def fixed_policies(cfg: SamplingBenchConfig, pool: SimulatorPool) -> dict[str, tuple[tuple[int, ...], bytes | None]]:
    policies: dict[str, tuple[tuple[int, ...], bytes | None]] = {"random": ((64, 64), None)}
    if cfg.checkpoint_dir is not None:
        from learner.checkpoint import load_latest
        from learner.policy import ActorCritic, export_weights

        checkpoint = load_latest(cfg.checkpoint_dir)
        if checkpoint is None:
            raise ValueError(f"checkpoint_dir {cfg.checkpoint_dir} holds no checkpoint; give a fast train run's checkpoints/")
        policy = ActorCritic(checkpoint.observation_space.shape, checkpoint.action_space, checkpoint.hidden_sizes)
        policy.load_state_dict(checkpoint.learner_state["policy"])
        policies["trained"] = (tuple(checkpoint.hidden_sizes), export_weights(policy))
    return policies


def runner_for(pool: SimulatorPool, hidden: tuple[int, ...], weights: bytes | None, seed: int) -> PolicyRunner:
    runner = PolicyRunner(pool.observation_space, pool.action_space, hidden, seed=seed)
    if weights is not None:
        runner.load(0, weights)
    return runner


async def measure_mode(cfg: SamplingBenchConfig, pool: SimulatorPool, runner: PolicyRunner, mode: str, clips: int,
                       seed: int, *, warmup_samples: int, samples: int) -> dict:
    """A fresh sampler of `mode` on `clips` slots: one warm-up iteration, then the measured one's summary."""
    slots = spread_slots(pool, clips)
    dealer = ClipDealer(pool.num_clips, holdout_every=cfg.holdout_every, seed=seed)
    if mode == "ver":
        sampler = VerSampler(pool, runner, dealer, samples_per_iteration=max(warmup_samples, 1), slots=slots)
    else:
        sampler = LockstepSampler(pool, runner, dealer, mode=mode, samples_per_iteration=max(warmup_samples, 1),
                                  alpha=cfg.alpha, t_max=cfg.t_max, slots=slots)
    await sampler.sample()
    sampler.samples_per_iteration = samples
    _, stats = await sampler.sample()
    return stats.summary()


@asynccontextmanager
async def simulator_pool(cfg: SamplingBenchConfig, preset: str) -> AsyncIterator[SimulatorPool]:
    """`cfg.servers` sim-server processes under `preset`, with slots for the largest clip count, as one pool.

    The servers are stopped on exit, whatever happened.
    """
    from jobs.compare.run import Workload, start_simulators

    servers = start_simulators(Workload(cfg.env, (), cfg.holdout_every), cfg.servers,
                               math.ceil(max(cfg.clips) / cfg.servers), ("--cost-preset", preset))
    pool = SimulatorPool()
    try:
        for server in servers:
            await pool.add(server.address)
        yield pool
    finally:
        await pool.close()
        for server in servers:
            server.stop()


async def _run_preset(cfg: SamplingBenchConfig, preset: str, log) -> list[Measurement]:
    measurements: list[Measurement] = []
    async with simulator_pool(cfg, preset) as pool:
        policies = fixed_policies(cfg, pool)
        plan = [(policy, mode, n) for policy in policies for mode in cfg.modes for n in (cfg.clips if mode != "sc" else (1,))]
        if cfg.gym_reference:
            plan += [(policy, GYM_REFERENCE, n) for policy in policies for n in cfg.clips]
        rng = np.random.default_rng(cfg.seed)
        for repeat in range(cfg.repeats):
            for j in rng.permutation(len(plan)):  # interleaved, a new order each repeat
                policy, mode, n = plan[j]
                hidden, weights = policies[policy]
                started = time.perf_counter()
                if mode == GYM_REFERENCE:
                    from jobs.bench.gym_reference import measure_async_vector

                    summary = measure_async_vector(n, cfg.servers, preset, weights, hidden, cfg.samples, cfg.seed + repeat)
                else:
                    runner = runner_for(pool, hidden, weights, cfg.seed + repeat)
                    summary = await measure_mode(cfg, pool, runner, mode, n, cfg.seed + repeat,
                                                 warmup_samples=cfg.warmup_samples, samples=cfg.samples)
                measurements.append(Measurement(preset, policy, mode, n, repeat, summary))
                log(f"{preset:>10} {policy:>7} {mode:>9} clips={n:<3} repeat {repeat + 1}/{cfg.repeats}: "
                    f"effective {summary['effective_throughput']:,.0f}/s, eta {summary['validity']:.2f}, "
                    f"time efficiency {summary['time_efficiency']:.3f} ({time.perf_counter() - started:.1f} s)")
    return measurements


def aggregate(measurements: list[Measurement]) -> list[dict]:
    """Medians over repeats per (preset, policy, mode, clips), with speedups against sc."""
    groups: dict[tuple, list[Measurement]] = {}
    for m in measurements:
        groups.setdefault((m.preset, m.policy, m.mode, m.clips), []).append(m)
    rows = []
    for (preset, policy, mode, clips), ms in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][3], kv[0][2])):
        row = {"preset": preset, "policy": policy, "mode": mode, "clips": clips, "repeats": len(ms)}
        for key in METRICS:
            values = [m.summary[key] for m in ms if isinstance(m.summary.get(key), (int, float)) and math.isfinite(m.summary[key])]
            row[key] = statistics.median(values) if values else float("nan")
        lengths = [x for m in ms for x in m.summary.get("episode_lengths", [])]
        row["episode_length_p10_p50_p90"] = [float(np.percentile(lengths, q)) for q in (10, 50, 90)] if lengths else []
        rows.append(row)
    reference = {(r["preset"], r["policy"]): r for r in rows if r["mode"] == "sc"}
    for row in rows:
        sc = reference.get((row["preset"], row["policy"]))
        row["speedup_vs_sc"] = row["effective_throughput"] / sc["effective_throughput"] if sc else float("nan")
        row["episode_length_vs_sc"] = row["episode_length_mean"] / sc["episode_length_mean"] if sc else float("nan")
    return rows


def run(cfg: SamplingBenchConfig, out_dir: Path, log=print) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.time()
    measurements: list[Measurement] = []
    for preset in cfg.presets:
        measurements += asyncio.run(_run_preset(cfg, preset, log))
    rows = aggregate(measurements)
    lengths = []
    if cfg.length_samples > 0:
        from jobs.bench.episode_length import measure_lengths

        lengths = asyncio.run(measure_lengths(cfg, log))
    result = {
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in cfg.__dict__.items()},
        "started": started,
        "wall_clock_s": time.time() - started,
        "rows": rows,
        "episode_length": lengths,
        "measurements": [m.__dict__ for m in measurements],
    }
    (out_dir / "sampling.json").write_text(json.dumps(result, indent=1, default=float))
    from jobs.bench.sampling_report import write_charts, write_table

    write_table(result, out_dir / "sampling.md")
    write_charts(rows, out_dir)
    return result
