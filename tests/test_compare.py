"""`fast compare`: the jackknife and the t quantile against slow, obviously-right references, then
end to end on run directories made with the learner's own checkpoint API and a real simulator server."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import typer
import yaml
from typer.testing import CliRunner

from broker.dealer import HOLDOUT_EVERY
from jobs.compare.cli import compare_command, expand_runs
from jobs.compare.jackknife import paired_difference, t_cdf, t_quantile
from jobs.compare.run import CompareError, _catalog_args, check_runs, compare
from jobs.simulators import Workload
from jobs.train.config import TrainConfig
from learner.checkpoint import Checkpoint, save_checkpoint
from learner.policy import ActorCritic
from learner.ppo import PPOConfig, PPOLearner
from sim_server.takeover.env import TakeoverEnv
from sim_server.takeover.metrics import METRIC_NAMES

NUM_CLIPS = 60  # 6 held-out clips (9, 19, ..., 59): enough for a jackknife, quick to play
HIDDEN = (16, 16)


# -- the statistics -----------------------------------------------------------------------------


def slow_jackknife(a: np.ndarray, b: np.ndarray, t: float) -> tuple[float, float, float, float]:
    """Literal delete-one jackknife of mean(A) - mean(B) over rows, through pseudo-values."""
    a, b = np.atleast_2d(a.T).T, np.atleast_2d(b.T).T  # [n] -> [n, 1]
    n = a.shape[0]

    def estimate(rows: list[int]) -> float:
        per_unit_a = [sum(a[i]) / len(a[i]) for i in rows]
        per_unit_b = [sum(b[i]) / len(b[i]) for i in rows]
        return sum(per_unit_a) / len(rows) - sum(per_unit_b) / len(rows)

    theta = estimate(list(range(n)))
    pseudo = []
    for i in range(n):
        theta_without_i = estimate([j for j in range(n) if j != i])
        pseudo.append(n * theta - (n - 1) * theta_without_i)
    center = sum(pseudo) / n
    variance = sum((p - center) ** 2 for p in pseudo) / (n - 1)
    se = math.sqrt(variance / n)
    return center, se, center - t * se, center + t * se


@pytest.mark.parametrize(("n", "k_a", "k_b"), [(2, 1, 1), (7, 3, 5), (23, 1, 4), (61, 6, 3)])
def test_jackknife_matches_delete_one_loop(n: int, k_a: int, k_b: int) -> None:
    rng = np.random.default_rng(n * 100 + k_a)
    a = rng.normal(1.0, 2.0, size=(n, k_a)) + rng.normal(size=(n, 1)) * 3  # clip effects shared by both groups
    b = rng.normal(0.7, 1.5, size=(n, k_b)) + rng.normal(size=(n, 1)) * 3
    result = paired_difference(a, b)
    center, se, low, high = slow_jackknife(a, b, t_quantile(0.975, n - 1))
    assert result.units == n and result.df == n - 1
    assert result.difference == pytest.approx(center, rel=1e-12, abs=1e-12)
    assert result.se == pytest.approx(se, rel=1e-10)
    assert (result.low, result.high) == (pytest.approx(low, rel=1e-10), pytest.approx(high, rel=1e-10))
    assert result.mean_a == pytest.approx(a.mean()) and result.mean_b == pytest.approx(b.mean())
    # For a mean the jackknife SE is the sample SD over sqrt(n): the paired t interval.
    d = a.mean(axis=1) - b.mean(axis=1)
    assert result.se == pytest.approx(d.std(ddof=1) / math.sqrt(n), rel=1e-10)


def test_jackknife_hand_computed() -> None:
    # d = 1, 2, 3, 6: theta 3; leave-one-out means 11/3, 10/3, 3, 2; deviations 2/3, 1/3, 0, -1;
    # se^2 = 3/4 * (4/9 + 1/9 + 0 + 1) = 7/6; t_{0.975, 3} = 3.182446.
    result = paired_difference([3.0, 4.0, 5.0, 8.0], [2.0, 2.0, 2.0, 2.0])
    assert result.difference == pytest.approx(3.0)
    assert result.se == pytest.approx(math.sqrt(7 / 6))
    assert result.t == pytest.approx(3.182446, abs=1e-6)
    assert result.low == pytest.approx(3.0 - 3.182446 * math.sqrt(7 / 6), abs=1e-5)
    assert result.high == pytest.approx(3.0 + 3.182446 * math.sqrt(7 / 6), abs=1e-5)
    assert result.covers_zero  # low = -0.437


def test_identical_groups_differ_by_exactly_zero() -> None:
    values = np.random.default_rng(3).normal(size=(11, 4))
    result = paired_difference(values, values.copy())
    assert (result.difference, result.se, result.low, result.high) == (0.0, 0.0, 0.0, 0.0)
    assert result.covers_zero is True


def test_constant_metric_gives_the_zero_interval() -> None:
    result = paired_difference(np.full((5, 3), 0.1), np.full((5, 2), 0.1))
    assert (result.difference, result.low, result.high) == (0.0, 0.0, 0.0)
    assert result.covers_zero is True


def test_clear_shift_excludes_zero() -> None:
    rng = np.random.default_rng(5)
    b = rng.normal(size=(20, 3))
    a = b + 1.0 + rng.normal(scale=0.1, size=(20, 3))
    result = paired_difference(a, b)
    assert result.low > 0.5 and not result.covers_zero
    assert not paired_difference(b, a).covers_zero and paired_difference(b, a).high < -0.5


def test_jackknife_refuses_bad_input() -> None:
    with pytest.raises(ValueError, match=r"speed \(group A\).*at least 2 units, got 1|at least 2 units, got 1"):
        paired_difference([1.0], [2.0], name="speed")
    with pytest.raises(ValueError, match="group A has 3 units, group B 2"):
        paired_difference([1.0, 2.0, 3.0], [1.0, 2.0])
    with pytest.raises(ValueError, match=r"return \(group B\): value at \[unit, replicate\] = \[1, 0\] is nan"):
        paired_difference([1.0, 2.0], [1.0, float("nan")], name="return")
    with pytest.raises(ValueError, match="level must be in"):
        paired_difference([1.0, 2.0], [1.0, 2.0], level=95)


@pytest.mark.parametrize(
    ("df", "expected"),
    [
        (1, 12.706205),
        (2, 4.302653),
        (3, 3.182446),
        (5, 2.570582),
        (10, 2.228139),
        (19, 2.093024),
        (30, 2.042272),
        (59, 2.000995),
        (120, 1.979930),
        (10**7, 1.959964),
    ],
)
def test_t_quantile_known_values(df: int, expected: float) -> None:
    assert t_quantile(0.975, df) == pytest.approx(expected, abs=2e-6)
    assert t_quantile(0.025, df) == pytest.approx(-expected, abs=2e-6)


@pytest.mark.parametrize("t", [-30.0, -2.7, -0.4, 0.0, 0.013, 1.3, 8.0, 250.0])
def test_t_cdf_closed_forms(t: float) -> None:
    assert t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, rel=1e-12, abs=1e-15)  # Cauchy
    assert t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(2 + t * t)), rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("p", [0.6, 0.9, 0.975, 0.995])
def test_t_quantile_inverts_closed_forms(p: float) -> None:
    assert t_quantile(p, 1) == pytest.approx(math.tan(math.pi * (p - 0.5)), rel=1e-10)
    q = 2 * p - 1  # df = 2: t = q * sqrt(2 / (1 - q^2))
    assert t_quantile(p, 2) == pytest.approx(q * math.sqrt(2 / (1 - q * q)), rel=1e-10)


# -- run directories ----------------------------------------------------------------------------

_SPACES = TakeoverEnv(num_slots=1, num_clips=2)


def make_run(
    root: Path,
    name: str,
    seed: int,
    *,
    brake: bool = False,
    num_clips: int | None = NUM_CLIPS,
    checkpoint: bool = True,
    env: str = "takeover",
) -> Path:
    """A run directory as `fast train` leaves it, without training: config.yaml and one learner checkpoint."""
    run_dir = root / name
    run_dir.mkdir(parents=True)
    command = "python -m fast sim-server --env takeover --slots 2 --host 127.0.0.1 --port 0 --cost-preset off"
    if num_clips is not None:
        command += f" --num-clips {num_clips}"
    document = {
        "train": TrainConfig(name=name, seed=seed, env=env).model_dump(mode="json"),
        "holdout_every": HOLDOUT_EVERY,
        "processes": {"sim-server-0": {"pid": 1, "address": "127.0.0.1:1", "command": command}},
    }
    (run_dir / "config.yaml").write_text(yaml.safe_dump(document, sort_keys=False))
    if checkpoint:
        torch.manual_seed(seed)
        policy = ActorCritic(_SPACES.observation_space.shape, _SPACES.action_space, HIDDEN)
        if brake:  # full braking whatever it sees: a policy clearly different from coasting
            with torch.no_grad():
                policy.actor_mean[-1].bias.copy_(torch.tensor([-1.0, 0.0]))
        learner = PPOLearner(policy, PPOConfig(seed=seed), device="cpu")
        save_checkpoint(
            run_dir / "checkpoints",
            Checkpoint(
                policy_version=7,
                observation_space=_SPACES.observation_space,
                action_space=_SPACES.action_space,
                hidden_sizes=HIDDEN,
                learner_state=learner.state_dict(),
            ),
        )
    return run_dir


def test_compare_end_to_end(tmp_path: Path) -> None:
    coast_1, coast_2 = make_run(tmp_path, "coast-1", 1), make_run(tmp_path, "coast-2", 2)
    brake = make_run(tmp_path, "brake", 3, brake=True)
    out = tmp_path / "out"
    result = compare(
        {"coast": [coast_1, coast_2], "brake": [brake, coast_1]},
        episodes_per_clip=1,
        seed=4,
        servers=1,
        slots=8,
        out_dir=out,
    )

    written = json.loads((out / "compare.json").read_text())
    assert written == json.loads(json.dumps(result))
    assert written["evaluation"]["clips"] == [9, 19, 29, 39, 49, 59]
    assert written["evaluation"]["num_clips"] == NUM_CLIPS
    expected = {name for name in METRIC_NAMES if name != "clip_id"} | {"terminated"}
    assert set(written["metrics"]) == expected
    for name, m in written["metrics"].items():
        for field in ("mean_a", "mean_b", "difference", "se", "ci_low", "ci_high"):
            assert math.isfinite(m[field]), (name, field)
        assert isinstance(m["covers_zero"], bool)
        assert m["ci_low"] <= m["difference"] <= m["ci_high"]
        assert m["units"] == 6 and len(m["per_clip_a"]) == 6
        assert m["difference"] == pytest.approx(m["mean_a"] - m["mean_b"], abs=1e-9)
    assert written["covering"] == sum(m["covers_zero"] for m in written["metrics"].values())
    assert written["total"] == len(expected)
    # A - B, in that order: coasting keeps more of its speed than half of B braking to a stop.
    speed = written["metrics"]["speed_efficiency"]
    assert speed["difference"] > 0 and speed["mean_a"] > speed["mean_b"]
    # coast-1 is in both groups and played once: its episodes are the same object's copies.
    runs_a, runs_b = written["groups"]["a"]["runs"], written["groups"]["b"]["runs"]
    assert runs_a[0]["episodes"] == runs_b[1]["episodes"] and len(runs_a[0]["episodes"]) == 6
    assert runs_a[0]["policy_version"] == 7

    markdown = (out / "compare.md").read_text()
    assert f"**{written['covering']} of {written['total']} intervals cover zero.**" in markdown
    for name in expected:
        assert f"| {name} |" in markdown
    assert str(coast_2) in markdown and str(brake) in markdown
    assert "[9, 19, 29, 39, 49, 59]" in markdown

    with pytest.raises(CompareError, match="already holds a comparison"):
        compare({"a": [coast_1], "b": [coast_2]}, episodes_per_clip=1, seed=4, servers=1, slots=8, out_dir=out)


def test_check_runs_refuses_another_workload(tmp_path: Path) -> None:
    ours = make_run(tmp_path, "ours", 1)
    other_catalog = make_run(tmp_path, "other-catalog", 2, num_clips=None)
    gym = make_run(tmp_path, "gym", 3, env="gym:CartPole-v1")
    mismatch = rf"run {other_catalog} \(group B\) was trained on env takeover \(default catalog\).*--num-clips 60"
    with pytest.raises(CompareError, match=mismatch):
        check_runs({"A": [ours], "B": [other_catalog]})
    with pytest.raises(CompareError, match=rf"run {gym} \(group B\) was trained on env gym:CartPole-v1"):
        check_runs({"A": [ours], "B": [gym]})
    with pytest.raises(CompareError, match=rf"run {ours} is listed twice in group A"):
        check_runs({"A": [ours, ours], "B": [ours]})
    with pytest.raises(CompareError, match="exactly two groups"):
        check_runs({"A": [ours]})
    with pytest.raises(CompareError, match="group B has no run"):
        check_runs({"A": [ours], "B": []})


def test_catalog_args_read_from_the_simulator_command() -> None:
    command = "FAST_SIM_SEED=3 FAST_SIM_NUM_CLIPS=9 python -m fast sim-server --env takeover --num-clips=60 --slots 5"
    assert _catalog_args({"learner": {"command": "x --seed 1"}, "sim-server-0": {"command": command}}) == (
        "--num-clips",
        "60",
        "--seed",
        "3",
    )
    assert _catalog_args(None) == ()
    assert Workload("takeover", (), 10).describe() == "env takeover (default catalog), holdout_every 10"


# -- the command --------------------------------------------------------------------------------


def cli() -> typer.Typer:
    app = typer.Typer()
    app.command("compare")(compare_command)
    return app


def test_cli_names_a_missing_run_dir(tmp_path: Path) -> None:
    present = make_run(tmp_path, "present", 1)
    missing = tmp_path / "no-such-run"
    result = CliRunner().invoke(cli(), [str(present), str(missing), "--out", str(tmp_path / "out")])
    assert result.exit_code == 2
    assert f"run {missing} (group {missing})" in result.output and "does not exist" in result.output


def test_cli_names_a_run_without_checkpoint(tmp_path: Path) -> None:
    present = make_run(tmp_path, "present", 1)
    empty = make_run(tmp_path, "empty", 2, checkpoint=False)
    result = CliRunner().invoke(cli(), [f"{present},{empty}", str(present), "--out", str(tmp_path / "out")])
    assert result.exit_code == 2
    assert f"run {empty}" in result.output and f"no checkpoint in {empty / 'checkpoints'}" in result.output


def test_cli_names_a_glob_that_matches_nothing(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli(), [str(tmp_path / "fast-*"), str(tmp_path / "sc-*")])
    assert result.exit_code == 2
    assert f"RUN_A: '{tmp_path / 'fast-*'}' matches no directory" in result.output


def test_expand_runs_globs_and_lists(tmp_path: Path) -> None:
    for name in ("fast-2", "fast-1", "sc-1"):
        (tmp_path / name).mkdir()
    assert expand_runs(str(tmp_path / "fast-*"), "RUN_A") == [tmp_path / "fast-1", tmp_path / "fast-2"]
    listed = expand_runs(f"{tmp_path / 'sc-1'}, {tmp_path / 'fast-2'},", "RUN_B")
    assert listed == [tmp_path / "sc-1", tmp_path / "fast-2"]
    with pytest.raises(ValueError, match="RUN_B: ',' names no run"):
        expand_runs(",", "RUN_B")


def test_cli_compares_a_run_with_its_copy(tmp_path: Path) -> None:
    run = make_run(tmp_path, "only", 1)
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)  # another directory, so the policy is played a second time
    out = tmp_path / "self"
    result = CliRunner().invoke(
        cli(), [str(run), str(copy), "--episodes-per-clip", "1", "--servers", "1", "--slots", "8", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    written = json.loads((out / "compare.json").read_text())
    assert [written["groups"][g]["label"] for g in ("a", "b")] == [str(run), str(copy)]
    for name, m in written["metrics"].items():  # the same deterministic policy on the same episodes
        assert (m["difference"], m["ci_low"], m["ci_high"], m["covers_zero"]) == (0.0, 0.0, 0.0, True), name
    assert f"{written['total']} of {written['total']} intervals cover zero" in result.output
    assert list(written["metrics"])[:5] == ["return", "length", "terminated", "collided", "off_road"]
