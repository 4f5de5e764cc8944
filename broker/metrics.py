"""Per-iteration sampling metrics, measured the same way in every mode (docs/metrics.md)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, fields

import numpy as np

from fast.v1 import simulator_pb2 as pb

# Episode ends that say only that the episode lasted at least its length.
CENSORING_ENDS = ("cut", "fault")


@dataclass
class IterationStats:
    """Counters and timers one sampler fills during one iteration."""

    mode: str
    num_slots: int
    wall_s: float = 0.0  # sampling wall time of the iteration
    inference_s: float = 0.0  # forward passes (actions and bootstrap values)
    step_wall_s: float = 0.0  # awaiting Step calls on the critical path
    step_server_s: float = 0.0  # of which the servers report as their own time
    reset_wall_s: float = 0.0  # awaiting Reset calls on the critical path
    reset_server_s: float = 0.0
    transitions: int = 0  # all transitions, padding included
    valid: int = 0  # valid transitions
    global_resets: int = 0  # resets of every slot at once (SGR, FAST round ends)
    slot_resets: int = 0  # slot resets, all causes
    reset_calls: int = 0
    faults: int = 0  # slot-steps lost to simulator faults
    steps_ahead: int = 0  # Step calls started before the row before them was judged (pipelined rounds)
    steps_discarded: int = 0  # ... of which thrown away: the round ended at the row before
    episode_lengths: list[int] = field(default_factory=list)  # every episode that ended, by any cause
    episode_ends: dict[str, int] = field(default_factory=lambda: defaultdict(int))  # terminated / clip_end / cut
    episode_returns: list[float] = field(default_factory=list)  # episodes the env ended (terminated, clip end)
    closed_loop: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    # For --alpha auto (broker/advisor/auto_alpha.py), not in the summary: which of episode_lengths were
    # censored (cut or lost to a fault: they lasted at least that), the lengths of the episodes still
    # running at the iteration's end, each of the rounds' batched Reset calls (slots in it, wall s: one a server),
    # and each unpipelined lock-step row's (slots acting on its busiest server, wall s outside forward passes).
    episode_censored: list[bool] = field(default_factory=list)
    running_lengths: list[int] = field(default_factory=list)
    round_resets: list[tuple[int, float]] = field(default_factory=list)
    row_steps: list[tuple[int, float]] = field(default_factory=list)
    round_overheads: list[float] = field(default_factory=list)  # each such round's wall s outside them and its Resets

    def record_episode(self, length: int, cause: str, summary: pb.EpisodeSummary | None = None) -> None:
        self.episode_lengths.append(int(length))
        self.episode_censored.append(cause in CENSORING_ENDS)
        self.episode_ends[cause] += 1
        if summary is not None:
            self.episode_returns.append(float(summary.episode_return))
            for name, value in summary.metrics.items():
                if name not in ("length", "return", "clip_id"):
                    self.closed_loop[name].append(float(value))

    def summary(self) -> dict:
        wall = max(self.wall_s, 1e-9)
        lengths = np.array(self.episode_lengths, dtype=float)
        step_transport = max(self.step_wall_s - self.step_server_s, 0.0)
        reset_transport = max(self.reset_wall_s - self.reset_server_s, 0.0)
        critical = self.step_wall_s + self.reset_wall_s
        return {
            "mode": self.mode,
            "num_slots": self.num_slots,
            "sampling_time_s": self.wall_s,
            "transitions": self.transitions,
            "valid_transitions": self.valid,
            "raw_throughput": self.transitions / wall,
            "validity": self.valid / max(self.transitions, 1),
            "effective_throughput": self.valid / wall,
            "time_efficiency": float(self.step_wall_s / critical) if critical > 0 else 1.0,
            "time_split_s": {
                "stepping": self.step_server_s,
                "resetting": self.reset_server_s,
                "inference": self.inference_s,
                "transport": step_transport + reset_transport,
                "waiting": max(self.wall_s - self.inference_s - critical, 0.0),
            },
            "episodes": len(self.episode_lengths),
            "episode_ends": dict(self.episode_ends),
            "episode_length_mean": float(lengths.mean()) if lengths.size else float("nan"),
            "episode_lengths": self.episode_lengths,
            "episode_return_mean": float(np.mean(self.episode_returns)) if self.episode_returns else float("nan"),
            "episode_returns": self.episode_returns,
            "global_resets": self.global_resets,
            "global_resets_per_1k_valid": 1000.0 * self.global_resets / max(self.valid, 1),
            "slot_resets_per_1k_valid": 1000.0 * self.slot_resets / max(self.valid, 1),
            "reset_calls": self.reset_calls,
            "faults": self.faults,
            "steps_ahead": self.steps_ahead,
            "steps_discarded": self.steps_discarded,
            "closed_loop": {k: float(np.mean(v)) for k, v in sorted(self.closed_loop.items())},
        }


def combined(stats: Sequence[IterationStats]) -> IterationStats:
    """Several iterations of one sampler as one: counters and timers summed, lists joined in order,
    so that its summary's rates are over all of them (valid transitions over their summed wall)."""
    if not stats:
        raise ValueError("combined() needs at least one iteration's stats")
    first = stats[0]
    total = IterationStats(mode=first.mode, num_slots=first.num_slots)
    for f in fields(IterationStats):
        if f.name in ("mode", "num_slots"):
            continue
        values = [getattr(s, f.name) for s in stats]
        if isinstance(values[0], list):
            setattr(total, f.name, [v for value in values for v in value])
        elif f.name == "episode_ends":
            for value in values:
                for cause, count in value.items():
                    total.episode_ends[cause] += count
        elif f.name == "closed_loop":
            for value in values:
                for name, seen in value.items():
                    total.closed_loop[name].extend(seen)
        else:
            setattr(total, f.name, sum(values))
    return total


# Keys of a metrics line whose values are measured times or rates: they differ between any two runs,
# even of the same seed on the same machine (tests/test_reproducible.py).
TIMING_KEYS = ("time", "_s", "throughput", "time_efficiency", "time_split")


def without_timings(value):
    """A metrics line (or any JSON value) without its timing keys, at every depth: what two runs of
    the same seed must agree on."""
    if isinstance(value, dict):
        return {k: without_timings(v) for k, v in value.items() if not any(t in k for t in TIMING_KEYS)}
    if isinstance(value, list):
        return [without_timings(v) for v in value]
    return value
