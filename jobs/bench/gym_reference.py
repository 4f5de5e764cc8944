"""The external reference of `fast bench sampling`: Gymnasium's own `AsyncVectorEnv` with
per-environment autoreset, stepping the takeover workload (same clips, same cost preset, same
policy) at the same clip counts as the broker's modes. See docs/gym_reference.md.

One process per env (`TakeoverGymEnv`); `servers` groups of envs share a reset engine, a load
channel and a map cache, as the slots of one `fast sim-server` do. Envs are spread over the
servers round-robin, like the benchmark's `spread_slots`. The same protocol as the broker's
measurements: a fresh vector env, a warm-up (initial resets, map cache), then one measured
stretch of `samples` valid transitions. Process start-up is measured apart (`startup_s`) and is
in neither.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Sequence
from functools import partial

import gymnasium as gym
import numpy as np

from broker.dealer import HOLDOUT_EVERY, ClipDealer
from broker.metrics import IterationStats
from broker.policy_runner import PolicyRunner
from fast.v1 import simulator_pb2 as pb
from sim_server.cost_model import cost_model_config
from sim_server.takeover.catalog import build_catalog
from sim_server.takeover.gym_env import ServerCostResources, TakeoverGymEnv, space_spec

MODE = "gym-async"


def measure_async_vector(
    num_envs: int,
    servers: int,
    preset: str,
    policy_weights: bytes | None,
    hidden_sizes: Sequence[int],
    samples: int,
    seed: int,
    *,
    warmup_samples: int = 256,
    num_clips: int = 200,
    catalog_seed: int = 0,
    holdout_every: int = HOLDOUT_EVERY,
    context: str | None = "forkserver",
) -> dict:
    """Sample `samples` valid transitions with an AsyncVectorEnv of `num_envs` TakeoverGymEnvs.

    Returns IterationStats.summary()'s keys (mode "gym-async"), and:
    - `time_efficiency`: the critical-path figure, as the broker's lock-step modes define it
      (wall time awaiting Step over wall time awaiting Step or Reset; also under
      `time_efficiency_critical_path`). Inside one vector step the two cannot be told apart by
      wall time (each env steps, then resets itself), so it is estimated:
      per vector step, the env that took longest (step + reset) held the call up; its reset
      seconds are the reset part, the rest of the call's wall time (its step, pipes and shared
      memory) the step part, just as the broker counts transport into the call it awaits.
    - `time_efficiency_env_sum`: the envs' own step seconds over their step + reset seconds,
      summed over every env and vector step (the per-slot sums the broker uses for `ver`). It
      hides how a reset stalls the whole vector step (one env resets, the others wait), so it
      is the higher of the two whenever resets are rare per env but frequent per vector step;
    - `time_split_s`: stepping / resetting are the critical env's step / reset seconds summed
      over vector steps, transport the rest of the vector calls' wall time (IPC), inference
      the policy's forward passes, waiting the remainder;
    - `env_step_s_sum`, `env_reset_s_sum`: the per-env sums behind `time_efficiency_env_sum`;
    - `startup_s` (process start-up and catalog building), `warmup_s`, `servers`, `preset`.
    Extra keyword arguments: the catalog (`num_clips`, `catalog_seed`, as `fast sim-server`
    builds it), the clips held out of training (`holdout_every`, as the broker's ClipDealer),
    the multiprocessing `context`: "forkserver" by default, because forking the calling process
    itself breaks when it holds gRPC channels (the benchmark's broker pool does: the forked
    envs die at start-up); the fork server is a clean process that imports the env module once
    and forks every env from it (Python 3.14's default start method on Linux).
    """
    if num_envs < 1 or servers < 1 or samples < 1 or warmup_samples < 0:
        raise ValueError(
            f"{num_envs=}, {servers=}, {samples=}, {warmup_samples=}: "
            "need num_envs, servers, samples >= 1, warmup_samples >= 0"
        )
    cost = cost_model_config(preset)
    train_clips = ClipDealer(num_clips, holdout_every=holdout_every, seed=seed).train_clips

    start_method = multiprocessing.get_context(context).get_start_method()
    started = time.perf_counter()
    # A forked env inherits the parent's catalog for free; any other start method would pickle
    # its 12 MB to every env, so there each env builds its own (the same: a pure function of the seed).
    if start_method == "fork":
        catalog_args = {"catalog": build_catalog(catalog_seed, num_clips)}
    else:
        catalog_args = {"catalog_seed": catalog_seed, "num_clips": num_clips}
    if start_method == "forkserver":
        # Envs forked from the server find the env module imported (ignored once the server runs).
        multiprocessing.get_context("forkserver").set_forkserver_preload(["sim_server.takeover.gym_env"])
    resources = [ServerCostResources.create(cost.map_cache_size, context) for _ in range(servers)]
    vector: gym.vector.AsyncVectorEnv | None = None
    failed = True
    try:
        env_fns = [
            partial(TakeoverGymEnv, train_clips, cost=cost, server=resources[i % servers], **catalog_args)
            for i in range(num_envs)
        ]
        # Returns once every env process has built its env (it checks their spaces).
        vector = gym.vector.AsyncVectorEnv(env_fns, context=context, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
        startup_s = time.perf_counter() - started
        runner = PolicyRunner(
            space_spec(vector.single_observation_space),
            space_spec(vector.single_action_space),
            tuple(hidden_sizes),
            seed=seed,
        )
        if policy_weights is not None:
            runner.load(0, policy_weights)

        sampler = _VectorSampler(vector, runner)
        warm, measured = IterationStats(MODE, num_envs), IterationStats(MODE, num_envs)
        # The initial reset belongs to the warm-up, as in the broker's bench; with none, to the measurement.
        env_seconds = sampler.reset(seed, warm if warmup_samples > 0 else measured)
        if warmup_samples > 0:
            sampler.sample(warmup_samples, warm)
            env_seconds = np.zeros(2)
        env_seconds += sampler.sample(samples, measured)
        failed = False
    finally:
        if vector is not None:
            vector.close(terminate=failed)
        for server in resources:
            server.close()

    summary = measured.summary()
    env_step_s, env_reset_s = (float(x) for x in env_seconds)
    # `time_efficiency` stays the critical-path estimate, defined like the broker's lock-step
    # modes (a vector step waits for every env), so the table compares like with like.
    summary["time_efficiency_critical_path"] = summary["time_efficiency"]
    summary["time_efficiency_env_sum"] = (
        env_step_s / (env_step_s + env_reset_s) if env_step_s + env_reset_s > 0 else 1.0
    )
    summary.update(
        env_step_s_sum=env_step_s,
        env_reset_s_sum=env_reset_s,
        startup_s=startup_s,
        warmup_s=warm.wall_s,
        servers=servers,
        preset=preset,
    )
    return summary


class _VectorSampler:
    """Drives the vector env with the policy and fills IterationStats as the broker's samplers do.

    `reset` and `sample` return the envs' own seconds [stepping, resetting] summed over envs.
    """

    def __init__(self, vector: gym.vector.AsyncVectorEnv, runner: PolicyRunner) -> None:
        self.vector, self.runner = vector, runner
        self.num_envs = vector.num_envs
        self.obs: np.ndarray | None = None

    def reset(self, seed: int, stats: IterationStats) -> np.ndarray:
        """The initial reset of every env, each seeded from its own SeedSequence child of `seed`
        (so each shuffles its own clip list, and runs with seeds s and s + 1 share no env seed)."""
        env_seeds = [int(x) for x in np.random.SeedSequence(seed).generate_state(self.num_envs) & 0x7FFFFFFF]
        t0 = time.perf_counter()
        self.obs, info = self.vector.reset(seed=env_seeds)
        wall = time.perf_counter() - t0
        stats.wall_s += wall
        stats.reset_wall_s += wall
        stats.reset_server_s += float(np.max(info["reset_s"]))
        stats.slot_resets += self.num_envs
        stats.reset_calls += self.num_envs
        return np.array([0.0, float(np.sum(info["reset_s"]))])

    def sample(self, target_valid: int, stats: IterationStats) -> np.ndarray:
        """Step until `stats` holds `target_valid` valid transitions."""
        env_seconds = np.zeros(2)
        started = time.perf_counter()
        while stats.valid < target_valid:
            t0 = time.perf_counter()
            decision = self.runner.act(self.obs)
            t1 = time.perf_counter()
            self.obs, _, terminated, truncated, info = self.vector.step(decision.env_actions)
            call_s = time.perf_counter() - t1
            stats.inference_s += t1 - t0

            ended = terminated | truncated
            final = info.get("final_info", {})
            # Same-step autoreset: an ended env's step info is under "final_info", its reset's on top.
            step_s = np.where(ended, final.get("step_s", 0.0), info["step_s"])
            reset_s = np.where(ended, info["reset_s"], 0.0)
            env_seconds += (step_s.sum(), reset_s.sum())
            critical = int(np.argmax(step_s + reset_s))  # the env that held this vector step up
            stats.reset_wall_s += float(reset_s[critical])
            stats.reset_server_s += float(reset_s[critical])
            stats.step_wall_s += call_s - float(reset_s[critical])
            stats.step_server_s += float(step_s[critical])
            stats.transitions += self.num_envs  # no padding: every env stepped a live episode
            stats.valid += self.num_envs

            for i in np.flatnonzero(ended):
                metrics = {k: float(v[i]) for k, v in final["episode_metrics"].items() if not k.startswith("_")}
                summary = pb.EpisodeSummary(
                    length=int(metrics["length"]), episode_return=metrics["return"],
                    terminated=bool(terminated[i]), metrics=metrics,
                )  # fmt: skip
                stats.record_episode(int(metrics["length"]), "terminated" if terminated[i] else "clip_end", summary)
            stats.slot_resets += int(ended.sum())
            stats.reset_calls += int(ended.sum())
        stats.wall_s += time.perf_counter() - started
        return env_seconds
