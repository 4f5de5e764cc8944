"""`fast train`'s TensorBoard events without torch: the same file content as torch's SummaryWriter wrote,
and no torch in the process of `fast train` on a normal run (jobs/train/monitor.py TensorBoardSink)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from jobs.train.monitor import TensorBoardSink, scalars

ROOT = Path(__file__).resolve().parents[1]


def _metrics() -> list[dict]:
    """Three iterations as a broker writes them: numbers, nested dicts, episode lengths; one step
    with lengths at and below zero (bins on both sides of 0), one with a single length."""
    rng = np.random.default_rng(3)
    lengths = [
        [int(x) for x in rng.integers(1, 400, size=37)],
        [0, 0, 1, 2, 3, 5, 8, 13, -2, 1e-13, 2.5e6],
        [250],
    ]
    return [
        {
            "iteration": i + 1,
            "time": 1_700_000_000.25 + 7.5 * i,
            "num_slots": 4,
            "mode": "sync",
            "episode_return_mean": 10.0 * i - 3.3,
            "effective_throughput": 1234.5 + i,
            "validity": 0.9,
            "not_finite": float("nan"),
            "flag": True,
            "learner": {"policy_loss": 0.1 / (i + 1), "approx_kl": 1e-3 * i, "name": "x"},
            "episode_lengths": lengths[i],
        }
        for i in range(3)
    ]


def _write_with_torch(log_dir: Path, metrics: list[dict]) -> None:
    """What TensorBoardSink wrote before (torch.utils.tensorboard.SummaryWriter)."""
    SummaryWriter = pytest.importorskip("torch.utils.tensorboard").SummaryWriter
    writer = SummaryWriter(log_dir=str(log_dir))
    for m in metrics:
        step, walltime = int(m["iteration"]), m["time"]
        for tag, value in scalars(m):
            writer.add_scalar(tag, value, global_step=step, walltime=walltime)
        writer.add_histogram(
            "sampling/episode_lengths", np.asarray(m["episode_lengths"]), global_step=step, walltime=walltime
        )
        writer.flush()
    writer.close()


def _events(log_dir: Path) -> list:
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    (path,) = log_dir.glob("events.out.tfevents.*")
    return list(EventFileLoader(str(path)).Load())


def test_sink_writes_what_torch_summary_writer_wrote(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    metrics = _metrics()
    _write_with_torch(tmp_path / "torch", metrics)
    sink = TensorBoardSink(tmp_path / "sink")
    for m in metrics:
        sink.write(m)
    sink.close()

    everything = {"compressedHistograms": 0, "images": 0, "audio": 0, "scalars": 0, "histograms": 0, "tensors": 0}
    ours, theirs = (EventAccumulator(str(tmp_path / d), size_guidance=everything).Reload() for d in ("sink", "torch"))
    assert ours.Tags() == theirs.Tags()
    assert ours.Tags()["histograms"] == ["sampling/episode_lengths"]
    assert len(ours.Tags()["scalars"]) == 5
    for tag in ours.Tags()["scalars"]:
        assert ours.Scalars(tag) == theirs.Scalars(tag)
        assert [(e.step, e.wall_time) for e in ours.Scalars(tag)] == [(m["iteration"], m["time"]) for m in metrics]
    ours_h, theirs_h = ours.Histograms("sampling/episode_lengths"), theirs.Histograms("sampling/episode_lengths")
    assert [(e.step, e.wall_time) for e in ours_h] == [(e.step, e.wall_time) for e in theirs_h]
    assert [e.step for e in ours_h] == [1, 2, 3]
    for a, b in zip(ours_h, theirs_h, strict=True):
        for field in ("min", "max", "num", "sum", "sum_squares", "bucket_limit", "bucket"):
            assert getattr(a.histogram_value, field) == getattr(b.histogram_value, field), field

    # Event for event: the same records after the first (file_version, written at the writer's start).
    ours_e, theirs_e = _events(tmp_path / "sink"), _events(tmp_path / "torch")
    assert len(ours_e) == len(theirs_e) == 1 + 3 * (5 + 1)  # file_version, then 5 scalars and 1 histogram a step
    assert ours_e[0].file_version == theirs_e[0].file_version == "brain.Event:2"
    assert ours_e[0].source_metadata == theirs_e[0].source_metadata
    assert [e.SerializeToString() for e in ours_e[1:]] == [e.SerializeToString() for e in theirs_e[1:]]


def _without_torch(code: str) -> str:
    """Runs `code` in a fresh interpreter and returns the modules of interest it left loaded."""
    script = code + "\nimport sys; print(sorted(m for m in ('torch', 'tensorflow') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def test_sink_imports_neither_torch_nor_tensorflow(tmp_path: Path) -> None:
    code = textwrap.dedent(f"""
        from jobs.train.monitor import TensorBoardSink
        sink = TensorBoardSink({str(tmp_path)!r})
        sink.write({{"iteration": 1, "time": 1.0, "validity": 0.5, "episode_lengths": [3, 4, 5]}})
        sink.close()
    """)
    assert _without_torch(code) == "[]"
    assert list(tmp_path.glob("events.out.tfevents.*"))


def test_fast_train_modules_import_no_torch() -> None:
    """`fast train`'s own process: torch is the learner's (and a checkpoint fallback's), never imported here."""
    modules = [
        "jobs.cli",
        "jobs.train.orchestrate",
        "jobs.train.evaluation",
        "jobs.train.monitor",
        "jobs.train.restart",
    ]
    assert _without_torch("\n".join(f"import {m}" for m in modules)) == "[]"


class _GoneLearner:
    """A LearnerClient whose learner is gone: UNAVAILABLE at once (a real one waits out its deadline)."""

    def __init__(self, *args, **kwargs) -> None:
        pass

    async def __aenter__(self) -> "_GoneLearner":
        return self

    async def __aexit__(self, *exc) -> None:
        return None

    async def get_policy(self):
        import grpc

        raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), "gone")


def test_final_policy_falls_back_to_the_newest_checkpoint(tmp_path: Path, monkeypatch) -> None:
    """The one path of `fast train` that loads torch (learner.checkpoint, imported there): a learner that
    does not answer, its newest checkpoint evaluated instead; none at all is an error."""
    import asyncio

    from test_learner_service import ACTION_SPACE, OBS_SPACE

    from jobs.train import evaluation
    from jobs.train.evaluation import fetch_final_policy
    from learner.checkpoint import load_latest, policy_weights
    from learner.config import LearnerConfig
    from learner.core import LearnerCore

    monkeypatch.setattr(evaluation, "LearnerClient", _GoneLearner)
    gone = "127.0.0.1:1"
    with pytest.raises(RuntimeError, match="holds no checkpoint"):
        asyncio.run(fetch_final_policy(gone, tmp_path))
    asyncio.run(LearnerCore(LearnerConfig(checkpoint_dir=tmp_path)).initialize(OBS_SPACE, ACTION_SPACE))
    final = asyncio.run(fetch_final_policy(gone, tmp_path))
    checkpoint = load_latest(tmp_path)
    assert (final.version, final.hidden_sizes, final.weights) == (
        0,
        checkpoint.hidden_sizes,
        policy_weights(checkpoint),
    )
    assert final.source == str(tmp_path / "ckpt-000000000.pt")
