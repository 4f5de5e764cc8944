"""Steady-state episode lengths per sampling mode: how long episodes are, not how fast they come.

The timed measurement of `fast bench sampling` is one short iteration right after every slot
started its first episode together: with 30 slots, 1,536 samples are about 50 steps per slot,
so only episodes shorter than that can end inside the window and every multi-slot mode looks
as if its episodes were short. Here each configuration warms up for `length_warmup_steps` per
slot (twice the takeover clips' longest episode, so every slot is many episodes past the common
start), then counts every episode that ends within the next `length_samples` valid transitions.
In steady state the episodes ending in a window are a fair sample of episode lengths.

An episode ends by termination, by its clip's end, or (sgr, fast+reset) cut by a global truncation;
a cut episode counts with the length it reached, as the article counts it, and the share of
cut episodes is reported beside the mean. Lengths do not depend on the simulator's costs, so
this runs on servers without emulated costs, which keeps it cheap.
"""

from __future__ import annotations

import time

import numpy as np

from jobs.bench.harness import (
    SamplingBenchConfig,
    fixed_policies,
    measure_mode,
    mode_labels,
    runner_for,
    simulator_pool,
    split_label,
)
from jobs.external import ExternalSimulators


async def measure_lengths(
    cfg: SamplingBenchConfig, log=print, external: ExternalSimulators | None = None
) -> list[dict]:
    """One row per (policy, mode, clips): episodes, mean, percentiles, cut share and the ratio to SC.

    On servers of its own without emulated costs, or on the `external` ones as they are."""
    rows = []
    async with simulator_pool(cfg, "off", external) as pool:
        for policy, (hidden, weights) in fixed_policies(cfg, pool).items():
            for mode in mode_labels(cfg):
                for clips in cfg.clips if mode != "sc" else (1,):
                    started = time.perf_counter()
                    base, truncation = split_label(mode)
                    summary = await measure_mode(
                        cfg,
                        pool,
                        runner_for(pool, hidden, weights, cfg.seed),
                        base,
                        clips,
                        cfg.seed,
                        warmup_samples=cfg.length_warmup_steps * clips,
                        samples=cfg.length_samples,
                        truncation=truncation,
                    )
                    rows.append(length_row(policy, mode, clips, summary))
                    log(
                        f"episode length {policy:>7} {mode:>10} clips={clips:<3}: mean {rows[-1]['mean']:.1f} "
                        f"over {rows[-1]['episodes']} episodes ({time.perf_counter() - started:.1f} s)"
                    )
    reference = {r["policy"]: r for r in rows if r["mode"] == "sc"}
    for row in rows:
        sc = reference.get(row["policy"])
        row["mean_vs_sc"] = row["mean"] / sc["mean"] if sc and sc["mean"] > 0 else float("nan")
    return rows


def length_row(policy: str, mode: str, clips: int, summary: dict) -> dict:
    lengths = np.asarray(summary.get("episode_lengths", []), dtype=float)
    ends = dict(summary.get("episode_ends", {}))
    return {
        "policy": policy,
        "mode": mode,
        "clips": clips,
        "episodes": int(lengths.size),
        "mean": float(lengths.mean()) if lengths.size else float("nan"),
        "p10_p50_p90": [float(np.percentile(lengths, q)) for q in (10, 50, 90)] if lengths.size else [],
        "ends": ends,
        "cut_share": ends.get("cut", 0) / lengths.size if lengths.size else float("nan"),
        # In steady state, unlike the short timed window, which counts the start's synchronised resets.
        "slot_resets_per_1k_valid": summary.get("slot_resets_per_1k_valid", float("nan")),
    }
