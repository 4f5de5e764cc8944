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

Every wait is made with `precise_wait` and reported as measured, not as configured.
See docs/cost_model.md for the presets and their calibration.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from dataclasses import dataclass

from pydantic import BaseModel, Field

from sim_server.precise_wait import precise_wait


class CostModelConfig(BaseModel):
    """The knobs of the cost model (seconds); see the module docstring for their meaning."""

    preset: str = "off"
    step_latency_s: float = Field(0.0, ge=0.0, le=10.0)
    reset_fixed_s: float = Field(0.0, ge=0.0, le=60.0)
    reset_fixed_exclusive: bool = True
    map_load_s: float = Field(0.0, ge=0.0, le=60.0)
    map_load_cached_s: float = Field(0.0, ge=0.0, le=60.0)
    map_load_shared: bool = True
    map_cache_size: int = Field(4, ge=0, le=100_000)


# Calibrated on a real driving simulator measured on this kind of machine: about 1.6 ms a
# step, about 150 ms a reset onto a new map and about 27 ms onto a cached one. The 27 ms is
# the fixed part (engine re-initialisation); the other 123 ms is the map load.
PRESETS: dict[str, CostModelConfig] = {
    "off": CostModelConfig(preset="off"),
    "calibrated": CostModelConfig(
        preset="calibrated",
        step_latency_s=0.0016,
        reset_fixed_s=0.027,
        reset_fixed_exclusive=True,
        map_load_s=0.123,
        map_load_cached_s=0.0,
        map_load_shared=True,
        map_cache_size=4,
    ),
    # Same costs, but every slot is its own machine: resets never queue or share bandwidth.
    "parallel": CostModelConfig(
        preset="parallel",
        step_latency_s=0.0016,
        reset_fixed_s=0.027,
        reset_fixed_exclusive=False,
        map_load_s=0.123,
        map_load_cached_s=0.0,
        map_load_shared=False,
        map_cache_size=4,
    ),
    # Only the step latency: measures framework overhead against slots / step latency.
    "step-only": CostModelConfig(preset="step-only", step_latency_s=0.0016),
}


def check_preset(name: str) -> str:
    """The name itself when it is a preset; ValueError naming the presets otherwise."""
    if name not in PRESETS:
        raise ValueError(f"use one of {', '.join(PRESETS)}")
    return name


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


class CostModel:
    """Applies a CostModelConfig inside one server's event loop."""

    def __init__(self, config: CostModelConfig) -> None:
        self.config = config
        self._reset_engine = asyncio.Lock()
        self._load_channel = asyncio.Lock()
        self._map_cache: OrderedDict[int, None] = OrderedDict()

    async def step(self, compute_s: float = 0.0) -> CostTiming:
        """Wait out the rest of the step latency after `compute_s` of real compute."""
        return CostTiming(emulated_s=await precise_wait(self.config.step_latency_s - compute_s))

    async def reset(self, map_ids: list[int]) -> CostTiming:
        c = self.config
        timing = CostTiming()
        if c.reset_fixed_s > 0:
            if c.reset_fixed_exclusive:
                queued_from = time.perf_counter()
                async with self._reset_engine:
                    timing.queued_s += time.perf_counter() - queued_from
                    timing.emulated_s += await precise_wait(c.reset_fixed_s)
            else:
                timing.emulated_s += await precise_wait(c.reset_fixed_s)
        # A map is loaded once per call even if several slots play it; the cache is only
        # updated once the loads are done, so a call cancelled mid-wait leaves it as it was.
        seen: set[int] = set()
        loads = []
        for m in map_ids:
            loads.append(c.map_load_cached_s if (m in self._map_cache or m in seen) else c.map_load_s)
            seen.add(m)
        total = sum(loads) if c.map_load_shared else max(loads, default=0.0)
        if total > 0:
            if c.map_load_shared:
                queued_from = time.perf_counter()
                async with self._load_channel:
                    timing.queued_s += time.perf_counter() - queued_from
                    timing.emulated_s += await precise_wait(total)
            else:
                timing.emulated_s += await precise_wait(total)
        for m in map_ids:
            self._remember_map(m)
        return timing

    def _remember_map(self, map_id: int) -> None:
        """Mark a map as most recently loaded, evicting beyond map_cache_size (LRU)."""
        if map_id in self._map_cache:
            self._map_cache.move_to_end(map_id)
        elif self.config.map_cache_size > 0:
            self._map_cache[map_id] = None
            while len(self._map_cache) > self.config.map_cache_size:
                self._map_cache.popitem(last=False)
