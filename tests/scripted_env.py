"""A SlotEnv whose episode lengths are set per slot, to check sampling semantics exactly.

Slot s's episodes last `lengths[s]` steps and end terminated (or truncated for the slots in
`truncating`). Observation: [steps taken, slot id, clip id]; reward 1 per step. It is served
by the real `Simulator` and gRPC server in-process, so samplers talk to it over sockets.
"""

from __future__ import annotations

import numpy as np

from fast.spaces import SpaceSpec
from sim_server.env_api import StepResult


class ScriptedLengthEnv:
    def __init__(self, lengths: list[int], truncating: tuple[int, ...] = (), num_clips: int = 50) -> None:
        self.num_slots = len(lengths)
        self.num_clips = num_clips
        self.lengths = np.array(lengths)
        self.truncating = set(truncating)
        self.observation_space = SpaceSpec(
            "box", (3,), np.dtype(np.float32), np.full(3, -1e6, np.float32), np.full(3, 1e6, np.float32)
        )
        self.action_space = SpaceSpec(
            "box", (1,), np.dtype(np.float32), np.full(1, -1, np.float32), np.full(1, 1, np.float32)
        )
        self.t = np.zeros(self.num_slots, dtype=np.int64)
        self.clip = np.zeros(self.num_slots, dtype=np.int64)
        self.reset_calls: list[list[int]] = []  # slot ids of every reset call, in order

    def map_id(self, clip_id: int) -> int:
        return clip_id

    def _obs(self, slots: np.ndarray) -> np.ndarray:
        return np.stack([self.t[slots], slots, self.clip[slots]], axis=1).astype(np.float32)

    def reset(self, slot_ids, clip_ids, seeds) -> np.ndarray:
        self.reset_calls.append([int(s) for s in slot_ids])
        self.t[slot_ids] = 0
        self.clip[slot_ids] = clip_ids
        return self._obs(slot_ids)

    def step(self, slot_ids, actions) -> StepResult:
        self.t[slot_ids] += 1
        ended = self.t[slot_ids] >= self.lengths[slot_ids]
        trunc = ended & np.isin(slot_ids, list(self.truncating))
        term = ended & ~trunc
        metrics = [
            {"length": float(self.t[s]), "return": float(self.t[s]), "clip_id": float(self.clip[s])} if e else None
            for s, e in zip(slot_ids, ended)
        ]
        return StepResult(self._obs(slot_ids), np.ones(len(slot_ids), np.float32), term, trunc, metrics)
