"""Straight multi-lane roads: lane indices, lane markings, and solid-line look-ups.

Coordinates: s along the road (m), d across it from the right road edge (m, positive to the
left). Lane i spans [i * w, (i + 1) * w]; boundary b lies at d = b * w, b = 0 and b = n being
the road edges (always solid) and 1..n-1 the interior lane lines, each solid on some stretches.
"""

from __future__ import annotations

import numpy as np

MAX_LANES = 4
SOLID_BIN_M = 10.0  # resolution of the solid/dashed pattern along s
ROAD_LENGTH_M = 2500.0  # longer than any ego or agent can travel in a clip; look-ups clamp beyond
NUM_SOLID_BINS = int(ROAD_LENGTH_M / SOLID_BIN_M)


def lane_index(d: np.ndarray, lane_width: np.ndarray, num_lanes: np.ndarray) -> np.ndarray:
    """The lane whose span contains d (clamped to the road's lanes)."""
    return np.minimum(np.maximum(np.floor(d / lane_width), 0), num_lanes - 1).astype(np.int64)


def interior_solid(solid: np.ndarray, map_ids: np.ndarray, s: np.ndarray) -> np.ndarray:
    """[k, MAX_LANES - 1] bool: whether interior boundary b = 1..MAX_LANES-1 is solid at s.

    `solid` is the catalog's [num_maps, MAX_LANES - 1, NUM_SOLID_BINS] table; boundaries that do
    not exist on a map are stored dashed (False).
    """
    bins = np.minimum(np.maximum(np.floor(s / SOLID_BIN_M), 0), NUM_SOLID_BINS - 1).astype(np.int64)
    return solid[map_ids, :, bins]


def nearest_solid_distances(
    d: np.ndarray, lane_width: np.ndarray, num_lanes: np.ndarray, interior: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Distance (m) from d to the nearest solid line (road edges included) on the right and left.

    `interior` is interior_solid(...) at the ego's s. Off the road on one side, that side's
    distance is 0 (the edge has been passed).
    """
    b = np.arange(MAX_LANES + 1)[None, :]  # boundary index, [1, MAX_LANES + 1]
    n = num_lanes[:, None]
    y = b * lane_width[:, None]
    interior_padded = np.zeros((d.shape[0], MAX_LANES + 1), dtype=bool)
    interior_padded[:, 1:MAX_LANES] = interior
    solid = (b <= n) & ((b == 0) | (b == n) | interior_padded)
    offset = d[:, None] - y
    right = np.where(solid & (offset >= 0.0), offset, np.inf).min(axis=1)
    left = np.where(solid & (offset <= 0.0), -offset, np.inf).min(axis=1)
    return np.where(np.isfinite(right), right, 0.0), np.where(np.isfinite(left), left, 0.0)


def solid_crossings(
    d_before: np.ndarray, d_after: np.ndarray, lane_width: np.ndarray, num_lanes: np.ndarray, interior: np.ndarray
) -> np.ndarray:
    """How many solid interior lane lines the ego centre crossed between d_before and d_after."""
    count = np.zeros(d_before.shape, dtype=np.int64)
    for b in range(1, MAX_LANES):
        y = b * lane_width
        crossed = (d_before < y) != (d_after < y)
        count += crossed & (b < num_lanes) & interior[:, b - 1]
    return count
