"""The masked rollout batch a broker hands to the learner.

Layout is `[T, N]` = `[steps, slots]`: `obs[t, slot]` is what slot `slot` saw at step `t`.
DPSA (docs/smpo.md, "DPSA padding") keeps every tensor at N slots by padding: a step is
*invalid* (`valid_mask[t, slot] == False`) when the slot's episode already terminated in this
round, or when the step was lost to a simulator fault. Padded contents are garbage (NaN, 1e9,
anything) and no consumer may read them without selecting on `valid_mask` first.

Producer invariant (checked by `RolloutBatch.validate`, used by `masked_gae`):
  for each slot, every valid step either continues the same episode to that slot's *next
  valid* step, or is terminated or truncated; the last valid step of each slot is terminated
  or truncated (the broker truncates every live episode at the end of a rollout and supplies
  `bootstrap_values` for it).
Only the second half is checkable from the tensors; the first half is what lets GAE jump over
padding (`masked_gae`) and is the broker's promise.

A step that is both terminated and truncated counts as terminated (next value 0), as in
Gymnasium.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Mapping

import numpy as np
import torch

from fast.quoting import quote

# Fields shaped exactly [T, N]; the two per-step tensors with trailing dims are obs and actions.
_FLOAT_STEP_FIELDS = ("logprobs", "values", "rewards", "bootstrap_values")
_BOOL_STEP_FIELDS = ("terminated", "truncated", "valid_mask")
_TENSOR_FIELDS = ("obs", "actions", *_FLOAT_STEP_FIELDS, *_BOOL_STEP_FIELDS)


@dataclass(frozen=True)
class RolloutBatch:
    """One iteration's transitions, `[T, N]` with a validity mask (see module docstring)."""

    obs: torch.Tensor  # [T, N, *obs_shape] float, observation the action was sampled from
    actions: torch.Tensor  # [T, N, *act_shape] float (Box) or int64 (Discrete)
    logprobs: torch.Tensor  # [T, N] log pi_old(a | s) at sampling time
    values: torch.Tensor  # [T, N] V_old(s) at sampling time
    rewards: torch.Tensor  # [T, N] reward received after the action
    terminated: torch.Tensor  # [T, N] bool, the MDP ended the episode: next value is 0
    truncated: torch.Tensor  # [T, N] bool, the episode was cut: next value is bootstrap_values
    valid_mask: torch.Tensor  # [T, N] bool, False = padding (DPSA virtual step or lost step)
    bootstrap_values: torch.Tensor  # [T, N] V_old(s_next) where truncated, ignored elsewhere
    policy_version: int  # version of the policy that sampled every valid step

    @classmethod
    def from_numpy(cls, arrays: Mapping[str, Any]) -> RolloutBatch:
        """Build from a dict of numpy arrays keyed by field name (plus int `policy_version`).

        Arrays are copied, so the caller may reuse its buffers. The result is validated.
        """
        expected = {f.name for f in fields(cls)}
        missing = sorted(expected - arrays.keys())
        unknown = sorted(arrays.keys() - expected)
        if missing:
            raise ValueError(f"RolloutBatch.from_numpy: missing fields {missing}")
        if unknown:
            raise ValueError(f"RolloutBatch.from_numpy: unknown fields {unknown}; expected {sorted(expected)}")
        tensors = {name: torch.tensor(np.asarray(arrays[name])) for name in _TENSOR_FIELDS}
        policy_version = arrays["policy_version"]
        if isinstance(policy_version, np.integer):
            policy_version = int(policy_version)
        batch = cls(**tensors, policy_version=policy_version)
        batch.validate()
        return batch

    @property
    def num_steps(self) -> int:
        """T, the number of steps per slot."""
        return int(self.obs.shape[0])

    @property
    def num_slots(self) -> int:
        """N, the number of slots."""
        return int(self.obs.shape[1])

    @property
    def num_total(self) -> int:
        """T * N, every transition including padding."""
        return self.num_steps * self.num_slots

    @property
    def num_valid(self) -> int:
        """sum(valid_mask), the transitions SMPO normalises by."""
        return int(self.valid_mask.sum().item())

    def to(self, device: torch.device | str, dtype: torch.dtype | None = None) -> RolloutBatch:
        """Move to `device`; with `dtype`, also cast every floating-point field (not int actions)."""

        def move(tensor: torch.Tensor) -> torch.Tensor:
            if dtype is not None and tensor.is_floating_point():
                return tensor.to(device=device, dtype=dtype)
            return tensor.to(device=device)

        return replace(self, **{name: move(getattr(self, name)) for name in _TENSOR_FIELDS})

    def validate(
        self,
        obs_shape: tuple[int, ...] | None = None,
        action_shape: tuple[int, ...] | None = None,
    ) -> None:
        """Raise ValueError naming the first field whose type, shape, dtype or content is wrong.

        Checks shapes against `[T, N]` (and the per-step shapes when given), dtypes, a single
        device, that valid entries are finite, and the checkable half of the producer
        invariant (each slot's last valid step is terminated or truncated).
        """
        for name in _TENSOR_FIELDS:
            value = getattr(self, name)
            if not isinstance(value, torch.Tensor):
                raise ValueError(f"RolloutBatch.{name}: expected a torch.Tensor, got {type(value).__name__}")
        if self.obs.ndim < 2 or self.obs.shape[0] < 1 or self.obs.shape[1] < 1:
            raise ValueError(
                f"RolloutBatch.obs: expected shape [T, N, *obs_shape] with T, N >= 1, got {quote(list(self.obs.shape))}"
            )
        steps, slots = self.num_steps, self.num_slots
        if obs_shape is not None and tuple(self.obs.shape[2:]) != tuple(obs_shape):
            raise ValueError(
                f"RolloutBatch.obs: expected shape [T, N, *obs_shape] = {[steps, slots, *obs_shape]}, "
                f"got {quote(list(self.obs.shape))}"
            )
        if not self.obs.is_floating_point():
            raise ValueError(f"RolloutBatch.obs: expected a floating dtype, got {self.obs.dtype}")

        if tuple(self.actions.shape[:2]) != (steps, slots) or (
            action_shape is not None and tuple(self.actions.shape[2:]) != tuple(action_shape)
        ):
            act_shape = list(action_shape) if action_shape is not None else ["*act_shape"]
            raise ValueError(
                f"RolloutBatch.actions: expected shape [T, N, *act_shape] = {[steps, slots, *act_shape]}, "
                f"got {quote(list(self.actions.shape))}"
            )
        if not (self.actions.is_floating_point() or self.actions.dtype == torch.int64):
            raise ValueError(
                f"RolloutBatch.actions: expected a floating dtype (Box) or int64 (Discrete), got {self.actions.dtype}"
            )

        for name in (*_FLOAT_STEP_FIELDS, *_BOOL_STEP_FIELDS):
            tensor = getattr(self, name)
            if tuple(tensor.shape) != (steps, slots):
                raise ValueError(
                    f"RolloutBatch.{name}: expected shape [T, N] = {[steps, slots]}, got {quote(list(tensor.shape))}"
                )
        for name in _FLOAT_STEP_FIELDS:
            if not getattr(self, name).is_floating_point():
                raise ValueError(f"RolloutBatch.{name}: expected a floating dtype, got {getattr(self, name).dtype}")
        for name in _BOOL_STEP_FIELDS:
            if getattr(self, name).dtype != torch.bool:
                raise ValueError(f"RolloutBatch.{name}: expected dtype torch.bool, got {getattr(self, name).dtype}")

        devices = {name: getattr(self, name).device for name in _TENSOR_FIELDS}
        if len(set(devices.values())) > 1:
            raise ValueError(f"RolloutBatch: all fields must be on one device, got {devices}")

        if isinstance(self.policy_version, bool) or not isinstance(self.policy_version, int) or self.policy_version < 0:
            raise ValueError(f"RolloutBatch.policy_version: expected an int >= 0, got {self.policy_version!r}")

        self._validate_finite()
        self._validate_episode_ends()

    def _validate_finite(self) -> None:
        valid = self.valid_mask
        per_step_valid = {
            "obs": valid,
            "actions": valid,
            "logprobs": valid,
            "values": valid,
            "rewards": valid,
            # bootstrap_values is read only at truncated (and not terminated) valid steps.
            "bootstrap_values": valid & self.truncated & ~self.terminated,
        }
        for name, read_mask in per_step_valid.items():
            tensor = getattr(self, name)
            if not tensor.is_floating_point():
                continue
            finite = torch.isfinite(tensor).reshape(self.num_steps, self.num_slots, -1).all(dim=-1)
            bad = read_mask & ~finite
            if bool(bad.any()):
                t, slot = (int(i) for i in bad.nonzero()[0])
                raise ValueError(
                    f"RolloutBatch.{name}: non-finite value at a step that is read, first at "
                    f"[t={t}, slot={slot}] ({int(bad.sum())} in all); only padding may hold garbage"
                )

    def _validate_episode_ends(self) -> None:
        # Index of the last valid step of each slot, -1 for a slot with no valid step.
        step_index = torch.arange(self.num_steps, device=self.valid_mask.device).unsqueeze(1)
        last_valid = torch.where(self.valid_mask, step_index, -1).max(dim=0).values  # [N]
        has_valid = last_valid >= 0
        done = self.terminated | self.truncated
        done_at_last = done.gather(0, last_valid.clamp(min=0).unsqueeze(0)).squeeze(0)  # [N]
        open_slots = (has_valid & ~done_at_last).nonzero().flatten().tolist()
        if open_slots:
            steps = [int(last_valid[s]) for s in open_slots]
            raise ValueError(
                "RolloutBatch.terminated/truncated: the last valid step of every slot must be terminated "
                f"or truncated (with bootstrap_values); slots {open_slots} end open at steps {steps}"
            )
