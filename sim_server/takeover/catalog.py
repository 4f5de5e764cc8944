"""The clip catalog: maps (road layouts) and clips (a road, an ego start, replayed agents).

Everything a clip replays is precomputed here as padded arrays, so the env gathers the agents
of k slots at step t with one fancy index: agent_state[clip_ids, t] -> [k, A, features].
The catalog is a pure function of (seed, num_clips, num_maps): every clip draws from its own
SeedSequence child, so clip i is the same whatever num_clips is.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, fields

import numpy as np

from sim_server.takeover.dynamics import DT, EGO_LENGTH, EGO_WIDTH
from sim_server.takeover.road import MAX_LANES, NUM_SOLID_BINS
from sim_server.takeover.scenarios import (
    BUILDERS,
    IMMINENT_SEVERITY,
    KIND_NONE,
    KIND_PEDESTRIAN,
    ROLE_FOLLOWER,
    SCENARIOS,
    ClipContext,
    Track,
    vehicle,
)

MAX_STEPS = 300  # the longest clip (30 s); arrays hold MAX_STEPS + 1 states
MIN_STEPS = 100
MAX_AGENTS = 8
EGO_START_S = 100.0  # m from the start of the road
SPEED_LIMITS_KMH = (30, 40, 50, 60, 70, 80, 100, 120)
SCENARIO_SHARES = {  # of clips; every clip also carries benign traffic
    "benign": 0.12,
    "cut_in": 0.22,
    "lead_hard_brake": 0.22,
    "slow_merge": 0.14,
    "stalled_vehicle": 0.14,
    "crossing_pedestrian": 0.16,
}
IMMINENT_SHARE = 0.2  # clips taken over when the conflict was already under way (severity >= 0.85)
JAM_SHARE = 0.2  # clips logged in slow, dense traffic
FOLLOWER_SHARE = 0.45  # clips with a vehicle following the ego
LEAD_SHARE = 0.6  # clips (where the scenario allows) with a benign lead in the ego lane

# Clearance an agent ahead in the ego's path keeps at t = 0 (see _clear_ego_start).
START_CLEARANCE_M = 1.0
START_REACTION_S = 0.3
START_LATERAL_MARGIN_M = 0.4  # > the env's lateral start perturbation plus heading effects

# Agent features per step, in agent_state[..., feature].
AGENT_S, AGENT_D, AGENT_VS, AGENT_VD, AGENT_COS, AGENT_SIN = range(6)
NUM_AGENT_FEATURES = 6


@dataclass(frozen=True)
class IdmParams:
    """Intelligent Driver Model parameters (Treiber et al. 2000)."""

    headway: float | np.ndarray  # desired time headway, s (per clip for followers)
    standstill: float  # minimum bumper gap, m
    accel: float  # maximum acceleration, m/s^2
    comfort_decel: float  # comfortable deceleration, m/s^2


# The logged ego (the human after the takeover) and followers, which replay how they followed it.
LOGGED_EGO_IDM = IdmParams(headway=1.4, standstill=4.0, accel=1.5, comfort_decel=3.0)
FOLLOWER_STANDSTILL_M, FOLLOWER_ACCEL, FOLLOWER_COMFORT_DECEL = 2.5, 1.5, 2.5
FOLLOWER_DESIRED_SPEED_FACTOR = 1.1  # of the route speed: followers close up to their headway
MAX_HUMAN_DECEL = 8.0


@dataclass(frozen=True, eq=False)
class Catalog:
    """Maps and clips as arrays; M maps, C clips, T = MAX_STEPS, A = MAX_AGENTS."""

    seed: int
    map_num_lanes: np.ndarray  # [M] int64, 2..4
    map_lane_width: np.ndarray  # [M] float64, m
    map_speed_limit: np.ndarray  # [M] float64, m/s
    map_solid: np.ndarray  # [M, MAX_LANES - 1, NUM_SOLID_BINS] bool: interior line b+1 solid in bin
    clip_map_id: np.ndarray  # [C] int64
    clip_length: np.ndarray  # [C] int64, steps until truncation
    clip_scenario: np.ndarray  # [C] int64, index into SCENARIOS
    clip_severity: np.ndarray  # [C] float64 in [0, 1]
    ego_lane: np.ndarray  # [C] int64, the lane the ego starts in
    ego_s: np.ndarray  # [C] float64, m
    ego_speed: np.ndarray  # [C] float64, m/s (before the per-episode perturbation)
    route_speed: np.ndarray  # [C] float64, m/s: the logged ego's cruising speed
    route_length: np.ndarray  # [C] float64, m: route_speed * clip duration
    agent_state: np.ndarray  # [C, T + 1, A, NUM_AGENT_FEATURES] float32, zeros where absent
    agent_present: np.ndarray  # [C, T + 1, A] bool
    agent_kind: np.ndarray  # [C, A] int8, KIND_*
    agent_length: np.ndarray  # [C, A] float32, m
    agent_width: np.ndarray  # [C, A] float32, m

    @property
    def num_clips(self) -> int:
        return int(self.clip_map_id.shape[0])

    @property
    def num_maps(self) -> int:
        return int(self.map_num_lanes.shape[0])

    @property
    def max_steps(self) -> int:
        return int(self.agent_state.shape[1] - 1)

    @property
    def max_agents(self) -> int:
        return int(self.agent_state.shape[2])

    def arrays(self) -> dict[str, np.ndarray]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "seed"}

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays().values())

    def digest(self) -> str:
        """SHA-256 over every array's dtype, shape and bytes: equal iff bitwise-identical."""
        h = hashlib.sha256()
        for name, a in self.arrays().items():
            h.update(f"{name}:{a.dtype.str}:{a.shape}".encode())
            h.update(np.ascontiguousarray(a).tobytes())
        return h.hexdigest()


def build_catalog(seed: int = 0, num_clips: int = 200, *, num_maps: int = 20) -> Catalog:
    """Generate the catalog deterministically from `seed`."""
    if num_clips < 1 or num_maps < 1:
        raise ValueError(f"need at least one clip and one map; got {num_clips=}, {num_maps=}")
    if seed < 0:
        raise ValueError(f"the catalog seed must be a non-negative integer; got {seed=}")
    map_seq, clips_seq = np.random.SeedSequence(seed).spawn(2)
    maps = _generate_maps(np.random.default_rng(map_seq), num_maps)
    clips = [_draft_clip(np.random.default_rng(child), maps) for child in clips_seq.spawn(num_clips)]
    return _assemble(seed, maps, clips)


@dataclass
class _Maps:
    num_lanes: np.ndarray
    lane_width: np.ndarray
    speed_limit: np.ndarray
    solid: np.ndarray


@dataclass
class _ClipDraft:
    map_id: int
    length: int
    scenario: int
    severity: float
    ego_lane: int
    route_speed: float
    tracks: list[Track]
    follower_headway: float


def _generate_maps(rng: np.random.Generator, num_maps: int) -> _Maps:
    limits_kmh = rng.choice(SPEED_LIMITS_KMH, size=num_maps)
    highway = limits_kmh >= 80
    num_lanes = np.where(highway, rng.integers(3, MAX_LANES + 1, size=num_maps), rng.integers(2, 4, size=num_maps))
    lane_width = rng.uniform(3.3, 3.75, size=num_maps)
    solid = np.zeros((num_maps, MAX_LANES - 1, NUM_SOLID_BINS), dtype=bool)
    for m in range(num_maps):
        solid_share = rng.uniform(0.1, 0.5)  # how much of this town's lane lines is solid
        for b in range(int(num_lanes[m]) - 1):
            pos, is_solid = 0, bool(rng.random() < solid_share)
            while pos < NUM_SOLID_BINS:
                mean_bins = 8.0 if is_solid else 8.0 * (1.0 - solid_share) / solid_share
                run = 1 + int(rng.exponential(mean_bins))
                solid[m, b, pos : pos + run] = is_solid
                pos, is_solid = pos + run, not is_solid
    return _Maps(num_lanes.astype(np.int64), lane_width, limits_kmh / 3.6, solid)


def _draft_clip(rng: np.random.Generator, maps: _Maps) -> _ClipDraft:
    map_id = int(rng.integers(maps.num_lanes.shape[0]))
    num_lanes, lane_width, limit = (
        int(maps.num_lanes[map_id]),
        float(maps.lane_width[map_id]),
        float(maps.speed_limit[map_id]),
    )
    jam = rng.random() < JAM_SHARE
    route_speed = rng.uniform(2.0, 7.0) if jam else limit * rng.uniform(0.7, 1.0)
    length = int(rng.integers(MIN_STEPS, MAX_STEPS + 1))
    scenario = int(rng.choice(len(SCENARIOS), p=[SCENARIO_SHARES[name] for name in SCENARIOS]))
    imminent = rng.random() < IMMINENT_SHARE
    severity = float(rng.uniform(IMMINENT_SEVERITY, 1.0) if imminent else rng.beta(1.2, 2.0))
    ego_lane = int(rng.integers(num_lanes))
    ctx = ClipContext(rng, MAX_STEPS, num_lanes, lane_width, limit, route_speed, ego_lane, EGO_START_S, severity)
    draft = BUILDERS[SCENARIOS[scenario]](ctx)
    tracks = list(draft.tracks)
    n = MAX_STEPS + 1
    ego_centre = ctx.lane_centre(ego_lane)

    if draft.lead_allowed and rng.random() < LEAD_SHARE:
        kind, length_m, width = vehicle(rng, truck_share=0.15)
        gap = max(draft.lead_min_gap, route_speed * rng.uniform(1.5, 3.5) + 5.0)
        s0 = EGO_START_S + 0.5 * (EGO_LENGTH + length_m) + gap
        speed = route_speed * rng.uniform(1.0, 1.1)
        tracks.append(Track(s0 + speed * DT * np.arange(n), np.full(n, ego_centre), kind, length_m, width))

    follower_headway = 0.0
    if rng.random() < FOLLOWER_SHARE:
        kind, length_m, width = vehicle(rng, truck_share=0.1)
        follower_headway = rng.uniform(1.0, 1.6)
        gap = route_speed * rng.uniform(1.0, 2.2) + 3.0
        s = np.full(n, EGO_START_S - 0.5 * (EGO_LENGTH + length_m) - gap)  # the rest is filled by _replay_followers
        tracks.append(Track(s, np.full(n, ego_centre), kind, length_m, width, ROLE_FOLLOWER))

    for lane in range(num_lanes):
        if lane == ego_lane or lane in draft.reserved_lanes:
            continue
        lane_speed = route_speed * rng.uniform(0.85, 1.2) if not jam else rng.uniform(1.0, 8.0)
        pos = EGO_START_S + rng.uniform(-60.0, 40.0)
        for _ in range(int(rng.integers(0, 3))):
            kind, length_m, width = vehicle(rng, truck_share=0.15)
            tracks.append(
                Track(pos + lane_speed * DT * np.arange(n), np.full(n, ctx.lane_centre(lane)), kind, length_m, width)
            )
            pos += length_m + 5.0 + lane_speed * rng.uniform(1.5, 3.0)

    _clear_ego_start(tracks, ego_centre, route_speed)
    # Keep the scenario actor and the ego-lane agents when the table is full.
    return _ClipDraft(map_id, length, scenario, severity, ego_lane, route_speed, tracks[:MAX_AGENTS], follower_headway)


def _clear_ego_start(tracks: list[Track], ego_centre: float, ego_speed: float) -> None:
    """Push forward any agent that would start on top of (or too close ahead of) the ego.

    An agent overlapping the ego's perturbed start laterally must begin at least START_CLEARANCE_M
    plus START_REACTION_S of closing speed ahead, so no episode is decided before its first action.
    """
    lateral_margin = START_LATERAL_MARGIN_M + 0.5 * EGO_WIDTH
    for track in tracks:
        if track.role == ROLE_FOLLOWER:
            continue
        rel = track.s[0] - EGO_START_S
        beside = abs(track.d[0] - ego_centre) < 0.5 * track.width + lateral_margin
        if not beside or rel < -0.5 * (track.length + EGO_LENGTH):
            continue
        closing = max(ego_speed - (track.s[1] - track.s[0]) / DT, 0.0)
        needed = 0.5 * (track.length + EGO_LENGTH) + START_CLEARANCE_M + START_REACTION_S * closing
        if rel < needed:
            track.s = track.s + (needed - rel)


def _assemble(seed: int, maps: _Maps, drafts: list[_ClipDraft]) -> Catalog:
    num_clips, n, a_max = len(drafts), MAX_STEPS + 1, MAX_AGENTS
    state = np.zeros((num_clips, n, a_max, NUM_AGENT_FEATURES), dtype=np.float64)
    kind = np.zeros((num_clips, a_max), dtype=np.int8)
    role = np.zeros((num_clips, a_max), dtype=np.int8)
    length = np.zeros((num_clips, a_max), dtype=np.float64)
    width = np.zeros((num_clips, a_max), dtype=np.float64)
    for c, draft in enumerate(drafts):
        for a, track in enumerate(draft.tracks):
            state[c, :, a, AGENT_S] = track.s
            state[c, :, a, AGENT_D] = track.d
            kind[c, a], role[c, a], length[c, a], width[c, a] = track.kind, track.role, track.length, track.width

    map_id = np.array([dr.map_id for dr in drafts], dtype=np.int64)
    clip_length = np.array([dr.length for dr in drafts], dtype=np.int64)
    route_speed = np.array([dr.route_speed for dr in drafts])
    ego_lane = np.array([dr.ego_lane for dr in drafts], dtype=np.int64)
    lane_width = maps.lane_width[map_id]
    follower_headway = np.array([dr.follower_headway for dr in drafts])
    follower_idm = IdmParams(follower_headway, FOLLOWER_STANDSTILL_M, FOLLOWER_ACCEL, FOLLOWER_COMFORT_DECEL)
    _replay_followers(
        state, kind, role, length, width, follower_idm, route_speed, (ego_lane + 0.5) * lane_width, lane_width
    )
    _fill_kinematics(state, kind)

    steps = np.arange(n)
    present = (kind[:, None, :] != KIND_NONE) & (steps[None, :, None] <= clip_length[:, None, None])
    state[~present] = 0.0
    return Catalog(
        seed=int(seed),
        map_num_lanes=maps.num_lanes,
        map_lane_width=maps.lane_width,
        map_speed_limit=maps.speed_limit,
        map_solid=maps.solid,
        clip_map_id=map_id,
        clip_length=clip_length,
        clip_scenario=np.array([dr.scenario for dr in drafts], dtype=np.int64),
        clip_severity=np.array([dr.severity for dr in drafts]),
        ego_lane=ego_lane,
        ego_s=np.full(num_clips, EGO_START_S),
        ego_speed=route_speed.copy(),
        route_speed=route_speed,
        route_length=route_speed * clip_length * DT,
        agent_state=state.astype(np.float32),
        agent_present=present,
        agent_kind=kind,
        agent_length=length.astype(np.float32),
        agent_width=width.astype(np.float32),
    )


def idm_accel(
    speed: np.ndarray, desired: np.ndarray, gap: np.ndarray, closing: np.ndarray, idm: IdmParams
) -> np.ndarray:
    """IDM acceleration behind a leader `gap` m ahead (inf: none) closing at `closing` m/s.

    a = accel * (1 - (v / v0)^4 - (s* / gap)^2), s* = standstill + max(0, v T + v dv / (2 sqrt(a b))),
    limited to [-MAX_HUMAN_DECEL, accel].
    """
    wanted = idm.standstill + np.maximum(
        speed * idm.headway + speed * closing / (2.0 * np.sqrt(idm.accel * idm.comfort_decel)), 0.0
    )
    free = 1.0 - (speed / np.maximum(desired, 0.1)) ** 4
    interaction = np.where(np.isfinite(gap), (wanted / np.maximum(gap, 0.1)) ** 2, 0.0)
    return np.clip(idm.accel * (free - interaction), -MAX_HUMAN_DECEL, idm.accel)


def _replay_followers(
    state: np.ndarray,
    kind: np.ndarray,
    role: np.ndarray,
    length: np.ndarray,
    width: np.ndarray,
    follower_idm: IdmParams,
    route_speed: np.ndarray,
    ego_centre: np.ndarray,
    lane_width: np.ndarray,
) -> None:
    """Fill follower tracks: each follows the logged ego, which itself drives an IDM on its lane.

    The logged ego (the human after the takeover) keeps its lane and brakes for whatever
    overlaps it ahead; followers replay an IDM behind that logged ego. A policy that brakes
    much harder or earlier than the human can therefore be rear-ended, as in log replay.
    """
    num_clips, n = state.shape[0], state.shape[1]
    clips = np.arange(num_clips)
    is_follower = role == ROLE_FOLLOWER
    follower_slot = np.argmax(is_follower, axis=1)
    has_follower = is_follower.any(axis=1)
    follower_len = length[clips, follower_slot]
    obstacle = (kind != KIND_NONE) & ~is_follower
    lane_lo, lane_hi = ego_centre - 0.5 * lane_width, ego_centre + 0.5 * lane_width
    vel_s = np.gradient(state[:, :, :, AGENT_S], DT, axis=1)

    ego_s, ego_v = np.full(num_clips, EGO_START_S), route_speed.copy()
    f_s, f_v = state[clips, 0, follower_slot, AGENT_S].copy(), route_speed.copy()
    for t in range(n):
        state[clips, t, follower_slot, AGENT_S] = np.where(has_follower, f_s, state[clips, t, follower_slot, AGENT_S])
        if t == n - 1:
            break
        s, d = state[:, t, :, AGENT_S], state[:, t, :, AGENT_D]
        beside = (d + 0.5 * width > lane_lo[:, None]) & (d - 0.5 * width < lane_hi[:, None])
        in_lane = obstacle & beside & (s > ego_s[:, None])
        gaps = np.where(in_lane, s - ego_s[:, None] - 0.5 * (EGO_LENGTH + length), np.inf)
        lead = np.argmin(gaps, axis=1)
        gap = gaps[clips, lead]
        closing = np.where(np.isfinite(gap), ego_v - vel_s[clips, t, lead], 0.0)
        new_v = np.maximum(ego_v + idm_accel(ego_v, route_speed, gap, closing, LOGGED_EGO_IDM) * DT, 0.0)
        f_gap = ego_s - f_s - 0.5 * (EGO_LENGTH + follower_len)
        f_accel = idm_accel(f_v, FOLLOWER_DESIRED_SPEED_FACTOR * route_speed, f_gap, f_v - ego_v, follower_idm)
        new_fv = np.maximum(f_v + f_accel * DT, 0.0)
        ego_s, ego_v = ego_s + 0.5 * (ego_v + new_v) * DT, new_v
        f_s, f_v = f_s + 0.5 * (f_v + new_fv) * DT, new_fv


def _fill_kinematics(state: np.ndarray, kind: np.ndarray) -> None:
    """Velocities from the tracks; heading along the velocity (pedestrians: square, heading 0)."""
    vs = np.gradient(state[:, :, :, AGENT_S], DT, axis=1)
    vd = np.gradient(state[:, :, :, AGENT_D], DT, axis=1)
    state[:, :, :, AGENT_VS], state[:, :, :, AGENT_VD] = vs, vd
    speed = np.hypot(vs, vd)
    oriented = (speed > 0.1) & (kind[:, None, :] != KIND_PEDESTRIAN)
    safe = np.where(oriented, speed, 1.0)
    state[:, :, :, AGENT_COS] = np.where(oriented, vs / safe, 1.0)
    state[:, :, :, AGENT_SIN] = np.where(oriented, vd / safe, 0.0)
