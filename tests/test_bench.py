"""`fast bench sampling` and `fast bench train` on tiny sizes, as a user runs them, plus their maths."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from jobs.bench.harness import SamplingBenchConfig, spread_slots
from jobs.bench.learning_curve import time_to_target, version_clock
from jobs.bench.sampling import Measurement, aggregate
from jobs.bench.train import TrainBenchConfig, iterations_per_mode, summarize, training_curve
from jobs.cli import app


def _fast(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fast", *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_bench_sampling_tiny_writes_json_table_and_charts(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    done = _fast(
        "bench",
        "sampling",
        "--modes",
        "sc,autoreset,sgr,ver,fast",
        "--clips",
        "4",
        "--preset",
        "off",
        "--repeats",
        "1",
        "--samples",
        "64",
        "--length-samples",
        "300",
        "--length-warmup-steps",
        "20",
        "--locality",
        "off",
        "--prefetch",
        "off",
        "--ver-per-slot",
        "--out",
        str(out),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads((out / "sampling.json").read_text())
    rows = {(r["mode"], r["clips"]): r for r in result["rows"]}
    modes = ("autoreset", "sgr", "ver", "ver+perslot", "fast+carry", "fast+reset", "gym-async")  # fast per truncation
    assert set(rows) == {("sc", 1)} | {(m, 4) for m in modes}
    # VER before and after batching its steps: one call per slot-step, as VER was; the ready slots of
    # a server in one call now (4 slots on 2 servers).
    assert rows[("ver+perslot", 4)]["step_calls_per_valid"] == 1.0 and rows[("ver", 4)]["step_calls_per_valid"] < 0.9
    assert rows[("sc", 1)]["speedup_vs_sc"] == 1.0
    for row in rows.values():
        assert row["effective_throughput"] > 0 and 0 < row["validity"] <= 1 and 0 < row["time_efficiency"] <= 1
    assert (
        rows[("sgr", 4)]["global_resets_per_1k_valid"] > 0 and rows[("autoreset", 4)]["global_resets_per_1k_valid"] == 0
    )
    # The limit beside each broker mode's row: under `off` only the step latency the servers paid bounds it.
    for (mode, _), row in rows.items():
        if mode != "gym-async":
            assert row["step_latency_s"] > 0 and row["limit_binding"] == "step" and 0 < row["limit_share"] <= 1.5
    table = (out / "sampling.md").read_text()
    assert "| limit steps/s (bound) |" in table
    assert "## preset `off`, policy `random`" in table and "| gym-async | 4 |" in table
    assert "| fast+carry | 4 |" in table and "| fast+reset | 4 |" in table
    assert "emulated" in table and "Workload `takeover`" in table
    assert (out / "sampling_off_random.png").stat().st_size > 0
    # Steady-state lengths: every (mode, clips) but the Gymnasium reference, SC the reference.
    lengths = {(r["mode"], r["clips"]): r for r in result["episode_length"]}
    assert set(lengths) == set(rows) - {("gym-async", 4), ("ver+perslot", 4)}  # ver+perslot: the same lengths as ver
    assert lengths[("sc", 1)]["mean_vs_sc"] == 1.0 and lengths[("sc", 1)]["cut_share"] == 0.0
    for row in lengths.values():
        assert row["episodes"] > 0 and 1 <= row["mean"] <= 300 and 0.0 <= row["cut_share"] <= 1.0
        assert sum(row["ends"].values()) == row["episodes"]
    # carry cuts no episode; reset cuts the live ones at every round's end.
    assert lengths[("fast+carry", 4)]["cut_share"] == 0.0 and lengths[("fast+reset", 4)]["cut_share"] > 0.0
    assert "## Episode length in steady state" in table and "| fast+reset | 4 |" in table.split("steady state")[1]


@pytest.mark.slow
def test_bench_sampling_with_map_locality_hits_the_map_cache_more(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    args = ["--modes", "sc,fast", "--clips", "6", "--preset", "calibrated", "--repeats", "1", "--samples", "600"]
    args += ["--no-gym-reference", "--length-samples", "0", "--locality", "off,on", "--prefetch", "off"]
    args += ["--truncation", "carry"]
    args += ["--out", str(out)]
    done = _fast("bench", "sampling", *args)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {(r["mode"], r["clips"]): r for r in json.loads((out / "sampling.json").read_text())["rows"]}
    assert set(rows) == {("sc", 1), ("sc+locality", 1), ("fast+carry", 6), ("fast+carry+locality", 6)}
    plain, local = rows[("fast+carry", 6)], rows[("fast+carry+locality", 6)]
    # Dealing is seeded and FAST steps in lock-step: the counts below do not depend on timing.
    assert local["cache_hit_rate"] > plain["cache_hit_rate"] + 0.2, (plain["cache_hit_rate"], local["cache_hit_rate"])
    assert local["distinct_maps"] < plain["distinct_maps"]
    assert rows[("sc+locality", 1)]["speedup_vs_sc"] > 0 and rows[("sc", 1)]["speedup_vs_sc"] == 1.0
    # Under `calibrated` the map loads share one channel per server: a load or engine bound applies.
    assert set(plain["limit_bounds"]) == {"step", "load", "engine"}
    assert "| fast+carry+locality | 6 |" in (out / "sampling.md").read_text()


def test_bench_sampling_bad_options_exit_2_with_the_fix(tmp_path: Path) -> None:
    # The command in this process (CliRunner): the same code as `python -m fast`, without a second
    # of imports per call; nothing is started before the options are checked.
    runner = CliRunner()
    done = runner.invoke(app, ["bench", "sampling", "--modes", "fast,turbo", "--out", str(tmp_path / "x")])
    assert done.exit_code == 2
    assert "modes ['turbo'] are unknown; use some of sc, autoreset, sgr, ver, fast" in done.output
    done = runner.invoke(app, ["bench", "sampling", "--preset", "warp", "--out", str(tmp_path / "x")])
    assert done.exit_code == 2 and "presets ['warp'] are unknown" in done.output
    done = runner.invoke(app, ["bench", "sampling", "--locality", "sometimes", "--out", str(tmp_path / "x")])
    assert done.exit_code == 2 and "give off, on or off,on" in done.output
    assert not (tmp_path / "x").exists()


def test_aggregate_medians_and_speedups() -> None:
    def m(mode, clips, repeat, eff, length):
        return Measurement(
            "p",
            "random",
            mode,
            clips,
            repeat,
            {
                "sampling_time_s": 1.0,
                "raw_throughput": eff,
                "validity": 1.0,
                "time_efficiency": 0.5,
                "effective_throughput": eff,
                "episode_length_mean": length,
                "global_resets_per_1k_valid": 0.0,
                "slot_resets_per_1k_valid": 1.0,
                "episode_lengths": [int(length)],
            },
        )

    rows = aggregate(
        [
            m("sc", 1, 0, 100, 30),
            m("sc", 1, 1, 300, 30),
            m("sc", 1, 2, 200, 30),
            m("fast", 10, 0, 900, 33),
            m("fast", 10, 1, 800, 33),
            m("fast", 10, 2, 1000, 33),
        ]
    )
    fast = next(r for r in rows if r["mode"] == "fast")
    assert fast["effective_throughput"] == 900 and fast["speedup_vs_sc"] == 4.5
    assert fast["episode_length_vs_sc"] == pytest.approx(1.1) and fast["repeats"] == 3


def test_length_row_counts_cut_episodes_with_their_share() -> None:
    from jobs.bench.episode_length import length_row

    row = length_row(
        "random", "fast", 10, {"episode_lengths": [10, 20, 30, 40], "episode_ends": {"terminated": 3, "cut": 1}}
    )
    assert row["mean"] == 25.0 and row["cut_share"] == 0.25 and row["episodes"] == 4
    assert row["p10_p50_p90"] == pytest.approx([13.0, 25.0, 37.0])
    empty = length_row("random", "sc", 1, {})
    assert empty["episodes"] == 0 and empty["p10_p50_p90"] == []


def test_spread_slots_deals_round_robin_over_servers() -> None:
    class Server:
        def __init__(self, offset, n):
            self.slot_offset, self.num_slots = offset, n

    class Pool:
        servers = [Server(0, 3), Server(3, 3)]
        num_slots = 6

    assert spread_slots(Pool(), 3).tolist() == [0, 1, 3]
    assert spread_slots(Pool(), 6).tolist() == [0, 1, 2, 3, 4, 5]
    with pytest.raises(ValueError, match="7 clips need 7 slots; the servers have 6"):
        spread_slots(Pool(), 7)


def test_config_refuses_bad_clip_counts() -> None:
    with pytest.raises(ValueError, match="give clip counts >= 1"):
        SamplingBenchConfig(clips=(0, 5))


def test_training_curve_smooths_and_carries_iterations_without_episodes(tmp_path: Path) -> None:
    lines = [
        {"time": 10.0 + 2 * i, "iteration_time_s": 2.0, "episode_return_mean": r}
        for i, r in enumerate([1.0, float("nan"), 3.0, 10.0, 12.0])
    ]
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    t, smoothed = training_curve(path, smooth=2)
    assert t.tolist() == [2.0, 4.0, 6.0, 8.0, 10.0]  # since the first iteration began (time 10 - 2 = 8)
    np.testing.assert_allclose(smoothed, [1.0, 1.0, 2.0, 6.5, 11.0])  # a NaN iteration carries the last return


def test_version_clock_places_version_v_at_the_end_of_iteration_v(tmp_path: Path) -> None:
    # Iteration i samples with version i - 1; its update makes version i.
    lines = [
        {
            "iteration": i + 1,
            "policy_version": i,
            "time": 103.0 + 3 * i,
            "iteration_time_s": 3.0,
            "valid_transitions": 100 + i,
        }
        for i in range(3)
    ]
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert version_clock(path) == {0: (0.0, 0), 1: (3.0, 100), 2: (6.0, 201), 3: (9.0, 303)}


def test_time_to_target_is_the_first_point_at_or_above_it() -> None:
    points = [
        {"time_s": 0.0, "transitions": 0, "return_mean": 48.0},
        {"time_s": 5.0, "transitions": 10, "return_mean": 71.0},
        {"time_s": 9.0, "transitions": 20, "return_mean": 65.0},
        {"time_s": 12.0, "transitions": 30, "return_mean": 80.0},
    ]
    assert time_to_target(points, 70.0) == (5.0, 10)
    assert time_to_target(points, 75.0) == (12.0, 30)
    assert time_to_target(points, 90.0) is None


def _record(mode: str, seed: int, reached: bool, training_s: float, reached_at: float | None = None) -> dict:
    curve = [
        {"version": 0, "time_s": 0.0, "transitions": 0, "return_mean": 48.0},
        {"version": 10, "time_s": training_s, "transitions": 1000, "return_mean": 75.0 if reached else 60.0},
    ]
    return {
        "mode": mode,
        "seed": seed,
        "time_to_target_s": (reached_at or training_s) if reached else None,
        "transitions_to_target": 1000 if reached else None,
        "training_s": training_s,
        "initial_return": 48.0,
        "final_return": curve[-1]["return_mean"],
        "eval_curve": curve,
    }


def test_bench_train_modes_may_add_locality_and_prefetch() -> None:
    assert TrainBenchConfig(modes=("fast", "fast+locality", "ver+prefetch+locality")).modes[1] == "fast+locality"
    assert TrainBenchConfig(modes=("fast+reset", "fast+carry+prefetch")).modes[0] == "fast+reset"
    with pytest.raises(ValueError, match=r"modes \['fast\+turbo'\] are unknown.*\+locality, \+prefetch"):
        TrainBenchConfig(modes=("fast+turbo",))
    with pytest.raises(ValueError, match=r"modes \['ver\+reset'\] are unknown.*fast only"):
        TrainBenchConfig(modes=("ver+reset",))


def test_summary_censors_runs_that_never_reached_the_target_at_their_training_time() -> None:
    config = TrainBenchConfig(modes=("sc", "fast"), seeds=2)
    rows = {
        row["mode"]: row
        for row in summarize(
            [
                _record("sc", 0, True, 100.0),
                _record("sc", 1, True, 120.0),
                _record("fast", 0, True, 40.0),
                _record("fast", 1, False, 50.0),
            ],
            config,
        )
    }
    assert rows["sc"]["time_to_target_median_s"] == 110.0 and rows["sc"]["time_to_target_exact"]
    assert rows["sc"]["speedup_to_target_vs_sc"] == 1.0
    # fast: one run at 40 s, one not there by its end at 50 s: more than 45 s, no speedup claimed.
    assert rows["fast"]["reached_target"] == 1 and rows["fast"]["time_to_target_median_s"] == 45.0
    assert not rows["fast"]["time_to_target_exact"] and rows["fast"]["speedup_to_target_vs_sc"] is None
    assert rows["fast"]["speedup_training_vs_sc"] == pytest.approx(110.0 / 45.0)

    # SC never got there in 100 and 120 s; fast did at 30 and 40 s: a speedup of at least 110 / 35.
    rows = {
        row["mode"]: row
        for row in summarize(
            [
                _record("sc", 0, False, 100.0),
                _record("sc", 1, False, 120.0),
                _record("fast", 0, True, 45.0, reached_at=30.0),
                _record("fast", 1, True, 45.0, reached_at=40.0),
            ],
            config,
        )
    }
    assert rows["fast"]["speedup_to_target_vs_sc"] == pytest.approx(110.0 / 35.0)
    assert rows["fast"]["speedup_to_target_is_lower_bound"] and not rows["sc"]["speedup_to_target_is_lower_bound"]


# `fast bench train` end to end (a run per mode, held-out curves, --report-only): on external servers, in
# tests/test_external_simulators.py, where one pair of runs serves both.


@pytest.mark.slow
def test_bench_sampling_serves_a_gymnasium_env(tmp_path: Path) -> None:
    out = tmp_path / "bench-gym"
    done = _fast(
        "bench",
        "sampling",
        "--env",
        "gym:CartPole-v1",
        "--modes",
        "sc,fast",
        "--truncation",
        "carry",
        "--clips",
        "2",
        "--preset",
        "off",
        "--repeats",
        "1",
        "--samples",
        "64",
        "--no-gym-reference",
        "--length-samples",
        "0",
        "--locality",
        "off",
        "--prefetch",
        "off",
        "--out",
        str(out),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {(r["mode"], r["clips"]) for r in json.loads((out / "sampling.json").read_text())["rows"]}
    assert rows == {("sc", 1), ("fast+carry", 2)} and "Workload `gym:CartPole-v1`" in (out / "sampling.md").read_text()
    done = _fast("bench", "sampling", "--env", "gym:CartPole-v1", "--out", str(tmp_path / "y"), timeout=60)
    assert done.returncode == 2 and "pass --no-gym-reference" in done.stderr


def test_report_only_refuses_a_file_that_is_no_finished_benchmark_and_leaves_it(tmp_path: Path) -> None:
    from jobs.bench.train import rewrite_report

    with pytest.raises(ValueError, match="does not exist; pass the --out of a finished"):
        rewrite_report(tmp_path)
    for text, fault in (
        ("{", "JSONDecodeError"),
        ('{"config": {}}', "KeyError: 'runs'"),
        ('{"config": {"bogus": 1}, "runs": []}', "TypeError"),
    ):
        (tmp_path / "train.json").write_text(text)
        with pytest.raises(ValueError, match=f"is not the train.json of a finished .*{fault}"):
            rewrite_report(tmp_path)
        assert (tmp_path / "train.json").read_text() == text and not (tmp_path / "train.md").exists()


def test_report_only_recomputes_every_run_for_a_new_target(tmp_path: Path) -> None:
    """`--report-only --target-return X`: the times to target are those of X, not the stored target's."""
    import shutil

    from jobs.bench.train import rewrite_report

    shutil.copy(Path(__file__).resolve().parents[1] / "benchmarks/results/train/train.json", tmp_path / "train.json")
    stored = json.loads((tmp_path / "train.json").read_text())
    finals = sorted(r["final_return"] for r in stored["runs"])
    target = finals[len(finals) // 2]  # some runs reach it, some do not
    assert target != stored["config"]["target_return"]
    result = rewrite_report(tmp_path, target)
    assert result["config"]["target_return"] == target
    assert json.loads((tmp_path / "train.json").read_text())["config"]["target_return"] == target
    for record in result["runs"]:
        expected = time_to_target(record["eval_curve"], target)
        assert record["time_to_target_s"] == (expected[0] if expected else None)
    assert any(r["time_to_target_s"] is None for r in result["runs"])
    assert any(r["time_to_target_s"] is not None for r in result["runs"])
    assert f"Target: held-out return {target:g}" in (tmp_path / "train.md").read_text()


def _stopped_benchmark(out: Path, kept: int) -> tuple[TrainBenchConfig, list[dict]]:
    """A benchmark stopped after `kept` runs: the committed 3-seed run's first records, as train.json."""
    stored = json.loads((Path(__file__).resolve().parents[1] / "benchmarks/results/train/train.json").read_text())
    cfg = TrainBenchConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in stored["config"].items()})
    runs = stored["runs"][:kept]
    out.mkdir(parents=True, exist_ok=True)
    (out / "train.json").write_text(
        json.dumps(
            {"config": json.loads(json.dumps(cfg.__dict__)), "finished": False, "wall_clock_s": 1000.0, "runs": runs}
        )
    )
    return cfg, runs


def test_resume_keeps_the_finished_runs_and_runs_only_the_rest(tmp_path: Path, monkeypatch) -> None:
    import contextlib
    from types import SimpleNamespace

    import jobs.bench.train as bench_train

    cfg, kept = _stopped_benchmark(tmp_path, kept=5)
    (tmp_path / "runs" / "sgr-s1").mkdir(parents=True)  # the run the stop cut short
    (tmp_path / "runs" / "sgr-s1" / "metrics.jsonl").write_text("{}\n")
    ran = []

    def fake_run(cfg, mode, seed, runs_dir, *args, **kwargs):
        assert not (runs_dir / f"{mode}-s{seed}").exists()  # a half-done run starts over
        ran.append((mode, seed))
        return {**kept[0], "mode": mode, "seed": seed, "run_dir": str(runs_dir / f"{mode}-s{seed}")}

    monkeypatch.setattr(bench_train, "_train_and_evaluate", fake_run)
    monkeypatch.setattr(
        bench_train,
        "job_simulators",
        lambda *a, **k: contextlib.nullcontext(SimpleNamespace(addresses=[], credentials=None)),
    )
    result = bench_train.run(cfg, tmp_path, log=lambda *_: None, resume=True)
    order = [(m, s) for s in range(cfg.seeds) for m in cfg.modes]
    assert ran == order[5:]
    assert result["runs"][:5] == kept and [(r["mode"], r["seed"]) for r in result["runs"]] == order
    assert result["finished"] and result["wall_clock_s"] >= 1000.0
    assert json.loads((tmp_path / "train.json").read_text())["finished"]


def test_resume_refuses_a_benchmark_of_other_settings_and_leaves_it(tmp_path: Path) -> None:
    from dataclasses import replace

    from jobs.bench.train import resumable_records, run

    cfg, kept = _stopped_benchmark(tmp_path, kept=2)
    before = (tmp_path / "train.json").read_text()
    with pytest.raises(ValueError, match=r"other settings \(iterations, preset\); pass the options"):
        run(replace(cfg, iterations=cfg.iterations + 1, preset="calibrated"), tmp_path, resume=True)
    assert (tmp_path / "train.json").read_text() == before
    assert resumable_records(cfg, tmp_path) == (kept, 1000.0)
    assert resumable_records(cfg, tmp_path / "nothing-there") == ([], 0.0)
    (tmp_path / "train.json").write_text("{")
    with pytest.raises(ValueError, match="is not the train.json of a `fast bench train`"):
        resumable_records(cfg, tmp_path)


def test_resume_needs_out() -> None:
    done = _fast("bench", "train", "--resume", timeout=60)
    assert done.returncode == 2 and "--resume needs --out" in done.stderr


def test_a_median_the_censored_runs_cannot_move_is_exact() -> None:
    """Three seeds, two at the target (148 s, 191 s), one not by its end (279 s): the median is
    191 s whatever the third would have needed; with the censored run below the middle it is not."""
    config = TrainBenchConfig(modes=("fast",), seeds=3)
    records = [
        _record("fast", 0, False, 279.0),
        _record("fast", 1, True, 279.0, reached_at=148.0),
        _record("fast", 2, True, 279.0, reached_at=191.0),
    ]
    [row] = summarize(records, config)
    assert row["time_to_target_median_s"] == 191.0 and row["time_to_target_exact"]
    assert row["transitions_to_target_median"] is None  # counted only when every run got there
    records[0] = _record("fast", 0, False, 150.0)  # censored at 150 s: the median could be anywhere above
    [row] = summarize(records, config)
    assert row["time_to_target_median_s"] == 150.0 and not row["time_to_target_exact"]


def test_bench_train_runs_mode_auto_and_counts_the_iterations_it_sampled_in_each_mode(tmp_path: Path) -> None:
    assert TrainBenchConfig(modes=("fast", "auto", "auto+prefetch")).modes[1] == "auto"
    with pytest.raises(ValueError, match=r"modes \['auto\+reset'\] are unknown.*fast only"):
        TrainBenchConfig(modes=("auto+reset",))
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps({"iteration": i + 1, "mode": m}) + "\n" for i, m in enumerate("ffvfa")))
    assert iterations_per_mode(metrics) == {"f": 3, "v": 1, "a": 1}
    assert iterations_per_mode(tmp_path / "none.jsonl") == {}
    records = [
        {**_record("auto", 0, True, 40.0), "iterations_per_mode": {"fast": 8, "ver": 2}},
        {**_record("auto", 1, True, 50.0), "iterations_per_mode": {"fast": 7, "ver": 1, "autoreset": 2}},
    ]
    (row,) = summarize(records, TrainBenchConfig(modes=("auto",), seeds=2))
    assert row["iterations_per_mode"] == {"fast": 15, "ver": 3, "autoreset": 2}


def test_a_runs_sampling_is_set_against_what_its_simulators_allow(tmp_path: Path) -> None:
    """`sampling_against_limit`: sampling seconds and valid / limit summed over the iterations that
    carry `pool_calls`; the bound that binds most; and the summary's medians and report cells."""
    from jobs.bench.limits import costs_from_describe
    from jobs.bench.train import _limit_cells, sampling_against_limit
    from sim_server.cost_model import PRESETS

    calls = dict(step_calls=200, step_server_s=0.4, reset_calls=1, reset_slots=8, map_loads=0, map_cache_hits=8)
    line = {"num_slots": 10, "validity": 0.8, "valid_transitions": 800, "sampling_time_s": 0.5, "pool_calls": calls}
    older = {k: v for k, v in line.items() if k != "pool_calls"}
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps(x) + "\n" for x in (line, line, older)))
    got = sampling_against_limit(metrics, costs_from_describe(PRESETS["calibrated"]), servers=2)
    # Every map cached: the step bound, 0.8 * 10 / 2 ms = 4,000 valid/s: 800 valid take 0.2 s at least.
    assert got == {
        "sampling_s": 1.0,
        "limit_sampling_s": pytest.approx(0.4),
        "limit_binding": "step",
        "limited_iterations": 2,
        "iterations": 3,
    }
    records = [{**_record("fast", s, True, 40.0), "sampling_limit": {**got, "sampling_s": 1.0 + s}} for s in range(3)]
    (row,) = summarize(records, TrainBenchConfig(modes=("fast",), seeds=3))
    assert row["sampling_s_median"] == 2.0 and row["limit_sampling_s_median"] == pytest.approx(0.4)
    assert _limit_cells(row, lambda v, d=1: f"{v:.{d}f}") == "2.0 | 0.4 (step) | 0.20"
    (old,) = summarize([_record("fast", 0, True, 40.0)], TrainBenchConfig(modes=("fast",), seeds=1))
    assert old["limit_sampling_s_median"] is None and _limit_cells(old, str) == "- | - | -"  # a run before the limit


def test_runs_of_one_configuration_sum_into_one_figure() -> None:
    """Turns of a row (benchmarks/advisor_ranking.py) as one figure: valid over summed wall, the pool's
    calls summed, the maps dealt over all of them."""
    from types import SimpleNamespace

    from broker.metrics import IterationStats
    from broker.slots import PoolCounters
    from jobs.bench.harness import ModeRun, runs_summary

    pool = SimpleNamespace(
        slot_server=np.array([0, 0, 1, 1]),
        servers=[SimpleNamespace(cost_model=None)] * 2,
        clip_map_ids=np.array([0, 0, 1, 2]),
        num_clips=4,
    )
    slots = np.arange(4)

    def run(valid: int, wall: float, step_calls: int, clips: tuple[int, ...]) -> ModeRun:
        stats = IterationStats(mode="sgr", num_slots=4, wall_s=wall, valid=valid, transitions=valid, slot_resets=4)
        calls = PoolCounters(step_calls=step_calls, step_server_s=0.001 * step_calls, reset_calls=2, reset_slots=4)
        return ModeRun(stats, calls, slots, clips)

    one = runs_summary([run(100, 1.0, 50, (0,))], pool)
    both = runs_summary([run(100, 1.0, 50, (0,)), run(300, 0.5, 150, (1, 2, 3))], pool)
    assert one["effective_throughput"] == pytest.approx(100.0) and one["distinct_maps"] == 1
    assert both["effective_throughput"] == pytest.approx(400 / 1.5)  # not the mean of 100 and 600
    assert both["step_calls_per_valid"] == pytest.approx(200 / 400)
    assert both["slot_resets_per_1k_valid"] == pytest.approx(1000 * 8 / 400)
    assert both["step_latency_s"] == pytest.approx(0.001)
    assert both["distinct_maps"] == 3
    with pytest.raises(ValueError, match="at least one run"):
        runs_summary([], pool)
    summed = PoolCounters(step_calls=2, prepared=1).plus(PoolCounters(step_calls=3))
    assert summed == PoolCounters(step_calls=5, prepared=1)
