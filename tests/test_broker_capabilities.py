"""The broker honours each simulator's Capabilities, over real processes: servers started with
`fast sim-server --no-step-stream --no-batched-reset` advertise neither and refuse both, and
every mode still runs on them (alone, or mixed with a server that has both) without a fault.
A simulator killed mid-run is reported by its transport error, not grpc's InvalidStateError."""

from __future__ import annotations

import asyncio
import time

import grpc
import numpy as np
import pytest

from broker.dealer import ClipDealer
from broker.policy_runner import PolicyRunner
from broker.pool import PoolTimeouts, SimulatorPool
from broker.samplers import MODE_NAMES, make_sampler
from fast import tensor
from fast.rpc import open_blocking_channel
from fast.v1 import broker_pb2, broker_pb2_grpc
from fast.v1 import simulator_pb2 as sim_pb
from fast.v1 import simulator_pb2_grpc as sim_grpc
from jobs.processes import ServiceProcess, start_service
from sim_server.client import StepStream

# Brokers driving real servers and a learner: end-to-end runs, left out of `dev.py test --quick`.
pytestmark = pytest.mark.slow

SIM_ARGS = ["sim-server", "--slots", "3", "--port", "0"]
BARE = ["--no-step-stream", "--no-batched-reset"]


@pytest.fixture(scope="module")
def services(tmp_path_factory):
    """Two bare simulators (neither capability), one with both, and a learner the brokers share."""
    started: list[ServiceProcess] = []
    try:
        for name, extra in (("bare-a", BARE), ("bare-b", BARE), ("full", [])):
            started.append(start_service(name, [*SIM_ARGS, *extra]))
        ckpt = tmp_path_factory.mktemp("ckpt")
        started.append(
            start_service(
                "learner",
                ["learner", "--port", "0", "--checkpoint-dir", str(ckpt), "--update-epochs", "1"]
                + ["--num-minibatches", "1"],
            )
        )
        yield dict(zip(("bare_a", "bare_b", "full", "learner"), started))
    finally:
        for service in started:
            service.stop()


def test_bare_server_advertises_and_refuses(services) -> None:
    with open_blocking_channel(services["bare_a"].address) as channel:
        stub = sim_grpc.SimulatorStub(channel)
        caps = stub.Describe(sim_pb.DescribeRequest(), timeout=5).capabilities
        assert not caps.streaming_step and not caps.batched_reset
        with pytest.raises(grpc.RpcError) as excinfo:
            stub.Reset(sim_pb.ResetRequest(slot_ids=[0, 1], clip_ids=[0, 1]), timeout=5)
        assert excinfo.value.code() == grpc.StatusCode.UNIMPLEMENTED
        assert "resets one slot per call" in excinfo.value.details()
        stub.Reset(sim_pb.ResetRequest(slot_ids=[0], clip_ids=[0]), timeout=5)  # one slot: served
        request = sim_pb.StepRequest(slot_ids=[0], actions=tensor.to_proto(np.zeros((1, 2), np.float32)))
        with pytest.raises(grpc.RpcError) as excinfo:
            list(stub.StepStream(iter([request]), timeout=5))
        assert excinfo.value.code() == grpc.StatusCode.UNIMPLEMENTED and "StepStream" in excinfo.value.details()
    with open_blocking_channel(services["full"].address) as channel:
        caps = sim_grpc.SimulatorStub(channel).Describe(sim_pb.DescribeRequest(), timeout=5).capabilities
        assert caps.streaming_step and caps.batched_reset


def _run_broker(services, mode: str, simulators: list[str], tmp_path) -> tuple[broker_pb2.GetRunStatusResponse, str]:
    """A broker over `simulators` until its 2nd iteration; its status then, and everything it printed."""
    broker = start_service(
        f"broker-{mode}",
        ["broker", "--simulators", ",".join(simulators), "--learner", services["learner"].address]
        + ["--mode", mode, "--iterations", "0", "--samples-per-iteration", "24", "--alpha", "1.0", "--t-max", "8"]
        + ["--run-dir", str(tmp_path / "run"), "--port", "0"],
    )
    try:
        with open_blocking_channel(broker.address) as channel:
            stub = broker_pb2_grpc.BrokerStub(channel)
            deadline = time.monotonic() + 120
            while True:
                status = stub.GetRunStatus(broker_pb2.GetRunStatusRequest(), timeout=5)
                if status.iteration >= 2 or status.state == broker_pb2.RUN_STATE_FAILED:
                    break
                assert time.monotonic() < deadline and broker.alive(), f"no 2nd iteration: {status}"
                time.sleep(0.1)
    finally:
        broker.stop()
    return status, "\n".join(broker.output)


@pytest.mark.parametrize("mode", MODE_NAMES)
def test_every_mode_runs_on_servers_without_stream_or_batched_reset(services, mode, tmp_path) -> None:
    bare = [services["bare_a"].address, services["bare_b"].address]
    status, output = _run_broker(services, mode, bare, tmp_path)
    assert status.state == broker_pb2.RUN_STATE_RUNNING and not status.error, status.error
    assert status.faults_total == 0 and status.valid_steps_total > 0
    assert [s.address for s in status.simulators] == bare
    for sim in status.simulators:
        assert sim.up and sim.faults == 0 and not sim.last_error, sim
        assert not sim.step_stream and not sim.batched_reset
    for address in bare:  # each fallback logged once per server
        assert output.count(f"simulator {address}: no StepStream, using unary Step") == 1, output
        assert output.count(f"simulator {address}: no batched Reset, sending one Reset per slot") == 1, output


@pytest.mark.parametrize("mode", ["sgr", "ver"])
def test_a_mixed_pool_drives_each_server_as_it_can(services, mode, tmp_path) -> None:
    full, bare = services["full"].address, services["bare_a"].address
    status, output = _run_broker(services, mode, [full, bare], tmp_path)
    assert status.state == broker_pb2.RUN_STATE_RUNNING and not status.error, status.error
    assert status.faults_total == 0
    by_address = {s.address: s for s in status.simulators}
    assert all(s.up and s.faults == 0 for s in status.simulators), status.simulators
    # ver steps and resets every slot on its own, whatever the server can; sgr batches where it may.
    assert by_address[full].step_stream == by_address[full].batched_reset == (mode == "sgr")
    assert not by_address[bare].step_stream and not by_address[bare].batched_reset
    assert f"simulator {full}: no" not in output


def test_pool_falls_back_per_server_and_counts_reset_calls(services) -> None:
    """In process: a mixed pool batches the full server's reset and splits the bare one's."""

    async def go():
        pool = SimulatorPool(PoolTimeouts(step_s=5.0, reset_s=10.0, describe_s=5.0))
        await pool.add(services["full"].address)
        await pool.add(services["bare_a"].address)
        full, bare = pool.servers
        assert (full.streaming_step, full.batched_reset) == (True, True)
        assert (bare.streaming_step, bare.batched_reset) == (False, False)
        slots = np.arange(pool.num_slots)
        reset = await pool.reset(slots, slots % pool.num_clips, np.zeros_like(slots), batched=True)
        assert not reset.failed.any() and reset.calls == 1 + bare.num_slots
        actions = np.zeros((slots.size, *pool.action_space.shape), np.float32)
        for _ in range(3):
            step = await pool.step(slots, actions)
            assert not step.failed.any()
        assert full.stream is not None and bare.stream is None
        await pool.close()

    asyncio.run(asyncio.wait_for(go(), 60))


class KillAtStep(SimulatorPool):
    """Before its `at_step`-th Step call: kill the server, and wait until its step stream has
    seen the connection go (the stream is finished before the next request is written)."""

    def __init__(self, timeouts: PoolTimeouts, *, at_step: int, victim: ServiceProcess, use_local_step: bool) -> None:
        super().__init__(timeouts, use_local_step=use_local_step)
        self.at_step, self.victim, self.steps = at_step, victim, 0

    async def step(self, slots, env_actions, **kw):
        self.steps += 1
        if self.steps == self.at_step:
            server = self.servers[1]
            self.victim.kill()
            deadline = time.monotonic() + 10
            # A gRPC stream sees it asynchronously; a local socket's next read sees it at once.
            while isinstance(server.stream, StepStream) and not server.stream._call.done():
                assert time.monotonic() < deadline, "the step stream never saw the server go"
                await asyncio.sleep(0.01)
        return await super().step(slots, env_actions, **kw)


@pytest.mark.parametrize("use_local_step", [False, True], ids=["grpc", "local-socket"])
def test_killed_simulator_is_reported_by_its_transport_error(use_local_step: bool) -> None:
    a = start_service("sim-a", SIM_ARGS)
    b = start_service("sim-b", SIM_ARGS)
    try:

        async def go():
            pool = KillAtStep(
                PoolTimeouts(step_s=5.0, reset_s=5.0, describe_s=1.0, backoff_initial_s=5.0),
                at_step=3,
                victim=b,
                use_local_step=use_local_step,
            )
            await pool.add(a.address)
            await pool.add(b.address)
            runner = PolicyRunner(pool.observation_space, pool.action_space, (16,), seed=0)
            dealer = ClipDealer(pool.num_clips, holdout_every=10, seed=0)
            sampler = make_sampler("autoreset", pool, runner, dealer, samples_per_iteration=30)
            _, stats = await sampler.sample()
            server_b = pool.servers[1]
            await pool.close()
            return stats, server_b

        stats, server_b = asyncio.run(asyncio.wait_for(go(), 60))
    finally:
        a.stop()
        b.stop()
    assert stats.faults >= 1 and not server_b.up and server_b.faults == 1
    assert "InvalidStateError" not in server_b.last_error and "already finished" not in server_b.last_error
    assert server_b.last_error.startswith("UNAVAILABLE: "), server_b.last_error
