"""The run settings that may change while a run goes on (UpdateSettings), their bounds, and what changed.

Which modes read which setting (broker/samplers/):

    alpha                  fast only (DPSA's termination rate)
    alpha_auto             fast only: alpha chosen at each iteration boundary (broker/advisor/auto_alpha.py);
                           a number given for alpha turns it off
    t_max                  fast only (DPSA's round length cap; sgr's rounds end at the first episode end)
    samples_per_iteration  every mode
    mode                   the sampling mode in force (the one the iteration sampled with); "auto"
                           given live turns mode_auto on, a mode's name turns it off
    mode_auto              the mode chosen at each iteration boundary from the run's measured
                           throughput per mode (broker/advisor/auto_mode.py)

A setting a mode does not read is still accepted and recorded, so that the run's status and
its metrics show what was asked for, and a later run in another mode can be set up alike.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

from broker.samplers import MODE_NAMES
from fast.quoting import quote

# Upper bounds of what UpdateSettings accepts; BrokerConfig's lower bounds are the same.
MAX_T_MAX = 100_000
MAX_SAMPLES_PER_ITERATION = 10_000_000
# Learner statistics whose change between consecutive iterations is reported in settings_changed.
LEARNER_SETTINGS = ("learning_rate", "ent_coef")


class SettingError(ValueError):
    """A setting out of its range; the message names the field, the range and the value."""


@dataclass(frozen=True)
class RunSettings:
    alpha: float  # DPSA: truncate when the termination rate reaches alpha, in (0, 1]
    t_max: int  # DPSA: ... or when the round reaches t_max steps, >= 1
    samples_per_iteration: int  # valid transitions per iteration (at least), >= 1
    alpha_auto: bool = False  # alpha chosen at each boundary (broker/advisor/auto_alpha.py); fast only
    mode: str = "fast"  # the sampling mode in force (broker/samplers/)
    mode_auto: bool = False  # the mode chosen at each boundary (broker/advisor/auto_mode.py)

    def as_dict(self) -> dict[str, float | int | bool | str]:
        return asdict(self)

    def updated(
        self,
        *,
        alpha: float | None = None,
        t_max: int | None = None,
        samples_per_iteration: int | None = None,
        alpha_auto: bool | None = None,
        mode: str | None = None,
    ) -> RunSettings:
        """These settings with the given ones replaced (each checked: SettingError); None keeps a value.
        An alpha given as a number turns alpha_auto off, unless alpha_auto is given too; a mode given
        by name fixes it (mode_auto off), "auto" turns mode_auto on (the mode stays until it chooses)."""
        given = {
            "alpha": alpha,
            "t_max": t_max,
            "samples_per_iteration": samples_per_iteration,
            "alpha_auto": alpha_auto,
            "mode": mode,
        }
        given = {name: value for name, value in given.items() if value is not None}
        if not given:
            raise SettingError(
                "no setting given; set at least one of alpha, t_max, samples_per_iteration, alpha_auto, mode"
            )
        for name, value in given.items():
            check(name, value)
        if alpha is not None and alpha_auto is None:
            given["alpha_auto"] = False
        if mode is not None:
            given["mode_auto"] = mode == "auto"
            if mode == "auto":
                del given["mode"]
        return replace(self, **given)


def check(name: str, value: float | int) -> None:
    """SettingError unless `value` is in the range of setting `name`."""
    if name == "alpha":
        ok, allowed = isinstance(value, (int, float)) and math.isfinite(value) and 0.0 < value <= 1.0, "0 < alpha <= 1"
    elif name == "t_max":
        ok, allowed = _is_int(value) and 1 <= value <= MAX_T_MAX, f"an integer in 1..{MAX_T_MAX:,}"
    elif name in ("alpha_auto", "mode_auto"):
        ok, allowed = isinstance(value, bool), "true or false"
    elif name == "mode":
        ok, allowed = value in (*MODE_NAMES, "auto"), f"{', '.join(MODE_NAMES)} or auto"
    elif name == "samples_per_iteration":
        ok = _is_int(value) and 1 <= value <= MAX_SAMPLES_PER_ITERATION
        allowed = f"an integer in 1..{MAX_SAMPLES_PER_ITERATION:,}"
    else:
        raise SettingError(
            f"setting {quote(name)} is unknown; use alpha, alpha_auto, t_max, samples_per_iteration or mode"
        )
    if not ok:
        raise SettingError(f"{name} is {quote(value)}; allowed: {allowed}")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def changes(old: RunSettings, new: RunSettings) -> list[dict]:
    """The settings_changed entries (name, old_value, new_value) of the broker's settings."""
    before, after = old.as_dict(), new.as_dict()
    return [
        {"name": name, "old_value": before[name], "new_value": after[name]}
        for name in before
        if before[name] != after[name]
    ]


def learner_changes(previous: dict | None, current: dict | None) -> list[dict]:
    """The learner's learning_rate / ent_coef that differ between two consecutive iterations' stats.

    Stats without a positive learning_rate come from a learner that does not report its
    hyper-parameters (proto3 reads the missing fields as 0): nothing is known of either then, and
    a change from or to unknown is not reported. ent_coef may well be 0 once reported.
    """
    old_stats, new_stats = _reported(previous), _reported(current)
    found = []
    for name in LEARNER_SETTINGS:
        old, new = _finite(old_stats.get(name)), _finite(new_stats.get(name))
        if old is not None and new is not None and old != new:
            found.append({"name": name, "old_value": old, "new_value": new})
    return found


def _reported(stats: dict | None) -> dict:
    learning_rate = _finite((stats or {}).get("learning_rate"))
    return stats if learning_rate is not None and learning_rate > 0 else {}


def _finite(value: object) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None
