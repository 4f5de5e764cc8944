"""ExportPolicy: the exported TorchScript and ONNX models give the action the broker's evaluation takes
(`PolicyRunner.act_deterministic`), to 1e-5, for a Box with bounds that clip and for a Discrete space;
first as a plain module, then through a learner served over real gRPC on loopback."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path

import grpc
import numpy as np
import onnxruntime
import pytest
import torch
from conftest import Aborted, FakeContext

from broker.policy_runner import PolicyRunner
from fast.spaces import SpaceSpec
from fast.v1 import learner_pb2 as pb
from fast.v1 import learner_pb2_grpc as pb_grpc
from learner import export as export_module
from learner.client import LearnerClient
from learner.config import LearnerConfig
from learner.core import LearnerCore
from learner.export import ONNX_INPUT, ONNX_OUTPUT, export_policy
from learner.policy import ActorCritic, export_weights
from learner.server import create_server
from learner.servicer import LearnerServicer
from learner.wire import Policy

HIDDEN = (16, 16)
OBS_SHAPE = (2, 3)  # two dimensions: the model flattens them as the policy does
OBS_SPACE = SpaceSpec(
    "box", OBS_SHAPE, np.dtype(np.float32), np.full(OBS_SHAPE, -5, np.float32), np.full(OBS_SHAPE, 5, np.float32)
)
# Per-element bounds, finite and infinite, so clipping is exercised dimension by dimension.
BOX = SpaceSpec(
    "box",
    (2, 2),
    np.dtype(np.float32),
    np.array([[-0.5, -np.inf], [0.0, -1.0]], np.float32),
    np.array([[0.5, 0.2], [np.inf, 1.0]], np.float32),
)
DISCRETE = SpaceSpec("discrete", (), np.dtype(np.int64), n=5)
SPACES = {"box": BOX, "discrete": DISCRETE}


def observations(batch: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(scale=2.0, size=(batch, *OBS_SHAPE)).astype(np.float32)


def spread_policy(action_space: SpaceSpec) -> Policy:
    """A policy whose output head is scaled up: the initial head (std 0.01) puts every mean near 0 and
    every logit near a tie, which would test neither clipping nor the arg-max."""
    torch.manual_seed(7)
    actor_critic = ActorCritic(OBS_SHAPE, action_space, HIDDEN)
    head = actor_critic.actor_mean if action_space.kind == "box" else actor_critic.actor_logits
    with torch.no_grad():
        head[-1].weight.mul_(200.0)
    return Policy(3, export_weights(actor_critic), HIDDEN, OBS_SPACE, action_space)


def broker_actions(policy: Policy, obs: np.ndarray) -> np.ndarray:
    """What the broker's evaluation plays (broker/evaluate.py calls act_deterministic)."""
    runner = PolicyRunner(policy.observation_space, policy.action_space, policy.hidden_sizes)
    runner.load(policy.version, policy.weights)
    return runner.act_deterministic(obs)


def run_torchscript(model: bytes, obs: np.ndarray) -> np.ndarray:
    module = torch.jit.load(io.BytesIO(model))
    with torch.no_grad():
        return module(torch.from_numpy(obs)).numpy()


def run_onnx(model: bytes, obs: np.ndarray) -> np.ndarray:
    session = onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == [ONNX_INPUT]
    assert [o.name for o in session.get_outputs()] == [ONNX_OUTPUT]
    (actions,) = session.run([ONNX_OUTPUT], {ONNX_INPUT: obs})
    return actions


RUNTIMES = {"torchscript": run_torchscript, "onnx": run_onnx}
# Loading TorchScript is what the format promises its users; torch's deprecation of it is not this test's concern.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:DeprecationWarning")


def assert_same_actions(got: np.ndarray, expected: np.ndarray, action_space: SpaceSpec) -> None:
    assert got.shape == expected.shape
    if action_space.kind == "discrete":
        assert got.dtype == np.int64 and np.array_equal(got, expected)
    else:
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("format_name", ["torchscript", "onnx"])
@pytest.mark.parametrize("kind", ["box", "discrete"])
def test_exported_model_takes_the_broker_evaluation_action(kind: str, format_name: str) -> None:
    action_space = SPACES[kind]
    policy = spread_policy(action_space)
    model = export_policy(policy, format_name)
    for batch in (1, 64):  # traced with a batch of 2: the batch dimension is dynamic
        obs = observations(batch, seed=batch)
        expected = broker_actions(policy, obs)
        assert_same_actions(RUNTIMES[format_name](model, obs), expected, action_space)
    expected = broker_actions(policy, observations(64, seed=64))
    if kind == "box":
        # The test means something only if some actions were clipped to each bound and some were not.
        low, high = np.broadcast_to(BOX.low, expected.shape), np.broadcast_to(BOX.high, expected.shape)
        assert (expected == low).any() and (expected == high).any() and ((expected > low) & (expected < high)).any()
    else:
        assert len(np.unique(expected)) >= 3


def test_export_refuses_an_unknown_format() -> None:
    with pytest.raises(ValueError, match=r"format must be one of \['torchscript', 'onnx'\], got 'pickle'"):
        export_policy(spread_policy(BOX), "pickle")


def test_onnx_without_the_onnx_package_is_unimplemented(tmp_path: Path, monkeypatch) -> None:
    """The learner's runtime dependencies lack onnx (torch's exporter writes the file with it): ONNX is
    refused by name, TorchScript still exports."""
    find_spec = export_module.importlib.util.find_spec

    def without_onnx(name: str, *rest):
        return None if name == "onnx" else find_spec(name, *rest)

    monkeypatch.setattr(export_module.importlib.util, "find_spec", without_onnx)

    async def run() -> tuple[Aborted, pb.ExportPolicyResponse]:
        core = LearnerCore(LearnerConfig(checkpoint_dir=tmp_path, hidden_sizes=list(HIDDEN)))
        await core.initialize(OBS_SPACE, BOX)
        servicer = LearnerServicer(core)
        with pytest.raises(Aborted) as excinfo:
            await servicer.ExportPolicy(pb.ExportPolicyRequest(format=pb.POLICY_FORMAT_ONNX), FakeContext())
        return excinfo.value, await servicer.ExportPolicy(
            pb.ExportPolicyRequest(format=pb.POLICY_FORMAT_TORCHSCRIPT), FakeContext()
        )

    refused, torchscript = asyncio.run(run())
    assert refused.code == grpc.StatusCode.UNIMPLEMENTED and "pip install onnx" in refused.details
    assert torchscript.model and torchscript.policy_version == 0


# -- over gRPC -------------------------------------------------------------------------------------


def test_export_policy_over_grpc(tmp_path: Path) -> None:
    """A served learner exports the version it serves, as its own GetPolicy weights act."""
    # One bound a hair around 0: even the initial (near-zero) means get clipped on it.
    low, high = np.array([-1e-4, -1], np.float32), np.array([1e-4, 1], np.float32)
    tight = SpaceSpec("box", (2,), np.dtype(np.float32), low, high)
    config = LearnerConfig(checkpoint_dir=tmp_path, hidden_sizes=list(HIDDEN), update_epochs=1, num_minibatches=1)

    async def run() -> None:
        core = LearnerCore(config)
        server, port, _ = await create_server(core, "127.0.0.1:0")
        try:
            async with LearnerClient(f"127.0.0.1:{port}", timeout_s=30) as client:
                await client.wait_ready()
                stub = client.stub(pb_grpc.LearnerStub)
                with pytest.raises(grpc.aio.AioRpcError) as excinfo:
                    await client.export_policy("onnx")
                assert excinfo.value.code() == grpc.StatusCode.FAILED_PRECONDITION
                assert "ExportPolicy before Initialize" in excinfo.value.details()

                await client.initialize(OBS_SPACE, tight)
                for request, fragment in (
                    (pb.ExportPolicyRequest(), "format is POLICY_FORMAT_UNSPECIFIED; set one of"),
                    (pb.ExportPolicyRequest(format=7), "format is 7; set one of POLICY_FORMAT_TORCHSCRIPT"),
                ):
                    with pytest.raises(grpc.aio.AioRpcError) as excinfo:
                        await stub.ExportPolicy(request, timeout=30)
                    assert excinfo.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                    assert fragment in excinfo.value.details()

                policy = await client.get_policy()
                obs = observations(32, seed=5)
                expected = broker_actions(policy, obs)
                assert (np.abs(expected[:, 0]) == np.float32(1e-4)).any()  # clipped on the tight bound
                for format_name, runtime in RUNTIMES.items():
                    exported = await client.export_policy(format_name)
                    assert exported.policy_version == policy.version == 0
                    assert exported.observation_shape == OBS_SHAPE
                    assert_same_actions(runtime(exported.model, obs), expected, tight)
        finally:
            await server.stop(None)

    asyncio.run(run())
