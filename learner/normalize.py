"""Running statistics for normalisation: observations (shipped with the policy) and reward scale.

Rewards: returns of a driving task run to the hundreds, while the critic's output layer is
initialised for values of order 1, and the value loss (squared errors of that order) dominates
the global gradient norm that the 0.5 clip acts on: every step of the actor is scaled by a factor
set by the critic's current error, which changes from step to step (Adam's per-parameter
normalisation undoes a constant factor, not a varying one). `RewardScaler` divides every reward
by the running standard deviation of the discounted return, as Gymnasium's `NormalizeReward`
wrapper does in CleanRL's continuous PPO, but inside the learner and over the masked batch, so
the simulators and the broker keep the raw rewards (the metrics report those). Measured effect:
docs/learning.md.
"""

from __future__ import annotations

import torch

from learner.policy import AllSum, merged_moments


class RunningMeanStd:
    """Mean and (population) variance of everything `update` has seen, per feature, in float64.

    `count` starts at a tiny epsilon as in Gymnasium, so the first batch sets
    the statistics almost alone and nothing divides by zero.
    """

    def __init__(self, shape: tuple[int, ...] = (), epsilon: float = 1e-4) -> None:
        self.mean = torch.zeros(shape, dtype=torch.float64)
        self.var = torch.ones(shape, dtype=torch.float64)
        self.count = float(epsilon)

    def update(self, x: torch.Tensor, all_sum: AllSum | None = None) -> None:
        """Merge the rows of `x` `[B, *shape]` (B may be 0: nothing changes); with `all_sum`, the rows of
        every rank (learner.policy.merged_moments)."""
        if x.shape[0] == 0 and all_sum is None:
            return
        x = x.detach().to("cpu", torch.float64)
        self.mean, self.var, self.count = merged_moments(self.mean, self.var, self.count, x, all_sum)

    def state_dict(self) -> dict:
        return {"mean": self.mean.clone(), "var": self.var.clone(), "count": self.count}

    def load_state_dict(self, state: dict) -> None:
        self.mean = state["mean"].to(torch.float64).clone()
        self.var = state["var"].to(torch.float64).clone()
        self.count = float(state["count"])


def discounted_returns(
    rewards: torch.Tensor, ended: torch.Tensor, valid_mask: torch.Tensor, gamma: float
) -> torch.Tensor:
    """Per slot, the running discounted sum of rewards since its episode began in this batch.

    `[T, N]` in, `[T, N]` out; zero at padded steps, and an ended step (terminated or truncated)
    closes the sum for the slot's next valid step. An episode that began before the batch starts
    from 0 here, as Gymnasium's wrapper starts at its own first step: the scale only needs the
    magnitude, not each episode's exact return.
    """
    running = torch.zeros(rewards.shape[1], dtype=torch.float64)
    out = torch.zeros(rewards.shape, dtype=torch.float64)
    rewards64 = torch.where(valid_mask, rewards, 0.0).to(torch.float64).cpu()
    valid, ended = valid_mask.cpu(), ended.cpu()
    for t in range(rewards.shape[0]):
        updated = running * gamma + rewards64[t]
        running = torch.where(valid[t], updated, running)
        out[t] = torch.where(valid[t], running, 0.0)
        running = torch.where(valid[t] & ended[t], 0.0, running)
    return out


class RewardScaler:
    """Divides rewards by the running standard deviation of the discounted return (see module docstring)."""

    def __init__(self, gamma: float, epsilon: float = 1e-8) -> None:
        self.gamma = gamma
        self.epsilon = epsilon
        self.returns = RunningMeanStd(())

    @property
    def scale(self) -> float:
        """What rewards are divided by now."""
        return float((self.returns.var + self.epsilon).sqrt())

    def observe(
        self, rewards: torch.Tensor, ended: torch.Tensor, valid_mask: torch.Tensor, all_sum: AllSum | None = None
    ) -> None:
        """Merge the discounted returns of one batch's valid steps into the statistics (of every rank's
        batch with `all_sum`: returns are per slot, so each rank computes its own)."""
        returns = discounted_returns(rewards, ended, valid_mask, self.gamma)
        self.returns.update(returns[valid_mask.cpu()], all_sum)

    def state_dict(self) -> dict:
        return {"gamma": self.gamma, "returns": self.returns.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.gamma = float(state["gamma"])
        self.returns.load_state_dict(state["returns"])
