"""The built-in takeover workload, in process: catalog, spaces, determinism, dynamics, metrics."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from sim_server.takeover import Catalog, TakeoverEnv, build_catalog
from sim_server.takeover.baseline_policy import lane_keeping_actions
from sim_server.takeover.catalog import AGENT_COS, AGENT_D, AGENT_S, AGENT_SIN, AGENT_VS
from sim_server.takeover.dynamics import DT, EGO_LENGTH, EGO_WIDTH
from sim_server.takeover.geometry import boxes_overlap
from sim_server.takeover.metrics import METRIC_NAMES
from sim_server.takeover.observation import EGO_SPEED
from sim_server.takeover.scenarios import KIND_CAR, SCENARIOS
from sim_server.takeover.survey import play_all_clips, random_policy, scripted_policy, summarise


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return build_catalog(seed=0)


def _single_clip(base: Catalog, agents: list[tuple[float, float, float]], ego_speed: float, length: int) -> Catalog:
    """Clip 0 of `base` rebuilt by hand: cars (s0 ahead of the ego centre, lateral offset from the
    ego lane centre, constant speed) and an ego starting at ego_speed, truncated after `length`."""
    one = {name: a[:1].copy() for name, a in base.arrays().items() if not name.startswith("map_")}
    steps, a_max = base.max_steps + 1, base.max_agents
    lane_width = base.map_lane_width[base.clip_map_id[0]]
    ego_centre = (base.ego_lane[0] + 0.5) * lane_width
    one["agent_state"][:] = 0.0
    one["agent_present"][:] = False
    one["agent_kind"][:] = 0
    for a, (ahead, lateral, speed) in enumerate(agents):
        s = base.ego_s[0] + ahead + speed * DT * np.arange(steps)
        one["agent_state"][0, :, a, AGENT_S] = s
        one["agent_state"][0, :, a, AGENT_D] = ego_centre + lateral
        one["agent_state"][0, :, a, AGENT_VS] = speed
        one["agent_state"][0, :, a, AGENT_COS] = 1.0
        one["agent_present"][0, : length + 1, a] = True
        one["agent_kind"][0, a] = KIND_CAR
        one["agent_length"][0, a], one["agent_width"][0, a] = 4.5, 1.8
    assert len(agents) <= a_max
    one["clip_length"][0] = length
    one["ego_speed"][0] = one["route_speed"][0] = ego_speed
    one["route_length"][0] = ego_speed * length * DT
    return dataclasses.replace(base, **one)


def _rollout(
    env: TakeoverEnv, slot: int, clip: int, seed: int, actions: np.ndarray
) -> list[tuple[bytes, bytes, bool, bool]]:
    """Reset one slot and step it through `actions`; the raw bytes of every observation and reward."""
    out = [(env.reset(np.array([slot]), np.array([clip]), np.array([seed])).tobytes(), b"", False, False)]
    for action in actions:
        r = env.step(np.array([slot]), action[None])
        out.append((r.observations.tobytes(), r.rewards.tobytes(), bool(r.terminated[0]), bool(r.truncated[0])))
        if r.terminated[0] or r.truncated[0]:
            break
    return out


def test_build_catalog_is_deterministic(catalog) -> None:
    again = build_catalog(seed=0)
    assert again.digest() == catalog.digest()
    for name, array in catalog.arrays().items():
        assert np.array_equal(array, again.arrays()[name]), name
    assert build_catalog(seed=1).digest() != catalog.digest()


def test_build_catalog_keeps_clips_when_growing(catalog) -> None:
    small = build_catalog(seed=0, num_clips=30)
    assert np.array_equal(small.agent_state, catalog.agent_state[:30])
    assert np.array_equal(small.clip_map_id, catalog.clip_map_id[:30])


def test_build_catalog_covers_scenarios_maps_and_stays_small(catalog) -> None:
    assert catalog.num_clips == 200 and catalog.num_maps == 20
    assert set(np.unique(catalog.clip_scenario)) == set(range(len(SCENARIOS)))
    assert len(np.unique(catalog.clip_map_id)) == 20
    assert set(np.unique(catalog.map_num_lanes)) <= {2, 3, 4}
    assert catalog.map_solid.any()
    assert catalog.clip_length.min() >= 100 and catalog.clip_length.max() <= catalog.max_steps
    assert catalog.nbytes < 30e6
    assert np.isfinite(catalog.agent_state).all()


def test_catalog_clips_start_clear_of_the_ego(catalog) -> None:
    # Whatever the seed's lateral perturbation (+-0.25 m), no agent overlaps the ego at t = 0.
    lane_width = catalog.map_lane_width[catalog.clip_map_id]
    for shift in (-0.25, 0.0, 0.25):
        ego_d = (catalog.ego_lane + 0.5) * lane_width + shift
        agents = catalog.agent_state[:, 0].astype(np.float64)
        overlap = catalog.agent_present[:, 0] & boxes_overlap(
            catalog.ego_s[:, None], ego_d[:, None], 1.0, 0.0, EGO_LENGTH / 2, EGO_WIDTH / 2,
            agents[..., AGENT_S], agents[..., AGENT_D], agents[..., AGENT_COS], agents[..., AGENT_SIN],
            catalog.agent_length / 2, catalog.agent_width / 2,
        )  # fmt: skip
        assert not overlap.any(), np.argwhere(overlap)


def test_map_id_reports_the_clip_map(catalog) -> None:
    env = TakeoverEnv(2, catalog=catalog)
    assert [env.map_id(c) for c in range(5)] == catalog.clip_map_id[:5].tolist()
    assert all(isinstance(env.map_id(c), int) for c in range(5))


def test_reset_and_step_shapes_match_spaces(catalog) -> None:
    env = TakeoverEnv(4, catalog=catalog)
    obs_space, act_space = env.observation_space, env.action_space
    assert obs_space.kind == "box" and obs_space.dtype == np.float32 and len(obs_space.shape) == 1
    assert act_space.kind == "box" and act_space.shape == (2,) and act_space.dtype == np.float32
    assert (act_space.low == -1).all() and (act_space.high == 1).all()
    assert env.num_slots == 4 and env.num_clips == 200
    obs = env.reset(np.array([0, 2]), np.array([5, 6]), np.array([0, 1]))
    assert obs.shape == (2, *obs_space.shape) and obs.dtype == np.float32
    r = env.step(np.array([2, 0]), np.zeros((2, 2), np.float32))
    assert r.observations.shape == (2, *obs_space.shape) and r.observations.dtype == np.float32
    assert r.rewards.shape == (2,) and r.rewards.dtype == np.float32
    assert r.terminated.dtype == bool and r.truncated.dtype == bool and len(r.episode_metrics) == 2
    for o in (obs, r.observations):
        assert ((o >= obs_space.low) & (o <= obs_space.high)).all()


def test_step_is_bitwise_deterministic_across_slots_and_neighbours(catalog) -> None:
    actions = np.random.default_rng(7).uniform(-1, 1, size=(60, 2)).astype(np.float32) * 0.3
    alone = _rollout(TakeoverEnv(8, catalog=catalog), slot=0, clip=17, seed=5, actions=actions)

    # The same episode in slot 6, stepped together with busy neighbours in other slots.
    env = TakeoverEnv(8, catalog=catalog)
    env.reset(np.array([1, 2, 3]), np.array([3, 17, 150]), np.array([9, 9, 9]))
    crowded = [(env.reset(np.array([6]), np.array([17]), np.array([5])).tobytes(), b"", False, False)]
    neighbour_actions = np.random.default_rng(8).uniform(-1, 1, size=(60, 3, 2)).astype(np.float32)
    live = np.array([True, True, True])
    for t, action in enumerate(actions):
        slots = np.concatenate([np.array([1, 2, 3])[live], [6]])  # slot 6 last, odd batch sizes
        r = env.step(slots, np.concatenate([neighbour_actions[t][live], action[None]]))
        live[live] = ~(r.terminated[:-1] | r.truncated[:-1])
        crowded.append(
            (r.observations[-1].tobytes(), r.rewards[-1:].tobytes(), bool(r.terminated[-1]), bool(r.truncated[-1]))
        )
        if r.terminated[-1] or r.truncated[-1]:
            break
    assert crowded == alone

    other_seed = _rollout(TakeoverEnv(8, catalog=catalog), slot=0, clip=17, seed=6, actions=actions)
    assert other_seed[0][0] != alone[0][0]


def test_batched_reset_equals_resetting_one_by_one(catalog) -> None:
    slots, clips, seeds = np.array([3, 0, 5, 1]), np.array([10, 11, 10, 199]), np.array([0, 4, 2, 2**40])
    batched = TakeoverEnv(6, catalog=catalog).reset(slots, clips, seeds)
    env = TakeoverEnv(6, catalog=catalog)
    singles = np.concatenate([env.reset(slots[j : j + 1], clips[j : j + 1], seeds[j : j + 1]) for j in range(4)])
    assert batched.tobytes() == singles.tobytes()
    # ...and the slots step identically afterwards.
    batched_env = TakeoverEnv(6, catalog=catalog)
    batched_env.reset(slots, clips, seeds)
    actions = np.full((4, 2), 0.2, np.float32)
    assert batched_env.step(slots, actions).observations.tobytes() == env.step(slots, actions).observations.tobytes()


@settings(max_examples=40, deadline=None)
@given(
    clip=st.integers(0, 199),
    seed=st.integers(0, 2**63 - 1),
    actions=arrays(np.float32, (80, 2), elements=st.floats(-1.0, 1.0, width=32)),
)
def test_random_actions_keep_outputs_finite(catalog, clip, seed, actions) -> None:
    env = TakeoverEnv(3, catalog=catalog)
    obs = env.reset(np.array([1]), np.array([clip]), np.array([seed]))
    assert np.isfinite(obs).all()
    for action in actions:
        r = env.step(np.array([1]), action[None])
        assert np.isfinite(r.observations).all() and np.isfinite(r.rewards).all()
        assert r.terminated.dtype == bool and r.truncated.dtype == bool
        assert not (r.terminated[0] and r.truncated[0])
        assert abs(float(r.rewards[0])) < 25.0  # O(1) per step, at most both crash penalties
        if r.terminated[0] or r.truncated[0]:
            assert r.episode_metrics[0] is not None
            assert all(math.isfinite(v) for v in r.episode_metrics[0].values())
            break
        assert r.episode_metrics[0] is None


def test_random_policy_spreads_episode_lengths(catalog) -> None:
    lengths = np.array([m["length"] for m in play_all_clips(catalog, random_policy, episode_seed=0)])
    assert (lengths <= 5).any() and (lengths >= 150).any()
    assert len(lengths) == catalog.num_clips


def test_scripted_driver_survives_longer_than_random(catalog) -> None:
    random_summary = summarise(play_all_clips(catalog, random_policy, episode_seed=1))
    scripted_summary = summarise(play_all_clips(catalog, scripted_policy, episode_seed=1))
    assert scripted_summary["mean"] > 2.0 * random_summary["mean"]
    assert scripted_summary["collision_rate"] < random_summary["collision_rate"]
    assert scripted_summary["off_road_rate"] == 0.0
    assert scripted_summary["mean_return"] > random_summary["mean_return"]


def test_ended_episodes_report_every_metric_as_finite_float(catalog) -> None:
    metrics = play_all_clips(catalog, random_policy, episode_seed=2, clip_ids=np.arange(40))
    for clip, m in enumerate(metrics):
        assert set(METRIC_NAMES) <= set(m)
        assert all(type(v) is float and math.isfinite(v) for v in m.values())
        assert m["clip_id"] == clip and m["length"] >= 1
        assert m["collided"] in (0.0, 1.0) and m["off_road"] in (0.0, 1.0)
        assert 0.0 <= m["speeding_fraction"] <= 1.0 and 0.0 <= m["route_progress"] <= 1.0
        assert 0.0 <= m["min_ttc_lead"] <= 10.0 and 0.0 <= m["safety_margin"] <= 50.0
        assert (m["collision_severity"] > 0.0) == (m["collided"] == 1.0)


def test_collision_with_stalled_car_reports_severity(catalog) -> None:
    clip = _single_clip(catalog, agents=[(3.0 + EGO_LENGTH, 0.0, 0.0)], ego_speed=20.0, length=100)
    env = TakeoverEnv(1, catalog=clip)
    env.reset(np.array([0]), np.array([0]), np.array([0]))
    for _ in range(5):
        r = env.step(np.array([0]), np.zeros((1, 2), np.float32))
        if r.terminated[0]:
            break
    assert r.terminated[0] and not r.truncated[0]
    m = r.episode_metrics[0]
    assert m["collided"] == 1.0 and m["off_road"] == 0.0
    assert 19.0 < m["collision_severity"] < 21.0  # ~20 m/s into a standing car
    assert m["safety_margin"] == 0.0 and m["min_ttc_lead"] < 0.5
    assert m["return"] < -9.0


def test_full_steering_leaves_the_road(catalog) -> None:
    env = TakeoverEnv(1, catalog=_single_clip(catalog, agents=[], ego_speed=15.0, length=300))
    env.reset(np.array([0]), np.array([0]), np.array([0]))
    for _ in range(300):
        r = env.step(np.array([0]), np.array([[0.0, 1.0]], np.float32))
        if r.terminated[0]:
            break
    m = r.episode_metrics[0]
    assert r.terminated[0] and m["off_road"] == 1.0 and m["collided"] == 0.0 and m["length"] < 50


def test_clip_end_truncates_with_metrics(catalog) -> None:
    # An empty road, a car 60 m ahead at the ego's speed: the scripted driver follows to the end.
    env = TakeoverEnv(1, catalog=_single_clip(catalog, agents=[(60.0, 0.0, 15.0)], ego_speed=15.0, length=120))
    obs = env.reset(np.array([0]), np.array([0]), np.array([0]))
    for t in range(120):
        r = env.step(np.array([0]), lane_keeping_actions(obs))
        obs = r.observations
        assert r.truncated[0] == (t == 119) and not r.terminated[0]
    m = r.episode_metrics[0]
    assert m["length"] == 120.0 and m["collided"] == 0.0 and m["hard_brake_count"] == 0.0
    assert 40.0 < m["safety_margin"] <= 50.0 and m["min_ttc_lead"] == 10.0
    assert m["stall_time_s"] == 0.0 and m["solid_line_crossings"] == 0.0
    assert 0.9 < m["route_progress"] <= 1.0


def test_braking_to_a_stop_counts_hard_brakes_and_stall_time(catalog) -> None:
    limit = float(catalog.map_speed_limit[catalog.clip_map_id[0]])
    env = TakeoverEnv(1, catalog=_single_clip(catalog, agents=[], ego_speed=12.0, length=100))
    speeds = [float(env.reset(np.array([0]), np.array([0]), np.array([0]))[0, EGO_SPEED]) * limit]
    for _ in range(100):
        r = env.step(np.array([0]), np.array([[-1.0, 0.0]], np.float32))
        speeds.append(float(r.observations[0, EGO_SPEED]) * limit)
    m = r.episode_metrics[0]
    # Reference counts from the observed speeds: full braking is -6 m/s^2 until the ego stands.
    accel = np.diff(speeds) / DT
    assert m["hard_brake_count"] == float((accel < -4.0).sum()) and m["hard_brake_count"] >= 19
    assert m["stall_time_s"] == pytest.approx(float((np.array(speeds[1:]) < 0.5).sum()) * DT)
    assert m["hard_accel_count"] == 0.0 and m["speeding_fraction"] == 0.0


def test_speeding_is_measured_against_the_limit(catalog) -> None:
    limit = float(catalog.map_speed_limit[catalog.clip_map_id[0]])
    env = TakeoverEnv(1, catalog=_single_clip(catalog, agents=[], ego_speed=1.3 * limit, length=100))
    env.reset(np.array([0]), np.array([0]), np.array([0]))
    for _ in range(100):
        r = env.step(np.array([0]), np.zeros((1, 2), np.float32))
    m = r.episode_metrics[0]
    assert m["speeding_fraction"] == 1.0 and m["speed_efficiency"] > 1.2
    assert float(r.rewards[0]) < 1.0 - 2.0 * 0.2  # progress capped at 1, speeding penalised


def test_the_closing_in_term_is_off_in_the_workload_and_charges_under_three_seconds_when_on(monkeypatch):
    from sim_server.takeover import reward

    k = 4
    common = dict(
        speed=np.full(k, 10.0),
        cos_h=np.ones(k),
        limit=np.full(k, 10.0),
        accel=np.zeros(k),
        jerk=np.zeros(k),
        lane_offset=np.zeros(k),
        half_lane_width=np.full(k, 1.75),
        solid_crossings=np.zeros(k),
        collided=np.zeros(k, bool),
        off_road=np.zeros(k, bool),
        lead_gap=np.array([np.inf, 30.0, 15.0, 5.0]),
        lead_closing=np.array([0.0, 5.0, 10.0, 10.0]),
    )  # fmt: skip: ttc: none, 6 s, 1.5 s, 0.5 s
    assert reward.TTC_WEIGHT == 0.0
    np.testing.assert_array_equal(reward.step_reward(**common), np.ones(k))
    monkeypatch.setattr(reward, "TTC_WEIGHT", 1.0)
    np.testing.assert_allclose(reward.step_reward(**common), [1.0, 1.0, 0.5, 1.0 / 6.0])
