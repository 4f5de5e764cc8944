"""The broker's hand-rolled Gaussian sampling scores actions exactly as the learner does."""

from __future__ import annotations

import numpy as np
import torch

from broker.policy_runner import PolicyRunner
from fast.spaces import SpaceSpec
from learner.policy import export_weights


def _box(shape, low, high) -> SpaceSpec:
    return SpaceSpec(
        "box", shape, np.dtype(np.float32), np.full(shape, low, np.float32), np.full(shape, high, np.float32)
    )


def test_act_logprobs_and_values_match_actor_critic() -> None:
    runner = PolicyRunner(_box((7,), -5, 5), _box((3,), -1, 1), (16, 16), seed=1)
    with torch.no_grad():
        runner.policy.actor_logstd.fill_(-0.3)
    runner.load(1, export_weights(runner.policy))  # weights reach the numpy copy only through load
    obs = np.random.default_rng(0).normal(size=(11, 7)).astype(np.float32)
    d = runner.act(obs)
    _, logprob, _, value = runner.policy.get_action_and_value(torch.as_tensor(obs), torch.as_tensor(d.actions))
    np.testing.assert_allclose(d.logprobs, logprob.detach().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(d.values, value.detach().numpy(), rtol=1e-5, atol=1e-5)
    assert d.env_actions.dtype == np.float32 and (np.abs(d.env_actions) <= 1).all()
    assert (d.actions != d.env_actions).any() or np.abs(d.actions).max() <= 1  # stored unclipped


def test_act_is_seeded_and_weights_load() -> None:
    a = PolicyRunner(_box((4,), -1, 1), _box((2,), -1, 1), (8,), seed=5)
    b = PolicyRunner(_box((4,), -1, 1), _box((2,), -1, 1), (8,), seed=5)
    b.load(3, export_weights(a.policy))
    obs = np.ones((2, 4), np.float32)
    np.testing.assert_array_equal(a.act(obs).actions, b.act(obs).actions)
    assert b.version == 3


def test_discrete_actions_are_int64_in_range() -> None:
    runner = PolicyRunner(_box((4,), -1, 1), SpaceSpec("discrete", (), np.dtype(np.int64), n=3), (8,))
    d = runner.act(np.zeros((50, 4), np.float32))
    assert d.actions.dtype == np.int64 and set(d.env_actions.tolist()) <= {0, 1, 2}
    assert runner.act_deterministic(np.zeros((2, 4), np.float32)).dtype == np.int64
