"""`--alpha auto` (broker/advisor/auto_alpha.py): the choice on scripted runs whose episode lengths
and costs are known, against the model's brute-force optimum over the grid; censoring, bounds, and
the settings that turn it on.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from broker.advisor.auto_alpha import AutoAlpha, IterationCosts, alpha_grid, fit_line
from broker.advisor.lengths import EpisodeLengths
from broker.advisor.model import SimulatorCosts, Workload, best_alpha
from broker.config import BrokerConfig
from broker.settings import RunSettings, SettingError, changes
from jobs.train.config import TrainConfig

SLOTS = 8
ROW_S = 0.002


def _uniform(lo: int, hi: int) -> EpisodeLengths:
    values = np.arange(lo, hi + 1)
    return EpisodeLengths(values, np.full(values.size, 1.0 / values.size))


def _run(
    lengths: np.ndarray,
    *,
    reset_s: float,
    censored: np.ndarray | None = None,
    bounds: tuple[float, float] = (0.1, 1.0),
    truncation: str = "carry",
    rng_seed: int = 0,
) -> AutoAlpha:
    """An AutoAlpha that has observed one scripted iteration: rows of ROW_S, rounds resetting 1 to
    SLOTS slots at `reset_s` each, forward passes of 0.1 ms, and these episodes."""
    rng = np.random.default_rng(rng_seed)
    auto = AutoAlpha(
        *bounds, servers=1, slots_per_server=SLOTS, t_max=1000, samples_per_iteration=1024, truncation=truncation
    )
    rounds = tuple((int(k), reset_s) for k in rng.integers(1, SLOTS + 1, 30))
    rows = 600
    costs = IterationCosts(
        rows=rows,
        wall_s=rows * (ROW_S + 1e-4) + 30 * reset_s,
        reset_wall_s=30 * reset_s,
        inference_s=rows * 1e-4,
        round_resets=rounds,
    )
    cut = np.zeros(len(lengths), bool) if censored is None else censored
    auto.observe(costs, list(zip(lengths.tolist(), cut.tolist())), running=[])
    return auto


def _brute_force(workload: Workload, auto: AutoAlpha, seeds=(0,)) -> tuple[float, list[float]]:
    """Every alpha of the grid played by the model's own `best_alpha`, once per seed; the fastest in
    the mean over the seeds (the first of a tie)."""
    per_seed = [
        [
            p.effective_throughput
            for p in best_alpha(
                workload,
                alphas=auto.grid,
                t_max=auto.t_max,
                truncation=auto.truncation,
                horizon=auto.horizon(),
                seed=seed,
            )[1]
        ]
        for seed in seeds
    ]
    speeds = np.mean(per_seed, axis=0).tolist()
    return auto.grid[int(np.argmax(speeds))], speeds


# --- the pieces -------------------------------------------------------------------------------------


def test_the_grid_is_the_bounds_and_the_standard_alphas_between() -> None:
    assert alpha_grid(0.1, 1.0) == (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
    assert alpha_grid(0.25, 0.6) == (0.25, 0.3, 0.4, 0.5, 0.6)
    assert alpha_grid(0.5, 0.5) == (0.5,)
    with pytest.raises(ValueError, match="alpha_min=0.7, alpha_max=0.3"):
        alpha_grid(0.7, 0.3)


def test_a_rounds_reset_is_fitted_as_a_fixed_part_and_a_part_per_slot() -> None:
    rounds = [(k, 0.03 + 0.002 * k) for k in (1, 3, 2, 5, 4)]
    assert fit_line(rounds) == pytest.approx((0.03, 0.002))
    assert fit_line([(8, 0.05), (8, 0.07)]) == pytest.approx((0.06, 0.0))  # every slot every round: all fixed
    assert fit_line([(1, 0.001), (4, 0.004)]) == pytest.approx((0.0, 0.001))
    assert fit_line([]) == (0.0, 0.0)


def test_the_costs_are_the_windows_per_row_and_per_pass() -> None:
    auto = _run(np.full(50, 40), reset_s=0.05)
    costs = auto.measured_costs()
    assert costs.row_s == pytest.approx(ROW_S) and costs.inference_s == pytest.approx(1e-4)
    assert costs.reset_fixed_s == pytest.approx(0.05) and costs.reset_per_slot_s == pytest.approx(0.0)


def test_a_rows_cost_is_split_into_a_fixed_part_and_a_part_per_acting_slot() -> None:
    """Rows that step fewer slots (padded, as at high alpha) cost less: the slope comes from the rows,
    the fixed part is what then makes the window's mean row, and the model's Step call gets both."""
    auto = AutoAlpha(0.1, 1.0, servers=2, slots_per_server=4, t_max=100, samples_per_iteration=512)
    rows = [(k, 0.001 + 0.0002 * k) for k in (1, 2, 3, 4, 4, 4)]  # mean k 3: a mean row of 1.6 ms
    extra = 0.0003  # per row outside the rows' own walls (round opening, the batch): kept in the fixed part
    wall = sum(w for _, w in rows) + len(rows) * extra
    auto.observe(
        IterationCosts(rows=len(rows), wall_s=wall, reset_wall_s=0.0, inference_s=0.0, row_steps=tuple(rows)), [], []
    )
    costs = auto.measured_costs()
    assert costs.row_per_slot_s == pytest.approx(0.0002)
    assert costs.row_s == pytest.approx(0.001 + extra)
    sim = costs.simulator_costs()
    assert sim.step_s == pytest.approx(costs.row_s) and sim.step_per_slot_s == pytest.approx(0.0002)
    # A slope steeper than the mean row allows: the whole row per slot, nothing negative.
    auto = AutoAlpha(0.1, 1.0, servers=1, slots_per_server=4, t_max=100, samples_per_iteration=512)
    steep = ((1, 0.0001), (4, 0.01))
    auto.observe(IterationCosts(rows=2, wall_s=0.002, reset_wall_s=0.0, inference_s=0.0, row_steps=steep), [], [])
    costs = auto.measured_costs()
    assert costs.row_s == 0.0 and costs.row_per_slot_s == pytest.approx(0.001 / 2.5)


def test_a_rounds_own_work_is_the_windows_mean_and_leaves_the_rows() -> None:
    auto = AutoAlpha(0.1, 1.0, servers=1, slots_per_server=4, t_max=100, samples_per_iteration=512)
    rows = tuple((4, 0.002) for _ in range(100))
    overheads = (0.001, 0.003)  # two rounds
    wall = 100 * 0.002 + sum(overheads)
    auto.observe(
        IterationCosts(
            rows=100, wall_s=wall, reset_wall_s=0.0, inference_s=0.0, row_steps=rows, round_overheads=overheads
        ),
        [],
        [],
    )
    costs = auto.measured_costs()
    assert costs.round_s == pytest.approx(0.002) and costs.row_s == pytest.approx(0.002)
    assert auto.workload(costs, _uniform(5, 10)).round_s == pytest.approx(0.002)


# --- the choice against brute force --------------------------------------------------------------


@pytest.mark.parametrize(
    ("lo", "hi", "reset_s"),
    [(20, 100, 0.001), (20, 100, 0.05), (20, 100, 0.5), (2, 10, 0.05), (100, 300, 0.02)],
)
def test_the_choice_is_the_brute_force_optimum(lo: int, hi: int, reset_s: float) -> None:
    """Lengths uniform on [lo, hi], known costs: the choice is the model's optimum over the grid on what
    the run measured, and within 5% of the optimum on the true distribution and costs."""
    lengths = np.random.default_rng(1).integers(lo, hi + 1, 400)
    auto = _run(lengths, reset_s=reset_s)
    choice = auto.choose()
    measured = auto.workload(auto.measured_costs(), EpisodeLengths.from_sample(lengths))
    best, speeds = _brute_force(measured, auto, seeds=range(auto.seeds_per_decision))
    assert choice.source == "model" and choice.alpha == best and not choice.held
    np.testing.assert_allclose(choice.predicted, speeds)
    true = Workload(
        _uniform(lo, hi),
        SimulatorCosts(step_s=ROW_S, reset_fixed_s=reset_s, prepare=False),
        slots_per_server=SLOTS,
        inference_s=1e-4,
    )
    _, true_speeds = _brute_force(true, auto)
    assert true_speeds[auto.grid.index(choice.alpha)] >= 0.95 * max(true_speeds)


def test_later_choices_average_the_decisions_curves_on_fresh_seeds_and_hold_within_the_margin() -> None:
    """Each decision plays fresh seeds; the curve it goes by is the mean of the last decisions'; the
    alpha in force stays unless another is predicted faster by more than the margin (brute force
    on the same seeds decides what each should be)."""
    lengths = np.random.default_rng(1).integers(20, 101, 400)
    auto = _run(lengths, reset_s=0.05)
    workload = auto.workload(auto.measured_costs(), EpisodeLengths.from_sample(lengths))
    k = auto.seeds_per_decision
    first = auto.choose()
    second = auto.choose()  # the same window: a second decision on seeds k .. 2k-1
    _, both = _brute_force(workload, auto, seeds=range(2 * k))  # the mean of two equal-sized curves
    np.testing.assert_allclose(second.predicted, both)
    best = int(np.argmax(both))
    in_force = auto.grid.index(first.alpha)
    if both[best] > both[in_force] * (1 + auto.margin):
        assert (second.alpha, second.held) == (auto.grid[best], False)
    else:
        assert second.alpha == first.alpha and second.held == (best != in_force)
    # Past smooth_decisions, the oldest curve leaves the mean.
    for _ in range(auto.smooth_decisions - 1):
        last = auto.choose()
    _, window = _brute_force(workload, auto, seeds=range(k, (auto.smooth_decisions + 1) * k))
    np.testing.assert_allclose(last.predicted, window)
    # A server lost (or t_max or the batch changed): the curves played on the old shape are dropped.
    auto.servers, auto.slots_per_server = 2, SLOTS // 2
    seeds = auto.seeds()
    _, fresh = _brute_force(auto.workload(auto.measured_costs(), EpisodeLengths.from_sample(lengths)), auto, seeds)
    np.testing.assert_allclose(auto.choose().predicted, fresh)


def test_the_alpha_in_force_is_held_unless_another_beats_it_by_the_margin() -> None:
    lengths = np.random.default_rng(1).integers(20, 101, 400)
    wide = _run(lengths, reset_s=0.05)
    wide.margin = 10.0  # nothing beats the first choice by 1,000%
    first = wide.choose()
    assert all(wide.choose().alpha == first.alpha for _ in range(3))
    eager = _run(lengths, reset_s=0.05)
    eager.margin = 0.0
    for _ in range(3):
        choice = eager.choose()
        assert choice.alpha == eager.grid[int(np.argmax(choice.predicted))] and not choice.held


@pytest.mark.parametrize(
    ("setting", "message"),
    [({"seeds_per_decision": 0}, "seeds_per_decision=0"), ({"margin": -0.1}, "margin=-0.1")],
)
def test_bad_smoothing_settings_are_refused(setting: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        AutoAlpha(0.1, 1.0, servers=1, slots_per_server=4, t_max=100, samples_per_iteration=256, **setting)


def test_costlier_resets_raise_alpha_and_longer_episodes_lower_it() -> None:
    rng = np.random.default_rng(2)
    medium = rng.integers(20, 101, 400)
    cheap, costly = _run(medium, reset_s=0.001).choose().alpha, _run(medium, reset_s=0.5).choose().alpha
    assert cheap < costly
    short = _run(rng.integers(2, 11, 400), reset_s=0.05).choose().alpha
    long = _run(rng.integers(200, 1001, 400), reset_s=0.05).choose().alpha
    assert long < short


def test_cut_episodes_are_censored_not_taken_as_short() -> None:
    """Lengths uniform on [20, 100], each seen until a truncation at a random step: Kaplan-Meier finds
    the true mean where taking the cuts as ends would not, and the choice stays near the true optimum."""
    rng = np.random.default_rng(3)
    true_lengths = rng.integers(20, 101, 500)
    cut_at = rng.integers(10, 150, 500)
    seen, censored = np.minimum(true_lengths, cut_at), cut_at < true_lengths
    auto = _run(seen, reset_s=0.05, censored=censored)
    choice = auto.choose()
    assert choice.censored == int(censored.sum()) > 150
    assert choice.length_mean == pytest.approx(60, rel=0.1)
    assert seen.mean() < 0.85 * 60  # the naive mean
    true = Workload(
        _uniform(20, 100),
        SimulatorCosts(step_s=ROW_S, reset_fixed_s=0.05, prepare=False),
        slots_per_server=SLOTS,
        inference_s=1e-4,
    )
    _, true_speeds = _brute_force(true, auto)
    assert true_speeds[auto.grid.index(choice.alpha)] >= 0.95 * max(true_speeds)


def test_episodes_running_at_the_boundary_count_censored_until_they_end() -> None:
    auto = _run(np.full(10, 30), reset_s=0.05)
    costs = IterationCosts(rows=10, wall_s=0.1, reset_wall_s=0.0, inference_s=0.0)
    auto.observe(costs, [], running=[50, 70])
    lengths, episodes, censored = auto.lengths()
    assert (episodes, censored) == (12, 2) and lengths.longest == 70
    auto.observe(costs, [(80, False)], running=[5])  # the 70 ended at 80; the 50 was cut (not here); a new one
    _, episodes, censored = auto.lengths()
    assert (episodes, censored) == (12, 1)


def test_the_window_keeps_the_recent_episodes() -> None:
    auto = AutoAlpha(0.1, 1.0, servers=1, slots_per_server=4, t_max=100, samples_per_iteration=256, window_episodes=5)
    costs = IterationCosts(rows=10, wall_s=0.1, reset_wall_s=0.0, inference_s=0.0)
    auto.observe(costs, [(10, False)] * 5, running=[])
    auto.observe(costs, [(90, False)] * 5, running=[])
    assert auto.lengths()[0].values.tolist() == [90]


# --- bounds, and before anything is measured --------------------------------------------------


def test_the_choice_stays_inside_the_bounds() -> None:
    lengths = np.random.default_rng(4).integers(20, 101, 400)
    assert _run(lengths, reset_s=0.001).choose().alpha < 0.3  # unbounded, it goes low ...
    bounded = _run(lengths, reset_s=0.001, bounds=(0.35, 0.45)).choose()
    assert bounded.alpha == 0.35 and bounded.grid == (0.35, 0.4, 0.45)  # ... bounded, to the lower bound
    assert _run(lengths, reset_s=0.5).choose().alpha > 0.6
    assert _run(lengths, reset_s=0.5, bounds=(0.1, 0.6)).choose().alpha <= 0.6
    assert _run(lengths, reset_s=0.5, bounds=(0.7, 0.7)).choose().source == "bounds"


def test_before_any_measurement_the_prior_held_inside_the_bounds() -> None:
    fresh = AutoAlpha(0.6, 0.9, servers=2, slots_per_server=4, t_max=100, samples_per_iteration=256)
    choice = fresh.choose()
    assert (choice.alpha, choice.source) == (0.6, "prior")
    assert (
        AutoAlpha(0.1, 1.0, servers=1, slots_per_server=4, t_max=100, samples_per_iteration=256).choose().alpha == 0.5
    )


# --- the settings ----------------------------------------------------------------------------------

BROKER = {"simulators": ["127.0.0.1:1"], "learner": "127.0.0.1:2"}


def test_alpha_takes_a_number_or_auto_within_bounds() -> None:
    assert BrokerConfig(**BROKER, alpha="auto").alpha == "auto"
    assert BrokerConfig(**BROKER, alpha="0.25").alpha == 0.25
    cfg = TrainConfig(alpha="auto", alpha_min=0.2, alpha_max=0.8)
    assert (cfg.alpha, cfg.alpha_min, cfg.alpha_max) == ("auto", 0.2, 0.8)


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"alpha": "foo"}, "alpha is 'foo': give a number in (0, 1] or auto"),
        ({"alpha": 1.5}, "alpha is 1.5: give a number in (0, 1] or auto"),
        ({"alpha": "auto", "alpha_min": 0.8, "alpha_max": 0.3}, "alpha_min=0.8 is above alpha_max=0.3"),
        ({"alpha_min": 0.0}, "alpha_min"),
    ],
)
def test_bad_alpha_settings_name_the_setting(given: dict, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        BrokerConfig(**BROKER, **given)
    with pytest.raises(ValueError, match=re.escape(message)):
        TrainConfig(**given)


def test_a_number_for_alpha_turns_auto_off_and_alpha_auto_turns_it_on() -> None:
    auto = RunSettings(0.5, 200, 64, alpha_auto=True)
    manual = auto.updated(alpha=0.3)
    assert manual == RunSettings(0.3, 200, 64, alpha_auto=False)
    assert changes(auto, manual) == [
        {"name": "alpha", "old_value": 0.5, "new_value": 0.3},
        {"name": "alpha_auto", "old_value": True, "new_value": False},
    ]
    assert manual.updated(alpha_auto=True) == RunSettings(0.3, 200, 64, alpha_auto=True)
    with pytest.raises(SettingError, match="alpha_auto is 'yes'; allowed: true or false"):
        manual.updated(alpha_auto="yes")


# --- end to end ------------------------------------------------------------------------------------

# tests/test_train.py's tiny run.
TINY = ["--servers", "2", "--slots", "2", "--samples-per-iteration", "128", "--update-epochs", "1"]
TINY += ["--eval-episodes-per-clip", "1"]


@pytest.mark.slow
def test_train_with_alpha_auto_and_mode_auto_records_choices_and_a_switch(tmp_path: Path) -> None:
    """One tiny run for both: alpha is chosen in each iteration sampled in fast, and mode auto (fast, then
    a probe of ver, then the decision) switches mode at a boundary with nothing lost (tests/test_auto_mode.py)."""
    bounds = ["--alpha-min", "0.2", "--alpha-max", "0.8"]
    modes = ["--mode", "auto", "--mode-candidates", "fast,ver", "--mode-probe-every", "2"]
    command = [sys.executable, "-m", "fast", "train", "--runs-dir", str(tmp_path), "--name", "auto"]
    command += [*modes, "--alpha", "auto", *bounds, "--iterations", "3", *TINY]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=150, env={**os.environ, "PYTHONUNBUFFERED": "1"}
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    lines = [json.loads(line) for line in (tmp_path / "auto" / "metrics.jsonl").read_text().splitlines()]
    assert [m["iteration"] for m in lines] == [1, 2, 3]
    assert [m["policy_version"] for m in lines] == [0, 1, 2]  # every batch learnt from, in turn
    # mode auto: fast first, ver probed once, then the decision; each change a settings change.
    # (tests/test_train.py runs fast alone; ver trains end to end here, in the probe.)
    assert [(m["settings"]["mode"], m["mode_auto"]["source"]) for m in lines[:2]] == [
        ("fast", "start"),
        ("ver", "probe"),
    ]
    assert lines[1]["valid_transitions"] >= 128 and "policy_loss" in lines[1]["learner"]
    assert all(m["settings"]["mode_auto"] and m["mode"] == m["settings"]["mode"] for m in lines)
    assert {"name": "mode", "old_value": "fast", "new_value": "ver"} in lines[1]["settings_changed"]
    assert lines[2]["mode_auto"]["source"] in ("stay", "switch") and lines[2]["mode_auto"]["iterations"] == {
        "fast": 1,
        "ver": 1,
    }
    assert all(v > 0 for v in lines[2]["mode_auto"]["throughput"].values())
    back = {"name": "mode", "old_value": "ver", "new_value": "fast"} in lines[2].get("settings_changed", [])
    assert back == (lines[2]["settings"]["mode"] == "fast")
    # alpha auto: a choice in each iteration sampled in fast, from its window of fast iterations only.
    fast = [m for m in lines if m["settings"]["mode"] == "fast"]
    assert all("alpha_auto" not in m for m in lines if m["settings"]["mode"] != "fast")
    for m in fast:
        assert m["settings"]["alpha_auto"] is True and 0.2 <= m["settings"]["alpha"] <= 0.8
        assert m["alpha_auto"]["alpha"] == m["settings"]["alpha"] and m["alpha_auto"]["grid"][::3] == [0.2, 0.5, 0.8]
    assert [m["alpha_auto"]["source"] for m in fast] == ["prior", "model"][: len(fast)]
    assert fast[0]["settings"]["alpha"] == 0.5
    assert all(m["alpha_auto"]["episodes"] > 0 and m["alpha_auto"]["decision_s"] > 0 for m in fast[1:])
