"""Faults over real processes: a simulator server killed mid-round, a learner killed mid-run."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from broker.dealer import ClipDealer
from broker.policy_runner import PolicyRunner
from broker.pool import PoolTimeouts, SimulatorPool
from broker.samplers import make_sampler
from fast.rpc import open_blocking_channel
from fast.v1 import broker_pb2, broker_pb2_grpc
from jobs.processes import start_service
from learner.batch import RolloutBatch
from learner.policy import ActorCritic
from learner.ppo import PPOConfig, PPOLearner

# Servers and learners killed under running brokers: end-to-end runs, left out of `dev.py test --quick`.
pytestmark = pytest.mark.slow


def _port(address: str) -> str:
    return address.rsplit(":", 1)[1]


class FaultAtStep(SimulatorPool):
    """A pool that calls `fault()` just before its `at_step`-th Step call of a slot of `server`
    (its index in the pool), from inside the sampler.

    Counted per server: modes with rounds call Step once per server and row, pipelined, so the
    order of calls across servers depends on who answers first."""

    def __init__(self, timeouts: PoolTimeouts, *, at_step: int, fault, server: int = 1) -> None:
        super().__init__(timeouts)
        self.at_step, self.fault, self.steps, self.server = at_step, fault, 0, server

    async def step(self, slots, env_actions, **kw):
        if (self.slot_server[slots] == self.server).any():
            self.steps += 1
            if self.steps == self.at_step:
                self.fault()
        return await super().step(slots, env_actions, **kw)


@pytest.mark.parametrize("pipeline", [False, True])
def test_killed_simulator_masks_its_slots_and_is_readmitted(pipeline: bool) -> None:
    sim_args = ["sim-server", "--slots", "3", "--step-latency-s", "0.003"]
    a = start_service("sim-a", [*sim_args, "--port", "0"])
    b = start_service("sim-b", [*sim_args, "--port", "0"])
    restarted = []
    try:

        async def go():
            # Kills server b just before its 3rd lock-step Step: mid-round, while its slots act.
            pool = FaultAtStep(
                PoolTimeouts(step_s=2.0, reset_s=5.0, describe_s=1.0, backoff_initial_s=0.1, backoff_max_s=0.3),
                at_step=3,
                fault=b.kill,
            )
            await pool.add(a.address)
            await pool.add(b.address)
            runner = PolicyRunner(pool.observation_space, pool.action_space, (16,), seed=0)
            sampler = make_sampler(
                "fast",
                pool,
                runner,
                ClipDealer(pool.num_clips, holdout_every=10, seed=0),
                samples_per_iteration=400,
                alpha=1.0,
                t_max=30,
                pipeline=pipeline,
            )
            first = await sampler.sample()
            restarted.append(start_service("sim-b2", [*sim_args, "--port", _port(b.address)]))
            await asyncio.sleep(0.5)  # past b's backoff
            second = await sampler.sample()
            server_b = pool.servers[1]
            await pool.close()
            return first, second, server_b, pool.action_space

        (batch, stats), (batch2, stats2), server_b, action_space = asyncio.run(asyncio.wait_for(go(), 120))
    finally:
        for service in [a, b, *restarted]:
            service.stop()

    rb = RolloutBatch.from_numpy({**batch, "policy_version": 0})
    rb.validate()
    valid = rb.valid_mask.numpy()
    b_cols = slice(3, 6)
    assert stats.faults >= 1
    assert stats.transitions < valid.size  # b's slots stop counting once b is down
    # From the kill step on, nothing of b's slots is valid; a's slots carry on.
    kill_row = int(np.flatnonzero(~valid[:, b_cols].any(axis=1) & valid[:, :3].any(axis=1))[0])
    assert not valid[kill_row:, b_cols].any()
    assert valid[kill_row:, :3].any()
    assert valid[:kill_row, b_cols].any()
    # The step before the fault is bootstrapped where the episode was still open.
    before = rb.truncated[kill_row - 1, 3:6] | rb.terminated[kill_row - 1, 3:6] | ~rb.valid_mask[kill_row - 1, 3:6]
    assert before.all()
    for name in ("obs", "rewards", "values", "logprobs", "bootstrap_values"):
        assert torch.isfinite(getattr(rb, name)[rb.valid_mask]).all(), name
    # The update on this batch is finite.
    policy = ActorCritic((rb.obs.shape[-1],), action_space, (16,))
    update = PPOLearner(policy, PPOConfig(update_epochs=1, num_minibatches=2), device="cpu").update(rb)
    assert all(np.isfinite(update[k]) for k in ("policy_loss", "value_loss", "grad_norm"))
    # After the restart, b is re-admitted and its slots sample again.
    assert server_b.up and server_b.readmissions == 1 and server_b.faults == 1
    assert batch2["valid_mask"][:, b_cols].any() and stats2.faults == 0


def test_restarted_simulator_is_readmitted_on_the_first_attempt() -> None:
    """Readmission opens a fresh channel; it must not inherit the dead connection's backoff.

    With gRPC's process-wide subchannel pool it did: Describe kept failing with "connection
    refused" for up to a second after the restart, and a broker sampling briefly never
    re-admitted the server.
    """
    sim = start_service("sim", ["sim-server", "--slots", "2", "--port", "0"])
    restarted = None
    try:

        async def go() -> tuple[list[bool], int]:
            nonlocal restarted
            pool = SimulatorPool(PoolTimeouts(step_s=2.0, describe_s=2.0, backoff_initial_s=0.05, backoff_max_s=0.1))
            await pool.add(sim.address)
            server = pool.servers[0]
            sim.kill()
            step = await pool.step(np.arange(2), np.zeros((2, *pool.action_space.shape), np.float32))
            assert step.failed.all() and not server.up
            for _ in range(20):  # readmission attempts while the server is down
                await asyncio.sleep(0.1)
                assert await pool.readmit_due() == []
            restarted = start_service("sim2", ["sim-server", "--slots", "2", "--port", _port(sim.address)])
            await asyncio.sleep(0.1)  # past the backoff
            back = await pool.readmit_due()
            await pool.close()
            return back, server.readmissions

        back, readmissions = asyncio.run(asyncio.wait_for(go(), 60))
        assert len(back) == 1 and readmissions == 1
    finally:
        for service in (sim, restarted):
            if service is not None:
                service.stop()


def test_killed_learner_resumes_from_checkpoint_and_broker_continues(tmp_path) -> None:
    sims = [start_service(f"sim-{i}", ["sim-server", "--slots", "2", "--port", "0"]) for i in range(2)]
    learner_args = [
        "learner",
        "--checkpoint-dir",
        str(tmp_path / "ckpt"),
        "--checkpoint-every",
        "1",
        "--update-epochs",
        "1",
        "--num-minibatches",
        "2",
    ]
    learner = start_service("learner", [*learner_args, "--port", "0"])
    learner2 = None
    broker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fast",
            "broker",
            "--simulators",
            ",".join(s.address for s in sims),
            "--learner",
            learner.address,
            "--mode",
            "fast",
            "--iterations",
            "6",
            "--samples-per-iteration",
            "128",
            "--run-dir",
            str(tmp_path / "run"),
            "--learner-wait-s",
            "60",
            "--port",
            "0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        address = None
        deadline = time.monotonic() + 60
        while address is None and time.monotonic() < deadline:
            line = broker.stdout.readline()
            match = re.search(r"listening on (\S+)", line)
            address = match.group(1) if match else None
        assert address, "broker did not start"
        with open_blocking_channel(address) as channel:
            stub = broker_pb2_grpc.BrokerStub(channel)
            while stub.GetRunStatus(broker_pb2.GetRunStatusRequest(), timeout=5).iteration < 2:
                assert time.monotonic() < deadline and broker.poll() is None
                time.sleep(0.05)
            learner.kill()
            time.sleep(1.0)  # the broker finds the learner gone and waits
            learner2 = start_service("learner2", [*learner_args, "--port", _port(learner.address)])
            resumed_version = int(re.search(r"version=(\d+)", " ".join(learner2.output)).group(1))
            assert resumed_version >= 2
        out, _ = broker.communicate(timeout=120)
        assert broker.returncode == 0, out
    finally:
        if broker.poll() is None:
            broker.kill()
        for service in [*sims, learner, *([learner2] if learner2 else [])]:
            service.stop()
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["iteration"] for m in lines] == [1, 2, 3, 4, 5, 6]
    versions = [m["policy_version"] for m in lines]
    assert (
        versions == sorted(versions) and versions[-1] >= resumed_version
    )  # the version continued, never restarted at 0
    assert all(np.isfinite(m["learner"]["policy_loss"]) for m in lines)


def test_stalled_simulator_times_out_and_is_readmitted_when_it_resumes() -> None:
    import os
    import signal

    sim_args = ["sim-server", "--slots", "2", "--step-latency-s", "0.002", "--port", "0"]
    a, b = start_service("sim-a", sim_args), start_service("sim-b", sim_args)
    try:

        async def go():
            # Stops server b (SIGSTOP) just before its 5th Step: mid-iteration, while its slots act.
            pool = FaultAtStep(
                PoolTimeouts(step_s=0.5, reset_s=1.0, describe_s=0.5, backoff_initial_s=0.1, backoff_max_s=0.3),
                at_step=5,
                fault=lambda: os.kill(b.pid, signal.SIGSTOP),
            )
            await pool.add(a.address)
            await pool.add(b.address)
            runner = PolicyRunner(pool.observation_space, pool.action_space, (16,), seed=0)
            sampler = make_sampler(
                "autoreset",
                pool,
                runner,
                ClipDealer(pool.num_clips, holdout_every=10, seed=0),
                samples_per_iteration=300,
                stall_timeout_s=10,
            )
            started = time.monotonic()
            first = await sampler.sample()
            elapsed = time.monotonic() - started
            os.kill(b.pid, signal.SIGCONT)
            await asyncio.sleep(0.4)
            second = await sampler.sample()
            handle = pool.servers[1]
            await pool.close()
            return first, second, elapsed, handle

        (batch, stats), (batch2, stats2), elapsed, handle = asyncio.run(asyncio.wait_for(go(), 90))
    finally:
        for service in (a, b):
            os.kill(service.pid, signal.SIGCONT)
            service.stop()
    assert stats.faults >= 1 and elapsed < 30  # the stall cost one step deadline, not a hang
    assert not batch["valid_mask"][-1, 2:].any() and batch["valid_mask"][-1, :2].all()
    RolloutBatch.from_numpy({**batch, "policy_version": 0}).validate()
    assert handle.up and handle.readmissions == 1 and handle.faults == 1 and handle.last_error == "timed out"
    assert batch2["valid_mask"][:, 2:].any()


def test_a_reset_slower_than_describe_timeout_gets_the_reset_deadline() -> None:
    # The pool's clients default to Describe's deadline; a Reset must get reset_timeout_s instead, or a
    # simulator whose reset takes longer than describe_timeout_s would be marked down on every reset.
    sim = start_service("sim-slow-reset", ["sim-server", "--slots", "2", "--port", "0", "--reset-fixed-s", "1.5"])
    try:

        async def go():
            pool = SimulatorPool(PoolTimeouts(step_s=5.0, reset_s=10.0, describe_s=0.5))
            await pool.add(sim.address)
            try:
                return await pool.reset(np.arange(2), np.array([0, 1]), np.array([0, 0]), batched=True)
            finally:
                await pool.close()

        reset = asyncio.run(go())
        assert not reset.failed.any() and reset.server_s >= 1.5
    finally:
        sim.stop()
