"""Scripted takeover scenarios: the agent trajectories one clip replays.

Each builder draws one scenario's actors from a clip's generator and returns their tracks as
arrays over the clip's time axis. Agents are replays (non-reactive): the ego cannot influence
them, like logged agents in recorded takeover clips. `severity` in [0, 1] moves each event
earlier, closer and harsher; 1 is a clip where a collision is (almost) imminent at the start.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from sim_server.takeover.dynamics import DT, EGO_LENGTH

SCENARIOS = ("benign", "cut_in", "lead_hard_brake", "slow_merge", "stalled_vehicle", "crossing_pedestrian")

KIND_NONE, KIND_CAR, KIND_TRUCK, KIND_PEDESTRIAN = 0, 1, 2, 3
ROLE_TRAFFIC, ROLE_ACTOR, ROLE_FOLLOWER = 0, 1, 2  # follower tracks are filled in by the catalog
IMMINENT_SEVERITY = 0.85


@dataclass
class Track:
    """One agent over a clip: centre position per step [num_steps + 1] and its footprint."""

    s: np.ndarray
    d: np.ndarray
    kind: int
    length: float
    width: float
    role: int = ROLE_TRAFFIC


@dataclass
class ClipContext:
    """What a scenario builder knows about the clip it populates."""

    rng: np.random.Generator
    num_steps: int  # tracks have num_steps + 1 entries (the state after each step)
    num_lanes: int
    lane_width: float
    speed_limit: float
    route_speed: float  # the logged ego's cruising speed (m/s)
    ego_lane: int
    ego_s: float
    severity: float

    def lane_centre(self, lane: int) -> float:
        return (lane + 0.5) * self.lane_width

    @property
    def road_width(self) -> float:
        return self.num_lanes * self.lane_width

    def event_time(self, low: float, high: float) -> float:
        """When the event starts (s): 0.3 + ease(low, high); in imminent clips (severity >= 0.85)
        0.3 to 2.5 s *before* the clip starts: the takeover came with the event under way."""
        under_way = self.rng.uniform(0.3, 2.5) if self.severity >= IMMINENT_SEVERITY else 0.0
        return 0.3 + self.ease(low, high) - under_way

    def ease(self, low: float, high: float) -> float:
        """A draw that shrinks towards 0 as severity grows: (1 - severity) * U(low, high)."""
        return (1.0 - self.severity) * self.rng.uniform(low, high)


@dataclass
class ScenarioDraft:
    """A scenario's actors, and which parts of the road the benign traffic must leave free."""

    tracks: list[Track] = field(default_factory=list)
    reserved_lanes: set[int] = field(default_factory=set)  # no benign traffic in these lanes
    lead_allowed: bool = True  # may a benign lead drive ahead in the ego lane?
    lead_min_gap: float = 0.0  # ...and if so, at least this far ahead of the ego front at t=0 (m)


def car_size(rng: np.random.Generator) -> tuple[float, float]:
    return float(rng.uniform(4.3, 5.0)), float(rng.uniform(1.75, 1.95))


def truck_size(rng: np.random.Generator) -> tuple[float, float]:
    return float(rng.uniform(8.0, 12.0)), 2.5


def vehicle(rng: np.random.Generator, truck_share: float) -> tuple[int, float, float]:
    if rng.random() < truck_share:
        return (KIND_TRUCK, *truck_size(rng))
    return (KIND_CAR, *car_size(rng))


def positions(speeds: np.ndarray, anchor_t: float, anchor_s: float) -> np.ndarray:
    """Integrate speeds (trapezoid) into positions with s(anchor_t) = anchor_s.

    Before t = 0 the speed is taken as speeds[0], so an anchor in the past extrapolates.
    """
    times = np.arange(speeds.shape[0]) * DT
    travelled = np.concatenate([[0.0], np.cumsum(0.5 * (speeds[1:] + speeds[:-1]) * DT)])
    at_anchor = np.interp(anchor_t, times, travelled) if anchor_t >= 0.0 else speeds[0] * anchor_t
    return anchor_s + travelled - at_anchor


def braking_speeds(n: int, cruise: float, start_t: float, decel: float, final: float) -> np.ndarray:
    """Cruise, then brake at `decel` from start_t (s, may be < 0) down to `final` and hold it."""
    braking = cruise - decel * np.maximum(np.arange(n) * DT - start_t, 0.0)
    return np.maximum(braking, min(final, cruise))


def lane_change(n: int, d_from: float, d_to: float, start_t: float, duration_s: float) -> np.ndarray:
    """Lateral position for a lane change from start_t (s, may be < 0) along a quintic (minimum-jerk) profile."""
    progress = np.clip((np.arange(n) * DT - start_t) / duration_s, 0.0, 1.0)
    smooth = progress**3 * (10.0 - 15.0 * progress + 6.0 * progress**2)
    return d_from + (d_to - d_from) * smooth


def _adjacent_lanes(ctx: ClipContext) -> list[int]:
    return [lane for lane in (ctx.ego_lane - 1, ctx.ego_lane + 1) if 0 <= lane < ctx.num_lanes]


def benign(ctx: ClipContext) -> ScenarioDraft:
    """No event: the clip was logged as ordinary driving (a false-alarm takeover)."""
    return ScenarioDraft()


def cut_in(ctx: ClipContext) -> ScenarioDraft:
    """A vehicle in an adjacent lane changes into the ego lane with a short gap, maybe braking."""
    rng, n = ctx.rng, ctx.num_steps + 1
    source = int(rng.choice(_adjacent_lanes(ctx)))
    kind, length, width = vehicle(rng, truck_share=0.1)
    start = ctx.event_time(0.5, 6.0)
    speed = max(ctx.route_speed - ctx.severity * rng.uniform(0.0, 6.0) + rng.uniform(-1.0, 1.0), 0.5)
    gap = 0.5 + ctx.ease(2.0, 25.0)  # ego front to actor rear when the lane change starts (logged ego)
    anchor = ctx.ego_s + ctx.route_speed * start + 0.5 * (EGO_LENGTH + length) + gap
    duration = rng.uniform(1.0, 2.0) + ctx.ease(0.0, 1.5)
    speeds = np.full(n, speed)
    if rng.random() < ctx.severity:  # an aggressive cut-in brakes once in front
        speeds = braking_speeds(n, speed, start + duration, rng.uniform(2.0, 6.0), speed * rng.uniform(0.3, 0.8))
    s = positions(speeds, start, anchor)
    d = lane_change(n, ctx.lane_centre(source), ctx.lane_centre(ctx.ego_lane), start, duration)
    lead_gap = max(s[0] - ctx.ego_s, 0.0) + length + 15.0
    return ScenarioDraft([Track(s, d, kind, length, width, ROLE_ACTOR)], {source}, True, lead_gap)


def lead_hard_brake(ctx: ClipContext) -> ScenarioDraft:
    """The vehicle ahead in the ego lane brakes hard, possibly to a stop."""
    rng, n = ctx.rng, ctx.num_steps + 1
    kind, length, width = vehicle(rng, truck_share=0.15)
    headway = 0.5 + ctx.ease(0.3, 2.0)
    cruise = ctx.route_speed * rng.uniform(0.95, 1.05)
    gap0 = max(2.0, ctx.route_speed * headway) + 1.0
    start = ctx.event_time(0.5, 8.0)
    decel = 3.5 + ctx.severity * rng.uniform(1.0, 5.5)
    final = cruise * (1.0 - ctx.severity) * rng.uniform(0.0, 0.6)
    speeds = braking_speeds(n, cruise, start, decel, final)
    s = positions(speeds, 0.0, ctx.ego_s + 0.5 * (EGO_LENGTH + length) + gap0)
    d = np.full(n, ctx.lane_centre(ctx.ego_lane))
    return ScenarioDraft([Track(s, d, kind, length, width, ROLE_ACTOR)], set(), False)


def slow_merge(ctx: ClipContext) -> ScenarioDraft:
    """A slow vehicle merges into the ego lane ahead: from an on-ramp, or from the lane to the right."""
    rng, n = ctx.rng, ctx.num_steps + 1
    kind, length, width = vehicle(rng, truck_share=0.3)
    on_ramp = ctx.ego_lane == 0
    source_d = -0.5 * ctx.lane_width - 1.0 if on_ramp else ctx.lane_centre(ctx.ego_lane - 1)
    speed = max(ctx.route_speed * rng.uniform(0.25, 0.6), 0.5)
    start = ctx.event_time(1.0, 8.0)
    duration = rng.uniform(2.5, 5.0)
    # Gap (logged ego front to merger rear) when the merger is half-way across the lane line.
    crossing = start + 0.5 * duration
    gap = 2.0 + ctx.ease(10.0, 60.0)
    anchor = ctx.ego_s + ctx.route_speed * crossing + 0.5 * (EGO_LENGTH + length) + gap
    s = positions(np.full(n, speed), crossing, anchor)
    d = lane_change(n, source_d, ctx.lane_centre(ctx.ego_lane), start, duration)
    reserved = set() if on_ramp else {ctx.ego_lane - 1}
    return ScenarioDraft(
        [Track(s, d, kind, length, width, ROLE_ACTOR)], reserved, True, max(s[0] - ctx.ego_s, 0.0) + length + 15.0
    )


def stalled_vehicle(ctx: ClipContext) -> ScenarioDraft:
    """A vehicle stands still in the ego lane ahead (breakdown, double parking)."""
    rng, n = ctx.rng, ctx.num_steps + 1
    kind, length, width = vehicle(rng, truck_share=0.3)
    gap = 2.0 + (ctx.ease(1.5, 6.0) + ctx.severity * rng.uniform(0.15, 1.5)) * ctx.route_speed
    s = np.full(n, ctx.ego_s + 0.5 * (EGO_LENGTH + length) + gap)
    d = np.full(n, ctx.lane_centre(ctx.ego_lane) + rng.uniform(-0.4, 0.4))
    return ScenarioDraft([Track(s, d, kind, length, width, ROLE_ACTOR)], set(), False)


def crossing_pedestrian(ctx: ClipContext) -> ScenarioDraft:
    """A pedestrian walks across the road in front of the ego, from one sidewalk to the other."""
    rng, n = ctx.rng, ctx.num_steps + 1
    from_right = rng.random() < 0.5
    kerb_right, kerb_left = -1.5, ctx.road_width + 1.5
    start_d, end_d = (kerb_right, kerb_left) if from_right else (kerb_left, kerb_right)
    walk = rng.uniform(1.0, 2.5)
    start_t = ctx.ease(0.0, 4.0)
    reach_t = start_t + abs(ctx.lane_centre(ctx.ego_lane) - start_d) / walk
    ego_t = max(reach_t + ctx.ease(-1.5, 3.0), 0.5)  # when the logged ego gets there
    s = np.full(n, ctx.ego_s + ctx.route_speed * ego_t + 0.5 * EGO_LENGTH + 0.3)
    walked = np.maximum(np.arange(n) * DT - start_t, 0.0) * walk
    d = start_d + np.sign(end_d - start_d) * np.minimum(walked, abs(end_d - start_d))
    return ScenarioDraft([Track(s, d, KIND_PEDESTRIAN, 0.6, 0.6, ROLE_ACTOR)], set(), False)


BUILDERS: dict[str, Callable[[ClipContext], ScenarioDraft]] = {
    "benign": benign,
    "cut_in": cut_in,
    "lead_hard_brake": lead_hard_brake,
    "slow_merge": slow_merge,
    "stalled_vehicle": stalled_vehicle,
    "crossing_pedestrian": crossing_pedestrian,
}
