"""The Gymnasium reference of the sampling benchmark: TakeoverGymEnv and measure_async_vector."""

from __future__ import annotations

import math
import multiprocessing
import os
import threading
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from broker.policy_runner import PolicyRunner
from jobs.bench.gym_reference import measure_async_vector
from learner.policy import export_weights
from sim_server.cost_model import CostModelConfig
from sim_server.takeover import TakeoverEnv, build_catalog
from sim_server.takeover.gym_env import ServerCostResources, SyncCostModel, TakeoverGymEnv, space_spec

# 5 ms steps, resets of 10 ms fixed (one engine) + 20 ms per new map (one channel), 2 ms cached.
SMALL_COSTS = CostModelConfig(
    preset="custom", step_latency_s=0.005, reset_fixed_s=0.010, reset_fixed_exclusive=True,
    map_load_s=0.020, map_load_cached_s=0.002, map_load_shared=True, map_cache_size=2,
)  # fmt: skip
# Waits never end early; a shared 2-core machine may oversleep by a few ms.


@pytest.fixture(scope="module")
def catalog():
    return build_catalog(0, 200)  # every one of its 20 maps has 5 clips or more


def _clip_on_map(catalog, map_id: int, not_clip: int = -1) -> int:
    return int(next(c for c in np.flatnonzero(catalog.clip_map_id == map_id) if c != not_clip))


class _WithoutTimings(gym.Wrapper):
    """The env with the measured seconds dropped from its infos: check_env's determinism checks
    compare infos of repeated steps, and wall-clock measurements differ between any two calls."""

    _TIMINGS = ("step_s", "reset_s", "step_queued_s", "reset_queued_s")

    def reset(self, *, seed=None, options=None):
        obs, info = self.env.reset(seed=seed, options=options)
        return obs, {k: v for k, v in info.items() if k not in self._TIMINGS}

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        return obs, reward, terminated, truncated, {k: v for k, v in info.items() if k not in self._TIMINGS}


def test_gym_env_passes_check_env(catalog) -> None:
    # Run on the wrapper (check_env warns that it is wrapped); every other check is the stock one.
    with pytest.warns(UserWarning):
        check_env(_WithoutTimings(TakeoverGymEnv(catalog=catalog)), skip_render_check=True)


def test_gym_env_replays_takeover_env_bitwise(catalog) -> None:
    clip, episode_seed = 17, 12345
    gym_env = TakeoverGymEnv(catalog=catalog)
    slot_env = TakeoverEnv(num_slots=1, catalog=catalog)
    obs, info = gym_env.reset(seed=3, options={"clip_id": clip, "episode_seed": episode_seed})
    expected = slot_env.reset(np.array([0]), np.array([clip]), np.array([episode_seed]))[0]
    assert info["clip_id"] == clip and info["episode_seed"] == episode_seed
    assert np.array_equal(obs, expected) and obs.dtype == np.float32
    actions = np.random.default_rng(0).uniform(-1, 1, size=(400, 2)).astype(np.float32)
    for t, action in enumerate(actions):
        obs, reward, terminated, truncated, info = gym_env.step(action)
        ref = slot_env.step(np.array([0]), action[None])
        assert np.array_equal(obs, ref.observations[0]), f"observation differs at step {t}"
        assert reward == float(ref.rewards[0])
        assert (terminated, truncated) == (bool(ref.terminated[0]), bool(ref.truncated[0]))
        if terminated or truncated:
            assert info["episode_metrics"] == ref.episode_metrics[0]
            assert info["episode_metrics"]["length"] == t + 1
            break
    else:
        pytest.fail("the episode did not end within 400 steps")
    with pytest.raises(RuntimeError, match="call reset"):
        gym_env.step(actions[0])


def test_gym_env_deals_its_own_shuffled_clips(catalog) -> None:
    clips = [2, 5, 7, 11, 13]
    env = TakeoverGymEnv(clips, catalog=catalog)
    first = [env.reset(seed=9 if i == 0 else None)[1]["clip_id"] for i in range(10)]
    assert sorted(first[:5]) == clips and sorted(first[5:]) == clips  # every clip once per pass
    again = [env.reset(seed=9 if i == 0 else None)[1]["clip_id"] for i in range(10)]
    assert again == first
    with pytest.raises(ValueError, match="clip_id"):
        env.reset(options={"clip_id": 200})
    with pytest.raises(ValueError, match="clips"):
        TakeoverGymEnv([0, 999], catalog=catalog)


def test_cost_model_waits_what_the_config_says(catalog) -> None:
    # Never early (lower bounds); whether a map loads is counted, not timed: a busy machine is late.
    env = TakeoverGymEnv(catalog=catalog, cost=SMALL_COSTS)
    first = _clip_on_map(catalog, 0)
    _, info = env.reset(options={"clip_id": first})
    assert info["reset_s"] >= 0.030 and info["reset_map_loads"] == 1 and info["step_s"] == 0.0  # fixed + new map
    _, _, _, _, info = env.step(np.zeros(2, np.float32))
    assert info["step_s"] >= 0.005 and info["reset_s"] == 0.0  # compute included
    _, info = env.reset(options={"clip_id": _clip_on_map(catalog, 0, not_clip=first)})
    assert info["reset_s"] >= 0.012 and info["reset_map_loads"] == 0  # fixed + cached map
    # LRU of 2 maps: after maps 1 and 2, map 0 is evicted and loads in full again.
    env.reset(options={"clip_id": _clip_on_map(catalog, 1)})
    env.reset(options={"clip_id": _clip_on_map(catalog, 2)})
    _, info = env.reset(options={"clip_id": first})
    assert info["reset_s"] >= 0.030 and info["reset_map_loads"] == 1


def test_envs_of_one_server_queue_and_share_its_map_cache(catalog) -> None:
    """Two concurrent resets on one server: the second waits for the engine, then the channel
    (A: engine 0-10 ms, loads 10-30; B: engine 10-20, loads 30-50). On two servers neither waits."""

    def concurrent_resets(servers: list[ServerCostResources], clips: list[int]) -> list[dict]:
        envs = [TakeoverGymEnv(catalog=catalog, cost=SMALL_COSTS, server=s) for s in servers]
        infos: list[dict] = [{}, {}]
        barrier = threading.Barrier(2)

        def reset(i: int) -> None:
            barrier.wait()
            infos[i] = envs[i].reset(options={"clip_id": clips[i]})[1]

        threads = [threading.Thread(target=reset, args=(i,)) for i in range(2)]
        started = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for info in infos:
            info["both_s"] = time.perf_counter() - started
        return infos

    # Only lower bounds on times (a loaded machine makes every wait late, never early); which map loads
    # and which is cached is counted, not timed. Whether B queued needs the two threads to overlap,
    # which a loaded machine may deny one attempt (a thread started after the other finished): each
    # case gets 3 attempts, and B must have queued in one of them.
    new_maps = [_clip_on_map(catalog, 3), _clip_on_map(catalog, 4)]
    for _ in range(3):
        server = ServerCostResources.create(SMALL_COSTS.map_cache_size)
        a, b = sorted(concurrent_resets([server, server], new_maps), key=lambda info: info["reset_s"])
        assert a["reset_map_loads"] == b["reset_map_loads"] == 1
        assert a["reset_s"] >= 0.030  # engine and channel
        if b["reset_queued_s"] >= 0.005:  # B queued (for A's fixed part, then A's load)
            assert a["both_s"] >= 0.050  # engine 2 x 10 ms and channel 2 x 20 ms, in turn
            break
    else:
        pytest.fail("in 3 attempts, the second of two concurrent resets on one server never queued")
    # Both maps are now in the server's cache, whichever env loaded them.
    cached = [_clip_on_map(catalog, 4, not_clip=new_maps[1]), _clip_on_map(catalog, 3, not_clip=new_maps[0])]
    for _ in range(3):
        a, b = sorted(concurrent_resets([server, server], cached), key=lambda info: info["reset_s"])
        assert a["reset_map_loads"] == b["reset_map_loads"] == 0
        assert a["reset_s"] >= 0.012  # fixed + cached load
        if b["reset_queued_s"] >= 0.005:  # queued for A's fixed part
            assert b["both_s"] >= 0.022
            break
    else:
        pytest.fail("in 3 attempts, the second of two concurrent cached resets on one server never queued")

    two_servers = [ServerCostResources.create(SMALL_COSTS.map_cache_size) for _ in range(2)]
    for info in concurrent_resets(two_servers, new_maps):  # nothing to queue for: each server its own
        assert info["reset_map_loads"] == 1 and info["reset_s"] >= 0.030
        assert info["reset_queued_s"] < 0.010  # less than the other's fixed part: it never waited for it


def test_envs_of_one_server_take_turns_when_its_resets_stop_its_steps() -> None:
    """reset_blocks_steps across the envs of one server (threads here, processes in the benchmark):
    a step waits for another env's running fixed part, a fixed part for another env's running step.
    The second call starts only once the first holds its turn, so the order is sure; the times
    asserted are lower bounds that order implies."""
    server = ServerCostResources.create(2)
    try:
        a, b = (SyncCostModel(CostModelConfig(step_latency_s=0.1, reset_fixed_s=0.1, reset_blocks_steps=True), server)
                for _ in range(2))  # fmt: skip

        def first_then(first, counted: int, second) -> tuple[float, object]:
            started = time.perf_counter()
            thread = threading.Thread(target=first)
            thread.start()
            while server._counts()[counted] == 0:  # the first call holds its turn
                time.sleep(0.001)
            timing = second()
            thread.join()
            return time.perf_counter() - started, timing

        elapsed, step = first_then(lambda: a.reset(7), 1, b.step)  # a fixed part, then a step
        assert elapsed >= 0.2 and step.queued_s > 0.0 and step.emulated_s >= 0.1
        elapsed, reset = first_then(a.step, 0, lambda: b.reset(8))  # a step, then a fixed part
        assert elapsed >= 0.2 and reset.queued_s > 0.0 and reset.emulated_s >= 0.1
        assert server._counts() == (0, 0)
    finally:
        server.close()


def _children(pid: int) -> set[int]:
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            found.update(int(p) for p in (task / "children").read_text().split())
        except FileNotFoundError:  # the task ended meanwhile
            pass
    return found


def _descendants(pid: int | None = None) -> set[int]:
    """Every live process below `pid` (this one by default), read from /proc."""
    found: set[int] = set()
    for child in _children(pid or os.getpid()):
        found |= {child} | _descendants(child)
    return found


def _left_behind(before: set[int]) -> set[int]:
    """New processes below this one, except multiprocessing's fork server and resource tracker
    (our children, started once, serving every later call and exiting with us). The env
    processes are the fork server's children (they share its command line), so they count."""

    def helper(pid: int) -> bool:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except FileNotFoundError:
            return False
        return b"multiprocessing.forkserver" in cmdline or b"multiprocessing.resource_tracker" in cmdline

    helpers = {pid for pid in _children(os.getpid()) if helper(pid)}
    return _descendants() - before - helpers


def _check_summary(summary: dict, samples: int, num_envs: int) -> None:
    assert summary["mode"] == "gym-async" and summary["num_slots"] == num_envs
    assert summary["valid_transitions"] >= samples and summary["transitions"] == summary["valid_transitions"]
    assert summary["validity"] == 1.0 and summary["global_resets"] == 0
    for key in ("sampling_time_s", "raw_throughput", "effective_throughput", "time_efficiency",
                "time_efficiency_critical_path", "time_efficiency_env_sum", "episode_length_mean",
                "episode_return_mean", "slot_resets_per_1k_valid", "startup_s"):  # fmt: skip
        assert math.isfinite(summary[key]), f"{key}={summary[key]}"
    assert (
        0.0 < summary["time_efficiency"] <= 1.0
        and summary["time_efficiency"] == summary["time_efficiency_critical_path"]
    )
    assert 0.0 < summary["time_efficiency_env_sum"] <= 1.0
    assert summary["effective_throughput"] == pytest.approx(summary["valid_transitions"] / summary["sampling_time_s"])
    assert summary["episodes"] == len(summary["episode_lengths"]) > 0
    assert sum(summary["episode_ends"].values()) == summary["episodes"]
    assert summary["closed_loop"] and all(math.isfinite(v) for v in summary["closed_loop"].values())


def test_measure_async_vector_returns_the_broker_metrics_and_cleans_up() -> None:
    before = _descendants()
    summary = measure_async_vector(2, 1, "off", None, (64, 64), 200, 0)
    _check_summary(summary, 200, 2)
    assert summary["slot_resets_per_1k_valid"] == pytest.approx(
        1000 * summary["episodes"] / summary["valid_transitions"]
    )
    assert not multiprocessing.active_children()
    assert not _left_behind(before)  # the env processes, children of the fork server, are gone too


def test_measure_async_vector_with_given_weights_and_no_warmup() -> None:
    catalog = build_catalog(0, 200)
    spaces = TakeoverGymEnv(catalog=catalog)
    runner = PolicyRunner(space_spec(spaces.observation_space), space_spec(spaces.action_space), (16,), seed=5)
    before = _descendants()
    summary = measure_async_vector(3, 2, "off", export_weights(runner.policy), (16,), 300, 1, warmup_samples=0)
    _check_summary(summary, 300, 3)
    assert summary["servers"] == 2 and summary["warmup_s"] == 0.0
    assert not _left_behind(before)
