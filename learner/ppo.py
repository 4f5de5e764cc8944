"""The PPO update over a masked rollout batch: GAE, epochs, minibatches, Adam, statistics.

Minibatching keeps the SMPO equivalence (docs/smpo.md, "Minibatching"): the valid transitions
are gathered first, in (slot, step) order, and only that compacted list is shuffled and split.
Each minibatch is therefore exactly what plain PPO would see on the same data recorded without
padding, and any two batches that differ only by padding (where it sits, how much, what it
holds) give the same sequence of minibatches and the same parameters afterwards.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from learner.batch import RolloutBatch
from learner.device import pick_device
from learner.gae import masked_gae
from learner.normalize import RewardScaler
from learner.policy import ActorCritic, fit_normalizer
from learner.ppo_config import PPOConfig
from learner.smpo import explained_variance, smpo_loss

if TYPE_CHECKING:
    from learner.distributed import Ranks


class PPOLearner:
    """Owns a policy's optimiser and runs SMPO-PPO updates on masked rollout batches."""

    def __init__(self, policy: ActorCritic, config: PPOConfig, device: torch.device | str | None = None) -> None:
        """Move `policy` to `device` (default: CUDA when available, else CPU) and build Adam over it."""
        self.config = config
        self.device = pick_device(None if device is None else str(device))
        self.policy = policy.to(self.device)
        self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=config.lr, eps=1e-5)
        # A private CPU generator: shuffling is reproducible from the seed on any device and
        # independent of whatever else draws from torch's global RNG.
        self.shuffle_generator = torch.Generator(device="cpu").manual_seed(config.seed)
        self.param_dtype = next(self.policy.parameters()).dtype
        self.reward_scaler = RewardScaler(config.gamma) if config.norm_reward else None
        self.lr_anneal_factor = 1.0  # Adam's learning rate is config.lr times this (set_hyperparameters)

    def update(self, batch: RolloutBatch, ranks: Ranks | None = None) -> dict[str, float]:
        """One PPO update on `batch`; returns statistics (losses averaged over minibatch steps).

        Raises ValueError for a malformed batch or one with no valid transition, and
        FloatingPointError (before any step is taken with it) for a non-finite gradient.

        With `ranks` (learner/distributed.py), `batch` is this rank's part of an update that every
        rank of the group runs at once: the step taken, on every rank, is one learner's on the union
        of the ranks' batches, and the statistics are the union's. A batch that one rank refuses is
        refused on every rank (RankRefused elsewhere); without ranks, the single learner.
        """
        start = time.perf_counter()
        cfg = self.config
        # Read once: the values this update uses, reported with its statistics.
        learning_rate, lr_anneal_factor = float(cfg.lr), self.lr_anneal_factor
        all_sum = None if ranks is None else ranks.all_sum
        if ranks is None:
            self._check_batch(batch)
            num_valid = batch.num_valid
            if num_valid == 0:
                raise ValueError("PPOLearner.update: the batch has no valid transition (valid_mask is all False)")
            share = None
        else:
            try:
                self._check_batch(batch)
            except ValueError:
                ranks.refuse()  # the other ranks raise RankRefused
                raise
            share = ranks.share(batch.num_valid)
            num_valid = share.total
        rewards = batch.rewards
        if self.reward_scaler is not None:
            # Statistics first, so the very first batch is scaled by its own magnitude. The critic
            # learns scaled returns, so the batch's values and bootstrap values are in those units.
            self.reward_scaler.observe(batch.rewards, batch.terminated | batch.truncated, batch.valid_mask, all_sum)
            rewards = batch.rewards / self.reward_scaler.scale
        batch = replace(batch, rewards=rewards).to(self.device, dtype=self.param_dtype)

        advantages, returns = masked_gae(
            batch.rewards,
            batch.values,
            batch.terminated,
            batch.truncated,
            batch.bootstrap_values,
            batch.valid_mask,
            gamma=cfg.gamma,
            lam=cfg.gae_lambda,
        )

        # Compact: (slot, step) order, i.e. each slot's valid steps in time order, slot after slot.
        valid_index = batch.valid_mask.T.reshape(-1).nonzero().squeeze(1)  # [num_valid]

        def compact(per_step: torch.Tensor) -> torch.Tensor:
            slot_major = per_step.transpose(0, 1)  # [N, T, ...]
            return slot_major.reshape(-1, *per_step.shape[2:])[valid_index]

        b_obs = compact(batch.obs)
        b_actions = compact(batch.actions)
        b_logprobs = compact(batch.logprobs)
        b_values = compact(batch.values)
        b_advantages = compact(advantages)
        b_returns = compact(returns)

        step_stats: dict[str, list[torch.Tensor]] = {
            key: [] for key in ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction", "grad_norm")
        }
        for _ in range(cfg.update_epochs):
            # With ranks, every rank draws this same permutation of the global indices (module
            # docstring of learner/distributed.py) and trains on its entries of each part.
            permutation = torch.randperm(num_valid, generator=self.shuffle_generator).to(self.device)
            # Nearly equal minibatches (sizes differ by at most 1); empty ones when
            # num_minibatches > num_valid are skipped.
            for mb_index in torch.tensor_split(permutation, cfg.num_minibatches):
                if mb_index.numel() == 0:
                    continue
                if share is not None:
                    mb_index = share.local(mb_index)  # may be empty: the rank still joins every reduction
                loss = smpo_loss(
                    self.policy,
                    b_obs[mb_index],
                    b_actions[mb_index],
                    b_logprobs[mb_index],
                    b_values[mb_index],
                    b_advantages[mb_index],
                    b_returns[mb_index],
                    valid_mask=None,
                    all_sum=all_sum,
                    clip_eps=cfg.clip_eps,
                    vf_coef=cfg.vf_coef,
                    ent_coef=cfg.ent_coef,
                    norm_adv=cfg.norm_adv,
                    clip_vloss=cfg.clip_vloss,
                )
                self.optimizer.zero_grad(set_to_none=True)
                loss.total.backward()
                if ranks is not None:
                    ranks.sum_gradients(self.policy.parameters())  # one learner's gradient, on every rank
                grad_norm = torch.nn.utils.clip_grad_norm_(self.policy.parameters(), cfg.max_grad_norm)
                if not bool(torch.isfinite(grad_norm)):
                    raise FloatingPointError(
                        f"PPOLearner.update: non-finite gradient norm {float(grad_norm)} "
                        f"(policy_loss={float(loss.policy_loss)}, value_loss={float(loss.value_loss)}); "
                        "no optimiser step was taken with it"
                    )
                self.optimizer.step()
                for key in ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction"):
                    step_stats[key].append(getattr(loss, key))
                step_stats["grad_norm"].append(grad_norm.detach())

        if ranks is not None:
            # Each rank's loss terms are its share of the union's: their sums are the union's figures.
            for key in ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction"):
                step_stats[key] = list(ranks.all_sum(torch.stack(step_stats[key])))
        stats = {key: float(torch.stack(values).mean()) for key, values in step_stats.items()}
        # CleanRL's diagnostic: how much of the return variance the rollout's critic explained.
        stats["explained_variance"] = float(
            explained_variance(b_values, b_returns, torch.ones_like(b_values, dtype=torch.bool), all_sum)
        )
        stats["num_valid"] = num_valid
        stats["num_total"] = batch.num_total if ranks is None else int(ranks.all_sum(torch.tensor(batch.num_total)))
        stats["learning_rate"] = learning_rate
        stats["lr_anneal_factor"] = lr_anneal_factor
        stats["ent_coef"] = float(cfg.ent_coef)
        stats["reward_scale"] = self.reward_scaler.scale if self.reward_scaler is not None else 1.0
        if self.policy.obs_normalizer is not None:
            # After the update: this batch was sampled, and just learnt from, with the statistics
            # it was sampled with; the next version ships the merged ones.
            self.policy.obs_normalizer.observe(compact(batch.obs), all_sum)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        stats["update_time_s"] = time.perf_counter() - start
        return stats

    def _check_batch(self, batch: RolloutBatch) -> None:
        """ValueError for a batch this policy cannot learn from (shapes, dtypes, read entries not finite)."""
        batch.validate(obs_shape=self.policy.obs_shape, action_shape=self._action_shape())
        if self.policy.action_spec.kind == "discrete" and batch.actions.dtype != torch.int64:
            raise ValueError(f"RolloutBatch.actions: a discrete policy needs int64 actions, got {batch.actions.dtype}")
        if self.policy.action_spec.kind == "box" and not batch.actions.is_floating_point():
            raise ValueError(f"RolloutBatch.actions: a box policy needs float actions, got {batch.actions.dtype}")

    def set_hyperparameters(self, *, learning_rate: float, ent_coef: float, lr_anneal_factor: float = 1.0) -> None:
        """Train with these from the next update on: Adam's learning rate (`learning_rate` times
        `lr_anneal_factor`, in (0, 1]) and the loss's entropy weight.

        Not to be called while `update` runs (LearnerCore calls it as an update starts, under its state
        lock); ValueError if PPOConfig refuses a value.
        """
        if not 0.0 < lr_anneal_factor <= 1.0:
            raise ValueError(f"lr_anneal_factor must be in (0, 1], got {lr_anneal_factor!r}")
        self.config = replace(self.config, lr=learning_rate, ent_coef=ent_coef)  # validated again
        self.lr_anneal_factor = float(lr_anneal_factor)
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate * lr_anneal_factor

    def state_dict(self) -> dict:
        """Everything needed to resume updates identically: weights, Adam state, shuffle RNG."""
        return {
            "policy": self.policy.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "shuffle_generator": self.shuffle_generator.get_state(),
            **({"reward_scaler": self.reward_scaler.state_dict()} if self.reward_scaler is not None else {}),
        }

    def load_state_dict(self, state: dict) -> None:
        fit_normalizer(self.policy, state["policy"])
        self.policy.load_state_dict(state["policy"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.shuffle_generator.set_state(state["shuffle_generator"])
        if self.reward_scaler is not None and "reward_scaler" in state:
            self.reward_scaler.load_state_dict(state["reward_scaler"])

    def _action_shape(self) -> tuple[int, ...]:
        spec = self.policy.action_spec
        return spec.shape if spec.kind == "box" else ()
