"""SMPO exactness: the masked loss on a padded [T, N] grid equals plain PPO on the compacted data."""

from __future__ import annotations

import math

import pytest
import torch

from learner.gae import masked_gae
from learner.policy import ActionSpec, ActorCritic
from learner.smpo import (
    explained_variance,
    masked_mean,
    normalize_advantages,
    smpo_loss,
    smpo_loss_terms,
)

OBS_DIM = 5
COEFS = {"clip_eps": 0.2, "vf_coef": 0.5, "ent_coef": 0.01}


def make_policy(kind: str, seed: int = 0) -> ActorCritic:
    torch.manual_seed(seed)
    spec = ActionSpec.box(3) if kind == "box" else ActionSpec.discrete(4)
    policy = ActorCritic(OBS_DIM, spec).double()
    # Move the policy away from its init so ratios differ from 1 and some are clipped.
    with torch.no_grad():
        for parameter in policy.parameters():
            parameter.add_(0.3 * torch.randn_like(parameter))
    return policy


def make_grid(kind: str, num_steps: int = 17, num_slots: int = 6, seed: int = 1) -> dict[str, torch.Tensor]:
    """A float64 padded grid of transitions with clean (finite, random) padding."""
    generator = torch.Generator().manual_seed(seed)

    def normal(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator, dtype=torch.float64)

    grid = {
        "obs": normal(num_steps, num_slots, OBS_DIM),
        "logprobs": normal(num_steps, num_slots) - 2.0,
        "values": normal(num_steps, num_slots),
        "advantages": 2.0 * normal(num_steps, num_slots) + 0.5,
        "returns": normal(num_steps, num_slots),
        "valid_mask": torch.rand(num_steps, num_slots, generator=generator) < 0.6,
    }
    if kind == "box":
        grid["actions"] = normal(num_steps, num_slots, 3)
    else:
        grid["actions"] = torch.randint(0, 4, (num_steps, num_slots), generator=generator)
    return grid


def fill_padding(grid: dict[str, torch.Tensor], garbage: float) -> dict[str, torch.Tensor]:
    padding = ~grid["valid_mask"]
    filled = dict(grid)
    for name in ("obs", "actions", "logprobs", "values", "advantages", "returns"):
        tensor = grid[name].clone()
        if tensor.is_floating_point():
            tensor[padding] = garbage
        else:
            tensor[padding] = -(10**9)  # an int action that no Categorical accepts
        filled[name] = tensor
    return filled


def plain_ppo_loss(
    policy, obs, actions, logprobs, values, advantages, returns, *, clip_eps, vf_coef, ent_coef, norm_adv, clip_vloss
) -> torch.Tensor:
    """CleanRL's PPO loss, unmasked means, written without reference to the code under test."""
    _, new_logprob, entropy, new_value = policy.get_action_and_value(obs, actions)
    ratio = (new_logprob - logprobs).exp()
    if norm_adv:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    pg_loss = torch.max(-advantages * ratio, -advantages * torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps)).mean()
    if clip_vloss:
        unclipped = (new_value - returns) ** 2
        clipped = (values + torch.clamp(new_value - values, -clip_eps, clip_eps) - returns) ** 2
        v_loss = 0.5 * torch.max(unclipped, clipped).mean()
    else:
        v_loss = 0.5 * ((new_value - returns) ** 2).mean()
    return pg_loss - ent_coef * entropy.mean() + v_loss * vf_coef


def loss_and_grads(policy: ActorCritic, loss: torch.Tensor) -> tuple[float, list[torch.Tensor]]:
    grads = torch.autograd.grad(loss, list(policy.parameters()))
    return loss.item(), [g.clone() for g in grads]


def smpo_on_grid(policy: ActorCritic, grid: dict[str, torch.Tensor], **options) -> torch.Tensor:
    return smpo_loss(
        policy,
        grid["obs"],
        grid["actions"],
        grid["logprobs"],
        grid["values"],
        grid["advantages"],
        grid["returns"],
        grid["valid_mask"],
        **COEFS,
        **options,
    ).total


@pytest.mark.parametrize("kind", ["box", "discrete"])
@pytest.mark.parametrize("norm_adv", [True, False])
@pytest.mark.parametrize("clip_vloss", [False, True])
def test_smpo_gradient_equals_plain_ppo_on_compacted_batch(kind: str, norm_adv: bool, clip_vloss: bool) -> None:
    policy = make_policy(kind)
    grid = make_grid(kind)
    valid = grid["valid_mask"]
    assert 0 < valid.sum() < valid.numel()
    smpo = smpo_on_grid(policy, grid, norm_adv=norm_adv, clip_vloss=clip_vloss)
    smpo_value, smpo_grads = loss_and_grads(policy, smpo)
    compact = {name: tensor[valid] for name, tensor in grid.items() if name != "valid_mask"}
    plain = plain_ppo_loss(
        policy,
        compact["obs"],
        compact["actions"],
        compact["logprobs"],
        compact["values"],
        compact["advantages"],
        compact["returns"],
        **COEFS,
        norm_adv=norm_adv,
        clip_vloss=clip_vloss,
    )
    plain_value, plain_grads = loss_and_grads(policy, plain)
    assert smpo_value == pytest.approx(plain_value, abs=1e-10)
    for smpo_grad, plain_grad in zip(smpo_grads, plain_grads):
        torch.testing.assert_close(smpo_grad, plain_grad, rtol=0, atol=1e-10)
    assert any(g.abs().max() > 1e-3 for g in plain_grads), "the comparison must not be between two zero gradients"


@pytest.mark.parametrize("kind", ["box", "discrete"])
@pytest.mark.parametrize("garbage", [math.nan, 1e9, -math.inf])
def test_garbage_padding_leaves_loss_and_gradient_unchanged(kind: str, garbage: float) -> None:
    policy = make_policy(kind)
    grid = make_grid(kind)
    clean_value, clean_grads = loss_and_grads(policy, smpo_on_grid(policy, grid, clip_vloss=True))
    dirty = smpo_on_grid(policy, fill_padding(grid, garbage), clip_vloss=True)
    dirty_value, dirty_grads = loss_and_grads(policy, dirty)
    assert dirty_value == clean_value
    for dirty, clean in zip(dirty_grads, clean_grads):
        assert torch.equal(dirty, clean)


@pytest.mark.parametrize("garbage", [math.nan, 1e9])
def test_garbage_padding_through_gae_and_loss_leaves_gradient_unchanged(garbage: float) -> None:
    # The whole learner path on the [T, N] grid: rewards/values/bootstrap garbage hit GAE first.
    policy = make_policy("box")
    grid = make_grid("box", seed=3)
    valid = grid["valid_mask"]
    generator = torch.Generator().manual_seed(7)
    rewards = torch.randn(valid.shape, generator=generator, dtype=torch.float64)
    terminated = valid & (torch.rand(valid.shape, generator=generator) < 0.1)
    truncated = torch.zeros_like(valid)
    truncated[-1] = valid[-1] & ~terminated[-1]
    for slot in range(valid.shape[1]):  # end each slot's last valid step (producer invariant)
        last = valid[:, slot].nonzero().max()
        truncated[last, slot] = ~terminated[last, slot]
    bootstrap = torch.randn(valid.shape, generator=generator, dtype=torch.float64)

    def loss_from(rollout: dict[str, torch.Tensor], rewards: torch.Tensor, bootstrap: torch.Tensor):
        advantages, returns = masked_gae(
            rewards, rollout["values"], terminated, truncated, bootstrap, valid, gamma=0.99, lam=0.95
        )
        return loss_and_grads(policy, smpo_on_grid(policy, {**rollout, "advantages": advantages, "returns": returns}))

    clean_value, clean_grads = loss_from(grid, rewards, bootstrap)
    dirty_rewards = torch.where(valid, rewards, garbage)
    dirty_bootstrap = torch.where(truncated, bootstrap, garbage)
    dirty_value, dirty_grads = loss_from(fill_padding(grid, garbage), dirty_rewards, dirty_bootstrap)
    assert math.isfinite(clean_value) and dirty_value == clean_value
    for dirty, clean in zip(dirty_grads, clean_grads):
        assert torch.equal(dirty, clean)


def test_masked_helpers_equal_plain_statistics_on_valid_entries() -> None:
    grid = make_grid("box")
    valid = grid["valid_mask"]
    x = torch.where(valid, grid["advantages"], math.nan)
    compact = grid["advantages"][valid]
    assert masked_mean(x, valid).item() == pytest.approx(compact.mean().item(), abs=1e-12)
    normalized = normalize_advantages(x, valid)
    expected_normalized = (compact - compact.mean()) / (compact.std() + 1e-8)
    torch.testing.assert_close(normalized[valid], expected_normalized, rtol=0, atol=1e-12)
    assert (normalized[~valid] == 0).all()
    predicted = torch.where(valid, grid["values"], math.nan)
    expected_ev = 1 - (compact - grid["values"][valid]).var(unbiased=False) / compact.var(unbiased=False)
    assert explained_variance(predicted, x, valid).item() == pytest.approx(expected_ev.item(), abs=1e-12)


def test_explained_variance_is_nan_for_constant_targets_and_one_for_perfect_prediction() -> None:
    valid = torch.tensor([True, True, False, True])
    target = torch.tensor([1.0, 2.0, math.nan, 4.0], dtype=torch.float64)
    assert explained_variance(target, target, valid).item() == 1.0
    assert math.isnan(explained_variance(target, torch.ones(4, dtype=torch.float64), valid).item())


def test_smpo_diagnostics_match_plain_formulas() -> None:
    policy = make_policy("box")
    grid = make_grid("box")
    valid = grid["valid_mask"]
    loss = smpo_loss(
        policy,
        grid["obs"],
        grid["actions"],
        grid["logprobs"],
        grid["values"],
        grid["advantages"],
        grid["returns"],
        valid,
        **COEFS,
    )
    with torch.no_grad():
        _, new_logprob, entropy, new_value = policy.get_action_and_value(grid["obs"][valid], grid["actions"][valid])
        log_ratio = new_logprob - grid["logprobs"][valid]
        ratio = log_ratio.exp()
    assert loss.approx_kl.item() == pytest.approx(((ratio - 1) - log_ratio).mean().item(), abs=1e-12)
    assert loss.clip_fraction.item() == pytest.approx(((ratio - 1).abs() > 0.2).double().mean().item(), abs=1e-12)
    assert 0.0 < loss.clip_fraction.item() < 1.0
    assert loss.entropy.item() == pytest.approx(entropy.mean().item(), abs=1e-12)
    value_loss = 0.5 * ((new_value - grid["returns"][valid]) ** 2).mean()
    assert loss.value_loss.item() == pytest.approx(value_loss.item(), abs=1e-12)
    for stat in (loss.policy_loss, loss.value_loss, loss.entropy, loss.approx_kl, loss.clip_fraction):
        assert not stat.requires_grad


def test_smpo_loss_with_no_valid_transition_is_zero_with_zero_gradient() -> None:
    policy = make_policy("discrete")
    grid = fill_padding(make_grid("discrete"), math.nan)
    grid["valid_mask"] = torch.zeros_like(grid["valid_mask"])
    grid = fill_padding(grid, math.nan)
    value, grads = loss_and_grads(policy, smpo_on_grid(policy, grid))
    assert value == 0.0
    assert all((g == 0).all() for g in grads)


def test_smpo_loss_terms_select_rather_than_multiply() -> None:
    # Direct call on [B] tensors with NaN network outputs at padding: the loss stays finite.
    valid = torch.tensor([True, False, True])
    nan = math.nan
    terms = smpo_loss_terms(
        new_logprobs=torch.tensor([-1.0, nan, -2.0]),
        entropy=torch.tensor([1.0, nan, 1.0]),
        new_values=torch.tensor([0.5, nan, 0.0]),
        old_logprobs=torch.tensor([-1.0, nan, -2.0]),
        old_values=torch.tensor([0.5, nan, 0.0]),
        advantages=torch.tensor([1.0, nan, -1.0]),
        returns=torch.tensor([1.5, nan, -1.0]),
        valid_mask=valid,
        **COEFS,
    )
    # ratio = 1 everywhere, normalised advantages are +-1/sqrt(2): L_clip = 0; L_v = 0.5 * mean(1, 1) = 0.5.
    assert terms.policy_loss.item() == pytest.approx(0.0, abs=1e-7)
    assert terms.value_loss.item() == pytest.approx(0.5, abs=1e-7)
    assert terms.total.item() == pytest.approx(0.5 * 0.5 - 0.01 * 1.0, abs=1e-7)
