"""What the ego sees and touches at one step: relations between k egos and their A agents.

Computed once per step and shared by the observation, the reward, termination and metrics.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim_server.takeover.catalog import AGENT_COS, AGENT_D, AGENT_S, AGENT_SIN, AGENT_VD, AGENT_VS
from sim_server.takeover.dynamics import EGO_LENGTH, EGO_WIDTH
from sim_server.takeover.geometry import boxes_overlap, road_aligned_gap


@dataclass
class Scene:
    """Relations of k egos to their agents; [k, A] arrays unless noted."""

    rel_s: np.ndarray  # agent centre minus ego centre along the road (m)
    rel_d: np.ndarray  # ... across the road (m)
    rel_vs: np.ndarray  # agent velocity minus ego velocity, road frame (m/s)
    rel_vd: np.ndarray
    present: np.ndarray  # bool
    colliding: np.ndarray  # bool: footprints overlap
    collided: np.ndarray  # [k] bool: any agent overlaps the ego
    impact_speed: np.ndarray  # [k] m/s: largest |relative velocity| over overlapping agents, 0 if none
    min_gap: np.ndarray  # [k] m: smallest road-aligned clearance to any present agent, inf if none
    lead_gap: np.ndarray  # [k] m: bumper gap to the lead (>= 0), inf without a lead
    lead_closing: np.ndarray  # [k] m/s: ego speed minus lead speed along the road, 0 without a lead


def query_scene(
    ego_s: np.ndarray,
    ego_d: np.ndarray,
    ego_cos: np.ndarray,
    ego_sin: np.ndarray,
    ego_speed: np.ndarray,
    corridor_lo: np.ndarray,
    corridor_hi: np.ndarray,
    agents: np.ndarray,
    present: np.ndarray,
    agent_length: np.ndarray,
    agent_width: np.ndarray,
) -> Scene:
    """agents [k, A, features] (float64), present/length/width [k, A]; ego arrays [k].

    The lead is the nearest present agent ahead (centre in front of the ego centre) whose
    lateral extent overlaps the ego's corridor: its current lane widened to the ego's own
    footprint while it straddles a line.
    """
    col = (slice(None), None)
    rel_s = agents[:, :, AGENT_S] - ego_s[col]
    rel_d = agents[:, :, AGENT_D] - ego_d[col]
    rel_vs = agents[:, :, AGENT_VS] - (ego_speed * ego_cos)[col]
    rel_vd = agents[:, :, AGENT_VD] - (ego_speed * ego_sin)[col]
    half_len, half_wid = 0.5 * agent_length, 0.5 * agent_width

    colliding = present & boxes_overlap(
        ego_s[col], ego_d[col], ego_cos[col], ego_sin[col], 0.5 * EGO_LENGTH, 0.5 * EGO_WIDTH,
        agents[:, :, AGENT_S], agents[:, :, AGENT_D], agents[:, :, AGENT_COS], agents[:, :, AGENT_SIN],
        half_len, half_wid,
    )  # fmt: skip
    impact = np.where(colliding, np.sqrt(rel_vs * rel_vs + rel_vd * rel_vd), 0.0)

    gaps = np.where(
        present, road_aligned_gap(rel_s, rel_d, 0.5 * EGO_LENGTH, 0.5 * EGO_WIDTH, half_len, half_wid), np.inf
    )

    in_corridor = (agents[:, :, AGENT_D] + half_wid > corridor_lo[col]) & (
        agents[:, :, AGENT_D] - half_wid < corridor_hi[col]
    )
    ahead = present & in_corridor & (rel_s > 0.0)
    bumper = np.where(ahead, np.maximum(rel_s - 0.5 * EGO_LENGTH - half_len, 0.0), np.inf)
    rows = np.arange(ego_s.shape[0])
    lead = np.argmin(bumper, axis=1)
    lead_gap = bumper[rows, lead]
    lead_closing = np.where(np.isfinite(lead_gap), -rel_vs[rows, lead], 0.0)

    return Scene(
        rel_s=rel_s,
        rel_d=rel_d,
        rel_vs=rel_vs,
        rel_vd=rel_vd,
        present=present,
        colliding=colliding,
        collided=colliding.any(axis=1),
        impact_speed=impact.max(axis=1),
        min_gap=gaps.min(axis=1),
        lead_gap=lead_gap,
        lead_closing=lead_closing,
    )
