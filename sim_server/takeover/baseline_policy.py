"""Two reference policies for the takeover workload: uniform random, and a scripted driver.

The scripted driver reads only the observation (as a learned policy would): pure-pursuit lane
keeping towards the current lane centre plus an Intelligent Driver Model on the reported lead or
on the nearest agent predicted to enter its path.
It never changes lanes and never looks behind, so it cannot dodge a stalled vehicle at close
range or a follower that does not brake; it marks what "competent" means for benchmarks.
"""

from __future__ import annotations

import numpy as np

from sim_server.takeover.dynamics import ACCEL_MAX, ACCEL_MIN, ACCEL_PER_UNIT, EGO_LENGTH, EGO_WIDTH, max_curvature
from sim_server.takeover.observation import (
    AGENT_FEATURES,
    AGENT_LENGTH,
    AGENT_PRESENT,
    AGENT_VX,
    AGENT_VY,
    AGENT_WIDTH,
    AGENT_X,
    AGENT_Y,
    EGO_FEATURES,
    EGO_LANE_OFFSET,
    EGO_LEAD_CLOSING,
    EGO_LEAD_GAP,
    EGO_LIMIT,
    EGO_SIN_HEADING,
    EGO_SPEED,
    LEAD_GAP_CAP_M,
    NUM_NEAREST,
)

NOMINAL_HALF_LANE_M = 1.75  # the observation gives the offset in half lane widths
PREDICTION_S = 3.0


def random_actions(rng: np.random.Generator, count: int) -> np.ndarray:
    """[count, 2] float32 actions uniform in the action box."""
    return rng.uniform(-1.0, 1.0, size=(count, 2)).astype(np.float32)


def lane_keeping_actions(obs: np.ndarray, cruise_fraction: float = 0.9) -> np.ndarray:
    """[k, 2] float32 actions for observations [k, OBS_SIZE]."""
    obs = obs.astype(np.float64)
    limit = obs[:, EGO_LIMIT] * 30.0
    speed = obs[:, EGO_SPEED] * limit

    # Pure pursuit on a point `lookahead` ahead on the lane centre: kappa = 2 sin(alpha) / L.
    lookahead = np.maximum(6.0, 1.2 * speed)
    offset = obs[:, EGO_LANE_OFFSET] * NOMINAL_HALF_LANE_M
    alpha = -offset / lookahead - obs[:, EGO_SIN_HEADING]
    steer = np.clip(2.0 * alpha / lookahead / max_curvature(speed), -1.0, 1.0)

    # IDM towards cruise_fraction * limit behind the nearest of: the reported lead, and any
    # reported agent ahead whose constant-velocity prediction enters the ego's path within
    # PREDICTION_S (cut-ins, merges, crossing pedestrians); an emergency stop on short TTC.
    gap = obs[:, EGO_LEAD_GAP] * 50.0
    closing = obs[:, EGO_LEAD_CLOSING] * 20.0
    agents = obs[:, EGO_FEATURES:].reshape(obs.shape[0], NUM_NEAREST, AGENT_FEATURES)
    x, y = agents[:, :, AGENT_X] * 50.0, agents[:, :, AGENT_Y] * 10.0
    vx, vy = agents[:, :, AGENT_VX] * 20.0, agents[:, :, AGENT_VY] * 20.0
    half_length, half_width = agents[:, :, AGENT_LENGTH] * 5.0, agents[:, :, AGENT_WIDTH] * 2.5
    horizon = np.linspace(0.0, PREDICTION_S, 7)[None, None, :]
    future_y = y[:, :, None] + vy[:, :, None] * horizon
    enters_path = (np.abs(future_y) < (half_width + 0.5 * EGO_WIDTH + 0.3)[:, :, None]).any(axis=2)
    conflict = (agents[:, :, AGENT_PRESENT] > 0.5) & enters_path & (x > 0.0)
    conflict_gap = np.where(conflict, np.maximum(x - half_length - 0.5 * EGO_LENGTH, 0.0), np.inf)
    nearest = np.argmin(conflict_gap, axis=1)
    rows = np.arange(obs.shape[0])
    use_conflict = conflict_gap[rows, nearest] < gap
    gap = np.where(use_conflict, conflict_gap[rows, nearest], gap)
    closing = np.where(use_conflict, -vx[rows, nearest], closing)
    has_lead = gap < LEAD_GAP_CAP_M - 1e-3
    wanted = 3.0 + np.maximum(speed * 1.2 + speed * closing / (2.0 * np.sqrt(2.0 * 3.0)), 0.0)
    interaction = np.where(has_lead, (wanted / np.maximum(gap, 0.1)) ** 2, 0.0)
    accel = 2.0 * (1.0 - (speed / (cruise_fraction * limit)) ** 4 - interaction)
    ttc = np.where(closing > 0.0, gap / np.maximum(closing, 1e-6), np.inf)
    accel = np.where(has_lead & (ttc < 1.5), ACCEL_MIN, accel)
    longitudinal = np.minimum(accel, ACCEL_MAX) / ACCEL_PER_UNIT  # dynamics.accel_command's inverse
    return np.stack([np.clip(longitudinal, -1.0, 1.0), steer], axis=1).astype(np.float32)
