"""Sampling semantics of every mode, exact, against scripted episode lengths.

The scripted env runs in a real `Simulator`. The semantics tests reach it through the broker's
in-process pool (broker/in_process.py): sockets add nothing to what a mode decides. Every mode
is also sampled over real gRPC (a gRPC server on a loopback port in this process, the broker's
SimulatorPool), and its batches must be those of the in-process pool: the seam of
broker/slots.py changes nothing a sampler sees.
"""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager

import numpy as np
import pytest
import torch
from scripted_env import ScriptedLengthEnv

from broker.dealer import ClipDealer, holdout_clips
from broker.in_process import InProcessPool
from broker.policy_runner import PolicyRunner
from broker.pool import SimulatorPool
from broker.recorder import RolloutRecorder
from broker.samplers import MODE_NAMES, make_sampler
from broker.samplers.fast import Dpsa, round_ends, termination_rate
from broker.samplers.sgr import SynchronousGlobalReset
from broker.slots import PoolTimeouts
from learner.batch import RolloutBatch
from learner.gae import masked_gae
from sim_server.cost_model import CostModel, CostModelConfig
from sim_server.server import create_server
from sim_server.simulator import Simulator


@asynccontextmanager
async def scripted_pool(*envs: ScriptedLengthEnv, timeouts: PoolTimeouts | None = None):
    """The scripted envs in-process, one Simulator each, and a runner for their spaces."""
    pool = InProcessPool([Simulator(env, CostModel(CostModelConfig())) for env in envs], timeouts)
    yield pool, PolicyRunner(pool.observation_space, pool.action_space, (8,), seed=0)
    await pool.close()


@asynccontextmanager
async def grpc_scripted_pool(*envs: ScriptedLengthEnv):
    """The scripted envs each behind a real gRPC server in this process, through the SimulatorPool."""
    servers = []
    pool = SimulatorPool()
    try:
        for env in envs:
            server, port, _ = await create_server(
                Simulator(env, CostModel(CostModelConfig())), "127.0.0.1:0", env_id="scripted"
            )
            servers.append(server)
            await pool.add(f"127.0.0.1:{port}")
        runner = PolicyRunner(pool.observation_space, pool.action_space, (8,), seed=0)
        yield pool, runner
    finally:
        await pool.close()
        for server in servers:
            await server.stop(None)


def _sample(sampler):
    return sampler.sample()


def _check_batch(batch: dict) -> RolloutBatch:
    rb = RolloutBatch.from_numpy({**batch, "policy_version": 0})
    rb.validate()
    adv, ret = masked_gae(
        rb.rewards, rb.values, rb.terminated, rb.truncated, rb.bootstrap_values, rb.valid_mask, 0.99, 0.95
    )
    assert torch.isfinite(adv).all() and torch.isfinite(ret).all()
    return rb


# --- pure rules -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "done, steps, alpha, t_max, expected",
    [
        ([1, 0, 0, 0], 3, 0.5, 100, False),  # tau 0.25 < 0.5
        ([1, 1, 0, 0], 3, 0.5, 100, True),  # tau reaches alpha exactly
        ([1, 1, 1, 0], 3, 0.5, 100, True),
        ([0, 0, 0, 0], 99, 0.5, 100, False),
        ([0, 0, 0, 0], 100, 0.5, 100, True),  # t reaches t_max
        ([1, 1, 1, 0], 5, 1.0, 100, False),  # alpha 1: wait for all
        ([1, 1, 1, 1], 5, 1.0, 100, True),
    ],
)
def test_round_ends_exactly_at_alpha_or_t_max(done, steps, alpha, t_max, expected) -> None:
    assert round_ends(np.array(done, bool), steps, alpha, t_max) is expected
    assert termination_rate(np.array(done, bool)) == sum(done) / len(done)
    rule, live, nothing = Dpsa(alpha, t_max), np.ones(len(done), bool), np.zeros(0, np.int64)
    assert rule.round_over(ended=nothing, live=live, done=np.array(done, bool), steps=steps) is expected


def test_round_rules_of_sgr_and_fast_when_nothing_or_no_one_is_left() -> None:
    sgr, nothing = SynchronousGlobalReset(), np.zeros(0, np.int64)
    assert sgr.round_over(ended=np.array([2]), live=np.ones(3, bool), done=np.zeros(3, bool), steps=1)
    assert not sgr.round_over(ended=nothing, live=np.ones(3, bool), done=np.zeros(3, bool), steps=1)
    assert sgr.round_over(ended=nothing, live=np.zeros(3, bool), done=np.ones(3, bool), steps=1)  # all failed
    # A round whose every reset failed has no members: it is over at once.
    assert Dpsa(0.5, 100).round_over(ended=nothing, live=np.zeros(3, bool), done=np.zeros(0, bool), steps=1)


def test_registry_lists_every_mode_once_and_refuses_others() -> None:
    assert MODE_NAMES == ("sc", "autoreset", "sgr", "ver", "fast")
    with pytest.raises(ValueError, match="mode 'async' is unknown; use one of sc, autoreset, sgr, ver, fast"):
        make_sampler("async", None, None, None, samples_per_iteration=1)


def test_dealer_visits_every_training_clip_and_never_holdout() -> None:
    dealer = ClipDealer(30, holdout_every=10, seed=3)
    held = set(holdout_clips(30, 10).tolist())
    assert held == {9, 19, 29}
    first_pass, seeds = dealer.deal(27)
    assert sorted(first_pass.tolist()) == sorted(set(range(30)) - held)
    assert len(set(seeds.tolist())) == 27
    again = ClipDealer(30, holdout_every=10, seed=3).deal(27)[0]
    np.testing.assert_array_equal(first_pass, again)
    assert not set(dealer.deal(100)[0].tolist()) & held
    with pytest.raises(ValueError, match="holdout_every=1 leaves no training clip"):
        ClipDealer(5, holdout_every=1, seed=0)


def test_recorder_bootstraps_in_one_pass_and_pads_with_zeros() -> None:
    rec = RolloutRecorder(3, (2,), np.float32, (1,), np.float32)
    acting = np.array([True, False, True])
    row = rec.add_row(acting, np.ones((2, 2)), np.zeros((2, 1)), np.zeros(2), np.full(2, 0.5))
    rec.set_outcome(row, np.array([0, 2]), np.array([1.0, 2.0]), np.array([True, False]))
    rec.truncate(row, 2, next_obs=np.array([3.0, 4.0]))
    calls = []
    batch = rec.build(lambda obs: calls.append(obs.copy()) or obs.sum(axis=1))
    assert len(calls) == 1 and batch["bootstrap_values"][0, 2] == 7.0
    assert batch["valid_mask"].tolist() == [[True, False, True]]
    assert batch["obs"][0, 1].tolist() == [0.0, 0.0] and batch["truncated"][0].tolist() == [False, False, True]


# --- modes, in-process -------------------------------------------------------------------------


@pytest.mark.parametrize("truncation", ["carry", "reset"])
def test_fast_pads_ended_slots_and_truncates_at_alpha(truncation) -> None:
    async def go():
        env = ScriptedLengthEnv([2, 5, 9, 20])
        async with scripted_pool(env) as (pool, runner):
            sampler = make_sampler(
                "fast",
                pool,
                runner,
                ClipDealer(50, holdout_every=0, seed=0),
                samples_per_iteration=1,
                alpha=0.5,
                t_max=100,
                truncation=truncation,
            )
            batch, stats = await sampler.sample()
            return env, batch, stats

    env, batch, stats = asyncio.run(go())
    rb = _check_batch(batch)
    # Slot 0 ends at step 2, slot 1 at step 5: tau = 2/4 = alpha at step 5 -> one round of 5 rows.
    assert rb.valid_mask.shape == (5, 4)
    assert rb.valid_mask[:, 0].tolist() == [True, True, False, False, False]  # padded after termination
    assert rb.valid_mask[:, 1:].all()
    assert rb.terminated[1, 0] and rb.terminated[4, 1]
    assert rb.truncated[4, 2] and rb.truncated[4, 3] and not rb.terminated[4, 2:].any()  # alive: truncated
    assert (rb.obs[2:, 0] == 0).all()  # virtual steps carry zeros
    assert env.reset_calls == [[0, 1, 2, 3]]  # one batched reset per server per round
    s = stats.summary()
    assert s["transitions"] == 20 and s["valid_transitions"] == 17 and s["global_resets"] == 1
    if truncation == "reset":  # the live episodes are cut at the round's end, at 5 steps
        assert s["episode_ends"] == {"terminated": 2, "cut": 2} and sorted(s["episode_lengths"]) == [2, 5, 5, 5]
    else:  # carried on: only the episodes that ended are over
        assert s["episode_ends"] == {"terminated": 2} and sorted(s["episode_lengths"]) == [2, 5]


@pytest.mark.parametrize("truncation", ["carry", "reset"])
def test_fast_truncates_at_t_max_and_concatenates_rounds(truncation) -> None:
    async def go():
        env = ScriptedLengthEnv([50, 60, 70, 80])
        async with scripted_pool(env) as (pool, runner):
            sampler = make_sampler(
                "fast",
                pool,
                runner,
                ClipDealer(50, holdout_every=0, seed=0),
                samples_per_iteration=20,
                alpha=0.5,
                t_max=3,
                truncation=truncation,
            )
            return env, *(await sampler.sample())

    env, batch, stats = asyncio.run(go())
    rb = _check_batch(batch)
    assert rb.valid_mask.shape == (6, 4) and rb.valid_mask.all()  # two rounds of t_max = 3
    assert rb.truncated[2].all() and rb.truncated[5].all() and not rb.truncated[[0, 1, 3, 4]].any()
    steps_taken = rb.obs[:, :, 0]  # the scripted observation's first entry
    if truncation == "reset":
        assert env.reset_calls == [[0, 1, 2, 3], [0, 1, 2, 3]] and stats.global_resets == 2
        assert (steps_taken[3] == 0).all()  # the second round starts every episode over
    else:  # t_max bounds the round, not the episode: the second round goes on from step 3
        assert env.reset_calls == [[0, 1, 2, 3]] and stats.global_resets == 1
        assert (steps_taken[3] == 3).all() and (steps_taken[5] == 5).all()


def test_sgr_resets_every_slot_on_first_termination() -> None:
    async def go():
        env = ScriptedLengthEnv([3, 7, 9, 20])
        async with scripted_pool(env) as (pool, runner):
            sampler = make_sampler(
                "sgr", pool, runner, ClipDealer(50, holdout_every=0, seed=0), samples_per_iteration=20
            )
            return env, *(await sampler.sample())

    env, batch, stats = asyncio.run(go())
    rb = _check_batch(batch)
    assert rb.valid_mask.shape == (6, 4) and rb.valid_mask.all()  # rounds of min length 3, no padding
    assert rb.terminated[2, 0] and rb.terminated[5, 0]
    assert rb.truncated[2, 1:].all() and rb.truncated[5, 1:].all()
    assert env.reset_calls == [[0, 1, 2, 3]] * 2 and stats.summary()["episode_length_mean"] == 3.0


def test_autoreset_resets_ended_slot_alone_within_the_step() -> None:
    async def go():
        env = ScriptedLengthEnv([2, 100, 100], truncating=(0,))
        async with scripted_pool(env) as (pool, runner):
            sampler = make_sampler(
                "autoreset", pool, runner, ClipDealer(50, holdout_every=0, seed=0), samples_per_iteration=15
            )
            first = await sampler.sample()
            resets_in_first = list(env.reset_calls)
            second = await sampler.sample()
            return resets_in_first, first, second

    reset_calls, (batch, stats), (batch2, _) = asyncio.run(go())
    rb = _check_batch(batch)
    assert rb.valid_mask.shape == (5, 3) and rb.valid_mask.all()
    assert rb.truncated[[1, 3], 0].all()  # slot 0's clip ends every 2 steps: truncated, bootstrapped
    assert rb.truncated[4].all()  # the rollout boundary bootstraps every live episode
    assert reset_calls == [[0], [1], [2], [0], [0]]  # initial resets, then slot 0 on its own
    assert stats.global_resets == 0 and stats.slot_resets == 5
    # Live episodes carry over: the next iteration starts where the last stopped (obs[0] = steps taken).
    assert _check_batch(batch2).obs[0, 1, 0].item() == 5.0


def test_sc_uses_one_slot() -> None:
    async def go():
        env = ScriptedLengthEnv([4, 4])
        async with scripted_pool(env) as (pool, runner):
            sampler = make_sampler("sc", pool, runner, ClipDealer(50, holdout_every=0, seed=0), samples_per_iteration=9)
            return env, *(await sampler.sample())

    env, batch, _ = asyncio.run(go())
    rb = _check_batch(batch)
    assert rb.valid_mask.shape == (9, 1) and all(call == [0] for call in env.reset_calls)


def test_ver_steps_the_ready_slots_of_a_server_in_one_call() -> None:
    async def go(step_batching: bool):
        envs = ScriptedLengthEnv([30, 30, 30]), ScriptedLengthEnv([30, 30, 30])
        async with scripted_pool(*envs) as (pool, runner):
            dealer = ClipDealer(50, holdout_every=0, seed=0)
            sampler = make_sampler(
                "ver", pool, runner, dealer, samples_per_iteration=120, ver_step_batching=step_batching
            )
            batch, stats = await sampler.sample()
            c = pool.counters
            # The servers' own compute is counted apart, within their time (broker_overhead's floor uses it).
            assert 0 < c.step_compute_s <= c.step_server_s
            return batch, stats, c.step_calls

    batched, stats, calls = asyncio.run(go(True))
    _check_batch(batched)
    assert stats.valid == 120
    # Six slots on two servers, all ready together after each batched forward pass: a call per
    # server per step of its slots, not a call per slot-step.
    assert calls <= 0.75 * 120, calls
    per_slot, per_slot_stats, per_slot_calls = asyncio.run(go(False))
    _check_batch(per_slot)
    assert per_slot_calls == per_slot_stats.valid == 120


def test_ver_steps_a_servers_live_slots_together_from_an_iterations_first_step() -> None:
    """Live episodes carried into an iteration: its first call already waits for every slot of the
    server, so 3 slots x 10 steps take 10 calls (the first slot used to step alone, and the split
    could last)."""

    async def go():
        env = ScriptedLengthEnv([100, 100, 100])
        async with scripted_pool(env) as (pool, runner):
            sampler = make_sampler(
                "ver", pool, runner, ClipDealer(50, holdout_every=0, seed=0), samples_per_iteration=30
            )
            await sampler.sample()  # the first: every slot resets, each on its own, and steps from then
            before = pool.counters.step_calls
            _, stats = await sampler.sample()
            return pool.counters.step_calls - before, stats

    calls, stats = asyncio.run(go())
    assert stats.valid == 30 and stats.slot_resets == 0
    assert calls == 10


def test_ver_fills_budget_unevenly_without_padding() -> None:
    async def go():
        env = ScriptedLengthEnv([2, 30, 30])
        async with scripted_pool(env) as (pool, runner):
            sampler = make_sampler(
                "ver", pool, runner, ClipDealer(50, holdout_every=0, seed=0), samples_per_iteration=40
            )
            return env, *(await sampler.sample())

    env, batch, stats = asyncio.run(go())
    rb = _check_batch(batch)
    assert rb.valid_mask.shape == (40, 1) and rb.valid_mask.all()  # exactly the budget, one column
    s = stats.summary()
    assert s["validity"] == 1.0 and s["global_resets"] == 0
    assert all(len(call) == 1 for call in env.reset_calls)  # every reset is a slot's own
    assert s["episode_ends"].get("terminated", 0) >= 4  # slot 0 finished several short episodes
    # Each segment ends terminated or truncated, so GAE never crosses from one slot to another.
    ends = (rb.terminated | rb.truncated)[:, 0]
    assert ends[-1] and ends.sum() >= 6


# --- every mode over real gRPC: the batches of the in-process pool -------------------------------


@pytest.mark.parametrize("mode", MODE_NAMES)
def test_every_mode_samples_over_grpc_as_over_the_in_process_pool(mode) -> None:
    async def go(pool_of):
        envs = ScriptedLengthEnv([3, 7, 12], truncating=(1,)), ScriptedLengthEnv([5, 9, 4])
        async with pool_of(*envs) as (pool, runner):
            dealer = ClipDealer(50, holdout_every=0, seed=0)
            sampler = make_sampler(mode, pool, runner, dealer, samples_per_iteration=30, alpha=0.5, t_max=8)
            out = [await sampler.sample() for _ in range(2)]
            return out, [env.reset_calls for env in envs]

    over_grpc, grpc_resets = asyncio.run(go(grpc_scripted_pool))
    in_process, resets = asyncio.run(go(scripted_pool))
    for (a, a_stats), (b, b_stats) in zip(over_grpc, in_process):
        _check_batch(a)
        _check_batch(b)
        assert a_stats.valid == b_stats.valid >= 30 and a_stats.faults == b_stats.faults == 0
        if mode == "ver":  # every slot runs on its own: which slot takes which step is a matter of timing
            continue
        assert a.keys() == b.keys()
        for key in a:
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)
        assert (a_stats.episode_lengths, a_stats.episode_returns) == (b_stats.episode_lengths, b_stats.episode_returns)
        assert (a_stats.transitions, a_stats.global_resets, a_stats.reset_calls) == (
            b_stats.transitions,
            b_stats.global_resets,
            b_stats.reset_calls,
        )
    if mode != "ver":  # the same slots reset (a server's concurrent one-slot Resets may arrive in any order)
        assert [sorted(calls) for calls in grpc_resets] == [sorted(calls) for calls in resets]


# --- the in-process pool's faults ---------------------------------------------------------------


class FailingEnv(ScriptedLengthEnv):
    """Raises at its `fail_at`-th step call; answers a NaN reward from its `nan_from`-th on."""

    def __init__(self, lengths, *, fail_at: int = 0, nan_from: int = 0) -> None:
        super().__init__(lengths)
        self.calls, self.fail_at, self.nan_from = 0, fail_at, nan_from

    def step(self, slot_ids, actions):
        self.calls += 1
        if self.calls == self.fail_at:
            raise RuntimeError("the engine crashed")
        result = super().step(slot_ids, actions)
        if self.nan_from and self.calls >= self.nan_from:
            result.rewards[:] = np.nan
        return result


def test_in_process_pool_fails_the_slots_of_an_env_that_raises_and_readmits_it() -> None:
    async def go():
        envs = ScriptedLengthEnv([50, 50]), FailingEnv([50, 50], fail_at=3)
        async with scripted_pool(*envs, timeouts=PoolTimeouts(backoff_initial_s=0.0)) as (pool, runner):
            sampler = make_sampler(
                "fast", pool, runner, ClipDealer(50, holdout_every=0, seed=0), samples_per_iteration=40, t_max=5
            )
            batch, stats = await sampler.sample()
            return pool, envs, batch, stats

    pool, envs, batch, stats = asyncio.run(go())
    _check_batch(batch)
    # Its two slots failed at the third row: padding there, their second step truncated and bootstrapped.
    assert stats.faults == 2 and stats.episode_ends["fault"] == 2
    assert not batch["valid_mask"][2, 2:].any() and batch["valid_mask"][2, :2].all()
    assert batch["truncated"][1, 2:].all()
    server = pool.servers[1]
    assert server.faults == 1 and server.readmissions == 1 and server.up
    assert server.last_error == "RuntimeError: the engine crashed"
    assert envs[1].reset_calls[-1] == [0, 1]  # re-admitted at the next round's start and reset there
    assert batch["valid_mask"][5:, 2:].any()  # and its slots sampled again


def test_in_process_pool_drops_a_server_that_keeps_answering_badly() -> None:
    async def go():
        envs = ScriptedLengthEnv([50, 50]), FailingEnv([50, 50], nan_from=2)
        timeouts = PoolTimeouts(backoff_initial_s=0.0)
        async with scripted_pool(*envs, timeouts=timeouts) as (pool, runner):
            sampler = make_sampler(
                "autoreset", pool, runner, ClipDealer(50, holdout_every=0, seed=0), samples_per_iteration=60
            )
            batch, stats = await sampler.sample()
            return pool, batch, stats

    pool, batch, stats = asyncio.run(go())
    _check_batch(batch)
    server = pool.servers[1]
    assert server.dropped and not server.up and server.faults == pool.max_bad_answers
    assert "rewards: slot 0 has reward nan" in server.last_error
    assert np.isfinite(batch["rewards"]).all()  # nothing of a bad answer reached the batch
    assert stats.valid >= 60 and batch["valid_mask"][-10:, 2:].sum() == 0  # the other server filled the batch
