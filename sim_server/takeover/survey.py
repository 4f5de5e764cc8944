"""Episode-length survey and step-cost benchmark of the takeover workload.

    python -m sim_server.takeover.survey [--seed 0] [--clips 200] [--episode-seeds 5] [--by-scenario] \
[--bench-slots 8 64]

Plays every clip once per episode seed under the uniform random policy and the scripted
lane-keeping driver, all clips as slots of one env, and prints length and outcome statistics;
then measures the CPU cost of `step` per slot-step. These are the figures in docs/takeover.md.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np

from sim_server.takeover.baseline_policy import lane_keeping_actions, random_actions
from sim_server.takeover.catalog import Catalog, build_catalog
from sim_server.takeover.env import TakeoverEnv
from sim_server.takeover.scenarios import SCENARIOS

Policy = Callable[[np.ndarray, np.random.Generator], np.ndarray]


def random_policy(obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return random_actions(rng, obs.shape[0])


def scripted_policy(obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return lane_keeping_actions(obs)


def play_all_clips(
    catalog: Catalog, policy: Policy, episode_seed: int, clip_ids: np.ndarray | None = None
) -> list[dict[str, float]]:
    """One episode per clip (each clip in its own slot, all stepped together); their metrics."""
    clips = np.arange(catalog.num_clips) if clip_ids is None else np.asarray(clip_ids, dtype=np.int64)
    env = TakeoverEnv(len(clips), catalog=catalog)
    slots = np.arange(len(clips))
    obs = env.reset(slots, clips, np.full(len(clips), episode_seed))
    rng = np.random.default_rng(episode_seed)
    live = np.ones(len(clips), dtype=bool)
    metrics: list[dict[str, float]] = [{}] * len(clips)
    while live.any():
        stepped = slots[live]
        result = env.step(stepped, policy(obs[live], rng))
        obs[live] = result.observations
        for j, m in zip(stepped, result.episode_metrics):
            if m is not None:
                metrics[j] = m
        live[stepped] = ~(result.terminated | result.truncated)
    return metrics


def summarise(metrics: list[dict[str, float]]) -> dict[str, float]:
    lengths = np.array([m["length"] for m in metrics])
    return {
        "episodes": len(metrics),
        "mean": float(lengths.mean()),
        "min": float(lengths.min()),
        "p10": float(np.percentile(lengths, 10)),
        "p25": float(np.percentile(lengths, 25)),
        "p50": float(np.percentile(lengths, 50)),
        "p75": float(np.percentile(lengths, 75)),
        "p90": float(np.percentile(lengths, 90)),
        "max": float(lengths.max()),
        "share_le_5": float((lengths <= 5).mean()),
        "share_ge_150": float((lengths >= 150).mean()),
        "collision_rate": float(np.mean([m["collided"] for m in metrics])),
        "off_road_rate": float(np.mean([m["off_road"] for m in metrics])),
        "truncated_rate": float(np.mean([1.0 - max(m["collided"], m["off_road"]) for m in metrics])),
        "mean_return": float(np.mean([m["return"] for m in metrics])),
        "mean_route_progress": float(np.mean([m["route_progress"] for m in metrics])),
    }


def bench_step(catalog: Catalog, num_slots: int, calls: int = 500) -> tuple[float, float]:
    """CPU seconds per `step` call and per slot-step, all slots stepped each call.

    Slots replay the scripted driver; ended slots are reset outside the timed region.
    """
    env = TakeoverEnv(num_slots, catalog=catalog)
    slots = np.arange(num_slots)
    rng = np.random.default_rng(0)
    obs = env.reset(slots, slots % catalog.num_clips, np.zeros(num_slots))
    cpu = 0.0
    for _ in range(calls):
        actions = scripted_policy(obs, rng)
        start = time.process_time()
        result = env.step(slots, actions)
        cpu += time.process_time() - start
        obs = result.observations
        ended = result.terminated | result.truncated
        if ended.any():
            obs[ended] = env.reset(
                slots[ended], rng.integers(0, catalog.num_clips, int(ended.sum())), np.zeros(int(ended.sum()))
            )
    return cpu / calls, cpu / (calls * num_slots)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=0, help="catalog seed")
    parser.add_argument("--clips", type=int, default=200)
    parser.add_argument("--episode-seeds", type=int, default=5, help="episodes per clip and policy")
    parser.add_argument("--by-scenario", action="store_true", help="also break lengths down by scenario")
    parser.add_argument("--bench-slots", type=int, nargs="*", default=[8, 64], help="slot counts to time `step` at")
    args = parser.parse_args()
    catalog = build_catalog(args.seed, args.clips)
    print(
        f"catalog seed={args.seed} clips={catalog.num_clips} maps={catalog.num_maps} "
        f"arrays={catalog.nbytes / 1e6:.1f} MB"
    )
    for name, policy in (("random", random_policy), ("scripted", scripted_policy)):
        metrics = [m for seed in range(args.episode_seeds) for m in play_all_clips(catalog, policy, seed)]
        summary = summarise(metrics)
        print(
            f"{name:9s}" + " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in summary.items())
        )
        if args.by_scenario:
            for index, scenario in enumerate(SCENARIOS):
                part = summarise([m for m in metrics if catalog.clip_scenario[int(m["clip_id"])] == index])
                print(
                    f"  {scenario:20s} episodes={part['episodes']} mean={part['mean']:.4g} p10={part['p10']:.4g} "
                    f"collision_rate={part['collision_rate']:.3g} off_road_rate={part['off_road_rate']:.3g}"
                )
    for num_slots in args.bench_slots:
        per_call, per_slot_step = bench_step(catalog, num_slots)
        print(
            f"step cpu: slots={num_slots} per_call_us={per_call * 1e6:.0f} per_slot_step_us={per_slot_step * 1e6:.1f}"
        )


if __name__ == "__main__":
    main()
