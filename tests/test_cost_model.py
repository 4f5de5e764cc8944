"""The cost model's rules, checked on its own clock (no sockets)."""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict

import pytest

from sim_server.cost_model import PRESETS, CostModel, CostModelConfig, cost_model_config, map_load_s, remember_maps
from sim_server.precise_wait import precise_wait


def _run(coro):
    return asyncio.run(coro)


def test_precise_wait_reports_the_wait_it_made() -> None:
    async def go():
        started = time.perf_counter()
        waited = await precise_wait(0.0016)
        return waited, time.perf_counter() - started

    # Never early, and what it reports is a wait it really made. How precise the waits are (an
    # upper bound) is a timing figure for a benchmark, not for a unit test on a shared machine.
    waited, outside = _run(go())
    assert 0.0016 <= waited <= outside
    assert _run(precise_wait(0.0)) == 0.0


def test_off_preset_waits_nothing() -> None:
    model = CostModel(PRESETS["off"])
    assert _run(model.step()).emulated_s == 0.0
    assert _run(model.reset([1, 2, 3])).emulated_s == 0.0


def test_batched_reset_pays_fixed_part_once() -> None:
    cfg = CostModelConfig(reset_fixed_s=0.05, map_load_s=0.0)
    batched = _run(CostModel(cfg).reset([1, 2, 3, 4]))

    async def four_concurrent():
        model = CostModel(cfg)
        started = time.perf_counter()
        timings = await asyncio.gather(*(model.reset([m]) for m in (1, 2, 3, 4)))
        return time.perf_counter() - started, timings

    elapsed, timings = _run(four_concurrent())
    assert 0.05 <= batched.emulated_s < 0.1
    assert elapsed >= 0.2  # the exclusive engine serves one reset at a time
    assert sum(t.queued_s for t in timings) >= 0.05 + 0.1 + 0.15 - 0.01


def test_parallel_preset_resets_do_not_queue() -> None:
    cfg = cost_model_config("parallel", step_latency_s=0.0)

    async def four_concurrent():
        model = CostModel(cfg)
        started = time.perf_counter()
        await asyncio.gather(*(model.reset([m]) for m in (1, 2, 3, 4)))
        return time.perf_counter() - started

    assert _run(four_concurrent()) < 2 * (cfg.reset_fixed_s + cfg.map_load_s)


def test_map_loads_share_bandwidth_and_cache() -> None:
    cfg = CostModelConfig(map_load_s=0.03, map_load_cached_s=0.0, map_cache_size=2)
    # The rule, without waiting (upper bounds on real waits fail on a loaded machine).
    recent: OrderedDict[int, None] = OrderedDict()

    def cached(map_id: int) -> bool:
        return map_id in recent

    assert map_load_s(cfg, [1, 2], cached) == pytest.approx(0.06)  # two uncached loads, one channel
    remember_maps(recent, [1, 2], cfg.map_cache_size)
    assert map_load_s(cfg, [1, 2], cached) == 0.0  # both cached now
    assert map_load_s(cfg, [7, 7], cached) == pytest.approx(0.03)  # one map loads once
    remember_maps(recent, [7, 7], cfg.map_cache_size)
    assert map_load_s(cfg, [1], cached) == pytest.approx(0.03)  # evicted (cache of 2: 7 and 2 remain)
    # The model waits what the rule says, never less, and remembers what it loaded.
    model = CostModel(cfg)
    assert _run(model.reset([1, 2])).emulated_s >= 0.06
    assert _run(model.reset([1, 2])).emulated_s < _run(CostModel(cfg).reset([1, 2])).emulated_s


def test_resets_count_the_maps_they_load_and_the_cache_hits() -> None:
    model = CostModel(CostModelConfig(map_cache_size=2))
    first = _run(model.reset([7, 7, 8]))  # map 7 twice in one call loads once
    assert (first.map_loads, first.map_cache_hits) == (2, 1)
    again = _run(model.reset([8, 9]))
    assert (again.map_loads, again.map_cache_hits) == (1, 1)
    evicted = _run(model.reset([7]))  # the cache of 2 holds 8 and 9 now
    assert (evicted.map_loads, evicted.map_cache_hits) == (1, 0)


def test_unknown_preset_is_named() -> None:
    with pytest.raises(ValueError, match="cost preset 'fastest' is unknown; use one of off, calibrated"):
        cost_model_config("fastest")


def test_override_marks_preset_custom() -> None:
    cfg = cost_model_config("calibrated", step_latency_s=0.01, reset_fixed_s=None)
    assert cfg.preset == "calibrated+custom" and cfg.step_latency_s == 0.01
    assert cfg.reset_fixed_s == PRESETS["calibrated"].reset_fixed_s


def test_cost_preset_off_from_yaml_is_the_off_preset() -> None:
    # YAML 1.1 reads a bare `off` as False: a FAST_TRAIN_COST_PRESET=off must still mean the preset.
    from fast.config import resolve_config
    from jobs.train.config import ENV_PREFIX, TrainConfig

    cfg = resolve_config(TrainConfig, env_prefix=ENV_PREFIX, environ={"FAST_TRAIN_COST_PRESET": "off"}, overrides={})
    assert cfg.cost_preset == "off"
