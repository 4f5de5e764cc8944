"""Masked generalised advantage estimation over a `[T, N]` DPSA batch (docs/smpo.md, eq. G1-G4).

GAE is CleanRL's ten-line reversed loop, vectorised over slots, with two changes:
- padding steps are skipped: they neither produce an advantage nor touch the carry, so each
  slot sees only its valid steps, exactly as if the padding had never been recorded;
- the next value of a valid step comes from the step's own end (0 if terminated,
  `bootstrap_values` if truncated) or else from the slot's next *valid* step.
"""

from __future__ import annotations

import torch


@torch.no_grad()
def masked_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    terminated: torch.Tensor,
    truncated: torch.Tensor,
    bootstrap_values: torch.Tensor,
    valid_mask: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return `(advantages, returns)`, both `[T, N]` and exactly 0 at padding.

    All inputs are `[T, N]`; the three flags are bool. Padded entries of any input may be
    NaN or huge: they are only ever dropped by `torch.where`, never multiplied by the mask
    (NaN * 0 is NaN). Advantages are targets, not differentiated through (no_grad).
    """
    _check_inputs(
        {
            "rewards": rewards,
            "values": values,
            "terminated": terminated,
            "truncated": truncated,
            "bootstrap_values": bootstrap_values,
            "valid_mask": valid_mask,
        }
    )
    num_steps = rewards.shape[0]
    zeros = torch.zeros_like(values[0])
    advantages = torch.zeros_like(values)

    # Per slot, the state of the reversed sweep as of the next valid step (t' > t).
    next_valid_value = zeros  # V(s_{t'}); unused while the slot's next valid step is a fresh episode
    last_gae = zeros  # A_{t'}, the GAE carry
    for t in reversed(range(num_steps)):
        valid = valid_mask[t]
        # (G1) terminated wins over truncated, as in Gymnasium.
        ends_terminated = terminated[t]
        ends_truncated = truncated[t] & ~ends_terminated
        ends_episode = ends_terminated | ends_truncated
        next_value = torch.where(
            ends_terminated, zeros, torch.where(ends_truncated, bootstrap_values[t], next_valid_value)
        )
        # (G2) delta_t = r_t + gamma * V_next - V(s_t)
        delta = rewards[t] + gamma * next_value - values[t]
        # (G3) A_t = delta_t + gamma * lam * A_{t'}, the carry cut where the episode ends.
        carry = torch.where(ends_episode, zeros, last_gae)
        gae = delta + gamma * lam * carry
        # (G4) padding: no advantage, and the carry/next value skip over it untouched.
        advantages[t] = torch.where(valid, gae, zeros)
        last_gae = torch.where(valid, gae, last_gae)
        next_valid_value = torch.where(valid, values[t], next_valid_value)

    # R_t = A_t + V(s_t) on valid steps; values at padding may be NaN, so select, don't add.
    returns = advantages + torch.where(valid_mask, values, zeros)
    return advantages, returns


def _check_inputs(named: dict[str, torch.Tensor]) -> None:
    """ValueError naming the first of masked_gae's inputs (by argument name) of the wrong shape or dtype."""
    values = named["values"]
    if values.ndim != 2:
        raise ValueError(f"masked_gae: values must be [T, N], got shape {list(values.shape)}")
    for name, tensor in named.items():
        if tensor.shape != values.shape:
            raise ValueError(
                f"masked_gae: {name} must have the shape of values {list(values.shape)}, got {list(tensor.shape)}"
            )
    for name in ("terminated", "truncated", "valid_mask"):
        if named[name].dtype != torch.bool:
            raise ValueError(f"masked_gae: {name} must be torch.bool, got {named[name].dtype}")
