"""Settings of `fast advise`: each declared once, here; the command's options derive from them
(fast/settings.py), and so do FAST_ADVISE_* variables and the keys of a --config file.

Kept apart from the run (jobs/advise/run.py loads torch and the broker's samplers), so that
building the `fast` command line does not load them.
"""

from __future__ import annotations

import math
from pathlib import Path

from pydantic import Field, field_validator, model_validator

from broker.config import BrokerConfig
from fast.settings import Settings, same_as
from jobs.external import inapplicable, parse_simulators
from sim_server.cost_model import PRESETS, CostPreset

ENV_PREFIX = "FAST_ADVISE_"
# The built-in workload when neither is given: as `fast train` and `fast bench train` run it.
DEFAULT_CLIPS = 10
DEFAULT_SERVERS = 2
# Settings that shape the servers `fast advise` starts itself: given with `simulators`, they are refused.
SIMULATOR_SETTINGS = {"preset": "--preset", "servers": "--servers"}
# An iteration's valid transitions, predicted and validated, per 10 clips: 1,024 over 30 clips is 34
# rows, which one or two reset bursts decide (repeats spread 2.2x; docs/advisor.md).
SAMPLES_PER_10_CLIPS = 1024


class AdviseConfig(Settings):
    # The simulators: `servers` built-in takeover servers under `preset`, or external ones.
    preset: CostPreset = Field(
        "calibrated",
        description=f"Cost preset of the built-in servers it starts (docs/cost_model.md): {' | '.join(PRESETS)}.",
    )
    servers: int = Field(DEFAULT_SERVERS, ge=1, le=64, description="Built-in simulator server processes.")
    simulators: list[str] = Field(
        default_factory=list,
        description="Advise on simulator servers that run already: HOST:PORT[,HOST:PORT...] or dns:///NAME:PORT "
        "(none started or stopped; the environment's run token; --preset/--servers then do not apply).",
    )
    clips: int | None = Field(
        None,
        ge=1,
        description=f"Parallel clips (slots) the modes drive, spread over the servers, as `fast bench sampling` "
        f"--clips; unset: {DEFAULT_CLIPS}, or every slot of --simulators.",
    )
    # The policy whose episode lengths are probed.
    checkpoint: Path | None = Field(
        None,
        description="A fast train run's checkpoints/ directory: probe episode lengths under its newest policy; "
        "unset: the initial policy.",
    )
    # What is measured, and how long.
    probe_repeats: int = Field(5, ge=1, le=50, description="Calls per timed figure of each server's probe.")
    # 8,000: the modes with rounds end a round at the first of many episodes to end, so the model needs
    # the lengths' lower tail; 2,000 (about 29 random-policy episodes) left it too thin (docs/advisor.md).
    length_samples: int = Field(
        8000, ge=1, description="Valid transitions of the episode-length probe (autoreset, every clip)."
    )
    samples: int | None = Field(
        None,
        ge=1,
        description="Valid transitions of a predicted iteration and of each validation run; unset: "
        f"{SAMPLES_PER_10_CLIPS:,} per 10 clips, rounded up.",
    )
    # 3: an iteration of 1,024 valid transitions under `off` is 0.2 s, where one scheduler hiccup moved a
    # repeat by 30%; the model plays the same iterations (docs/advisor.md).
    iterations: int = Field(
        3, ge=1, le=20, description="Measured iterations of a prediction and of each validation run, after the warm-up."
    )
    warmup_steps: int = Field(
        50, ge=0, description="Steps per clip before a validation run's measured iteration (a warm-up iteration)."
    )
    # 8: one seed's figure is one draw of the horizon, as noisy as one measurement (sgr at 10 clips moved
    # by 38% between seeds); the mean of 8 is the horizon's expected figure (docs/advisor.md).
    model_seeds: int = Field(
        8, ge=1, le=64, description="Seeds the model plays each prediction on (pooled: the expected figure)."
    )
    validate_top: int = Field(2, ge=0, le=6, description="The best predicted modes run briefly to check; 0 skips.")
    t_max: int = same_as(BrokerConfig, "t_max")
    seed: int = Field(0, ge=0, description="Seed of the probes, the model and the validation runs.")

    def samples_for(self, clips: int) -> int:
        """The iteration's valid transitions at `clips` clips: `samples`, or SAMPLES_PER_10_CLIPS per 10."""
        return self.samples or SAMPLES_PER_10_CLIPS * math.ceil(clips / 10)

    @field_validator("simulators", mode="before")
    @classmethod
    def _addresses(cls, value):
        return list(parse_simulators(value))

    @model_validator(mode="after")
    def _simulator_settings(self) -> AdviseConfig:
        given = [SIMULATOR_SETTINGS[name] for name in SIMULATOR_SETTINGS if name in self.model_fields_set]
        if self.simulators and given:
            raise ValueError(inapplicable(given))
        return self

    @model_validator(mode="after")
    def _checkpoint_exists(self) -> AdviseConfig:
        if self.checkpoint is not None and not self.checkpoint.is_dir():
            raise ValueError(
                f"checkpoint {str(self.checkpoint)[:80]} is not a directory; give a fast train run's checkpoints/"
            )
        return self
