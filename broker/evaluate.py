"""Closed-loop evaluation: play every (clip, seed) episode to its end, many at once over the slots.

A policy is judged on whole episodes, so nothing here truncates or pads: a slot plays one
episode until the environment ends it (termination or the clip's end), then takes the next
pending one. All busy slots step in lock-step, one forward pass per step. The episode list
(clip ids and episode seeds) depends only on `clips`, `episodes_per_clip` and `seed`, so two
policies evaluated with the same arguments face exactly the same episodes.

The policy acts deterministically (`PolicyRunner.act_deterministic`: the mean action); with
`runner=None` actions are uniform over the action space from a seeded generator: the random
baseline that a trained policy must beat.

`EvaluationSession` is the one way a job evaluates: a pool kept open (the simulator servers at
some addresses, or any `SlotPool`), the held-out clips of its catalog, and any number of
policies played on the same episodes. `fast train`'s final evaluation, `fast compare` and
`fast bench train`'s learning curve all use it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import numpy as np

from broker.dealer import holdout_clips
from broker.policy_runner import PolicyRunner
from broker.pool import SimulatorPool
from broker.slots import SlotPool
from fast.rpc import Credentials
from fast.spaces import random_actions


class EvaluationError(RuntimeError):
    """Evaluation could not finish (a simulator server failed); the message names it."""


def evaluation_episodes(clips: np.ndarray, episodes_per_clip: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(clip ids, episode seeds) of every evaluation episode, in the order they are played."""
    clip_ids = np.repeat(np.asarray(clips, dtype=np.int64), episodes_per_clip)
    # A generator of its own, so the episode seeds do not depend on who else draws from `seed`.
    seeds = np.random.default_rng([seed, 0xE7A1]).integers(0, 2**31 - 1, size=clip_ids.size, dtype=np.int64)
    return clip_ids, seeds


class EvaluationSession:
    """Policies played on the held-out episodes of one pool: the clips `c` with
    `c % holdout_every == holdout_every - 1` (broker/dealer.py), `episodes_per_clip` episodes of
    each, their seeds drawn from `seed` (`evaluation_episodes`)."""

    def __init__(self, pool: SlotPool, *, holdout_every: int, episodes_per_clip: int, seed: int) -> None:
        self.pool = pool
        self.holdout_every = holdout_every
        self.episodes_per_clip = episodes_per_clip
        self.seed = seed
        self.clips = holdout_clips(pool.num_clips, holdout_every)  # may be empty: `require_clips`

    @classmethod
    @asynccontextmanager
    async def connect(
        cls,
        addresses: list[str],
        *,
        holdout_every: int,
        episodes_per_clip: int,
        seed: int,
        credentials: Credentials | None = None,
    ) -> AsyncIterator[EvaluationSession]:
        """A session over the simulator servers at `addresses`, closed on leaving (`credentials`: their
        run token; None: the environment's)."""
        pool = SimulatorPool(credentials=credentials)
        try:
            for address in addresses:
                await pool.add(address)
            yield cls(pool, holdout_every=holdout_every, episodes_per_clip=episodes_per_clip, seed=seed)
        finally:
            await pool.close()

    @property
    def num_clips(self) -> int:
        return self.pool.num_clips

    def require_clips(self) -> None:
        """RuntimeError when the catalog holds no held-out clip to evaluate on."""
        if self.clips.size == 0:
            raise RuntimeError(f"no held-out clip among {self.num_clips} with holdout_every={self.holdout_every}")

    def policy(self, hidden_sizes: tuple[int, ...], version: int, weights: bytes) -> PolicyRunner:
        """A runner of these weights (learner.policy.export_weights bytes) for this pool's spaces."""
        runner = PolicyRunner(self.pool.observation_space, self.pool.action_space, hidden_sizes, seed=self.seed)
        runner.load(version, weights)
        return runner

    async def play(self, runner: PolicyRunner | None) -> list[dict]:
        """Every held-out episode played by `runner` (None: random actions), as `evaluate` gives them."""
        return await evaluate(self.pool, runner, self.clips, self.episodes_per_clip, self.seed)


async def evaluate(
    pool: SlotPool,
    runner: PolicyRunner | None,
    clips: np.ndarray,
    episodes_per_clip: int,
    seed: int,
) -> list[dict]:
    """Play every episode to its end; one dict per episode, in the order of `evaluation_episodes`.

    Each dict holds `clip_id`, `seed`, `return` (sum of the rewards received), `length` (steps
    taken), `terminated` (False: the clip ran out), `collided` and `off_road` when the
    environment reports them, and every closed-loop metric of its EpisodeSummary.
    """
    if pool.num_slots == 0:
        raise EvaluationError("the simulator pool has no slot; add a server before evaluating")
    if episodes_per_clip < 0:
        raise ValueError(f"episodes_per_clip must be >= 0, got {episodes_per_clip}")
    clip_ids, seeds = evaluation_episodes(clips, episodes_per_clip, seed)
    num_slots = pool.num_slots
    # Random actions come from one generator per episode, so an episode's actions do not depend
    # on which slot plays it or what the other slots do: the baseline is the same for any layout.
    action_rngs: list[np.random.Generator | None] = [None] * num_slots
    obs = np.zeros((num_slots, *pool.observation_space.shape), dtype=pool.observation_space.dtype)
    episode_of_slot = np.full(num_slots, -1, dtype=np.int64)  # index into clip_ids; -1: free
    returns = np.zeros(num_slots, dtype=np.float64)
    lengths = np.zeros(num_slots, dtype=np.int64)
    results: list[dict | None] = [None] * clip_ids.size
    next_episode = 0

    while next_episode < clip_ids.size or (episode_of_slot >= 0).any():
        # Free slots take the next pending episodes (one batched Reset per server).
        free = np.flatnonzero(episode_of_slot < 0)[: clip_ids.size - next_episode]
        if free.size:
            picked = np.arange(next_episode, next_episode + free.size)
            reset = await pool.reset(free, clip_ids[picked], seeds[picked], batched=True)
            _raise_on_failure(pool, free, reset.failed, "Reset")
            obs[free] = reset.observations
            episode_of_slot[free] = picked
            returns[free], lengths[free] = 0.0, 0
            for slot, index in zip(free, picked):
                action_rngs[slot] = np.random.default_rng([seed, 0xAC7, int(index)])
            next_episode += free.size

        busy = np.flatnonzero(episode_of_slot >= 0)
        if runner is None:
            actions = np.concatenate([random_actions(pool.action_space, 1, action_rngs[slot]) for slot in busy])
        else:
            actions = runner.act_deterministic(obs[busy])
        step = await pool.step(busy, actions)
        _raise_on_failure(pool, busy, step.failed, "Step")
        obs[busy] = step.observations
        returns[busy] += step.rewards
        lengths[busy] += 1

        for j in np.flatnonzero(step.terminated | step.truncated):
            slot = int(busy[j])
            index = int(episode_of_slot[slot])
            summary = step.episodes.get(slot)
            metrics = {name: float(value) for name, value in summary.metrics.items()} if summary is not None else {}
            results[index] = {
                **metrics,
                "clip_id": int(clip_ids[index]),
                "seed": int(seeds[index]),
                "return": float(returns[slot]),
                "length": int(lengths[slot]),
                "terminated": bool(step.terminated[j]),
            }
            episode_of_slot[slot] = -1
    return [r for r in results if r is not None]


def summarize(episodes: list[dict]) -> dict:
    """Means over episodes of return, length, collision and off-road rates, and every numeric metric."""
    if not episodes:
        return {"episodes": 0}
    names = sorted(
        {k for e in episodes for k, v in e.items() if isinstance(v, (int, float)) and k not in ("clip_id", "seed")}
    )
    out: dict = {"episodes": len(episodes)}
    for name in names:
        values = [float(e[name]) for e in episodes if name in e]
        out[f"{name}_mean"] = float(np.mean(values))
    # The headline rates under the names the report uses (absent for environments without them).
    for name in ("collided", "off_road"):
        if f"{name}_mean" in out:
            out[f"{name}_rate"] = out.pop(f"{name}_mean")
    return out


def _raise_on_failure(pool: SlotPool, slots: np.ndarray, failed: np.ndarray, call: str) -> None:
    if failed.any():
        servers = sorted({pool.servers[pool.slot_server[s]].address for s in slots[failed]})
        errors = "; ".join(f"{pool.servers[pool.slot_server[s]].last_error}" for s in slots[failed][:1])
        raise EvaluationError(
            f"{call} failed on simulator server(s) {', '.join(servers)} ({errors}); "
            "evaluation needs every server up until it ends"
        )
