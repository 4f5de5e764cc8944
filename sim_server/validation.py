"""Checks of Reset and Step requests against the slot table and the spaces.

Run before anything changes, so a refused request leaves every slot as it was. Messages
name the slot and the field and say what was expected.
"""

from __future__ import annotations

import numpy as np

from fast.quoting import quote
from sim_server.env_api import SpaceSpec
from sim_server.errors import ErrorKind, SimError


def check_slot_ids(slot_ids: np.ndarray, num_slots: int) -> None:
    if slot_ids.size == 0:
        raise SimError(ErrorKind.INVALID_ARGUMENT, "slot_ids is empty; name at least one slot")
    if slot_ids.min() < 0 or slot_ids.max() >= num_slots:
        unknown = slot_ids[(slot_ids < 0) | (slot_ids >= num_slots)]
        raise SimError(
            ErrorKind.NOT_FOUND, f"slot {int(unknown[0])} does not exist; this server has slots 0..{num_slots - 1}"
        )
    # In range now, so a count per slot finds a repeat in one pass (np.unique sorts).
    if np.bincount(slot_ids).max() > 1:
        uniq, counts = np.unique(slot_ids, return_counts=True)
        raise SimError(ErrorKind.INVALID_ARGUMENT, f"slot {int(uniq[counts > 1][0])} appears twice in slot_ids")


def check_reset(slot_ids: np.ndarray, clip_ids: np.ndarray, seeds: np.ndarray, num_slots: int, num_clips: int) -> None:
    check_slot_ids(slot_ids, num_slots)
    if clip_ids.size != slot_ids.size:
        raise SimError(
            ErrorKind.INVALID_ARGUMENT,
            f"clip_ids has {clip_ids.size} entries for {slot_ids.size} slot_ids; give one clip per slot",
        )
    if seeds.size not in (0, slot_ids.size):
        raise SimError(
            ErrorKind.INVALID_ARGUMENT,
            f"seeds has {seeds.size} entries for {slot_ids.size} slot_ids; give one seed per slot or none",
        )
    bad = np.flatnonzero((clip_ids < 0) | (clip_ids >= num_clips))
    if bad.size:
        j = int(bad[0])
        raise SimError(
            ErrorKind.NOT_FOUND,
            f"slot {int(slot_ids[j])}: clip {int(clip_ids[j])} does not exist; "
            f"the catalog has clips 0..{num_clips - 1}",
        )


def check_actions(slot_ids: np.ndarray, actions: np.ndarray, space: SpaceSpec) -> None:
    expected_shape = (slot_ids.size, *space.shape)
    if actions.shape != expected_shape or actions.dtype != space.dtype:
        raise SimError(
            ErrorKind.INVALID_ARGUMENT,
            f"actions: expected shape {list(expected_shape)} ({slot_ids.size} slots x action shape "
            f"{list(space.shape)}) of {space.dtype}, got shape {quote(list(actions.shape))} of {actions.dtype}",
        )
    flat = actions.reshape(slot_ids.size, -1)
    if space.kind == "discrete":
        bad = np.flatnonzero((flat < 0).any(axis=1) | (flat >= space.n).any(axis=1))
        if bad.size:
            j = int(bad[0])
            raise SimError(
                ErrorKind.INVALID_ARGUMENT,
                f"slot {int(slot_ids[j])}: action {int(flat[j, 0])} is outside the discrete space [0, {space.n})",
            )
        return
    low, high, finite_bounds = space.flat_bounds
    # One pass for the usual, good request: NaN fails both comparisons, and an infinity passes
    # only bounds that are infinite themselves (then the finiteness check below names it).
    if finite_bounds and ((flat >= low) & (flat <= high)).all():
        return
    if flat.dtype.kind == "f":
        nonfinite = np.flatnonzero(~np.isfinite(flat).all(axis=1))
        if nonfinite.size:
            j = int(nonfinite[0])
            raise SimError(
                ErrorKind.INVALID_ARGUMENT,
                f"slot {int(slot_ids[j])}: action {quote(flat[j].tolist())} is not finite; send finite values "
                f"of shape {list(space.shape)}",
            )
    outside = (flat < low) | (flat > high)
    rows = np.flatnonzero(outside.any(axis=1))
    if rows.size:
        j = int(rows[0])
        k = int(np.flatnonzero(outside[j])[0])
        raise SimError(
            ErrorKind.INVALID_ARGUMENT,
            f"slot {int(slot_ids[j])}: action element {k} = {flat[j, k].item()} is outside its bounds "
            f"[{low[k].item()}, {high[k].item()}]; clip actions to the action space",
        )
