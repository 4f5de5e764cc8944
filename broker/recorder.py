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

    @property
    def num_rows(self) -> int:
        return len(self._rows["obs"])

    def add_row(self, acting: np.ndarray, obs, actions, logprobs, values) -> int:
        """Start row t: `acting` [N] bool are the slots that act; the arrays are for those slots only."""
        n = self.num_slots
        row_obs = np.zeros((n, *self._obs_shape), dtype=self._obs_dtype)
        row_act = np.zeros((n, *self._act_shape), dtype=self._act_dtype)
        row_lp = np.zeros(n, dtype=np.float32)
        row_v = np.zeros(n, dtype=np.float32)
        row_obs[acting], row_act[acting], row_lp[acting], row_v[acting] = obs, actions, logprobs, values
        for key, value in (("obs", row_obs), ("actions", row_act), ("logprobs", row_lp), ("values", row_v)):
            self._rows[key].append(value)
        self._rows["rewards"].append(np.zeros(n, dtype=np.float32))
        self._rows["terminated"].append(np.zeros(n, dtype=bool))
        self._rows["truncated"].append(np.zeros(n, dtype=bool))
        self._rows["valid_mask"].append(acting.copy())
        return self.num_rows - 1

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
            self._bootstrap_obs.append(np.asarray(next_obs))

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
