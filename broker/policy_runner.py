"""Batched policy inference for the broker: one forward pass for every slot that acts.

Actions are stored in the batch as sampled (the learner recomputes their log-probs) and sent
to the simulators clipped to the action space's bounds, in its dtype.

Inference runs in numpy on a copy of the weights made at every load: on the small batches of
a lock-step step (tens of rows) torch's per-op overhead and torch.distributions cost several
times the arithmetic (measured: 634 us per 10-row step through get_action_and_value, see
tests and docs/metrics.md for the current figure). The Gaussian is sampled and scored by
hand; tests/test_policy_runner.py checks log-probs and values against ActorCritic.

No torch on a Box policy: importing it costs a process about 2.5 CPU seconds (most of a broker's
start), and the Box path never needs it. The learner's weights payload (`torch.save` bytes) is read
by fast/weights.py, checked against `policy_layout` (the names, shapes and dtypes of
`ActorCritic(...).state_dict()`, written here because learner/policy.py imports torch;
tests/test_policy_runner.py fails if the two drift apart) and cast as `load_state_dict` would
cast it. torch is imported only where it is still needed: the initial weights of a runner used
before any `load` (the orthogonal init of `ActorCritic`, seeded as ever), `runner.policy` (the
torch module, for tests and exports), and Discrete policies, whose stream-less sampling draws
from torch's global RNG (`__init__` seeds and builds them as before, see there).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np

from fast.spaces import SpaceSpec
from fast.weights import read_state_dict

if TYPE_CHECKING:
    from learner.policy import ActorCritic

_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)
# learner/policy.py's ObservationNormalizer: its clip (CLIP) and the variance's epsilon in forward();
# tests/test_policy_runner.py holds the two equal.
OBS_CLIP = 10.0
OBS_EPS = 1e-8

_FLOAT32, _FLOAT64 = np.dtype(np.float32), np.dtype(np.float64)
_WEIGHTS_MISMATCH = "import_weights: weights do not match this policy"


def policy_layout(
    obs_shape: Sequence[int], action_space: SpaceSpec, hidden_sizes: Sequence[int], *, obs_norm: bool
) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """`{name: (shape, dtype)}` of `ActorCritic(obs_shape, action_space, hidden_sizes, obs_norm=obs_norm)
    .state_dict()` (learner/policy.py), in its order, without torch."""
    flat = math.prod(obs_shape)
    layout: dict[str, tuple[tuple[int, ...], np.dtype]] = {}

    def mlp(prefix: str, out_dim: int) -> None:
        widths = [flat, *hidden_sizes, out_dim]
        for i, (fan_in, fan_out) in enumerate(zip(widths, widths[1:])):  # Linear, Tanh, Linear, ...
            layout[f"{prefix}.{2 * i}.weight"] = ((fan_out, fan_in), _FLOAT32)
            layout[f"{prefix}.{2 * i}.bias"] = ((fan_out,), _FLOAT32)

    if action_space.kind == "box":
        action_dim = math.prod(action_space.shape)
        layout["actor_logstd"] = ((1, action_dim), _FLOAT32)  # a parameter of the module itself: first
        mlp("actor_mean", action_dim)
    else:
        mlp("actor_logits", action_space.n)
    mlp("critic", 1)
    if obs_norm:
        layout.update(
            {
                "obs_normalizer.mean": ((flat,), _FLOAT64),
                "obs_normalizer.var": ((flat,), _FLOAT64),
                "obs_normalizer.count": ((), _FLOAT64),
            }
        )
    return layout


def _fit_state(state: dict[str, np.ndarray], layout: dict[str, tuple[tuple[int, ...], np.dtype]]) -> dict:
    """`state` as a strict `load_state_dict` would leave the module: the same names and shapes, each
    array cast to the module's dtype (copy_ rounds as numpy's astype does); ValueError otherwise."""
    missing = [name for name in layout if name not in state]
    unexpected = [name for name in state if name not in layout]
    problems = []
    if missing:
        problems.append(f"missing key(s) {missing}")
    if unexpected:
        problems.append(f"unexpected key(s) {unexpected}")
    fitted = {}
    for name, (shape, dtype) in layout.items():
        if name not in state:
            continue
        array = state[name]
        if shape == () and array.ndim == 1 and len(array):  # load_state_dict's 1-d into 0-d allowance
            array = array[0:1].reshape(())
        if array.shape != shape:
            problems.append(
                f"size mismatch for {name}: the payload has shape {list(array.shape)}, this policy {list(shape)}"
            )
            continue
        fitted[name] = array.astype(dtype)  # a copy in every case
    if problems:
        raise ValueError(f"{_WEIGHTS_MISMATCH}: " + "; ".join(problems))
    return fitted


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
        self._hidden_sizes = tuple(hidden_sizes)
        self._obs_norm = obs_norm  # becomes True for good once weights carry a normaliser (fit_normalizer)
        self._policy: ActorCritic | None = None  # the torch module, built on first need
        self._state: dict[str, np.ndarray] | None = None  # the last weights loaded, as the module holds them
        self.version = -1
        self._seed = seed
        self._rng = np.random.default_rng(seed)
        self._streams: dict[int, np.random.Generator] = {}
        self._critic: list[tuple[np.ndarray, np.ndarray]] | None = None  # None: no weights yet
        self._obs_mean = self._obs_std = None
        if action_space.kind == "box":
            self._low = np.broadcast_to(action_space.low, action_space.shape).astype(np.float32)
            self._high = np.broadcast_to(action_space.high, action_space.shape).astype(np.float32)
        else:
            # Built now, as it always was: stream-less discrete sampling draws from torch's global
            # RNG, which this seeds, and what it draws depends on everything that drew from it
            # since (another runner's construction included, e.g. an evaluation's). Deferring the
            # seeding to the first action would change that order; for a Box runner nothing here
            # draws from torch's RNG, and the learner's own draws use forked or private generators.
            self._build_policy()

    @property
    def policy(self) -> ActorCritic:
        """The torch ActorCritic holding the weights last loaded (the initial ones before a load).

        Built on first use (imports torch). Changing it changes nothing until its weights are `load`ed."""
        if self._policy is None:
            self._build_policy()
        return self._policy

    def _build_policy(self) -> None:
        import torch

        from learner.policy import ActorCritic

        # The initial weights exactly as __init__ made them before it deferred this: the global
        # RNG seeded right before the orthogonal init.
        torch.manual_seed(self._seed)
        policy = ActorCritic(
            self.observation_space.shape, self.action_space, self._hidden_sizes, obs_norm=self._obs_norm
        )
        policy.eval()
        if self._state is not None:
            policy.load_state_dict({name: torch.from_numpy(array.copy()) for name, array in self._state.items()})
        self._policy = policy
        if self._critic is None:  # no load yet: inference runs on the initial weights, copied before anyone edits them
            self._snapshot(self._module_state(policy))

    @staticmethod
    def _module_state(policy: ActorCritic) -> dict[str, np.ndarray]:
        return {name: tensor.detach().cpu().numpy().copy() for name, tensor in policy.state_dict().items()}

    def load(self, version: int, weights: bytes) -> None:
        if self.action_space.kind != "box":  # the torch module acts: load into it (learner/policy.py)
            from learner.policy import import_weights

            import_weights(self.policy, weights)
            self._snapshot(self._module_state(self.policy))
            self.version = version
            return
        payload = read_state_dict(weights)
        if any(name.startswith("obs_normalizer.") for name in payload):
            self._obs_norm = True  # learner/policy.py fit_normalizer: the weights say the policy normalises
        state = _fit_state(payload, self.layout())
        self._state = state
        if self._policy is not None:
            self._sync_policy()
        self.version = version
        self._snapshot(state)

    def _sync_policy(self) -> None:
        import torch

        from learner.policy import fit_normalizer

        fit_normalizer(self._policy, self._state)
        self._policy.load_state_dict({name: torch.from_numpy(array.copy()) for name, array in self._state.items()})

    def layout(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """The weights this runner takes (`policy_layout`)."""
        shape = self.observation_space.shape
        return policy_layout(shape, self.action_space, self._hidden_sizes, obs_norm=self._obs_norm)

    def _snapshot(self, state: dict[str, np.ndarray]) -> None:
        """numpy copies of the MLPs ([(W^T, b), ...], tanh between layers), the log-std and the
        normaliser's statistics, from `{name: array}` as the module holds them."""

        def layers(prefix: str) -> list[tuple[np.ndarray, np.ndarray]]:
            return [
                (state[f"{prefix}.{2 * i}.weight"].T.copy(), state[f"{prefix}.{2 * i}.bias"].copy())
                for i in range(len(self._hidden_sizes) + 1)
            ]

        self._obs_mean = self._obs_std = None
        if "obs_normalizer.mean" in state:  # the statistics shipped inside the weights (learner/policy.py)
            self._obs_mean = state["obs_normalizer.mean"].astype(np.float32)
            self._obs_std = np.sqrt(state["obs_normalizer.var"] + OBS_EPS).astype(np.float32)
        if self.action_space.kind == "box":
            self._actor = layers("actor_mean")
            self._log_std = state["actor_logstd"][0].copy()  # [action_dim]
            self._std = np.exp(self._log_std)
        self._critic = layers("critic")  # last: set means the snapshot is whole

    def _flat(self, obs: np.ndarray) -> np.ndarray:
        """obs [k, *obs_shape] as the network's input [k, flat]: flattened, normalised when the policy is."""
        if self._critic is None:  # a Box runner acting before any load: ActorCritic's initial weights
            self._build_policy()  # (built means snapshotted: a Discrete runner is built in __init__)
        flat = np.asarray(obs, dtype=np.float32).reshape(len(obs), -1)
        if self._obs_mean is None:
            return flat
        return np.clip((flat - self._obs_mean) / self._obs_std, -OBS_CLIP, OBS_CLIP).astype(np.float32)

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
            import torch  # imported since __init__ built the policy: a lookup

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
        import torch

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

    def act_deterministic(self, obs: np.ndarray) -> np.ndarray:
        """The mode of the policy (mean action / argmax), for evaluation; env-ready."""
        flat = self._flat(obs)
        if self.action_space.kind == "box":
            return self.to_env(
                self._forward(self._actor, flat).reshape(-1, *self.action_space.shape).astype(np.float32)
            )
        import torch

        with torch.no_grad():
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
