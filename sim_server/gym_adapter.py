"""Serve any registered Gymnasium environment as a SlotEnv: one env instance per slot.

Gymnasium has no clip catalog, so a clip id selects a reset-seed stream: clip c with
episode seed s resets with seed = SeedSequence([c, s]), deterministic and distinct per clip.
Spaces translate to the proto's: Box keeps its shape, dtype and bounds; Discrete becomes
an int64 scalar in [0, n).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

from sim_server.env_api import SpaceSpec, StepResult


def space_spec(space: gym.Space, *, what: str) -> SpaceSpec:
    if isinstance(space, gym.spaces.Box):
        return SpaceSpec("box", tuple(space.shape), np.dtype(space.dtype), space.low.copy(), space.high.copy())
    if isinstance(space, gym.spaces.Discrete):
        if int(space.start) != 0:
            raise ValueError(f"{what} space Discrete(start={space.start}) is not supported; only start=0")
        return SpaceSpec("discrete", (), np.dtype(np.int64), n=int(space.n))
    raise ValueError(f"{what} space {space} is not supported; FAST serves Box and Discrete spaces")


class GymSlotEnv:
    """`env`: a Gymnasium id (made with `env_kwargs`) or a factory called once per slot."""

    def __init__(
        self,
        env: str | Callable[[], gym.Env],
        num_slots: int,
        num_clips: int = 1000,
        *,
        name: str | None = None,
        **env_kwargs: Any,
    ) -> None:
        make = functools.partial(gym.make, env, **env_kwargs) if isinstance(env, str) else env
        name = name or (f"gym:{env}" if isinstance(env, str) else repr(env))
        try:
            self._envs = [make() for _ in range(num_slots)]
        except gym.error.Error as exc:
            raise ValueError(f"{name} cannot be made: {exc}") from None
        first = self._envs[0]
        self.observation_space = space_spec(first.observation_space, what="observation")
        self.action_space = space_spec(first.action_space, what="action")
        self.num_slots = num_slots
        self.num_clips = num_clips
        self._returns = np.zeros(num_slots, dtype=np.float64)
        self._lengths = np.zeros(num_slots, dtype=np.int64)
        self._clips = np.zeros(num_slots, dtype=np.int64)

    def map_id(self, clip_id: int) -> int:
        return 0

    def _obs(self, obs: Any) -> np.ndarray:
        return np.asarray(obs, dtype=self.observation_space.dtype).reshape(self.observation_space.shape)

    def reset(self, slot_ids: np.ndarray, clip_ids: np.ndarray, seeds: np.ndarray) -> np.ndarray:
        observations = []
        for slot, clip, seed in zip(slot_ids, clip_ids, seeds):
            episode_seed = int(np.random.SeedSequence([int(clip), int(seed) & 0xFFFFFFFF]).generate_state(1)[0])
            obs, _ = self._envs[slot].reset(seed=episode_seed)
            observations.append(self._obs(obs))
            self._returns[slot], self._lengths[slot], self._clips[slot] = 0.0, 0, clip
        return np.stack(observations)

    def step(self, slot_ids: np.ndarray, actions: np.ndarray) -> StepResult:
        k = slot_ids.size
        observations = np.empty((k, *self.observation_space.shape), dtype=self.observation_space.dtype)
        rewards = np.empty(k, dtype=np.float32)
        terminated = np.empty(k, dtype=bool)
        truncated = np.empty(k, dtype=bool)
        metrics: list[dict[str, float] | None] = []
        for j, slot in enumerate(slot_ids):
            action = actions[j].item() if self.action_space.kind == "discrete" else actions[j]
            obs, reward, term, trunc, _ = self._envs[slot].step(action)
            observations[j] = self._obs(obs)
            rewards[j], terminated[j] = reward, term
            truncated[j] = trunc and not term
            self._returns[slot] += float(reward)
            self._lengths[slot] += 1
            ended = terminated[j] or truncated[j]
            metrics.append(
                {
                    "length": float(self._lengths[slot]),
                    "return": float(self._returns[slot]),
                    "clip_id": float(self._clips[slot]),
                }
                if ended
                else None
            )
        return StepResult(observations, rewards, terminated, truncated, metrics)

    def close(self) -> None:
        for env in self._envs:
            env.close()
