"""The broker's hand-rolled Gaussian sampling scores actions exactly as the learner does."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from broker.policy_runner import OBS_CLIP, OBS_EPS, PolicyRunner, policy_layout
from fast.spaces import SpaceSpec
from learner.policy import ActorCritic, ObservationNormalizer, export_weights, import_weights

ROOT = Path(__file__).resolve().parents[1]


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


# -- no torch on a Box policy: the payload read by fast/weights.py, laid out as ActorCritic's -----------

_DISCRETE3 = SpaceSpec("discrete", (), np.dtype(np.int64), n=3)


@pytest.mark.parametrize(
    ("obs_shape", "action_space", "hidden", "obs_norm"),
    [
        ((4,), _box((2,), -1, 1), (8,), False),
        ((3, 5), _box((2, 3), -1, 1), (16, 8, 4), True),
        ((7,), _DISCRETE3, (64, 64), False),
        ((2, 2), _DISCRETE3, (5,), True),
        ((6,), _box((1,), -1, 1), (), True),
    ],
)
def test_policy_layout_is_actor_critics_state_dict(obs_shape, action_space, hidden, obs_norm) -> None:
    """policy_layout restates learner/policy.py's network without torch: this fails if the two drift."""
    state = ActorCritic(obs_shape, action_space, hidden, obs_norm=obs_norm).state_dict()
    expected = [(name, tuple(t.shape), t.numpy().dtype) for name, t in state.items()]
    got = policy_layout(obs_shape, action_space, hidden, obs_norm=obs_norm)
    assert [(name, shape, dtype) for name, (shape, dtype) in got.items()] == expected


def test_the_normaliser_constants_are_the_learners() -> None:
    assert OBS_CLIP == ObservationNormalizer.CLIP
    normalizer = ObservationNormalizer(3)
    normalizer.var.fill_(0.0)  # where the epsilon is all of the scale
    x = torch.tensor([[1e-5, -2e-4, 3.0]])
    want = normalizer(x).numpy()
    np.testing.assert_allclose(np.clip(x.numpy() / np.sqrt(OBS_EPS), -OBS_CLIP, OBS_CLIP), want, rtol=1e-6)


def _old_snapshot(policy: ActorCritic) -> list[np.ndarray]:
    """What the runner copied from its torch module before it read the payload itself."""
    linear = [m for seq in (policy.actor_mean, policy.critic) for m in seq if isinstance(m, torch.nn.Linear)]
    out = [a for m in linear for a in (m.weight.detach().numpy().T.copy(), m.bias.detach().numpy().copy())]
    out.append(policy.actor_logstd.detach().numpy()[0].copy())
    if policy.obs_normalizer is not None:
        out.append(policy.obs_normalizer.mean.numpy().astype(np.float32))
        out.append(np.sqrt(policy.obs_normalizer.var.numpy() + 1e-8).astype(np.float32))
    return out


def _new_snapshot(runner: PolicyRunner) -> list[np.ndarray]:
    out = [a for layer in (*runner._actor, *runner._critic) for a in layer] + [runner._log_std]
    return out + ([runner._obs_mean, runner._obs_std] if runner._obs_mean is not None else [])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("obs_norm", [False, True])
def test_a_box_load_copies_what_import_weights_loads_bit_for_bit(dtype, obs_norm) -> None:
    obs_space, act_space = _box((5,), -9, 9), _box((2,), -1, 1)
    torch.manual_seed(11)
    source = ActorCritic((5,), act_space, (16, 8), obs_norm=obs_norm, init_log_std=-0.4).to(dtype)
    if obs_norm:
        source.obs_normalizer.observe(torch.randn(9, 5, dtype=torch.float64) * 3 + 1)
    payload = export_weights(source)
    old = ActorCritic((5,), act_space, (16, 8))  # not told about the normaliser: the weights say
    import_weights(old, payload)
    runner = PolicyRunner(obs_space, act_space, (16, 8), seed=2)
    runner.load(4, payload)
    assert runner.version == 4
    for want, got in zip(_old_snapshot(old), _new_snapshot(runner), strict=True):
        assert want.dtype == got.dtype and want.tobytes() == got.tobytes()
    for want, got in zip(old.state_dict().values(), runner.policy.state_dict().values(), strict=True):
        assert torch.equal(want, got)  # and the torch module, built after the load, holds the same


def test_a_box_runner_before_any_load_acts_with_the_seeded_initial_weights() -> None:
    obs_space, act_space = _box((4,), -1, 1), _box((2,), -1, 1)
    torch.manual_seed(7)
    initial = ActorCritic((4,), act_space, (8,), obs_norm=True)
    runner = PolicyRunner(obs_space, act_space, (8,), seed=7, obs_norm=True)
    obs = np.random.default_rng(1).normal(size=(3, 4)).astype(np.float32)
    runner.act_deterministic(obs)
    for want, got in zip(_old_snapshot(initial), _new_snapshot(runner), strict=True):
        assert want.tobytes() == got.tobytes()
    edited = PolicyRunner(obs_space, act_space, (8,), seed=7, obs_norm=True)
    with torch.no_grad():
        edited.policy.actor_logstd.fill_(-3.0)  # reaches inference only through load, as before
    assert edited._log_std.tobytes() == runner._log_std.tobytes()


def test_weights_that_do_not_fit_are_refused_as_import_weights_refuses_them() -> None:
    runner = PolicyRunner(_box((4,), -1, 1), _box((2,), -1, 1), (8,))
    with pytest.raises(ValueError, match=r"^import_weights: not a weights payload \("):
        runner.load(1, b"not torch")
    with pytest.raises(ValueError, match=r"^import_weights: weights do not match this policy: missing.*actor_logstd"):
        runner.load(1, export_weights(ActorCritic(4, _DISCRETE3, (8,))))
    with pytest.raises(ValueError, match=r"^import_weights: weights do not match this policy: size mismatch"):
        runner.load(1, export_weights(ActorCritic(4, _box((2,), -1, 1), (9,))))
    with pytest.raises(ValueError, match="do not match this policy: missing.*obs_normalizer"):
        PolicyRunner(_box((4,), -1, 1), _box((2,), -1, 1), (8,), obs_norm=True).load(
            1, export_weights(ActorCritic(4, _box((2,), -1, 1), (8,)))
        )
    assert runner.version == -1
    # A normaliser, once the weights bring one, stays (learner/policy.py fit_normalizer), as it did.
    runner.load(2, export_weights(ActorCritic(4, _box((2,), -1, 1), (8,), obs_norm=True)))
    with pytest.raises(ValueError, match="missing.*obs_normalizer"):
        runner.load(3, export_weights(ActorCritic(4, _box((2,), -1, 1), (8,))))
    assert runner.version == 2


def test_discrete_sampling_draws_torchs_global_rng_as_it_did() -> None:
    """Stream-less discrete actions come from torch's global RNG, seeded and drawn at construction
    as before: even a runner built in between (an evaluation's) moves it as it did."""
    obs = np.random.default_rng(0).normal(size=(6, 4)).astype(np.float32)
    torch.manual_seed(3)
    old = ActorCritic((4,), _DISCRETE3, (8,))
    torch.manual_seed(9)
    ActorCritic((4,), _DISCRETE3, (8,))  # the other runner's construction
    with torch.no_grad():
        expected = [old.get_action_and_value(torch.as_tensor(obs)) for _ in range(5)]
    runner = PolicyRunner(_box((4,), -1, 1), _DISCRETE3, (8,), seed=3)
    runner.load(0, export_weights(runner.policy))
    PolicyRunner(_box((4,), -1, 1), _DISCRETE3, (8,), seed=9)
    for action, logprob, _, value in expected:
        d = runner.act(obs)
        np.testing.assert_array_equal(d.actions, action.numpy())
        assert d.logprobs.tobytes() == logprob.numpy().tobytes() and d.values.tobytes() == value.numpy().tobytes()


def test_a_box_runner_loads_and_acts_without_importing_torch(tmp_path) -> None:
    payload = tmp_path / "weights.pt"
    payload.write_bytes(export_weights(ActorCritic(4, _box((2,), -1, 1), (8,), obs_norm=True)))
    code = (
        "import sys, numpy as np\n"
        "from broker.policy_runner import PolicyRunner\n"
        "from fast.spaces import SpaceSpec\n"
        "def box(n): return SpaceSpec('box', (n,), np.dtype('f4'), np.full(n, -1, 'f4'), np.ones(n, 'f4'))\n"
        "runner = PolicyRunner(box(4), box(2), (8,), seed=1)\n"
        f"runner.load(1, open({str(payload)!r}, 'rb').read())\n"
        "obs = np.ones((3, 4), np.float32)\n"
        "runner.act(obs); runner.act(obs, stream=2); runner.value(obs); runner.act_deterministic(obs)\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False"]
