"""Footprint geometry between the ego and the agents, broadcast over [k slots, A agents]."""

from __future__ import annotations

import numpy as np


def boxes_overlap(
    ego_x: np.ndarray,
    ego_y: np.ndarray,
    ego_cos: np.ndarray,
    ego_sin: np.ndarray,
    ego_half_length: float,
    ego_half_width: float,
    agent_x: np.ndarray,
    agent_y: np.ndarray,
    agent_cos: np.ndarray,
    agent_sin: np.ndarray,
    agent_half_length: np.ndarray,
    agent_half_width: np.ndarray,
) -> np.ndarray:
    """Whether oriented rectangles intersect (separating-axis test on the 4 edge normals).

    Ego arguments are [k, 1] (or broadcastable), agent arguments [k, A]; returns bool [k, A].
    Touching boxes count as overlapping.
    """
    dx = agent_x - ego_x
    dy = agent_y - ego_y
    # Cosine and sine of the angle between the two boxes' long axes.
    dot = np.abs(ego_cos * agent_cos + ego_sin * agent_sin)
    cross = np.abs(ego_cos * agent_sin - ego_sin * agent_cos)
    sep_ego_long = (
        np.abs(dx * ego_cos + dy * ego_sin) > ego_half_length + agent_half_length * dot + agent_half_width * cross
    )
    sep_ego_lat = (
        np.abs(-dx * ego_sin + dy * ego_cos) > ego_half_width + agent_half_length * cross + agent_half_width * dot
    )
    sep_agent_long = (
        np.abs(dx * agent_cos + dy * agent_sin) > agent_half_length + ego_half_length * dot + ego_half_width * cross
    )
    sep_agent_lat = (
        np.abs(-dx * agent_sin + dy * agent_cos) > agent_half_width + ego_half_length * cross + ego_half_width * dot
    )
    return ~(sep_ego_long | sep_ego_lat | sep_agent_long | sep_agent_lat)


def road_aligned_gap(
    rel_s: np.ndarray,
    rel_d: np.ndarray,
    ego_half_length: float,
    ego_half_width: float,
    agent_half_length: np.ndarray,
    agent_half_width: np.ndarray,
) -> np.ndarray:
    """Euclidean clearance (m) between two road-aligned rectangles; 0 when they overlap.

    The bumper-to-bumper gap when one is ahead of the other, the side clearance when abreast.
    """
    gap_s = np.maximum(np.abs(rel_s) - (ego_half_length + agent_half_length), 0.0)
    gap_d = np.maximum(np.abs(rel_d) - (ego_half_width + agent_half_width), 0.0)
    return np.sqrt(gap_s * gap_s + gap_d * gap_d)
