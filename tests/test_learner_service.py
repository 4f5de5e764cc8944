"""The learner as a service: over real gRPC against `fast learner` processes, and its core and
checkpoints without sockets."""

from __future__ import annotations

import asyncio
import logging
import math
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import numpy as np
import pytest
import torch
from conftest import assert_serving_with_reflection, stub_for
from grpc_health.v1 import health_pb2, health_pb2_grpc

from fast.config import ConfigError, resolve_config
from fast.spaces import SpaceSpec, space_to_proto
from fast.v1 import learner_pb2 as pb
from fast.v1 import learner_pb2_grpc as pb_grpc
from fast.v1 import tensor_pb2 as tpb
from jobs.processes import ServiceProcess, start_service
from learner.batch import RolloutBatch
from learner.checkpoint import (
    Checkpoint,
    CheckpointError,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    prune_checkpoints,
    save_checkpoint,
)
from learner.client import LearnerClient
from learner.config import ENV_PREFIX, LearnerConfig
from learner.core import LearnerCore
from learner.errors import ErrorKind, LearnerError
from learner.policy import ActorCritic, import_weights
from learner.ppo import PPOConfig
from learner.wire import STATS_FIELDS, batch_to_proto

STEPS, SLOTS, OBS_DIM = 16, 4, 6
OBS_SPACE = SpaceSpec(
    "box", (OBS_DIM,), np.dtype(np.float32), np.full(OBS_DIM, -10, np.float32), np.full(OBS_DIM, 10, np.float32)
)
ACTION_SPACE = SpaceSpec("box", (2,), np.dtype(np.float32), -np.ones(2, np.float32), np.ones(2, np.float32))
# Small updates keep every call well under a second on a CPU.
FAST_PPO = ["--update-epochs", "2", "--num-minibatches", "2"]
STAT_NAMES = tuple(name for name in STATS_FIELDS if not name.startswith("num_"))  # the float statistics


def make_arrays(seed: int = 0, steps: int = STEPS, slots: int = SLOTS) -> dict[str, np.ndarray]:
    """A DPSA-shaped batch [T, N]: slots 0 and 1 terminate early and pad (with NaN) to the end of
    the round; the others are truncated at the last step with a bootstrap value."""
    rng = np.random.default_rng(seed)
    valid = np.ones((steps, slots), bool)
    terminated = np.zeros((steps, slots), bool)
    truncated = np.zeros((steps, slots), bool)
    for slot, length in ((0, steps // 3), (1, steps // 2)):
        terminated[length - 1, slot] = True
        valid[length:, slot] = False
    truncated[-1, 2:] = True
    arrays = {
        "obs": rng.normal(size=(steps, slots, OBS_DIM)).astype(np.float32),
        "actions": rng.normal(size=(steps, slots, 2)).astype(np.float32),
        "logprobs": (rng.normal(size=(steps, slots)) - 2.0).astype(np.float32),
        "values": rng.normal(size=(steps, slots)).astype(np.float32),
        "rewards": rng.normal(size=(steps, slots)).astype(np.float32),
        "bootstrap_values": rng.normal(size=(steps, slots)).astype(np.float32),
    }
    for array in arrays.values():
        array[~valid] = np.nan  # padding is garbage; the learner must never read it
    return {**arrays, "terminated": terminated, "truncated": truncated, "valid_mask": valid}


def submit_request(arrays: dict[str, np.ndarray], version: int, return_policy: bool = True) -> pb.SubmitBatchRequest:
    return pb.SubmitBatchRequest(batch=batch_to_proto(arrays, version), return_policy=return_policy)


def init_request(obs_space: SpaceSpec = OBS_SPACE, action_space: SpaceSpec = ACTION_SPACE) -> pb.InitializeRequest:
    return pb.InitializeRequest(observation_space=space_to_proto(obs_space), action_space=space_to_proto(action_space))


def assert_code(excinfo, code: grpc.StatusCode, *fragments: str) -> None:
    assert excinfo.value.code() == code, excinfo.value.details()
    for fragment in fragments:
        assert fragment in excinfo.value.details(), excinfo.value.details()


def weights_of(data: bytes) -> dict[str, torch.Tensor]:
    policy = ActorCritic(OBS_DIM, ACTION_SPACE)
    import_weights(policy, data)
    return policy.state_dict()


def assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name].cpu(), b[name].cpu()), name


@contextmanager
def learner_process(checkpoint_dir: Path, *args: str) -> Iterator[ServiceProcess]:
    service = start_service(
        "learner",
        ["learner", "--host", "127.0.0.1", "--port", "0", "--checkpoint-dir", str(checkpoint_dir), *FAST_PPO, *args],
    )
    try:
        yield service
    finally:
        service.stop()


def learner_stub(address: str):
    return stub_for(address, pb_grpc.LearnerStub)


@pytest.fixture(scope="module")
def learner(tmp_path_factory) -> Iterator[ServiceProcess]:
    """One initialised learner shared by the tests that do not depend on its version."""
    with learner_process(tmp_path_factory.mktemp("learner-ckpt")) as service:
        with learner_stub(service.address) as stub:
            stub.Initialize(init_request(), timeout=30)
        yield service


@pytest.fixture()
def stub(learner: ServiceProcess) -> Iterator[pb_grpc.LearnerStub]:
    with learner_stub(learner.address) as s:
        yield s


# -- over gRPC -----------------------------------------------------------------------------


def test_calls_before_initialize_failed_precondition(tmp_path: Path) -> None:
    with learner_process(tmp_path) as service, learner_stub(service.address) as stub:
        status = stub.GetStatus(pb.GetStatusRequest(), timeout=10)
        device = "cuda:0" if torch.cuda.is_available() else "cpu"  # the best device present, by default
        assert not status.initialized and status.policy_version == 0 and status.device == device
        for call, request in (
            (stub.GetPolicy, pb.GetPolicyRequest(known_version=-1)),
            (stub.SubmitBatch, submit_request(make_arrays(), 0)),
            (stub.SaveCheckpoint, pb.SaveCheckpointRequest()),
        ):
            with pytest.raises(grpc.RpcError) as excinfo:
                call(request, timeout=10)
            assert_code(excinfo, grpc.StatusCode.FAILED_PRECONDITION, "before Initialize", "call Initialize")
        assert service.stop() == 0
    assert list_checkpoints(tmp_path) == []


def test_lifecycle_submit_stale_checkpoint_every_k_and_sigterm(tmp_path: Path) -> None:
    with learner_process(tmp_path, "--checkpoint-every", "3") as service, learner_stub(service.address) as stub:
        r = stub.Initialize(init_request(), timeout=30)
        assert (r.policy_version, r.resumed) == (0, False)
        assert [v for v, _ in list_checkpoints(tmp_path)] == [0]  # the spaces are on disk at once

        policy = stub.GetPolicy(pb.GetPolicyRequest(known_version=-1), timeout=10).policy
        assert policy.version == 0 and policy.weights and list(policy.hidden_sizes) == [64, 64]
        weights_of(policy.weights)  # loads into an ActorCritic of these spaces
        assert stub.GetPolicy(pb.GetPolicyRequest(known_version=0), timeout=10).policy.weights == b""

        arrays = make_arrays(seed=1)
        reply = stub.SubmitBatch(submit_request(arrays, 0), timeout=30)
        assert reply.policy_version == 1 and reply.policy.version == 1
        assert reply.stats.num_valid == int(arrays["valid_mask"].sum()) and reply.stats.num_total == STEPS * SLOTS
        for name in STAT_NAMES:
            assert math.isfinite(getattr(reply.stats, name)), name
        assert reply.stats.update_time_s > 0
        assert reply.policy.weights == stub.GetPolicy(pb.GetPolicyRequest(known_version=0), timeout=10).policy.weights
        assert reply.policy.weights != policy.weights

        with pytest.raises(grpc.RpcError) as excinfo:  # the same batch again: sampled by version 0
            stub.SubmitBatch(submit_request(arrays, 0), timeout=30)
        assert_code(
            excinfo, grpc.StatusCode.FAILED_PRECONDITION, "batch.policy_version is 0", "current policy version is 1"
        )
        without_policy = stub.SubmitBatch(submit_request(make_arrays(seed=2), 1, return_policy=False), timeout=30)
        assert without_policy.policy_version == 2 and not without_policy.HasField("policy")
        assert [v for v, _ in list_checkpoints(tmp_path)] == [0]
        stub.SubmitBatch(submit_request(make_arrays(seed=3), 2), timeout=30)
        assert [v for v, _ in list_checkpoints(tmp_path)] == [0, 3]  # every K=3 versions

        status = stub.GetStatus(pb.GetStatusRequest(), timeout=10)
        assert status.initialized and status.policy_version == 3 and status.updates_this_process == 3
        assert status.stale_batches_refused == 1 and status.last_checkpoint.endswith("ckpt-000000003.pt")
        assert math.isfinite(status.last_stats.policy_loss)

        # SIGTERM while an update is in flight: it is drained, answered, and in the final checkpoint.
        in_flight = stub.SubmitBatch.future(submit_request(make_arrays(seed=4, steps=2048, slots=32), 3), timeout=30)
        time.sleep(0.5)  # the call reaches the learner; its update takes about a second here
        service.process.send_signal(signal.SIGTERM)
        assert in_flight.result().policy_version == 4
        assert service.process.wait(timeout=20) == 0
    final = load_checkpoint(latest_checkpoint(tmp_path))
    assert final.policy_version == 4  # written on shutdown: 4 is not a multiple of K
    assert_same_weights(final.learner_state["policy"], weights_of(in_flight.result().policy.weights))


def test_kill_9_then_restart_resumes_from_latest_checkpoint(tmp_path: Path) -> None:
    args = ("--checkpoint-every", "2", "--keep-checkpoints", "2")
    with learner_process(tmp_path, *args) as service, learner_stub(service.address) as stub:
        stub.Initialize(init_request(), timeout=30)
        for version in range(3):
            stub.SubmitBatch(submit_request(make_arrays(seed=version), version), timeout=30)
        service.kill()  # version 3 was never checkpointed
    assert [v for v, _ in list_checkpoints(tmp_path)] == [0, 2]
    checkpointed = load_checkpoint(latest_checkpoint(tmp_path))

    with learner_process(tmp_path, *args) as service, learner_stub(service.address) as stub:
        assert "version=2" in " ".join(service.output)
        status = stub.GetStatus(pb.GetStatusRequest(), timeout=10)
        assert status.initialized and status.policy_version == 2
        policy = stub.GetPolicy(pb.GetPolicyRequest(), timeout=10).policy
        assert policy.version == 2
        assert_same_weights(weights_of(policy.weights), checkpointed.learner_state["policy"])
        r = stub.Initialize(init_request(), timeout=30)
        assert (r.policy_version, r.resumed) == (2, True)
        with pytest.raises(grpc.RpcError) as excinfo:  # sampled by the lost version 3
            stub.SubmitBatch(submit_request(make_arrays(seed=3), 3), timeout=30)
        assert_code(excinfo, grpc.StatusCode.FAILED_PRECONDITION, "is 3", "version is 2")
        assert stub.SubmitBatch(submit_request(make_arrays(seed=3), 2), timeout=30).policy_version == 3
        assert service.stop() == 0
    assert [v for v, _ in list_checkpoints(tmp_path)] == [2, 3]  # final one written, oldest pruned


def _mutate(arrays: dict, name: str, value) -> dict:
    return {**arrays, name: value}


def _bad_batch(case: str) -> pb.SubmitBatchRequest:
    arrays = make_arrays(seed=9)
    if case == "obs shape":
        arrays = _mutate(arrays, "obs", np.zeros((STEPS, SLOTS, 5), np.float32))
    elif case == "actions shape":
        arrays = _mutate(arrays, "actions", np.zeros((STEPS, SLOTS, 3), np.float32))
    elif case == "logprobs shape":
        arrays = _mutate(arrays, "logprobs", np.zeros((STEPS, SLOTS - 1), np.float32))
    elif case == "valid_mask dtype":
        arrays = _mutate(arrays, "valid_mask", arrays["valid_mask"].astype(np.float32))
    elif case == "int actions for a box":
        arrays = _mutate(arrays, "actions", np.zeros((STEPS, SLOTS, 2), np.int64))
    elif case == "nan at a valid step":
        obs = arrays["obs"].copy()
        obs[0, 3, 1] = np.nan
        arrays = _mutate(arrays, "obs", obs)
    elif case == "open episode":
        arrays = _mutate(arrays, "truncated", np.zeros((STEPS, SLOTS), bool))
    elif case == "no valid step":
        arrays = {**arrays, "valid_mask": np.zeros((STEPS, SLOTS), bool), "terminated": np.zeros((STEPS, SLOTS), bool)}
    request = submit_request(arrays, 0)
    if case == "missing tensor":
        request.batch.ClearField("valid_mask")
    elif case == "unspecified dtype":
        request.batch.rewards.dtype = tpb.DTYPE_UNSPECIFIED
    elif case == "bytes do not match shape":
        request.batch.values.data = request.batch.values.data[:-4]
    return request


@pytest.mark.parametrize(
    "case, fragments",
    [
        ("obs shape", ("RolloutBatch.obs", "[16, 4, 6]", "[16, 4, 5]")),
        ("actions shape", ("RolloutBatch.actions", "[16, 4, 2]")),
        ("logprobs shape", ("RolloutBatch.logprobs", "[16, 4]", "[16, 3]")),
        ("valid_mask dtype", ("RolloutBatch.valid_mask", "torch.bool", "torch.float32")),
        ("int actions for a box", ("RolloutBatch.actions", "float")),
        ("nan at a valid step", ("RolloutBatch.obs", "non-finite", "t=0, slot=3")),
        ("open episode", ("terminated/truncated", "slots [2, 3]")),
        ("no valid step", ("valid_mask", "no valid transition")),
        ("missing tensor", ("batch.valid_mask is missing",)),
        ("unspecified dtype", ("batch.rewards.dtype", "DTYPE_UNSPECIFIED")),
        ("bytes do not match shape", ("batch.values", "bytes")),
    ],
)
def test_malformed_batch_invalid_argument_names_field(stub, case: str, fragments: tuple[str, ...]) -> None:
    before = stub.GetStatus(pb.GetStatusRequest(), timeout=10).policy_version
    request = _bad_batch(case)
    request.batch.policy_version = before
    with pytest.raises(grpc.RpcError) as excinfo:
        stub.SubmitBatch(request, timeout=30)
    assert_code(excinfo, grpc.StatusCode.INVALID_ARGUMENT, *fragments)
    assert stub.GetStatus(pb.GetStatusRequest(), timeout=10).policy_version == before


def test_initialize_with_other_spaces_failed_precondition(stub) -> None:
    wider = SpaceSpec("box", (7,), np.dtype(np.float32), np.zeros(7, np.float32), np.ones(7, np.float32))
    with pytest.raises(grpc.RpcError) as excinfo:
        stub.Initialize(init_request(obs_space=wider), timeout=30)
    assert_code(excinfo, grpc.StatusCode.FAILED_PRECONDITION, "Box(shape=(7,)", "Box(shape=(6,)", "--checkpoint-dir")
    other_bounds = SpaceSpec("box", (2,), np.dtype(np.float32), -2 * np.ones(2, np.float32), 2 * np.ones(2, np.float32))
    with pytest.raises(grpc.RpcError) as excinfo:
        stub.Initialize(init_request(action_space=other_bounds), timeout=30)
    assert_code(excinfo, grpc.StatusCode.FAILED_PRECONDITION, "action_space", "other bounds")
    r = stub.Initialize(init_request(), timeout=30)
    assert r.resumed


def test_initialize_without_spaces_invalid_argument(stub) -> None:
    with pytest.raises(grpc.RpcError) as excinfo:
        stub.Initialize(pb.InitializeRequest(action_space=space_to_proto(ACTION_SPACE)), timeout=30)
    assert_code(excinfo, grpc.StatusCode.INVALID_ARGUMENT, "observation_space is missing")


def test_concurrent_submits_of_one_version_accept_exactly_one(stub) -> None:
    version = stub.GetStatus(pb.GetStatusRequest(), timeout=10).policy_version
    futures = [stub.SubmitBatch.future(submit_request(make_arrays(seed=s), version), timeout=30) for s in (20, 21)]
    outcomes = []
    for future in futures:
        try:
            outcomes.append(future.result().policy_version)
        except grpc.RpcError as error:
            outcomes.append(error.code())
    assert sorted(map(str, outcomes)) == sorted(map(str, [version + 1, grpc.StatusCode.FAILED_PRECONDITION]))


def test_status_and_health_answer_during_an_update(stub, learner) -> None:
    version = stub.GetStatus(pb.GetStatusRequest(), timeout=10).policy_version
    # 65k transitions over 2048 steps (GAE is a loop over steps): an update of a good fraction of
    # a second on a CPU.
    big = make_arrays(seed=30, steps=2048, slots=32)
    future = stub.SubmitBatch.future(submit_request(big, version, return_policy=False), timeout=60)
    latencies, old_version_answers = [], 0
    with grpc.insecure_channel(learner.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        while not future.done():
            started = time.perf_counter()
            status = stub.GetStatus(pb.GetStatusRequest(), timeout=5)
            serving = health.Check(health_pb2.HealthCheckRequest(service="fast.v1.Learner"), timeout=5).status
            latencies.append(time.perf_counter() - started)
            assert serving == health_pb2.HealthCheckResponse.SERVING
            old_version_answers += status.policy_version == version
            time.sleep(0.005)
    reply = future.result()
    assert reply.policy_version == version + 1 and not reply.run_stops
    # Were the update run on the event loop, the calls issued during it would wait for it to end.
    assert old_version_answers >= 1
    assert max(latencies) < max(0.1, reply.stats.update_time_s / 2), (max(latencies), reply.stats.update_time_s)


def test_health_serving_and_reflection(learner) -> None:
    assert_serving_with_reflection(learner.address, "fast.v1.Learner")


def test_client_round_trip(learner) -> None:
    async def run() -> None:
        async with LearnerClient(learner.address, timeout_s=10) as client:
            await client.wait_ready()
            version, resumed = await client.initialize(OBS_SPACE, ACTION_SPACE)
            assert resumed and client.world_size == 1
            policy = await client.get_policy()
            assert policy.version == version and policy.observation_space.shape == (OBS_DIM,)
            actor_critic = policy.actor_critic()
            action, logprob, _, value = actor_critic.get_action_and_value(torch.zeros(SLOTS, OBS_DIM))
            assert action.shape == (SLOTS, 2) and logprob.shape == value.shape == (SLOTS,)
            assert (await client.get_policy(known_version=version)).weights == b""

            # A single learner's answer says the run stops exactly when its own broker asked.
            reply = await client.submit(make_arrays(seed=40), policy_version=version, stop_requested=True)
            assert reply.policy_version == version + 1 and reply.policy is not None and reply.run_stops
            assert reply.policy.version == version + 1
            assert set(STAT_NAMES) <= reply.stats.keys() and all(math.isfinite(reply.stats[k]) for k in STAT_NAMES)
            status = await client.status()
            assert status.policy_version == version + 1 and status.last_stats is not None
            path, saved = await client.save_checkpoint()
            assert saved == version + 1 and path.name == f"ckpt-{version + 1:09d}.pt"
            with pytest.raises(grpc.aio.AioRpcError) as excinfo:
                await client.submit(make_arrays(seed=41), policy_version=version)
            assert excinfo.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            with pytest.raises(ValueError, match="missing"):
                await client.submit({"obs": np.zeros((1, 1, OBS_DIM))}, policy_version=version + 1)

    asyncio.run(run())


# -- without sockets -----------------------------------------------------------------------


def _core(tmp_path: Path, **settings) -> LearnerCore:
    settings = {"checkpoint_dir": tmp_path, "update_epochs": 2, "num_minibatches": 2, **settings}
    return LearnerCore(LearnerConfig(**settings))


def _batch(version: int, seed: int = 0, **changes) -> RolloutBatch:
    return RolloutBatch.from_numpy({**make_arrays(seed=seed), **changes, "policy_version": version})


def test_core_corrupt_newest_checkpoint_falls_back_to_previous(tmp_path: Path, caplog) -> None:
    async def train() -> None:
        core = _core(tmp_path, checkpoint_every=1)
        await core.initialize(OBS_SPACE, ACTION_SPACE)
        for version in range(2):
            await core.submit(_batch(version, seed=version))

    asyncio.run(train())
    assert [v for v, _ in list_checkpoints(tmp_path)] == [0, 1, 2]
    expected = load_checkpoint(tmp_path / "ckpt-000000001.pt")
    newest = tmp_path / "ckpt-000000002.pt"
    newest.write_bytes(newest.read_bytes()[: len(newest.read_bytes()) // 2])  # a torn write
    with pytest.raises(CheckpointError, match="ckpt-000000002.pt is unreadable"):
        load_checkpoint(newest)

    with caplog.at_level(logging.WARNING, logger="fast.learner"):
        core = _core(tmp_path)
    assert core.policy_version == 1 and core.status().last_checkpoint == str(expected.path)
    assert "ckpt-000000002.pt is unreadable" in caplog.text and "falling back" in caplog.text
    assert_same_weights(weights_of(core.get_policy().weights), expected.learner_state["policy"])


def test_core_refuses_to_start_when_every_checkpoint_is_corrupt(tmp_path: Path) -> None:
    (tmp_path / "ckpt-000000004.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="no readable checkpoint.*start afresh"):
        _core(tmp_path)


def test_prune_keeps_newest_n_and_sorts_by_version(tmp_path: Path) -> None:
    policy = ActorCritic(OBS_DIM, ACTION_SPACE)
    state = {"policy": policy.state_dict(), "optimizer": {}, "shuffle_generator": torch.Generator().get_state()}
    for version in (3, 12, 7, 1_000_000_000, 0):
        save_checkpoint(tmp_path, Checkpoint(version, OBS_SPACE, ACTION_SPACE, (64, 64), state))
    (tmp_path / ".ckpt-000000013.pt.tmp-999999").write_bytes(b"left by a killed writer")
    assert [v for v, _ in list_checkpoints(tmp_path)] == [0, 3, 7, 12, 1_000_000_000]
    assert latest_checkpoint(tmp_path).name == "ckpt-1000000000.pt"
    removed = prune_checkpoints(tmp_path, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-000000012.pt", "ckpt-1000000000.pt"]
    assert len(removed) == 4
    loaded = load_checkpoint(tmp_path / "ckpt-000000012.pt")
    assert loaded.policy_version == 12 and loaded.hidden_sizes == (64, 64)
    assert loaded.observation_space.shape == (OBS_DIM,) and np.array_equal(loaded.action_space.high, ACTION_SPACE.high)


def test_checkpoint_write_failure_leaves_no_partial_file(tmp_path: Path, monkeypatch) -> None:
    def broken_save(obj, file) -> None:
        file.write(b"half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", broken_save)
    state = {"policy": {}, "optimizer": {}, "shuffle_generator": torch.Generator().get_state()}
    with pytest.raises(OSError):
        save_checkpoint(tmp_path, Checkpoint(5, OBS_SPACE, ACTION_SPACE, (64, 64), state))
    assert list(tmp_path.iterdir()) == []


def test_core_serialises_updates_and_refuses_the_second_of_one_version(tmp_path: Path) -> None:
    async def run() -> list:
        core = _core(tmp_path)
        await core.initialize(OBS_SPACE, ACTION_SPACE)
        return await asyncio.gather(
            core.submit(_batch(0, seed=1)), core.submit(_batch(0, seed=2)), return_exceptions=True
        )

    first, second = asyncio.run(run())
    assert first.policy_version == 1
    assert isinstance(second, LearnerError) and second.kind == ErrorKind.FAILED_PRECONDITION
    assert "batch.policy_version is 0 but the current policy version is 1" in second.message


def test_core_diverging_update_is_rolled_back(tmp_path: Path) -> None:
    async def run() -> None:
        core = _core(tmp_path)
        await core.initialize(OBS_SPACE, ACTION_SPACE)
        before = core.get_policy().weights
        rewards = np.full((STEPS, SLOTS), 3e38, np.float32)  # returns overflow to inf
        with pytest.raises(LearnerError) as excinfo:
            await core.submit(_batch(0, rewards=rewards))
        assert excinfo.value.kind == ErrorKind.INVALID_ARGUMENT and "rolled back" in excinfo.value.message
        assert core.policy_version == 0 and core.get_policy().weights == before
        assert (await core.submit(_batch(0))).policy_version == 1

    asyncio.run(run())


def test_core_discrete_actions_checked_against_the_space(tmp_path: Path) -> None:
    discrete = SpaceSpec("discrete", (), np.dtype(np.int64), n=3)
    actions = np.random.default_rng(0).integers(0, 3, size=(STEPS, SLOTS))

    async def run() -> None:
        core = _core(tmp_path)
        await core.initialize(OBS_SPACE, discrete)
        with pytest.raises(LearnerError, match=r"lie in \[0, 3\)"):
            await core.submit(_batch(0, actions=actions + 1))
        with pytest.raises(LearnerError, match="int64"):
            await core.submit(_batch(0, actions=actions.astype(np.float32)))
        assert (await core.submit(_batch(0, actions=actions))).policy_version == 1

    asyncio.run(run())


def test_core_refuses_spaces_the_policy_cannot_serve(tmp_path: Path) -> None:
    core = _core(tmp_path)
    discrete = SpaceSpec("discrete", (), np.dtype(np.int64), n=3)
    int_box = SpaceSpec("box", (2,), np.dtype(np.int32), np.zeros(2, np.int32), np.ones(2, np.int32))
    for obs_space, action_space, fragment in (
        (discrete, ACTION_SPACE, "observation_space"),
        (OBS_SPACE, int_box, "float dtype"),
    ):
        with pytest.raises(LearnerError, match=fragment) as excinfo:
            asyncio.run(core.initialize(obs_space, action_space))
        assert excinfo.value.kind == ErrorKind.INVALID_ARGUMENT
    assert not core.initialized and list_checkpoints(tmp_path) == []


def test_config_mirrors_ppo_config_and_reads_env(tmp_path: Path) -> None:
    config = LearnerConfig()
    assert config.ppo_config() == PPOConfig()
    assert (config.port, config.checkpoint_every, config.keep_checkpoints, config.hidden_sizes) == (0, 10, 3, [64, 64])
    env = {f"{ENV_PREFIX}GAMMA": "0.995", f"{ENV_PREFIX}HIDDEN_SIZES": "[32, 16]", f"{ENV_PREFIX}DEVICE": "cpu"}
    resolved = resolve_config(LearnerConfig, env_prefix=ENV_PREFIX, environ=env, overrides={"lr": 1e-3})
    assert (
        resolved.ppo_config().gamma == 0.995 and resolved.ppo_config().lr == 1e-3 and resolved.hidden_sizes == [32, 16]
    )
    for field, value in (
        ("gamma", 1.5),
        ("checkpoint_every", 0),
        ("device", "tpu"),
        ("hidden_sizes", [64, 0]),
        ("lr", math.inf),
    ):
        with pytest.raises(ConfigError, match=field):
            resolve_config(LearnerConfig, environ={}, overrides={field: value})
