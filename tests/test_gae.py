"""Masked GAE against a slow per-slot, per-episode reference, and tiny hand-computed cases."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from learner.gae import masked_gae


def random_masked_rollout(
    num_steps: int, num_slots: int, seed: int, garbage: float = math.nan
) -> dict[str, torch.Tensor]:
    """A float64 [T, N] rollout whose flags respect the producer invariant, padding filled with `garbage`.

    Padding sits anywhere (mid-episode, after an episode, at the start); valid steps end
    episodes at random (terminated, truncated or both); each slot's last valid step is forced
    to end its episode, as the broker's end-of-rollout truncation does.
    """
    rng = np.random.default_rng(seed)
    valid = rng.random((num_steps, num_slots)) < 0.7
    terminated = valid & (rng.random((num_steps, num_slots)) < 0.08)
    truncated = valid & (rng.random((num_steps, num_slots)) < 0.05)
    for slot in range(num_slots):
        valid_steps = np.flatnonzero(valid[:, slot])
        if len(valid_steps) and not (terminated[valid_steps[-1], slot] or truncated[valid_steps[-1], slot]):
            truncated[valid_steps[-1], slot] = True
    rollout = {
        "rewards": rng.normal(size=(num_steps, num_slots)),
        "values": rng.normal(size=(num_steps, num_slots)),
        "bootstrap_values": rng.normal(size=(num_steps, num_slots)),
    }
    for name in rollout:
        rollout[name][~valid] = garbage
    # bootstrap_values is read only at truncated steps: garbage everywhere else too.
    rollout["bootstrap_values"][~truncated] = garbage
    tensors = {name: torch.tensor(array, dtype=torch.float64) for name, array in rollout.items()}
    tensors.update(
        terminated=torch.tensor(terminated), truncated=torch.tensor(truncated), valid_mask=torch.tensor(valid)
    )
    return tensors


def reference_gae(rollout: dict[str, torch.Tensor], gamma: float, lam: float) -> tuple[np.ndarray, np.ndarray]:
    """Obviously-right GAE: per slot, split the valid steps into episodes, loop each backwards."""
    rewards, values, bootstrap = (rollout[k].tolist() for k in ("rewards", "values", "bootstrap_values"))
    terminated, truncated, valid = (rollout[k].tolist() for k in ("terminated", "truncated", "valid_mask"))
    num_steps, num_slots = len(rewards), len(rewards[0])
    advantages = np.zeros((num_steps, num_slots))
    returns = np.zeros((num_steps, num_slots))
    for slot in range(num_slots):
        episodes: list[list[int]] = []
        current: list[int] = []
        for t in range(num_steps):
            if not valid[t][slot]:
                continue
            current.append(t)
            if terminated[t][slot] or truncated[t][slot]:
                episodes.append(current)
                current = []
        assert not current, "the generator must end every slot's last valid step"
        for episode in episodes:
            end = episode[-1]
            value_after_end = 0.0 if terminated[end][slot] else bootstrap[end][slot]
            gae = 0.0
            for i in reversed(range(len(episode))):
                t = episode[i]
                next_value = value_after_end if i == len(episode) - 1 else values[episode[i + 1]][slot]
                delta = rewards[t][slot] + gamma * next_value - values[t][slot]
                gae = delta + gamma * lam * gae
                advantages[t, slot] = gae
                returns[t, slot] = gae + values[t][slot]
    return advantages, returns


def run_gae(rollout: dict[str, torch.Tensor], gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    return masked_gae(
        rollout["rewards"],
        rollout["values"],
        rollout["terminated"],
        rollout["truncated"],
        rollout["bootstrap_values"],
        rollout["valid_mask"],
        gamma=gamma,
        lam=lam,
    )


@pytest.mark.parametrize(("gamma", "lam"), [(0.99, 0.95), (1.0, 1.0), (0.9, 0.0), (0.0, 0.7), (0.5, 1.0)])
@pytest.mark.parametrize(("num_steps", "num_slots", "seed"), [(123, 7, 0), (1, 1, 1), (37, 13, 2), (2, 3, 3)])
def test_masked_gae_matches_reference_loop(gamma: float, lam: float, num_steps: int, num_slots: int, seed: int) -> None:
    rollout = random_masked_rollout(num_steps, num_slots, seed)
    advantages, returns = run_gae(rollout, gamma, lam)
    expected_advantages, expected_returns = reference_gae(rollout, gamma, lam)
    torch.testing.assert_close(advantages, torch.from_numpy(expected_advantages), rtol=0, atol=1e-12)
    torch.testing.assert_close(returns, torch.from_numpy(expected_returns), rtol=0, atol=1e-12)


@settings(max_examples=60, deadline=None)
@given(
    num_steps=st.integers(1, 40),
    num_slots=st.integers(1, 9),
    seed=st.integers(0, 2**32 - 1),
    gamma=st.floats(0.0, 1.0),
    lam=st.floats(0.0, 1.0),
)
def test_masked_gae_matches_reference_loop_on_any_size(
    num_steps: int, num_slots: int, seed: int, gamma: float, lam: float
) -> None:
    rollout = random_masked_rollout(num_steps, num_slots, seed)
    advantages, returns = run_gae(rollout, gamma, lam)
    expected_advantages, expected_returns = reference_gae(rollout, gamma, lam)
    torch.testing.assert_close(advantages, torch.from_numpy(expected_advantages), rtol=0, atol=1e-12)
    torch.testing.assert_close(returns, torch.from_numpy(expected_returns), rtol=0, atol=1e-12)


@pytest.mark.parametrize("garbage", [math.nan, 1e9, -math.inf])
def test_masked_gae_padding_is_zero_and_finite(garbage: float) -> None:
    rollout = random_masked_rollout(123, 7, seed=4, garbage=garbage)
    advantages, returns = run_gae(rollout, 0.99, 0.95)
    padding = ~rollout["valid_mask"]
    assert padding.any()
    assert torch.isfinite(advantages).all() and torch.isfinite(returns).all()
    assert (advantages[padding] == 0).all() and (returns[padding] == 0).all()


def test_masked_gae_ignores_padding_contents() -> None:
    with_nan = random_masked_rollout(64, 5, seed=5, garbage=math.nan)
    with_huge = random_masked_rollout(64, 5, seed=5, garbage=1e9)
    for left, right in zip(run_gae(with_nan, 0.97, 0.9), run_gae(with_huge, 0.97, 0.9)):
        assert torch.equal(left, right)


def test_masked_gae_padding_mid_episode_equals_no_padding() -> None:
    # One slot: steps 0, 2, 4 valid (one episode, truncated at 4), steps 1, 3 lost to a fault.
    nan = math.nan
    padded = {
        "rewards": torch.tensor([[1.0], [nan], [2.0], [nan], [3.0]], dtype=torch.float64),
        "values": torch.tensor([[0.5], [nan], [0.25], [nan], [-1.0]], dtype=torch.float64),
        "bootstrap_values": torch.tensor([[nan], [nan], [nan], [nan], [4.0]], dtype=torch.float64),
        "terminated": torch.tensor([[False]] * 5),
        "truncated": torch.tensor([[False], [False], [False], [False], [True]]),
        "valid_mask": torch.tensor([[True], [False], [True], [False], [True]]),
    }
    dense = {name: tensor[[0, 2, 4]] for name, tensor in padded.items()}
    padded_advantages, padded_returns = run_gae(padded, 0.9, 0.8)
    dense_advantages, dense_returns = run_gae(dense, 0.9, 0.8)
    assert torch.equal(padded_advantages[[0, 2, 4]], dense_advantages)
    assert torch.equal(padded_returns[[0, 2, 4]], dense_returns)


def one_slot_episode(rewards: list[float], values: list[float], *, terminated: bool, bootstrap: float = 0.0):
    num_steps = len(rewards)
    end = torch.zeros(num_steps, 1, dtype=torch.bool)
    end[-1] = True
    return {
        "rewards": torch.tensor(rewards, dtype=torch.float64).unsqueeze(1),
        "values": torch.tensor(values, dtype=torch.float64).unsqueeze(1),
        "bootstrap_values": torch.full((num_steps, 1), bootstrap, dtype=torch.float64),
        "terminated": end if terminated else torch.zeros_like(end),
        "truncated": torch.zeros_like(end) if terminated else end,
        "valid_mask": torch.ones(num_steps, 1, dtype=torch.bool),
    }


@pytest.mark.parametrize(("gamma", "lam"), [(0.99, 0.95), (1.0, 1.0), (0.5, 0.5)])
def test_masked_gae_reward_only_at_last_step(gamma: float, lam: float) -> None:
    # V = 0 everywhere: delta is 1 at the last step, 0 before, so A_t = (gamma * lam)^(T-1-t).
    rollout = one_slot_episode([0.0, 0.0, 0.0, 0.0, 1.0], [0.0] * 5, terminated=True)
    advantages, returns = run_gae(rollout, gamma, lam)
    expected = torch.tensor([(gamma * lam) ** (4 - t) for t in range(5)], dtype=torch.float64).unsqueeze(1)
    torch.testing.assert_close(advantages, expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(returns, expected, rtol=0, atol=1e-12)


def test_masked_gae_correct_constant_value_gives_zero_advantage() -> None:
    # V = c is exact for reward (1 - gamma) c forever: every TD error is 0, so every A_t is 0
    # and R_t = c, provided the truncation bootstraps with V(s_next) = c.
    gamma, c = 0.9, 10.0
    rollout = one_slot_episode([(1 - gamma) * c] * 6, [c] * 6, terminated=False, bootstrap=c)
    advantages, returns = run_gae(rollout, gamma, 0.95)
    torch.testing.assert_close(advantages, torch.zeros(6, 1, dtype=torch.float64), rtol=0, atol=1e-12)
    torch.testing.assert_close(returns, torch.full((6, 1), c, dtype=torch.float64), rtol=0, atol=1e-12)


def test_masked_gae_truncation_bootstraps_and_termination_does_not() -> None:
    gamma = 0.9
    truncated_step = one_slot_episode([1.0], [0.5], terminated=False, bootstrap=2.0)
    terminated_step = one_slot_episode([1.0], [0.5], terminated=True, bootstrap=2.0)
    truncated_advantage, _ = run_gae(truncated_step, gamma, 0.95)
    terminated_advantage, _ = run_gae(terminated_step, gamma, 0.95)
    assert truncated_advantage.item() == pytest.approx(1.0 + gamma * 2.0 - 0.5, abs=1e-15)
    assert terminated_advantage.item() == pytest.approx(1.0 - 0.5, abs=1e-15)


def test_masked_gae_terminated_wins_over_truncated() -> None:
    rollout = one_slot_episode([1.0], [0.5], terminated=True, bootstrap=2.0)
    rollout["truncated"] = rollout["terminated"].clone()
    advantages, _ = run_gae(rollout, 0.9, 0.95)
    assert advantages.item() == pytest.approx(0.5, abs=1e-15)


def test_masked_gae_carry_resets_between_episodes() -> None:
    # Two back-to-back terminated episodes in one slot: the first's advantage must not see the second's reward.
    rollout = one_slot_episode([0.0, 0.0, 5.0], [0.0] * 3, terminated=True)
    rollout["terminated"][0] = True
    advantages, _ = run_gae(rollout, 1.0, 1.0)
    assert advantages[:, 0].tolist() == [0.0, 5.0, 5.0]


def test_masked_gae_rejects_mismatched_shapes_naming_the_input() -> None:
    rollout = random_masked_rollout(5, 3, seed=6)
    rollout["rewards"] = rollout["rewards"][:4]
    with pytest.raises(ValueError, match="rewards"):
        run_gae(rollout, 0.99, 0.95)
    rollout = random_masked_rollout(5, 3, seed=6)
    rollout["valid_mask"] = rollout["valid_mask"].double()
    with pytest.raises(ValueError, match="valid_mask"):
        run_gae(rollout, 0.99, 0.95)
