"""TakeoverEnv: the built-in driving workload, a SlotEnv vectorised over slots with numpy.

Each slot holds one live episode: the ego's state, the clip it replays and the step index.
`reset` and `step` take any subset of slots and process them as [k]-shaped arrays; a slot's
arithmetic never mixes with another's, so a (clip, seed, actions) triple replays bitwise
identically whichever slot plays it and whoever shares the call.
"""

from __future__ import annotations

import math

import numpy as np

from sim_server.env_api import SpaceSpec, StepResult
from sim_server.takeover.catalog import Catalog, build_catalog
from sim_server.takeover.dynamics import DT, EGO_WIDTH, step_ego
from sim_server.takeover.metrics import EpisodeMetrics
from sim_server.takeover.observation import OBS_CLIP, OBS_SIZE, SOLID_LOOKAHEAD_M, build_observations
from sim_server.takeover.reward import step_reward
from sim_server.takeover.road import interior_solid, lane_index, nearest_solid_distances, solid_crossings
from sim_server.takeover.scene import Scene, query_scene

# Per-episode perturbation of the ego's start, drawn from a Generator seeded by (clip, seed).
START_LATERAL_M = 0.25
START_HEADING_RAD = 0.02
START_SPEED_FRACTION = 0.05
_EPISODE_STREAM = 0x7A6B0  # keeps episode streams apart from the catalog's SeedSequence(seed)


class TakeoverEnv:
    """Slots replaying takeover clips; see docs/takeover.md for the full specification."""

    def __init__(self, num_slots: int, catalog: Catalog | None = None, seed: int = 0, num_clips: int = 200) -> None:
        """`seed` and `num_clips` build the catalog when none is given; a given catalog wins."""
        if num_slots < 1:
            raise ValueError(f"num_slots must be >= 1; got {num_slots=}")
        self.catalog = catalog if catalog is not None else build_catalog(seed, num_clips)
        self.num_slots = int(num_slots)
        self.num_clips = self.catalog.num_clips
        self.observation_space = SpaceSpec(
            "box", (OBS_SIZE,), np.dtype(np.float32),
            low=np.full(OBS_SIZE, -OBS_CLIP, np.float32), high=np.full(OBS_SIZE, OBS_CLIP, np.float32),
        )  # fmt: skip
        self.action_space = SpaceSpec(
            "box", (2,), np.dtype(np.float32), low=np.full(2, -1.0, np.float32), high=np.full(2, 1.0, np.float32)
        )

        cat = self.catalog
        self._clip_num_lanes = cat.map_num_lanes[cat.clip_map_id]
        self._clip_lane_width = cat.map_lane_width[cat.clip_map_id]
        self._clip_limit = cat.map_speed_limit[cat.clip_map_id]
        self._agent_length = cat.agent_length.astype(np.float64)
        self._agent_width = cat.agent_width.astype(np.float64)

        shape = (self.num_slots,)
        self._clip = np.zeros(shape, dtype=np.int64)
        self._t = np.zeros(shape, dtype=np.int64)
        self._s, self._d, self._speed, self._accel = (np.zeros(shape) for _ in range(4))
        self._cos, self._sin = np.ones(shape), np.zeros(shape)
        self._metrics = EpisodeMetrics(self.num_slots)

    def map_id(self, clip_id: int) -> int:
        return int(self.catalog.clip_map_id[clip_id])

    def prepare(self, clip_id: int, seed: int) -> tuple[float, float, float, float]:
        """The episode's start perturbation (lateral offset, cos and sin of the heading, speed
        scale): the part of a reset that depends on (clip, seed) alone, so a simulator server can
        build it ahead (Prepare) and hand it to `reset`."""
        # One Generator per episode (not a vector draw) so a slot's start depends only on its own
        # (clip, seed); math.cos/sin on Python floats keep it independent of batch layout too.
        u = np.random.default_rng([_EPISODE_STREAM, int(clip_id), int(seed) % 2**64]).uniform(-1.0, 1.0, size=3)
        heading = START_HEADING_RAD * float(u[1])
        return float(START_LATERAL_M * u[0]), math.cos(heading), math.sin(heading), 1.0 + START_SPEED_FRACTION * u[2]

    def reset(
        self,
        slot_ids: np.ndarray,
        clip_ids: np.ndarray,
        seeds: np.ndarray,
        prepared: list[tuple[float, float, float, float] | None] | None = None,
    ) -> np.ndarray:
        """`prepared[j]`: slot j's start as `prepare` built it ahead, or None to build it now."""
        slots = np.asarray(slot_ids, dtype=np.int64)
        clips = np.asarray(clip_ids, dtype=np.int64)
        cat = self.catalog
        lateral, cos_h, sin_h, speed_scale = (np.empty(len(slots)) for _ in range(4))
        for j, (clip, seed) in enumerate(zip(clips.tolist(), np.asarray(seeds).tolist())):
            start = prepared[j] if prepared is not None and prepared[j] is not None else self.prepare(clip, seed)
            lateral[j], cos_h[j], sin_h[j], speed_scale[j] = start
        self._clip[slots] = clips
        self._t[slots] = 0
        self._s[slots] = cat.ego_s[clips]
        self._d[slots] = (cat.ego_lane[clips] + 0.5) * self._clip_lane_width[clips] + lateral
        self._cos[slots], self._sin[slots] = cos_h, sin_h
        self._speed[slots] = cat.ego_speed[clips] * speed_scale
        self._accel[slots] = 0.0
        self._metrics.start(slots, clips, cat.ego_s[clips], cat.route_length[clips])
        obs, _, _ = self._perceive(slots)
        return obs

    def step(self, slot_ids: np.ndarray, actions: np.ndarray) -> StepResult:
        slots = np.asarray(slot_ids, dtype=np.int64)
        clips = self._clip[slots]
        d_before, accel_before = self._d[slots], self._accel[slots]
        s, d, cos_h, sin_h, speed, accel = step_ego(
            self._s[slots], d_before, self._cos[slots], self._sin[slots], self._speed[slots], np.asarray(actions)
        )
        self._s[slots], self._d[slots], self._cos[slots], self._sin[slots] = s, d, cos_h, sin_h
        self._speed[slots], self._accel[slots] = speed, accel
        self._t[slots] += 1

        obs, scene, solid_here = self._perceive(slots)
        lane_width, num_lanes, limit = (
            self._clip_lane_width[clips],
            self._clip_num_lanes[clips],
            self._clip_limit[clips],
        )
        off_road = (d < 0.0) | (d > num_lanes * lane_width)
        crossings = solid_crossings(d_before, d, lane_width, num_lanes, solid_here)
        terminated = scene.collided | off_road
        truncated = (self._t[slots] >= self.catalog.clip_length[clips]) & ~terminated
        lane_centre = (lane_index(d, lane_width, num_lanes) + 0.5) * lane_width
        reward = step_reward(
            speed=speed, cos_h=cos_h, limit=limit, accel=accel, jerk=(accel - accel_before) / DT,
            lane_offset=d - lane_centre, half_lane_width=0.5 * lane_width, solid_crossings=crossings,
            collided=scene.collided, off_road=off_road,
            lead_gap=scene.lead_gap, lead_closing=scene.lead_closing,
        )  # fmt: skip
        self._metrics.update(
            slots, reward=reward, s=s, speed=speed, limit=limit, accel=accel, solid_crossings=crossings,
            collided=scene.collided, off_road=off_road, impact_speed=scene.impact_speed, min_gap=scene.min_gap,
            lead_gap=scene.lead_gap, lead_closing=scene.lead_closing,
        )  # fmt: skip
        return StepResult(
            observations=obs,
            rewards=reward.astype(np.float32),
            terminated=terminated,
            truncated=truncated,
            episode_metrics=self._metrics.finish(slots, terminated | truncated),
        )

    def _perceive(self, slots: np.ndarray) -> tuple[np.ndarray, Scene, np.ndarray]:
        """Observations [k, OBS_SIZE], the scene, and interior solid lines at the egos' s."""
        cat = self.catalog
        clips, t = self._clip[slots], self._t[slots]
        s, d, cos_h, sin_h, speed = (
            self._s[slots],
            self._d[slots],
            self._cos[slots],
            self._sin[slots],
            self._speed[slots],
        )
        lane_width, num_lanes, limit = (
            self._clip_lane_width[clips],
            self._clip_num_lanes[clips],
            self._clip_limit[clips],
        )
        map_ids = cat.clip_map_id[clips]

        lane = lane_index(d, lane_width, num_lanes)
        corridor_lo = np.minimum(lane * lane_width, d - 0.5 * EGO_WIDTH)
        corridor_hi = np.maximum((lane + 1) * lane_width, d + 0.5 * EGO_WIDTH)
        agent_length, agent_width = self._agent_length[clips], self._agent_width[clips]
        scene = query_scene(
            s, d, cos_h, sin_h, speed, corridor_lo, corridor_hi,
            cat.agent_state[clips, t].astype(np.float64), cat.agent_present[clips, t], agent_length, agent_width,
        )  # fmt: skip

        solid_here = interior_solid(cat.map_solid, map_ids, s)
        solid_right, solid_left = nearest_solid_distances(d, lane_width, num_lanes, solid_here)
        solid_ahead = interior_solid(cat.map_solid, map_ids, s + SOLID_LOOKAHEAD_M)
        solid_right_ahead, solid_left_ahead = nearest_solid_distances(d, lane_width, num_lanes, solid_ahead)
        obs = build_observations(
            speed=speed, limit=limit, accel=self._accel[slots], d=d, cos_h=cos_h, sin_h=sin_h,
            lane_width=lane_width, road_width=num_lanes * lane_width, lane_centre=(lane + 0.5) * lane_width,
            solid_right=solid_right, solid_left=solid_left,
            solid_right_ahead=solid_right_ahead, solid_left_ahead=solid_left_ahead,
            scene=scene, agent_length=agent_length, agent_width=agent_width, agent_kind=cat.agent_kind[clips],
        )  # fmt: skip
        return obs, scene, solid_here
