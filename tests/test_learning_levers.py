"""The learning levers of docs/learning.md: reward scaling, observation normalisation shipped inside
the weights, learning-rate annealing and the initial log-std. Each keeps SMPO's promise (padding
changes nothing), resumes bit for bit from a checkpoint, and reaches every consumer of the policy."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import io
from pathlib import Path

import numpy as np
import onnxruntime
import pytest
import torch
from test_learner_hyperparameters import _batch, _core
from test_learner_service import ACTION_SPACE, OBS_SPACE
from test_policy_runner import _box
from test_ppo import CONFIG, OBS_DIM, compacted, make_policy, padded_batch

from broker.policy_runner import PolicyRunner
from broker.settings import learner_changes
from fast.spaces import SpaceSpec
from learner.batch import RolloutBatch
from learner.export import export_policy
from learner.normalize import RunningMeanStd, discounted_returns
from learner.policy import ActionSpec, ActorCritic, export_weights, import_weights
from learner.ppo import PPOLearner
from learner.wire import Policy

LEVERS = dataclasses.replace(CONFIG, norm_reward=True)


def normalized_policy(kind: str, seed: int = 0) -> ActorCritic:
    torch.manual_seed(seed)
    spec = ActionSpec.box(2) if kind == "box" else ActionSpec.discrete(3)
    return ActorCritic(OBS_DIM, spec, obs_norm=True).to(torch.float64)


def state_after(kind: str, batches: list[RolloutBatch]) -> dict[str, torch.Tensor]:
    learner = PPOLearner(normalized_policy(kind), LEVERS, device="cpu")
    for batch in batches:
        learner.update(batch)
    return {name: t.detach().clone() for name, t in learner.policy.state_dict().items()}


# -- the statistics --------------------------------------------------------------------------------


def test_running_statistics_merged_batch_by_batch_equal_those_of_all_the_data() -> None:
    data = np.random.default_rng(0).normal(3.0, 2.0, size=(1000, 3))
    stats = RunningMeanStd((3,), epsilon=0.0 + 1e-12)
    for chunk in np.array_split(data, [1, 7, 300, 301, 999]):
        stats.update(torch.from_numpy(chunk))
    np.testing.assert_allclose(stats.mean.numpy(), data.mean(0), rtol=1e-9)
    np.testing.assert_allclose(stats.var.numpy(), data.var(0), rtol=1e-9)
    stats.update(torch.zeros((0, 3), dtype=torch.float64))  # an empty batch changes nothing
    np.testing.assert_allclose(stats.mean.numpy(), data.mean(0), rtol=1e-9)


def test_discounted_returns_skip_padding_and_restart_after_an_episode_ends() -> None:
    nan = float("nan")
    rewards = torch.tensor([[1.0], [nan], [2.0], [4.0], [8.0]])
    valid = torch.tensor([[True], [False], [True], [True], [True]])
    ended = torch.tensor([[False], [False], [True], [False], [False]])
    out = discounted_returns(rewards, ended, valid, gamma=0.5)
    # 1; padding (0, not NaN); 0.5 * 1 + 2; a new episode: 4; 0.5 * 4 + 8.
    assert out[:, 0].tolist() == [1.0, 0.0, 2.5, 4.0, 10.0]


# -- SMPO's promise with the levers on -------------------------------------------------------------


@pytest.mark.parametrize("kind", ["box", "discrete"])
@pytest.mark.parametrize("layout", ["per_slot", "one_slot"])
def test_padding_changes_nothing_with_reward_scaling_and_observation_normalisation(kind: str, layout: str) -> None:
    batches = [padded_batch(kind, 29, 5, valid_per_slot=19, seed=seed) for seed in (0, 1)]
    padded = state_after(kind, batches)
    compact = state_after(kind, [compacted(b, layout) for b in batches])
    initial = normalized_policy(kind).state_dict()
    assert not torch.equal(padded["obs_normalizer.mean"], initial["obs_normalizer.mean"]), "the statistics must move"
    for name in padded:
        torch.testing.assert_close(padded[name], compact[name], rtol=0, atol=1e-10, msg=name)


def test_reward_scale_is_the_std_of_the_discounted_return_and_is_reported() -> None:
    batch = padded_batch("box", 40, 6, 25, seed=12)
    learner = PPOLearner(make_policy("box"), LEVERS, device="cpu")
    stats = learner.update(batch)
    ended = batch.terminated | batch.truncated
    expected = discounted_returns(batch.rewards, ended, batch.valid_mask, LEVERS.gamma)[batch.valid_mask].std(
        unbiased=False
    )
    assert stats["reward_scale"] == pytest.approx(float(expected), rel=1e-6)
    assert PPOLearner(make_policy("box"), CONFIG, device="cpu").update(batch)["reward_scale"] == 1.0


def test_reward_scaling_changes_the_update() -> None:
    """The lever is wired: the same batch trains other weights with it than without it."""
    batch = padded_batch("box", 31, 3, 20, seed=8)
    plain = PPOLearner(make_policy("box"), CONFIG, device="cpu")
    scaled = PPOLearner(make_policy("box"), LEVERS, device="cpu")
    plain.update(batch)
    scaled.update(batch)
    assert not all(torch.equal(p, q) for p, q in zip(plain.policy.parameters(), scaled.policy.parameters()))


def test_update_resumes_identically_with_the_statistics() -> None:
    batches = [padded_batch("box", 17, 3, 9, seed=seed) for seed in (10, 11, 12)]
    straight = state_after("box", batches)
    first = PPOLearner(normalized_policy("box"), LEVERS, device="cpu")
    for batch in batches[:2]:
        first.update(batch)
    state = copy.deepcopy(first.state_dict())
    # A learner built without a normaliser takes it from the state (the weights describe themselves).
    resumed = PPOLearner(make_policy("box", seed=99), LEVERS, device="cpu")
    resumed.load_state_dict(state)
    resumed.update(batches[2])
    for name, tensor in resumed.policy.state_dict().items():
        assert torch.equal(tensor, straight[name]), name


# -- the normalised policy reaches every consumer ------------------------------------------------------


def trained_normalizer_policy(obs_space: SpaceSpec, act_space: SpaceSpec, hidden=(16, 16)) -> ActorCritic:
    torch.manual_seed(4)
    policy = ActorCritic(obs_space.shape, act_space, hidden, obs_norm=True, init_log_std=-0.7)
    policy.obs_normalizer.observe(torch.from_numpy(np.random.default_rng(1).normal(5.0, 3.0, size=(500, 7))))
    return policy


def test_policy_runner_builds_the_normaliser_from_the_weights_and_scores_as_the_learner() -> None:
    obs_space, act_space = _box((7,), -50, 50), _box((3,), -1, 1)
    policy = trained_normalizer_policy(obs_space, act_space)
    assert float(policy.actor_logstd.detach()[0, 0]) == pytest.approx(-0.7)
    runner = PolicyRunner(obs_space, act_space, (16, 16), seed=1)  # not told about the normaliser
    runner.load(1, export_weights(policy))
    obs = np.random.default_rng(0).normal(5.0, 3.0, size=(11, 7)).astype(np.float32)
    d = runner.act(obs)
    with torch.no_grad():
        _, logprob, _, value = policy.get_action_and_value(torch.as_tensor(obs), torch.as_tensor(d.actions))
        mean = policy.actor_mean(policy.obs_normalizer(torch.as_tensor(obs)))
    np.testing.assert_allclose(d.logprobs, logprob.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(d.values, value.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(runner.act_deterministic(obs), np.clip(mean.numpy(), -1, 1), rtol=1e-5, atol=1e-5)
    # Without the statistics the same network would act otherwise: the normaliser is in the path.
    plain = ActorCritic(obs_space.shape, act_space, (16, 16))
    plain.load_state_dict({k: v for k, v in policy.state_dict().items() if not k.startswith("obs_normalizer.")})
    with torch.no_grad():
        assert not np.allclose(plain.actor_mean(torch.as_tensor(obs)).numpy(), mean.numpy(), atol=1e-3)


@pytest.mark.parametrize("format_name", ["torchscript", "onnx"])
def test_exported_model_normalises_raw_observations(format_name: str) -> None:
    obs_space, act_space = _box((7,), -50, 50), _box((3,), -1, 1)
    policy = trained_normalizer_policy(obs_space, act_space)
    with torch.no_grad():
        policy.actor_mean[-1].weight.mul_(100.0)  # spread the actions so the comparison means something
    shipped = Policy(2, export_weights(policy), (16, 16), obs_space, act_space)
    runner = PolicyRunner(obs_space, act_space, (16, 16))
    runner.load(2, shipped.weights)
    obs = np.random.default_rng(3).normal(5.0, 3.0, size=(64, 7)).astype(np.float32)
    model = export_policy(shipped, format_name)
    if format_name == "torchscript":
        with torch.no_grad():
            got = torch.jit.load(io.BytesIO(model))(torch.from_numpy(obs)).numpy()
    else:
        session = onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"])
        (got,) = session.run(None, {session.get_inputs()[0].name: obs})
    np.testing.assert_allclose(got, runner.act_deterministic(obs), rtol=0, atol=1e-5)


pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:DeprecationWarning")


def test_weights_without_a_normaliser_do_not_load_into_a_normalised_policy() -> None:
    plain = ActorCritic(OBS_DIM, ActionSpec.box(2))
    with pytest.raises(ValueError, match="obs_normalizer"):
        import_weights(ActorCritic(OBS_DIM, ActionSpec.box(2), obs_norm=True), export_weights(plain))


# -- the learner service: annealing, and a restart with the statistics ------------------------------------


def test_learning_rate_anneals_linearly_and_is_no_settings_change(tmp_path: Path) -> None:
    async def run() -> tuple[list[dict], list[float]]:
        core = _core(tmp_path, anneal_lr_updates=3, lr=6e-4)
        await core.initialize(OBS_SPACE, ACTION_SPACE)
        stats, lrs = [], []
        for version in range(4):
            stats.append((await core.submit(_batch(version, seed=version))).stats)
            lrs.append(core._learner.optimizer.param_groups[0]["lr"])
        return stats, lrs

    stats, lrs = asyncio.run(run())
    assert [s["lr_anneal_factor"] for s in stats] == pytest.approx([1.0, 2 / 3, 1 / 3, 1 / 3])
    assert lrs == pytest.approx([6e-4, 4e-4, 2e-4, 2e-4])
    assert {s["learning_rate"] for s in stats} == {6e-4}  # the value in force, before annealing
    assert all(not learner_changes(a, b) for a, b in zip(stats, stats[1:]))


def test_a_learner_with_every_lever_resumes_from_its_checkpoint_bit_for_bit(tmp_path: Path) -> None:
    settings = {"checkpoint_every": 1, "norm_reward": True, "obs_norm": True, "init_log_std": -0.5}

    async def straight() -> bytes:
        core = _core(tmp_path / "straight", **settings)
        await core.initialize(OBS_SPACE, ACTION_SPACE)
        for version in range(3):
            result = await core.submit(_batch(version, seed=version))
        return result.policy.weights

    async def restarted() -> bytes:
        first = _core(tmp_path / "restarted", **settings)
        await first.initialize(OBS_SPACE, ACTION_SPACE)
        for version in range(2):
            await first.submit(_batch(version, seed=version))
        # The restarted learner's config no longer asks for observation normalisation: the checkpoint wins.
        second = _core(tmp_path / "restarted", **{**settings, "obs_norm": False})
        return (await second.submit(_batch(2, seed=2))).policy.weights

    assert asyncio.run(straight()) == asyncio.run(restarted())


def test_fast_train_and_the_learner_share_the_learning_defaults() -> None:
    """`fast train` passes its levers to the learner; a learner started alone (Compose, Kubernetes)
    must learn with the same defaults, so the two tables may not drift apart."""
    from jobs.train.config import TrainConfig
    from learner.config import LearnerConfig

    train, learner = TrainConfig(), LearnerConfig()
    for name in (
        "init_log_std",
        "obs_norm",
        "norm_reward",
        "ent_coef",
        "lr",
        "update_epochs",
        "num_minibatches",
        "gamma",
    ):
        assert getattr(train, name) == getattr(learner, name), name
    assert train.init_log_std == -0.5  # docs/learning.md: 150-iteration runs beat their start in 6 of 6 seeds
    assert (learner.anneal_lr_updates > 0) == train.anneal_lr
