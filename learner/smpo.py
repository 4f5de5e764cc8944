"""SMPO, scaled mask-padding optimisation: the PPO loss as masked means (docs/smpo.md, eq. L1-L6).

Every per-transition term is averaged over the valid transitions only,
    masked_mean(x) = (1 / sum m) * sum m * x,
so padding contributes neither to the numerator nor to the count, and the loss and its
gradient on a padded batch equal plain PPO's on the same valid transitions without padding.

Garbage in padding (NaN, 1e9) must not leak into the loss *or the gradient*. Selecting a
network output with `torch.where` zeroes the gradient that flows back to padded outputs, but
the network's own backward then computes `grad_weight = x^T @ grad_out`, and NaN * 0 is NaN.
So `smpo_loss` replaces padded observations and actions by zeros *before* the forward pass,
and `smpo_loss_terms` replaces every padded input by zero before any arithmetic: every
intermediate stays finite and padded rows contribute an exact zero.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from learner.policy import ActorCritic, AllSum


class SMPOLoss(NamedTuple):
    """The differentiable total loss and its detached parts and diagnostics (all scalars)."""

    total: torch.Tensor  # (L6) L_clip + vf_coef * L_v - ent_coef * H, differentiable
    policy_loss: torch.Tensor  # (L2) L_clip
    value_loss: torch.Tensor  # (L3) L_v
    entropy: torch.Tensor  # (L4) H
    approx_kl: torch.Tensor  # masked mean of (r - 1) - log r, Schulman's k3 estimator of KL(old || new)
    clip_fraction: torch.Tensor  # masked mean of [|r - 1| > clip_eps]
    explained_variance: torch.Tensor  # of the returns by the *new* values, NaN if returns are constant


def masked_mean(x: torch.Tensor, valid_mask: torch.Tensor, all_sum: AllSum | None = None) -> torch.Tensor:
    """(L1) (1 / sum m) * sum m * x, with x selected (not multiplied) so padded NaN can't leak.

    With no valid entry the mean is 0 (empty sum over a count clamped to 1). With `all_sum`, the
    sum and the count are summed over the ranks first: the mean of every rank's valid entries, the
    same on every rank (a statistic: no gradient flows through the reduction).
    """
    total, num_valid = torch.where(valid_mask, x, 0.0).sum(), valid_mask.sum()
    if all_sum is not None:
        total, num_valid = all_sum(total), all_sum(num_valid)
    return total / num_valid.clamp(min=1)


def masked_var(
    x: torch.Tensor, valid_mask: torch.Tensor, unbiased: bool, all_sum: AllSum | None = None
) -> torch.Tensor:
    """Variance of the valid entries (Bessel-corrected if `unbiased`, count clamped to >= 1); over
    every rank's valid entries with `all_sum` (two passes, as here: the mean first, then the squares)."""
    num_valid = valid_mask.sum()
    deviation = torch.where(valid_mask, x - masked_mean(x, valid_mask, all_sum), 0.0)
    squares = deviation.square().sum()
    if all_sum is not None:
        num_valid, squares = all_sum(num_valid), all_sum(squares)
    divisor = (num_valid - 1 if unbiased else num_valid).clamp(min=1)
    return squares / divisor


def normalize_advantages(
    advantages: torch.Tensor, valid_mask: torch.Tensor, eps: float = 1e-8, all_sum: AllSum | None = None
) -> torch.Tensor:
    """(L5) (A - mean) / (std + eps) over the valid entries only, 0 at padding.

    Matches CleanRL's `(A - A.mean()) / (A.std() + 1e-8)` (unbiased std) on the compacted
    valid entries; a single valid entry has std 0 here (CleanRL would give NaN). With `all_sum`,
    mean and std are those of every rank's valid entries (docs/smpo.md, "Data-parallel ranks").
    """
    mean = masked_mean(advantages, valid_mask, all_sum)
    std = masked_var(advantages, valid_mask, unbiased=True, all_sum=all_sum).sqrt()
    return torch.where(valid_mask, (advantages - mean) / (std + eps), 0.0)


def explained_variance(
    predicted: torch.Tensor, target: torch.Tensor, valid_mask: torch.Tensor, all_sum: AllSum | None = None
) -> torch.Tensor:
    """1 - Var[target - predicted] / Var[target] over valid entries (CleanRL), NaN if Var[target] = 0;
    over every rank's valid entries with `all_sum`."""
    with torch.no_grad():
        var_target = masked_var(target, valid_mask, unbiased=False, all_sum=all_sum)
        var_residual = masked_var(target - predicted, valid_mask, unbiased=False, all_sum=all_sum)
        return torch.where(var_target > 0, 1 - var_residual / var_target, torch.nan)


def smpo_loss_terms(
    new_logprobs: torch.Tensor,
    entropy: torch.Tensor,
    new_values: torch.Tensor,
    old_logprobs: torch.Tensor,
    old_values: torch.Tensor,
    advantages: torch.Tensor,
    returns: torch.Tensor,
    valid_mask: torch.Tensor,
    *,
    clip_eps: float,
    vf_coef: float,
    ent_coef: float,
    norm_adv: bool = True,
    clip_vloss: bool = False,
    all_sum: AllSum | None = None,
) -> SMPOLoss:
    """The SMPO loss from per-transition tensors of one shape (`[T, N]`, or `[B]` for a minibatch).

    The first three are the current network's outputs; the rest come from the rollout and GAE.
    Padded entries of every input may be garbage. If the network outputs were computed from
    garbage observations, their gradient is still poisoned: use `smpo_loss` instead.

    With `all_sum` these tensors are one rank's share of a batch spread over data-parallel ranks
    (learner/distributed.py): every mean is divided by the valid count of *all* ranks and the
    advantages are normalised with the mean and std of all ranks, so the ranks' losses (and their
    gradients) sum to the loss one learner would compute on the union of their entries.
    """
    # Sanitise first: from here on every entry is finite, and padded entries are constants 0.
    new_logprobs, entropy, new_values, old_logprobs, old_values, advantages, returns = (
        torch.where(valid_mask, x, 0.0)
        for x in (new_logprobs, entropy, new_values, old_logprobs, old_values, advantages, returns)
    )
    if norm_adv:
        advantages = normalize_advantages(advantages, valid_mask, all_sum=all_sum)

    # (L1) n = sum m over every rank; alone, batch_mean is masked_mean. With ranks, each one's term is its
    # own sum over the global n: its share of the global mean, still differentiable.
    num_valid = (valid_mask.sum() if all_sum is None else all_sum(valid_mask.sum())).clamp(min=1)

    def batch_mean(x: torch.Tensor) -> torch.Tensor:
        return torch.where(valid_mask, x, 0.0).sum() / num_valid

    # (L2) L_clip = -(1/sum m) sum m min(r A, clip(r, 1-eps, 1+eps) A), r = pi_new / pi_old
    log_ratio = new_logprobs - old_logprobs
    ratio = log_ratio.exp()
    surrogate = torch.min(ratio * advantages, ratio.clamp(1 - clip_eps, 1 + clip_eps) * advantages)
    policy_loss = -batch_mean(surrogate)

    # (L3) L_v = 0.5 * masked mean (V - R)^2, or CleanRL's clipped max when clip_vloss.
    value_error = (new_values - returns).square()
    if clip_vloss:
        clipped_values = old_values + (new_values - old_values).clamp(-clip_eps, clip_eps)
        value_error = torch.max(value_error, (clipped_values - returns).square())
    value_loss = 0.5 * batch_mean(value_error)

    # (L4) H = masked mean of the policy entropy.
    mean_entropy = batch_mean(entropy)

    # (L6)
    total = policy_loss + vf_coef * value_loss - ent_coef * mean_entropy

    with torch.no_grad():
        approx_kl = batch_mean((ratio - 1) - log_ratio)
        clip_fraction = batch_mean(((ratio - 1).abs() > clip_eps).to(ratio.dtype))
        new_values_ev = explained_variance(new_values, returns, valid_mask, all_sum)
    return SMPOLoss(
        total=total,
        policy_loss=policy_loss.detach(),
        value_loss=value_loss.detach(),
        entropy=mean_entropy.detach(),
        approx_kl=approx_kl,
        clip_fraction=clip_fraction,
        explained_variance=new_values_ev,
    )


def smpo_loss(
    policy: ActorCritic,
    obs: torch.Tensor,
    actions: torch.Tensor,
    old_logprobs: torch.Tensor,
    old_values: torch.Tensor,
    advantages: torch.Tensor,
    returns: torch.Tensor,
    valid_mask: torch.Tensor | None = None,
    all_sum: AllSum | None = None,
    **settings: float | bool,
) -> SMPOLoss:
    """Evaluate `policy` on (obs, actions) and return the SMPO loss.

    `obs` is `[*batch, *obs_shape]`, `actions` `[*batch, *act_shape]`, the rest `[*batch]`;
    `valid_mask=None` means every entry is valid (a compacted minibatch: plain PPO).
    `settings` are smpo_loss_terms' keywords, passed on as given: clip_eps, vf_coef and ent_coef
    (required), norm_adv and clip_vloss; `all_sum` as there (this rank's share of a batch over ranks).
    """
    if valid_mask is None:
        valid_mask = torch.ones(old_logprobs.shape, dtype=torch.bool, device=old_logprobs.device)
    # Zero padded inputs before the forward pass so no NaN reaches the network's backward.
    safe_obs = torch.where(_broadcast_mask(valid_mask, obs), obs, torch.zeros((), dtype=obs.dtype, device=obs.device))
    safe_actions = torch.where(
        _broadcast_mask(valid_mask, actions), actions, torch.zeros((), dtype=actions.dtype, device=actions.device)
    )
    _, new_logprobs, entropy, new_values = policy.get_action_and_value(safe_obs, safe_actions)
    return smpo_loss_terms(
        new_logprobs,
        entropy,
        new_values,
        old_logprobs,
        old_values,
        advantages,
        returns,
        valid_mask,
        all_sum=all_sum,
        **settings,
    )


def _broadcast_mask(valid_mask: torch.Tensor, per_step: torch.Tensor) -> torch.Tensor:
    """valid_mask `[*batch]` viewed as `[*batch, 1, ...]` to select whole rows of `per_step`."""
    return valid_mask.reshape(*valid_mask.shape, *([1] * (per_step.ndim - valid_mask.ndim)))
