"""The cost model's rules, checked on its own clock (no sockets)."""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict

import pytest

from sim_server import cost_model
from sim_server.cost_model import (
    PRESETS,
    CostModel,
    CostModelConfig,
    cost_model_config,
    map_load_s,
    remember_maps,
    reset_waits,
)
from sim_server.precise_wait import _HANDBACK_S, precise_wait

# precise_wait hands the loop back ~0.1 ms before its deadline (the handback's own time, measured on
# a quiet machine); when the handback is quicker, or the coarse sleep already overslept to within it,
# a wait reports up to that much less than asked. Lower bounds allow it; they still catch any real
# shortfall.
EARLY = _HANDBACK_S


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
    assert 0.0016 - EARLY <= waited <= outside
    assert _run(precise_wait(0.0)) == 0.0


def test_off_preset_waits_nothing() -> None:
    model = CostModel(PRESETS["off"])
    assert _run(model.step()).emulated_s == 0.0
    assert _run(model.reset([1, 2, 3])).emulated_s == 0.0


def test_batched_reset_pays_fixed_part_once(monkeypatch) -> None:
    cfg = CostModelConfig(reset_fixed_s=0.05, map_load_s=0.0)
    batched = _run(CostModel(cfg).reset([1, 2, 3, 4]))

    # Each fixed part's wait as it ran, on the loop's own clock: from its start to its end, both taken
    # inside the engine's turn. (A start reckoned from outside, as the call's time asked plus its queued
    # time, is early by whatever ran in between: on CI a collection pause put one 1.5 ms early.)
    waits: list[tuple[float, float]] = []

    async def recorded(seconds: float) -> float:
        started = time.perf_counter()
        waited = await precise_wait(seconds)
        waits.append((started, time.perf_counter()))
        return waited

    monkeypatch.setattr(cost_model, "precise_wait", recorded)

    async def four_concurrent():
        model = CostModel(cfg)
        started = time.perf_counter()
        calls = await asyncio.gather(*(model.reset([m]) for m in (1, 2, 3, 4)))
        return time.perf_counter() - started, calls

    elapsed, calls = _run(four_concurrent())
    assert 0.05 - EARLY <= batched.emulated_s < 0.1
    assert elapsed >= 4 * (0.05 - EARLY)  # the exclusive engine serves one reset at a time ...
    # ... so no fixed part starts before the one before it has ended.
    assert len(waits) == 4
    waits.sort()
    for (_, end), (next_start, _) in zip(waits, waits[1:]):
        assert next_start >= end
    assert sum(t.queued_s > 0.02 for t in calls) >= 3


def test_parallel_preset_resets_do_not_queue() -> None:
    cfg = cost_model_config("parallel", step_latency_s=0.0)

    async def four_concurrent():
        model = CostModel(cfg)
        started = time.perf_counter()
        timings = await asyncio.gather(*(model.reset([m]) for m in (1, 2, 3, 4)))
        return time.perf_counter() - started, timings

    elapsed, timings = _run(four_concurrent())
    assert all(t.queued_s == 0.0 for t in timings)  # nothing to queue for
    # One at a time would take 4 resets' worth at the least; a loaded machine oversleeps, never that much.
    assert elapsed < 4 * (cfg.reset_fixed_s + cfg.map_load_s)


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
    assert _run(model.reset([1, 2])).emulated_s >= 0.06 - EARLY
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


# -- reset_blocks_steps: a reset's fixed part stops the server's steps (the `vectorized` preset) ----
# Order is asserted, not timing: each test starts its second call only once the first holds its
# turn (the counts of CostModel's StepTurns), so which call waits for which does not depend on how
# fast a loaded machine runs. Times are only lower bounds that the order implies.

BLOCKING = CostModelConfig(step_latency_s=0.005, reset_fixed_s=0.2, reset_blocks_steps=True)


async def _until(ready) -> None:
    while not ready():
        await asyncio.sleep(0)


def test_a_step_waits_for_a_running_fixed_part() -> None:
    async def go():
        model, done = CostModel(BLOCKING), []

        async def reset():
            started = time.perf_counter()
            await model.reset([1])
            done.append("reset")
            return time.perf_counter() - started

        resetting = asyncio.create_task(reset())
        await _until(lambda: model._turns.fixed_parts == 1)  # the fixed part runs
        step = await model.step()
        done.append("step")
        return done, step, await resetting

    done, step, reset_s = _run(go())
    assert done == ["reset", "step"]  # the step's turn came only after the fixed part
    assert reset_s >= BLOCKING.reset_fixed_s
    assert step.queued_s > 0.25 * BLOCKING.reset_fixed_s  # reported as queueing ...
    assert step.emulated_s >= BLOCKING.step_latency_s - EARLY  # ... and the latency paid after it


def test_a_fixed_part_waits_for_a_running_step_and_steps_cannot_starve_it() -> None:
    cfg = CostModelConfig(step_latency_s=0.2, reset_fixed_s=0.005, reset_blocks_steps=True)

    async def go():
        model, done = CostModel(cfg), []

        async def call(name, coro):
            timing = await coro
            done.append(name)
            return timing

        first = asyncio.create_task(call("first step", model.step()))
        await _until(lambda: model._turns.steps == 1)  # the first step runs
        reset = asyncio.create_task(call("reset", model.reset([1])))
        await _until(lambda: model._turns.fixed_parts == 1)  # the fixed part waits for it
        second = await call("second step", model.step())  # arrives while the fixed part waits
        return done, await first, await reset, second

    done, _, reset, second = _run(go())
    assert done == ["first step", "reset", "second step"]
    assert reset.queued_s > 0.25 * cfg.step_latency_s  # waited for the running step
    assert second.queued_s >= reset.emulated_s  # and the later step for the whole fixed part


def test_without_the_knob_steps_and_fixed_parts_overlap() -> None:
    cfg = BLOCKING.model_copy(update={"reset_blocks_steps": False})

    async def go():
        model, done = CostModel(cfg), []

        async def reset():
            await model.reset([1])
            done.append("reset")

        resetting = asyncio.create_task(reset())
        await _until(lambda: model._queues["reset_engine"].locked())  # the fixed part runs
        step = await model.step()
        done.append("step")
        await resetting
        return done, step

    done, step = _run(go())
    assert done == ["step", "reset"]  # 5 ms of step inside 200 ms of fixed part
    assert step.queued_s == 0.0  # nothing to wait for


def test_cancelled_calls_leave_the_turns_as_they_were() -> None:
    async def go():
        model = CostModel(BLOCKING)
        resetting = asyncio.create_task(model.reset([1]))
        await _until(lambda: model._turns.fixed_parts == 1)
        stepping = asyncio.create_task(model.step())
        await _until(lambda: model._turns._waiters)  # the step waits for its turn
        stepping.cancel()  # cancelled while waiting ...
        resetting.cancel()  # ... and in its turn
        for task in (stepping, resetting):
            with pytest.raises(asyncio.CancelledError):
                await task
        turns = (model._turns.steps, model._turns.fixed_parts, len(model._turns._waiters))
        started = time.perf_counter()
        step = await model.step()  # nothing left to wait for
        return turns, model._queues["reset_engine"].locked(), step, time.perf_counter() - started

    turns, engine_locked, step, step_s = _run(go())
    assert turns == (0, 0, 0) and not engine_locked
    assert step.queued_s < BLOCKING.reset_fixed_s and step_s < BLOCKING.reset_fixed_s


def test_only_the_fixed_part_stops_steps() -> None:
    waits = list(reset_waits(PRESETS["vectorized"], [1, 2], lambda m: False))
    assert [(w.queue, w.stops_steps) for w in waits] == [("reset_engine", True), ("load_channel", False)]
    for name in ("off", "calibrated", "parallel", "step-only"):
        assert not any(w.stops_steps for w in reset_waits(PRESETS[name], [1], lambda m: False))


def test_vectorized_is_calibrated_with_resets_stopping_steps() -> None:
    vectorized, calibrated = PRESETS["vectorized"].model_dump(), PRESETS["calibrated"].model_dump()
    assert (vectorized.pop("preset"), vectorized.pop("reset_blocks_steps")) == ("vectorized", True)
    assert (calibrated.pop("preset"), calibrated.pop("reset_blocks_steps")) == ("calibrated", False)
    assert vectorized == calibrated


def test_the_other_presets_are_unchanged() -> None:
    knobs = dict(
        step_latency_s=0.0, reset_fixed_s=0.0, reset_fixed_exclusive=True, reset_blocks_steps=False, map_load_s=0.0,
        map_load_cached_s=0.0, map_load_shared=True, map_cache_size=4, prefetch_step_penalty=0.0,
    )  # fmt: skip
    calibrated = dict(knobs, step_latency_s=0.0016, reset_fixed_s=0.027, map_load_s=0.123)
    expected = {
        "off": knobs,
        "calibrated": calibrated,
        "parallel": dict(calibrated, reset_fixed_exclusive=False, map_load_shared=False),
        "step-only": dict(knobs, step_latency_s=0.0016),
    }
    assert list(PRESETS) == ["off", "calibrated", "parallel", "step-only", "vectorized"]
    for name, values in expected.items():
        assert PRESETS[name].model_dump() == {"preset": name, **values}, name


def test_a_vectorized_sim_server_reports_the_knob_and_stops_steps_during_a_reset() -> None:
    """Through a real `fast sim-server`: Describe carries the knob, and a Step sent while a Reset's
    fixed part runs reports the wait as queued. Whether the Step reaches the server while the fixed
    part runs is up to a loaded machine, so it gets 3 attempts; it must have waited in one."""
    import numpy as np
    from conftest import sim_server, stub_for

    from fast import tensor
    from fast.v1 import simulator_pb2 as pb

    args = ("--slots", "2", "--cost-preset", "vectorized", "--reset-fixed-s", "0.3", "--map-load-s", "0")
    with sim_server(*args) as server, stub_for(server.address) as stub:
        cost = stub.Describe(pb.DescribeRequest(), timeout=10).capabilities.cost_model
        assert cost.preset == "vectorized+custom" and cost.reset_blocks_steps and cost.reset_fixed_exclusive
        stub.Reset(pb.ResetRequest(slot_ids=[0, 1], clip_ids=[5, 6]), timeout=10)
        step = pb.StepRequest(slot_ids=[1], actions=tensor.to_proto(np.zeros((1, 2), np.float32)))
        for _ in range(3):
            resetting = stub.Reset.future(pb.ResetRequest(slot_ids=[0], clip_ids=[7]), timeout=10)
            time.sleep(0.1)  # the fixed part is (most likely) under way
            stepped = stub.Step(step, timeout=10)
            resetting.result()
            if stepped.timing.queued_s >= 0.05:
                assert stepped.timing.compute_s + stepped.timing.emulated_s >= cost.step_latency_s - EARLY  # latency
                break
        else:
            pytest.fail("in 3 attempts, a step sent during a reset's fixed part never waited for it")
