"""A simulator server's logic, without transport: slots, their episodes, the cost model.

`Simulator` owns a `SlotEnv` and the state of each slot (no episode / live / ended). Every
call is validated first, then the slots it names are claimed so no concurrent call can
touch them. A refused call changes nothing.

Reset waits out its emulated cost before touching the env, so a Reset cancelled mid-wait
changes nothing. Step computes first and then waits what remains of the step latency (the
latency of a real simulator includes its compute); the servicer refuses a Step whose
deadline cannot cover the latency before anything runs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import IntEnum

import numpy as np

from sim_server import validation
from sim_server.cost_model import CostModel, CostTiming
from sim_server.env_api import SlotEnv, StepResult
from sim_server.errors import ErrorKind, SimError


class SlotState(IntEnum):
    EMPTY = 0  # never reset
    LIVE = 1  # an episode is running
    ENDED = 2  # the episode terminated or was truncated; needs a reset


@dataclass
class CallTiming:
    """Where one call's time went on the server (seconds)."""

    compute_s: float = 0.0
    emulated_s: float = 0.0
    queued_s: float = 0.0
    map_loads: int = 0
    map_cache_hits: int = 0


@dataclass
class EpisodeEnd:
    slot_id: int
    clip_id: int
    terminated: bool
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class StepOutcome:
    result: StepResult
    episodes: list[EpisodeEnd]
    timing: CallTiming


class Simulator:
    def __init__(self, env: SlotEnv, cost_model: CostModel) -> None:
        self.env = env
        self.cost_model = cost_model
        self.state = np.full(env.num_slots, SlotState.EMPTY, dtype=np.int8)
        self.clip_of_slot = np.full(env.num_slots, -1, dtype=np.int64)
        self._busy = np.zeros(env.num_slots, dtype=bool)

    def _claim(self, slot_ids: np.ndarray) -> None:
        busy = slot_ids[self._busy[slot_ids]]
        if busy.size:
            raise SimError(
                ErrorKind.FAILED_PRECONDITION,
                f"slot {int(busy[0])} is busy in another call; wait for it to return before calling again",
            )
        self._busy[slot_ids] = True

    async def reset(
        self, slot_ids: np.ndarray, clip_ids: np.ndarray, seeds: np.ndarray
    ) -> tuple[np.ndarray, CallTiming]:
        validation.check_reset(slot_ids, clip_ids, seeds, self.env.num_slots, self.env.num_clips)
        if seeds.size == 0:
            seeds = np.zeros(slot_ids.size, dtype=np.int64)
        self._claim(slot_ids)
        try:
            cost = await self.cost_model.reset([self.env.map_id(int(c)) for c in clip_ids])
            started = time.perf_counter()
            observations = self.env.reset(slot_ids, clip_ids, seeds)
            compute_s = time.perf_counter() - started
            self.state[slot_ids] = SlotState.LIVE
            self.clip_of_slot[slot_ids] = clip_ids
        finally:
            self._busy[slot_ids] = False
        return observations, _timing(cost, compute_s)

    async def step(self, slot_ids: np.ndarray, actions: np.ndarray) -> StepOutcome:
        validation.check_slot_ids(slot_ids, self.env.num_slots)
        not_live = slot_ids[self.state[slot_ids] != SlotState.LIVE]
        if not_live.size:
            slot = int(not_live[0])
            why = "its episode ended" if self.state[slot] == SlotState.ENDED else "it was never reset"
            raise SimError(ErrorKind.FAILED_PRECONDITION, f"slot {slot} has no live episode ({why}); Reset it first")
        validation.check_actions(slot_ids, actions, self.env.action_space)
        self._claim(slot_ids)
        try:
            started = time.perf_counter()
            result = self.env.step(slot_ids, actions)
            compute_s = time.perf_counter() - started
            ended = result.terminated | result.truncated
            self.state[slot_ids[ended]] = SlotState.ENDED
            cost = await self.cost_model.step(compute_s)
        finally:
            self._busy[slot_ids] = False
        episodes = [
            EpisodeEnd(
                slot_id=int(slot_ids[j]),
                clip_id=int(self.clip_of_slot[slot_ids[j]]),
                terminated=bool(result.terminated[j]),
                metrics=result.episode_metrics[j] or {},
            )
            for j in np.flatnonzero(ended)
        ]
        return StepOutcome(result=result, episodes=episodes, timing=_timing(cost, compute_s))


def _timing(cost: CostTiming, compute_s: float) -> CallTiming:
    return CallTiming(
        compute_s=compute_s,
        emulated_s=cost.emulated_s,
        queued_s=cost.queued_s,
        map_loads=cost.map_loads,
        map_cache_hits=cost.map_cache_hits,
    )
