"""The emulated costs of a real driving simulator, so that many slots run on few cores.

A real closed-loop simulator spends its time in rendering, physics and, above all, resets:
re-initialising the engine and moving the HD map and sensor state to the device. The small
built-in workloads do none of that, so the cost model *waits* where a real simulator would
work. It knows nothing about sampling modes: every caller pays the same rules.

- A Step call takes `step_latency_s` in all, once per call: the slots of a server step in
  parallel. The env's own compute counts towards it (a real simulator's measured step time
  includes its compute), so the wait is what remains of the latency after the compute.
- A Reset call first does the fixed part (`reset_fixed_s`) once for all its slots. When
  `reset_fixed_exclusive`, the server has one reset engine: concurrent Reset calls queue
  for it, so k one-slot resets cost k fixed parts while one k-slot reset costs one.
- Then each reset slot loads its clip's map: `map_load_s`, or `map_load_cached_s` when the
  map is among the server's `map_cache_size` most recently loaded. When `map_load_shared`,
  the loads go through one load channel (the server's bandwidth), one after another, so k
  concurrent loads finish after k load times; otherwise each slot loads on its own and the
  call waits for the slowest.
- When `reset_blocks_steps`, the server is one batched engine that stops stepping while it
  re-initialises: its Steps and the fixed parts of its Resets take turns. A fixed part starts
  once no Step runs, and a Step that arrives while a fixed part runs or waits to start waits
  for it (so a stream of Steps cannot starve a reset). Steps still run side by side, and map
  loads do not stop them. The time a call waits for its turn is queueing, like the queues above.

The rules are functions that neither wait nor lock (`step_wait_s`, `reset_waits`, `map_load_s`,
`remember_maps`), applied here by the asyncio `CostModel` and, blocking, by the Gymnasium reference's
`SyncCostModel` (sim_server/takeover/gym_env.py). Every wait is made with a precise wait
(sim_server/precise_wait.py) and reported as measured, not as configured.
See docs/cost_model.md for the presets and their calibration.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, Field

from sim_server.precise_wait import precise_wait


class CostModelConfig(BaseModel):
    """The knobs of the cost model (seconds); see the module docstring for their meaning."""

    preset: str = "off"
    step_latency_s: float = Field(0.0, ge=0.0, le=10.0)
    reset_fixed_s: float = Field(0.0, ge=0.0, le=60.0)
    reset_fixed_exclusive: bool = True
    reset_blocks_steps: bool = False  # the server's Steps wait while a reset's fixed part runs
    map_load_s: float = Field(0.0, ge=0.0, le=60.0)
    map_load_cached_s: float = Field(0.0, ge=0.0, le=60.0)
    map_load_shared: bool = True
    map_cache_size: int = Field(4, ge=0, le=100_000)
    # A Step call takes this fraction of step_latency_s longer while a background load (Prepare) runs.
    prefetch_step_penalty: float = Field(0.0, ge=0.0, le=10.0)


# Calibrated on a real driving simulator measured on this kind of machine: about 1.6 ms a
# step, about 150 ms a reset onto a new map and about 27 ms onto a cached one. The 27 ms is
# the fixed part (engine re-initialisation); the other 123 ms is the map load.
_CALIBRATED = CostModelConfig(
    preset="calibrated",
    step_latency_s=0.0016,
    reset_fixed_s=0.027,
    reset_fixed_exclusive=True,
    map_load_s=0.123,
    map_load_cached_s=0.0,
    map_load_shared=True,
    map_cache_size=4,
)
PRESETS: dict[str, CostModelConfig] = {
    "off": CostModelConfig(preset="off"),
    "calibrated": _CALIBRATED,
    # Same costs, but every slot is its own machine: resets never queue or share bandwidth.
    "parallel": _CALIBRATED.model_copy(
        update={"preset": "parallel", "reset_fixed_exclusive": False, "map_load_shared": False}
    ),
    # Only the step latency: measures framework overhead against slots / step latency.
    "step-only": CostModelConfig(preset="step-only", step_latency_s=0.0016),
    # Same costs, on a GPU-batched engine (GPUDrive, Waymax): a reset's fixed part re-initialises
    # the batch the server's slots step in, so their steps wait for it (docs/cost_model.md).
    "vectorized": _CALIBRATED.model_copy(update={"preset": "vectorized", "reset_blocks_steps": True}),
}


def check_preset(name: str) -> str:
    """The name itself when it is a preset; ValueError naming the presets otherwise."""
    if name not in PRESETS:
        raise ValueError(f"use one of {', '.join(PRESETS)}")
    return name


def _yaml_off(value: object) -> object:
    # YAML 1.1 reads a bare `off` (in a --config file or a FAST_*_COST_PRESET variable) as False.
    return "off" if value is False else value


# A config field naming a cost preset (`fast sim-server --cost-preset`, `fast train --cost-preset`).
CostPreset = Annotated[str, BeforeValidator(_yaml_off), AfterValidator(check_preset)]


def cost_model_config(preset: str, **overrides: float | bool | int | None) -> CostModelConfig:
    """A preset with some knobs overridden (None leaves a knob as the preset has it)."""
    if preset not in PRESETS:
        raise ValueError(f"cost preset {preset!r} is unknown; use one of {', '.join(PRESETS)}")
    changes = {k: v for k, v in overrides.items() if v is not None}
    base = PRESETS[preset].model_dump()
    if changes:
        base.update(changes, preset="custom" if preset == "off" else f"{preset}+custom")
    return CostModelConfig.model_validate(base)


@dataclass
class CostTiming:
    """Seconds spent in emulated work and in queues for exclusive resources, as measured."""

    emulated_s: float = 0.0
    queued_s: float = 0.0
    map_loads: int = 0  # reset slots whose map loaded from scratch
    map_cache_hits: int = 0  # reset slots whose map was cached or loaded by an earlier slot of the call


# -- The rules: what a call waits, and nothing about how --------------------------------------
# CostModel below (asyncio, inside one server's event loop) and the Gymnasium reference's
# SyncCostModel (sim_server/takeover/gym_env.py: blocking, one env process per slot) apply
# these same functions; each keeps only its own way of waiting and of queueing.

Queue = Literal["reset_engine", "load_channel"]  # a server's exclusive resources


@dataclass(frozen=True)
class Wait:
    """One emulated wait: `seconds` (nothing when <= 0), made while holding `queue`, if any, and,
    when `stops_steps`, while no Step runs on the server (Steps arriving meanwhile wait)."""

    seconds: float
    queue: Queue | None
    stops_steps: bool = False  # the fixed part of a reset under `reset_blocks_steps`
    map_loads: int = 0  # the load wait only: slots loading their map from scratch ...
    map_cache_hits: int = 0  # ... and slots whose map was cached or already loaded by the call


def step_wait_s(config: CostModelConfig, compute_s: float, *, loading: bool = False) -> float:
    """What a Step call waits: the rest of the step latency after the env's own compute; the
    latency is `prefetch_step_penalty` longer while a background load runs on the server.
    Under `reset_blocks_steps` the wait is made in the Steps' turn (after any fixed part)."""
    latency = config.step_latency_s * (1.0 + (config.prefetch_step_penalty if loading else 0.0))
    return latency - compute_s


def reset_waits(config: CostModelConfig, map_ids: Sequence[int], is_cached: Callable[[int], bool]) -> Iterator[Wait]:
    """The waits of one Reset call whose slots play maps `map_ids`, in order: the fixed part, then the loads.

    A generator on purpose: the loads are priced only once the caller has made the fixed part,
    against the map cache as it is then (a concurrent call may have loaded a map meanwhile).
    """
    yield Wait(
        config.reset_fixed_s,
        "reset_engine" if config.reset_fixed_exclusive else None,
        stops_steps=config.reset_blocks_steps,
    )
    loads = map_loads(map_ids, is_cached)
    yield Wait(
        map_load_s(config, map_ids, is_cached),
        "load_channel" if config.map_load_shared else None,
        map_loads=loads,
        map_cache_hits=len(map_ids) - loads,
    )


def map_loads(map_ids: Sequence[int], is_cached: Callable[[int], bool]) -> int:
    """How many maps one Reset call loads from scratch: distinct maps not in the cache."""
    return len({m for m in map_ids if not is_cached(m)})


def map_load_s(config: CostModelConfig, map_ids: Sequence[int], is_cached: Callable[[int], bool]) -> float:
    """The seconds the map loads of one Reset call take: one after another through the shared load
    channel, else side by side (the slowest). A map played by several slots of the call loads once."""
    seen: set[int] = set()
    loads = []
    for m in map_ids:
        loads.append(config.map_load_cached_s if (m in seen or is_cached(m)) else config.map_load_s)
        seen.add(m)
    return sum(loads) if config.map_load_shared else max(loads, default=0.0)


def remember_maps(recent: OrderedDict[int, None], map_ids: Sequence[int], size: int) -> None:
    """Mark maps as most recently loaded, in order, evicting beyond `size` (LRU).

    `recent` holds map ids from least to most recently loaded. Callers update it only once a
    reset's waits are done, so a call cancelled mid-wait leaves the cache as it was.
    """
    for m in map_ids:
        if m in recent:
            recent.move_to_end(m)
        elif size > 0:
            recent[m] = None
            while len(recent) > size:
                recent.popitem(last=False)


class StepTurns:
    """Steps and the fixed parts of resets taking turns on one server (`reset_blocks_steps`).

    Many Steps may run at once, and so may fixed parts (as many as the reset engine lets through),
    but never a Step and a fixed part together. A fixed part counts from the moment it asks for
    its turn, so a Step arriving while one waits for the running Steps waits too: a stream of Steps
    cannot starve a reset. Each turn yields the seconds it waited for. The counts change only
    between awaits and are undone in `finally`, so a call cancelled while waiting or in its turn
    leaves them right. Waiters are futures of the running loop, so no loop is bound at creation.
    """

    def __init__(self) -> None:
        self.steps = 0  # Steps in their turn
        self.fixed_parts = 0  # fixed parts in their turn or waiting for the Steps to finish
        self._waiters: set[asyncio.Future[None]] = set()

    @contextlib.asynccontextmanager
    async def step(self) -> AsyncIterator[float]:
        started = time.perf_counter()
        await self._until(lambda: self.fixed_parts == 0)
        self.steps += 1
        try:
            yield time.perf_counter() - started
        finally:
            self.steps -= 1
            if self.steps == 0:
                self._wake()

    @contextlib.asynccontextmanager
    async def fixed_part(self) -> AsyncIterator[float]:
        started = time.perf_counter()
        self.fixed_parts += 1  # from now on, arriving Steps wait
        try:
            await self._until(lambda: self.steps == 0)
            yield time.perf_counter() - started
        finally:
            self.fixed_parts -= 1
            if self.fixed_parts == 0:
                self._wake()

    async def _until(self, ready: Callable[[], bool]) -> None:
        while not ready():  # checked again on every wake-up: another call may have taken the turn
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.add(waiter)
            try:
                await waiter
            finally:
                self._waiters.discard(waiter)

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, set()
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)


class CostModel:
    """Applies a CostModelConfig inside one server's event loop (FIFO asyncio locks as its queues,
    StepTurns for Steps against fixed parts)."""

    def __init__(self, config: CostModelConfig) -> None:
        self.config = config
        self._queues: dict[Queue, asyncio.Lock] = {"reset_engine": asyncio.Lock(), "load_channel": asyncio.Lock()}
        self._turns = StepTurns()
        self._map_cache: OrderedDict[int, None] = OrderedDict()
        self._background_loads = 0  # Prepare loads holding the load channel now (not queued)

    async def step(self, compute_s: float = 0.0) -> CostTiming:
        """Wait out the rest of the step latency after `compute_s` of real compute; under
        `reset_blocks_steps`, first wait for the fixed parts that run or wait (queued_s)."""
        timing = CostTiming()
        turn = self._turns.step() if self.config.reset_blocks_steps else contextlib.nullcontext(0.0)
        async with turn as queued_s:
            timing.queued_s = queued_s
            wait = step_wait_s(self.config, compute_s, loading=self._background_loads > 0)
            timing.emulated_s = await precise_wait(wait)
        return timing

    def is_cached(self, map_id: int) -> bool:
        return map_id in self._map_cache

    async def prefetch(self, map_id: int) -> CostTiming:
        """A background load of one map, for a slot's prepared clip: through the same load channel
        as resets' loads, priced against the cache once the channel is free, and entered in the cache
        only when done (a cancelled prefetch leaves the cache as it was). Steps pay the penalty while
        it loads."""
        timing = CostTiming()
        queued_from = time.perf_counter()
        async with self._queues["load_channel"] if self.config.map_load_shared else contextlib.nullcontext():
            timing.queued_s = time.perf_counter() - queued_from
            cached = map_id in self._map_cache
            seconds = self.config.map_load_cached_s if cached else self.config.map_load_s
            timing.map_loads, timing.map_cache_hits = (0, 1) if cached else (1, 0)
            if seconds > 0:
                self._background_loads += 1
                try:
                    timing.emulated_s = await precise_wait(seconds)
                finally:
                    self._background_loads -= 1
        remember_maps(self._map_cache, [map_id], self.config.map_cache_size)
        return timing

    async def reset(self, map_ids: list[int]) -> CostTiming:
        timing = CostTiming()
        for wait in reset_waits(self.config, map_ids, self._map_cache.__contains__):
            timing.map_loads += wait.map_loads
            timing.map_cache_hits += wait.map_cache_hits
            await self._make(wait, timing)
        remember_maps(self._map_cache, map_ids, self.config.map_cache_size)
        return timing

    async def _make(self, wait: Wait, timing: CostTiming) -> None:
        if wait.seconds <= 0:
            return
        if wait.queue is None and not wait.stops_steps:
            timing.emulated_s += await precise_wait(wait.seconds)
            return
        queued_from = time.perf_counter()
        async with contextlib.AsyncExitStack() as held:
            # The queue first, then the Steps' absence: a reset queued behind another one for the
            # engine does not stop the Steps; only the fixed part about to run does.
            if wait.queue is not None:
                await held.enter_async_context(self._queues[wait.queue])
            if wait.stops_steps:
                await held.enter_async_context(self._turns.fixed_part())
            timing.queued_s += time.perf_counter() - queued_from
            timing.emulated_s += await precise_wait(wait.seconds)
