"""Assembles one iteration's masked batch, [T, N] = [steps, slots], row by row.

Padding rows of a slot (DPSA virtual steps, steps lost to a fault) hold zeros and
valid_mask False. Truncations are recorded with the observation to bootstrap from; their
values V(s_next) are computed at the end in one forward pass (the policy does not change
within an iteration).
"""

from __future__ import annotations

from typing import Callable

import numpy as np


class RolloutRecorder:
    def __init__(
        self, num_slots: int, obs_shape: tuple[int, ...], obs_dtype, act_shape: tuple[int, ...], act_dtype
    ) -> None:
        self.num_slots = num_slots
        self._obs_shape, self._obs_dtype = obs_shape, obs_dtype
        self._act_shape, self._act_dtype = act_shape, act_dtype
        self._rows: dict[str, list[np.ndarray]] = {
            k: [] for k in ("obs", "actions", "logprobs", "values", "rewards", "terminated", "truncated", "valid_mask")
        }
        self._bootstrap_at: list[tuple[int, int]] = []  # (row, slot) of each truncation
        self._bootstrap_obs: list[np.ndarray] = []
        self._bootstrap_known: dict[tuple[int, int], float] = {}

    @classmethod
    def for_spaces(cls, num_slots: int, observation_space, action_space) -> RolloutRecorder:
        """A recorder for a pool's spaces (broker/slots.py): discrete actions as int64, others float32."""
        act_dtype = np.int64 if action_space.kind == "discrete" else np.float32
        return cls(num_slots, observation_space.shape, observation_space.dtype, action_space.shape, act_dtype)

    @property
    def num_rows(self) -> int:
        return len(self._rows["obs"])

    def add_row(self, acting: np.ndarray, obs, actions, logprobs, values) -> int:
        """Start row t: `acting` [N] bool are the slots that act; the arrays are for those slots only."""
        row = self.new_row()
        self.put(row, np.flatnonzero(acting), obs, actions, logprobs, values)
        return row

    def new_row(self) -> int:
        """Start a row in which no slot acts yet (all padding until `put`)."""
        n = self.num_slots
        self._rows["obs"].append(np.zeros((n, *self._obs_shape), dtype=self._obs_dtype))
        self._rows["actions"].append(np.zeros((n, *self._act_shape), dtype=self._act_dtype))
        for key, dtype in (("logprobs", np.float32), ("values", np.float32), ("rewards", np.float32)):
            self._rows[key].append(np.zeros(n, dtype=dtype))
        for key in ("terminated", "truncated", "valid_mask"):
            self._rows[key].append(np.zeros(n, dtype=bool))
        return self.num_rows - 1

    def put(self, row: int, slots: np.ndarray, obs, actions, logprobs, values) -> None:
        """`slots` act at `row` (a row may be filled in parts: one per simulator server)."""
        self._rows["obs"][row][slots] = obs
        self._rows["actions"][row][slots] = actions
        self._rows["logprobs"][row][slots] = logprobs
        self._rows["values"][row][slots] = values
        self._rows["valid_mask"][row][slots] = True

    def drop_rows(self, start: int) -> None:
        """Forget rows `start`.. (steps taken past a round's end, broker/samplers/rounds.py); they
        must hold no truncation yet."""
        marked = (*self._bootstrap_at, *self._bootstrap_known)
        assert all(row < start for row, _ in marked), "a truncation in a dropped row"
        for rows in self._rows.values():
            del rows[start:]

    def set_outcome(self, row: int, slots: np.ndarray, rewards: np.ndarray, terminated: np.ndarray) -> None:
        self._rows["rewards"][row][slots] = rewards
        self._rows["terminated"][row][slots] = terminated

    def invalidate(self, row: int, slots: np.ndarray) -> None:
        """The step of `slots` at `row` was lost (fault): padding from here on."""
        self._rows["valid_mask"][row][slots] = False
        self._rows["rewards"][row][slots] = 0.0

    def is_open(self, row: int, slot: int) -> bool:
        """True when the slot's step at `row` is valid and did not end its episode."""
        return bool(
            self._rows["valid_mask"][row][slot]
            and not self._rows["terminated"][row][slot]
            and not self._rows["truncated"][row][slot]
        )

    def truncate(
        self, row: int, slot: int, *, next_obs: np.ndarray | None = None, next_value: float | None = None
    ) -> None:
        """Mark the slot's step at `row` truncated: GAE bootstraps from V(next_obs) (or a known value)."""
        self._rows["truncated"][row][slot] = True
        if next_value is not None:
            self._bootstrap_known[(row, slot)] = float(next_value)
        else:
            self._bootstrap_at.append((row, slot))
            # A copy: callers pass a view of their live observation buffer, which the slot's next
            # step or reset overwrites before build() computes the value.
            self._bootstrap_obs.append(np.array(next_obs, copy=True))

    def build(self, value_fn: Callable[[np.ndarray], np.ndarray]) -> dict[str, np.ndarray]:
        """The batch arrays; `value_fn(obs [k, ...]) -> [k]` computes the pending bootstrap values."""
        batch = {k: np.stack(v) for k, v in self._rows.items()}
        bootstrap = np.zeros((self.num_rows, self.num_slots), dtype=np.float32)
        if self._bootstrap_at:
            values = value_fn(np.stack(self._bootstrap_obs))
            rows, slots = np.array(self._bootstrap_at).T
            bootstrap[rows, slots] = values
        for (row, slot), value in self._bootstrap_known.items():
            bootstrap[row, slot] = value
        batch["bootstrap_values"] = bootstrap
        return batch
