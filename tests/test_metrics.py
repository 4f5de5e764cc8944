"""broker/metrics.py: several iterations summarised as one (`combined`), as the advisor's validation
and the ranking benchmark measure a row (jobs/bench/harness.py `timed_iterations`)."""

from __future__ import annotations

import json

import pytest

from broker.metrics import IterationStats, combined


def _iteration(wall_s: float, valid: int, transitions: int, lengths: list[int], cause: str) -> IterationStats:
    stats = IterationStats("fast", 4, wall_s=wall_s, valid=valid, transitions=transitions, slot_resets=len(lengths))
    for length in lengths:
        stats.record_episode(length, cause)
    stats.closed_loop["progress"].append(float(valid))
    return stats


def test_combined_iterations_rate_over_their_summed_wall_not_the_mean_of_rates() -> None:
    fast, slow = _iteration(0.1, 1000, 1100, [5, 7], "terminated"), _iteration(0.9, 1000, 1000, [9], "cut")
    both = combined([fast, slow]).summary()
    # 2,000 valid in 1.0 s: 2,000/s, where the mean of the two rates (10,000 and 1,111) is 5,556.
    assert both["effective_throughput"] == pytest.approx(2000.0)
    assert both["validity"] == pytest.approx(2000 / 2100)
    assert both["episode_lengths"] == [5, 7, 9] and both["episode_ends"] == {"terminated": 2, "cut": 1}
    assert both["slot_resets_per_1k_valid"] == pytest.approx(1.5)
    assert both["closed_loop"] == {"progress": pytest.approx(1000.0)}
    assert combined([fast, slow]).episode_censored == [False, False, True]


def test_combined_one_iteration_summarises_as_itself() -> None:
    one = _iteration(0.25, 512, 600, [3, 4, 8], "terminated")
    # (as JSON: no episode returned a summary, so both return means are NaN, which equals nothing)
    assert json.dumps(combined([one]).summary()) == json.dumps(one.summary())


def test_combined_leaves_its_inputs_alone_and_refuses_none() -> None:
    a, b = _iteration(0.1, 10, 10, [2], "terminated"), _iteration(0.2, 20, 20, [3], "terminated")
    combined([a, b])
    assert a.episode_lengths == [2] and a.episode_ends == {"terminated": 1} and a.valid == 10
    with pytest.raises(ValueError, match="at least one"):
        combined([])
