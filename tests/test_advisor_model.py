"""The advisor's model (broker/advisor/): cases whose answer is known by hand, the Kaplan-Meier
estimate, and the model against the real cost model driven by the broker's real samplers.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time

import numpy as np
import pytest

from broker.advisor.lengths import EpisodeLengths
from broker.advisor.model import (
    Catalog,
    Horizon,
    ModeSettings,
    SimulatorCosts,
    Workload,
    _SlotEpisodes,
    best_alpha,
    predict,
    rank,
    standard_modes,
)
from broker.dealer import ClipDealer
from broker.in_process import InProcessPool
from broker.policy_runner import PolicyRunner
from broker.samplers import make_sampler
from fast.spaces import SpaceSpec
from sim_server.cost_model import CostModel, CostModelConfig
from sim_server.env_api import StepResult
from sim_server.simulator import Simulator

LOCKSTEP = [
    ModeSettings("autoreset"),
    ModeSettings("sgr"),
    ModeSettings("fast", truncation="carry"),
    ModeSettings("fast", truncation="reset"),
]


def _figures(p) -> dict:
    return {k: v for k, v in p.as_dict().items() if k not in ("label", "settings")}


# --- the episode-length distribution ----------------------------------------------------------


def test_kaplan_meier_by_hand_with_a_cut_longest_episode() -> None:
    # times 1 2 3 4; at risk 5 4 2 1; ended 1 1 1 0 -> S = 4/5, 3/5, 3/10, 3/10
    d = EpisodeLengths.from_sample([1, 2, 2, 3, 4], censored=[False, True, False, False, True])
    assert d.values.tolist() == [1, 2, 3, 4]
    np.testing.assert_allclose(d.probabilities, [0.2, 0.2, 0.3, 0.3])  # S(3) = 0.3 left at the longest
    assert d.survival(2) == pytest.approx(0.6) and d.mean == pytest.approx(2.7)
    tail = EpisodeLengths.from_sample([1, 2, 2, 3, 4], censored=[False, True, False, False, True], tail_length=10)
    assert tail.values.tolist() == [1, 2, 3, 10] and tail.mean == pytest.approx(0.2 + 0.4 + 0.9 + 3.0)


def test_kaplan_meier_undoes_the_bias_of_cut_episodes() -> None:
    """Lengths uniform on 1..100, each episode cut at a uniform time: counting cuts as ends (or
    dropping them) is far off; the survival estimate is not."""
    rng = np.random.default_rng(0)
    true = rng.integers(1, 101, 20_000)
    cut_at = rng.integers(1, 101, true.size)
    seen, censored = np.minimum(true, cut_at), cut_at < true
    estimate = EpisodeLengths.from_sample(seen, censored, tail_length=100)
    assert estimate.mean == pytest.approx(50.5, rel=0.03)
    assert seen.mean() < 0.8 * 50.5 and seen[~censored].mean() < 0.8 * 50.5, (seen.mean(), seen[~censored].mean())
    for t in (10, 50, 90):
        assert estimate.survival(t) == pytest.approx(1 - t / 100, abs=0.02)


def test_lengths_refuse_what_is_not_a_sample() -> None:
    with pytest.raises(ValueError, match="censored has 1 flags for 2 lengths"):
        EpisodeLengths.from_sample([3, 4], censored=[True])
    with pytest.raises(ValueError, match="an episode length of 0"):
        EpisodeLengths.from_sample([0, 4])
    with pytest.raises(ValueError, match="tail_length=3 is shorter than an observed length"):
        EpisodeLengths.from_sample([5], tail_length=3)


def test_an_episode_in_progress_is_length_biased_with_a_uniform_age() -> None:
    """Lengths 10 or 90, equally likely: a slot that has run for long is 9 times likelier to be in a 90
    (it covers 90% of the slot's steps), and its age is uniform over that episode's steps."""
    d = EpisodeLengths(np.array([10, 90]), np.array([0.5, 0.5]))
    total, age = d.sample_in_progress(np.random.default_rng(0), 40_000)
    assert np.mean(total == 90) == pytest.approx(0.9, abs=0.01)
    assert ((age >= 0) & (age < total)).all()
    assert age[total == 90].mean() == pytest.approx(44.5, rel=0.02)
    assert age[total == 10].mean() == pytest.approx(4.5, rel=0.05)


def test_a_steady_start_ends_episodes_from_the_first_row() -> None:
    """Every episode 100 steps: started fresh, no episode ends in the first 99 rows; started as a long
    run finds it (mid-episode), about one slot in ten ends within 10 rows, as in the long run."""
    w = Workload(EpisodeLengths.fixed(100), SimulatorCosts(step_s=0.001), servers=1, slots_per_server=50)
    horizon = Horizon(samples_per_iteration=500, iterations=1, warmup_iterations=0)
    fresh = predict(w, ModeSettings("autoreset"), horizon)
    steady = predict(w, ModeSettings("autoreset"), dataclasses.replace(horizon, steady_start=True))
    assert math.isnan(fresh.episode_length_mean) and fresh.slot_resets_per_1k_valid == 100.0  # the first 50 alone
    # 50 slots x 10 rows: about 5 episodes end (each a whole 100 steps) and are reset, 10 per 1k valid
    assert steady.episode_length_mean == 100.0
    assert 2 <= steady.slot_resets_per_1k_valid - 100.0 <= 20, steady.slot_resets_per_1k_valid


# --- cases known by hand --------------------------------------------------------------------------


@pytest.mark.parametrize("length", [1, 7, 30])
def test_sc_gives_L_over_L_steps_plus_a_reset(length) -> None:
    s, r = 0.002, 0.05
    w = Workload(EpisodeLengths.fixed(length), SimulatorCosts(step_s=s, reset_fixed_s=r), servers=2, slots_per_server=3)
    p = predict(w, ModeSettings("sc"), Horizon(samples_per_iteration=210, iterations=2))
    assert p.effective_throughput == pytest.approx(length / (length * s + r), rel=1e-9)
    assert p.eta == 1.0 and p.slot_resets_per_1k_valid == pytest.approx(1000 / length)
    assert p.episode_length_mean == length


@pytest.mark.parametrize("exclusive", [True, False])
def test_lockstep_modes_with_equal_lengths_never_pad(exclusive) -> None:
    """Every slot's episode ends at the same step: nothing to pad, whatever alpha; the modes with
    rounds pay one batched reset per server, autoreset one per slot (queued when the engine is one)."""
    n, L, s, r = 4, 20, 0.001, 0.03
    costs = SimulatorCosts(step_s=s, reset_fixed_s=r, reset_exclusive=exclusive)
    w = Workload(EpisodeLengths.fixed(L), costs, servers=2, slots_per_server=n)
    for settings in LOCKSTEP:
        p = predict(w, settings, Horizon(samples_per_iteration=2 * n * L * 5, iterations=2))
        assert p.eta == 1.0, settings.label
        own_resets = n if exclusive and settings.mode == "autoreset" else 1  # fixed parts one after another
        assert p.effective_throughput == pytest.approx(2 * n * L / (L * s + own_resets * r), rel=1e-9), settings.label
        assert p.episode_length_mean == L


def test_fast_carry_waiting_for_every_episode_is_fast_reset() -> None:
    """alpha 1 and t_max beyond every episode: a round ends when every episode has, so nothing is
    left to carry and carry is reset, figure for figure."""
    lengths = EpisodeLengths.from_sample([5, 12, 20, 33, 40])
    w = Workload(
        lengths, SimulatorCosts(step_s=0.001, reset_fixed_s=0.02, map_load_s=0.01), servers=2, slots_per_server=4
    )
    horizon = Horizon(samples_per_iteration=500)
    carry = predict(w, ModeSettings("fast", alpha=1.0, t_max=41, truncation="carry"), horizon, seed=3)
    reset = predict(w, ModeSettings("fast", alpha=1.0, t_max=41, truncation="reset"), horizon, seed=3)
    assert _figures(carry) == _figures(reset)
    assert carry.eta < 1.0  # the short episodes wait, padded, for the longest


def test_fast_carry_never_cuts_and_resets_each_episode_once() -> None:
    """With carry, a round's end cuts nothing: the recorded lengths are the episodes' own (their mean
    that of the distribution), and each episode costs one slot reset; reset's rounds cut them short."""
    lengths = EpisodeLengths(np.array([10, 50, 200]), np.array([0.5, 0.3, 0.2]))
    w = Workload(lengths, SimulatorCosts(step_s=0.001, reset_fixed_s=0.02), servers=2, slots_per_server=8)
    horizon = Horizon(samples_per_iteration=4096, iterations=10)
    carry = predict(w, ModeSettings("fast", alpha=0.5, t_max=30, truncation="carry"), horizon)
    cut = predict(w, ModeSettings("fast", alpha=0.5, t_max=30, truncation="reset"), horizon)
    assert carry.episode_length_mean == pytest.approx(lengths.mean, rel=0.12)
    assert carry.slot_resets_per_1k_valid == pytest.approx(1000 / lengths.mean, rel=0.12)
    assert cut.episode_length_mean <= 30 and cut.slot_resets_per_1k_valid > 2 * carry.slot_resets_per_1k_valid


def test_reset_blocks_steps_makes_per_slot_resets_stop_every_slot() -> None:
    """One engine that stops stepping while it resets: VER's per-slot resets each stop the whole
    server, so a server's k episodes cost L steps and k fixed parts: at most k*L / (L*s + k*r) (the
    step+engine bound of jobs/bench/limits.py). FAST's batched reset stops it once: k*L / (L*s + r).
    Without the stop, VER's resets overlap the others' steps and it does far better."""
    k, L, s, r = 4, 40, 0.001, 0.02
    lengths = EpisodeLengths.fixed(L)
    horizon = Horizon(samples_per_iteration=1600, iterations=4)

    def on(blocks: bool, settings: ModeSettings):
        costs = SimulatorCosts(step_s=s, reset_fixed_s=r, reset_exclusive=True, reset_blocks_steps=blocks)
        return predict(Workload(lengths, costs, servers=1, slots_per_server=k), settings, horizon)

    bound = k * L / (L * s + k * r)
    blocked, free = on(True, ModeSettings("ver")), on(False, ModeSettings("ver"))
    assert 0.8 * bound <= blocked.effective_throughput <= bound * (1 + 1e-9)
    assert free.effective_throughput > 1.4 * blocked.effective_throughput
    fast = on(True, ModeSettings("fast", alpha=1.0))
    assert fast.effective_throughput == pytest.approx(k * L / (L * s + r), rel=1e-9)


def test_a_servers_compute_takes_turns_on_its_one_thread() -> None:
    """A CPU-bound simulator computes on its event loop (sim_server/simulator.py): a Reset's compute and
    a concurrent Step's take turns, though no emulated engine is exclusive or stops the steps. VER's
    per-slot resets then each stop the server, as under `reset_blocks_steps`: k*L / (L*s + k*r) at most;
    autoreset's k resets sent at once for the k slots that ended together take k*r, not r; FAST's
    batched reset, with no Step beside it, costs the same either way."""
    k, L, s, r = 4, 40, 0.001, 0.02
    lengths = EpisodeLengths.fixed(L)
    horizon = Horizon(samples_per_iteration=1600, iterations=4)

    def on(share: float, settings: ModeSettings) -> float:
        costs = SimulatorCosts(
            step_s=s, reset_fixed_s=r, reset_exclusive=False, step_compute_share=share, reset_compute_share=share
        )
        return predict(Workload(lengths, costs, servers=1, slots_per_server=k), settings, horizon).effective_throughput

    bound = k * L / (L * s + k * r)
    computed, free = on(1.0, ModeSettings("ver")), on(0.0, ModeSettings("ver"))
    assert 0.8 * bound <= computed <= bound * (1 + 1e-9)
    assert free > 1.4 * computed
    assert on(1.0, ModeSettings("autoreset")) == pytest.approx(bound, rel=1e-9)
    assert on(0.0, ModeSettings("autoreset")) == pytest.approx(k * L / (L * s + r), rel=1e-9)
    fast = ModeSettings("fast", alpha=1.0)
    assert on(1.0, fast) == pytest.approx(on(0.0, fast), rel=1e-9)
    assert on(1.0, fast) == pytest.approx(k * L / (L * s + r), rel=1e-9)
    # Half of each: the Steps beside a reset wait only for its compute, so VER lands in between.
    assert computed < on(0.5, ModeSettings("ver")) < free
    with pytest.raises(ValueError, match="step_compute_share=1.5: a share of the call's time"):
        SimulatorCosts(step_compute_share=1.5)


def test_prefetch_hides_a_load_shorter_than_the_episode() -> None:
    L, s, r, load = 50, 0.002, 0.02, 0.06  # the episode (100 ms) outlasts the load
    costs = SimulatorCosts(step_s=s, reset_fixed_s=r, map_load_s=load)
    w = Workload(EpisodeLengths.fixed(L), costs, servers=1, slots_per_server=1)
    horizon = Horizon(samples_per_iteration=500, iterations=2)
    assert predict(w, ModeSettings("sc"), horizon).effective_throughput == pytest.approx(L / (L * s + r + load))
    assert predict(w, ModeSettings("sc", prefetch=True), horizon).effective_throughput == pytest.approx(L / (L * s + r))
    slowed = dataclasses.replace(costs, prefetch_step_penalty=0.5)  # steps 50% slower while it loads
    p = predict(dataclasses.replace(w, costs=slowed), ModeSettings("sc", prefetch=True), horizon)
    extra = load * 0.5 / 1.5  # the steps the load overlaps take 1.5 times as long: 60 ms of them did 40 ms of work
    assert L / (L * s + r + extra + s) < p.effective_throughput < L / (L * s + r + extra - s)


def test_a_map_cache_of_one_map_loads_it_once() -> None:
    catalog = Catalog(np.zeros(40, dtype=np.int64))
    costs = SimulatorCosts(step_s=0.001, reset_fixed_s=0.01, map_load_s=0.1, map_cache_size=1)
    w = Workload(EpisodeLengths.fixed(10), costs, servers=2, slots_per_server=2, catalog=catalog)
    p = predict(w, ModeSettings("autoreset"), Horizon(samples_per_iteration=400))
    assert p.cache_hit_rate == 1.0
    assert p.effective_throughput == pytest.approx(4 * 10 / (10 * 0.001 + 2 * 0.01))


def test_each_slot_draws_its_episodes_from_its_own_stream() -> None:
    """Common random numbers: a slot's k-th episode has the same length whatever order the slots were
    reset in (so two alphas on one seed differ by their rules, not by which draw fell to which slot);
    another seed gives other lengths, and the episode a steady start catches is per slot too."""
    lengths = EpisodeLengths.from_sample(np.arange(5, 500, 7))
    together = _SlotEpisodes(lengths, 4, seed=3)
    apart = _SlotEpisodes(lengths, 4, seed=3)
    firsts = together.next(np.arange(4))
    seconds = together.next(np.array([2, 0]))
    assert apart.next(np.array([2])).tolist() == [firsts[2]]
    assert apart.next(np.array([2, 3, 1, 0])).tolist() == [seconds[0], firsts[3], firsts[1], firsts[0]]
    assert apart.next(np.array([0])).tolist() == [seconds[1]]
    many = together.next(np.repeat(np.arange(4), 100))  # past the first block of draws
    assert np.isin(many, lengths.values).all() and np.unique(many).size > 10
    assert _SlotEpisodes(lengths, 4, seed=4).next(np.arange(4)).tolist() != firsts.tolist()
    total, age = together.in_progress(np.array([1, 3]))
    again = apart.in_progress(np.array([3, 1]))
    assert total.tolist() == again[0][::-1].tolist() and age.tolist() == again[1][::-1].tolist()
    assert (age < total).all()


def test_the_brokers_own_work_a_round_is_paid_once_a_round() -> None:
    """`round_s` adds its time to every round of sgr and fast (more rounds at a lower alpha, so more of
    it), and nothing to the modes without rounds."""
    lengths = EpisodeLengths.from_sample(np.arange(10, 60, 5))
    w = Workload(lengths, SimulatorCosts(step_s=0.001, reset_fixed_s=0.005), servers=2, slots_per_server=4)
    horizon = Horizon(samples_per_iteration=800, iterations=2)
    for settings in (ModeSettings("fast", alpha=0.2, t_max=100), ModeSettings("fast", alpha=1.0, t_max=100)):
        free = predict(w, settings, horizon, seed=1)
        paid = predict(dataclasses.replace(w, round_s=0.01), settings, horizon, seed=1)
        rounds = round(free.global_resets_per_1k_valid * free.valid / 1000)
        assert rounds > 0 and paid.valid == free.valid
        assert paid.wall_s - free.wall_s == pytest.approx(rounds * 0.01)
    for mode in ("autoreset", "ver"):
        settings = ModeSettings(mode)
        assert (
            predict(dataclasses.replace(w, round_s=0.01), settings, horizon).wall_s
            == predict(w, settings, horizon).wall_s
        )


def test_the_model_is_deterministic_for_a_seed_and_ranks_best_first() -> None:
    lengths = EpisodeLengths.from_sample(np.arange(5, 80, 3))
    catalog = Catalog(np.arange(50) % 10)
    costs = SimulatorCosts(step_s=0.0016, reset_fixed_s=0.027, map_load_s=0.123)
    w = Workload(lengths, costs, servers=2, slots_per_server=5, inference_s=2e-4, catalog=catalog)
    horizon = Horizon(samples_per_iteration=512)
    modes = standard_modes(alpha=0.5)
    assert [m.label for m in modes] == ["sc", "autoreset", "sgr", "ver", "fast+carry", "fast+reset"]
    first = rank(w, modes, horizon, seed=1)
    assert [_figures(p) for p in first] == [_figures(p) for p in rank(w, modes, horizon, seed=1)]
    speeds = [p.effective_throughput for p in first]
    assert speeds == sorted(speeds, reverse=True) and first[-1].label == "sc"
    assert _figures(predict(w, modes[3], horizon, seed=2)) != _figures(predict(w, modes[3], horizon, seed=1))


def test_several_seeds_pool_their_runs_into_the_expected_figure() -> None:
    # Pooled: the valid transitions and the wall of seeds 4, 5 and 6 summed, as one longer measurement.
    lengths = EpisodeLengths.from_sample(np.arange(5, 80, 3))
    costs = SimulatorCosts(step_s=0.0016, reset_fixed_s=0.027, map_load_s=0.123, hit_rate=0.5)
    w = Workload(lengths, costs, servers=2, slots_per_server=5, inference_s=2e-4)
    horizon, settings = Horizon(samples_per_iteration=256), ModeSettings("sgr")
    alone = [predict(w, settings, horizon, seed=s) for s in (4, 5, 6)]
    pooled = predict(w, settings, horizon, seed=4, seeds=3)
    assert pooled.valid == sum(p.valid for p in alone) and pooled.wall_s == pytest.approx(sum(p.wall_s for p in alone))
    assert pooled.effective_throughput == pytest.approx(pooled.valid / sum(p.wall_s for p in alone))
    assert (
        min(p.effective_throughput for p in alone)
        < pooled.effective_throughput
        < max(p.effective_throughput for p in alone)
    )
    assert predict(w, settings, horizon, seed=4, seeds=1) == alone[0]
    with pytest.raises(ValueError, match="seeds=0: give >= 1"):
        predict(w, settings, horizon, seeds=0)


@pytest.mark.parametrize("reset_s, want", [(0.0, 0.2), (5.0, 1.0)])
def test_best_alpha_trades_padding_against_resets(reset_s, want) -> None:
    """Half the episodes last 10 steps, half 200. Free resets: the earliest round end pads least,
    so the smallest alpha of the grid wins; a reset dearer than a whole episode's steps: alpha 1,
    the fewest rounds. The choice is the best of the predictions it returns."""
    lengths = EpisodeLengths(np.array([10, 200]), np.array([0.5, 0.5]))
    w = Workload(lengths, SimulatorCosts(step_s=0.001, reset_fixed_s=reset_s), servers=1, slots_per_server=8)
    grid = (0.2, 0.5, 1.0)
    alpha, predictions = best_alpha(w, alphas=grid, horizon=Horizon(samples_per_iteration=2048, iterations=2))
    assert alpha == want
    assert [p.settings.alpha for p in predictions] == list(grid)
    assert predictions[grid.index(alpha)].effective_throughput == max(p.effective_throughput for p in predictions)


def test_ver_slot_work_takes_the_broker_thread_in_turn() -> None:
    """Each VER slot-step's own work (`ver_slot_s`) queues on the broker's one thread: a row of n slots
    on one server is one Step call, then n turns of that work; the lock-step modes do not pay it."""
    n, s, v = 5, 0.004, 0.0002
    base = Workload(EpisodeLengths.fixed(10_000), SimulatorCosts(step_s=s), servers=1, slots_per_server=n)
    busy = dataclasses.replace(base, ver_slot_s=v)
    horizon = Horizon(samples_per_iteration=n * 50, iterations=2, warmup_iterations=1)
    assert predict(base, ModeSettings("ver"), horizon).effective_throughput == pytest.approx(n / s, rel=1e-9)
    assert predict(busy, ModeSettings("ver"), horizon).effective_throughput == pytest.approx(n / (s + n * v), rel=1e-9)
    for settings in LOCKSTEP:
        assert predict(busy, settings, horizon) == predict(base, settings, horizon), settings.label
    with pytest.raises(ValueError, match="ver_slot_s=-1"):
        dataclasses.replace(base, ver_slot_s=-1)


def test_a_calls_thread_part_leaves_a_lockstep_row_and_queues_concurrent_calls() -> None:
    """`call_cpu_s` is the part of a call's `call_s` that holds the broker's thread: a row of one call
    per server still costs call_s (servers * call_cpu_s in turn, then the rest as a wait), but the n
    Reset calls autoreset sends at once for the n slots that ended together now take turns on it."""
    n, length, step, reset, call = 4, 20, 0.003, 0.002, 0.001
    base = Workload(
        EpisodeLengths.fixed(length),
        SimulatorCosts(step_s=step, reset_fixed_s=reset, reset_exclusive=False),
        servers=1,
        slots_per_server=n,
    )
    held = dataclasses.replace(base, call_s=call, call_cpu_s=call)
    waited = dataclasses.replace(base, call_s=call)
    horizon = Horizon(samples_per_iteration=n * length * 5, iterations=2, warmup_iterations=1)
    autoreset = ModeSettings("autoreset")
    # Per episode: `length` rows of (call + step), then the resets: all n at once when the call is a wait,
    # one after another on the thread (n calls' parts) before the last one's reset when it holds it.
    rows = length * (call + step)
    assert predict(waited, autoreset, horizon).effective_throughput == pytest.approx(n * length / (rows + call + reset))
    assert predict(held, autoreset, horizon).effective_throughput == pytest.approx(
        n * length / (rows + n * call + reset)
    )
    two = dataclasses.replace(waited, servers=2, slots_per_server=n // 2)
    for settings in (ModeSettings("sgr"), ModeSettings("fast", truncation="carry")):
        split = predict(dataclasses.replace(two, call_cpu_s=call / 2), settings, horizon)
        assert split.effective_throughput == pytest.approx(predict(two, settings, horizon).effective_throughput)
    with pytest.raises(ValueError, match="call_cpu_s=0.001 for 2 servers exceeds call_s=0.001"):
        dataclasses.replace(two, call_cpu_s=call)


def test_a_calls_receive_comes_after_the_server_and_a_lone_call_overlaps_only_its_send() -> None:
    """`call_receive_cpu_s` splits a call's thread part into its send (before the server's part) and its
    receive (after it). A lock-step row of one call per server still costs call_s + the step, whichever
    part is longer; a call alone (sc) costs call_s less the other servers' sends (or receives, whichever
    is longer), where it cost call_s less their whole thread parts; and where the servers answer at
    their own times (VER) a receive waits for the thread."""
    length, step, call, cpu = 10_000, 0.003, 0.002, 0.0008
    two = Workload(
        EpisodeLengths.fixed(length),
        SimulatorCosts(step_s=step),
        servers=2,
        slots_per_server=2,
        call_s=call,
        call_cpu_s=cpu,
    )
    horizon = Horizon(samples_per_iteration=400, iterations=2, warmup_iterations=1)
    for receive in (0.0002, 0.0006):  # shorter than the send, then longer (the receives queue)
        split = dataclasses.replace(two, call_receive_cpu_s=receive)
        for settings in (ModeSettings("sgr"), ModeSettings("fast", truncation="carry")):
            assert predict(split, settings, horizon).wall_s == pytest.approx(predict(two, settings, horizon).wall_s)
        # sc: one slot, a lone Step call a row: call_s less the other server's send (or receive, the longer
        # part), where it was call_s less its whole thread part before.
        lone = predict(split, ModeSettings("sc"), horizon)
        assert lone.effective_throughput == pytest.approx(1 / (step + call - max(cpu - receive, receive)), rel=1e-6)
    assert predict(two, ModeSettings("sc"), horizon).effective_throughput == pytest.approx(1 / (step + call - cpu))
    late = dataclasses.replace(two, call_receive_cpu_s=0.0004)
    assert predict(late, ModeSettings("ver"), horizon).wall_s > predict(two, ModeSettings("ver"), horizon).wall_s
    with pytest.raises(ValueError, match="call_receive_cpu_s=0.001 exceeds call_cpu_s=0.0008"):
        dataclasses.replace(two, call_receive_cpu_s=0.001)


def test_settings_and_workloads_are_checked() -> None:
    with pytest.raises(ValueError, match="mode 'async' is unknown"):
        ModeSettings("async")
    with pytest.raises(ValueError, match="alpha=0: give 0 < alpha <= 1"):
        ModeSettings("fast", alpha=0)
    with pytest.raises(ValueError, match="step_s=-1: costs are seconds"):
        SimulatorCosts(step_s=-1)
    with pytest.raises(ValueError, match="2 costs for 3 servers"):
        Workload(EpisodeLengths.fixed(3), (SimulatorCosts(), SimulatorCosts()), servers=3)
    with pytest.raises(ValueError, match="locality needs a Catalog"):
        predict(Workload(EpisodeLengths.fixed(3), SimulatorCosts()), ModeSettings("sgr", locality=True))


# --- against the cost model, through the broker's real samplers -------------------------------


class DrawnLengthEnv:
    """A SlotEnv whose episode lasts a length drawn from (clip, seed): uniform on 10..60 steps."""

    LOW, HIGH = 10, 60

    def __init__(self, num_slots: int, num_clips: int, num_maps: int) -> None:
        self.num_slots, self.num_clips, self.num_maps = num_slots, num_clips, num_maps
        box = SpaceSpec("box", (2,), np.dtype(np.float32), np.full(2, -1e6, np.float32), np.full(2, 1e6, np.float32))
        self.observation_space = box
        self.action_space = SpaceSpec(
            "box", (1,), np.dtype(np.float32), np.full(1, -1, np.float32), np.full(1, 1, np.float32)
        )
        self.t = np.zeros(num_slots, dtype=np.int64)
        self.length = np.ones(num_slots, dtype=np.int64)

    def map_id(self, clip_id: int) -> int:
        return clip_id % self.num_maps

    def _obs(self, slots: np.ndarray) -> np.ndarray:
        return np.stack([self.t[slots], self.length[slots]], axis=1).astype(np.float32)

    def reset(self, slot_ids, clip_ids, seeds) -> np.ndarray:
        for slot, clip, seed in zip(slot_ids, clip_ids, seeds):
            self.length[slot] = np.random.default_rng([int(clip), int(seed)]).integers(self.LOW, self.HIGH + 1)
        self.t[slot_ids] = 0
        return self._obs(slot_ids)

    def step(self, slot_ids, actions) -> StepResult:
        self.t[slot_ids] += 1
        ended = self.t[slot_ids] >= self.length[slot_ids]
        metrics = [{"length": float(self.t[s]), "return": 0.0} if e else None for s, e in zip(slot_ids, ended)]
        return StepResult(
            self._obs(slot_ids), np.zeros(len(slot_ids), np.float32), ended, np.zeros_like(ended), metrics
        )


SERVERS, SLOTS, CLIPS, MAPS = 2, 4, 40, 8
COSTS = CostModelConfig(
    preset="custom",
    step_latency_s=0.004,
    reset_fixed_s=0.02,
    reset_fixed_exclusive=True,
    map_load_s=0.04,
    map_load_cached_s=0.0,
    map_load_shared=True,
    map_cache_size=2,
)


async def _measure(settings: ModeSettings, warmup: int, samples: int, iterations: int) -> tuple[float, float]:
    """(effective throughput, eta) of the real sampler on real Simulators under COSTS, as the
    sampling benchmark measures it (jobs/bench/harness.py: a warm-up iteration, then measured ones)."""
    pool = InProcessPool([Simulator(DrawnLengthEnv(SLOTS, CLIPS, MAPS), CostModel(COSTS)) for _ in range(SERVERS)])
    runner = PolicyRunner(pool.observation_space, pool.action_space, (8,), seed=0)
    sampler = make_sampler(
        settings.mode,
        pool,
        runner,
        ClipDealer(CLIPS, holdout_every=10, seed=0),
        samples_per_iteration=warmup,
        alpha=settings.alpha,
        t_max=settings.t_max,
        truncation=settings.truncation,
    )
    await sampler.sample()
    sampler.samples_per_iteration = samples
    valid = transitions = 0
    wall = 0.0
    for _ in range(iterations):
        _, stats = await sampler.sample()
        valid, transitions, wall = valid + stats.valid, transitions + stats.transitions, wall + stats.wall_s
    return valid / wall, valid / transitions


async def _probe() -> tuple[SimulatorCosts, float]:
    """COSTS as this machine pays them, and the broker's own time per Step call, from a short probe
    as the advisor measures a simulator: rows of Step calls through the in-process pool (each
    server's paid time as it reports it, the rest of the wall time the broker's), and Resets of one
    slot onto a new and onto a cached map (the cost model's precise waits hand back late on a
    loaded machine: a 4 ms wait may last 5 to 6 ms)."""
    pool = InProcessPool([Simulator(DrawnLengthEnv(SLOTS, CLIPS, MAPS), CostModel(COSTS)) for _ in range(SERVERS)])
    slots = np.arange(pool.num_slots)
    await pool.reset(slots, slots, slots, batched=True)
    paid, wall = [], []
    for _ in range(DrawnLengthEnv.LOW - 1):  # every episode is still live
        started = time.perf_counter()
        result = await pool.step(slots, np.zeros((slots.size, 1), np.float32))
        wall.append(time.perf_counter() - started)
        paid.append(result.server_s)
    model = CostModel(COSTS)
    fixed, loads = [], []
    for m in range(5):
        new = (await model.reset([1000 + m])).emulated_s  # a map never loaded: fixed part and load
        cached = (await model.reset([1000 + m])).emulated_s  # the same map, cached: fixed part only
        fixed.append(cached)
        loads.append(new - cached)
    costs = SimulatorCosts.from_cost_model(
        COSTS, step_s=float(np.mean(paid)), reset_fixed_s=float(np.mean(fixed)), map_load_s=float(np.mean(loads))
    )
    return costs, max(float(np.mean(wall) - np.mean(paid)), 0.0)


def _inference_s() -> float:
    """The forward pass's own time on this machine, for the model (the median of a few)."""
    runner = PolicyRunner(DrawnLengthEnv(1, 1, 1).observation_space, DrawnLengthEnv(1, 1, 1).action_space, (8,))
    obs = np.zeros((SLOTS, 2), np.float32)
    times = []
    for _ in range(30):
        t0 = time.perf_counter()
        runner.act(obs)
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


@pytest.fixture(scope="module")
def probed() -> tuple[SimulatorCosts, float, float]:
    """(costs, broker time per Step call, forward pass time) as measured here, once for the module."""
    costs, call_s = asyncio.run(_probe())
    return costs, call_s, _inference_s()


@pytest.mark.parametrize(
    "settings",
    [ModeSettings("fast", alpha=0.5, truncation="carry"), ModeSettings("autoreset"), ModeSettings("ver")],
    ids=lambda s: s.label,
)
def test_the_model_predicts_the_real_samplers_on_the_cost_model(settings, probed) -> None:
    """The model against the broker's own sampler on real Simulators whose cost model waits
    (in-process, no sockets), on one small configuration: 2 servers of 4 slots, a 4 ms step, a
    20 ms fixed reset part on one engine, 40 ms map loads on one channel, 8 maps over a cache of 2,
    lengths uniform on 10..60.

    The model is given the costs as a short probe measures them here (`_probe`: on a loaded machine a
    4 ms wait lasts 5 to 6 ms, and the broker adds its own time to every call), and the forward
    pass's time, as the advisor will measure a simulator. Within 30%, not closer: the probe's few
    calls estimate costs that drift with the machine's load (other processes share its 2 cores),
    the broker's bookkeeping between calls is not in the model, and the real run draws its lengths
    from (clip, seed), not from the model's random stream, so two iterations of 768 transitions
    (~45 episodes) differ from the model's by sampling noise of several percent."""
    warmup, samples, iterations = 256, 768, 2
    lengths = EpisodeLengths(np.arange(10, 61), np.full(51, 1 / 51))
    horizon = Horizon(samples, iterations=iterations, warmup_iterations=1, warmup_samples=warmup)
    # Up to three tries, each probing again just before it measures: a burst of another process's
    # load (a full test suite on 2 cores) halves a measurement that the probe before it did not see.
    for attempt in range(3):
        costs, call_s, inference_s = probed if attempt == 0 else (*asyncio.run(_probe()), _inference_s())
        measured, measured_eta = asyncio.run(_measure(settings, warmup, samples, iterations))
        workload = Workload(
            lengths,
            costs,
            servers=SERVERS,
            slots_per_server=SLOTS,
            inference_s=inference_s,
            call_s=call_s,
            catalog=Catalog(np.arange(CLIPS) % MAPS, holdout_every=10),
        )
        predicted = predict(workload, settings, horizon)
        print(
            f"{settings.label} (try {attempt + 1}): predicted {predicted.effective_throughput:.0f}/s "
            f"eta {predicted.eta:.3f}, measured {measured:.0f}/s eta {measured_eta:.3f}"
        )
        assert math.isfinite(predicted.effective_throughput)
        if abs(predicted.effective_throughput - measured) <= 0.3 * measured:
            break
    assert predicted.effective_throughput == pytest.approx(measured, rel=0.3)
    assert predicted.eta == pytest.approx(measured_eta, abs=0.1)
