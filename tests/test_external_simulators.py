"""Every job on external simulators (`--simulators`): servers started apart, as a user would, with the
test session's token (conftest.py), used by `fast train`, `fast bench sampling`, `fast bench train` and
`fast compare`, and still running afterwards. And the settings that do not apply with them, refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from conftest import SESSION_TOKEN_FILE, sim_server
from typer.testing import CliRunner

from fast import auth
from jobs.cli import app
from jobs.processes import ServiceProcess, start_service

# Two iterations of 128 samples on 2 servers x 2 slots; the evaluation plays every 10th of the 40 clips once.
TINY = ["--iterations", "2", "--samples-per-iteration", "128", "--update-epochs", "1", "--eval-episodes-per-clip", "1"]
RUN_TIMEOUT_S = 150


def _fast(*args: str, env: dict[str, str] | None = None, timeout_s: float = RUN_TIMEOUT_S) -> tuple[int, str]:
    """`python -m fast ARGS` as a user runs it; (exit code, output)."""
    done = subprocess.run(
        [sys.executable, "-m", "fast", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        timeout=timeout_s,
    )
    return done.returncode, done.stdout


def _assert_still_serving(servers: list[ServiceProcess]) -> None:
    """The job did not stop the servers it did not start: alive, and they still answer."""
    assert all(s.alive() for s in servers), "a job stopped an external simulator server"
    for server in servers:
        code, output = _fast("health", server.address, timeout_s=30)
        assert code == 0 and "SERVING" in output, output


@pytest.fixture(scope="module")
def external() -> Iterator[list[ServiceProcess]]:
    """Two takeover servers of 2 slots, started apart with the session's token. 40 clips rather than the
    workload's 200: the held-out evaluations every job here runs play 4 clips, not 20."""
    servers = ("--slots", "2", "--num-clips", "40")
    with sim_server(*servers) as first, sim_server(*servers) as second:
        yield [first, second]


def _spec(servers: list[ServiceProcess]) -> str:
    return ",".join(s.address for s in servers)


@pytest.fixture(scope="module")
def trained(external: list[ServiceProcess], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, str]:
    """One `fast train` on the external servers, given in FAST_TRAIN_SIMULATORS: (run directory, code, output)."""
    runs = tmp_path_factory.mktemp("runs")
    code, output = _fast(
        "train", "--runs-dir", str(runs), "--name", "ext", *TINY, env={"FAST_TRAIN_SIMULATORS": _spec(external)}
    )
    return runs / "ext", code, output


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_train_on_external_simulators_given_in_the_environment(external, trained) -> None:
    run_dir, code, output = trained
    assert code == 0, output[-3000:]
    assert "external simulators" in output
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert config["train"]["simulators"] == [s.address for s in external]  # FAST_TRAIN_SIMULATORS honoured
    assert not {"env", "servers", "slots", "cost_preset"} & set(config["train"])  # none applies
    recorded = config["simulators"]
    assert [s["address"] for s in recorded["servers"]] == [s.address for s in external]
    assert all(s["num_slots"] == 2 and s["num_clips"] == 40 for s in recorded["servers"])
    assert recorded["token"] == f"{auth.TOKEN_FILE_ENV}={SESSION_TOKEN_FILE}"  # where, never the token itself
    assert SESSION_TOKEN_FILE.read_text().strip() not in (run_dir / "config.yaml").read_text() + output
    # It started the learner, the broker and the gateway, and no simulator server; no token of its own.
    assert sorted(config["processes"]) == ["broker", "gateway", "learner"]
    assert f"--simulators {_spec(external)}" in config["processes"]["broker"]["command"]
    assert not (run_dir / "token").exists()

    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["iteration"] for m in lines] == [1, 2] and all(m["num_slots"] == 4 for m in lines)
    evaluation = json.loads((run_dir / "eval.json").read_text())
    assert len(evaluation["clips"]) == 4 and evaluation["policy_version"] == 2
    report = (run_dir / "report.md").read_text()
    assert f"external: {_spec(external).replace(',', ', ')}" in report and "eval return" in report
    outcome = json.loads((run_dir / "outcome.json").read_text())
    assert outcome["outcome"] == "done" and sorted(outcome["exit_codes"]) == ["broker", "gateway", "learner"]
    _assert_still_serving(external)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_compare_on_external_simulators(external, trained, tmp_path: Path) -> None:
    run_dir = trained[0]
    assert trained[1] == 0, trained[2][-3000:]
    out = tmp_path / "compare"
    result = CliRunner().invoke(
        app,
        ["compare", str(run_dir), str(run_dir), "--simulators", _spec(external), "--episodes-per-clip", "1"]
        + ["--out", str(out)],
    )
    assert result.exit_code == 0, result.output
    comparison = json.loads((out / "compare.json").read_text())
    evaluation = comparison["evaluation"]
    assert evaluation["simulators"]["specs"] == [s.address for s in external]
    assert (evaluation["servers"], evaluation["slots"], len(evaluation["clips"])) == (2, 4, 4)
    assert comparison["covering"] == comparison["total"]  # a run against itself
    assert "not started or stopped by compare" in (out / "compare.md").read_text()
    _assert_still_serving(external)

    # Without --simulators, compare cannot start servers of an external run's workload: it says what to pass.
    result = CliRunner().invoke(app, ["compare", str(run_dir), str(run_dir), "--out", str(tmp_path / "again")])
    assert result.exit_code == 2 and "pass --simulators" in result.output


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bench_sampling_on_external_simulators(external, tmp_path: Path) -> None:
    out = tmp_path / "bench"
    result = CliRunner().invoke(
        app,
        ["bench", "sampling", "--simulators", _spec(external), "--modes", "sc,fast", "--truncation", "carry"]
        + ["--clips", "2,4"]
        + ["--repeats", "1", "--samples", "64", "--length-samples", "32", "--length-warmup-steps", "4"]
        + ["--locality", "off", "--prefetch", "off", "--out", str(out)],
    )
    assert result.exit_code == 0, result.output
    bench = json.loads((out / "sampling.json").read_text())
    assert {(r["preset"], r["mode"], r["clips"]) for r in bench["rows"]} == {
        ("external", "sc", 1),
        ("external", "fast+carry", 2),
        ("external", "fast+carry", 4),
    }
    assert [s["address"] for s in bench["simulators"]["servers"]] == [s.address for s in external]
    assert {(r["mode"], r["clips"]) for r in bench["episode_length"]} == {
        ("sc", 1),
        ("fast+carry", 2),
        ("fast+carry", 4),
    }
    assert "External simulators" in (out / "sampling.md").read_text()
    _assert_still_serving(external)

    # More clips than the external servers have slots: refused, naming --clips.
    result = CliRunner().invoke(
        app,
        ["bench", "sampling", "--simulators", _spec(external), "--clips", "5", "--repeats", "1"]
        + ["--length-samples", "0", "--out", str(tmp_path / "too-many")],
    )
    assert result.exit_code == 2 and "--clips 5 needs 5 slots; the simulators have 4" in result.output


# `fast bench train` end to end is tested here, on the external servers (one pair of runs serves both).
@pytest.mark.slow
@pytest.mark.timeout(400)
def test_bench_train_on_external_simulators_runs_each_mode_and_evaluates_checkpoints(external, tmp_path: Path) -> None:
    out = tmp_path / "bench-train"
    args = ["bench", "train", "--simulators", _spec(external), "--modes", "sc,fast", "--seeds", "1"]
    args += ["--iterations", "4", "--samples-per-iteration", "64", "--update-epochs", "1", "--checkpoint-every", "2"]
    args += ["--eval-episodes-per-clip", "1", "--target-return", "-1000", "--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    bench = json.loads((out / "train.json").read_text())
    assert bench["config"]["simulators"] == [s.address for s in external]
    assert [s["num_slots"] for s in bench["simulators"]["servers"]] == [2, 2]
    assert [(r["mode"], r["seed"]) for r in bench["runs"]] == [("sc", 0), ("fast", 0)]
    assert bench["finished"] is True  # written after every run too, with finished false until the last
    for record in bench["runs"]:
        curve = record["eval_curve"]  # held out, on the external servers
        assert [p["version"] for p in curve] == [0, 2, 4]  # the start, every 2nd version, the end
        assert [p["episodes"] for p in curve] == [4, 4, 4]  # 1 per held-out clip (40 clips, every 10th)
        assert curve[0]["time_s"] == 0.0 and curve[0]["time_s"] < curve[1]["time_s"] < curve[2]["time_s"]
        assert curve[2]["transitions"] >= 4 * 64 and record["time_to_target_s"] == 0.0
        # Only the newest checkpoint is kept: the run stays a `fast compare` input.
        assert [p.name for p in (Path(record["run_dir"]) / "checkpoints").glob("ckpt-*.pt")] == ["ckpt-000000004.pt"]
        run_config = yaml.safe_load((Path(record["run_dir"]) / "config.yaml").read_text())
        assert run_config["train"]["simulators"] == [s.address for s in external]
    # The same held-out episodes for both modes: with one seed, version 0 is the same policy and scores alike.
    assert bench["runs"][0]["eval_curve"][0]["return_mean"] == bench["runs"][1]["eval_curve"][0]["return_mean"]
    assert {row["mode"] for row in bench["summary"]} == {"sc", "fast"}
    report = (out / "train.md").read_text()
    assert "external simulators" in report and "| fast | 1 | 1 |" in report
    # Each mode's sampling beside the least its simulators allow: their costs unknown, the step bound,
    # which every iteration of 4 met (sampling took longer than valid / limit).
    for record in bench["runs"]:
        limit = record["sampling_limit"]
        assert limit["limited_iterations"] == limit["iterations"] == 4 and limit["limit_binding"] == "step"
        assert 0 < limit["limit_sampling_s"] < limit["sampling_s"]
    assert "their limit is the step bound alone" in report and " (step) | " in report
    assert (out / "train_curves.png").stat().st_size > 0
    _assert_still_serving(external)
    # --report-only rewrites the report from train.json, training nothing.
    (out / "train.md").unlink()
    result = CliRunner().invoke(app, ["bench", "train", "--report-only", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "| fast | 1 | 1 |" in (out / "train.md").read_text() and len(list((out / "runs").iterdir())) == 2
    # ... for a new target, recomputed from the stored held-out curves: no run reaches 1e9.
    result = CliRunner().invoke(app, ["bench", "train", "--report-only", "--out", str(out), "--target-return", "1e9"])
    assert result.exit_code == 0, result.output
    rewritten = json.loads((out / "train.json").read_text())
    assert rewritten["config"]["target_return"] == 1e9
    assert all(r["time_to_target_s"] is None and r["transitions_to_target"] is None for r in rewritten["runs"])
    assert "| fast | 1 | 0 |" in (out / "train.md").read_text()
    result = CliRunner().invoke(app, ["bench", "train", "--report-only"])
    assert result.exit_code == 2 and "--report-only needs --out" in result.output


# A run on too few clips for an evaluation (it is skipped, with a note): tests/test_simulator_kit.py's
# training run, on a server of 8 clips.


def test_an_external_server_with_another_token_fails_fast_naming_the_token(tmp_path: Path) -> None:
    other = start_service(
        "sim-server", ["sim-server", "--port", "0", "--slots", "1"], env={auth.TOKEN_ENV: "another-token"}
    )
    try:
        code, output = _fast("train", "--runs-dir", str(tmp_path), "--simulators", other.address, timeout_s=60)
        assert other.alive()
    finally:
        other.stop()
    assert code == 2, output
    assert f"simulator {other.address} refused the run token" in output
    assert f"{auth.TOKEN_FILE_ENV}={SESSION_TOKEN_FILE}" in output  # which token to give it


# -- settings that do not apply with --simulators, and misspelt variables (nothing starts) -----------------


@pytest.mark.parametrize(
    ("flag", "value"), [("--slots", "3"), ("--servers", "3"), ("--cost-preset", "calibrated"), ("--env", "takeover")]
)
def test_train_refuses_simulator_settings_with_external_simulators(tmp_path: Path, flag: str, value: str) -> None:
    result = CliRunner().invoke(app, ["train", "--runs-dir", str(tmp_path), "--simulators", "127.0.0.1:9", flag, value])
    assert result.exit_code == 2
    assert f"{flag} (FAST_TRAIN_" in result.output and "does not apply with --simulators" in result.output
    assert not any(tmp_path.iterdir())  # refused before anything was written


def test_train_refuses_a_simulator_setting_from_the_environment(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app,
        ["train", "--runs-dir", str(tmp_path), "--simulators", "127.0.0.1:9"],
        env={"FAST_TRAIN_SLOTS": "3"},
    )
    assert result.exit_code == 2 and "--slots (FAST_TRAIN_SLOTS" in result.output


def test_env_given_an_address_says_to_use_simulators(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["train", "--runs-dir", str(tmp_path), "--env", "127.0.0.1:5000"])
    assert result.exit_code == 2 and "give --simulators 127.0.0.1:5000 (or FAST_TRAIN_SIMULATORS)" in result.output
    result = CliRunner().invoke(app, ["bench", "sampling", "--env", "127.0.0.1:5000", "--out", str(tmp_path / "b")])
    assert result.exit_code == 2 and "give --simulators 127.0.0.1:5000 instead of --env" in result.output


def test_train_refuses_a_misspelt_variable_naming_the_right_one(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["train", "--runs-dir", str(tmp_path)], env={"FAST_TRAIN_SIMULATRS": "127.0.0.1:9"}
    )
    assert result.exit_code == 2
    assert "FAST_TRAIN_SIMULATRS" in result.output and "did you mean FAST_TRAIN_SIMULATORS?" in result.output


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["bench", "sampling", "--preset", "off"], "--preset"),
        (["bench", "sampling", "--servers", "2"], "--servers"),
        (["bench", "sampling", "--env", "takeover"], "--env"),
        (["bench", "sampling", "--gym-reference"], "--gym-reference"),
        (["bench", "train", "--clips", "4"], "--clips"),
        (["bench", "train", "--servers", "2"], "--servers"),
        (["bench", "train", "--preset", "off"], "--preset"),
        (["compare", "runs/a", "runs/b", "--servers", "2"], "--servers"),
        (["compare", "runs/a", "runs/b", "--slots", "4"], "--slots"),
    ],
)
def test_bench_and_compare_refuse_simulator_settings_with_external_simulators(
    tmp_path: Path, args: list[str], named: str
) -> None:
    extra = [] if args[0] == "compare" else ["--out", str(tmp_path / "out")]
    result = CliRunner().invoke(app, [*args, "--simulators", "127.0.0.1:9", *extra])
    assert result.exit_code == 2, result.output
    assert f"{named} does not apply with --simulators" in result.output
