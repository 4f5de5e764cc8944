"""The observation vector: an ego block, then the K nearest agents in the ego frame.

Every entry is scaled to O(1) and clipped to [-OBS_CLIP, OBS_CLIP] so observations stay finite
whatever the ego does (spinning, stopping, leaving the road). The layout is documented in
docs/takeover.md; the index constants below are the single source of truth for it.
"""

from __future__ import annotations

import numpy as np

from sim_server.takeover.catalog import KIND_PEDESTRIAN
from sim_server.takeover.scene import Scene

NUM_NEAREST = 6  # K agents reported
AGENT_RANGE_M = 100.0  # agents farther (centre to centre) are reported as absent
LEAD_GAP_CAP_M = 100.0
OBS_CLIP = 10.0
SOLID_LOOKAHEAD_M = 30.0

# Ego block.
(
    EGO_SPEED,  # v / limit
    EGO_LIMIT,  # limit / 30 m/s
    EGO_ACCEL,  # last realised acceleration / 6 m/s^2
    EGO_LANE_OFFSET,  # (d - centre of current lane) / (lane width / 2), positive left
    EGO_SIN_HEADING,  # sin of heading relative to the road
    EGO_COS_HEADING,
    EGO_RIGHT_EDGE,  # distance to right road edge / lane width (negative: off the road)
    EGO_LEFT_EDGE,
    EGO_RIGHT_SOLID,  # distance to nearest solid line on the right (edges included) / lane width
    EGO_LEFT_SOLID,
    EGO_RIGHT_SOLID_AHEAD,  # the same, SOLID_LOOKAHEAD_M ahead
    EGO_LEFT_SOLID_AHEAD,
    EGO_LEAD_GAP,  # bumper gap to the lead / 50 m, LEAD_GAP_CAP_M / 50 without a lead
    EGO_LEAD_CLOSING,  # (ego speed - lead speed) along the road / 20 m/s, 0 without a lead
) = range(14)
EGO_FEATURES = 14

# Per reported agent, offset from EGO_FEATURES + i * AGENT_FEATURES.
(
    AGENT_X,  # relative position in the ego frame, forward / 50 m
    AGENT_Y,  # ... left / 10 m
    AGENT_VX,  # relative velocity in the ego frame / 20 m/s
    AGENT_VY,
    AGENT_LENGTH,  # length / 10 m
    AGENT_WIDTH,  # width / 5 m
    AGENT_IS_PEDESTRIAN,  # 0/1
    AGENT_PRESENT,  # 0/1; all other features are 0 when absent
) = range(8)
AGENT_FEATURES = 8

OBS_SIZE = EGO_FEATURES + NUM_NEAREST * AGENT_FEATURES


def build_observations(
    *,
    speed: np.ndarray,
    limit: np.ndarray,
    accel: np.ndarray,
    d: np.ndarray,
    cos_h: np.ndarray,
    sin_h: np.ndarray,
    lane_width: np.ndarray,
    road_width: np.ndarray,
    lane_centre: np.ndarray,
    solid_right: np.ndarray,
    solid_left: np.ndarray,
    solid_right_ahead: np.ndarray,
    solid_left_ahead: np.ndarray,
    scene: Scene,
    agent_length: np.ndarray,
    agent_width: np.ndarray,
    agent_kind: np.ndarray,
) -> np.ndarray:
    """[k, OBS_SIZE] float32 from per-ego arrays [k] and the step's scene."""
    k = speed.shape[0]
    obs = np.zeros((k, OBS_SIZE), dtype=np.float64)
    obs[:, EGO_SPEED] = speed / limit
    obs[:, EGO_LIMIT] = limit / 30.0
    obs[:, EGO_ACCEL] = accel / 6.0
    obs[:, EGO_LANE_OFFSET] = (d - lane_centre) / (0.5 * lane_width)
    obs[:, EGO_SIN_HEADING] = sin_h
    obs[:, EGO_COS_HEADING] = cos_h
    obs[:, EGO_RIGHT_EDGE] = d / lane_width
    obs[:, EGO_LEFT_EDGE] = (road_width - d) / lane_width
    obs[:, EGO_RIGHT_SOLID] = solid_right / lane_width
    obs[:, EGO_LEFT_SOLID] = solid_left / lane_width
    obs[:, EGO_RIGHT_SOLID_AHEAD] = solid_right_ahead / lane_width
    obs[:, EGO_LEFT_SOLID_AHEAD] = solid_left_ahead / lane_width
    obs[:, EGO_LEAD_GAP] = np.minimum(scene.lead_gap, LEAD_GAP_CAP_M) / 50.0
    obs[:, EGO_LEAD_CLOSING] = scene.lead_closing / 20.0

    # K nearest present agents in range; a stable sort keeps ties in agent order.
    dist2 = scene.rel_s * scene.rel_s + scene.rel_d * scene.rel_d
    reported = scene.present & (dist2 <= AGENT_RANGE_M * AGENT_RANGE_M)
    order = np.argsort(np.where(reported, dist2, np.inf), axis=1, kind="stable")[:, :NUM_NEAREST]

    rows = np.arange(k)[:, None]

    def pick(values: np.ndarray) -> np.ndarray:
        return values[rows, order]

    shown = pick(reported)
    rel_s, rel_d, rel_vs, rel_vd = pick(scene.rel_s), pick(scene.rel_d), pick(scene.rel_vs), pick(scene.rel_vd)
    c, s = cos_h[:, None], sin_h[:, None]
    block = np.zeros((k, NUM_NEAREST, AGENT_FEATURES), dtype=np.float64)
    block[:, :, AGENT_X] = (c * rel_s + s * rel_d) / 50.0
    block[:, :, AGENT_Y] = (-s * rel_s + c * rel_d) / 10.0
    block[:, :, AGENT_VX] = (c * rel_vs + s * rel_vd) / 20.0
    block[:, :, AGENT_VY] = (-s * rel_vs + c * rel_vd) / 20.0
    block[:, :, AGENT_LENGTH] = pick(agent_length) / 10.0
    block[:, :, AGENT_WIDTH] = pick(agent_width) / 5.0
    block[:, :, AGENT_IS_PEDESTRIAN] = pick(agent_kind) == KIND_PEDESTRIAN
    block[:, :, AGENT_PRESENT] = 1.0
    block = np.where(shown[:, :, None], block, 0.0)
    obs[:, EGO_FEATURES:] = block.reshape(k, NUM_NEAREST * AGENT_FEATURES)
    return np.minimum(np.maximum(obs, -OBS_CLIP), OBS_CLIP).astype(np.float32)
