"""What every sampling measurement is built from: its simulator servers as one pool, its fixed
policies, and one measured iteration of a mode on N slots (the settings: jobs/bench/config.py).

`fast bench sampling` (jobs/bench/sampling.py) times configurations with these pieces and
measures steady-state episode lengths with them too (jobs/bench/episode_length.py): both
measurements import them from here, so neither bench module leans on the other's insides.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, replace

import numpy as np

from broker.dealer import ClipDealer, pool_locality
from broker.metrics import IterationStats, combined
from broker.policy_runner import PolicyRunner
from broker.pool import PoolCounters, SimulatorPool
from broker.samplers import Sampler, make_sampler
from jobs.bench.config import SamplingBenchConfig
from jobs.bench.limits import Pattern, costs_from_describe, pattern_limit
from jobs.external import ExternalSimulators
from jobs.simulators import Workload, job_simulators


def mode_labels(cfg: SamplingBenchConfig) -> list[str]:
    """The modes measured, as rows name them: fast once per truncation (fast+carry, fast+reset)."""
    return [label for m in cfg.modes for label in ([f"fast+{t}" for t in cfg.truncations] if m == "fast" else [m])]


def split_label(label: str) -> tuple[str, str]:
    """(mode, truncation) of a `mode_labels` label; modes without rounds to carry read "carry"."""
    mode, _, truncation = label.partition("+")
    return mode, truncation or "carry"


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
        from learner.checkpoint import load_latest, policy_weights

        checkpoint = load_latest(cfg.checkpoint_dir)
        if checkpoint is None:
            raise ValueError(
                f"checkpoint_dir {cfg.checkpoint_dir} holds no checkpoint; give a fast train run's checkpoints/"
            )
        policies["trained"] = (tuple(checkpoint.hidden_sizes), policy_weights(checkpoint))
    return policies


def runner_for(pool: SimulatorPool, hidden: tuple[int, ...], weights: bytes | None, seed: int) -> PolicyRunner:
    runner = PolicyRunner(pool.observation_space, pool.action_space, hidden, seed=seed)
    if weights is not None:
        runner.load(0, weights)
    return runner


@dataclass(frozen=True)
class ModeRun:
    """One sampler's measured iterations: their stats (`combined`), what the pool's answered calls add
    up to over them, its slots and the clips its dealer dealt meanwhile."""

    stats: IterationStats
    calls: PoolCounters
    slots: np.ndarray
    clips_dealt: tuple[int, ...]


async def measure_mode(
    cfg: SamplingBenchConfig,
    pool: SimulatorPool,
    runner: PolicyRunner,
    mode: str,
    clips: int,
    seed: int,
    **settings,
) -> dict:
    """A fresh sampler of `mode` on `clips` slots: one warm-up iteration, then `iterations` measured
    ones of `samples` each, summarised as one (`combined`: valid transitions over their summed wall).
    `settings`: `run_mode`'s keywords."""
    return runs_summary([await run_mode(cfg, pool, runner, mode, clips, seed, **settings)], pool)


async def run_mode(
    cfg: SamplingBenchConfig,
    pool: SimulatorPool,
    runner: PolicyRunner,
    mode: str,
    clips: int,
    seed: int,
    *,
    warmup_samples: int,
    samples: int,
    locality: bool = False,
    prefetch: bool = False,
    ver_step_batching: bool = True,
    truncation: str = "carry",
    iterations: int = 1,
) -> ModeRun:
    """`measure_mode`'s run, unsummarised: a fresh sampler, its warm-up iteration, then `iterations`
    measured ones of `samples` each."""
    sampler, dealer, slots = fresh_sampler(
        cfg,
        pool,
        runner,
        mode,
        clips,
        seed,
        samples_per_iteration=max(warmup_samples, 1),
        locality=locality,
        prefetch=prefetch,
        ver_step_batching=ver_step_batching,
        truncation=truncation,
    )
    await sampler.sample()
    sampler.samples_per_iteration = samples
    dealer.clips_dealt.clear()
    stats, calls = await _sample(sampler, pool, iterations)
    return ModeRun(stats, calls, slots, tuple(int(c) for c in dealer.clips_dealt))


def runs_summary(runs: Sequence[ModeRun], pool: SimulatorPool) -> dict:
    """Runs of one configuration (the same mode and settings on the same slots) as one figure: their
    iterations `combined` (valid transitions over their summed wall), the pool's calls over all of
    them (`with_limit`), and how many distinct maps they dealt where the maps are known."""
    if not runs:
        raise ValueError("runs_summary() needs at least one run")
    calls = PoolCounters()
    for run in runs:
        calls = calls.plus(run.calls)
    slots = runs[0].slots
    summary = with_limit(combined([run.stats for run in runs]).summary(), pool, slots, calls)
    if pool.clip_map_ids.size == pool.num_clips:  # maps known: how many the iterations dealt
        summary["distinct_maps"] = len({int(pool.clip_map_ids[c]) for run in runs for c in run.clips_dealt})
    return summary


def fresh_sampler(
    cfg: SamplingBenchConfig,
    pool: SimulatorPool,
    runner: PolicyRunner,
    mode: str,
    clips: int,
    seed: int,
    *,
    samples_per_iteration: int,
    locality: bool = False,
    prefetch: bool = False,
    ver_step_batching: bool = True,
    truncation: str = "carry",
) -> tuple[Sampler, ClipDealer, np.ndarray]:
    """A sampler of `mode` (cfg's alpha and t_max) on `clips` slots spread over the servers, with a dealer
    of its own: (sampler, dealer, the global slot ids)."""
    slots = spread_slots(pool, clips)
    where = pool_locality(pool, cfg.locality_max_repeat) if locality else None
    if locality and where is None:
        raise ValueError("--locality on: the simulators do not say which map each clip plays on (Describe)")
    dealer = ClipDealer(pool.num_clips, holdout_every=cfg.holdout_every, seed=seed, locality=where)
    sampler = make_sampler(
        mode,
        pool,
        runner,
        dealer,
        samples_per_iteration=samples_per_iteration,
        alpha=cfg.alpha,
        t_max=cfg.t_max,
        truncation=truncation,
        slots=slots,
        prefetch=prefetch,
        ver_step_batching=ver_step_batching,
    )
    return sampler, dealer, slots


async def timed_iteration(sampler: Sampler, pool: SimulatorPool, slots: np.ndarray) -> tuple[dict, IterationStats]:
    """One iteration of `sampler`: its summary with what the servers' answers and the costs tell of it
    (`with_limit`), and its stats."""
    return await timed_iterations(sampler, pool, slots, 1)


async def timed_iterations(
    sampler: Sampler, pool: SimulatorPool, slots: np.ndarray, iterations: int
) -> tuple[dict, IterationStats]:
    """`iterations` iterations of `sampler` back to back, as one (`combined`): `timed_iteration`'s
    summary and stats over all of them."""
    stats, calls = await _sample(sampler, pool, iterations)
    return with_limit(stats.summary(), pool, slots, calls), stats


async def _sample(sampler: Sampler, pool: SimulatorPool, iterations: int) -> tuple[IterationStats, PoolCounters]:
    """`iterations` iterations of `sampler` back to back: their stats `combined`, and what the pool's
    answered calls added up to meanwhile."""
    if iterations < 1:
        raise ValueError(f"iterations={iterations}: give at least 1")
    before = replace(pool.counters)  # a copy to diff against
    stats = combined([(await sampler.sample())[1] for _ in range(iterations)])
    return stats, pool.counters.since(before)


def with_limit(summary: dict, pool: SimulatorPool, slots: np.ndarray, calls: PoolCounters) -> dict:
    """`summary` with what the servers' answers tell of the iteration (step latency paid, map cache hit
    rate) and the limit its costs put on the pattern measured (jobs/bench/limits.py)."""
    servers = np.unique(pool.slot_server[slots])
    valid = max(summary["valid_transitions"], 1)
    pattern = Pattern.from_calls(
        asdict(calls), slots=int(slots.size), servers=int(servers.size), eta=summary["validity"], valid=valid
    )
    limit = pattern_limit(costs_from_describe(pool.servers[int(servers[0])].cost_model), pattern)
    counted = calls.map_loads + calls.map_cache_hits
    return {
        **summary,
        "step_latency_s": pattern.step_latency_s,
        "map_loads": calls.map_loads,
        "map_cache_hits": calls.map_cache_hits,
        "cache_hit_rate": pattern.hit_rate if counted else float("nan"),
        "step_calls_per_valid": calls.step_calls / valid,
        "prepared_share": calls.prepared / calls.reset_slots if calls.reset_slots else float("nan"),
        **limit.as_row(),
        "limit_share": summary["effective_throughput"] / limit.limit if math.isfinite(limit.limit) else float("nan"),
    }


@asynccontextmanager
async def simulator_pool(
    cfg: SamplingBenchConfig, preset: str, external: ExternalSimulators | None = None, extra: dict | None = None
) -> AsyncIterator[SimulatorPool]:
    """`cfg.servers` sim-server processes under `preset`, with slots for the largest clip count, as one pool.

    The servers are stopped on exit, whatever happened. They and the pool share a token of their own.
    With `external`, the pool is those servers (the environment's token), and nothing is started or stopped.
    """
    workload = Workload(cfg.env, (), cfg.holdout_every)
    slots = math.ceil(max(cfg.clips) / cfg.servers)
    settings = {"cost_preset": preset, **(extra or {})}  # sim_server/config.py
    with job_simulators(workload, cfg.servers, slots, settings, external=external) as servers:
        pool = SimulatorPool(credentials=servers.credentials)
        try:
            for address in servers.addresses:
                await pool.add(address)
            if pool.num_slots < max(cfg.clips):
                raise ValueError(
                    f"--clips {max(cfg.clips)} needs {max(cfg.clips)} slots; the simulators have {pool.num_slots}: "
                    f"give clip counts up to {pool.num_slots}"
                )
            yield pool
        finally:
            await pool.close()
