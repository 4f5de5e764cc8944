"""The pure rules of benchmarks/broker_capacity.py: the saturation point, the grid, how the brokers'
metrics lines of one iteration combine, and the cores read off a CPU trace. No process is started."""

from __future__ import annotations

import math

import pytest

from benchmarks.broker_capacity import (
    CpuTrace,
    by_iteration,
    check_doubling,
    collection_window,
    combine,
    parser,
    saturation_point,
    scaling_verdict,
    step_latency_s,
)


@pytest.mark.parametrize(
    ("throughputs", "expected"),
    [
        # Doubling, doubling, then +5% and +2%: saturated at 32.
        ([1000, 2000, 4000, 4200, 4284], 32),
        # A first doubling that gains little but growth after it: not saturated there.
        ([1000, 1050, 2000, 2050, 2060], 32),
        # Still growing 10% or more at the last doubling: no saturation inside the grid.
        ([1000, 2000, 3000, 3500, 3900], None),
        # Throughput that falls past the peak is saturated at the peak's slot count.
        ([1000, 2000, 3000, 2500, 2000], 32),
        # Flat from the start.
        ([1000, 1000, 1000, 1000, 1000], 8),
    ],
)
def test_saturation_point_smallest_past_which_doublings_gain_little(throughputs, expected):
    grid = [8, 16, 32, 64, 128]
    assert saturation_point(list(zip(grid, throughputs))) == expected


def test_saturation_point_gain_exactly_the_threshold_is_growth():
    assert saturation_point([(8, 1000.0), (16, 1100.0)], min_gain=0.10) is None
    assert saturation_point([(8, 1000.0), (16, 1099.0)], min_gain=0.10) == 8


def test_saturation_point_reads_points_in_any_order():
    assert saturation_point([(32, 4200.0), (8, 1000.0), (16, 4000.0)]) == 16


@pytest.mark.parametrize("grid", [[8], [8, 24], [8, 16, 24], [0, 0], []])
def test_check_doubling_refuses_other_grids(grid):
    with pytest.raises(ValueError, match="each double the one before"):
        check_doubling(grid)


def test_parse_grid_flag_refuses_a_grid_that_does_not_double(capsys):
    with pytest.raises(SystemExit):
        parser().parse_args(["--out", "x", "--grid", "8,16,24"])
    assert "--grid" in capsys.readouterr().err
    assert parser().parse_args(["--out", "x", "--grid", "8,16,32"]).grid == [8, 16, 32]


def _line(iteration, end, iteration_s, sampling_s, valid, transitions, slots, stepping_s):
    return {
        "iteration": iteration,
        "time": end,
        "iteration_time_s": iteration_s,
        "sampling_time_s": sampling_s,
        "valid_transitions": valid,
        "transitions": transitions,
        "num_slots": slots,
        "time_split_s": {"stepping": stepping_s},
    }


def test_collection_window_ends_sampling_time_after_the_iteration_began():
    # Written at t=110 after a 10 s iteration, 4 s of which sampling: collection from 100 to 104.
    assert collection_window(_line(1, 110.0, 10.0, 4.0, 1, 1, 1, 0.1)) == (100.0, 104.0)


def test_step_latency_is_stepping_time_per_lock_step_step():
    # 16 slots, 1600 transitions: 100 lock-step steps, 0.9 s stepping -> 9 ms a step.
    assert step_latency_s(_line(1, 0.0, 1.0, 1.0, 1200, 1600, 16, 0.9)) == pytest.approx(0.009)


def test_combine_counts_every_brokers_valid_over_the_span_of_their_windows():
    a = _line(3, 104.0, 4.0, 2.0, 1000, 1600, 16, 0.8)  # collects 100..102, 8 ms a step
    b = _line(3, 104.5, 4.0, 2.0, 1000, 1600, 16, 0.8)  # collects 100.5..102.5
    it = combine([a, b])
    assert it["span_s"] == pytest.approx(2.5)
    assert it["effective"] == pytest.approx(2000 / 2.5)
    assert it["raw"] == pytest.approx(3200 / 2.5)
    assert it["ideal"] == pytest.approx(2 * 16 / 0.008)
    assert it["validity"] == pytest.approx(2000 / 3200)


def test_combine_one_broker_is_its_own_effective_throughput():
    line = _line(1, 10.0, 3.0, 2.0, 900, 1000, 10, 0.5)
    assert combine([line])["effective"] == pytest.approx(900 / 2.0)


def test_by_iteration_keeps_iterations_every_broker_finished_past_the_warmup():
    a = [_line(i, 10.0 * i, 3.0, 2.0, 100, 100, 1, 0.1) for i in (1, 2, 3, 4)]
    b = [_line(i, 10.0 * i, 3.0, 2.0, 100, 100, 1, 0.1) for i in (1, 2, 3)]
    assert [it["iteration"] for it in by_iteration([a, b], skip=1)] == [2, 3]


def test_cpu_trace_cores_interpolates_between_samples():
    trace = CpuTrace()
    trace.add(0.0, {"broker": 0.0})
    trace.add(1.0, {"broker": 0.5, "sim-server": 1.0})  # a role that appears later starts from 0
    trace.add(2.0, {"broker": 1.5, "sim-server": 1.0})
    assert trace.cores("broker", 0.5, 1.5) == pytest.approx((1.0 - 0.25) / 1.0)
    assert trace.cores("sim-server", 0.0, 2.0) == pytest.approx(0.5)
    assert math.isnan(trace.cores("broker", 1.0, 3.0))  # past the trace
    assert math.isnan(trace.cores("learner", 0.0, 1.0))


@pytest.mark.parametrize(
    ("one_pair_cores", "cores", "limit"),
    [(0.5, 2, 2.0), (1.6, 2, 1.25), (1.6, 16, 2.0)],
)
def test_scaling_verdict_sets_the_ratio_beside_the_cores(one_pair_cores, cores, limit):
    one = {"effective": 1000.0, "cores_total": one_pair_cores}
    two = {"effective": 1800.0}
    verdict = scaling_verdict(one, two, cores)
    assert verdict == {"ratio": pytest.approx(1.8), "physical_limit": pytest.approx(limit), "target": 1.7, "met": True}
