"""The same seed on the same machine gives the same run: metrics, evaluation and weights.

Two short `fast train` runs with one seed, started as a user starts them (every service its own
process, lock-step sampling over two simulator servers that answer in whichever order), must
agree on everything but wall-clock times. What is allowed to differ is listed in broker.metrics.TIMING_KEYS;
anything else that differs is a source of randomness or of timing-dependent order to fix.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from test_train import RUN_TIMEOUT_S, TINY, fast_train, finish

from broker.metrics import without_timings
from learner.checkpoint import load_latest


def _metrics(run_dir: Path) -> list[dict]:
    return [without_timings(json.loads(line)) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_same_seed_same_machine_gives_identical_metrics_and_weights(tmp_path: Path) -> None:
    """Two runs side by side, one over the local step sockets (the default), one over gRPC
    (FAST_TRAIN_LOCAL_STEP=false), learn the same policy: equal runs with different transports are
    equal runs (a source of randomness or of timing-dependent order would tell them apart whatever the
    transport), and the transport changes nothing."""
    args = [*TINY, "--iterations", "4", "--seed", "3", "--mode", "fast"]
    envs = {"first": {}, "grpc": {"FAST_TRAIN_LOCAL_STEP": "false"}}
    runs = [fast_train(tmp_path, name, *args, env=env) for name, env in envs.items()]
    for process in runs:
        code, output = finish(process, RUN_TIMEOUT_S * 3)
        assert code == 0, output[-3000:]
    dirs = [tmp_path / name for name in envs]
    transports = [yaml.safe_load((d / "config.yaml").read_text())["train"]["local_step"] for d in dirs]
    assert transports == [True, False]

    first, *others = dirs
    metrics = _metrics(first)
    # Not vacuous: the comparison holds counts, episode lengths, returns and the learner's losses.
    assert len(metrics) == 4 and metrics[0]["valid_transitions"] > 0 and "policy_loss" in metrics[-1]["learner"]
    evaluation = without_timings(json.loads((first / "eval.json").read_text()))
    a = load_latest(first / "checkpoints")
    assert a.policy_version == 4
    for other in others:
        assert metrics == _metrics(other), other.name
        assert evaluation == without_timings(json.loads((other / "eval.json").read_text())), other.name
        b = load_latest(other / "checkpoints")
        assert b.policy_version == 4
        for name, tensor in a.learner_state["policy"].items():
            assert torch.equal(tensor, b.learner_state["policy"][name]), f"{other.name}: policy weight {name} differs"
