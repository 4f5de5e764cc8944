"""`fast bench sampling` and `fast bench train` on tiny sizes, as a user runs them, plus their maths."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fast.bench.sampling import Measurement, SamplingBenchConfig, aggregate, spread_slots
from fast.bench.train import curve, time_to_target


def _fast(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fast", *args], capture_output=True, text=True, timeout=timeout)


def test_bench_sampling_tiny_writes_json_table_and_charts(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    done = _fast("bench", "sampling", "--modes", "sc,autoreset,sgr,ver,fast", "--clips", "2,4", "--preset", "off",
                 "--repeats", "1", "--samples", "64", "--out", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads((out / "sampling.json").read_text())
    rows = {(r["mode"], r["clips"]): r for r in result["rows"]}
    assert set(rows) == {("sc", 1)} | {(m, n) for m in ("autoreset", "sgr", "ver", "fast", "gym-async") for n in (2, 4)}
    assert rows[("sc", 1)]["speedup_vs_sc"] == 1.0
    for row in rows.values():
        assert row["effective_throughput"] > 0 and 0 < row["validity"] <= 1 and 0 < row["time_efficiency"] <= 1
    assert rows[("sgr", 4)]["global_resets_per_1k_valid"] > 0 and rows[("autoreset", 4)]["global_resets_per_1k_valid"] == 0
    table = (out / "sampling.md").read_text()
    assert "## preset `off`, policy `random`" in table and "| fast | 4 |" in table and "| gym-async | 4 |" in table
    assert "emulated" in table and "Workload `takeover`" in table
    assert (out / "sampling_off_random.png").stat().st_size > 0


def test_bench_sampling_bad_options_exit_2_with_the_fix(tmp_path: Path) -> None:
    done = _fast("bench", "sampling", "--modes", "fast,turbo", "--out", str(tmp_path / "x"), timeout=60)
    assert done.returncode == 2 and "modes ['turbo'] are unknown; use some of sc, autoreset, sgr, ver, fast" in done.stderr
    done = _fast("bench", "sampling", "--preset", "warp", "--out", str(tmp_path / "x"), timeout=60)
    assert done.returncode == 2 and "presets ['warp'] are unknown" in done.stderr


def test_aggregate_medians_and_speedups() -> None:
    def m(mode, clips, repeat, eff, length):
        return Measurement("p", "random", mode, clips, repeat, {
            "sampling_time_s": 1.0, "raw_throughput": eff, "validity": 1.0, "time_efficiency": 0.5,
            "effective_throughput": eff, "episode_length_mean": length, "global_resets_per_1k_valid": 0.0,
            "slot_resets_per_1k_valid": 1.0, "episode_lengths": [int(length)],
        })
    rows = aggregate([m("sc", 1, 0, 100, 30), m("sc", 1, 1, 300, 30), m("sc", 1, 2, 200, 30),
                      m("fast", 10, 0, 900, 33), m("fast", 10, 1, 800, 33), m("fast", 10, 2, 1000, 33)])
    fast = next(r for r in rows if r["mode"] == "fast")
    assert fast["effective_throughput"] == 900 and fast["speedup_vs_sc"] == 4.5
    assert fast["episode_length_vs_sc"] == pytest.approx(1.1) and fast["repeats"] == 3


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


def test_training_curve_and_time_to_target(tmp_path: Path) -> None:
    lines = [{"time": 10.0 + 2 * i, "iteration_time_s": 2.0, "episode_return_mean": r}
             for i, r in enumerate([1.0, float("nan"), 3.0, 10.0, 12.0])]
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    t, smoothed = curve(path, smooth=2)
    assert t.tolist() == [2.0, 4.0, 6.0, 8.0, 10.0]  # since the first iteration began (time 10 - 2 = 8)
    np.testing.assert_allclose(smoothed, [1.0, 1.0, 2.0, 6.5, 11.0])  # a NaN iteration carries the last return
    assert time_to_target(t, smoothed, 6.0) == 8.0 and time_to_target(t, smoothed, 50.0) is None


def test_bench_train_tiny_runs_fast_train_per_mode_and_seed(tmp_path: Path) -> None:
    out = tmp_path / "bench-train"
    done = _fast("bench", "train", "--modes", "sc,fast", "--seeds", "1", "--iterations", "2", "--samples-per-iteration", "64",
                 "--update-epochs", "1", "--clips", "4", "--preset", "off", "--target-return", "-1000", "--out", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads((out / "train.json").read_text())
    assert [(r["mode"], r["seed"]) for r in result["runs"]] == [("sc", 0), ("fast", 0)]
    assert all(len(r["curve"]["t"]) == 2 and r["time_to_target_s"] is not None for r in result["runs"])
    assert {row["mode"] for row in result["summary"]} == {"sc", "fast"}
    assert "| fast | 1 | 1 |" in (out / "train.md").read_text() and (out / "train_curves.png").stat().st_size > 0


def test_bench_sampling_serves_a_gymnasium_env(tmp_path: Path) -> None:
    out = tmp_path / "bench-gym"
    done = _fast("bench", "sampling", "--env", "gym:CartPole-v1", "--modes", "sc,fast", "--clips", "2", "--preset", "off",
                 "--repeats", "1", "--samples", "64", "--no-gym-reference", "--out", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {(r["mode"], r["clips"]) for r in json.loads((out / "sampling.json").read_text())["rows"]}
    assert rows == {("sc", 1), ("fast", 2)} and "Workload `gym:CartPole-v1`" in (out / "sampling.md").read_text()
    done = _fast("bench", "sampling", "--env", "gym:CartPole-v1", "--out", str(tmp_path / "y"), timeout=60)
    assert done.returncode == 2 and "pass --no-gym-reference" in done.stderr
