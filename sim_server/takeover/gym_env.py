"""TakeoverGymEnv: one takeover episode at a time as a plain `gymnasium.Env`, with the cost model.

This is the external reference of the sampling benchmark: the takeover workload as a user of
Gymnasium would wrap it, stepped by `gymnasium.vector.AsyncVectorEnv` (one process per env)
instead of by the broker. It wraps `TakeoverEnv(num_slots=1)`, so a (clip, episode seed,
actions) triple replays bitwise the trajectory a simulator server's slot would play.

The costs follow the rules of `sim_server/cost_model.py` (docs/cost_model.md): the same
functions on the same `CostModelConfig`, applied synchronously in the env's process:
- a step waits what remains of `step_latency_s` after the env's own compute;
- a reset first takes the server's reset engine for `reset_fixed_s` (one env at a time when
  `reset_fixed_exclusive`), then the server's load channel for the clip's map load
  (`map_load_s`, or `map_load_cached_s` when the map is among the server's `map_cache_size`
  most recently loaded), then resets the env;
- with `reset_blocks_steps`, the steps of the server's envs and the fixed parts of its resets
  take turns: a fixed part waits for the running steps, and a step waits while a fixed part
  runs or waits (an env's own reset already stops its own steps: one env plays one slot).
A "server" is the `ServerCostResources` its envs share: K envs given S of them reproduce the
broker's setting with S simulator servers. The map cache is per server, in shared memory, so
a map one env loaded is cached for the other envs of its server exactly as in a server's
`CostModel` (a per-env-process cache would hold k times as many maps for a server of k envs
and would only see its own loads).

One difference from the asyncio CostModel, in queue order only: the engine and the load
channel are POSIX semaphores, which do not promise FIFO order (asyncio.Lock does), so which
queued reset goes first may differ; the sum of the waits does not. Waits are `precise_sleep`s
(sim_server/precise_wait.py) and every info reports the seconds the call really took.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import struct
import time
import weakref
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from multiprocessing.shared_memory import SharedMemory
from typing import Any

import gymnasium as gym
import numpy as np

from fast.spaces import SpaceSpec
from sim_server.cost_model import (
    CostModelConfig,
    CostTiming,
    Queue,
    Wait,
    cost_model_config,
    remember_maps,
    reset_waits,
    step_wait_s,
)
from sim_server.precise_wait import precise_sleep
from sim_server.takeover.catalog import Catalog
from sim_server.takeover.env import TakeoverEnv

_EMPTY = -1  # an unused entry of the shared map cache


@dataclass(frozen=True, eq=False)
class ServerCostResources:
    """What the envs that play one simulator server share: its reset engine, its load channel,
    its map cache and the turns its steps and fixed parts take (`reset_blocks_steps`).

    Create it in the parent process (with the multiprocessing context the envs' processes use)
    and hand the same object to every env of that server. The map cache is an int64 array of
    map ids, least to most recently loaded (_EMPTY-padded at the front), in POSIX shared memory
    (and so are the two counts of the turns, guarded by a multiprocessing Condition):
    it reaches the env processes by name, which works with every start method (a shared-ctypes
    Array reaches them as a file descriptor, which cloudpickle, used by AsyncVectorEnv for its
    env_fns, cannot pickle). The creating process unlinks it when `close` is called or the
    object is collected; processes that attached keep their mapping until they exit.
    """

    reset_engine: Any  # multiprocessing Lock
    load_channel: Any  # multiprocessing Lock
    cache_lock: Any  # multiprocessing Lock guarding map_cache
    map_cache: SharedMemory | None  # None when map_cache_size is 0
    map_cache_size: int
    turns: Any  # multiprocessing Condition guarding turn_counts
    turn_counts: SharedMemory  # two int64: steps in their turn, fixed parts in theirs or waiting

    @classmethod
    def create(cls, map_cache_size: int, context: str | None = None) -> "ServerCostResources":
        ctx = multiprocessing.get_context(context)
        cache = None
        if map_cache_size > 0:
            cache = SharedMemory(create=True, size=8 * map_cache_size)
            np.frombuffer(cache.buf, dtype=np.int64, count=map_cache_size)[:] = _EMPTY
        counts = SharedMemory(create=True, size=_TURN_COUNTS.size)
        _TURN_COUNTS.pack_into(counts.buf, 0, 0, 0)
        resources = cls(ctx.Lock(), ctx.Lock(), ctx.Lock(), cache, map_cache_size, ctx.Condition(), counts)
        object.__setattr__(resources, "_unlink", weakref.finalize(resources, _unlink, cache, counts))
        return resources

    def close(self) -> None:
        """Unlink the shared map cache (creating process only; a no-op elsewhere and when repeated)."""
        unlink = self.__dict__.get("_unlink")
        if unlink is not None:
            unlink()

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "_unlink"}  # only the creator unlinks

    def is_cached(self, map_id: int) -> bool:
        if self.map_cache is None:
            return False
        with self.cache_lock:
            return map_id in np.frombuffer(self.map_cache.buf, dtype=np.int64, count=self.map_cache_size)

    def remember_map(self, map_id: int) -> None:
        """Mark a map as most recently loaded, evicting the least recent beyond the cache size (LRU)."""
        if self.map_cache is None:
            return
        with self.cache_lock:
            ids = np.frombuffer(self.map_cache.buf, dtype=np.int64, count=self.map_cache_size)
            recent = OrderedDict.fromkeys(int(m) for m in ids if m != _EMPTY)
            remember_maps(recent, [map_id], self.map_cache_size)
            ids[:] = [_EMPTY] * (self.map_cache_size - len(recent)) + list(recent)
            del ids  # no buffer export may outlive the call: SharedMemory.close refuses while one exists

    # The turns of StepTurns (sim_server/cost_model.py) across the env processes of the server: the
    # same rule, with a Condition's wait in place of the event loop's futures.

    @contextlib.contextmanager
    def step_turn(self) -> Iterator[float]:
        """A step's turn: once no fixed part runs or waits; yields the seconds it waited."""
        started = time.perf_counter()
        with self.turns:
            self.turns.wait_for(lambda: self._counts()[1] == 0)
            self._count(steps=1)
        try:
            yield time.perf_counter() - started
        finally:
            self._leave(steps=-1)

    @contextlib.contextmanager
    def fixed_part_turn(self) -> Iterator[float]:
        """A fixed part's turn: once no step runs (arriving steps wait from the moment it asks)."""
        started = time.perf_counter()
        with self.turns:
            self._count(fixed_parts=1)
        try:
            with self.turns:
                self.turns.wait_for(lambda: self._counts()[0] == 0)
            yield time.perf_counter() - started
        finally:
            self._leave(fixed_parts=-1)

    def _counts(self) -> tuple[int, int]:
        return _TURN_COUNTS.unpack_from(self.turn_counts.buf, 0)  # struct: no buffer export outlives it

    def _count(self, steps: int = 0, fixed_parts: int = 0) -> tuple[int, int]:
        running, fixed = self._counts()
        counts = (running + steps, fixed + fixed_parts)
        _TURN_COUNTS.pack_into(self.turn_counts.buf, 0, *counts)
        return counts

    def _leave(self, steps: int = 0, fixed_parts: int = 0) -> None:
        with self.turns:
            if 0 in self._count(steps, fixed_parts):  # a turn may have ended: let the waiters check
                self.turns.notify_all()


_TURN_COUNTS = struct.Struct("qq")


def _unlink(*blocks: SharedMemory | None) -> None:
    for block in blocks:
        if block is None:
            continue
        block.close()
        try:
            block.unlink()
        except FileNotFoundError:
            pass


class SyncCostModel:
    """CostModel's rules for one env process playing one slot of a server (blocking waits)."""

    def __init__(self, config: CostModelConfig, server: ServerCostResources) -> None:
        self.config = config
        self.server = server

    def step(self, compute_s: float = 0.0) -> CostTiming:
        timing = CostTiming()
        turn = self.server.step_turn() if self.config.reset_blocks_steps else contextlib.nullcontext(0.0)
        with turn as queued_s:
            timing.queued_s = queued_s
            timing.emulated_s = precise_sleep(step_wait_s(self.config, compute_s))
        return timing

    def reset(self, map_id: int) -> CostTiming:
        """The fixed part on the server's engine, then the map load on its channel; the cache
        is updated only once the load is done, as in CostModel.reset."""
        timing = CostTiming()
        for wait in reset_waits(self.config, [map_id], self.server.is_cached):
            timing.map_loads += wait.map_loads
            timing.map_cache_hits += wait.map_cache_hits
            self._make(wait, timing)
        self.server.remember_map(map_id)
        return timing

    def _make(self, wait: Wait, timing: CostTiming) -> None:
        if wait.seconds <= 0:
            return
        if wait.queue is None and not wait.stops_steps:
            timing.emulated_s += precise_sleep(wait.seconds)
            return
        queues: dict[Queue, Any] = {"reset_engine": self.server.reset_engine, "load_channel": self.server.load_channel}
        queued_from = time.perf_counter()
        with contextlib.ExitStack() as held:  # the queue first, then the steps' absence, as in CostModel
            if wait.queue is not None:
                held.enter_context(queues[wait.queue])
            if wait.stops_steps:
                held.enter_context(self.server.fixed_part_turn())
            timing.queued_s += time.perf_counter() - queued_from
            timing.emulated_s += precise_sleep(wait.seconds)


def box_space(spec: SpaceSpec) -> gym.spaces.Box:
    return gym.spaces.Box(low=spec.low, high=spec.high, shape=spec.shape, dtype=spec.dtype)


def space_spec(space: gym.spaces.Box) -> SpaceSpec:
    """The SpaceSpec of a Box (what PolicyRunner takes)."""
    return SpaceSpec("box", tuple(space.shape), np.dtype(space.dtype), space.low.copy(), space.high.copy())


class TakeoverGymEnv(gym.Env):
    """One takeover episode at a time.

    reset(seed, options): `options={"clip_id": c}` plays clip c, else the next clip of this
    env's shuffled list of `clips` (a new shuffle per pass; `reset(seed=...)` reseeds it). The
    TakeoverEnv episode seed is `options["episode_seed"]` or is drawn from `np_random`.
    Every info carries `step_s` and `reset_s`: the seconds this call spent stepping (env
    compute + emulated latency + waiting for its turn, `step_queued_s`, under
    `reset_blocks_steps`) and resetting (queueing for the engine, load channel and turn,
    `reset_queued_s`, emulated waits, env compute), 0.0 for the part the call did not do, so that
    AsyncVectorEnv's same-step autoreset (step info under "final_info", reset info on top)
    yields complete arrays. A step that ends an episode adds `episode_metrics`, the
    closed-loop metrics of docs/takeover.md ("length" and "return" included).
    """

    metadata = {"render_modes": []}

    def __init__(
        self,
        clips: Sequence[int] | None = None,
        *,
        catalog: Catalog | None = None,
        catalog_seed: int = 0,
        num_clips: int = 200,
        cost: CostModelConfig | str = "off",
        server: ServerCostResources | None = None,
    ) -> None:
        """`catalog_seed`, `num_clips` build the catalog as `fast sim-server` does when none is
        given; `server=None` makes this env a server of its own (nothing shared)."""
        self._env = TakeoverEnv(num_slots=1, catalog=catalog, seed=catalog_seed, num_clips=num_clips)
        self.clips = (
            np.arange(self._env.num_clips, dtype=np.int64) if clips is None else np.asarray(clips, dtype=np.int64)
        )
        if self.clips.size == 0 or self.clips.min() < 0 or self.clips.max() >= self._env.num_clips:
            raise ValueError(f"clips must be non-empty ids in [0, {self._env.num_clips}); got {clips!r}")
        config = cost_model_config(cost) if isinstance(cost, str) else cost
        self._owns_server = server is None
        if server is None:
            server = ServerCostResources.create(config.map_cache_size)
        self.cost_model = SyncCostModel(config, server)
        self.observation_space = box_space(self._env.observation_space)
        self.action_space = box_space(self._env.action_space)
        self._order: np.ndarray | None = None
        self._next = 0
        self._live = False

    @property
    def takeover_env(self) -> TakeoverEnv:
        return self._env

    def _deal(self) -> int:
        if self._order is None or self._next == self._order.size:
            self._order = self.np_random.permutation(self.clips)
            self._next = 0
        clip = int(self._order[self._next])
        self._next += 1
        return clip

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        if seed is not None:
            self._order = None  # a seeded reset restarts the shuffled list from the new seed
        options = options or {}
        if "clip_id" in options:
            clip = int(options["clip_id"])
            if not 0 <= clip < self._env.num_clips:
                raise ValueError(
                    f"options['clip_id']={clip} is not a clip of this catalog; use 0..{self._env.num_clips - 1}"
                )
        else:
            clip = self._deal()
        episode_seed = (
            int(options["episode_seed"]) if "episode_seed" in options else int(self.np_random.integers(2**31))
        )
        started = time.perf_counter()
        cost = self.cost_model.reset(self._env.map_id(clip))  # waits first, as Simulator.reset does
        obs = self._env.reset(np.zeros(1, np.int64), np.array([clip]), np.array([episode_seed]))[0]
        reset_s = time.perf_counter() - started
        self._live = True
        info = {
            "clip_id": clip,
            "episode_seed": episode_seed,
            "step_s": 0.0,
            "reset_s": reset_s,
            "step_queued_s": 0.0,
            "reset_queued_s": cost.queued_s,
            "reset_map_loads": cost.map_loads,  # 1 when the clip's map was not in the server's cache
        }
        return obs, info

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        if not self._live:
            raise RuntimeError("the episode has ended or never started; call reset() before step()")
        started = time.perf_counter()
        result = self._env.step(
            np.zeros(1, np.int64), np.asarray(action, dtype=np.float32).reshape(1, *self.action_space.shape)
        )
        cost = self.cost_model.step(time.perf_counter() - started)  # the latency includes the compute
        step_s = time.perf_counter() - started
        terminated, truncated = bool(result.terminated[0]), bool(result.truncated[0])
        info: dict[str, Any] = {"step_s": step_s, "reset_s": 0.0, "step_queued_s": cost.queued_s, "reset_queued_s": 0.0}
        if terminated or truncated:
            self._live = False
            info["episode_metrics"] = dict(result.episode_metrics[0] or {})
        return result.observations[0], float(result.rewards[0]), terminated, truncated, info

    def close(self) -> None:
        if self._owns_server:
            self.cost_model.server.close()


__all__ = ["ServerCostResources", "SyncCostModel", "TakeoverGymEnv", "space_spec"]
