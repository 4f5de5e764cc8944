"""Pipelined rounds on real simulator server processes: the same batches as the classic lock-step.

That holds where a round's end resets every slot (sgr, fast's `reset` truncation), as here: a
step past the end is then thrown away. With `carry` it is kept (tests/test_carry.py).

With `pipeline` on (broker/samplers/rounds.py), a server that has answered steps its slots on
while the others are still stepping, whenever the round cannot end at the current row whatever
they answer. Servers of different step latencies make the rows interleave; a deterministic
simulator, the same seeds and each server's own noise stream make every decision the same, so
SMPO's batch is the same array for array (padding, masks, truncations and bootstrap values
included), for DPSA and for SGR, with and without prefetch.
"""

from __future__ import annotations

import asyncio
from contextlib import ExitStack, asynccontextmanager

import numpy as np
import pytest
from conftest import sim_server
from scripted_env import ScriptedLengthEnv
from test_prefetch_system import sample_three

from broker.dealer import ClipDealer
from broker.in_process import InProcessPool
from broker.policy_runner import PolicyRunner
from broker.samplers import make_sampler, rounds
from sim_server.cost_model import CostModel, CostModelConfig
from sim_server.simulator import Simulator

# Three servers at three speeds: the fast ones answer first and step on.
LATENCIES = ("0.0005", "0.002", "0.004")


def _same_batches(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for key in x:
            np.testing.assert_array_equal(x[key], y[key], err_msg=key)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_pipelined_rounds_sample_the_same_batches_as_lockstep() -> None:
    with ExitStack() as stack:
        servers = [
            stack.enter_context(sim_server("--slots", "3", "--cost-preset", "step-only", "--step-latency-s", latency))
            for latency in LATENCIES
        ]
        addresses = [s.address for s in servers]
        for mode, prefetch, alpha in (("fast", False, 0.5), ("fast", True, 0.8), ("sgr", False, 1.0)):
            plain, plain_stats, _ = asyncio.run(
                sample_three(addresses, mode=mode, pipeline=False, prefetch=prefetch, alpha=alpha, truncation="reset")
            )
            piped, piped_stats, _ = asyncio.run(
                sample_three(addresses, mode=mode, pipeline=True, prefetch=prefetch, alpha=alpha, truncation="reset")
            )
            _same_batches(plain, piped)
            for p, q in zip(plain_stats, piped_stats):
                assert (p.valid, p.transitions, p.global_resets) == (q.valid, q.transitions, q.global_resets)
                assert sorted(p.episode_lengths) == sorted(q.episode_lengths)
                assert p.episode_ends == q.episode_ends
                assert p.steps_ahead == p.steps_discarded == 0
            # Servers did step ahead of the row being judged, and some of those steps were thrown away
            # (the round ended at the row before): the batches above are the same all the same.
            assert sum(q.steps_ahead for q in piped_stats) > sum(q.steps_discarded for q in piped_stats) > 0


@pytest.mark.timeout(120)
def test_one_server_runs_its_rounds_unpipelined(monkeypatch) -> None:
    """Nothing to overlap with a single server: pipelined, its rounds take the plain lock-step path
    (no task per call, no speculation's bookkeeping), and the batches are the same."""
    plain_rounds = []
    lockstep_round = rounds.Rounds._lockstep

    async def counted(self, *args):
        plain_rounds.append(1)
        return await lockstep_round(self, *args)

    monkeypatch.setattr(rounds.Rounds, "_lockstep", counted)
    with sim_server("--slots", "4", "--cost-preset", "step-only", "--step-latency-s", "0.0005") as server:
        plain, _, _ = asyncio.run(sample_three([server.address], pipeline=False, prefetch=False, truncation="reset"))
        unpiped_rounds = len(plain_rounds)
        piped, stats, _ = asyncio.run(sample_three([server.address], pipeline=True, prefetch=False, truncation="reset"))
    _same_batches(plain, piped)
    assert all(s.steps_ahead == s.steps_discarded == 0 for s in stats)
    assert unpiped_rounds > 0 and len(plain_rounds) == 2 * unpiped_rounds


@asynccontextmanager
async def _scripted_servers(*envs_and_latencies):
    """Scripted envs (tests/scripted_env.py), each in a Simulator with its own step latency, in-process
    (broker/in_process.py): what the rows' interleaving depends on is the latencies, not the sockets."""
    pool = InProcessPool(
        [Simulator(env, CostModel(CostModelConfig(step_latency_s=latency))) for env, latency in envs_and_latencies]
    )
    yield pool
    await pool.close()


@pytest.mark.parametrize("pipeline", [False, True])
@pytest.mark.parametrize(
    "lengths_a, lengths_b, terminated, discarded",
    [
        # A's two slots end at step 3, with nothing else: 2 of 4 done, the round ends at row 2. Pipelined,
        # A's row-2 answer (its two endings) arrives while row 1 is not judged yet: it waits.
        ([3, 3], [10, 10], [True, True, False, False], 0),
        # One slot of each ends at step 3: the round ends at row 2. Pipelined, A has stepped its live
        # slot's row 3 by then: that step is thrown away.
        ([3, 10], [3, 10], [True, False, True, False], 1),
    ],
)
@pytest.mark.timeout(60)
def test_a_fast_server_waits_for_the_row_before_and_its_steps_past_the_end_are_thrown_away(
    pipeline, lengths_a, lengths_b, terminated, discarded
) -> None:
    """Server A answers at once, server B after 30 ms; DPSA, alpha 0.5, one round."""

    async def go():
        a, b = ScriptedLengthEnv(lengths_a), ScriptedLengthEnv(lengths_b)
        async with _scripted_servers((a, 0.0), (b, 0.03)) as pool:
            runner = PolicyRunner(pool.observation_space, pool.action_space, (8,), seed=0)
            dealer = ClipDealer(50, holdout_every=0, seed=0)
            sampler = make_sampler(
                "fast", pool, runner, dealer, samples_per_iteration=1, alpha=0.5, t_max=100, pipeline=pipeline,
                truncation="reset",
            )  # fmt: skip
            return await sampler.sample()

    batch, stats = asyncio.run(go())
    assert batch["valid_mask"].shape == (3, 4) and batch["valid_mask"].all()  # nothing of a row past the end
    assert batch["terminated"][2].tolist() == terminated
    assert batch["truncated"][2].tolist() == [not t for t in terminated]  # the live slots cut at the end
    assert not batch["terminated"][:2].any() and not batch["truncated"][:2].any()
    assert stats.valid == stats.transitions == 12 and sorted(stats.episode_lengths) == [3, 3, 3, 3]
    if pipeline:
        assert stats.steps_ahead >= 2 and stats.steps_discarded == discarded
    else:
        assert stats.steps_ahead == stats.steps_discarded == 0
