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

With `simulators` (servers that run already, jobs/external.py) every measurement runs on those,
under their own costs (the rows' preset is "external"), and nothing is started or stopped.
"""

from __future__ import annotations

import asyncio
import json
import math
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from jobs.bench.episode_length import measure_lengths
from jobs.bench.harness import (
    SamplingBenchConfig,
    fixed_policies,
    measure_mode,
    mode_labels,
    runner_for,
    simulator_pool,
    split_label,
)
from jobs.external import ExternalSimulators, check_simulators

GYM_REFERENCE = "gym-async"  # Gymnasium AsyncVectorEnv with per-env autoreset (jobs/bench/gym_reference.py)
LOCALITY = "+locality"  # the suffix of a mode's label when it deals clips with map locality
PREFETCH = "+prefetch"  # ... and when it prepares slots' next clips ahead (fast.v1 Prepare)
VER_PER_SLOT = "ver+perslot"  # VER stepping one slot per call, as before its steps were batched per server
# The figures a table row carries, from IterationStats.summary().
METRICS = (
    "sampling_time_s",
    "raw_throughput",
    "validity",
    "time_efficiency",
    "effective_throughput",
    "episode_length_mean",
    "global_resets_per_1k_valid",
    "slot_resets_per_1k_valid",
    # From the servers' answers and the costs (jobs/bench/harness.with_limit, jobs/bench/limits.py).
    "step_latency_s",
    "cache_hit_rate",
    "limit",
    "limit_share",
    "distinct_maps",
    "prepared_share",
    "step_calls_per_valid",
)


@dataclass
class Measurement:
    preset: str
    policy: str
    mode: str
    clips: int
    repeat: int
    summary: dict = field(default_factory=dict)


async def _run_preset(
    cfg: SamplingBenchConfig, preset: str, log, external: ExternalSimulators | None = None, penalty: float = 0.0
) -> list[Measurement]:
    """Every configuration under one cost preset; with a prefetch step `penalty` (servers of their own,
    started with it) the rows' preset reads PRESET+penalty<value>."""
    measurements: list[Measurement] = []
    extra = {"prefetch_step_penalty": penalty} if penalty else {}
    preset_label = f"{preset}+penalty{penalty:g}" if penalty else preset
    async with simulator_pool(cfg, preset, external, extra) as pool:
        policies = fixed_policies(cfg, pool)
        localities, prefetches = cfg.locality, cfg.prefetch
        if True in localities and pool.clip_map_ids.size != pool.num_clips:
            log("map locality not measured: the simulators do not list each clip's map (Describe.clip_map_ids)")
            localities = (False,)
        if True in prefetches and not any(s.prefetch for s in pool.servers):
            log("prefetch not measured: no simulator serves Prepare (Capabilities.prefetch)")
            prefetches = (False,)
        plan = [
            (policy, mode, n, local, ahead)
            for policy in policies
            for mode in mode_labels(cfg)
            for n in (cfg.clips if mode != "sc" else (1,))
            for local in localities
            for ahead in prefetches
        ]
        if cfg.gym_reference:
            plan += [(policy, GYM_REFERENCE, n, False, False) for policy in policies for n in cfg.clips]
        if cfg.ver_per_slot and "ver" in cfg.modes:
            plan += [(policy, VER_PER_SLOT, n, False, False) for policy in policies for n in cfg.clips]
        rng = np.random.default_rng(cfg.seed)
        for repeat in range(cfg.repeats):
            for j in rng.permutation(len(plan)):  # interleaved, a new order each repeat
                policy, mode, n, local, ahead = plan[j]
                hidden, weights = policies[policy]
                started = time.perf_counter()
                if mode == GYM_REFERENCE:
                    from jobs.bench.gym_reference import measure_async_vector

                    summary = measure_async_vector(
                        n,
                        cfg.servers,
                        preset,
                        weights,
                        hidden,
                        cfg.samples,
                        cfg.seed + repeat,
                        warmup_samples=max(cfg.warmup_samples, cfg.warmup_steps * n),
                    )
                else:
                    runner = runner_for(pool, hidden, weights, cfg.seed + repeat)
                    base, truncation = split_label(mode)
                    summary = await measure_mode(
                        cfg,
                        pool,
                        runner,
                        "ver" if mode == VER_PER_SLOT else base,
                        n,
                        cfg.seed + repeat,
                        warmup_samples=max(cfg.warmup_samples, cfg.warmup_steps * n),
                        samples=cfg.samples,
                        locality=local,
                        prefetch=ahead,
                        ver_step_batching=mode != VER_PER_SLOT,
                        truncation=truncation,
                    )
                label = f"{mode}{PREFETCH if ahead else ''}{LOCALITY if local else ''}"
                measurements.append(Measurement(preset_label, policy, label, n, repeat, summary))
                log(
                    f"{preset_label:>10} {policy:>7} {label:>10} clips={n:<3} repeat {repeat + 1}/{cfg.repeats}: "
                    f"effective {summary['effective_throughput']:,.0f}/s, eta {summary['validity']:.2f}, "
                    f"time efficiency {summary['time_efficiency']:.3f} ({time.perf_counter() - started:.1f} s)"
                )
    return measurements


def aggregate(measurements: list[Measurement]) -> list[dict]:
    """Medians over repeats per (preset, policy, mode, clips), with speedups against sc."""
    groups: dict[tuple, list[Measurement]] = {}
    for m in measurements:
        groups.setdefault((m.preset, m.policy, m.mode, m.clips), []).append(m)
    rows = []
    for (preset, policy, mode, clips), ms in sorted(
        groups.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][3], kv[0][2])
    ):
        row = {"preset": preset, "policy": policy, "mode": mode, "clips": clips, "repeats": len(ms)}
        for key in METRICS:
            values = [
                m.summary[key]
                for m in ms
                if isinstance(m.summary.get(key), (int, float)) and math.isfinite(m.summary[key])
            ]
            row[key] = statistics.median(values) if values else float("nan")
        bounds = [m.summary["limit_bounds"] for m in ms if "limit_bounds" in m.summary]
        row["limit_bounds"] = {k: statistics.median(b[k] for b in bounds) for k in bounds[0]} if bounds else {}
        bindings = [m.summary["limit_binding"] for m in ms if "limit_binding" in m.summary]
        row["limit_binding"] = max(set(bindings), key=bindings.count) if bindings else ""
        lengths = [x for m in ms for x in m.summary.get("episode_lengths", [])]
        row["episode_length_p10_p50_p90"] = [float(np.percentile(lengths, q)) for q in (10, 50, 90)] if lengths else []
        rows.append(row)
    # SC as measured, plain (one slot, no prefetch, no locality) where the run has it.
    reference = {}
    for r in sorted(rows, key=lambda r: r["mode"] != "sc"):
        if r["mode"].split("+")[0] == "sc":
            reference.setdefault((r["preset"], r["policy"]), r)
    # The best pattern's limit in each configuration: what the costs allow whichever mode samples.
    best: dict[tuple, float] = {}
    for row in rows:
        if math.isfinite(row["limit"]):
            key = (row["preset"], row["policy"], row["clips"])
            best[key] = max(best.get(key, 0.0), row["limit"])
    for row in rows:
        top = best.get((row["preset"], row["policy"], row["clips"]))
        row["best_limit"] = top if top else float("nan")
        row["best_limit_share"] = row["effective_throughput"] / top if top else float("nan")
        sc = reference.get((row["preset"], row["policy"]))
        row["speedup_vs_sc"] = row["effective_throughput"] / sc["effective_throughput"] if sc else float("nan")
        row["episode_length_vs_sc"] = row["episode_length_mean"] / sc["episode_length_mean"] if sc else float("nan")
    return rows


def _penalties(cfg: SamplingBenchConfig, preset: str) -> tuple[float, ...]:
    """The prefetch step penalties that mean something under `preset`: a non-zero one only when
    prefetch is measured and the preset has both a step latency and map loads to overlap."""
    from sim_server.cost_model import PRESETS

    costs = PRESETS.get(preset)
    applies = True in cfg.prefetch and costs is not None and costs.step_latency_s > 0 and costs.map_load_s > 0
    kept = tuple(p for p in cfg.prefetch_step_penalties if p == 0 or applies)
    return kept or (0.0,)


def run(cfg: SamplingBenchConfig, out_dir: Path, log=print) -> dict:
    external = check_simulators(cfg.simulators) if cfg.simulators else None  # before anything is measured
    if external is not None:
        log(f"on {external.describe()}")
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.time()
    measurements: list[Measurement] = []
    for preset in cfg.presets:
        for penalty in _penalties(cfg, preset):
            measurements += asyncio.run(_run_preset(cfg, preset, log, external, penalty))
    rows = aggregate(measurements)
    lengths = []
    if cfg.length_samples > 0:
        lengths = asyncio.run(measure_lengths(cfg, log, external))
    result = {
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in cfg.__dict__.items()},
        **({"simulators": external.record()} if external is not None else {}),
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
