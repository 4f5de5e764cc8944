"""Pipelined rounds on real simulator server processes: the same batches as the classic lock-step.

With `pipeline` on (broker/samplers/rounds.py), a server that has answered steps its slots on
while the others are still stepping, whenever the round cannot end at the current row whatever
they answer. Servers of different step latencies make the rows interleave; a deterministic
simulator, the same seeds and each server's own noise stream make every decision the same, so
SMPO's batch is the same array for array (padding, masks, truncations and bootstrap values
included), for DPSA and for SGR, with and without prefetch.
"""

from __future__ import annotations

import asyncio
from contextlib import ExitStack

import numpy as np
import pytest
from conftest import sim_server

from broker.dealer import ClipDealer
from broker.policy_runner import PolicyRunner
from broker.pool import SimulatorPool
from broker.samplers import make_sampler

# Three servers at three speeds: the fast ones answer first and step on.
LATENCIES = ("0.0005", "0.002", "0.004")


async def _sample(addresses: list[str], *, mode: str, pipeline: bool, prefetch: bool = False, alpha: float = 0.5):
    pool = SimulatorPool()
    try:
        for address in addresses:
            await pool.add(address)
        runner = PolicyRunner(pool.observation_space, pool.action_space, (16,), seed=3)
        dealer = ClipDealer(pool.num_clips, holdout_every=10, seed=5)
        sampler = make_sampler(
            mode, pool, runner, dealer, samples_per_iteration=400, alpha=alpha, t_max=60, prefetch=prefetch,
            pipeline=pipeline,
        )  # fmt: skip
        out = [await sampler.sample() for _ in range(3)]
        return [batch for batch, _ in out], [stats for _, stats in out]
    finally:
        await pool.close()


def _same_batches(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for key in x:
            np.testing.assert_array_equal(x[key], y[key], err_msg=key)


@pytest.mark.timeout(240)
def test_pipelined_rounds_sample_the_same_batches_as_lockstep() -> None:
    with ExitStack() as stack:
        servers = [
            stack.enter_context(sim_server("--slots", "3", "--cost-preset", "step-only", "--step-latency-s", latency))
            for latency in LATENCIES
        ]
        addresses = [s.address for s in servers]
        for mode, prefetch, alpha in (("fast", False, 0.5), ("fast", True, 0.8), ("sgr", False, 1.0)):
            plain, plain_stats = asyncio.run(
                _sample(addresses, mode=mode, pipeline=False, prefetch=prefetch, alpha=alpha)
            )
            piped, piped_stats = asyncio.run(
                _sample(addresses, mode=mode, pipeline=True, prefetch=prefetch, alpha=alpha)
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
