"""Gymnasium environments that behave like fussy simulator engines, for the simulator kit's tests.

Importable by worker processes (tests/ on PYTHONPATH): importing registers
- `KitMainThread-v0`: every call raises unless it runs in the main thread of its process, and the
  constructor installs a signal handler, as many engines do (`signal.signal` itself refuses any
  other thread: "signal only works in main thread of the main interpreter");
- `KitSingleton-v0`: the same, and constructing a second live instance in one process raises.

Dynamics: a seeded random walk. obs = [position, velocity, noise, step]; action 0/1/2 pushes
left/none/right; the episode terminates when |position| > 3 and is truncated after 40 steps.
"""

from __future__ import annotations

import signal
import threading

import gymnasium as gym
import numpy as np
from scripted_env import ScriptedLengthEnv

MAIN_THREAD_ID = "KitMainThread-v0"
SINGLETON_ID = "KitSingleton-v0"


def _require_main_thread(what: str) -> None:
    if threading.current_thread() is not threading.main_thread():
        name = threading.current_thread().name
        raise RuntimeError(f"{what} called from thread {name!r}; this engine is main-thread only")


class MainThreadEnv(gym.Env):
    def __init__(self, push: float = 0.3) -> None:
        _require_main_thread("__init__")
        signal.signal(signal.SIGUSR2, signal.SIG_IGN)  # what an engine does; raises off the main thread
        self.push = push
        self.observation_space = gym.spaces.Box(-100.0, 100.0, shape=(4,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(3)
        self._rng = np.random.default_rng(0)
        self._state = np.zeros(4, dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        _require_main_thread("reset")
        super().reset(seed=seed)
        self._rng = self.np_random
        self._state = np.array([self._rng.uniform(-1, 1), 0.0, 0.0, 0.0], dtype=np.float32)
        return self._state.copy(), {}

    def step(self, action):
        _require_main_thread("step")
        position, velocity, _, t = (float(v) for v in self._state)
        velocity += (int(action) - 1) * self.push + float(self._rng.normal(0.0, 0.2))
        position += velocity * 0.1
        self._state = np.array([position, velocity, self._rng.normal(), t + 1], dtype=np.float32)
        terminated = abs(position) > 3.0
        return self._state.copy(), 1.0 - abs(position) / 3.0, terminated, False, {}


class SingletonEnv(MainThreadEnv):
    live = 0  # instances of this process not yet closed

    def __init__(self, push: float = 0.3) -> None:
        if SingletonEnv.live:
            raise RuntimeError("a second engine instance in one process; this engine allows one per process")
        super().__init__(push)
        SingletonEnv.live += 1
        self._closed = False

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            SingletonEnv.live -= 1


def make_main_thread_env(push: float = 0.3) -> gym.Env:
    """A factory, for `gym:kit_envs:make_main_thread_env`: the same env as KitMainThread-v0."""
    return gym.wrappers.TimeLimit(MainThreadEnv(push), max_episode_steps=40)


def make_slot_env(num_slots: int, seed: int = 0, num_clips: int = 50) -> ScriptedLengthEnv:
    """A SlotEnv factory, for `slot:kit_envs:make_slot_env`: episodes of 3 + slot steps."""
    return ScriptedLengthEnv([3 + s for s in range(num_slots)], num_clips=num_clips)


for _id, _entry in ((MAIN_THREAD_ID, "kit_envs:MainThreadEnv"), (SINGLETON_ID, "kit_envs:SingletonEnv")):
    if _id not in gym.registry:
        gym.register(id=_id, entry_point=_entry, max_episode_steps=40)
