"""Where a restarted group resumes, and the metrics files made to agree with it (`fast train`'s max_restarts).

When a learner rank or a broker dies mid-run, `fast train` stops every rank and broker and starts them
again, as torchrun's `--max-restarts` would; the learners resume from the newest checkpoint in the run's
checkpoint directory (learner/core.py), and the brokers sample from that version on. Two records must
then agree with the learners' version sequence, with no version repeated and none skipped:

- **Lines past the checkpoint are dropped.** A broker writes the line of version v once the update
  v -> v+1 answered. Updates after the newest checkpoint are lost with the learners that made them, so
  their lines (policy_version >= the resumed version) are taken out of every broker's metrics.jsonl:
  those versions are trained again, once, from the checkpoint, and recorded then.
- **A checkpoint past the lines is set aside.** Rank 0 writes a checkpoint after its update and before
  its answer reaches the broker; a rank killed in between leaves a checkpoint of version v+1 whose
  line v no broker wrote (and a rank r != 0 killed after its update, before it answered, leaves its
  broker's line v unwritten). Resuming there would skip version v in that broker's file, so the group
  resumes from the newest checkpoint that every broker's lines reach, and the newer ones are moved to
  `checkpoints/superseded/` (kept, never read back). When none is old enough (pruned by
  keep_checkpoints), the newest is resumed and the gap is reported.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

# The lines' rule is the broker's too (a broker restarted alone by its platform): broker/metrics_file.py.
from broker.metrics_file import consecutive_from_zero, recorded_versions
from learner.checkpoint_files import list_checkpoints  # by name: no torch in fast train

SUPERSEDED = "superseded"  # checkpoints/superseded/: newer than what the metrics record, set aside


@dataclass(frozen=True)
class ResumePoint:
    """The version the restarted group resumes from, and what was done to make it so."""

    version: int | None  # the newest checkpoint left (None: none, the group starts afresh at Initialize)
    recorded: int  # versions every broker's metrics record consecutively from 0 (the resume bound)
    set_aside: list[int] = field(default_factory=list)  # newer checkpoint versions moved to superseded/
    gap: str = ""  # a version the metrics will lack, when no checkpoint was old enough


def choose_resume_point(checkpoint_dir: Path, metrics_files: list[Path]) -> ResumePoint:
    """Pick the checkpoint the group resumes from (every process of the group stopped): the newest whose
    version every broker's lines reach; newer ones are moved to checkpoints/superseded/."""
    recorded = min(consecutive_from_zero(recorded_versions(path)) for path in metrics_files)
    found = list_checkpoints(checkpoint_dir)
    if not found:
        return ResumePoint(None, recorded)
    reachable = [version for version, _ in found if version <= recorded]
    if not reachable:
        newest = found[-1][0]
        gap = f"versions {recorded} to {newest - 1} have no metrics line (no checkpoint at or below {recorded} is kept)"
        return ResumePoint(newest, recorded, gap=gap)
    resume = reachable[-1]
    newer = [(version, path) for version, path in found if version > resume]
    if newer:
        aside = Path(checkpoint_dir) / SUPERSEDED
        aside.mkdir(exist_ok=True)
        for _, path in newer:
            os.replace(path, aside / path.name)
    return ResumePoint(resume, recorded, set_aside=[version for version, _ in newer])
