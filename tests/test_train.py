"""`fast train` as a user runs it (a subprocess starting real processes), evaluation against a real
simulator server, and the report from a synthetic run directory."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import stat
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import sim_server
from typer.testing import CliRunner

from broker.evaluate import EvaluationError, EvaluationSession, evaluate, evaluation_episodes, summarize
from broker.in_process import InProcessPool
from broker.policy_runner import PolicyRunner
from broker.pool import SimulatorPool
from fast import auth
from fast.config import ConfigError, resolve_config
from fast.rpc import Credentials, open_blocking_channel
from fast.v1 import broker_pb2, broker_pb2_grpc
from jobs.bench.limits import costs_from_describe, line_limit
from jobs.cli import app
from jobs.train.config import ENV_PREFIX, TrainConfig
from jobs.train.report import PLOTS, ReportError, write_report
from learner.policy import export_weights
from sim_server.cost_model import PRESETS, CostModel, cost_model_config
from sim_server.environments import make_env
from sim_server.simulator import Simulator
from sim_server.takeover.metrics import METRIC_NAMES

# Tiny sizes: every mode trains 2 iterations in seconds; evaluation still plays all 20 held-out clips.
TINY = [
    "--servers",
    "2",
    "--slots",
    "2",
    "--samples-per-iteration",
    "128",
    "--update-epochs",
    "1",
    "--eval-episodes-per-clip",
    "1",
]
ROOT = Path(__file__).resolve().parent.parent
RUN_TIMEOUT_S = 100  # one tiny run takes ~20 s on a loaded 2-core CPU
_GATEWAY_LINE = re.compile(r"^gateway: (http://\S+)")


def fast_train(tmp_path: Path, name: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """`fast train` as a user starts it; `env`: variables added to this process's environment."""
    return subprocess.Popen(
        [sys.executable, "-m", "fast", "train", "--runs-dir", str(tmp_path), "--name", name, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
    )


def finish(process: subprocess.Popen, timeout_s: float) -> tuple[int, str]:
    try:
        output, _ = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        output, _ = process.communicate()
        pytest.fail(f"fast train did not finish in {timeout_s} s: {output[-3000:]}")
    return process.returncode, output


def recorded_pids(run_dir: Path) -> dict[str, int]:
    processes = yaml.safe_load((run_dir / "config.yaml").read_text())["processes"]
    return {name: entry["pid"] for name, entry in processes.items()}


def assert_all_gone(pids: dict[str, int]) -> None:
    alive = []
    for name, pid in pids.items():
        try:
            os.kill(pid, 0)
            alive.append(f"{name} (pid {pid})")
        except ProcessLookupError:
            pass
    assert not alive, f"still running after fast train exited: {', '.join(alive)}"


def _first_line_mode(run_dir: Path) -> str:
    return json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])["mode"]


# Every mode trains end to end through `fast train`: fast here, sc, autoreset and sgr in the stop tests
# below, ver (and fast) in the `--mode auto` run of tests/test_auto_alpha.py, whose second iteration
# samples in ver (one stack each; the modes' batches are tested against references elsewhere).
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["fast"])
def test_train_writes_the_run_directory_and_stops_every_process(tmp_path: Path, mode: str) -> None:
    # The user's environment names a token file that does not exist: if `fast train` or any of its
    # services used the environment's token instead of the run's own, the run would fail.
    env = {auth.TOKEN_FILE_ENV: str(tmp_path / "no-such-token")}
    process = fast_train(tmp_path, mode, "--mode", mode, "--iterations", "2", *TINY, env=env)
    code, output = finish(process, RUN_TIMEOUT_S)
    assert code == 0, output[-3000:]
    run_dir = tmp_path / mode
    token_file = run_dir / "token"
    token = token_file.read_text().strip()
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600 and len(token) >= 40
    # Printed once, in the dashboard URL's fragment (docs/security.md), and nowhere else.
    assert output.count(token) == 1 and token not in (run_dir / "config.yaml").read_text()
    for entry in yaml.safe_load((run_dir / "config.yaml").read_text())["processes"].values():
        assert f"{auth.TOKEN_FILE_ENV}={token_file}" in entry["command"]

    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert config["train"]["mode"] == mode and config["train"]["update_epochs"] == 1
    assert sorted(config["processes"]) == ["broker", "gateway", "learner", "sim-server-0", "sim-server-1"]
    gateway = config["processes"].pop("gateway")
    assert all(entry["address"].startswith("127.0.0.1:") for entry in config["processes"].values())
    assert f"--mode {mode}" in config["processes"]["broker"]["command"]
    # The gateway's URL is printed once, with the run's token in the fragment for the dashboard.
    token = (run_dir / "token").read_text().strip()
    assert gateway["address"].startswith("http://127.0.0.1:")
    assert output.count(f"{gateway['address']}/#token={token}") == 1

    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["iteration"] for m in lines] == [1, 2] and all(m["mode"] == mode for m in lines)
    # Each line holds the servers' answers of its iteration, and the limit they and the preset's costs put
    # on the pattern sampled is one the iteration did not beat (jobs/bench/limits.py `line_limit`).
    costs = costs_from_describe(PRESETS[config["train"]["cost_preset"]])
    assert lines[0]["pool_calls"]["reset_slots"] >= 4  # the first round resets every slot
    for m in lines:
        assert m["pool_calls"]["step_calls"] > 0
        assert line_limit(m, costs, servers=2).limit >= m["effective_throughput"]
    assert list((run_dir / "tb").glob("events.out.tfevents.*"))
    assert list((run_dir / "checkpoints").glob("ckpt-*.pt"))

    evaluation = json.loads((run_dir / "eval.json").read_text())
    assert evaluation["policy_version"] == 2 and evaluation["policy_source"] == "learner"
    assert len(evaluation["clips"]) == 20  # every 10th of the 200 takeover clips
    assert evaluation["initial"]["policy_version"] == 0
    for policy in ("trained", "initial", "random"):
        episodes = evaluation[policy]["episodes"]
        assert [e["clip_id"] for e in episodes] == evaluation["clips"]
        assert 0.0 <= evaluation[policy]["summary"]["collided_rate"] <= 1.0

    report = (run_dir / "report.md").read_text()
    assert "eval collision rate, trained vs initial vs random" in report and "validity eta, last iteration" in report
    assert "| sampling against the limit the simulators' costs allow |" in report
    assert all((run_dir / png).stat().st_size > 0 for png in PLOTS)
    outcome = json.loads((run_dir / "outcome.json").read_text())
    assert outcome["outcome"] == "done" and outcome["exit_codes"] == dict.fromkeys(recorded_pids(run_dir), 0)
    assert_all_gone(recorded_pids(run_dir))


# `fast train --ranks 2` run to its end (a broker per rank on its shard, one update over the union of
# their batches): tests/test_train_ranks_restart.py, which kills a rank on the way.


def _http(method: str, url: str, token: str | None = None) -> tuple[int, dict]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(url, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


@pytest.mark.slow
def test_train_with_two_ranks_gateway_shows_both_brokers_and_ranks_and_stops_both(tmp_path: Path) -> None:
    """The gateway of `fast train --ranks 2` over HTTP: both brokers and ranks in /v1/status, and a stop
    through it that reaches both brokers, which end at the same iteration. First broker-1 alone is paused
    (directly over gRPC): taken at its own boundary, that pause would let broker 0 go on into the next
    iteration, whose update then waits for broker-1's batch until the group fails (and a stop would then
    end broker-1 and leave broker 0 waiting). The ranks agree on pauses and stops with the update
    (broker/group_control.py), so both brokers pause after the same iteration, and both stop together."""
    process = fast_train(
        tmp_path, "ranks-gw", "--ranks", "2", "--iterations", "200", *TINY, "--eval-episodes-per-clip", "0"
    )
    lines: list[str] = []

    def read() -> None:
        for line in process.stdout:
            lines.append(line)

    threading.Thread(target=read, daemon=True).start()
    try:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while not (url := next((m.group(1) for m in map(_GATEWAY_LINE.search, lines) if m), None)):
            assert process.poll() is None and time.monotonic() < deadline, "".join(lines)[-3000:]
            time.sleep(0.2)
        while True:
            code, status = _http("GET", f"{url}/v1/status")
            brokers = status.get("brokers", [])
            if code == 200 and len(brokers) == 2 and all(b["up"] and b["run"]["iteration"] >= 1 for b in brokers):
                break
            assert process.poll() is None and time.monotonic() < deadline, (code, status, "".join(lines)[-3000:])
            time.sleep(0.3)
        assert [(r["name"], r["up"]) for r in status["ranks"]] == [("learner", True), ("learner-1", True)]
        totals = status["totals"]
        assert (totals["brokers_answered"], totals["ranks_answered"], totals["num_slots"]) == (2, 2, 4)
        assert not totals["learner_policy_versions_differ"]
        assert {s["address"] for b in brokers for s in b["run"]["simulators"]} == {
            s["address"] for s in _http("GET", f"{url}/v1/simulators")[1]
        }
        token = (tmp_path / "ranks-gw" / "token").read_text().strip()
        with open_blocking_channel(brokers[1]["address"], credentials=Credentials(token)) as channel:
            stub = broker_pb2_grpc.BrokerStub(channel)
            stub.Control(broker_pb2.ControlRequest(action=broker_pb2.CONTROL_ACTION_PAUSE), timeout=10)
            while stub.GetRunStatus(broker_pb2.GetRunStatusRequest(), timeout=10).state != broker_pb2.RUN_STATE_PAUSED:
                assert time.monotonic() < deadline, "broker-1 did not pause"
                time.sleep(0.1)
        time.sleep(1.0)  # were broker 0 not paused too, it would be into its next iteration by now
        code, status = _http("GET", f"{url}/v1/status")
        assert [(b["run"]["state"], b["run"]["iteration"]) for b in status["brokers"]] == [
            ("paused", status["brokers"][1]["run"]["iteration"])
        ] * 2, status["brokers"]
        code, answer = _http("POST", f"{url}/v1/run/stop", token)
        assert code == 200, answer
        assert [(b["name"], b["applied"]) for b in answer["brokers"]] == [("broker", True), ("broker-1", True)]
        assert process.wait(timeout=RUN_TIMEOUT_S) == 0, "".join(lines)[-3000:]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    run_dir = tmp_path / "ranks-gw"
    iterations = [len((d / "metrics.jsonl").read_text().splitlines()) for d in (run_dir, run_dir / "rank-1")]
    assert iterations[0] == iterations[1] < 200  # stopped together, well before the end
    assert_all_gone(recorded_pids(run_dir))


@pytest.mark.slow
def test_train_sigint_mid_run_stops_every_process(tmp_path: Path) -> None:
    """Started as the README starts it, `python3 dev.py train`, and interrupted by a SIGINT to that pid
    alone: dev.py hands its process over to `fast train` (exec), so the signal reaches the job itself."""
    command = [sys.executable, str(ROOT / "dev.py"), "train", "--runs-dir", str(tmp_path), "--name", "interrupted"]
    process = subprocess.Popen(
        [*command, "--mode", "sc", "--iterations", "1000", *TINY],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    metrics = tmp_path / "interrupted" / "metrics.jsonl"
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while not (metrics.is_file() and metrics.read_text().count("\n") >= 1):
        if process.poll() is not None or time.monotonic() > deadline:
            finish(process, 5)
            pytest.fail("fast train ended or stalled before its first iteration")
        time.sleep(0.2)
    pids = _all_recorded(tmp_path / "interrupted")

    interrupted_at = time.monotonic()
    process.send_signal(signal.SIGINT)
    code, output = finish(process, 60)
    assert time.monotonic() - interrupted_at < 60
    assert code == 128 + signal.SIGINT, output[-3000:]
    assert "SIGINT received: stopping" in output
    assert_all_gone(pids)
    outcome = json.loads((tmp_path / "interrupted" / "outcome.json").read_text())
    assert outcome["outcome"] == "interrupted" and 1 <= outcome["iterations"] < 1000
    # The broker finished its iteration on SIGTERM; the learner checkpointed its final version.
    assert outcome["exit_codes"]["broker"] == 0 and outcome["exit_codes"]["learner"] == 0
    assert (tmp_path / "interrupted" / "report.md").is_file()
    assert _first_line_mode(tmp_path / "interrupted") == "sc"


def _all_recorded(run_dir: Path) -> dict[str, int]:
    """The five processes' pids, once config.yaml holds them all (the gateway starts last)."""
    deadline = time.monotonic() + 60
    while len(pids := recorded_pids(run_dir)) < 5 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert sorted(pids) == ["broker", "gateway", "learner", "sim-server-0", "sim-server-1"]
    return pids


def _running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's zombie waits for whoever adopted it to reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _left_running(pids: dict[str, int], *, within_s: float) -> list[str]:
    """Wait up to `within_s` for every process to end; those still running, which are then SIGKILLed
    (never left behind, even when the caller's assertion fails)."""
    deadline = time.monotonic() + within_s
    while any(_running(pid) for pid in pids.values()) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [f"{name} (pid {pid})" for name, pid in pids.items() if _running(pid)]
    for pid in pids.values():
        if _running(pid):
            os.kill(pid, signal.SIGKILL)
    return left


@pytest.mark.slow
def test_train_killed_with_sigkill_leaves_no_process_behind(tmp_path: Path) -> None:
    process = fast_train(tmp_path, "killed", "--mode", "autoreset", "--iterations", "1000", *TINY)
    run_dir = tmp_path / "killed"
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while not ((run_dir / "metrics.jsonl").is_file() and (run_dir / "metrics.jsonl").read_text().count("\n") >= 1):
        if process.poll() is not None or time.monotonic() > deadline:
            finish(process, 5)
            pytest.fail("fast train ended or stalled before its first iteration")
        time.sleep(0.2)
    pids = _all_recorded(run_dir)
    # Each child leads a session of its own, so a terminal's Ctrl-C reaches only fast train.
    assert all(os.getsid(pid) == pid for pid in pids.values())

    process.kill()  # SIGKILL: fast train stops nobody
    process.communicate(timeout=10)
    left = _left_running(pids, within_s=60)
    assert not left, f"still running 60 s after fast train was SIGKILLed: {', '.join(left)}"
    # They stopped through their SIGTERM path: the learner wrote a final checkpoint past version 0.
    versions = [int(p.stem.split("-")[1]) for p in (run_dir / "checkpoints").glob("ckpt-*.pt")]
    assert max(versions) >= 1
    assert _first_line_mode(run_dir) == "autoreset"


# A job that starts `fast train` with FAST_PARENT_PID (as `fast bench train` does) and its output
# in a file, not a pipe: nothing breaks for the run when the job dies, unless it watches the job.
_PARENT_JOB = """
import os, subprocess, sys, time
runs, log, *args = sys.argv[1:]
with open(log, "w") as out:
    child = subprocess.Popen(
        [sys.executable, "-m", "fast", "train", "--runs-dir", runs, "--name", "orphan", *args],
        stdout=out, stderr=subprocess.STDOUT,
        env={**os.environ, "FAST_PARENT_PID": str(os.getpid()), "PYTHONUNBUFFERED": "1"},
    )
print(child.pid, flush=True)
time.sleep(600)
"""


@pytest.mark.slow
def test_train_started_by_a_job_stops_gracefully_when_the_job_is_killed(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    job = subprocess.Popen(
        [sys.executable, "-c", _PARENT_JOB, str(tmp_path), str(log), "--mode", "sgr", "--iterations", "1000", *TINY],
        stdout=subprocess.PIPE,
        text=True,
    )
    train_pid = int(job.stdout.readline())
    run_dir = tmp_path / "orphan"
    try:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while not ((run_dir / "metrics.jsonl").is_file() and (run_dir / "metrics.jsonl").read_text().count("\n") >= 1):
            assert _running(train_pid) and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        pids = {"train": train_pid, **_all_recorded(run_dir)}
        job.kill()  # SIGKILL: the job stops nobody
        job.communicate(timeout=10)
        left = _left_running(pids, within_s=60)
        assert not left, f"still running 60 s after the job that started fast train was killed: {', '.join(left)}"
        # Its SIGTERM path, not a crash: the stop is announced and the iteration reached is checkpointed.
        assert "SIGTERM received: stopping" in log.read_text(), log.read_text()[-3000:]
        versions = [int(p.stem.split("-")[1]) for p in (run_dir / "checkpoints").glob("ckpt-*.pt")]
        assert max(versions) >= 1
        assert _first_line_mode(run_dir) == "sgr"
    finally:
        for pid in [train_pid, *recorded_pids(run_dir).values()] if (run_dir / "config.yaml").exists() else [train_pid]:
            if _running(pid):
                os.kill(pid, signal.SIGKILL)
        if job.poll() is None:
            job.kill()
            job.wait()


def test_train_refuses_a_used_run_directory(tmp_path: Path) -> None:
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "metrics.jsonl").write_text("")
    result = CliRunner().invoke(app, ["train", "--runs-dir", str(tmp_path), "--name", "taken"])
    assert result.exit_code == 2
    assert "already holds a run; pick another --name" in result.output


def test_train_config_defaults_and_errors() -> None:
    cfg = resolve_config(TrainConfig, env_prefix=ENV_PREFIX, environ={}, overrides={"mode": "sgr"})
    assert cfg.name.startswith("sgr-") and cfg.run_dir == Path("runs") / cfg.name
    assert (cfg.servers, cfg.slots, cfg.iterations, cfg.samples_per_iteration) == (2, 5, 350, 2048)
    env = {"FAST_TRAIN_SLOTS": "3", "FAST_TRAIN_GAMMA": "0.995"}
    cfg = resolve_config(TrainConfig, env_prefix=ENV_PREFIX, environ=env, overrides={"slots": 4})
    assert (cfg.slots, cfg.gamma) == (4, 0.995)  # a flag beats the environment
    with pytest.raises(ConfigError) as error:
        resolve_config(TrainConfig, environ={}, overrides={"mode": "async", "name": "../up", "cost_preset": "fast"})
    message = str(error.value)
    assert "mode='async'" in message and "name='../up'" in message and "cost_preset='fast'" in message
    with pytest.raises(ConfigError, match="unknown setting"):
        resolve_config(TrainConfig, environ={}, overrides={"slot": 4})


# -- evaluate() against a real simulator server -----------------------------------------------

CLIPS = np.array([9, 19, 29])


async def _evaluate(address: str, with_policy: bool, episodes_per_clip: int = 1) -> list[dict]:
    pool = SimulatorPool()
    try:
        await pool.add(address)
        runner = PolicyRunner(pool.observation_space, pool.action_space, (64, 64), seed=0) if with_policy else None
        return await evaluate(pool, runner, CLIPS, episodes_per_clip, seed=3)
    finally:
        await pool.close()


async def _evaluate_after_server_died(server) -> None:
    pool = SimulatorPool()
    try:
        await pool.add(server.address)
        server.kill()
        await evaluate(pool, None, CLIPS, 1, seed=3)
    finally:
        await pool.close()


def test_evaluate_random_and_policy_play_every_episode_to_its_end() -> None:
    # One slot plays the three episodes in turn, three slots at once: the same episodes either way.
    with (
        sim_server("--env", "takeover", "--slots", "1") as one_slot,
        sim_server("--env", "takeover", "--slots", "3") as three_slots,
    ):
        random_episodes = asyncio.run(_evaluate(three_slots.address, with_policy=False))
        one_by_one = asyncio.run(_evaluate(one_slot.address, with_policy=False))
        policy_episodes = asyncio.run(_evaluate(three_slots.address, with_policy=True, episodes_per_clip=2))
        with pytest.raises(EvaluationError, match=f"Reset failed on simulator server.s. {one_slot.address}"):
            asyncio.run(_evaluate_after_server_died(one_slot))

    assert [e["clip_id"] for e in random_episodes] == CLIPS.tolist()
    clip_ids, seeds = evaluation_episodes(CLIPS, 1, seed=3)
    assert [e["seed"] for e in random_episodes] == seeds.tolist()
    for episode in random_episodes:
        assert set(METRIC_NAMES) <= set(episode)  # collided, off_road and every closed-loop metric
        assert episode["length"] >= 1 and isinstance(episode["terminated"], bool)
        assert episode["terminated"] == bool(episode["collided"] or episode["off_road"])
    assert random_episodes == one_by_one  # per-episode seeded actions, seeded resets

    assert [e["clip_id"] for e in policy_episodes] == np.repeat(CLIPS, 2).tolist()
    summary = summarize(policy_episodes)
    assert summary["episodes"] == 6 and 0.0 <= summary["collided_rate"] <= 1.0
    assert summary["length_mean"] == pytest.approx(np.mean([e["length"] for e in policy_episodes]))


async def _session_episodes(session: EvaluationSession, weights: bytes) -> tuple[list[dict], list[dict]]:
    """(policy, random) episodes of one session: what train, compare and bench play."""
    session.require_clips()
    return await session.play(session.policy((8,), 1, weights)), await session.play(None)


async def _over_grpc(address: str, weights: bytes) -> tuple[list[dict], list[dict]]:
    async with EvaluationSession.connect([address], holdout_every=10, episodes_per_clip=1, seed=3) as session:
        return await _session_episodes(session, weights)


def _takeover_in_process(slots: int) -> InProcessPool:
    """What `sim-server --env takeover --num-clips 40` serves, in this process."""
    return InProcessPool(
        [Simulator(make_env("takeover", slots, seed=0, num_clips=40), CostModel(cost_model_config("off")))]
    )


async def _in_process(weights: bytes) -> tuple[list[dict], list[dict]]:
    session = EvaluationSession(_takeover_in_process(3), holdout_every=10, episodes_per_clip=1, seed=3)
    return await _session_episodes(session, weights)


def test_evaluation_session_plays_the_same_episodes_over_grpc_and_in_process() -> None:
    pool = _takeover_in_process(1)
    weights = export_weights(PolicyRunner(pool.observation_space, pool.action_space, (8,), seed=5).policy)
    with sim_server("--env", "takeover", "--slots", "3", "--num-clips", "40") as server:
        over_grpc = asyncio.run(_over_grpc(server.address, weights))
    in_process = asyncio.run(_in_process(weights))
    for grpc_episodes, local_episodes in zip(over_grpc, in_process):
        assert [e["clip_id"] for e in grpc_episodes] == [9, 19, 29, 39]
        assert grpc_episodes == local_episodes  # every metric of every episode, the summaries included
    with pytest.raises(RuntimeError, match="no held-out clip among 40 with holdout_every=50"):
        EvaluationSession(pool, holdout_every=50, episodes_per_clip=1, seed=0).require_clips()


# -- the report from a synthetic run directory ------------------------------------------------


def _synthetic_run(run_dir: Path, with_eval: bool = True) -> None:
    run_dir.mkdir()
    lines = []
    for i in range(1, 4):
        lines.append(
            {
                "iteration": i,
                "time": 1000.0 + 2.0 * i,
                "iteration_time_s": 2.0,
                "mode": "fast",
                "episode_return_mean": float(i) if i != 2 else float("nan"),
                "effective_throughput": 900.0 + i,
                "raw_throughput": 1000.0,
                "validity": 0.9,
                "time_efficiency": 0.995,
                "valid_transitions": 128,
                "episode_lengths": [3, 40, 41, 300],
            }
        )
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    if with_eval:
        summary = lambda ret, col: {"episodes": 2, "return_mean": ret, "collided_rate": col, "length_mean": 50.0}  # noqa: E731
        (run_dir / "eval.json").write_text(
            json.dumps(
                {
                    "policy_version": 3,
                    "policy_source": "learner",
                    "clips": [9, 19],
                    "episodes_per_clip": 1,
                    "seed": 0,
                    "trained": {"summary": summary(12.5, 0.25), "episodes": []},
                    "random": {"summary": summary(-4.0, 0.75), "episodes": []},
                    "initial": {"summary": summary(1.0, 0.5), "episodes": [], "policy_version": 0},
                }
            )
        )


def test_report_from_synthetic_metrics(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    _synthetic_run(run_dir)
    report = write_report(run_dir).read_text()
    assert "| iterations | 3 |" in report
    assert "| wall-clock, training iterations | 6.0 s |" in report  # first start 1000, last end 1006
    assert "| return, first -> last iteration (training episodes) | 1.00 -> 3.00 |" in report
    assert "| eval return, trained vs initial vs random | 12.50 vs 1.00 vs -4.00 |" in report
    assert "| eval collision rate, trained vs initial vs random | 0.25 vs 0.50 vs 0.75 |" in report
    assert "| validity eta, last iteration | 0.900 |" in report
    assert "| time efficiency, last iteration | 0.9950 |" in report
    for png in PLOTS:
        assert (run_dir / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"]({png})" in report


def test_report_sets_the_runs_sampling_against_the_limit_its_costs_allow(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    _synthetic_run(run_dir)
    assert "against the limit" not in write_report(run_dir).read_text()  # no pool_calls: a run before them
    calls = dict(step_calls=200, step_server_s=0.4, reset_calls=1, reset_slots=8, map_loads=0, map_cache_hits=8)
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for m in lines:  # 128 valid of 160 over 10 slots; Steps of 2 ms: the step bound, 0.8 * 10 / 2 ms = 4,000/s
        m.update(num_slots=10, validity=0.8, sampling_time_s=0.1, pool_calls=calls)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    (run_dir / "config.yaml").write_text(yaml.safe_dump({"train": {"cost_preset": "calibrated", "servers": 2}}))
    report = write_report(run_dir).read_text()
    # 3 x 128 / 4,000 = 0.096 s at least, of 0.3 s sampled.
    row = "| sampling against the limit the simulators' costs allow |"
    assert f"{row} 0.3 s, at least 0.1 s (step): 0.32 of the limit |" in report
    (run_dir / "config.yaml").write_text(yaml.safe_dump({"train": {}, "simulators": {"servers": [{}, {}]}}))
    assert "(step, step bound alone): 0.32 of the limit" in write_report(run_dir).read_text()


def test_report_command_regenerates_and_names_missing_files(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    _synthetic_run(run_dir, with_eval=False)
    result = CliRunner().invoke(app, ["report", str(run_dir)])
    assert result.exit_code == 0, result.output
    assert "eval return" not in (run_dir / "report.md").read_text()  # no eval.json, no eval rows

    result = CliRunner().invoke(app, ["report", str(tmp_path / "nothing")])
    assert result.exit_code == 2 and "metrics.jsonl does not exist" in result.output
    with pytest.raises(ReportError, match="holds no iteration"):
        (tmp_path / "empty").mkdir()
        (tmp_path / "empty" / "metrics.jsonl").write_text("")
        write_report(tmp_path / "empty")


def test_train_refuses_more_ranks_than_simulator_servers() -> None:
    with pytest.raises(ValueError) as refused:
        TrainConfig(name="r", ranks=3, servers=2)
    assert "ranks is 3 but the run has 2 simulator server(s): each rank's broker needs one at least" in str(
        refused.value
    )
