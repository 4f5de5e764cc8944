"""Batched policy inference for the broker: one forward pass for every slot that acts.

Actions are stored in the batch as sampled (the learner recomputes their log-probs) and sent
to the simulators clipped to the action space's bounds, in its dtype.

For Box actions the Gaussian is sampled and scored by hand rather than through
torch.distributions: on the small batches of a lock-step step (tens of rows) building the
distribution objects costs five times the two MLPs. tests/test_policy_runner.py checks the
log-probs against ActorCritic.get_action_and_value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from fast.spaces import SpaceSpec
from learner.policy import ActorCritic, import_weights


_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


@dataclass
class Decision:
    actions: np.ndarray  # [k, *act_shape] as sampled (float32 for Box, int64 for Discrete)
    env_actions: np.ndarray  # [k, *act_shape] clipped to bounds, in the action space's dtype
    logprobs: np.ndarray  # [k] float32
    values: np.ndarray  # [k] float32


class PolicyRunner:
    def __init__(self, observation_space: SpaceSpec, action_space: SpaceSpec, hidden_sizes: tuple[int, ...], seed: int = 0) -> None:
        self.observation_space = observation_space
        self.action_space = action_space
        self.policy = ActorCritic(observation_space.shape, action_space, hidden_sizes)
        self.policy.eval()
        self.version = -1
        self._generator = torch.Generator().manual_seed(seed)
        torch.manual_seed(seed)
        if action_space.kind == "box":
            self._low = np.broadcast_to(action_space.low, action_space.shape).astype(np.float32)
            self._high = np.broadcast_to(action_space.high, action_space.shape).astype(np.float32)

    def load(self, version: int, weights: bytes) -> None:
        import_weights(self.policy, weights)
        self.version = version

    @torch.no_grad()
    def act(self, obs: np.ndarray) -> Decision:
        """Sample actions for obs [k, *obs_shape] in one forward pass."""
        x = torch.as_tensor(obs, dtype=torch.float32)
        if self.action_space.kind != "box":
            action, logprob, _, value = self.policy.get_action_and_value(x)
        else:
            flat = x.flatten(start_dim=1)
            mean = self.policy.actor_mean(flat)  # [k, action_dim]
            log_std = self.policy.actor_logstd.expand_as(mean)
            noise = torch.randn(mean.shape, generator=self._generator)
            action = (mean + log_std.exp() * noise).reshape(-1, *self.action_space.shape)
            # log N(a; mean, std) summed over independent dims, with (a - mean) / std = noise.
            logprob = (-0.5 * noise.square() - log_std - _HALF_LOG_2PI).sum(-1)
            value = self.policy.critic(flat).squeeze(-1)
        actions = action.numpy()
        return Decision(
            actions=actions.astype(np.int64 if self.action_space.kind == "discrete" else np.float32, copy=False),
            env_actions=self.to_env(actions),
            logprobs=logprob.numpy().astype(np.float32, copy=False),
            values=value.numpy().astype(np.float32, copy=False),
        )

    @torch.no_grad()
    def act_deterministic(self, obs: np.ndarray) -> np.ndarray:
        """The mode of the policy (mean action / argmax), for evaluation; env-ready."""
        flat = torch.as_tensor(obs, dtype=torch.float32).flatten(start_dim=1)
        if self.action_space.kind == "box":
            mean = self.policy.actor_mean(flat).reshape(-1, *self.action_space.shape)
            return self.to_env(mean.numpy())
        return self.policy.actor_logits(flat).argmax(-1).numpy().astype(np.int64)

    @torch.no_grad()
    def value(self, obs: np.ndarray) -> np.ndarray:
        if len(obs) == 0:
            return np.zeros(0, dtype=np.float32)
        return self.policy.get_value(torch.as_tensor(obs, dtype=torch.float32)).numpy().astype(np.float32, copy=False)

    def to_env(self, actions: np.ndarray) -> np.ndarray:
        if self.action_space.kind == "discrete":
            return actions.astype(np.int64, copy=False)
        return np.clip(actions, self._low, self._high).astype(self.action_space.dtype, copy=False)
