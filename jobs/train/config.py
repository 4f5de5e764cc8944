"""Settings of `fast train`: flags, FAST_TRAIN_* environment variables or a YAML file (--config).

Every default of the local training job lives here, in one place, so tuning a run means
changing one table. The learner's PPO knobs carry the learner's names (learner/config.py) and
are passed to it unchanged; the sampling knobs are the broker's (broker/config.py).
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from pydantic import BaseModel, Field, field_validator, model_validator

from broker.samplers import ModeName
from broker.samplers.fast import Truncation
from jobs.external import env_is_an_address, inapplicable, parse_simulators
from sim_server.cost_model import CostPreset
from sim_server.environments import EnvSpec

ENV_PREFIX = "FAST_TRAIN_"
# Settings that shape the simulator servers fast train starts: given with `simulators`, they are refused.
SIMULATOR_SETTINGS = {"env": "--env", "servers": "--servers", "slots": "--slots", "cost_preset": "--cost-preset"}
# A run's name becomes a directory under runs_dir: one path component, no surprises in a shell.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class TrainConfig(BaseModel):
    # The run and where it is written: runs_dir/name/.
    name: str = ""  # "" -> "<mode>-<YYYYmmdd-HHMMSS>"
    runs_dir: Path = Path("runs")

    # Sampling (the broker's settings).
    mode: ModeName = "fast"  # broker/samplers/
    alpha: float = Field(0.5, gt=0.0, le=1.0)  # DPSA: truncate the round when this share of clips ended
    truncation: Truncation = "carry"  # DPSA: live episodes carry on past a round's end, or are reset
    t_max: int = Field(200, ge=1)  # DPSA: ... or when the round is t_max steps long
    samples_per_iteration: int = Field(2048, ge=1)  # valid transitions per iteration (at least)
    # Deal clips with map locality (broker/dealer.py): off until `fast bench train` shows what it does to learning.
    locality: bool = False
    locality_max_repeat: int = Field(8, ge=1)  # clips of one map a server gets in a row while it stays cached
    # Load each slot's next clip while it steps (fast.v1 Prepare; servers without it reset as always).
    prefetch: bool = False
    # Rounds (sgr, fast): a server that answered steps its next row while the others still step; the
    # same batches. Off by default (benchmarks/results/broker-overhead/: no gain on 2 shared cores).
    pipeline: bool = False
    # The broker steps the servers it started over their local step sockets (sim_server/local_step.py)
    # rather than gRPC: the same messages, a fraction of the per-call cost. Remote servers use gRPC.
    local_step: bool = True
    # About 7 minutes on a 2-core CPU with the defaults below (README: the default run).
    iterations: int = Field(350, ge=1)
    seed: int = Field(0, ge=0)  # clip dealing, action sampling, initial weights, evaluation seeds

    # Simulators: `servers` processes of `slots` slots each, all with the same workload; or, with
    # `simulators`, servers started elsewhere (the four settings below then do not apply).
    simulators: list[str] = Field(default_factory=list)  # HOST:PORT[,HOST:PORT...] or dns:///NAME:PORT
    env: EnvSpec = "takeover"  # "takeover" or "gym:<Gymnasium id>"
    servers: int = Field(2, ge=1, le=64)
    slots: int = Field(5, ge=1, le=4096)  # per server
    cost_preset: CostPreset = "off"  # off | calibrated | parallel | step-only | vectorized (docs/cost_model.md)

    # Learner (PPO), same names and meaning as learner/config.py.
    lr: float = Field(3e-4, gt=0.0, allow_inf_nan=False)
    update_epochs: int = Field(10, ge=1)
    num_minibatches: int = Field(8, ge=1)
    ent_coef: float = Field(0.0, ge=0.0, allow_inf_nan=False)
    gamma: float = Field(0.99, ge=0.0, le=1.0)
    # The learning levers of docs/learning.md (benchmarks/results/learning-ablation/). The initial
    # log-std is -0.5: with 0, a run of 150 iterations ended below its initial policy in 3 of 6 seeds,
    # with -0.5 in none. The others are off: none made the default run learn more reliably.
    norm_reward: bool = False  # divide rewards by the running std of the discounted return
    init_log_std: float = Field(-0.5, ge=-5.0, le=2.0)  # the Gaussian policy's initial log-std
    anneal_lr: bool = False  # the learning rate falls linearly over `iterations` updates
    obs_norm: bool = False  # running observation statistics, shipped inside the policy's weights
    checkpoint_every: int = Field(10, ge=1)  # the learner checkpoints every K policy versions
    keep_checkpoints: int = Field(3, ge=1)  # ... and keeps the newest N (`fast bench train` keeps all)

    # The REST gateway (docs/gateway.md) on loopback: dashboard, status and control of the run.
    gateway: bool = True
    gateway_port: int = Field(0, ge=0, le=65535)  # 0 picks a free port; the URL is printed

    # Evaluation at the end, on the held-out clips; 0 skips it.
    eval_episodes_per_clip: int = Field(3, ge=0)

    # Bounded waits of the orchestration itself.
    startup_timeout_s: float = Field(120.0, gt=0.0)  # each service must print its listening line by then
    stop_timeout_s: float = Field(40.0, gt=0.0)  # SIGTERM, then SIGKILL after this long (per process)

    @field_validator("simulators", mode="before")
    @classmethod
    def _addresses(cls, value):
        return list(parse_simulators(value))

    @field_validator("env", mode="before")
    @classmethod
    def _env_is_no_address(cls, value):
        problem = env_is_an_address(value, f"{ENV_PREFIX}SIMULATORS")
        if problem:
            raise ValueError(problem)
        return value

    @field_validator("name")
    @classmethod
    def _safe_name(cls, value: str) -> str:
        if value and not _NAME.match(value):
            raise ValueError(
                "use letters, digits, '.', '_' or '-' (starting with a letter or digit), e.g. fast-alpha05"
            )
        return value

    @model_validator(mode="after")
    def _simulator_settings(self) -> "TrainConfig":
        given = [name for name in SIMULATOR_SETTINGS if name in self.model_fields_set]
        if self.simulators and given:
            raise ValueError(
                inapplicable(
                    f"{SIMULATOR_SETTINGS[name]} ({ENV_PREFIX}{name.upper()}, or {name}: in a --config file)"
                    for name in given
                )
            )
        return self

    @model_validator(mode="after")
    def _default_name(self) -> "TrainConfig":
        if not self.name:
            self.name = f"{self.mode}-{time.strftime('%Y%m%d-%H%M%S')}"
        return self

    @property
    def run_dir(self) -> Path:
        return Path(self.runs_dir) / self.name
