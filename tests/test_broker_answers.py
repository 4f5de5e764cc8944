"""The broker trusts nothing a simulator answers: the checks alone (broker/answers.py), then a
misbehaving simulator behind a real gRPC server on a loopback port, sampled by the pool and the
samplers, and the addresses RegisterSimulator accepts."""

from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager
from types import SimpleNamespace

import grpc
import numpy as np
import pytest
from conftest import Aborted, FakeContext
from scripted_env import ScriptedLengthEnv

from broker import answers
from broker.dealer import ClipDealer
from broker.policy_runner import PolicyRunner
from broker.pool import PoolTimeouts, SimulatorPool
from broker.samplers import SamplingError, make_sampler
from broker.servicer import BrokerServicer
from fast.addresses import resolve_addresses, split_host_port
from fast.spaces import SpaceSpec
from fast.v1 import broker_pb2
from fast.v1 import simulator_pb2 as pb
from learner.batch import RolloutBatch
from sim_server.client import ResetReply, ServerDescription, StepReply
from sim_server.cost_model import CostModel, CostModelConfig
from sim_server.env_api import StepResult
from sim_server.server import create_server
from sim_server.simulator import Simulator

OBS = SpaceSpec("box", (3,), np.dtype(np.float32), np.full(3, -1e6, np.float32), np.full(3, 1e6, np.float32))
ASKED = np.array([4, 1, 2])


def _good_step(**changes) -> StepReply:
    reply = StepReply(
        slot_ids=ASKED.copy(),
        observations=np.zeros((3, 3), np.float32),
        rewards=np.ones(3, np.float32),
        terminated=np.array([False, True, False]),
        truncated=np.array([False, False, True]),
        episodes=[
            pb.EpisodeSummary(slot_id=1, terminated=True, episode_return=2.0, metrics={"min_ttc": float("inf")}),
            pb.EpisodeSummary(slot_id=2, terminated=False, episode_return=1.0),
        ],
        timing=pb.ServerTiming(compute_s=0.001),
    )
    for name, value in changes.items():
        setattr(reply, name, value)
    return reply


# -- the checks, without sockets -------------------------------------------------------------------


def test_a_good_step_and_reset_answer_pass() -> None:
    assert answers.step_problem(_good_step(), ASKED, OBS) == ""
    reset = ResetReply(ASKED.copy(), np.zeros((3, 3), np.float32), pb.ServerTiming())
    assert answers.reset_problem(reset, ASKED, OBS) == ""


@pytest.mark.parametrize(
    "changes, fragment",
    [
        (
            {"observations": np.zeros((3, 4), np.float32)},
            "observations: expected shape [3, 3] of float32, got shape [3, 4]",
        ),
        (
            {"observations": np.zeros((3, 3), np.float64)},
            "observations: expected shape [3, 3] of float32, got shape [3, 3] of float64",
        ),
        (
            {"observations": np.array([[0, 0, 0], [0, np.nan, 0], [0, 0, 0]], np.float32)},
            "observations: 1 of 3 hold NaN or inf",
        ),
        ({"rewards": np.array([1, np.nan, 1], np.float32)}, "rewards: slot 1 has reward nan"),
        ({"rewards": np.ones(2, np.float32)}, "rewards: expected float32 [3], got shape [2]"),
        ({"rewards": np.ones(3, np.int32)}, "rewards: expected float32 [3], got shape [3] of int32"),
        ({"terminated": np.zeros(3, np.uint8)}, "terminated: expected bool [3]"),
        ({"truncated": np.array([False, True, True])}, "terminated/truncated: slot 1 is both terminated and truncated"),
        ({"slot_ids": np.array([4, 2, 1])}, "slot_ids: answered [4, 2, 1] for [4, 1, 2]"),
        ({"slot_ids": np.array([4, 1])}, "slot_ids: answered [4, 1] for [4, 1, 2]"),
        ({"episodes": []}, "episodes: no summary for slot 1, whose episode ended (2 missing in all)"),
        ({"episodes": [pb.EpisodeSummary(slot_id=4)]}, "episodes: a summary for slot 4, whose episode did not end"),
        (
            {"episodes": [pb.EpisodeSummary(slot_id=1, terminated=True)] * 2},
            "episodes: two summaries for slot 1",
        ),
        (
            {"episodes": [pb.EpisodeSummary(slot_id=1), pb.EpisodeSummary(slot_id=2)]},
            "episodes: slot 1's summary says terminated=False",
        ),
        (
            {
                "episodes": [
                    pb.EpisodeSummary(slot_id=1, terminated=True, metrics={"x" * 500: 1.0}),
                    pb.EpisodeSummary(slot_id=2),
                ]
            },
            "a metric name of 500 characters",
        ),
        ({"timing": pb.ServerTiming(queued_s=-1.0)}, "timing.queued_s is -1.0"),
        ({"timing": pb.ServerTiming(compute_s=float("nan"))}, "timing.compute_s is nan"),
        ({"timing": pb.ServerTiming(map_loads=-1)}, "timing.map_loads is -1"),
        ({"request_id": 7, "sent_request_id": 8}, "request_id: the answer carries 7 for request 8"),
    ],
)
def test_a_bad_step_answer_is_named_by_its_field(changes, fragment) -> None:
    problem = answers.step_problem(_good_step(**changes), ASKED, OBS)
    assert fragment in problem, problem
    assert len(problem) < 400


def test_a_bad_reset_answer_and_description_are_named() -> None:
    reset = ResetReply(ASKED.copy(), np.zeros((3, 2), np.float32), pb.ServerTiming())
    assert answers.reset_problem(reset, ASKED, OBS).startswith("observations: expected shape [3, 3]")
    reset = ResetReply(np.array([4]), np.zeros((1, 3), np.float32), pb.ServerTiming())
    assert answers.reset_problem(reset, ASKED, OBS).startswith("slot_ids: answered [4] for [4, 1, 2]")
    discrete = SpaceSpec("discrete", (), np.dtype(np.int64), n=5)
    reset = ResetReply(ASKED.copy(), np.array([0, 5, 1]), pb.ServerTiming())
    assert "Discrete(5) observation must lie in [0, 5)" in answers.reset_problem(reset, ASKED, discrete)

    def described(num_slots: int, num_clips: int) -> ServerDescription:
        return ServerDescription("x", OBS, OBS, num_slots, num_clips, None, "")

    assert answers.description_problem(described(3, 10)) == ""
    assert "num_slots is 0" in answers.description_problem(described(0, 10))
    assert "num_slots is 2147483647" in answers.description_problem(described(2**31 - 1, 10))
    assert "num_clips is 0" in answers.description_problem(described(3, 0))
    maps = ServerDescription("x", OBS, OBS, 3, 4, None, "", clip_map_ids=np.array([0, 0, 1]))
    assert "clip_map_ids has 3 entries for 4 clips" in answers.description_problem(maps)
    maps.clip_map_ids = np.array([0, 0, 1, -2])
    assert "negative map id" in answers.description_problem(maps)
    maps.clip_map_ids = np.array([0, 0, 1, 1])
    assert answers.description_problem(maps) == ""


def test_a_long_answer_is_quoted_bounded() -> None:
    asked = np.arange(10_000)
    reply = _good_step(slot_ids=asked[::-1].copy())
    problem = answers.step_problem(reply, asked, OBS)
    assert problem.startswith("slot_ids: answered [9999, 9998") and len(problem) < 300


# -- a misbehaving simulator over gRPC -------------------------------------------------------------


class MisbehavingEnv(ScriptedLengthEnv):
    """Scripted episodes whose Step (or Reset) answers break the contract in one way, from the start.

    Its observations carry 100 + slot id, so a transition of its slots is recognisable in a batch.
    """

    def __init__(self, lengths: list[int], fault: str) -> None:
        super().__init__(lengths)
        self.fault = fault

    def _obs(self, slots: np.ndarray) -> np.ndarray:
        obs = super()._obs(slots)
        obs[:, 1] += 100
        return obs

    def reset(self, slot_ids, clip_ids, seeds) -> np.ndarray:
        obs = super().reset(slot_ids, clip_ids, seeds)
        return np.zeros((len(slot_ids), 7), np.float32) if self.fault == "reset_observation_shape" else obs

    def step(self, slot_ids, actions) -> StepResult:
        result = super().step(slot_ids, actions)
        if self.fault == "observation_shape":
            result.observations = np.zeros((len(slot_ids), 4), np.float32)
        elif self.fault == "nan_reward":
            result.rewards = np.full(len(slot_ids), np.nan, np.float32)
        elif self.fault == "both_flags":
            result.terminated = result.truncated = np.ones(len(slot_ids), bool)
            result.episode_metrics = [{"length": 1.0, "return": 1.0}] * len(slot_ids)
        return result


FIELD_OF_FAULT = {
    "observation_shape": "observations",
    "nan_reward": "rewards",
    "both_flags": "terminated/truncated",
    "reset_observation_shape": "observations",
}


@asynccontextmanager
async def pool_of(*envs, max_bad_answers: int = 3):
    servers = []
    pool = SimulatorPool(
        PoolTimeouts(step_s=5.0, reset_s=5.0, describe_s=5.0, backoff_initial_s=0.01, backoff_max_s=0.02),
        max_bad_answers=max_bad_answers,
    )
    try:
        for env in envs:
            server, port, _ = await create_server(
                Simulator(env, CostModel(CostModelConfig())), "127.0.0.1:0", env_id="scripted"
            )
            servers.append(server)
            await pool.add(f"127.0.0.1:{port}")
        yield pool, PolicyRunner(pool.observation_space, pool.action_space, (8,), seed=0)
    finally:
        await pool.close()
        for server in servers:
            await server.stop(None)


@pytest.mark.parametrize("mode", ["fast", "autoreset", "ver"])
@pytest.mark.parametrize("fault", sorted(FIELD_OF_FAULT))
def test_a_simulator_answering_badly_is_faulted_reported_and_dropped_while_sampling_goes_on(
    mode: str, fault: str, caplog
) -> None:
    async def go():
        good, bad = ScriptedLengthEnv([4, 6]), MisbehavingEnv([3, 5], fault)
        async with pool_of(good, bad) as (pool, runner):
            sampler = make_sampler(
                mode,
                pool,
                runner,
                ClipDealer(pool.num_clips, holdout_every=10, seed=0),
                samples_per_iteration=60,
                alpha=1.0,
                t_max=50,
                stall_timeout_s=20,
            )
            # Re-admission waits out a backoff (10 to 20 ms here), so how many iterations the good
            # server fills before the bad one has failed three times depends on the machine's speed:
            # sample until it is dropped (a bound keeps a broken drop from looping), then once more.
            iterations = [await sampler.sample()]
            while not pool.servers[1].dropped and len(iterations) < 50:
                iterations.append(await sampler.sample())
            # Twice more: a slot of the dropped server still live at the drop (its own last step was good)
            # learns that its episode is lost at its next step, which pool._call answers without a call (a
            # server down is never asked): one fault, in the iteration after the drop under VER when the
            # budget ran out first. The second one after it costs nothing more.
            iterations.append(await sampler.sample())
            iterations.append(await sampler.sample())
            return iterations, pool.servers[1], pool

    with caplog.at_level(logging.WARNING, logger="fast.broker.pool"):
        iterations, bad, pool = asyncio.run(asyncio.wait_for(go(), 60))
    field = FIELD_OF_FAULT[fault]
    # The run went on: every batch is whole and valid (a NaN reward would fail validation).
    for b, _ in iterations:
        rb = RolloutBatch.from_numpy({**b, "policy_version": 0})
        assert rb.num_valid >= 60
        # Not one transition of the bad simulator's slots: its observations carry 100 + slot.
        assert not (b["obs"][..., 1][b["valid_mask"]] >= 100).any()
    faults = sum(stats.faults for _, stats in iterations)
    assert faults >= 1 or fault.startswith("reset")  # (a failed reset loses no step)
    assert iterations[-1][1].faults == 0  # once dropped, never asked again
    # Reported with the field, dropped after max_bad_answers in a row, never re-admitted.
    assert bad.dropped and not bad.up and bad.bad_answers == 3 and bad.faults == 3 and bad.readmissions == 2
    assert bad.last_error.startswith("dropped after 3 bad answers in a row and is not re-admitted in this run")
    assert f"the last: {field}" in bad.last_error
    lines = [r.getMessage() for r in caplog.records]
    assert any(bad.address in line and f"bad answer (1 in a row): {field}" in line for line in lines), lines
    assert any(bad.address in line and "dropped after 3 bad answers" in line for line in lines), lines
    # The one admission rule refuses it from now on, RegisterSimulator included.
    assert "was dropped after 3 bad answers" in pool.refusal(bad.address, _described(pool))


def _described(pool: SimulatorPool) -> ServerDescription:
    return ServerDescription("scripted", pool.observation_space, pool.action_space, 2, pool.num_clips, None, "")


def test_a_good_step_answer_clears_the_count_of_bad_ones() -> None:
    class SometimesBad(ScriptedLengthEnv):
        """Every third step answers a NaN reward: it never reaches three bad answers in a row."""

        steps = 0

        def step(self, slot_ids, actions) -> StepResult:
            result = super().step(slot_ids, actions)
            self.steps += 1
            if self.steps % 3 == 0:
                result.rewards = np.full(len(slot_ids), np.nan, np.float32)
            return result

    async def go():
        async with pool_of(ScriptedLengthEnv([5]), SometimesBad([50])) as (pool, runner):
            sampler = make_sampler(
                "autoreset",
                pool,
                runner,
                ClipDealer(pool.num_clips, holdout_every=10, seed=0),
                samples_per_iteration=80,
            )
            batch, stats = await sampler.sample()
            return batch, stats, pool.servers[1]

    batch, stats, flaky = asyncio.run(asyncio.wait_for(go(), 60))
    RolloutBatch.from_numpy({**batch, "policy_version": 0})  # no NaN reward reached it
    assert flaky.faults >= 2 and not flaky.dropped and flaky.bad_answers <= 1
    assert stats.faults >= 2


def test_every_simulator_dropped_ends_sampling_at_once_naming_them() -> None:
    async def go():
        async with pool_of(MisbehavingEnv([3, 3], "nan_reward"), max_bad_answers=2) as (pool, runner):
            sampler = make_sampler(
                "fast",
                pool,
                runner,
                ClipDealer(pool.num_clips, holdout_every=10, seed=0),
                samples_per_iteration=50,
                stall_timeout_s=30,
            )
            with pytest.raises(SamplingError) as failed:
                await sampler.sample()
            return str(failed.value), pool.servers[0].address

    message, address = asyncio.run(asyncio.wait_for(go(), 20))  # far below the stall timeout
    assert message.startswith("every simulator was dropped") and address in message and "rewards" in message


# -- addresses -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1:50051",
        "localhost:1",
        "sim-3.cluster.local:65535",
        "fast_sim_1:50051",
        "[::1]:7000",
        "dns:///localhost:7000",
    ],
)
def test_well_formed_addresses_are_accepted(address: str) -> None:
    assert resolve_addresses(address)


@pytest.mark.parametrize(
    "address",
    [
        "not an address",
        "127.0.0.1",
        "127.0.0.1:0",
        "127.0.0.1:65536",
        "127.0.0.1:http",
        ":50051",
        "two..dots:1",
        "a host:1",
        "[not-ipv6]:1",
        "::1:7000",
        "-leading-dash:1",
        "a" * 300 + ":1",
        "dns:///localhost",
        "dns:///bad name:1",
        "127.0.0.1:١٢",  # digits, but not ASCII ones
    ],
)
def test_malformed_addresses_are_refused_quoting_them_bounded(address: str) -> None:
    with pytest.raises(ValueError, match="expected") as refused:
        resolve_addresses(address)
    assert len(str(refused.value)) < 200
    with pytest.raises(ValueError):
        split_host_port(address)


def test_register_simulator_answers_invalid_argument_for_a_malformed_address_bounded() -> None:
    async def register(address: str):
        servicer = BrokerServicer(SimpleNamespace(pool=SimulatorPool(), register=lambda a: None))
        with pytest.raises(Aborted) as aborted:
            await servicer.RegisterSimulator(broker_pb2.RegisterSimulatorRequest(address=address), FakeContext())
        return aborted.value

    for address in ("not an address", "x" * 1_000_000):
        aborted = asyncio.run(register(address))
        assert aborted.code == grpc.StatusCode.INVALID_ARGUMENT, aborted.details
        assert "expected HOST:PORT" in aborted.details and len(aborted.details) < 200
    # Well formed, nothing listening: UNAVAILABLE.
    aborted = asyncio.run(register("127.0.0.1:1"))
    assert aborted.code == grpc.StatusCode.UNAVAILABLE and "did not answer Describe" in aborted.details


def test_a_call_in_flight_when_its_server_is_readmitted_fails_alone_and_is_not_counted() -> None:
    """VER steps slots of one server concurrently: one call may still be in flight when another's
    failure marks the server down and a re-admission replaces its channel. That call must fail as a
    call (its slot resets) and must not count against the server it came back as. Closing the old
    channel at once cancelled it locally, and the asyncio.CancelledError ended the whole iteration
    (a fresh clone's CI saw it under VER with a misbehaving server)."""

    async def go():
        slow = Simulator(ScriptedLengthEnv([50, 50]), CostModel(CostModelConfig(step_latency_s=0.3)))
        server, port, _ = await create_server(slow, "127.0.0.1:0", env_id="scripted")
        pool = SimulatorPool(PoolTimeouts(step_s=5.0, reset_s=5.0, describe_s=5.0, backoff_initial_s=0.0))
        try:
            await pool.add(f"127.0.0.1:{port}")
            handle = pool.servers[0]
            slots, actions = np.arange(2), np.zeros((2, *pool.action_space.shape), np.float32)
            assert not (await pool.reset(slots, np.arange(2), np.zeros(2, np.int64), batched=True)).failed.any()
            in_flight = asyncio.ensure_future(pool.step(slots[:1], actions[:1], unary=True))
            await asyncio.sleep(0.05)  # its Step is on the wire, 0.3 s to go
            pool._mark_down(handle, "another slot's call failed")
            assert await pool.readmit_due() == [handle]
            stale = await in_flight  # answered by the old admission: failed, not raised
            assert stale.failed.tolist() == [True]
            assert handle.up and handle.faults == 1 and handle.bad_answers == 0
            fresh = await pool.step(slots[1:], actions[1:], unary=True)  # the new channel works
            assert fresh.failed.tolist() == [False]
        finally:
            await pool.close()
            await server.stop(None)

    asyncio.run(asyncio.wait_for(go(), 30))
