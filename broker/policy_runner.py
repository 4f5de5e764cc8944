"""Batched policy inference for the broker: one forward pass for every slot that acts.

Actions are stored in the batch as sampled (the learner recomputes their log-probs) and sent
to the simulators clipped to the action space's bounds, in its dtype.

Inference runs in numpy on a copy of the weights made at every load: on the small batches of
a lock-step step (tens of rows) torch's per-op overhead and torch.distributions cost several
times the arithmetic (measured: 634 us per 10-row step through get_action_and_value, see
tests and docs/metrics.md for the current figure). The Gaussian is sampled and scored by
hand; tests/test_policy_runner.py checks log-probs and values against ActorCritic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from fast.spaces import SpaceSpec
from learner.policy import ActorCritic, ObservationNormalizer, import_weights

_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


@dataclass
class Decision:
    actions: np.ndarray  # [k, *act_shape] as sampled (float32 for Box, int64 for Discrete)
    env_actions: np.ndarray  # [k, *act_shape] clipped to bounds, in the action space's dtype
    logprobs: np.ndarray  # [k] float32
    values: np.ndarray  # [k] float32


class PolicyRunner:
    def __init__(
        self,
        observation_space: SpaceSpec,
        action_space: SpaceSpec,
        hidden_sizes: tuple[int, ...],
        seed: int = 0,
        *,
        obs_norm: bool = False,
    ) -> None:
        self.observation_space = observation_space
        self.action_space = action_space
        torch.manual_seed(seed)
        self.policy = ActorCritic(observation_space.shape, action_space, hidden_sizes, obs_norm=obs_norm)
        self.policy.eval()
        self.version = -1
        self._seed = seed
        self._rng = np.random.default_rng(seed)
        self._streams: dict[int, np.random.Generator] = {}
        self._snapshot_weights()
        if action_space.kind == "box":
            self._low = np.broadcast_to(action_space.low, action_space.shape).astype(np.float32)
            self._high = np.broadcast_to(action_space.high, action_space.shape).astype(np.float32)

    def load(self, version: int, weights: bytes) -> None:
        import_weights(self.policy, weights)
        self.version = version
        self._snapshot_weights()

    def _snapshot_weights(self) -> None:
        """numpy copies of the MLPs ([(W^T, b), ...], tanh between layers) and the log-std."""

        def layers(seq: torch.nn.Sequential) -> list[tuple[np.ndarray, np.ndarray]]:
            return [
                (m.weight.detach().numpy().T.copy(), m.bias.detach().numpy().copy())
                for m in seq
                if isinstance(m, torch.nn.Linear)
            ]

        self._critic = layers(self.policy.critic)
        normalizer = self.policy.obs_normalizer
        self._obs_mean = self._obs_std = None
        if normalizer is not None:  # the statistics shipped inside the weights (learner/policy.py)
            self._obs_mean = normalizer.mean.numpy().astype(np.float32)
            self._obs_std = np.sqrt(normalizer.var.numpy() + 1e-8).astype(np.float32)
        if self.action_space.kind == "box":
            self._actor = layers(self.policy.actor_mean)
            self._log_std = self.policy.actor_logstd.detach().numpy()[0].copy()  # [action_dim]
            self._std = np.exp(self._log_std)

    def _flat(self, obs: np.ndarray) -> np.ndarray:
        """obs [k, *obs_shape] as the network's input [k, flat]: flattened, normalised when the policy is."""
        flat = np.asarray(obs, dtype=np.float32).reshape(len(obs), -1)
        if self._obs_mean is None:
            return flat
        clip = ObservationNormalizer.CLIP
        return np.clip((flat - self._obs_mean) / self._obs_std, -clip, clip).astype(np.float32)

    @staticmethod
    def _forward(mlp: list[tuple[np.ndarray, np.ndarray]], x: np.ndarray) -> np.ndarray:
        for i, (w, b) in enumerate(mlp):
            x = x @ w + b
            if i < len(mlp) - 1:
                x = np.tanh(x)
        return x

    def _noise_source(self, stream: int | None) -> np.random.Generator:
        if stream is None:
            return self._rng
        if stream not in self._streams:
            self._streams[stream] = np.random.default_rng([self._seed, stream])
        return self._streams[stream]

    def act(self, obs: np.ndarray, *, stream: int | None = None) -> Decision:
        """Sample actions for obs [k, *obs_shape] in one forward pass.

        `stream`: draw the action noise from a random stream of its own (seeded from the runner's
        seed and this number) instead of the shared one. The lock-step modes with rounds act per
        simulator server, each on its server's stream, so what a slot does depends neither on when
        the other servers answer nor on which of them act in the same call."""
        if self.action_space.kind != "box":
            with torch.no_grad():  # only here: the Box path below is numpy, and no_grad costs a call's worth
                if stream is not None:
                    return self._act_discrete(obs, self._noise_source(stream))
                obs_t = torch.as_tensor(obs, dtype=torch.float32)
                action, logprob, _, value = self.policy.get_action_and_value(obs_t)
            actions = action.numpy().astype(np.int64, copy=False)
            return Decision(
                actions, self.to_env(actions), logprob.numpy().astype(np.float32), value.numpy().astype(np.float32)
            )
        flat = self._flat(obs)
        mean = self._forward(self._actor, flat)  # [k, action_dim]
        noise = self._noise_source(stream).standard_normal(mean.shape, dtype=np.float32)
        actions = (mean + self._std * noise).astype(np.float32, copy=False).reshape(-1, *self.action_space.shape)
        # log N(a; mean, std) summed over independent dims, with (a - mean) / std = noise.
        logprob = (-0.5 * noise * noise - self._log_std - _HALF_LOG_2PI).sum(-1).astype(np.float32)
        value = self._forward(self._critic, flat)[:, 0].astype(np.float32)
        return Decision(actions=actions, env_actions=self.to_env(actions), logprobs=logprob, values=value)

    def _act_discrete(self, obs: np.ndarray, rng: np.random.Generator) -> Decision:
        """Categorical sampling by inverse CDF on numpy uniforms (the separate streams' form)."""
        flat = self._flat(obs)
        logits = self.policy.actor_logits(torch.as_tensor(flat)).numpy().astype(np.float64)
        log_p = logits - logits.max(-1, keepdims=True)
        log_p -= np.log(np.exp(log_p).sum(-1, keepdims=True))
        cdf = np.cumsum(np.exp(log_p), -1)
        u = rng.random(len(flat))[:, None] * cdf[:, -1:]
        actions = np.minimum((cdf <= u).sum(-1), cdf.shape[-1] - 1).astype(np.int64)
        logprob = log_p[np.arange(len(actions)), actions].astype(np.float32)
        value = self._forward(self._critic, flat)[:, 0].astype(np.float32)
        return Decision(actions, self.to_env(actions), logprob, value)

    def noise_state(self, stream: int) -> dict:
        """Where a separate noise stream stands (to `rewind_noise` to it)."""
        return self._noise_source(stream).bit_generator.state

    def rewind_noise(self, stream: int, state: dict) -> None:
        """Put a stream back where `noise_state` saw it: draws made since are drawn again."""
        self._noise_source(stream).bit_generator.state = state

    @torch.no_grad()
    def act_deterministic(self, obs: np.ndarray) -> np.ndarray:
        """The mode of the policy (mean action / argmax), for evaluation; env-ready."""
        flat = self._flat(obs)
        if self.action_space.kind == "box":
            return self.to_env(
                self._forward(self._actor, flat).reshape(-1, *self.action_space.shape).astype(np.float32)
            )
        return self.policy.actor_logits(torch.as_tensor(flat)).argmax(-1).numpy().astype(np.int64)

    def value(self, obs: np.ndarray) -> np.ndarray:
        """V(obs) for obs [k, *obs_shape]."""
        flat = self._flat(obs)
        return self._forward(self._critic, flat)[:, 0].astype(np.float32)

    def to_env(self, actions: np.ndarray) -> np.ndarray:
        if self.action_space.kind == "discrete":
            return actions.astype(np.int64, copy=False)
        # minimum(maximum()) is np.clip's result (NaN stays NaN) without its Python wrappers.
        return np.minimum(np.maximum(actions, self._low), self._high).astype(self.action_space.dtype, copy=False)
