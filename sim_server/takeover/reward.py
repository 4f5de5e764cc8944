"""The per-step reward: progress, minus comfort, lane-keeping and rule penalties, minus crash terms.

Scaled so a step is O(1): progress is at most 1, the shaping penalties a few tenths, and only
the terminal events (collision, leaving the road) and solid-line crossings are larger.
"""

from __future__ import annotations

import numpy as np

from sim_server.takeover.metrics import time_to_collision

PROGRESS_WEIGHT = 1.0  # per step at the speed limit
ACCEL_WEIGHT = 0.05  # * (accel / 3 m/s^2)^2: 0.2 at full braking
JERK_WEIGHT = 0.05  # * (jerk / 20 m/s^3)^2, jerk clipped at 40 m/s^3
LANE_WEIGHT = 0.1  # * (offset from lane centre / half lane width)^2
SPEEDING_WEIGHT = 2.0  # * (excess speed / limit)
SOLID_CROSSING_PENALTY = 1.0  # per solid line crossed
COLLISION_PENALTY = 10.0
OFF_ROAD_PENALTY = 10.0
JERK_CLIP = 40.0
# Closing in on the lead: TTC_WEIGHT * (1 - ttc / TTC_HORIZON_S) per step while the time to
# collision is under the horizon. 0 leaves the reward as it was (the ablation screens it).
TTC_WEIGHT = 0.0
TTC_HORIZON_S = 3.0


def step_reward(
    *,
    speed: np.ndarray,
    cos_h: np.ndarray,
    limit: np.ndarray,
    accel: np.ndarray,
    jerk: np.ndarray,
    lane_offset: np.ndarray,
    half_lane_width: np.ndarray,
    solid_crossings: np.ndarray,
    collided: np.ndarray,
    off_road: np.ndarray,
    lead_gap: np.ndarray | None = None,
    lead_closing: np.ndarray | None = None,
) -> np.ndarray:
    """[k] float64 rewards; see docs/takeover.md for the formula."""
    progress = np.minimum(np.maximum(speed * cos_h, -limit), limit) / limit
    comfort = ACCEL_WEIGHT * (accel / 3.0) ** 2 + JERK_WEIGHT * (np.minimum(np.abs(jerk), JERK_CLIP) / 20.0) ** 2
    lane = LANE_WEIGHT * np.minimum((lane_offset / half_lane_width) ** 2, 1.0)
    speeding = SPEEDING_WEIGHT * np.maximum(speed - limit, 0.0) / limit
    closing = 0.0
    if TTC_WEIGHT and lead_gap is not None:
        closing = TTC_WEIGHT * np.maximum(1.0 - time_to_collision(lead_gap, lead_closing) / TTC_HORIZON_S, 0.0)
    return (
        PROGRESS_WEIGHT * progress
        - comfort
        - lane
        - speeding
        - closing
        - SOLID_CROSSING_PENALTY * solid_crossings
        - COLLISION_PENALTY * collided
        - OFF_ROAD_PENALTY * off_road
    )
