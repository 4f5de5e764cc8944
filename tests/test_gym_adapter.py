"""Gymnasium environments served over real gRPC through the adapter."""

from __future__ import annotations

import importlib.util

import grpc
import gymnasium as gym
import numpy as np
import pytest
from conftest import sim_server, stub_for

from fast import tensor
from fast.spaces import space_from_proto
from fast.v1 import simulator_pb2 as pb
from fast.v1 import tensor_pb2 as tpb
from sim_server.gym_adapter import GymSlotEnv, space_spec


def _episode(
    stub, slot: int, clip: int, seed: int, actions: np.ndarray
) -> tuple[list[bytes], pb.EpisodeSummary | None]:
    r = stub.Reset(pb.ResetRequest(slot_ids=[slot], clip_ids=[clip], seeds=[seed]), timeout=10)
    frames = [r.observations.data]
    for a in actions:
        s = stub.Step(pb.StepRequest(slot_ids=[slot], actions=tensor.to_proto(np.array([a], np.int64))), timeout=10)
        frames.append(s.observations.data)
        if s.episodes:
            return frames, s.episodes[0]
    return frames, None


def test_cartpole_round_trip_over_grpc() -> None:
    with sim_server("--env", "gym:CartPole-v1", "--slots", "3") as server, stub_for(server.address) as stub:
        d = stub.Describe(pb.DescribeRequest(), timeout=10)
        assert d.env_id == "gym:CartPole-v1" and d.num_slots == 3
        assert space_from_proto(d.action_space).n == 2 and d.action_space.kind == tpb.SPACE_KIND_DISCRETE
        obs = space_from_proto(d.observation_space)
        assert obs.shape == (4,) and obs.dtype == np.float32
        actions = np.random.default_rng(0).integers(0, 2, size=600)
        a, end_a = _episode(stub, 0, 7, 1, actions)
        b, end_b = _episode(stub, 2, 7, 1, actions)
        assert a == b and end_a is not None and end_a.length == len(a) - 1
        assert end_a.episode_return == pytest.approx(end_a.length)  # CartPole pays 1 per step
        c, _ = _episode(stub, 1, 8, 1, actions)
        assert c[0] != a[0]  # another clip is another start
        stub.Reset(pb.ResetRequest(slot_ids=[0], clip_ids=[0]), timeout=10)
        with pytest.raises(grpc.RpcError) as excinfo:
            stub.Step(pb.StepRequest(slot_ids=[0], actions=tensor.to_proto(np.array([2], np.int64))), timeout=10)
        assert excinfo.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "slot 0: action 2 is outside the discrete space [0, 2)" in excinfo.value.details()
        with pytest.raises(grpc.RpcError) as excinfo:
            stub.Step(pb.StepRequest(slot_ids=[0], actions=tensor.to_proto(np.array([1.0], np.float32))), timeout=10)
        assert excinfo.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "int64" in excinfo.value.details()


def test_gym_env_with_kwargs_and_box_actions() -> None:
    with (
        sim_server("--env", "gym:Pendulum-v1", "--slots", "2", "--env-kwarg", "g=9.81") as server,
        stub_for(server.address) as stub,
    ):
        act = space_from_proto(stub.Describe(pb.DescribeRequest(), timeout=10).action_space)
        assert act.kind == "box" and act.shape == (1,) and act.high[0] == pytest.approx(2.0)
        stub.Reset(pb.ResetRequest(slot_ids=[0, 1], clip_ids=[0, 1]), timeout=10)
        r = stub.Step(
            pb.StepRequest(slot_ids=[0, 1], actions=tensor.to_proto(np.array([[1.0], [-2.0]], np.float32))), timeout=10
        )
        assert tensor.from_proto(r.rewards).shape == (2,)


def test_unknown_gym_env_fails_at_start_with_name() -> None:
    with pytest.raises(RuntimeError, match="NoSuchEnv-v0"):
        with sim_server("--env", "gym:NoSuchEnv-v0", "--slots", "1"):
            pass


def test_space_spec_refuses_unsupported_space() -> None:
    with pytest.raises(ValueError, match="observation space .* not supported; FAST serves Box and Discrete"):
        space_spec(gym.spaces.Dict({"a": gym.spaces.Discrete(2)}), what="observation")


def test_gym_slot_env_in_process_matches_plain_gymnasium() -> None:
    env = GymSlotEnv("CartPole-v1", num_slots=2)
    first = env.reset(np.array([0, 1]), np.array([3, 3]), np.array([0, 0]))
    np.testing.assert_array_equal(first[0], first[1])
    result = env.step(np.array([0, 1]), np.array([0, 1], np.int64))
    assert result.observations.shape == (2, 4) and result.rewards.dtype == np.float32
    env.close()


@pytest.mark.skipif(importlib.util.find_spec("highway_env") is None, reason="optional extra highway-env not installed")
def test_highway_env_round_trip_over_grpc() -> None:
    with (
        sim_server("--env", "gym:highway_env:highway-fast-v0", "--slots", "2") as server,
        stub_for(server.address) as stub,
    ):
        d = stub.Describe(pb.DescribeRequest(), timeout=30)
        assert d.action_space.kind == tpb.SPACE_KIND_DISCRETE
        stub.Reset(pb.ResetRequest(slot_ids=[0, 1], clip_ids=[0, 1]), timeout=30)
        r = stub.Step(pb.StepRequest(slot_ids=[0, 1], actions=tensor.to_proto(np.array([1, 1], np.int64))), timeout=30)
        assert np.isfinite(tensor.from_proto(r.observations)).all()
