"""Closed-loop driving metrics, accumulated per slot over an episode and reported at its end.

Accumulators are [num_slots] arrays updated for the stepped slots in one vectorised call; only
`finish` loops, over the slots whose episode just ended, to build their dicts. Definitions are
in docs/takeover.md; every value is measured on the states after each step (t = 1..length).
"""

from __future__ import annotations

import numpy as np

from sim_server.takeover.dynamics import DT

TTC_CAP_S = 10.0
SAFETY_MARGIN_CAP_M = 50.0
HARD_BRAKE_MPS2 = -4.0
HARD_ACCEL_MPS2 = 2.0
STALL_SPEED_MPS = 0.5
FREE_LANE_AHEAD_M = 30.0

METRIC_NAMES = (
    "length",
    "return",
    "clip_id",
    "collided",
    "off_road",
    "collision_severity",
    "min_ttc_lead",
    "safety_margin",
    "hard_brake_count",
    "hard_accel_count",
    "solid_line_crossings",
    "speeding_fraction",
    "speed_efficiency",
    "stall_time_s",
    "route_progress",
)


def time_to_collision(gap: np.ndarray, closing: np.ndarray) -> np.ndarray:
    """gap / closing speed when closing in, capped at TTC_CAP_S (and TTC_CAP_S otherwise)."""
    closing_in = closing > 0.0
    ttc = np.where(closing_in, gap / np.where(closing_in, closing, 1.0), np.inf)
    return np.minimum(ttc, TTC_CAP_S)


class EpisodeMetrics:
    """Per-slot running sums and extremes of the current episode."""

    def __init__(self, num_slots: int) -> None:
        zeros = lambda: np.zeros(num_slots, dtype=np.float64)  # noqa: E731
        self.clip_id = np.zeros(num_slots, dtype=np.int64)
        self.start_s, self.route_length = zeros(), zeros()
        self.length, self.ret = zeros(), zeros()
        self.collided, self.off_road, self.severity = zeros(), zeros(), zeros()
        self.min_ttc, self.min_gap = zeros(), zeros()
        self.hard_brakes, self.hard_accels, self.solid_crossings = zeros(), zeros(), zeros()
        self.speeding_steps, self.speed_ratio_sum, self.stall_steps = zeros(), zeros(), zeros()
        self.last_s = zeros()

    def start(self, slots: np.ndarray, clip_ids: np.ndarray, start_s: np.ndarray, route_length: np.ndarray) -> None:
        self.clip_id[slots] = clip_ids
        self.start_s[slots] = start_s
        self.last_s[slots] = start_s
        self.route_length[slots] = route_length
        for acc in (self.length, self.ret, self.collided, self.off_road, self.severity, self.hard_brakes,
                    self.hard_accels, self.solid_crossings, self.speeding_steps, self.speed_ratio_sum,
                    self.stall_steps):  # fmt: skip
            acc[slots] = 0.0
        self.min_ttc[slots] = TTC_CAP_S
        self.min_gap[slots] = SAFETY_MARGIN_CAP_M

    def update(
        self,
        slots: np.ndarray,
        *,
        reward: np.ndarray,
        s: np.ndarray,
        speed: np.ndarray,
        limit: np.ndarray,
        accel: np.ndarray,
        solid_crossings: np.ndarray,
        collided: np.ndarray,
        off_road: np.ndarray,
        impact_speed: np.ndarray,
        min_gap: np.ndarray,
        lead_gap: np.ndarray,
        lead_closing: np.ndarray,
    ) -> None:
        """Fold one step of the stepped slots into their accumulators."""
        self.length[slots] += 1.0
        self.ret[slots] += reward
        self.collided[slots] = np.maximum(self.collided[slots], collided)
        self.off_road[slots] = np.maximum(self.off_road[slots], off_road)
        self.severity[slots] = np.maximum(self.severity[slots], impact_speed)
        self.min_ttc[slots] = np.minimum(self.min_ttc[slots], time_to_collision(lead_gap, lead_closing))
        self.min_gap[slots] = np.minimum(self.min_gap[slots], min_gap)
        self.hard_brakes[slots] += accel < HARD_BRAKE_MPS2
        self.hard_accels[slots] += accel > HARD_ACCEL_MPS2
        self.solid_crossings[slots] += solid_crossings
        self.speeding_steps[slots] += speed > limit
        self.speed_ratio_sum[slots] += speed / limit
        self.stall_steps[slots] += (speed < STALL_SPEED_MPS) & (lead_gap > FREE_LANE_AHEAD_M)
        self.last_s[slots] = s

    def finish(self, slots: np.ndarray, ended: np.ndarray) -> list[dict[str, float] | None]:
        """Metric dicts for slots[j] where ended[j], else None."""
        out: list[dict[str, float] | None] = [None] * len(slots)
        for j in np.flatnonzero(ended):
            i = slots[j]
            n = self.length[i]
            out[j] = {
                "length": float(n),
                "return": float(self.ret[i]),
                "clip_id": float(self.clip_id[i]),
                "collided": float(self.collided[i]),
                "off_road": float(self.off_road[i]),
                "collision_severity": float(self.severity[i]),
                "min_ttc_lead": float(self.min_ttc[i]),
                "safety_margin": float(self.min_gap[i]),
                "hard_brake_count": float(self.hard_brakes[i]),
                "hard_accel_count": float(self.hard_accels[i]),
                "solid_line_crossings": float(self.solid_crossings[i]),
                "speeding_fraction": float(self.speeding_steps[i] / n),
                "speed_efficiency": float(self.speed_ratio_sum[i] / n),
                "stall_time_s": float(self.stall_steps[i] * DT),
                "route_progress": float(np.clip((self.last_s[i] - self.start_s[i]) / self.route_length[i], 0.0, 1.0)),
            }
        return out
