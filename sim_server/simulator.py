"""A simulator server's logic, without transport: slots, their episodes, the cost model.

`Simulator` owns a `SlotEnv` and the state of each slot (no episode / live / ended). Every
call is validated first, then the slots it names are claimed so no concurrent call can
touch them. A refused call changes nothing.

Reset waits out its emulated cost before touching the env, so a Reset cancelled mid-wait
changes nothing.

Prepare starts a slot's next episode in the background (the map load through the cost
model's load channel, then the env's own `prepare` if it has one) and returns at once; a
Reset of the slot onto the same (clip, seed) waits for what is left of it and skips the load.
The rules for unused, repeated and unfinished preparations are in docs/simulator_api.md.

Step computes first and then waits what remains of the step latency (the latency of a real
simulator includes its compute); the servicer refuses a Step whose deadline cannot cover the
latency before anything runs.
"""

from __future__ import annotations

import asyncio
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
    prepared: int = 0  # slots reset onto a Prepare's clip


@dataclass
class Preparation:
    """A slot's next episode being prepared in the background: the task gives the load's
    CostTiming and the env's prepared start (None for an env without `prepare`)."""

    clip_id: int
    seed: int
    task: asyncio.Task


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
        self._resetting = np.zeros(env.num_slots, dtype=bool)
        self._prepared: dict[int, Preparation] = {}

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
        self._resetting[slot_ids] = True
        try:
            # The preparations this call uses, waited for (shielded: a cancelled Reset leaves them running).
            started = time.perf_counter()
            used = [await self._finished(int(s), int(c), int(e)) for s, c, e in zip(slot_ids, clip_ids, seeds)]
            waited_s = time.perf_counter() - started
            cost = await self.cost_model.reset([self.env.map_id(int(c)) for c, u in zip(clip_ids, used) if u is None])
            started = time.perf_counter()
            if any(u is not None and u[1] is not None for u in used):
                starts = [None if u is None else u[1] for u in used]
                observations = self.env.reset(slot_ids, clip_ids, seeds, prepared=starts)
            else:
                observations = self.env.reset(slot_ids, clip_ids, seeds)
            compute_s = time.perf_counter() - started
            self.state[slot_ids] = SlotState.LIVE
            self.clip_of_slot[slot_ids] = clip_ids
            for s in slot_ids.tolist():  # every preparation of these slots is spent or dropped now
                dropped = self._prepared.pop(s, None)
                if dropped is not None:
                    dropped.task.cancel()  # a load under way stops, the cache as it was; a finished one stays
        finally:
            self._busy[slot_ids] = False
            self._resetting[slot_ids] = False
        timing = _timing(cost, compute_s)
        for u in used:
            if u is not None:
                timing.prepared += 1
                timing.map_loads += u[0].map_loads
                timing.map_cache_hits += u[0].map_cache_hits
        timing.emulated_s += waited_s
        return observations, timing

    async def _finished(self, slot: int, clip: int, seed: int) -> tuple[CostTiming, object] | None:
        """The slot's preparation of (clip, seed), once done; None when it has none for them or it failed."""
        preparation = self._prepared.get(slot)
        if preparation is None or (preparation.clip_id, preparation.seed) != (clip, seed):
            return None
        try:
            return await asyncio.shield(preparation.task)
        except asyncio.CancelledError:
            if preparation.task.cancelled():
                return None  # the preparation was dropped, not this call: reset without it
            raise
        except Exception:  # an env whose prepare raised: the reset does the whole work itself
            return None

    async def prepare(self, slot_ids: np.ndarray, clip_ids: np.ndarray, seeds: np.ndarray) -> None:
        """Start preparing the slots' next episodes in the background; returns at once."""
        validation.check_reset(slot_ids, clip_ids, seeds, self.env.num_slots, self.env.num_clips)
        if seeds.size == 0:
            seeds = np.zeros(slot_ids.size, dtype=np.int64)
        resetting = slot_ids[self._resetting[slot_ids]]
        if resetting.size:
            raise SimError(
                ErrorKind.FAILED_PRECONDITION,
                f"slot {int(resetting[0])} is being reset; prepare it after its Reset returns",
            )
        for slot, clip, seed in zip(slot_ids.tolist(), clip_ids.tolist(), seeds.tolist()):
            old = self._prepared.get(slot)
            if old is not None and (old.clip_id, old.seed) == (clip, seed):
                continue  # under way already
            if old is not None:
                old.task.cancel()
            task = asyncio.get_running_loop().create_task(self._prepare_one(clip, seed))
            task.add_done_callback(_retrieve)  # a failure nobody waits for is not logged as "never retrieved"
            self._prepared[slot] = Preparation(clip, seed, task)

    async def _prepare_one(self, clip: int, seed: int) -> tuple[CostTiming, object]:
        cost = await self.cost_model.prefetch(self.env.map_id(clip))
        prepare = getattr(self.env, "prepare", None)  # the env's own part of a reset, done ahead
        return cost, (prepare(clip, seed) if prepare is not None else None)

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


def _retrieve(task: asyncio.Task) -> None:
    if not task.cancelled():
        task.exception()


def _timing(cost: CostTiming, compute_s: float) -> CallTiming:
    return CallTiming(
        compute_s=compute_s,
        emulated_s=cost.emulated_s,
        queued_s=cost.queued_s,
        map_loads=cost.map_loads,
        map_cache_hits=cost.map_cache_hits,
    )
