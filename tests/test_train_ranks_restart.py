"""Restarting `fast train --ranks`'s group after a rank dies: where it resumes and what the metrics keep
(jobs/train/restart.py, exact cases on files), and a run whose learner rank 1 is SIGKILLed mid-run."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import yaml
from test_train import assert_all_gone, fast_train, finish, recorded_pids

from broker.metrics_file import drop_lines_from, recorded_versions
from jobs.train.monitor import MetricsTail
from jobs.train.restart import SUPERSEDED, choose_resume_point


def _metrics(path: Path, versions: list[int], partial: bool = False) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = "".join(json.dumps({"iteration": v + 1, "policy_version": v}) + "\n" for v in versions)
    path.write_text(lines + ('{"iteration": 99, "policy_ver' if partial else ""))
    return path


def _checkpoints(directory: Path, versions: list[int]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for version in versions:
        (directory / f"ckpt-{version:09d}.pt").write_bytes(b"weights")
    return directory


def test_resume_at_the_newest_checkpoint_drops_the_lines_past_it(tmp_path: Path) -> None:
    checkpoints = _checkpoints(tmp_path / "checkpoints", [4, 6])
    metrics = _metrics(tmp_path / "metrics.jsonl", list(range(8)), partial=True)
    point = choose_resume_point(checkpoints, [metrics])
    assert (point.version, point.recorded, point.set_aside, point.gap) == (6, 8, [], "")
    tail = MetricsTail(metrics)
    assert len(tail.read_new()) == 8
    assert drop_lines_from(metrics, 6) == 3  # versions 6 and 7, and the partial line
    assert recorded_versions(metrics) == [0, 1, 2, 3, 4, 5]
    tail.follow_truncation()
    _metrics(tmp_path / "redone.jsonl", [6])
    with metrics.open("a") as file:
        file.write((tmp_path / "redone.jsonl").read_text())
    assert [m["policy_version"] for m in tail.read_new()] == [6]  # the redone version, read once


def test_a_checkpoint_no_brokers_line_reaches_is_set_aside(tmp_path: Path) -> None:
    """Rank 0 wrote version 6 and died before broker 1 heard of update 5 -> 6: resuming at 6 would skip
    version 5 in rank-1/metrics.jsonl, so the group resumes at 4 and 6 waits in superseded/."""
    checkpoints = _checkpoints(tmp_path / "checkpoints", [2, 4, 6])
    files = [_metrics(tmp_path / "metrics.jsonl", list(range(6))), _metrics(tmp_path / "r1.jsonl", list(range(5)))]
    point = choose_resume_point(checkpoints, files)
    assert (point.version, point.recorded, point.set_aside) == (4, 5, [6])
    assert sorted(p.name for p in checkpoints.glob("ckpt-*.pt")) == ["ckpt-000000002.pt", "ckpt-000000004.pt"]
    assert (checkpoints / SUPERSEDED / "ckpt-000000006.pt").exists()


def test_without_a_checkpoint_old_enough_the_newest_is_resumed_and_the_gap_told(tmp_path: Path) -> None:
    checkpoints = _checkpoints(tmp_path / "checkpoints", [6])
    point = choose_resume_point(checkpoints, [_metrics(tmp_path / "metrics.jsonl", list(range(4)))])
    assert (point.version, point.set_aside) == (6, [])
    assert point.gap == "versions 4 to 5 have no metrics line (no checkpoint at or below 4 is kept)"


def test_without_any_checkpoint_the_group_starts_afresh(tmp_path: Path) -> None:
    point = choose_resume_point(tmp_path / "none", [tmp_path / "metrics.jsonl"])
    assert (point.version, point.recorded) == (None, 0)


# 50 to 80 s on the 2-core CPU (two starts of the group, 10 tiny iterations), over 120 s when others load it.
RESTART_TIMEOUT_S = 220


def _lines(path: Path) -> list[dict]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.split("\n")[:-1]]


# A tiny two-rank run without evaluation or gateway, for the kill tests below.
TWO_RANKS = ("--ranks", "2", "--servers", "2", "--slots", "2", "--samples-per-iteration", "64", "--update-epochs", "1")
TWO_RANKS += ("--eval-episodes-per-clip", "0", "--no-gateway")


@pytest.mark.slow
@pytest.mark.timeout(RESTART_TIMEOUT_S + 20)
def test_train_with_two_ranks_restarts_the_group_after_a_rank_is_killed(tmp_path: Path) -> None:
    """Learner rank 0 SIGKILLed two versions past its checkpoint of version 3: the group restarts once, every
    rank resumes from the newest checkpoint whose version the metrics reach, the lines past it are dropped and
    their versions trained again, and the run ends with every version recorded once, in order."""
    iterations = 10
    args = ["--iterations", str(iterations), "--checkpoint-every", "3", "--max-restarts", "3"]
    process = fast_train(tmp_path, "restart", *TWO_RANKS, *args)
    run_dir = tmp_path / "restart"
    first_group: dict[str, int] = {}
    try:
        deadline = time.monotonic() + RESTART_TIMEOUT_S
        while "broker-1" not in first_group:  # config.yaml names the brokers once they sample
            assert process.poll() is None and time.monotonic() < deadline, "fast train did not start its brokers"
            time.sleep(0.1)
            first_group = recorded_pids(run_dir) if (run_dir / "config.yaml").exists() else {}
        while len(_lines(run_dir / "metrics.jsonl")) < 5:  # versions 0..4 learnt from: past the checkpoint at 3
            assert process.poll() is None and time.monotonic() < deadline, "fast train did not reach version 5"
            time.sleep(0.02)
        os.kill(first_group["learner"], signal.SIGKILL)
        code, output = finish(process, max(1.0, deadline - time.monotonic()))
    finally:
        if process.poll() is None:  # its children stop themselves once it is gone (FAST_PARENT_PID)
            process.kill()
            process.wait()
    assert code == 0, output[-4000:]
    assert output.count("restarting the group (1 of at most 3): learner exited with code -9") == 1, output[-4000:]
    assert output.count("group restarted: every rank resumed from policy version") == 1

    outcome = json.loads((run_dir / "outcome.json").read_text())
    assert outcome["outcome"] == "done" and len(outcome["restarts"]) == 1, outcome
    restart = outcome["restarts"][0]
    assert restart["exit_codes"]["learner"] == -9 and "gap" not in restart, restart
    resumed = restart["resumed_version"]
    assert resumed in (3, 6), restart  # rank 0 died before its checkpoint of version 6, or just after it
    if resumed == 3:  # the lines of versions 3 and 4 (at least) were dropped, and those versions trained again
        assert restart["metrics_lines_dropped"]["metrics.jsonl"] >= 2, restart
    # Every version once, in order, in the run's metrics and in broker 1's; the iterations count on.
    for directory in (run_dir, run_dir / "rank-1"):
        lines = _lines(directory / "metrics.jsonl")
        assert [(m["iteration"], m["policy_version"]) for m in lines] == [(v + 1, v) for v in range(iterations)]
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("ckpt-*.pt"))[-1] == f"ckpt-{iterations:09d}.pt"
    # The second group's brokers count on from the resumed version.
    processes = yaml.safe_load((run_dir / "config.yaml").read_text())["processes"]
    assert f"--first-iteration {resumed}" in processes["broker"]["command"]
    assert f"--first-iteration {resumed}" in processes["broker-1"]["command"]
    # A broker per learner rank, each on its share of the servers (dealt round-robin), feeding its rank.
    assert sorted(processes) == ["broker", "broker-1", "learner", "learner-1", "sim-server-0", "sim-server-1"]
    commands = {name: entry["command"] for name, entry in processes.items()}
    assert "--world-size 2 --rank 0" in commands["learner"] and "--world-size 2 --rank 1" in commands["learner-1"]
    assert f"--simulators {processes['sim-server-0']['address']} " in commands["broker"]
    assert f"--simulators {processes['sim-server-1']['address']} " in commands["broker-1"]
    assert f"--learner {processes['learner-1']['address']} " in commands["broker-1"]
    # One update over both brokers' batches: both ranks report the same statistics of the union.
    ranks = [_lines(directory / "metrics.jsonl") for directory in (run_dir, run_dir / "rank-1")]
    assert [m["learner"]["num_valid"] for m in ranks[0]] == [m["learner"]["num_valid"] for m in ranks[1]]
    assert all(m["learner"]["num_valid"] >= 2 * 64 for m in ranks[0])
    assert_all_gone(recorded_pids(run_dir) | first_group)


@pytest.mark.slow
@pytest.mark.chaos
@pytest.mark.timeout(RESTART_TIMEOUT_S + 20)
def test_train_with_no_restarts_left_fails_when_a_rank_dies(tmp_path: Path) -> None:
    """--max-restarts 0, the default: the first death fails the run (exit 1), nothing left running."""
    process = fast_train(tmp_path, "no-restart", *TWO_RANKS, "--iterations", "200")
    run_dir = tmp_path / "no-restart"
    try:
        deadline = time.monotonic() + RESTART_TIMEOUT_S
        while not _lines(run_dir / "metrics.jsonl"):
            assert process.poll() is None and time.monotonic() < deadline, "fast train learnt nothing"
            time.sleep(0.1)
        pids = recorded_pids(run_dir)
        os.kill(pids["learner-1"], signal.SIGKILL)
        code, output = finish(process, max(1.0, deadline - time.monotonic()))
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert code == 1, output[-4000:]
    assert "restarting the group" not in output and "fast train failed: the learner-1 exited with code -9" in output
    outcome = json.loads((run_dir / "outcome.json").read_text())
    assert (outcome["outcome"], outcome["restarts"]) == ("failed", [])
    assert_all_gone(pids)
