"""The PPO update's hyper-parameters, apart from the update itself so that reading them loads no torch.

`learner.ppo` (the update) re-exports `PPOConfig`; `learner.config` (the service's settings, which
`fast --help` builds its options from) takes its defaults from here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields


@dataclass(frozen=True)
class PPOConfig:
    """Hyper-parameters of the PPO update, checked once at construction (CleanRL defaults)."""

    gamma: float = 0.99  # discount
    gae_lambda: float = 0.95  # GAE lambda
    clip_eps: float = 0.2  # PPO ratio clip (and value clip when clip_vloss)
    vf_coef: float = 0.5  # weight of the value loss
    ent_coef: float = 0.0  # weight of the entropy bonus
    lr: float = 3e-4  # Adam learning rate
    update_epochs: int = 10  # passes over the batch per update
    # Minibatches per epoch, split from the valid transitions. 8, fast train's: CleanRL's 32 learned
    # less on the takeover workload and took twice the time (docs/learning.md, `mb32`).
    num_minibatches: int = 8
    max_grad_norm: float = 0.5  # global gradient-norm clip (math.inf disables)
    norm_adv: bool = True  # normalise advantages per minibatch over valid entries
    clip_vloss: bool = False  # CleanRL's clipped value loss
    norm_reward: bool = False  # divide rewards by the running std of the discounted return (learner/normalize.py)
    seed: int = 1  # seeds the minibatch shuffling

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if field.type == "bool" and not isinstance(value, bool):
                raise ValueError(f"PPOConfig.{field.name} must be a bool, got {value!r}")
            if field.type == "int" and (isinstance(value, bool) or not isinstance(value, int)):
                raise ValueError(f"PPOConfig.{field.name} must be an int, got {value!r}")
            if field.type == "float" and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise ValueError(f"PPOConfig.{field.name} must be a number, got {value!r}")
        # Written as `not (ok)` so that NaN fails every check.
        checks = {
            "gamma": 0.0 <= self.gamma <= 1.0,
            "gae_lambda": 0.0 <= self.gae_lambda <= 1.0,
            "clip_eps": 0.0 < self.clip_eps < 1.0,
            "vf_coef": 0.0 <= self.vf_coef < math.inf,
            "ent_coef": 0.0 <= self.ent_coef < math.inf,
            "lr": 0.0 < self.lr < math.inf,
            "update_epochs": self.update_epochs >= 1,
            "num_minibatches": self.num_minibatches >= 1,
            "max_grad_norm": self.max_grad_norm > 0.0,
            "seed": self.seed >= 0,
        }
        rules = {
            "gamma": "in [0, 1]",
            "gae_lambda": "in [0, 1]",
            "clip_eps": "in (0, 1)",
            "vf_coef": "finite and >= 0",
            "ent_coef": "finite and >= 0",
            "lr": "finite and > 0",
            "update_epochs": ">= 1",
            "num_minibatches": ">= 1",
            "max_grad_norm": "> 0 (math.inf disables clipping)",
            "seed": ">= 0",
        }
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"PPOConfig.{name} must be {rules[name]}, got {getattr(self, name)!r}")
