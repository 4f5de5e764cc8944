"""The hyper-parameters that change while a run goes on: what UpdateHyperparameters accepts, and which
values a restarted learner resumes with.

Two are changeable, the learning rate and the entropy coefficient: the knobs an operator turns on a
run that plateaus or collapses, and the two the update reads afresh at every step (Adam's
param_groups, the loss's entropy weight), so changing them between updates is sound. The rest of
PPOConfig shapes the batch's maths (gamma, lambda, epochs) and stays fixed for a run.

Plain values and rules; LearnerCore applies them between updates, under its state lock.
"""

from __future__ import annotations

import logging
import math

from learner.errors import invalid_argument
from learner.wire import Hyperparameters

log = logging.getLogger("fast.learner")

# Tighter than the config's bounds (lr > 0, ent_coef >= 0): a value sent while a run goes on is
# often a typo (a learning rate of 3 for 3e-4), and above 1 neither is a value anyone trains with.
LEARNING_RATE_RULE = "finite, > 0 and <= 1"
ENT_COEF_RULE = "finite, >= 0 and <= 1"


def updated(current: Hyperparameters, *, learning_rate: float | None, ent_coef: float | None) -> Hyperparameters:
    """`current` with the fields that are set changed (None keeps one).

    Raises LearnerError(INVALID_ARGUMENT) naming every value out of range, or the empty change;
    nothing is applied then, not even a valid field beside an invalid one.
    """
    if learning_rate is None and ent_coef is None:
        raise invalid_argument(
            "UpdateHyperparametersRequest sets no field; set learning_rate (" + LEARNING_RATE_RULE + ") "
            "and/or ent_coef (" + ENT_COEF_RULE + ")"
        )
    problems = []
    # Written as `not (ok)` so that NaN fails.
    if learning_rate is not None and not (0.0 < learning_rate <= 1.0):
        problems.append(f"learning_rate must be {LEARNING_RATE_RULE}, got {learning_rate!r}; e.g. 3e-4")
    if ent_coef is not None and not (0.0 <= ent_coef <= 1.0):
        problems.append(f"ent_coef must be {ENT_COEF_RULE}, got {ent_coef!r}; e.g. 0.01")
    if problems:
        raise invalid_argument("; ".join(problems) + " (nothing was changed)")
    return Hyperparameters(
        learning_rate=current.learning_rate if learning_rate is None else float(learning_rate),
        ent_coef=current.ent_coef if ent_coef is None else float(ent_coef),
    )


def usable(values: Hyperparameters) -> bool:
    """What any learner can train with (the config's bounds, looser than UpdateHyperparameters')."""
    return (
        math.isfinite(values.learning_rate)
        and values.learning_rate > 0.0
        and math.isfinite(values.ent_coef)
        and values.ent_coef >= 0.0
    )


def resumed(
    configured: Hyperparameters, saved: Hyperparameters | None, saved_configured: Hyperparameters | None
) -> Hyperparameters:
    """The values a learner restarted from a checkpoint trains with, field by field.

    `configured`: this start's config; `saved`: the values in force when the checkpoint was written
    (UpdateHyperparameters' changes included); `saved_configured`: the config they were written under.
    A value whose config setting is unchanged since the checkpoint resumes as saved (a change made
    with UpdateHyperparameters survives the restart); a setting changed in the config since wins (an
    operator restarting with a new --lr means it). A checkpoint without them (written before they
    were saved) resumes with the config's.
    """
    if saved is None or saved_configured is None:
        return configured
    values = {}
    for name in ("learning_rate", "ent_coef"):
        now, then, in_force = (getattr(v, name) for v in (configured, saved_configured, saved))
        if now != then:
            log.info("%s: the config's %r replaces the checkpoint's %r (the config changed since)", name, now, in_force)
        values[name] = in_force if now == then else now
    return Hyperparameters(**values)
