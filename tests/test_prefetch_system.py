"""FAST with prefetch on real simulator server processes: the same batches as without it.

Prefetch deals a round's next clips at the start of the round before (the order plain FAST
deals them in at the round's own start) and has the servers load them while the round steps;
with every server up, a run plays the same clips with the same seeds and the same actions, so
SMPO's batch is the same array for array, padding and masks included. A server without Prepare
(`--no-prefetch`) in the same pool is reset as always.
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

COSTS = ("--cost-preset", "calibrated", "--map-load-s", "0.004", "--reset-fixed-s", "0.001")


async def sample_three(
    addresses: list[str],
    *,
    prefetch: bool,
    mode: str = "fast",
    alpha: float = 0.5,
    use_local_step: bool = True,
    **settings,
) -> tuple[list, list, SimulatorPool]:
    """Three iterations of `mode` on the servers at `addresses` (batches, stats, the pool, closed);
    `settings` go to make_sampler."""
    pool = SimulatorPool(use_local_step=use_local_step)
    try:
        for address in addresses:
            await pool.add(address)
        runner = PolicyRunner(pool.observation_space, pool.action_space, (16,), seed=3)
        dealer = ClipDealer(pool.num_clips, holdout_every=10, seed=5)
        sampler = make_sampler(
            mode, pool, runner, dealer, samples_per_iteration=400, alpha=alpha, t_max=60, prefetch=prefetch,
            **settings,
        )  # fmt: skip
        out = [await sampler.sample() for _ in range(3)]
        return [batch for batch, _ in out], [stats for _, stats in out], pool
    finally:
        await pool.close()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_fast_with_prefetch_samples_the_same_batches_as_without() -> None:
    with ExitStack() as stack:
        servers = [stack.enter_context(sim_server("--slots", "3", *COSTS)) for _ in range(2)]
        servers.append(stack.enter_context(sim_server("--slots", "2", "--no-prefetch", *COSTS)))
        addresses = [s.address for s in servers]
        # With `reset` every round deals all its slots' clips in one order, with or without prefetch;
        # with `carry` (tests/test_carry.py) the slots that end first take the clips dealt ahead for them.
        plain, plain_stats, plain_pool = asyncio.run(sample_three(addresses, prefetch=False, truncation="reset"))
        ahead, ahead_stats, ahead_pool = asyncio.run(sample_three(addresses, prefetch=True, truncation="reset"))

    for a, b in zip(plain, ahead):
        assert a.keys() == b.keys()
        for key in a:
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)
    assert [s.valid for s in plain_stats] == [s.valid for s in ahead_stats]
    assert [s.episode_lengths for s in plain_stats] == [s.episode_lengths for s in ahead_stats]
    # The prefetch run reset most slots from a preparation; only the two servers with Prepare were asked.
    assert plain_pool.counters.prepared == plain_pool.counters.prepare_calls == 0
    assert ahead_pool.counters.prepared > 0 and ahead_pool.counters.prepare_calls > 0
    assert ahead_pool.counters.prepared <= ahead_pool.counters.reset_slots * 6 / 8
    assert [s.prefetch for s in ahead_pool.servers] == [True, True, False]
