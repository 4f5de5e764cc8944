"""A bad Initialize leaves the learner as it was: refused INVALID_ARGUMENT naming the field,
never persisted, and a checkpoint holding unusable spaces is refused at load. Through the
servicer without sockets, then the reported scenario against a `fast learner` process."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import grpc
import numpy as np
import pytest
import torch
from conftest import Aborted, FakeContext, stub_for

from fast import tensor
from fast.spaces import SpaceSpec, space_to_proto
from fast.v1 import learner_pb2 as pb
from fast.v1 import learner_pb2_grpc as pb_grpc
from fast.v1 import tensor_pb2 as tpb
from jobs.processes import start_service
from learner.checkpoint import CheckpointError, latest_checkpoint, list_checkpoints, load_checkpoint
from learner.config import LearnerConfig
from learner.core import MAX_POLICY_PARAMETERS, LearnerCore
from learner.policy import ActionSpec, ActorCritic, parameter_count
from learner.servicer import LearnerServicer

OBS = SpaceSpec("box", (5,), np.dtype(np.float32), np.full(5, -10, np.float32), np.full(5, 10, np.float32))
ACT = SpaceSpec("box", (2,), np.dtype(np.float32), -np.ones(2, np.float32), np.ones(2, np.float32))


def _request(obs: tpb.Space | None = None, act: tpb.Space | None = None) -> pb.InitializeRequest:
    return pb.InitializeRequest(
        observation_space=obs if obs is not None else space_to_proto(OBS),
        action_space=act if act is not None else space_to_proto(ACT),
    )


def _obs(**changes) -> tpb.Space:
    message = space_to_proto(OBS)
    for name, value in changes.items():
        getattr(message, name).CopyFrom(value) if name in ("low", "high") else setattr(message, name, value)
    return message


def _bounds(n: int) -> tpb.Tensor:
    return tensor.to_proto(np.zeros(n, np.float32))


BAD_INITIALIZE = {
    "bounds of 3 for a Box of 5": (_request(obs=_obs(low=_bounds(3))), "observation_space.low is shape [3]"),
    "low > high": (
        _request(obs=_obs(low=tensor.to_proto(np.full(5, 20, np.float32)))),
        "observation_space: low > high at element 0",
    ),
    "NaN bound": (
        _request(obs=_obs(high=tensor.to_proto(np.full(5, np.nan, np.float32)))),
        "observation_space.high holds NaN",
    ),
    "unknown dtype": (_request(obs=_obs(dtype=77)), "observation_space.dtype is 77"),
    "unknown kind": (_request(act=tpb.Space(kind=5)), "action_space.kind is 5"),
    "Discrete(0) actions": (
        _request(act=tpb.Space(kind=tpb.SPACE_KIND_DISCRETE, n=0)),
        "action_space.n is 0",
    ),
    "a policy too large to build": (
        _request(act=tpb.Space(kind=tpb.SPACE_KIND_DISCRETE, n=10**12)),
        f"the learner builds at most {MAX_POLICY_PARAMETERS:,}",
    ),
    "missing action space": (pb.InitializeRequest(observation_space=space_to_proto(OBS)), "action_space is missing"),
}


def _core(tmp_path: Path) -> LearnerCore:
    return LearnerCore(LearnerConfig(checkpoint_dir=tmp_path, update_epochs=1, num_minibatches=1))


@pytest.mark.parametrize("case", sorted(BAD_INITIALIZE))
def test_a_bad_initialize_is_refused_and_leaves_the_learner_usable(tmp_path: Path, case: str) -> None:
    request, fragment = BAD_INITIALIZE[case]

    async def run():
        core = _core(tmp_path)
        servicer = LearnerServicer(core)
        with pytest.raises(Aborted) as before_init:
            await servicer.Initialize(request, FakeContext())
        untouched = (core.initialized, list_checkpoints(tmp_path))
        # The correct Initialize afterwards succeeds, and so does everything after it.
        reply = await servicer.Initialize(_request(), FakeContext())
        policy = await servicer.GetPolicy(pb.GetPolicyRequest(known_version=-1), FakeContext())
        # Initialised now: the bad request is still refused as malformed, the spaces stay.
        with pytest.raises(Aborted) as after_init:
            await servicer.Initialize(request, FakeContext())
        saved = await servicer.SaveCheckpoint(pb.SaveCheckpointRequest(), FakeContext())
        return before_init.value, untouched, reply, policy, after_init.value, saved, core

    before, untouched, reply, policy, after, saved, core = asyncio.run(run())
    for refused in (before, after):
        assert refused.code == grpc.StatusCode.INVALID_ARGUMENT, refused.details
        assert fragment in refused.details and len(refused.details) < 600
    assert untouched == (False, [])  # nothing built, nothing persisted
    assert (reply.policy_version, reply.resumed) == (0, False) and policy.policy.weights
    assert saved.policy_version == 0
    assert load_checkpoint(Path(saved.path)).observation_space.shape == (5,)
    assert asyncio.run(core.close()) is None  # the final checkpoint: nothing new to write, no error


def test_a_checkpoint_holding_unusable_spaces_is_refused_at_load_by_name(tmp_path: Path) -> None:
    async def initialize() -> None:
        await _core(tmp_path).initialize(OBS, ACT)

    asyncio.run(initialize())
    path = latest_checkpoint(tmp_path)
    payload = torch.load(path, weights_only=True)
    # What an older learner stored after accepting the reported Initialize: a Box of 5, bounds of 3.
    payload["observation_space"] = _obs(low=_bounds(3), high=_bounds(3)).SerializeToString()
    torch.save(payload, path)
    with pytest.raises(CheckpointError) as refused:
        load_checkpoint(path)
    message = str(refused.value)
    assert str(path) in message and "holds an invalid observation_space" in message
    assert "observation_space.low is shape [3]" in message and "--checkpoint-dir" in message
    with pytest.raises(CheckpointError, match="no readable checkpoint"):
        _core(tmp_path)


def test_the_reported_wedge_over_grpc_then_sigterm_writes_the_final_checkpoint(tmp_path: Path) -> None:
    """Initialize with a 5-dimensional Box and a 3-element low, or low > high, used to answer OK
    and wedge the learner (GetPolicy and SaveCheckpoint failing, no final checkpoint)."""
    args = ["learner", "--port", "0", "--checkpoint-dir", str(tmp_path), "--update-epochs", "1"]
    service = start_service("learner", args)
    try:
        with stub_for(service.address, pb_grpc.LearnerStub) as stub:
            for case in ("bounds of 3 for a Box of 5", "low > high"):
                request, fragment = BAD_INITIALIZE[case]
                with pytest.raises(grpc.RpcError) as refused:
                    stub.Initialize(request, timeout=30)
                assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and fragment in refused.value.details()
            assert not stub.GetStatus(pb.GetStatusRequest(), timeout=10).initialized
            assert stub.Initialize(_request(), timeout=30).resumed is False
            assert stub.GetPolicy(pb.GetPolicyRequest(known_version=-1), timeout=10).policy.weights
            stub.SaveCheckpoint(pb.SaveCheckpointRequest(), timeout=30)
        service.process.send_signal(signal.SIGTERM)
        assert service.process.wait(timeout=30) == 0
    finally:
        service.stop()
    assert list_checkpoints(tmp_path) and load_checkpoint(latest_checkpoint(tmp_path)).observation_space.shape == (5,)


@pytest.mark.parametrize(
    "obs_shape, action, hidden",
    [((5,), ActionSpec.box(2), (64, 64)), ((3, 4), ActionSpec.discrete(7), (16,)), ((62,), ActionSpec.box((2, 3)), ())],
)
def test_parameter_count_is_the_built_networks(obs_shape, action, hidden) -> None:
    """The size guard counts without building: it must count what ActorCritic builds."""
    built = sum(p.numel() for p in ActorCritic(obs_shape, action, hidden).parameters())
    assert parameter_count(obs_shape, action, hidden) == built
