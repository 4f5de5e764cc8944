"""The contract between a simulator server and the environment it serves.

A `SlotEnv` is vectorised over a fixed number of *slots*. A slot holds at most one live
episode; which clip it plays is decided by the caller (the broker), never by the env.
The server validates every request (slot ids, episode state, action shape/dtype/bounds)
before it reaches the env, so an env may assume well-formed input.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from fast.spaces import SpaceSpec


@dataclass
class StepResult:
    """What one step of k slots returns; every array's first axis is the k stepped slots."""

    observations: np.ndarray  # [k, *obs_shape], the observation after the step
    rewards: np.ndarray  # [k] float32
    terminated: np.ndarray  # [k] bool: the episode ended by the MDP (collision, off-road)
    truncated: np.ndarray  # [k] bool: the episode was cut by a time limit (clip end)
    # Per stepped slot: the closed-loop metrics of the episode that just ended, else None.
    # Every dict holds at least "length" (steps) and "return" (sum of rewards).
    episode_metrics: list[dict[str, float] | None] = field(default_factory=list)


class SlotEnv(Protocol):
    """A vectorised environment over `num_slots` slots, playing clips of a catalog."""

    observation_space: SpaceSpec
    action_space: SpaceSpec
    num_slots: int
    num_clips: int

    def reset(self, slot_ids: np.ndarray, clip_ids: np.ndarray, seeds: np.ndarray) -> np.ndarray:
        """Start a new episode of clip_ids[j] with seeds[j] in slot_ids[j]; returns [k, *obs_shape]."""
        ...

    def step(self, slot_ids: np.ndarray, actions: np.ndarray) -> StepResult:
        """Advance the live episodes of slot_ids by one step with actions [k, *action_shape]."""
        ...

    def map_id(self, clip_id: int) -> int:
        """Which map (HD map, town) a clip plays on; the cost model caches loads per map."""
        ...
