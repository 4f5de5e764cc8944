"""The actor-critic network (CleanRL's `Agent`) and its weights as bytes for shipping.

Separate actor and critic MLPs (two hidden layers of 64 tanh units by default), orthogonal
init with gain sqrt(2) for hidden layers, 0.01 for the policy head (near-uniform initial
policy) and 1.0 for the value head, as in CleanRL's `ppo_continuous_action.py`.
Box actions: diagonal Gaussian with a state-independent log-std parameter. The sampled action
is not clipped to the Box bounds here: log-probs refer to the unclipped sample, and clipping
for the simulator is the sampler's job. Discrete actions: Categorical over `n` logits.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from typing import Any, Callable, Literal, Sequence

import torch
from torch import nn
from torch.distributions import Categorical, Normal

# The sum of a tensor over data-parallel learner ranks (learner/distributed.py: `Ranks.all_sum`), a
# detached copy on the tensor's device. Where it is optional, None means this process holds the whole batch.
AllSum = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class ActionSpec:
    """The action space the policy acts in: a float Box of `shape`, or Discrete(n)."""

    kind: Literal["box", "discrete"]
    shape: tuple[int, ...] = ()
    n: int = 0

    @classmethod
    def box(cls, shape: int | Sequence[int]) -> ActionSpec:
        return cls("box", (shape,) if isinstance(shape, int) else tuple(shape))

    @classmethod
    def discrete(cls, n: int) -> ActionSpec:
        return cls("discrete", (), n)

    @classmethod
    def coerce(cls, spec: Any) -> ActionSpec:
        """Accept an ActionSpec or anything with `kind`, `shape`, `n` (e.g. sim_server's SpaceSpec)."""
        if isinstance(spec, ActionSpec):
            result = spec
        elif all(hasattr(spec, attr) for attr in ("kind", "shape")):
            result = cls(spec.kind, tuple(int(d) for d in spec.shape), int(getattr(spec, "n", 0)))
        else:
            raise ValueError(f"action_spec: expected an ActionSpec or an object with kind/shape/n, got {spec!r}")
        if result.kind not in ("box", "discrete"):
            raise ValueError(f"action_spec: kind must be 'box' or 'discrete', got {result.kind!r}")
        if result.kind == "box" and (len(result.shape) == 0 or any(d < 1 for d in result.shape)):
            raise ValueError(f"action_spec: a box needs a non-empty shape of positive sizes, got {result.shape}")
        if result.kind == "discrete" and result.n < 1:
            raise ValueError(f"action_spec: a discrete space needs n >= 1, got n={result.n}")
        return result


def layer_init(layer: nn.Linear, std: float = math.sqrt(2), bias_const: float = 0.0) -> nn.Linear:
    """CleanRL's orthogonal weight init with a constant bias."""
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias_const)
    return layer


def _mlp(in_dim: int, hidden_sizes: Sequence[int], out_dim: int, out_std: float) -> nn.Sequential:
    layers: list[nn.Module] = []
    for width in hidden_sizes:
        layers += [layer_init(nn.Linear(in_dim, width)), nn.Tanh()]
        in_dim = width
    layers.append(layer_init(nn.Linear(in_dim, out_dim), std=out_std))
    return nn.Sequential(*layers)


def _mlp_parameters(in_dim: int, hidden_sizes: Sequence[int], out_dim: int) -> int:
    widths = [in_dim, *hidden_sizes, out_dim]
    return sum((a + 1) * b for a, b in zip(widths, widths[1:]))  # weights and biases


def parameter_count(obs_shape: Sequence[int], action_spec: Any, hidden_sizes: Sequence[int] = (64, 64)) -> int:
    """How many parameters `ActorCritic(obs_shape, action_spec, hidden_sizes)` has, without building it
    (so a caller can refuse a network too large to allocate before trying)."""
    spec = ActionSpec.coerce(action_spec)
    flat_obs = math.prod(obs_shape)
    if spec.kind == "box":
        action_dim = math.prod(spec.shape)
        actor = _mlp_parameters(flat_obs, hidden_sizes, action_dim) + action_dim  # + actor_logstd
    else:
        actor = _mlp_parameters(flat_obs, hidden_sizes, spec.n)
    return actor + _mlp_parameters(flat_obs, hidden_sizes, 1)


def merged_moments(
    mean: torch.Tensor, var: torch.Tensor, count: float, x: torch.Tensor, all_sum: AllSum | None = None
) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(mean, population variance, count) of the data summarised by the first three plus the rows
    of `x` `[B, *shape]` (float64, B >= 1): Chan et al.'s parallel merge, so a batch at a time gives
    the same figures as one value at a time, to rounding.

    With `all_sum` (learner/distributed.py) `x` is one rank's rows, B >= 0: the batch's moments are
    those of every rank's rows together (count, sum, then squared deviations, summed over the
    ranks), so every rank merges the same figures; rows on no rank at all change nothing.
    """
    if all_sum is None:
        batch_mean, batch_var, batch_count = x.mean(0), x.var(0, unbiased=False), float(x.shape[0])
    else:
        batch_count = float(all_sum(torch.tensor(float(x.shape[0]), dtype=torch.float64, device=x.device)))
        if batch_count == 0:
            return mean, var, count
        batch_mean = all_sum(x.sum(0)) / batch_count
        batch_var = all_sum((x - batch_mean).square().sum(0)) / batch_count
    delta = batch_mean - mean
    total = count + batch_count
    m2 = var * count + batch_var * batch_count + delta.square() * (count * batch_count / total)
    return mean + delta * (batch_count / total), m2 / total, total


class ObservationNormalizer(nn.Module):
    """(obs - mean) / sqrt(var + 1e-8), clipped to [-10, 10], with running statistics as buffers.

    Buffers, so the statistics travel inside the policy's weights: the broker's inference, the
    evaluation, checkpoints and exports all normalise with the ones the policy was trained with.
    The learner merges each batch's valid observations after its update (learner/ppo.py).
    """

    CLIP = 10.0

    def __init__(self, flat_dim: int) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(flat_dim, dtype=torch.float64))
        self.register_buffer("var", torch.ones(flat_dim, dtype=torch.float64))
        self.register_buffer("count", torch.tensor(1e-4, dtype=torch.float64))

    def forward(self, flat_obs: torch.Tensor) -> torch.Tensor:
        mean, std = self.mean.to(flat_obs.dtype), (self.var + 1e-8).sqrt().to(flat_obs.dtype)
        return ((flat_obs - mean) / std).clamp(-self.CLIP, self.CLIP)

    @torch.no_grad()
    def observe(self, flat_obs: torch.Tensor, all_sum: AllSum | None = None) -> None:
        """Merge rows `[B, flat_dim]` into the statistics (Chan's parallel update, float64); with
        `all_sum`, the rows of every rank (merged_moments), B = 0 included."""
        if flat_obs.shape[0] == 0 and all_sum is None:
            return
        x = flat_obs.detach().reshape(flat_obs.shape[0], self.mean.shape[0]).to(self.mean.device, torch.float64)
        mean, var, count = merged_moments(self.mean, self.var, float(self.count), x, all_sum)
        self.mean.copy_(mean)
        self.var.copy_(var)
        self.count.fill_(count)


class ActorCritic(nn.Module):
    """pi(a | s) and V(s) over observations `[*batch, *obs_shape]` (trailing dims are flattened)."""

    def __init__(
        self,
        obs_dim: int | Sequence[int],
        action_spec: Any,
        hidden_sizes: Sequence[int] = (64, 64),
        *,
        init_log_std: float = 0.0,
        obs_norm: bool = False,
    ) -> None:
        super().__init__()
        self.obs_shape: tuple[int, ...] = (obs_dim,) if isinstance(obs_dim, int) else tuple(obs_dim)
        if len(self.obs_shape) == 0 or any(d < 1 for d in self.obs_shape):
            raise ValueError(f"obs_dim: expected a positive size or shape, got {obs_dim!r}")
        self.action_spec = ActionSpec.coerce(action_spec)
        flat_obs = math.prod(self.obs_shape)
        if self.action_spec.kind == "box":
            self.action_dim = math.prod(self.action_spec.shape)
            self.actor_mean = _mlp(flat_obs, hidden_sizes, self.action_dim, out_std=0.01)
            self.actor_logstd = nn.Parameter(torch.full((1, self.action_dim), float(init_log_std)))
        else:
            self.action_dim = self.action_spec.n
            self.actor_logits = _mlp(flat_obs, hidden_sizes, self.action_spec.n, out_std=0.01)
        self.critic = _mlp(flat_obs, hidden_sizes, 1, out_std=1.0)
        self.obs_normalizer = ObservationNormalizer(flat_obs) if obs_norm else None

    def _flatten_obs(self, obs: torch.Tensor) -> torch.Tensor:
        if tuple(obs.shape[obs.ndim - len(self.obs_shape) :]) != self.obs_shape:
            expected = ", ".join(map(str, self.obs_shape))
            raise ValueError(f"obs: expected shape [*batch, {expected}], got {list(obs.shape)}")
        flat = obs.flatten(start_dim=obs.ndim - len(self.obs_shape))  # [*batch, prod(obs_shape)]
        return flat if self.obs_normalizer is None else self.obs_normalizer(flat)

    def get_value(self, obs: torch.Tensor) -> torch.Tensor:
        """V(s), shape `[*batch]`."""
        return self.critic(self._flatten_obs(obs)).squeeze(-1)

    def get_action_and_value(
        self, obs: torch.Tensor, action: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Return `(action, log pi(action|s), entropy, V(s))`; samples the action when None.

        Shapes: action `[*batch, *act_shape]` (int64 `[*batch]` for Discrete), the rest `[*batch]`.
        """
        flat_obs = self._flatten_obs(obs)
        batch_shape = flat_obs.shape[:-1]
        if self.action_spec.kind == "box":
            action_mean = self.actor_mean(flat_obs)  # [*batch, action_dim]
            action_std = self.actor_logstd.expand_as(action_mean).exp()
            dist = Normal(action_mean, action_std)
            if action is None:
                action = dist.sample().reshape(*batch_shape, *self.action_spec.shape)
            flat_action = action.reshape(*batch_shape, self.action_dim)
            # Independent dimensions: log-prob and entropy of the joint are sums over dims.
            logprob = dist.log_prob(flat_action).sum(-1)
            entropy = dist.entropy().sum(-1)
        else:
            dist = Categorical(logits=self.actor_logits(flat_obs))
            if action is None:
                action = dist.sample()
            logprob = dist.log_prob(action)
            entropy = dist.entropy()
        return action, logprob, entropy, self.critic(flat_obs).squeeze(-1)


def fit_normalizer(policy: nn.Module, state: dict) -> None:
    """Give `policy` an observation normaliser when the weights in `state` carry one.

    Weights describe themselves: a policy trained with observation normalisation ships its
    statistics as `obs_normalizer.*` buffers, and whoever loads them (the broker's inference,
    evaluation, a resumed learner) needs no flag to build the right network.
    """
    if isinstance(policy, ActorCritic) and policy.obs_normalizer is None:
        if any(name.startswith("obs_normalizer.") for name in state):
            device = next(policy.parameters()).device
            policy.obs_normalizer = ObservationNormalizer(math.prod(policy.obs_shape)).to(device)


def export_weights(policy: nn.Module) -> bytes:
    """The policy's `state_dict` as bytes (torch.save), device-independent (saved from CPU)."""
    buffer = io.BytesIO()
    torch.save({name: tensor.detach().cpu() for name, tensor in policy.state_dict().items()}, buffer)
    return buffer.getvalue()


def import_weights(policy: nn.Module, data: bytes) -> None:
    """Load bytes from `export_weights` into `policy` in place; ValueError if they don't fit it."""
    try:
        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises several types for corrupt or foreign payloads
        raise ValueError(f"import_weights: not a weights payload ({type(error).__name__}: {error})") from error
    if not isinstance(state, dict):
        raise ValueError(f"import_weights: expected a state_dict, got {type(state).__name__}")
    fit_normalizer(policy, state)
    try:
        policy.load_state_dict(state, strict=True)
    except RuntimeError as error:
        raise ValueError(f"import_weights: weights do not match this policy: {error}") from error
