"""A training run's learning curve on held-out clips: every checkpoint played on the same episodes.

The return of training episodes is no yardstick across sampling modes: FAST and SGR cut open
episodes at a global truncation, so the episodes that end inside a round are the short (often
failed) ones, while SC only ever reports whole episodes. Evaluating each checkpoint
deterministically on the same held-out (clip, seed) episodes (broker/evaluate.py) puts every
mode on one scale. It runs after the training run, on simulators of its own, so it costs the
training wall-clock nothing.

Version v of the policy exists once the learner has made v updates: at the end of iteration v
of metrics.jsonl (iteration i samples with version i - 1 and its update makes version i), so
its wall-clock is that line's time since the first iteration began, and version 0 is at 0 s.
"""

from __future__ import annotations

import json
from pathlib import Path

from broker.evaluate import EvaluationSession, summarize
from fast.rpc import Credentials
from learner.checkpoint import list_checkpoints, load_checkpoint, policy_weights


def version_clock(metrics_path: Path) -> dict[int, tuple[float, int]]:
    """{policy version: (wall-clock s since the first iteration began, valid transitions sampled before it)}."""
    lines = [json.loads(line) for line in Path(metrics_path).read_text().splitlines() if line.strip()]
    clock = {0: (0.0, 0)}
    if not lines:
        return clock
    start = lines[0]["time"] - lines[0]["iteration_time_s"]
    transitions = 0
    for line in lines:
        transitions += int(line["valid_transitions"])
        clock[int(line["iteration"])] = (float(line["time"] - start), transitions)
    return clock


async def evaluate_checkpoints(
    addresses: list[str],
    run_dir: Path,
    *,
    holdout_every: int,
    episodes_per_clip: int,
    seed: int,
    credentials: Credentials | None = None,
) -> list[dict]:
    """One point per checkpoint of run_dir: version, time_s, transitions and the held-out summary.

    Checkpoints whose version has no wall-clock in metrics.jsonl (none should) are skipped.
    `credentials`: the servers' run token (None: the environment's).
    """
    clock = version_clock(run_dir / "metrics.jsonl")
    points = []
    async with EvaluationSession.connect(
        addresses,
        holdout_every=holdout_every,
        episodes_per_clip=episodes_per_clip,
        seed=seed,
        credentials=credentials,
    ) as session:
        session.require_clips()
        for version, path in list_checkpoints(run_dir / "checkpoints"):
            if version not in clock:
                continue
            checkpoint = load_checkpoint(path)
            runner = session.policy(checkpoint.hidden_sizes, version, policy_weights(checkpoint))
            summary = summarize(await session.play(runner))
            time_s, transitions = clock[version]
            points.append({"version": version, "time_s": time_s, "transitions": transitions, **summary})
    return points


def time_to_target(points: list[dict], target: float, key: str = "return_mean") -> tuple[float, int] | None:
    """(wall-clock s, transitions) of the first point whose held-out `key` reaches `target`; None if none does."""
    for point in points:
        if point[key] >= target:
            return point["time_s"], point["transitions"]
    return None
