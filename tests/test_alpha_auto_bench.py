"""benchmarks/alpha_auto.py: how its rows combine into the verdict (pure), the broker's feed of the
chooser that it shares, and one tiny real run on sim-server processes."""

from __future__ import annotations

import json

import pytest

from benchmarks.alpha_auto import AUTO, main, parser, summarise
from broker.advisor.auto_alpha import AutoAlpha, IterationCosts
from broker.metrics import IterationStats


def _row(label: str, throughput: float, repeat: int = 0, choices=()) -> dict:
    return {
        "preset": "calibrated",
        "policy": "random",
        "clips": 10,
        "row": label,
        "repeat": repeat,
        "effective_throughput": throughput,
        "limit": 2 * throughput,
        "validity": 0.9,
        "choices": [{"alpha": a} for a in choices],
    }


def test_summary_takes_medians_over_repeats_and_compares_auto_with_the_best_fixed_alpha():
    rows = [
        _row("alpha=0.1", 900.0, 0),
        _row("alpha=0.1", 1100.0, 1),  # median 1000
        _row("alpha=0.5", 1200.0, 0),
        _row("alpha=0.5", 1300.0, 1),
        _row("alpha=0.5", 1250.0, 2),  # median 1250: the best fixed
        _row(AUTO, 1150.0, 0, choices=(0.5, 0.4)),
        _row(AUTO, 1200.0, 1, choices=(0.4,)),
    ]
    (summary,) = summarise(rows)
    assert summary["best_fixed"] == "alpha=0.5"
    assert summary["rows"]["alpha=0.5"]["effective_throughput"] == 1250.0
    assert summary["rows"]["alpha=0.1"]["spread"] == [900.0, 1100.0]
    assert summary["auto_vs_best"] == pytest.approx(1175.0 / 1250.0)
    assert summary["auto_alphas"] == [0.4, 0.5] and summary["auto_alpha_median"] == 0.4


def test_summary_keeps_configurations_apart():
    rows = [_row("alpha=0.5", 1000.0), _row(AUTO, 990.0)]
    other = [{**r, "preset": "parallel", "effective_throughput": r["effective_throughput"] * 2} for r in rows]
    summaries = summarise(rows + other)
    assert [(s["preset"], s["auto_vs_best"]) for s in summaries] == [
        ("calibrated", pytest.approx(0.99)),
        ("parallel", pytest.approx(0.99)),
    ]


def test_observe_iteration_feeds_the_chooser_as_observe_does():
    stats = IterationStats(mode="fast", num_slots=4, wall_s=2.0, reset_wall_s=0.5, inference_s=0.2, transitions=400)
    for length, cause in ((30, "terminated"), (50, "cut"), (12, "clip_end")):
        stats.record_episode(length, cause)
    stats.running_lengths = [7, 9]
    stats.round_resets = [(2, 0.2), (4, 0.3)]
    fed, by_hand = (AutoAlpha(0.1, 1.0, 2, 2, 200, 2048) for _ in range(2))
    fed.observe_iteration(stats)
    by_hand.observe(
        IterationCosts(rows=100, wall_s=2.0, reset_wall_s=0.5, inference_s=0.2, round_resets=((2, 0.2), (4, 0.3))),
        [(30, False), (50, True), (12, False)],
        [7, 9],
    )
    assert fed.measured_costs() == by_hand.measured_costs()
    assert fed.lengths()[1:] == by_hand.lengths()[1:] == (5, 3)  # 3 ended (1 cut) + 2 running, censored


def test_bad_options_name_the_flag():
    with pytest.raises(SystemExit):
        parser().parse_args(["--out", "x", "--presets", "turbo"])
    with pytest.raises(SystemExit):
        parser().parse_args(["--out", "x", "--alphas", "0.5,1.5"])


@pytest.mark.slow
def test_a_tiny_run_measures_every_row_and_auto_chooses_by_the_model(tmp_path):
    out = tmp_path / "alpha"
    result = main(
        ["--presets", "off", "--clips", "4", "--iterations", "2", "--repeats", "1", "--alphas", "0.5,1"]
        + ["--samples", "128", "--out", str(out)]
    )
    saved = json.loads((out / "alpha.json").read_text())
    assert saved["summary"] == json.loads(json.dumps(result["summary"]))
    assert sorted(r["row"] for r in saved["rows"]) == ["alpha=0.5", "alpha=1", "auto"]
    for row in saved["rows"]:
        assert len(row["iterations"]) == 2 and all(i["valid"] >= 128 for i in row["iterations"])
        assert row["effective_throughput"] > 0 and row["limit"] > 0
    auto = next(r for r in saved["rows"] if r["row"] == AUTO)
    # The warm-up ran at the prior; each measured iteration's alpha is the model's choice, from what came before.
    assert [c["source"] for c in auto["choices"]] == ["model", "model"]
    assert [i["alpha"] for i in auto["iterations"]] == [c["alpha"] for c in auto["choices"]]
    (summary,) = saved["summary"]
    assert summary["best_fixed"] in ("alpha=0.5", "alpha=1") and summary["auto_vs_best"] > 0
    assert "| off | random | 4 |" in (out / "alpha.md").read_text()
