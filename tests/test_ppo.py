"""The PPO update: padding changes nothing, determinism, learning, config and batch validation, devices."""

from __future__ import annotations

import copy
import dataclasses
import math
import re

import numpy as np
import pytest
import torch

from learner.batch import RolloutBatch
from learner.device import pick_device
from learner.policy import ActionSpec, ActorCritic, export_weights, import_weights
from learner.ppo import PPOConfig, PPOLearner
from learner.wire import STATS_FIELDS

OBS_DIM = 4
CONFIG = PPOConfig(update_epochs=3, num_minibatches=4, lr=1e-2, ent_coef=0.01, seed=3)


def make_policy(kind: str, seed: int = 0, dtype: torch.dtype = torch.float64) -> ActorCritic:
    torch.manual_seed(seed)
    spec = ActionSpec.box(2) if kind == "box" else ActionSpec.discrete(3)
    return ActorCritic(OBS_DIM, spec).to(dtype)


def padded_batch(
    kind: str, num_steps: int, num_slots: int, valid_per_slot: int, seed: int, garbage: float = math.nan
) -> RolloutBatch:
    """A float64 batch with `valid_per_slot` valid steps per slot at random positions.

    Padding holds `garbage`; flags respect the producer invariant.
    """
    rng = np.random.default_rng(seed)
    valid = np.zeros((num_steps, num_slots), dtype=bool)
    for slot in range(num_slots):
        valid[rng.choice(num_steps, size=valid_per_slot, replace=False), slot] = True
    terminated = valid & (rng.random(valid.shape) < 0.1)
    truncated = valid & (rng.random(valid.shape) < 0.05)
    for slot in range(num_slots):
        last = np.flatnonzero(valid[:, slot])[-1]
        truncated[last, slot] |= not terminated[last, slot]
    arrays = {
        "obs": rng.normal(size=(num_steps, num_slots, OBS_DIM)),
        "logprobs": rng.normal(size=valid.shape) - 1.5,
        "values": rng.normal(size=valid.shape),
        "rewards": rng.normal(size=valid.shape),
        "bootstrap_values": rng.normal(size=valid.shape),
    }
    if kind == "box":
        arrays["actions"] = rng.normal(size=(num_steps, num_slots, 2))
    else:
        arrays["actions"] = rng.integers(0, 3, size=valid.shape)
    for name, array in arrays.items():
        if array.dtype.kind == "f":
            array[~valid] = garbage
        else:
            array[~valid] = -(10**9)
    arrays["bootstrap_values"][~truncated] = garbage
    return RolloutBatch.from_numpy(
        {**arrays, "terminated": terminated, "truncated": truncated, "valid_mask": valid, "policy_version": 7}
    )


def compacted(batch: RolloutBatch, layout: str) -> RolloutBatch:
    """The same valid transitions with no padding at all.

    layout "per_slot": [K, N], each slot's valid steps moved up (needs equal counts per slot).
    layout "one_slot": [num_valid, 1], slot after slot; every slot ends its last episode, so
    concatenating them keeps every episode intact.
    """
    valid = batch.valid_mask
    per_slot = {}
    for name in ("obs", "actions", "logprobs", "values", "rewards", "terminated", "truncated", "bootstrap_values"):
        tensor = getattr(batch, name)
        per_slot[name] = [tensor[valid[:, slot], slot] for slot in range(batch.num_slots)]
    if layout == "per_slot":
        fields = {name: torch.stack(columns, dim=1) for name, columns in per_slot.items()}
    else:
        fields = {name: torch.cat(columns).unsqueeze(1) for name, columns in per_slot.items()}
    fields["bootstrap_values"] = torch.where(fields["truncated"], fields["bootstrap_values"], 0.0)
    fields["valid_mask"] = torch.ones_like(fields["terminated"])
    return RolloutBatch(**fields, policy_version=batch.policy_version)


def parameters_after_updates(kind: str, batches: list[RolloutBatch], config: PPOConfig = CONFIG):
    learner = PPOLearner(make_policy(kind), config, device="cpu")
    stats = [learner.update(batch) for batch in batches]
    return [p.detach().clone() for p in learner.policy.parameters()], stats


@pytest.mark.parametrize("kind", ["box", "discrete"])
@pytest.mark.parametrize("layout", ["per_slot", "one_slot"])
def test_update_on_padded_batch_equals_update_on_compacted_batch(kind: str, layout: str) -> None:
    batches = [padded_batch(kind, 29, 5, valid_per_slot=19, seed=seed) for seed in (0, 1)]
    padded_params, padded_stats = parameters_after_updates(kind, batches)
    compact_params, compact_stats = parameters_after_updates(kind, [compacted(b, layout) for b in batches])
    initial_params = list(make_policy(kind).parameters())
    assert any(not torch.allclose(p, q) for p, q in zip(padded_params, initial_params)), "the update must move"
    for padded, compact in zip(padded_params, compact_params):
        torch.testing.assert_close(padded, compact, rtol=0, atol=1e-10)
    compared = ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction", "grad_norm", "explained_variance")
    for key in compared:
        assert padded_stats[-1][key] == pytest.approx(compact_stats[-1][key], abs=1e-10)
    assert padded_stats[0]["num_valid"] == compact_stats[0]["num_valid"] == 5 * 19
    assert padded_stats[0]["num_total"] == 29 * 5


@pytest.mark.parametrize("garbage", [math.nan, 1e9])
def test_update_ignores_padding_contents(garbage: float) -> None:
    clean = parameters_after_updates("box", [padded_batch("box", 23, 4, 11, seed=5, garbage=0.0)])[0]
    dirty = parameters_after_updates("box", [padded_batch("box", 23, 4, 11, seed=5, garbage=garbage)])[0]
    for left, right in zip(clean, dirty):
        assert torch.equal(left, right)


def test_update_is_deterministic_given_seed() -> None:
    batch = padded_batch("box", 31, 3, 20, seed=8)
    first, _ = parameters_after_updates("box", [batch, batch])
    second, _ = parameters_after_updates("box", [batch, batch])
    other_seed, _ = parameters_after_updates("box", [batch, batch], dataclasses.replace(CONFIG, seed=4))
    assert all(torch.equal(p, q) for p, q in zip(first, second))
    assert not all(torch.equal(p, q) for p, q in zip(first, other_seed))


def test_update_resumes_identically_from_state_dict() -> None:
    batches = [padded_batch("discrete", 17, 3, 9, seed=seed) for seed in (10, 11)]
    straight, _ = parameters_after_updates("discrete", batches)
    first = PPOLearner(make_policy("discrete"), CONFIG, device="cpu")
    first.update(batches[0])
    state = copy.deepcopy(first.state_dict())
    resumed = PPOLearner(make_policy("discrete", seed=99), CONFIG, device="cpu")
    resumed.load_state_dict(state)
    resumed.update(batches[1])
    assert all(torch.equal(p, q) for p, q in zip(straight, resumed.policy.parameters()))


def test_update_statistics_are_finite_and_complete() -> None:
    learner = PPOLearner(make_policy("box", dtype=torch.float32), CONFIG, device="cpu")
    stats = learner.update(padded_batch("box", 40, 6, 25, seed=12).to("cpu", dtype=torch.float32))
    expected_keys = set(STATS_FIELDS)  # what the wire carries (fast.v1.UpdateStats)
    assert set(stats) == expected_keys
    assert all(math.isfinite(value) for value in stats.values())
    assert stats["num_valid"] == 150 and stats["num_total"] == 240
    assert 0.0 <= stats["clip_fraction"] <= 1.0 and stats["update_time_s"] > 0.0


def test_update_moves_mean_action_toward_rewarded_action() -> None:
    # A one-step bandit: reward -(a - 0.5)^2, every episode terminates at its only step.
    # A quarter of the slots are padding (NaN), as DPSA leaves them after early terminations.
    torch.manual_seed(0)
    policy = ActorCritic(1, ActionSpec.box(1))
    config = PPOConfig(lr=1e-2, update_epochs=4, num_minibatches=4, seed=0)
    learner = PPOLearner(policy, config, device="cpu")
    obs = torch.ones(1, 256, 1)
    generator = torch.Generator().manual_seed(1)

    def mean_action() -> float:
        with torch.no_grad():
            return policy.actor_mean(obs[0, :1]).item()

    start = mean_action()
    for _ in range(15):
        with torch.no_grad():
            actions, logprobs, _, values = policy.get_action_and_value(obs)
        valid = torch.rand(1, 256, generator=generator) < 0.75
        rewards = -((actions[..., 0] - 0.5) ** 2)
        learner.update(
            RolloutBatch(
                obs=torch.where(valid[..., None], obs, math.nan),
                actions=torch.where(valid[..., None], actions, math.nan),
                logprobs=torch.where(valid, logprobs, math.nan),
                values=torch.where(valid, values, math.nan),
                rewards=torch.where(valid, rewards, math.nan),
                terminated=valid.clone(),
                truncated=torch.zeros_like(valid),
                valid_mask=valid,
                bootstrap_values=torch.full_like(values, math.nan),
                policy_version=0,
            )
        )
    assert abs(start) < 0.1
    assert abs(mean_action() - 0.5) < 0.15


def test_update_rejects_batch_without_valid_transition() -> None:
    batch = padded_batch("box", 5, 2, 3, seed=13)
    empty = RolloutBatch(**{**batch.__dict__, "valid_mask": torch.zeros_like(batch.valid_mask)})
    with pytest.raises(ValueError, match="no valid transition"):
        PPOLearner(make_policy("box"), CONFIG, device="cpu").update(empty)


def test_update_rejects_batch_of_other_shapes() -> None:
    batch = padded_batch("box", 5, 2, 3, seed=13)
    with pytest.raises(ValueError, match=r"RolloutBatch.obs: expected shape \[T, N, \*obs_shape\] = \[5, 2, 4\]"):
        narrow_obs = RolloutBatch(**{**batch.__dict__, "obs": batch.obs[..., :3]})
        PPOLearner(make_policy("box"), CONFIG, device="cpu").update(narrow_obs)
    with pytest.raises(ValueError, match="RolloutBatch.actions"):
        PPOLearner(make_policy("discrete"), CONFIG, device="cpu").update(batch)


def test_update_refuses_to_step_on_non_finite_gradient() -> None:
    policy = make_policy("box")
    with torch.no_grad():
        policy.critic[0].weight[0, 0] = math.nan
    before = [p.detach().clone() for p in policy.parameters()]
    with pytest.raises(FloatingPointError, match="non-finite gradient norm"):
        PPOLearner(policy, CONFIG, device="cpu").update(padded_batch("box", 6, 2, 5, seed=19))
    after = list(policy.parameters())
    assert all(torch.equal(p, q) for p, q in zip(before, after) if not p.isnan().any())


def test_update_with_more_minibatches_than_transitions() -> None:
    config = PPOConfig(num_minibatches=64, update_epochs=1)
    stats = PPOLearner(make_policy("box"), config, device="cpu").update(padded_batch("box", 6, 2, 5, seed=14))
    assert stats["num_valid"] == 10 and math.isfinite(stats["policy_loss"])


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("gamma", 1.5),
        ("gamma", math.nan),
        ("gae_lambda", -0.1),
        ("clip_eps", 0.0),
        ("vf_coef", -1.0),
        ("ent_coef", math.inf),
        ("lr", 0.0),
        ("update_epochs", 0),
        ("update_epochs", 2.5),
        ("num_minibatches", 0),
        ("max_grad_norm", -0.5),
        ("norm_adv", 1),
        ("seed", -1),
        ("seed", True),
    ],
)
def test_config_rejects_bad_value_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=rf"PPOConfig\.{field} .*got {re.escape(repr(value))}"):
        PPOConfig(**{field: value})


def test_batch_validate_names_field_and_expected_shape() -> None:
    batch = padded_batch("box", 6, 3, 4, seed=15)
    bad = RolloutBatch(**{**batch.__dict__, "logprobs": batch.logprobs[:, :2]})
    with pytest.raises(ValueError, match=r"RolloutBatch.logprobs: expected shape \[T, N\] = \[6, 3\], got \[6, 2\]"):
        bad.validate()
    with pytest.raises(ValueError, match="RolloutBatch.terminated: expected dtype torch.bool"):
        RolloutBatch(**{**batch.__dict__, "terminated": batch.terminated.float()}).validate()
    with pytest.raises(ValueError, match="RolloutBatch.policy_version"):
        RolloutBatch(**{**batch.__dict__, "policy_version": -1}).validate()


def test_batch_validate_rejects_slot_whose_last_valid_step_is_open() -> None:
    batch = padded_batch("box", 6, 3, 4, seed=16)
    last = int(batch.valid_mask[:, 1].nonzero().max())
    terminated, truncated = batch.terminated.clone(), batch.truncated.clone()
    terminated[last, 1] = truncated[last, 1] = False
    with pytest.raises(ValueError, match=r"slots \[1\] end open"):
        RolloutBatch(**{**batch.__dict__, "terminated": terminated, "truncated": truncated}).validate()


def test_batch_validate_rejects_non_finite_valid_entries_only() -> None:
    batch = padded_batch("box", 6, 3, 4, seed=17)
    batch.validate()  # NaN in padding is fine
    values = batch.values.clone()
    t, slot = (int(i) for i in batch.valid_mask.nonzero()[0])
    values[t, slot] = math.nan
    with pytest.raises(ValueError, match=rf"RolloutBatch.values: non-finite .*\[t={t}, slot={slot}\]"):
        RolloutBatch(**{**batch.__dict__, "values": values}).validate()


def test_batch_from_numpy_rejects_missing_and_unknown_fields() -> None:
    batch = padded_batch("box", 4, 2, 3, seed=18)
    arrays = {name: getattr(batch, name).numpy() for name in batch.__dict__ if name != "policy_version"}
    with pytest.raises(ValueError, match=r"missing fields \['policy_version'\]"):
        RolloutBatch.from_numpy(arrays)
    with pytest.raises(ValueError, match=r"unknown fields \['dones'\]"):
        RolloutBatch.from_numpy({**arrays, "policy_version": 1, "dones": arrays["terminated"]})
    rebuilt = RolloutBatch.from_numpy({**arrays, "policy_version": np.int64(1)})
    assert rebuilt.num_valid == 6 and rebuilt.num_total == 8 and rebuilt.policy_version == 1


def test_weights_round_trip_through_bytes() -> None:
    source, target = make_policy("box", seed=1), make_policy("box", seed=2)
    import_weights(target, export_weights(source))
    assert all(torch.equal(p, q) for p, q in zip(source.parameters(), target.parameters()))
    with pytest.raises(ValueError, match="do not match"):
        import_weights(make_policy("discrete"), export_weights(source))
    with pytest.raises(ValueError, match="not a weights payload"):
        import_weights(target, b"not torch")


def test_policy_shapes_follow_the_action_spec() -> None:
    obs = torch.randn(5, 3, OBS_DIM, dtype=torch.float64)
    action, logprob, entropy, value = make_policy("box").get_action_and_value(obs)
    assert action.shape == (5, 3, 2) and logprob.shape == entropy.shape == value.shape == (5, 3)
    action, logprob, _, value = make_policy("discrete").get_action_and_value(obs)
    assert action.shape == (5, 3) and action.dtype == torch.int64 and logprob.shape == (5, 3)
    assert make_policy("box").get_value(obs).shape == (5, 3)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU fallback")
def test_pick_device_falls_back_to_cpu_and_refuses_absent_cuda() -> None:
    assert pick_device() == torch.device("cpu")
    with pytest.raises(ValueError, match="CUDA is not available"):
        pick_device("cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_pick_device_prefers_cuda() -> None:
    assert pick_device().type == "cuda"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_update_on_cuda_matches_cpu() -> None:
    batch = padded_batch("box", 29, 5, 19, seed=20)
    cpu_params, _ = parameters_after_updates("box", [batch])
    learner = PPOLearner(make_policy("box"), CONFIG, device=pick_device("cuda"))
    stats = learner.update(batch)
    assert all(math.isfinite(value) for value in stats.values())
    for cuda_param, cpu_param in zip(learner.policy.parameters(), cpu_params):
        torch.testing.assert_close(cuda_param.cpu(), cpu_param, rtol=0, atol=1e-8)
