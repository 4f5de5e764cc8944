"""Settings of `fast learner`: flags, FAST_LEARNER_* environment variables or a YAML file.

Each setting is declared once, here (fast/settings.py): the flag, its help, the variable and the key
derive from it. The PPO fields mirror `learner.ppo_config.PPOConfig` (same names, defaults and bounds)
so a run's hyper-parameters live in the one config the service validates at start-up.
"""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import Field, field_validator

from fast.tls import TlsSettings
from learner.ppo_config import PPOConfig

ENV_PREFIX = "FAST_LEARNER_"

_DEFAULT_PPO = PPOConfig()
_DEVICE = re.compile(r"^(cpu|cuda(:\d+)?)$")


class LearnerConfig(TlsSettings):  # tls_cert, tls_key, tls_ca, tls_server_name: fast/tls.py
    # Transport.
    host: str = Field("127.0.0.1", description="Address to bind.")
    port: int = Field(0, ge=0, le=65535, description="Port; 0 picks a free one and prints it.")
    # Batches are the largest messages of the system: T * N * obs floats, plus actions.
    max_message_bytes: int = Field(256 << 20, ge=1024, lt=2**31, description="Largest message accepted, in bytes.")
    grace_s: float = Field(
        10.0, ge=0.0, description="Drain time on SIGTERM before the final checkpoint (lets an in-flight update finish)."
    )

    # Checkpoints and resume.
    checkpoint_dir: Path = Field(
        Path("runs/learner/checkpoints"), description="Where checkpoints are written and resumed from."
    )
    checkpoint_every: int = Field(10, ge=1, description="Checkpoint every K policy versions.")
    keep_checkpoints: int = Field(3, ge=1, description="Newest checkpoints kept, older ones deleted.")

    # Model and device.
    device: str | None = Field(None, description="cpu | cuda | cuda:<index>; unset: CUDA when present, else CPU.")
    hidden_sizes: list[int] = Field(
        default_factory=lambda: [64, 64],
        min_length=1,
        description="Widths of the actor's and the critic's hidden layers.",
    )
    # The Gaussian policy's initial log standard deviation (Box actions). -0.5 (std 0.61) rather than
    # CleanRL's 0: on the takeover workload the first updates then unlearn less of the initial policy,
    # and 150-iteration runs ended above it in 6 of 6 seeds against 3 of 6 (docs/learning.md).
    init_log_std: float = Field(
        -0.5, ge=-5.0, le=2.0, description="The Gaussian policy's initial log-std (Box actions)."
    )
    # Normalise observations with running statistics kept in the policy's weights (learner/policy.py).
    obs_norm: bool = Field(
        False, description="Normalise observations with running statistics kept inside the policy's weights."
    )
    anneal_lr_updates: int = Field(
        0, ge=0, description="Anneal the learning rate linearly to lr / N over the first N updates; 0: constant."
    )

    # Data-parallel ranks (learner/group.py; docs/learner.md, "Ranks"): each one left unset comes from
    # torchrun's environment, else the learner is one rank alone, the single learner.
    world_size: int | None = Field(
        None, ge=1, description="Learner ranks in the group; unset: $WORLD_SIZE (torchrun's), else 1."
    )
    rank: int | None = Field(None, ge=0, description="This learner's rank, 0 to world_size - 1; unset: $RANK, else 0.")
    master_addr: str | None = Field(
        None, description="Rank 0's rendezvous address; unset: $MASTER_ADDR, else 127.0.0.1 (one machine)."
    )
    master_port: int | None = Field(
        None,
        ge=0,
        le=65535,
        description="Rank 0's rendezvous port (0 on rank 0: a free one, printed); unset: $MASTER_PORT, else 29500.",
    )
    rank_timeout_s: float = Field(
        600.0, gt=0.0, description="How long a rank waits for the others: to join, and for their batch of an update."
    )

    # PPO (learner.ppo_config.PPOConfig). `seed` also seeds the network's initial weights.
    gamma: float = Field(_DEFAULT_PPO.gamma, ge=0.0, le=1.0, description="Discount.")
    gae_lambda: float = Field(_DEFAULT_PPO.gae_lambda, ge=0.0, le=1.0, description="GAE lambda.")
    clip_eps: float = Field(
        _DEFAULT_PPO.clip_eps, gt=0.0, lt=1.0, description="PPO ratio clip (and value clip with clip_vloss)."
    )
    vf_coef: float = Field(_DEFAULT_PPO.vf_coef, ge=0.0, allow_inf_nan=False, description="Weight of the value loss.")
    ent_coef: float = Field(
        _DEFAULT_PPO.ent_coef, ge=0.0, allow_inf_nan=False, description="Weight of the entropy bonus."
    )
    lr: float = Field(_DEFAULT_PPO.lr, gt=0.0, allow_inf_nan=False, description="Adam learning rate.")
    update_epochs: int = Field(_DEFAULT_PPO.update_epochs, ge=1, description="PPO epochs per batch.")
    num_minibatches: int = Field(_DEFAULT_PPO.num_minibatches, ge=1, description="Minibatches per epoch.")
    max_grad_norm: float = Field(
        _DEFAULT_PPO.max_grad_norm, gt=0.0, description="Global gradient-norm clip; inf disables clipping."
    )
    norm_adv: bool = Field(_DEFAULT_PPO.norm_adv, description="Normalise advantages per minibatch.")
    clip_vloss: bool = Field(_DEFAULT_PPO.clip_vloss, description="CleanRL's clipped value loss.")
    norm_reward: bool = Field(
        _DEFAULT_PPO.norm_reward, description="Divide rewards by the running std of the discounted return."
    )
    seed: int = Field(_DEFAULT_PPO.seed, ge=0, description="Seeds the initial weights and the minibatch shuffling.")

    @field_validator("device")
    @classmethod
    def _known_device(cls, value: str | None) -> str | None:
        # Only the spelling is checked here; whether CUDA is present is checked when the
        # learner starts (learner.device.pick_device), on the machine that runs it.
        if value is not None and not _DEVICE.match(value):
            raise ValueError("use 'cpu', 'cuda' or 'cuda:<index>', or leave it unset for the best device present")
        return value

    @field_validator("hidden_sizes")
    @classmethod
    def _positive_widths(cls, value: list[int]) -> list[int]:
        if any(width < 1 for width in value):
            raise ValueError("every hidden layer needs a width >= 1, e.g. [64, 64]")
        return value

    def ppo_config(self) -> PPOConfig:
        """The PPO hyper-parameters of this config (validated again by PPOConfig itself)."""
        names = PPOConfig.__dataclass_fields__
        return PPOConfig(**{name: getattr(self, name) for name in names})
