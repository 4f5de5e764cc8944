"""benchmarks/advisor_ranking.py: its verdicts on scripted numbers (rank comparison, Kendall's tau
against a count of adjacent swaps, the within-noise rule, the top-two check, the summary and its
counts), bad options, and one tiny real run on sim-server processes."""

from __future__ import annotations

import asyncio
import json
import re

import numpy as np
import pytest

import benchmarks.advisor_ranking as ranking
from benchmarks.advisor_ranking import (
    compare,
    kendall_tau,
    main,
    parser,
    repeats_exact,
    repeats_tau,
    report,
    settled,
    summarise,
    swapped_pairs,
    targets,
    validated_top1,
    within_noise,
)

MODES = ("sc", "autoreset", "sgr", "ver", "fast+carry", "fast+reset")


def _tau_by_swaps(a: dict[str, float], b: dict[str, float]) -> float:
    """Slow reference without ties: bubble-sort b's order into a's, counting swaps; tau = 1 - 4 swaps / (n (n-1))."""
    target = sorted(a, key=lambda k: -a[k])
    current = sorted(b, key=lambda k: -b[k])
    swaps = 0
    for _ in range(len(current)):
        for i in range(len(current) - 1):
            if target.index(current[i]) > target.index(current[i + 1]):
                current[i], current[i + 1] = current[i + 1], current[i]
                swaps += 1
    n = len(a)
    return 1 - 4 * swaps / (n * (n - 1))


# -- Kendall's tau --------------------------------------------------------------------------------------


def test_kendall_tau_is_one_for_the_same_order_and_minus_one_reversed():
    a = dict(zip(MODES, (6.0, 5.0, 4.0, 3.0, 2.0, 1.0)))
    assert kendall_tau(a, {k: 10 * v for k, v in a.items()}) == 1.0
    assert kendall_tau(a, {k: -v for k, v in a.items()}) == -1.0
    one_swap = {**a, "sc": 5.0, "autoreset": 6.0}
    assert kendall_tau(a, one_swap) == pytest.approx(13 / 15)


@pytest.mark.parametrize("seed", range(8))
def test_kendall_tau_matches_a_count_of_adjacent_swaps(seed):
    rng = np.random.default_rng(seed)
    a = dict(zip(MODES, rng.permutation(6).astype(float)))
    b = dict(zip(MODES, rng.permutation(6).astype(float)))
    assert kendall_tau(a, b) == pytest.approx(_tau_by_swaps(a, b))


def test_kendall_tau_counts_a_tie_as_neither():
    a = {"x": 3.0, "y": 2.0, "z": 1.0}
    b = {"x": 3.0, "y": 3.0, "z": 1.0}  # x-y tied: 0; x-z and y-z concordant
    assert kendall_tau(a, b) == pytest.approx(2 / 3)


# -- the verdicts ---------------------------------------------------------------------------------------


def test_within_noise_is_ten_percent_of_the_larger():
    assert within_noise(100.0, 90.0) and within_noise(90.0, 100.0)
    assert not within_noise(100.0, 89.9)


def test_compare_a_ranking_measured_as_predicted():
    predicted = {"ver": 1000.0, "fast+carry": 900.0, "sc": 100.0}
    measured = {"ver": 1100.0, "fast+carry": 800.0, "sc": 90.0}
    verdict = compare(predicted, measured)
    assert verdict["predicted_order"] == verdict["measured_order"] == ["ver", "fast+carry", "sc"]
    assert verdict["exact"] and verdict["within_noise"] and verdict["top1"]
    assert verdict["kendall_tau"] == 1.0 and verdict["swapped"] == []
    # |1000 - 1100| <= 0.2 x 1100 and |900 - 800| <= 0.2 x 800
    assert verdict["top_two"]
    assert verdict["top_two_ratios"] == {"ver": pytest.approx(1.1), "fast+carry": pytest.approx(800 / 900)}


def test_compare_a_swap_within_noise_keeps_the_noise_verdict_only():
    predicted = {"ver": 1000.0, "fast+carry": 900.0, "sc": 100.0}
    measured = {"ver": 950.0, "fast+carry": 1000.0, "sc": 100.0}  # 950 is within 10% of 1000
    verdict = compare(predicted, measured)
    assert verdict["swapped"] == [["ver", "fast+carry"]]
    assert not verdict["exact"] and verdict["within_noise"] and not verdict["top1"]
    assert verdict["kendall_tau"] == pytest.approx(1 / 3)


def test_compare_a_swap_beyond_noise_misses_both_ranking_verdicts():
    predicted = {"ver": 1000.0, "fast+carry": 900.0, "sc": 100.0}
    measured = {"ver": 850.0, "fast+carry": 1000.0, "sc": 100.0}
    verdict = compare(predicted, measured)
    assert not verdict["exact"] and not verdict["within_noise"]


def test_compare_a_far_swap_counts_even_when_neighbours_are_close():
    # The model puts sc first, measured last: both its pairs are swapped, the far one (sc-ver) too;
    # measured 920 is within 10% of 1000 (noise), 880 is not.
    predicted = {"sc": 3.0, "ver": 2.0, "fast+carry": 1.0}
    verdict = compare(predicted, {"ver": 1000.0, "fast+carry": 950.0, "sc": 920.0})
    assert sorted(map(tuple, verdict["swapped"])) == [("sc", "fast+carry"), ("sc", "ver")]
    assert verdict["within_noise"]
    verdict = compare(predicted, {"ver": 1000.0, "fast+carry": 950.0, "sc": 880.0})  # sc-ver 12% apart
    assert not verdict["within_noise"]


@pytest.mark.parametrize(
    ("predicted", "measured", "within"),
    [
        (120.0, 100.0, True),  # |120 - 100| = 0.20 x 100
        (80.0, 100.0, True),
        (121.0, 100.0, False),
        (79.0, 100.0, False),
    ],
)
def test_top_two_is_predicted_within_twenty_percent_of_measured(predicted, measured, within):
    verdict = compare({"a": predicted, "b": 10.0, "c": 1.0}, {"a": measured, "b": 10.0, "c": 1.0})
    assert verdict["top_two"] is within


def test_a_pair_is_settled_when_every_repeat_of_one_is_above_every_repeat_of_the_other():
    assert settled([10.0, 11.0, 12.0], [7.0, 8.0, 9.0]) and settled([7.0, 9.0], [10.0, 12.0])
    assert not settled([10.0, 11.0, 12.0], [9.0, 8.0, 10.5])  # 10.5 above 10: the ranges overlap
    assert not settled([10.0], [10.0])  # a tie settles nothing


def test_a_swap_measurement_does_not_settle_keeps_the_settled_verdict():
    predicted = {"ver": 1000.0, "fast+carry": 900.0, "sc": 100.0}
    medians = {"ver": 800.0, "fast+carry": 1000.0, "sc": 100.0}  # swapped, 20% apart: beyond noise
    overlapping = {"ver": [700.0, 800.0, 1050.0], "fast+carry": [750.0, 1000.0, 1100.0], "sc": [90.0, 100.0, 110.0]}
    verdict = compare(predicted, medians, overlapping)
    assert not verdict["within_noise"] and verdict["settled"] and verdict["unsettled_pairs"] == 1
    apart = {**overlapping, "ver": [700.0, 720.0, 740.0]}  # every ver repeat below every fast+carry one
    verdict = compare(predicted, medians, apart)
    assert not verdict["settled"] and verdict["unsettled_pairs"] == 0
    # Without repeats the medians are all there is: every pair is settled and the verdict is `exact`'s.
    assert compare(predicted, medians)["settled"] is False
    assert compare(predicted, {"ver": 1100.0, "fast+carry": 800.0, "sc": 90.0})["settled"] is True


def test_repeats_tau_is_the_mean_agreement_of_every_two_repeats():
    runs = {"a": [3.0, 3.0, 1.0], "b": [2.0, 2.0, 2.0], "c": [1.0, 1.0, 3.0]}  # repeat 2 reverses 0 and 1
    # (0,1): 1; (0,2): -1; (1,2): -1
    assert repeats_tau(runs) == pytest.approx(-1 / 3)
    assert repeats_tau({"a": [1.0], "b": [2.0]}) is None


def test_repeats_exact_counts_the_pairs_of_repeats_in_the_same_order_beside_the_predicted_order_per_repeat():
    runs = {"a": [3.0, 3.0, 1.0], "b": [2.0, 2.0, 2.0], "c": [1.0, 1.0, 3.0]}  # repeat 2 reverses 0 and 1
    assert repeats_exact(runs) == pytest.approx(1 / 3)  # (0,1) alike; (0,2) and (1,2) not
    assert repeats_exact({"a": [1.0], "b": [2.0]}) is None
    medians = {k: float(np.median(r)) for k, r in runs.items()}
    verdicts = compare({"a": 3.0, "b": 2.0, "c": 1.0}, medians, runs)
    assert verdicts["exact"] and verdicts["repeats_exact"] == pytest.approx(1 / 3)
    assert verdicts["exact_per_repeat"] == pytest.approx(2 / 3)  # the predicted order is repeats 0 and 1's


def test_validated_top1_is_fast_advises_pick_from_each_repeat_against_the_measured_first():
    order = ["a", "b", "c"]
    # Repeat 0: b 5% above a (within the margin: a, wrong); 1: b 20% above (b, right); 2: a above (a, wrong).
    runs = {"a": [100.0, 100.0, 130.0], "b": [105.0, 120.0, 110.0], "c": [50.0, 50.0, 50.0]}
    assert validated_top1(order, ["b", "a", "c"], runs) == pytest.approx(1 / 3)
    assert validated_top1(order, ["a", "b", "c"], runs) == pytest.approx(2 / 3)
    assert validated_top1(order, ["c", "a", "b"], runs) == 0.0  # the third is never validated
    assert validated_top1(order, ["a", "b", "c"], {"a": [1.0], "b": [1.0, 5.0], "c": [0.0]}) == 1.0  # one repeat of a


def test_swapped_pairs_name_the_model_first():
    assert swapped_pairs({"x": 2.0, "y": 1.0}, {"x": 1.0, "y": 2.0}) == [("x", "y")]
    assert swapped_pairs({"x": 1.0, "y": 2.0}, {"x": 2.0, "y": 1.0}) == [("y", "x")]


def test_compare_refuses_different_modes():
    with pytest.raises(ValueError, match="different modes"):
        compare({"ver": 1.0}, {"sc": 1.0})


# -- the summary ----------------------------------------------------------------------------------------


def _advice(preset: str, predicted: dict[str, float]) -> dict:
    rows = []
    for label, figure in sorted(predicted.items(), key=lambda kv: -kv[1]):
        mode, _, truncation = label.partition("+")
        settings = {"mode": mode, "truncation": truncation or "carry", "prefetch": True, "locality": False}
        rows.append({"label": f"{label}+prefetch", "settings": settings, "effective_throughput": figure})
    return {"preset": preset, "policy": "random", "clips": 10, "rows": rows}


def _measured(preset: str, label: str, figures: list[float]) -> list[dict]:
    return [
        {"preset": preset, "policy": "random", "clips": 10, "mode": label, "repeat": r, "effective_throughput": f}
        for r, f in enumerate(figures)
    ]


def test_summary_takes_medians_ranks_each_mode_and_counts_the_targets():
    advice = [
        _advice("calibrated", {"fast+carry": 1000.0, "ver": 900.0, "sc": 100.0}),
        _advice("parallel", {"fast+carry": 1000.0, "ver": 900.0, "sc": 100.0}),
    ]
    measurements = (
        _measured("calibrated", "fast+carry", [900.0, 1000.0, 950.0])  # median 950
        + _measured("calibrated", "ver", [800.0, 850.0])  # median 825
        + _measured("calibrated", "sc", [100.0])
        + _measured("parallel", "fast+carry", [500.0])
        + _measured("parallel", "ver", [1000.0])  # swapped, 50% apart
        + _measured("parallel", "sc", [100.0])
    )
    calibrated, parallel = summarise(advice, measurements)
    fast = calibrated["modes"]["fast+carry"]
    assert fast["measured"] == 950.0 and fast["spread"] == [900.0, 1000.0] and fast["repeats"] == 3
    assert fast["ratio"] == pytest.approx(0.95) and fast["variant"] == "fast+carry+prefetch"
    assert calibrated["exact"] and calibrated["top_two"]
    assert parallel["modes"]["ver"]["predicted_rank"] == 2 and parallel["modes"]["ver"]["measured_rank"] == 1
    assert not parallel["exact"] and not parallel["within_noise"] and not parallel["top1"]
    assert not parallel["top_two"]  # fast+carry: |1000 - 500| > 0.2 x 500
    counts = targets([calibrated, parallel])
    assert counts == {name: {"met": 1, "missed": 1} for name in ("exact", "within_noise", "settled", "top1", "top_two")}

    result = {"config": {"samples": 1024, "repeats": 3, "servers": 2}, "summary": [calibrated, parallel]}
    text = report(json.loads(json.dumps(result)))
    assert "| parallel | random | 10 | fast+carry > ver > sc | ver > fast+carry > sc | no | no |" in text
    assert text.rstrip().splitlines()[-6:] == [
        "- ranking exact: met in 1, missed in 1",
        "- ranking within noise (10%): met in 1, missed in 1",
        "- every pair measurement settles in the predicted order: met in 1, missed in 1",
        "- predicted top-1 is the measured top-1: met in 1, missed in 1",
        "- top two predicted within 20% of measured: met in 1, missed in 1",
        # parallel: ver, measured twice fast+carry's, is what fast advise's validation recommends.
        "- `fast advise`'s recommendation (its top two validated by one repeat's figures: the second only if more "
        "than 10% faster) is the measured first: in 2.0 of 2 on average over the repeats (the model's first alone: 1)",
    ]
    # sc was measured once in each: no two repeats of every mode to compare.
    assert calibrated["repeats_tau"] is None and parallel["repeats_tau"] is None


def test_the_per_mode_table_puts_predicted_and_measured_resets_side_by_side():
    """A miss in the episodes drawn shows as resets that differ; a record without them (older runs) as '-'."""
    advice = _advice("vectorized", {"fast+reset": 2800.0, "ver": 2900.0})
    advice["rows"][1]["slot_resets_per_1k_valid"] = 12.04  # fast+reset, second best
    measurements = _measured("vectorized", "ver", [2600.0]) + [
        {**m, "slot_resets_per_1k_valid": r}
        for m, r in zip(_measured("vectorized", "fast+reset", [2300.0, 2400.0, 2350.0]), (17.9, 17.6, 17.8))
    ]
    (summary,) = summarise([advice], measurements)
    assert summary["modes"]["fast+reset"]["resets_predicted"] == 12.04
    assert summary["modes"]["fast+reset"]["resets_measured"] == 17.8
    assert summary["modes"]["ver"]["resets_predicted"] is None and summary["modes"]["ver"]["resets_measured"] is None
    text = report(
        json.loads(json.dumps({"config": {"samples": 1024, "repeats": 3, "servers": 2}, "summary": [summary]}))
    )
    assert (
        "| vectorized | random | 10 | fast+reset | fast+reset+prefetch | 2800 | 2350 [2300-2400] | - | 0.84 | 2 | 2 | "
        "12.0 / 17.8 |" in text
    )
    assert (
        "| vectorized | random | 10 | ver | ver+prefetch | 2900 | 2600 [2600-2600] | - | 0.90 | 1 | 1 | - / - |" in text
    )


def test_rescore_recomputes_the_verdicts_of_a_saved_run_without_measuring(tmp_path):
    advice = [_advice("parallel", {"fast+carry": 1000.0, "ver": 900.0, "sc": 100.0})]
    measurements = (
        _measured("parallel", "fast+carry", [500.0, 520.0])
        + _measured("parallel", "ver", [1000.0, 990.0])
        + _measured("parallel", "sc", [100.0, 90.0])
    )
    stale = {"config": {"samples": 1024, "repeats": 2, "servers": 2}, "advice": advice, "measurements": measurements}
    saved = tmp_path / "old" / "ranking.json"
    saved.parent.mkdir()
    saved.write_text(json.dumps({**stale, "summary": [{"made by": "an older version"}]}))
    result = main(["--rescore", str(saved), "--out", str(tmp_path / "new")])
    (summary,) = result["summary"]
    assert summary["settled"] is False and summary["measured_order"] == ["ver", "fast+carry", "sc"]
    assert result["measurements"] == measurements and result["rescored_from"] == str(saved)
    text = (tmp_path / "new" / "ranking.md").read_text()
    assert f"Verdicts recomputed from the measurements of {saved}" in text
    assert json.loads((tmp_path / "new" / "ranking.json").read_text())["summary"] == [summary]


def test_repredict_refuses_a_run_measured_without_its_model_inputs(tmp_path, capsys):
    advice = [_advice("parallel", {"fast+carry": 1000.0, "ver": 900.0, "sc": 100.0})]
    measurements = _measured("parallel", "ver", [1000.0])
    saved = tmp_path / "ranking.json"
    saved.write_text(json.dumps({"config": {}, "advice": advice, "measurements": measurements}))
    with pytest.raises(SystemExit) as exited:
        main(["--repredict", str(saved), "--out", str(tmp_path / "new")])
    assert exited.value.code == 2
    assert re.search("argument --repredict: .* no model_inputs .* use --rescore", capsys.readouterr().err)
    assert not (tmp_path / "new").exists()  # nothing written


def test_rescore_and_repredict_together_are_refused(tmp_path, capsys):
    saved = tmp_path / "ranking.json"
    saved.write_text(json.dumps({"config": {}, "advice": [], "measurements": []}))
    with pytest.raises(SystemExit) as exited:
        main(["--repredict", str(saved), "--rescore", str(saved), "--out", str(tmp_path / "new")])
    assert exited.value.code == 2 and "not both" in capsys.readouterr().err


@pytest.mark.parametrize("content", ["not json", "[1, 2]", '{"config": {}}'])
def test_rescore_refuses_what_is_not_a_ranking_json(content, tmp_path, capsys):
    path = tmp_path / "ranking.json"
    path.write_text(content)
    with pytest.raises(SystemExit) as exited:
        parser().parse_args(["--out", str(tmp_path), "--rescore", str(path)])
    assert exited.value.code == 2
    assert "argument --rescore" in capsys.readouterr().err


def test_summary_refuses_a_row_without_a_measurement():
    advice = [_advice("off", {"ver": 1.0, "sc": 0.5})]
    with pytest.raises(ValueError, match="sc has no measurement"):
        summarise(advice, _measured("off", "ver", [1.0]))


# -- options --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--presets", "turbo"], "--presets"),
        (["--clips", "10,0"], "--clips"),
        (["--clips", "ten"], "--clips"),
        (["--repeats", "0"], "--repeats"),
        (["--samples", "-5"], "--samples"),
        (["--servers", "65"], "--servers"),
        (["--seed", "-1"], "--seed"),
        (["--checkpoint", "/no/such/dir"], "--checkpoint"),
    ],
)
def test_bad_options_exit_2_naming_the_flag(argv, flag, capsys, tmp_path):
    with pytest.raises(SystemExit) as exited:
        parser().parse_args(["--out", str(tmp_path), *argv])
    assert exited.value.code == 2
    assert f"argument {flag}" in capsys.readouterr().err


def test_options_default_to_the_issues_grid():
    args = parser().parse_args(["--out", "x", "--clips", "30,10,10"])
    assert args.presets == ["off", "calibrated", "parallel", "vectorized"]
    assert args.clips == [10, 30] and args.repeats == 2 and args.servers == 2 and args.checkpoint is None


# -- what a repeat shuffles ------------------------------------------------------------------------------


def _repeat_calls(monkeypatch, interleave: str, repeats: int = 2, iterations: int = 3) -> list[tuple]:
    """The runs `_measure_repeat` asks for over `repeats` repeats of three rows: (row, iterations, seed)."""
    calls = []

    async def run_row(cfg, bench, pool, runner, row, clips, seed, iterations=None):
        calls.append((row["label"], iterations, seed))
        return (row["label"], seed)

    def runs_summary(runs, pool):
        assert len({label for label, _ in runs}) == 1  # one row's runs only
        return {
            "effective_throughput": 100.0 * len(runs),
            **dict.fromkeys(("validity", "slot_resets_per_1k_valid", "limit"), 1.0),
            **dict.fromkeys(("step_calls_per_valid", "step_latency_s"), 1.0),
            "time_split_s": {},
        }

    monkeypatch.setattr(ranking, "run_row", run_row)
    monkeypatch.setattr(ranking, "runs_summary", runs_summary)
    monkeypatch.setattr(ranking, "runner_for", lambda pool, hidden, weights, seed: None)
    args = parser().parse_args(["--out", "x", "--iterations", str(iterations), "--interleave", interleave])
    rows = [{"label": label, "effective_throughput": 1.0, "settings": {"mode": label}} for label in "abc"]
    plan = [("random", 10, row) for row in rows]
    rng = np.random.default_rng(0)
    records = []
    for repeat in range(repeats):
        records += asyncio.run(
            ranking._measure_repeat(args, "off", None, None, {"random": ((), None)}, plan, repeat, rng, lambda _: None)
        )
    assert sorted((m["mode"], m["repeat"]) for m in records) == sorted((x, r) for x in "abc" for r in range(repeats))
    return calls


def test_a_repeat_by_iteration_gives_every_row_its_turn_before_any_rows_next(monkeypatch):
    calls = _repeat_calls(monkeypatch, "iteration")
    assert len(calls) == 2 * 3 * 3 and all(iterations == 1 for _, iterations, _ in calls)
    for start in range(0, len(calls), 3):  # each round of turns holds every row once
        assert sorted(label for label, _, _ in calls[start : start + 3]) == ["a", "b", "c"]
    orders = {tuple(label for label, _, _ in calls[start : start + 3]) for start in range(0, len(calls), 3)}
    assert len(orders) > 1  # each round of turns shuffled anew
    # Each turn of a row deals from a seed of its own, the first turn's the one a whole run takes.
    for label in "abc":
        seeds = [seed for row, _, seed in calls if row == label]
        assert len(set(seeds)) == len(seeds) and {0, 1} <= set(seeds)


def test_a_repeat_by_run_measures_each_rows_iterations_at_once(monkeypatch):
    calls = _repeat_calls(monkeypatch, "run")
    assert sorted(calls) == sorted((label, 3, repeat) for label in "abc" for repeat in range(2))


def test_rows_are_shuffled_turn_by_turn_by_default():
    assert parser().parse_args(["--out", "x"]).interleave == "iteration"


# -- a tiny real run ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_tiny_run_measures_every_mode_the_advisor_ranks(tmp_path):
    out = tmp_path / "ranking"
    result = main(["--presets", "off", "--clips", "4", "--repeats", "1", "--samples", "128", "--out", str(out)])
    saved = json.loads((out / "ranking.json").read_text())
    assert saved["summary"] == json.loads(json.dumps(result["summary"]))
    (advice,) = saved["advice"]
    (summary,) = saved["summary"]
    assert sorted(summary["modes"]) == sorted(MODES)
    # Every row measured once, as the variant the advisor named.
    assert sorted((m["mode"], m["variant"]) for m in saved["measurements"]) == sorted(
        (label, summary["modes"][label]["variant"]) for label in MODES
    )
    assert [r["label"] for r in advice["rows"]] == [summary["modes"][k]["variant"] for k in summary["predicted_order"]]
    for m in summary["modes"].values():
        assert m["predicted"] > 0 and m["measured"] > 0
    # What a later model may be played on: the probe's measured parts beside the inputs, and each
    # measurement's Step calls and time split.
    assert 0 < advice["one_call_s"] and 0 < advice["ver_row_s"] and 0 < advice["call_receive_cpu_s"]
    assert all(0 < share <= 1 for share in advice["receive_shares"])
    for m in saved["measurements"]:
        assert m["step_calls_per_valid"] > 0 and m["step_latency_s"] > 0 and "stepping" in m["time_split_s"]
    assert sorted(m["measured_rank"] for m in summary["modes"].values()) == list(range(1, 7))
    assert -1 <= summary["kendall_tau"] <= 1
    assert list(summary["top_two_ratios"]) == summary["predicted_order"][:2]
    text = (out / "ranking.md").read_text()
    assert "| off | random | 4 |" in text
    assert text.rstrip().splitlines()[-2].startswith("- top two predicted within 20% of measured: met in")
    assert 0 <= summary["validated_top1"] <= 1 and "`fast advise`'s recommendation" in text.rstrip().splitlines()[-1]

    # The probe's inputs are recorded whole: the same model on them predicts every row to the last digit.
    again = main(["--repredict", str(out / "ranking.json"), "--out", str(tmp_path / "again")])
    assert again["summary"] == saved["summary"]
    for row in again["advice"][0]["rows"]:
        assert row["effective_throughput"] == row["recorded_effective_throughput"]
    # ... and a changed input changes them: the model runs again, nothing is copied.
    slower = json.loads((out / "ranking.json").read_text())
    for costs in slower["advice"][0]["model_inputs"]["workload"]["costs"]:
        costs["step_s"] += 0.01
    (tmp_path / "slower.json").write_text(json.dumps(slower))
    moved = main(["--repredict", str(tmp_path / "slower.json"), "--out", str(tmp_path / "moved")])
    for row in moved["advice"][0]["rows"]:
        assert row["effective_throughput"] < row["recorded_effective_throughput"]
    assert "Predictions made again" in (tmp_path / "moved" / "ranking.md").read_text()
