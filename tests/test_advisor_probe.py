"""The advisor's probe (broker/advisor/probe.py) against the cost model it must read without being
told: real Simulators in-process, each preset's regime at smaller costs."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
from scripted_env import ScriptedLengthEnv

from broker.advisor.lengths import EpisodeLengths
from broker.advisor.probe import LENGTH_STEPS_PER_SLOT, length_probe_slots, probe_lengths, probe_server
from broker.dealer import ClipDealer
from broker.in_process import InProcessPool
from broker.policy_runner import PolicyRunner
from sim_server.cost_model import CostModel, CostModelConfig
from sim_server.simulator import Simulator

# calibrated's regime (one engine, one load channel) at a fifth of its costs, and parallel's and vectorized's.
CALIBRATED = CostModelConfig(
    step_latency_s=0.003, reset_fixed_s=0.015, reset_fixed_exclusive=True, map_load_s=0.03, map_load_shared=True
)
REGIMES = {
    "calibrated": (CALIBRATED, {"reset_exclusive": True, "loads_shared": True, "reset_blocks_steps": False}),
    "parallel": (
        CALIBRATED.model_copy(update={"reset_fixed_exclusive": False, "map_load_shared": False}),
        {"reset_exclusive": False, "loads_shared": False, "reset_blocks_steps": False},
    ),
    "vectorized": (
        CALIBRATED.model_copy(update={"reset_blocks_steps": True}),
        {"reset_exclusive": True, "loads_shared": True, "reset_blocks_steps": True},
    ),
}


def _pool(config: CostModelConfig, lengths=(1000, 1000, 1000, 1000)) -> InProcessPool:
    return InProcessPool([Simulator(ScriptedLengthEnv(list(lengths)), CostModel(config))])


def _near(got: float, want: float) -> bool:
    """A precise wait is never short and hands back late on a loaded machine (2 cores shared, by
    other processes too): medians of a few calls land within a few ms above the configured cost. A
    cost read as a difference of two medians (a map load: a reset with it less one without) can come
    out short by as much: 26 ms for 30 once, in every try of a fresh clone's CI run."""
    return 0.75 * want <= got <= 1.6 * want + 0.004


# The probe times 3 to 60 ms waits in this process; under the suite's 4 workers on 2 cores a wake-up
# can come tens of ms late and one probe misreads a cost. Each check below passes when one of three
# probes reads right: a probe that is wrong every time still fails, a loaded moment does not.
TRIES = 3


def _first_that_holds(check, config, repeats: int):
    errors = []
    for _ in range(TRIES):
        probe = asyncio.run(probe_server(_pool(config), 0, repeats=repeats))
        try:
            check(probe)
            return
        except AssertionError as error:
            errors.append(str(error)[:400])
    pytest.fail(f"{TRIES} probes, none right: " + " | ".join(errors))


@pytest.mark.parametrize("regime", REGIMES)
def test_the_probe_reads_each_regime_of_the_cost_model(regime) -> None:
    config, findings = REGIMES[regime]

    def check(probe) -> None:
        assert probe.findings == {**findings, "prepare_hides_load": True}, probe.figures
        c = probe.costs
        assert _near(c.step_s, config.step_latency_s), c
        assert _near(c.reset_fixed_s, config.reset_fixed_s), c
        assert _near(c.map_load_s, config.map_load_s), c
        assert c.step_per_slot_s < 0.001 and c.reset_per_slot_s < 0.002, c
        assert 0 <= probe.call_s < 0.003
        assert c.prefetch_step_penalty == 0.0, c  # none configured

    _first_that_holds(check, config, repeats=5)


def test_the_probe_measures_what_a_background_load_costs_a_step() -> None:
    # Steps of 12 ms (not 3): a loaded machine's late wake-ups add the same few ms to the steps with
    # and without a load, and over 3 ms steps they halved the ratio read (0.2 for 0.5, twice in a run).
    config = CALIBRATED.model_copy(update={"prefetch_step_penalty": 0.5, "map_load_s": 0.12, "step_latency_s": 0.012})

    def check(probe) -> None:
        assert probe.findings["prepare_hides_load"]
        assert 0.25 <= probe.costs.prefetch_step_penalty <= 0.9, probe.figures.get("step_1_while_loading")

    _first_that_holds(check, config, repeats=3)


class ComputingEnv(ScriptedLengthEnv):
    """An env call that holds the server's thread for a set time, as a CPU-bound engine's compute
    does: `step_s` in each Step, `reset_s` in each Reset. It sleeps rather than spins: the server
    times its env's call on the wall clock, and a spin preempted on a loaded machine (the suite's
    workers on 2 cores) ends late, 2 ms of it read as up to 6 (a share of 0.59 for 0.2, in a CI run)."""

    def __init__(self, step_s: float, reset_s: float) -> None:
        super().__init__([1000] * 4)
        self.step_s, self.reset_s = step_s, reset_s

    def reset(self, slot_ids, clip_ids, seeds) -> np.ndarray:
        time.sleep(self.reset_s)
        return super().reset(slot_ids, clip_ids, seeds)

    def step(self, slot_ids, actions):
        time.sleep(self.step_s)
        return super().step(slot_ids, actions)


@pytest.mark.parametrize(
    "config, step_share, reset_share",
    [
        (CostModelConfig(), 1.0, 1.0),  # compute is the whole cost (`off`)
        (CostModelConfig(step_latency_s=0.020, reset_fixed_s=0.024), 0.2, 0.25),  # the rest an emulated wait
    ],
)
def test_the_probe_reads_the_share_of_a_call_that_is_the_servers_compute(config, step_share, reset_share) -> None:
    """4 ms of compute a Step and 8 ms a Reset: all of their time without emulated costs; a fifth of a
    20 ms step latency, and 8 of a Reset's 32 ms (the emulated fixed part comes on top of it)."""
    errors = []
    for _ in range(TRIES):
        pool = InProcessPool([Simulator(ComputingEnv(0.004, 0.008), CostModel(config))])
        c = asyncio.run(probe_server(pool, 0, repeats=3)).costs
        if abs(c.step_compute_share - step_share) <= 0.08 and abs(c.reset_compute_share - reset_share) <= 0.12:
            return
        errors.append(f"step {c.step_compute_share:.2f}, reset {c.reset_compute_share:.2f}")
    pytest.fail(f"{TRIES} probes, none right (want step {step_share}, reset {reset_share}): " + " | ".join(errors))


@pytest.mark.parametrize("prefetch", [False, True])  # prefetched: the same sample, autoreset's rows unchanged
def test_probe_lengths_counts_running_episodes_as_cut(prefetch) -> None:
    async def go():
        pool = InProcessPool([Simulator(ScriptedLengthEnv([5, 10, 20, 400]), CostModel(CostModelConfig()))])
        runner = PolicyRunner(pool.observation_space, pool.action_space, (8,), seed=0)
        dealer = ClipDealer(50, holdout_every=0, seed=0)
        return await probe_lengths(pool, runner, dealer, samples=200, prefetch=prefetch)

    # 50 rows of 4 slots: slot 0 ends 10 episodes of 5, slot 1 five of 10, slot 2 two of 20 and runs
    # its third (10 steps so far), slot 3 runs its first (50 steps so far).
    lengths = [5] * 10 + [10] * 5 + [20] * 2 + [10, 50]
    censored = [False] * 17 + [True, True]
    want = EpisodeLengths.from_sample(lengths, censored)
    got = asyncio.run(go())
    np.testing.assert_array_equal(got.values, want.values)
    np.testing.assert_allclose(got.probabilities, want.probabilities)


def test_the_length_probe_takes_few_enough_slots_that_theirs_run_long() -> None:
    """LENGTH_STEPS_PER_SLOT steps a slot at least, slots evenly spaced (both servers keep some)."""
    thirty = np.arange(30)  # spread_slots' order: server 0's 0-14, server 1's 15-29
    assert length_probe_slots(thirty, 2000).tolist() == [0, 10, 19, 29]
    assert length_probe_slots(thirty, 100).tolist() == [0]
    assert length_probe_slots(thirty, 10**6).tolist() == list(range(30))
    assert length_probe_slots(np.array([7]), 2000).tolist() == [7]
    for samples in (500, 1999, 4000, 7000):
        chosen = length_probe_slots(thirty, samples)
        assert chosen.size == max(1, samples // LENGTH_STEPS_PER_SLOT) and np.unique(chosen).size == chosen.size
