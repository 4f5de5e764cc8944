"""Which learning levers make the default run learn in every seed? An in-process ablation.

Runs the default training job's loop (`fast train`'s settings: takeover workload, 10 slots, mode
`fast`, alpha 0.5, t_max 200, 2,048 valid transitions per iteration, PPO 10 x 8) in one process,
with the real pieces but no sockets: the simulator servers' `Simulator` (cost model off) in the
broker's `InProcessPool` (broker/in_process.py), the broker's DPSA `LockstepSampler`,
`PolicyRunner` and `ClipDealer`, the learner's `ActorCritic` and `PPOLearner`, and the
evaluation `fast train` ends with (20 held-out clips x 3 episodes, deterministic actions).
Screening 5 seeds of each variant this way costs minutes instead of the hours that `fast train`
would take on a 2-core machine; the variant kept is then measured with `fast train` itself
(benchmarks/results/default-run/).

    .venv/bin/python benchmarks/learning_ablation.py --variants baseline,norm_reward --seeds 0-4 --jobs 2

Each (variant, seed) runs in its own process with one torch thread; `--jobs` of them at once.
Results go to benchmarks/results/learning-ablation/ (runs.jsonl, one line per run, and
ablation.md, the table).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# Each variant: the changes from the harness's base (the defaults of `fast train` before this
# ablation). Keys: PPOConfig fields, `init_log_std`, `obs_norm`, `anneal_lr`, `iterations`.
KINKED = {"accel_map": "kinked"}  # the takeover workload's longitudinal action map before 2026-12-01
VARIANTS: dict[str, dict] = {
    # The workload as it is (one slope through 0 for the longitudinal action, docs/takeover.md).
    "baseline": {},
    "norm_reward": {"norm_reward": True},
    "anneal": {"anneal_lr": True},
    "log_std": {"init_log_std": -0.5},
    "log_std+anneal": {"init_log_std": -0.5, "anneal_lr": True},
    "norm_reward+log_std+anneal": {"norm_reward": True, "init_log_std": -0.5, "anneal_lr": True},
    "obs_norm": {"obs_norm": True},
    "crash50": {"collision_penalty": 50.0},
    # The same levers on the workload as it was (3 m/s^2 per unit forward, 6 braking): the first rounds.
    "kinked:baseline": {**KINKED},
    "kinked:norm_reward": {**KINKED, "norm_reward": True},
    "kinked:norm_reward+log_std+anneal": {**KINKED, "norm_reward": True, "init_log_std": -0.5, "anneal_lr": True},
    "kinked:init_log_std-1": {**KINKED, "init_log_std": -1.0},
    "kinked:crash50": {**KINKED, "collision_penalty": 50.0},
    "kinked:norm_reward+log_std-1+anneal": {**KINKED, "norm_reward": True, "init_log_std": -1.0, "anneal_lr": True},
    "crash50+levers": {"collision_penalty": 50.0, "norm_reward": True, "init_log_std": -0.5, "anneal_lr": True},
    # A dense term before the crash: 1 per step at TTC 0 to the lead, falling to 0 at 3 s.
    "ttc1": {"ttc_weight": 1.0},
    "ttc1+norm_reward": {"ttc_weight": 1.0, "norm_reward": True},
    # CleanRL's minibatch count for 2,048 transitions (32 of 64), four times the gradient steps.
    "mb32": {"num_minibatches": 32},
    "mb32+ttc1": {"num_minibatches": 32, "ttc_weight": 1.0},
}


def _kinked_accel(longitudinal):
    import numpy as np

    return np.where(longitudinal >= 0.0, longitudinal * 3.0, longitudinal * 6.0)


def _workload_accel():
    from sim_server.takeover import dynamics

    return dynamics.accel_command


WORKLOAD_COLLISION_PENALTY = 10.0  # sim_server/takeover/reward.py's, restored before every run
WORKLOAD_TTC_WEIGHT = 0.0

BASE = {
    "iterations": 350,
    "slots": 10,
    "alpha": 0.5,
    "t_max": 200,
    "samples_per_iteration": 2048,
    "lr": 3e-4,
    "update_epochs": 10,
    "num_minibatches": 8,
    "gamma": 0.99,
    "eval_episodes_per_clip": 3,
}


def _in_process_pool(num_slots: int):
    """The takeover workload's `Simulator` (cost model off) in this process: broker/in_process.py's pool."""
    from broker.in_process import InProcessPool
    from sim_server.cost_model import CostModel, cost_model_config
    from sim_server.environments import make_env
    from sim_server.simulator import Simulator

    return InProcessPool([Simulator(make_env("takeover", num_slots), CostModel(cost_model_config("off")))])


ACCEL_MAPS: dict = {}


def run_one(variant: str, seed: int, iterations: int | None) -> dict:
    """Train one (variant, seed) to the end and evaluate initial and final policies."""
    import torch

    torch.set_num_threads(1)
    ACCEL_MAPS.setdefault("workload", _workload_accel())  # captured before any run patches it
    ACCEL_MAPS["kinked"] = _kinked_accel
    return asyncio.run(_run(variant, seed, iterations))


async def _run(variant: str, seed: int, iterations: int | None) -> dict:
    import torch

    from broker.dealer import HOLDOUT_EVERY, ClipDealer
    from broker.evaluate import EvaluationSession, summarize
    from broker.policy_runner import PolicyRunner
    from broker.samplers.fast import Dpsa
    from broker.samplers.lockstep import LockstepSampler
    from learner.batch import RolloutBatch
    from learner.policy import ActorCritic, export_weights
    from learner.ppo import PPOConfig, PPOLearner

    settings = {**BASE, **VARIANTS[variant]}
    if iterations is not None:
        settings["iterations"] = iterations
    # The workload's crash term, for this process only (set on every run: a worker process runs
    # several variants one after another): what a heavier crash term would teach.
    from sim_server.takeover import reward

    reward.COLLISION_PENALTY = settings.get("collision_penalty", WORKLOAD_COLLISION_PENALTY)
    reward.TTC_WEIGHT = settings.get("ttc_weight", WORKLOAD_TTC_WEIGHT)
    # The longitudinal action map: the workload's (6 m/s^2 per unit both ways, capped at +3), or
    # "kinked": 3 per unit forward and 6 braking, the workload's map before 2026-12-01.
    from sim_server.takeover import dynamics

    dynamics.accel_command = ACCEL_MAPS[settings.get("accel_map", "workload")]
    ppo_fields = set(PPOConfig.__dataclass_fields__)
    ppo = PPOConfig(**{k: v for k, v in settings.items() if k in ppo_fields}, seed=seed)
    pool = _in_process_pool(settings["slots"])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        policy = ActorCritic(
            tuple(pool.observation_space.shape),
            pool.action_space,
            (64, 64),
            init_log_std=settings.get("init_log_std", 0.0),
            obs_norm=settings.get("obs_norm", False),
        )
    learner = PPOLearner(policy, ppo, device="cpu")
    runner = PolicyRunner(
        pool.observation_space, pool.action_space, (64, 64), seed=seed, obs_norm=settings.get("obs_norm", False)
    )
    runner.load(0, export_weights(learner.policy))
    evaluation = EvaluationSession(
        pool, holdout_every=HOLDOUT_EVERY, episodes_per_clip=settings["eval_episodes_per_clip"], seed=seed
    )
    initial = summarize(await evaluation.play(runner))

    dealer = ClipDealer(pool.num_clips, holdout_every=HOLDOUT_EVERY, seed=seed)
    sampler = LockstepSampler(
        pool,
        runner,
        dealer,
        Dpsa(settings["alpha"], settings["t_max"]),
        samples_per_iteration=settings["samples_per_iteration"],
    )
    started = time.perf_counter()
    curve = []
    total = settings["iterations"]
    for version in range(total):
        if settings.get("anneal_lr"):
            # CleanRL's linear annealing: lr * (1 - update / total), the last update at lr / total.
            learner.set_hyperparameters(
                learning_rate=settings["lr"], ent_coef=ppo.ent_coef, lr_anneal_factor=1 - version / total
            )
        arrays, stats = await sampler.sample()
        batch = RolloutBatch.from_numpy({**arrays, "policy_version": version})
        update = learner.update(batch)
        runner.load(version + 1, export_weights(learner.policy))
        summary = stats.summary()
        curve.append(
            {
                "episode_return_mean": summary.get("episode_return_mean"),
                "value_loss": update["value_loss"],
                "grad_norm": update["grad_norm"],
                "entropy": update["entropy"],
            }
        )
    final = summarize(await evaluation.play(runner))
    keys = ("return_mean", "collided_rate", "off_road_rate", "length_mean")
    return {
        "variant": variant,
        "seed": seed,
        "settings": {k: v for k, v in settings.items() if not (isinstance(v, float) and math.isinf(v))},
        "iterations": total,
        "code": _code(),
        "train_s": time.perf_counter() - started,
        "initial": {k: initial[k] for k in keys},
        "final": {k: final[k] for k in keys},
        "curve": curve,
    }


def _code() -> str:
    """The commit the run's code is at (with "+changes" when the tree differs from it)."""
    import subprocess

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    changed = git("status", "--porcelain", "--untracked-files=no")
    return git("rev-parse", "--short", "HEAD") + (" + changes" if changed else "")


def _seeds(text: str) -> list[int]:
    if "-" in text:
        lo, hi = text.split("-")
        return list(range(int(lo), int(hi) + 1))
    return [int(s) for s in text.split(",")]


def table(runs: list[dict]) -> str:
    """The ablation table: per variant and run length, mean / min over seeds of return, margin and rates."""
    import numpy as np

    lines = [
        "| variant | iterations | seeds | trained return mean ± std (min) | margin over initial mean (min) | "
        "seeds beating initial | collision trained / initial | off-road trained / initial | "
        "seeds with fewer collisions | train s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for variant, iterations in dict.fromkeys((r["variant"], r["iterations"]) for r in runs):
        rs = [r for r in runs if r["variant"] == variant and r["iterations"] == iterations]
        final = np.array([r["final"]["return_mean"] for r in rs])
        margin = final - np.array([r["initial"]["return_mean"] for r in rs])
        col_f = np.array([r["final"]["collided_rate"] for r in rs])
        col_i = np.array([r["initial"]["collided_rate"] for r in rs])
        off_f = np.array([r["final"]["off_road_rate"] for r in rs])
        off_i = np.array([r["initial"]["off_road_rate"] for r in rs])
        std = final.std(ddof=1) if len(rs) > 1 else 0.0
        lines.append(
            f"| {variant} | {iterations} | {len(rs)} | {final.mean():.1f} ± {std:.1f} ({final.min():.1f}) | "
            f"{margin.mean():+.1f} ({margin.min():+.1f}) | {(margin > 0).sum()}/{len(rs)} | "
            f"{col_f.mean():.2f} / {col_i.mean():.2f} | {off_f.mean():.2f} / {off_i.mean():.2f} | "
            f"{(col_f < col_i).sum()}/{len(rs)} | {np.mean([r['train_s'] for r in rs]):.0f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variants", default="baseline,norm_reward", help=f"comma list of {', '.join(VARIANTS)}")
    parser.add_argument("--seeds", default="0-4", help="e.g. 0-4 or 0,2")
    parser.add_argument("--jobs", type=int, default=2, help="runs at once (one process each)")
    parser.add_argument("--iterations", type=int, default=None, help="override the 350 iterations")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/learning-ablation")
    parser.add_argument("--table-only", action="store_true", help="print the table of the runs on record")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    log = args.out / "runs.jsonl"
    if not args.table_only:
        variants = args.variants.split(",")
        unknown = [v for v in variants if v not in VARIANTS]
        if unknown:
            parser.error(f"--variants: unknown {', '.join(unknown)}; choose from {', '.join(VARIANTS)}")
        jobs = [(v, s) for v in variants for s in _seeds(args.seeds)]
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        with ProcessPoolExecutor(args.jobs) as executor:
            futures = [executor.submit(run_one, v, s, args.iterations) for v, s in jobs]
            for future in futures:
                result = future.result()
                with log.open("a") as f:
                    f.write(json.dumps(result) + "\n")
                i, fi = result["initial"], result["final"]
                print(
                    f"{result['variant']:>34} seed {result['seed']}: return {i['return_mean']:.1f} -> "
                    f"{fi['return_mean']:.1f}, collided {i['collided_rate']:.2f} -> {fi['collided_rate']:.2f}, "
                    f"off-road {i['off_road_rate']:.2f} -> {fi['off_road_rate']:.2f} ({result['train_s']:.0f} s)",
                    flush=True,
                )
    runs = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    text = table(runs)
    print(text)
    (args.out / "ablation.md").write_text(
        "# Learning ablation\n\n"
        "    .venv/bin/python benchmarks/learning_ablation.py --variants V1,V2,... --seeds 0-2 --jobs 2 \\\n"
        "        [--iterations 150]\n\n"
        'The default run\'s loop in one process (docs/learning.md, "The ablation"): 350 iterations of 2,048 '
        "valid transitions (or as many as the row says), 10 slots, mode fast, alpha 0.5, t_max 200, PPO 10 x 8, "
        "then the 20 held-out clips x 3 "
        "episodes with deterministic actions for the initial and the final policy. Each variant names its "
        "changes from that (`VARIANTS` in the script); `kinked:` rows play the takeover workload with its "
        "longitudinal action map before 2026-12-01 (3 m/s^2 per unit forward, 6 braking), the others with "
        "the map it has now (6 per unit both ways, capped at +3). `crash50` raises the workload's collision "
        "penalty from 10 to 50, so its returns are in other units than the other rows' (its margins and "
        "rates compare). Train s is wall-clock of the iterations, two runs at a time on 2 cores, some "
        "beside other work: not a speed figure. Every run is a line of runs.jsonl.\n\n"
        "`ttc1` adds a dense term before a crash: 1 per step at a time to collision of 0 with the lead, "
        "falling to 0 at 3 s (sim_server/takeover/reward.py `TTC_WEIGHT`, 0 in the workload). `mb32` is "
        "CleanRL's 32 minibatches instead of 8 (four times the gradient steps, about twice the wall time). "
        "The `mb32` runs were made after the lock-step rounds began to act per server on noise streams of "
        "their own (commit 4fff3ac), so their seeds draw other actions than the rows before them; their "
        "`code` field says so.\n\n" + text + "\n"
    )


if __name__ == "__main__":
    main()
