"""The limit that the costs put on a sampling pattern (jobs/bench/limits.py), by hand-checked cases."""

from __future__ import annotations

import math

import pytest

from jobs.bench.limits import Costs, Pattern, costs_from_describe, line_limit, pattern_limit
from sim_server.cost_model import PRESETS

CALIBRATED = costs_from_describe(PRESETS["calibrated"])
PARALLEL = costs_from_describe(PRESETS["parallel"])


def _pattern(**changes) -> Pattern:
    base = dict(
        slots=10,
        servers=2,
        step_latency_s=0.002,
        eta=0.8,
        resets_per_valid=0.01,
        reset_calls_per_valid=0.001,
        hit_rate=0.2,
    )
    return Pattern(**{**base, **changes})


def test_step_bound_is_eta_slots_over_the_latency_paid() -> None:
    limit = pattern_limit(Costs(map_load_shared=False, reset_fixed_exclusive=False), _pattern())
    assert limit.binding == "step" and limit.limit == pytest.approx(0.8 * 10 / 0.002)  # 4,000 valid/s
    assert set(limit.bounds) == {"step"}


def test_a_shared_load_channel_bounds_by_loads_per_valid_transition() -> None:
    # 0.01 resets per valid transition, 80% of them load a 123 ms map: 0.000984 s of channel time per
    # valid transition on each of 2 channels -> 2,033 valid/s, below the step bound of 4,000.
    limit = pattern_limit(CALIBRATED, _pattern())
    assert limit.binding == "load"
    assert limit.limit == pytest.approx(2 / (0.01 * 0.8 * 0.123))
    # The exclusive engine: one 27 ms fixed part per Reset call, 0.001 calls per valid transition.
    assert limit.bounds["engine"] == pytest.approx(2 / (0.001 * 0.027))
    # Every map cached: nothing to load, the step bound holds.
    assert pattern_limit(CALIBRATED, _pattern(hit_rate=1.0)).binding == "step"


def test_engine_bound_binds_when_every_slot_resets_alone() -> None:
    # Per-slot resets: a Reset call per slot reset, and resets often (short episodes).
    limit = pattern_limit(CALIBRATED, _pattern(resets_per_valid=0.05, reset_calls_per_valid=0.05, hit_rate=0.9))
    assert limit.binding == "engine" and limit.limit == pytest.approx(2 / (0.05 * 0.027))


def test_resets_that_queue_for_nothing_still_keep_their_slot_from_stepping() -> None:
    # parallel: a slot's own reset (27 ms + 80% of 123 ms) adds to its stepping, per valid transition.
    limit = pattern_limit(PARALLEL, _pattern())
    per_slot = 0.002 / 0.8 + 0.01 * (0.027 + 0.8 * 0.123)
    assert limit.binding == "slot" and limit.limit == pytest.approx(10 / per_slot)
    assert "load" not in limit.bounds and "engine" not in limit.bounds


def test_resets_that_stop_steps_add_the_engine_time_to_the_step_time() -> None:
    # vectorized: a server does not step during its fixed parts, so per valid transition the wall
    # time is the step share 0.002 / (0.8 * 10) plus the fixed-part share 0.05 * 0.027 / 2.
    vectorized = costs_from_describe(PRESETS["vectorized"])
    assert vectorized.reset_blocks_steps and not CALIBRATED.reset_blocks_steps
    pattern = _pattern(resets_per_valid=0.05, reset_calls_per_valid=0.05, hit_rate=1.0)
    limit = pattern_limit(vectorized, pattern)
    assert limit.binding == "step+engine"
    assert limit.limit == pytest.approx(1 / (0.002 / (0.8 * 10) + 0.05 * 0.027 / 2))
    assert limit.limit == pytest.approx(1 / (1 / limit.bounds["step"] + 1 / limit.bounds["engine"]))
    # The same pattern under calibrated: steps go on during fixed parts, the engine alone binds.
    assert "step+engine" not in pattern_limit(CALIBRATED, pattern).bounds
    # Fixed parts that do not queue may overlap one another: no sum of them bounds the steps.
    overlapping = Costs(0.027, reset_fixed_exclusive=False, map_load_shared=False, reset_blocks_steps=True)
    assert "step+engine" not in pattern_limit(overlapping, pattern).bounds


def _line(**calls) -> dict:
    """A broker's metrics.jsonl line (broker/run.py) of 800 valid transitions in 1,000 over 10 slots."""
    counts = dict(step_calls=200, step_server_s=0.4, reset_calls=1, reset_slots=8, map_loads=2, map_cache_hits=6)
    return {"num_slots": 10, "validity": 0.8, "valid_transitions": 800, "pool_calls": {**counts, **calls}}


def test_a_runs_metrics_line_gives_the_limit_of_the_pattern_it_sampled() -> None:
    # 200 Step calls (100 rows over 2 servers) took 0.4 s of server time: 2 ms a call; 8 resets of which
    # 2 loaded their map, in one Reset call per 800 valid transitions.
    got = line_limit(_line(), CALIBRATED, servers=2)
    want = pattern_limit(CALIBRATED, _pattern(resets_per_valid=0.01, reset_calls_per_valid=1 / 800, hit_rate=0.75))
    assert got == want and got.bounds["step"] == pytest.approx(4000.0)
    assert line_limit(_line(map_loads=0, map_cache_hits=0), CALIBRATED, 2) == pattern_limit(
        CALIBRATED, _pattern(resets_per_valid=0.01, reset_calls_per_valid=1 / 800, hit_rate=0.0)
    )  # servers that count no map: every reset loads (as `fast bench sampling` takes it)
    assert line_limit({k: v for k, v in _line().items() if k != "pool_calls"}, CALIBRATED, 2) is None  # older runs
    assert line_limit(_line(step_calls=0), CALIBRATED, 2) is None
    # A line edited by hand counts as an older one: no limit, no traceback.
    assert line_limit({**_line(), "pool_calls": {"step_calls": 3}}, CALIBRATED, 2) is None
    assert line_limit(_line(map_loads="many"), CALIBRATED, 2) is None
    assert line_limit({**_line(), "num_slots": None}, CALIBRATED, 2) is None


def test_no_costs_and_no_latency_leave_no_finite_bound() -> None:
    limit = pattern_limit(costs_from_describe(None), _pattern(step_latency_s=0.0))
    assert math.isinf(limit.limit)


def test_prefetch_targets_set_fast_against_the_best_other_mode_of_its_configuration() -> None:
    from benchmarks.prefetch_targets import targets

    def row(mode, eff, clips=10, policy="random"):
        return {"preset": "calibrated", "policy": policy, "mode": mode, "clips": clips, "effective_throughput": eff,
                "speedup_vs_sc": eff / 100, "limit": 2000.0, "limit_binding": "load", "limit_share": eff / 2000,
                "best_limit_share": eff / 2500, "time_efficiency": 0.8, "cache_hit_rate": 0.9}  # fmt: skip

    rows = [row("sc", 100, clips=1), row("fast", 400), row("fast+locality", 900), row("fast+prefetch+locality", 1200)]
    rows += [row("ver+prefetch", 600), row("autoreset+locality", 500), row("ver", 700, policy="trained")]
    (found,) = targets(rows)
    assert found["best_other"] == "ver+prefetch" and found["vs_best_other"] == pytest.approx(2.0)
    assert found["vs_sc"] == 12.0 and found["plain_fast_vs_sc"] == 4.0 and found["share_of_limit"] == 0.6


def test_carry_targets_set_carry_against_reset_the_best_other_mode_and_sc_lengths() -> None:
    from benchmarks.carry_targets import targets, verdicts

    def row(mode, eff, preset="vectorized", clips=10, resets=20.0, length_vs_sc=0.8):
        return {"preset": preset, "policy": "random", "mode": mode, "clips": clips, "effective_throughput": eff,
                "episode_length_vs_sc": length_vs_sc, "slot_resets_per_1k_valid": resets, "validity": 0.9,
                "limit": 3000.0, "limit_binding": "step+engine", "limit_share": eff / 3000}  # fmt: skip

    rows = [row("sc+prefetch+locality", 100, clips=1), row("fast+carry+prefetch+locality", 1400, resets=21.0)]
    rows += [row("fast+reset+prefetch+locality", 900, resets=45.0), row("ver+prefetch+locality", 1000)]
    steady = [{"policy": "random", "mode": "fast+carry", "clips": 10, "mean_vs_sc": 0.97}]
    (found,) = targets({"rows": rows, "episode_length": steady})
    assert found["best_other"] == "ver+prefetch+locality" and found["vs_best_other"] == pytest.approx(1.4)
    assert found["vs_reset"] == pytest.approx(1400 / 900) and found["resets_vs_ver"] == pytest.approx(1.05)
    assert found["length_vs_sc_steady"] == 0.97 and found["length_vs_sc_window"] == 0.8
    said = "\n".join(verdicts([found]))
    assert "vectorized: carry >= 1.3x the best other mode: 1 of 1 rows" in said
    assert "calibrated, 30 clips: carry >= 1.0x the best other mode: 0 of 0 rows" in said
    assert "within 10% of VER's: 1 of 1 rows" in said
