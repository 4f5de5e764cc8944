"""Train the takeover workload with DPSA and SMPO in one process: FAST's loop, top to bottom.

Read this first. `fast train` runs this same loop as services that talk over gRPC (simulator
servers, a broker, a learner). Here every piece runs in this process, in the order one
iteration runs them:

1. Simulators. The takeover workload (sim_server/takeover/: vehicles replaying recorded clips,
   one episode per clip) runs in a `Simulator` (sim_server/simulator.py), whose slots are
   stepped in batches. The broker reaches it through `InProcessPool` (broker/in_process.py),
   which answers as the gRPC pool does, without sockets.
2. Sampling with DPSA (mode `fast`, broker/samplers/fast.py). All slots step in lock-step on
   the policy's actions. A slot whose episode ended is padded (masked out) until the round
   ends: when a share `alpha` of the slots ended, or after `t_max` steps. Then the ended slots
   are reset onto new clips while the live episodes carry on. The result is a masked [T, N]
   batch of at least `samples` valid transitions.
3. Learning with SMPO (learner/ppo.py, learner/smpo.py): PPO on the valid transitions only:
   masked GAE, then minibatches of the valid steps, so padding changes nothing.
4. The new weights go back to the sampler's `PolicyRunner` for the next iteration.

At the end the initial and the final policy play the held-out clips, which training never
sees (broker/evaluate.py), with deterministic actions.

    .venv/bin/python examples/train_in_process.py --iterations 30
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's packages, not an installed copy

from broker.dealer import HOLDOUT_EVERY, ClipDealer  # noqa: E402
from broker.evaluate import EvaluationSession, summarize  # noqa: E402
from broker.in_process import InProcessPool  # noqa: E402
from broker.policy_runner import PolicyRunner  # noqa: E402
from broker.samplers import make_sampler  # noqa: E402
from learner.batch import RolloutBatch  # noqa: E402
from learner.policy import ActorCritic, export_weights  # noqa: E402
from learner.ppo import PPOConfig, PPOLearner  # noqa: E402
from sim_server.cost_model import CostModel, cost_model_config  # noqa: E402
from sim_server.environments import make_env  # noqa: E402
from sim_server.simulator import Simulator  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """`fast train`'s defaults, on one simulator of `--slots` slots."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--iterations", type=int, default=30, help="sample -> update rounds")
    p.add_argument("--slots", type=int, default=10, help="parallel episodes (simulator slots)")
    p.add_argument("--samples", type=int, default=2048, help="valid transitions per iteration")
    p.add_argument("--alpha", type=float, default=0.5, help="DPSA: end a round when this share of slots ended")
    p.add_argument("--t-max", type=int, default=200, help="DPSA: ... or after this many steps")
    p.add_argument("--hidden", type=int, nargs="+", default=[64, 64], help="the policy's hidden layers")
    p.add_argument("--update-epochs", type=int, default=10)
    p.add_argument("--num-minibatches", type=int, default=8)
    p.add_argument("--eval-episodes", type=int, default=3, help="episodes per held-out clip; 0: no evaluation")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


async def train(args: argparse.Namespace) -> dict:
    torch.set_num_threads(1)  # small networks: one thread is as fast, and leaves the rest of the machine alone

    # 1. The simulator, in this process: the takeover workload, no emulated costs.
    simulator = Simulator(make_env("takeover", args.slots, seed=args.seed), CostModel(cost_model_config("off")))
    pool = InProcessPool([simulator])
    obs_space, act_space = pool.observation_space, pool.action_space

    # The learner's policy (the learner service seeds and builds the same) and the broker's copy of it.
    hidden = tuple(args.hidden)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(args.seed)
        policy = ActorCritic(tuple(obs_space.shape), act_space, hidden, init_log_std=-0.5)
    ppo = PPOConfig(update_epochs=args.update_epochs, num_minibatches=args.num_minibatches, seed=args.seed)
    learner = PPOLearner(policy, ppo, device="cpu")
    runner = PolicyRunner(obs_space, act_space, hidden, seed=args.seed)  # numpy inference for the sampler
    runner.load(0, export_weights(learner.policy))

    # Held-out clips for the evaluation: the dealer never gives them to training.
    evaluation = EvaluationSession(
        pool, holdout_every=HOLDOUT_EVERY, episodes_per_clip=args.eval_episodes, seed=args.seed
    )
    initial = summarize(await evaluation.play(runner)) if args.eval_episodes else {}

    # 2. The DPSA sampler over every slot of the pool.
    dealer = ClipDealer(pool.num_clips, holdout_every=HOLDOUT_EVERY, seed=args.seed)
    sampler = make_sampler(
        "fast", pool, runner, dealer, samples_per_iteration=args.samples, alpha=args.alpha, t_max=args.t_max
    )

    started = time.perf_counter()
    for version in range(args.iterations):
        arrays, stats = await sampler.sample()  # {"obs": [T, N, ...], ..., "valid_mask": [T, N]}
        # 3. One SMPO update on the batch sampled with policy `version`.
        update = learner.update(RolloutBatch.from_numpy({**arrays, "policy_version": version}))
        # 4. The next iteration samples with the new weights.
        runner.load(version + 1, export_weights(learner.policy))
        s = stats.summary()
        print(
            f"iteration {version + 1:3d}: {s['valid_transitions']} valid of {s['transitions']} "
            f"(validity {s['validity']:.2f}), {s['episodes']} episodes ended, "
            f"return {s['episode_return_mean']:7.2f}, value loss {update['value_loss']:.3f}",
            flush=True,
        )
    train_s = time.perf_counter() - started

    final = summarize(await evaluation.play(runner)) if args.eval_episodes else {}
    await pool.close()
    for name, summary in (("initial", initial), ("final", final)):
        if summary:
            print(
                f"{name} policy on {summary['episodes']} held-out episodes: return {summary['return_mean']:.2f}, "
                f"collided {summary['collided_rate']:.2f}, off road {summary['off_road_rate']:.2f}"
            )
    print(f"trained {args.iterations} iterations in {train_s:.1f} s")
    return {"iterations": args.iterations, "train_s": train_s, "initial": initial, "final": final}


if __name__ == "__main__":
    asyncio.run(train(parse_args()))
