"""Settings of `fast train`: flags, FAST_TRAIN_* environment variables or a YAML file (--config).

Every default of the local training job lives here, in one place, so tuning a run means
changing one table; the flags, their help, the variables and the keys derive from it (fast/settings.py).
The sampling knobs are the broker's (broker/config.py) and the PPO knobs the learner's
(learner/config.py): the same names, taken over whole from those models (`same_as`: type, range,
default and help), and passed to the services they start unchanged (`TrainingRun`'s configs).
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from broker.config import BrokerConfig, ModeSetting, check_alpha_bounds
from broker.samplers import ModeName
from broker.samplers.fast import Truncation
from fast.addresses import is_dns_name
from fast.settings import Settings, same_as
from gateway.settings import GatewaySettings
from jobs.external import env_is_an_address, inapplicable, parse_simulators
from learner.config import LearnerConfig
from sim_server.config import SimServerConfig
from sim_server.cost_model import CostPreset
from sim_server.environments import EnvSpec

ENV_PREFIX = "FAST_TRAIN_"
# Settings that shape the simulator servers fast train starts: given with `simulators`, they are refused.
SIMULATOR_SETTINGS = {"env": "--env", "servers": "--servers", "slots": "--slots", "cost_preset": "--cost-preset"}
# A run's name becomes a directory under runs_dir: one path component, no surprises in a shell.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class TrainConfig(Settings):
    # The run and where it is written: runs_dir/name/.
    name: str = Field(
        "",
        description="Run name, the directory under --runs-dir: letters, digits, '.', '_', '-'; "
        "unset: <mode>-<YYYYmmdd-HHMMSS>.",
    )
    runs_dir: Path = Field(Path("runs"), description="Where runs are written.")

    # Sampling (the broker's settings).
    mode: ModeSetting = same_as(BrokerConfig, "mode")
    mode_candidates: list[ModeName] = same_as(BrokerConfig, "mode_candidates")  # its check (ModeCandidates) too
    mode_probe_every: int = same_as(BrokerConfig, "mode_probe_every")
    mode_margin: float = same_as(BrokerConfig, "mode_margin")
    alpha: float | Literal["auto"] = same_as(BrokerConfig, "alpha")  # its check (broker/config.py Alpha) too
    alpha_min: float = same_as(BrokerConfig, "alpha_min")
    alpha_max: float = same_as(BrokerConfig, "alpha_max")
    truncation: Truncation = same_as(BrokerConfig, "truncation")
    t_max: int = same_as(BrokerConfig, "t_max")
    samples_per_iteration: int = same_as(BrokerConfig, "samples_per_iteration")
    # Map locality: off until `fast bench train` shows what it does to learning.
    locality: bool = same_as(BrokerConfig, "locality")
    locality_max_repeat: int = same_as(BrokerConfig, "locality_max_repeat")
    prefetch: bool = same_as(BrokerConfig, "prefetch")
    # Off by default (benchmarks/results/broker-overhead/: no gain on 2 shared cores).
    pipeline: bool = same_as(BrokerConfig, "pipeline")
    local_step: bool = same_as(BrokerConfig, "local_step")
    # About 7 minutes on a 2-core CPU with the defaults below (README: the default run).
    iterations: int = Field(350, ge=1, description="Training iterations (one PPO update each).")
    seed: int = Field(0, ge=0, description="Seed of clip dealing, action sampling, initial weights and evaluation.")

    # Simulators: `servers` processes of `slots` slots each, all with the same workload; or, with
    # `simulators`, servers started elsewhere (the four settings below then do not apply).
    simulators: list[str] = Field(
        default_factory=list,
        description="Train on simulator servers that run already: HOST:PORT[,HOST:PORT...] or dns:///NAME:PORT "
        "(none started or stopped; the environment's run token; --env/--servers/--slots/--cost-preset then "
        "do not apply).",
    )
    env: EnvSpec = same_as(SimServerConfig, "env")
    servers: int = Field(2, ge=1, le=64, description="Simulator server processes.")
    slots: int = same_as(SimServerConfig, "slots", default=5, description="Slots per simulator server.")
    cost_preset: CostPreset = same_as(SimServerConfig, "cost_preset")

    # Learner (PPO), same names and meaning as learner/config.py.
    lr: float = same_as(LearnerConfig, "lr")
    update_epochs: int = same_as(LearnerConfig, "update_epochs", description="PPO epochs per iteration.")
    num_minibatches: int = same_as(LearnerConfig, "num_minibatches")
    ent_coef: float = same_as(LearnerConfig, "ent_coef")
    gamma: float = same_as(LearnerConfig, "gamma")
    # The learning levers of docs/learning.md (benchmarks/results/learning-ablation/). The initial
    # log-std is -0.5: with 0, a run of 150 iterations ended below its initial policy in 3 of 6 seeds,
    # with -0.5 in none. The others are off: none made the default run learn more reliably.
    norm_reward: bool = same_as(LearnerConfig, "norm_reward")
    init_log_std: float = same_as(LearnerConfig, "init_log_std")
    anneal_lr: bool = Field(False, description="The learning rate falls linearly over `iterations` updates.")
    obs_norm: bool = same_as(LearnerConfig, "obs_norm")
    checkpoint_every: int = same_as(LearnerConfig, "checkpoint_every")
    keep_checkpoints: int = same_as(
        LearnerConfig, "keep_checkpoints", description="Newest checkpoints kept (`fast bench train` keeps all)."
    )

    # Data-parallel ranks on this machine (docs/learner.md, "Ranks"): R learner ranks, each fed by a broker
    # of its own that drives its share of the simulator servers (dealt round-robin).
    ranks: int = Field(
        1,
        ge=1,
        le=64,
        description="Learner ranks, each with a broker of its own driving its share of the servers (dealt "
        "round-robin); every broker samples samples_per_iteration, and an iteration's update is over all of them.",
    )
    # torchrun's --max-restarts for the group (docs/scaling.md, "Restarting"): when a learner rank or a broker
    # dies mid-run, every rank and broker is stopped and started again, resuming from the newest checkpoint.
    # 0 by default, as torchrun's: a death that a restart cannot cure (simulators gone, a bad setting)
    # fails the run at once instead of N times over; a long run asks for restarts.
    max_restarts: int = Field(
        0,
        ge=0,
        le=100,
        description="Restarts of the whole group (every learner rank and broker) after one of them dies mid-run, "
        "each resuming from the newest checkpoint; 0: the run fails instead.",
    )
    # The REST gateway (docs/gateway.md) on loopback: dashboard, status and control of the run.
    gateway: bool = Field(True, description="Start the REST gateway and dashboard on loopback (docs/gateway.md).")
    gateway_port: int = Field(
        0, ge=0, le=65535, description="Port of the REST gateway and dashboard; 0 picks one (the URL is printed)."
    )

    # Evaluation at the end, on the held-out clips; 0 skips it.
    eval_episodes_per_clip: int = Field(3, ge=0, description="Evaluation episodes per held-out clip; 0 skips it.")

    # Bounded waits of the orchestration itself.
    startup_timeout_s: float = Field(
        120.0, gt=0.0, description="Each service must print its listening line by then, in seconds."
    )
    stop_timeout_s: float = Field(
        40.0, gt=0.0, description="SIGTERM, then SIGKILL after this long (per process), in seconds."
    )

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
    def _alpha_bounds(self) -> "TrainConfig":
        check_alpha_bounds(self.alpha_min, self.alpha_max)
        return self

    @model_validator(mode="after")
    def _a_server_per_rank(self) -> "TrainConfig":
        if any(is_dns_name(s) for s in self.simulators):
            return self  # a name's replicas are counted by each broker's shard, which says when it keeps none
        servers = len(self.simulators) if self.simulators else self.servers
        if servers < self.ranks:
            raise ValueError(
                f"ranks is {self.ranks} but the run has {servers} simulator server(s): each rank's broker needs one "
                f"at least; start --servers {self.ranks} or more, or train with fewer --ranks"
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

    # The services of a run, as configs (jobs/train/orchestrate.py starts each with its `to_argv()`):
    # the settings this run decides, on loopback; the others are left to the service's defaults.

    def sim_server_config(self) -> SimServerConfig:
        return SimServerConfig(env=self.env, slots=self.slots, host="127.0.0.1", port=0, cost_preset=self.cost_preset)

    def learner_config(self, run_dir: Path, rank: int = 0, master_port: int = 0) -> LearnerConfig:
        """Rank `rank`'s learner; with ranks > 1 in a group on loopback whose rendezvous is rank 0's
        `master_port` (0 on rank 0: a free one, which it prints), every rank on one checkpoint_dir."""
        group = {}
        if self.ranks > 1:
            group = {"world_size": self.ranks, "rank": rank, "master_addr": "127.0.0.1", "master_port": master_port}
        return LearnerConfig(
            host="127.0.0.1",
            port=0,
            checkpoint_dir=run_dir / "checkpoints",
            seed=self.seed,
            anneal_lr_updates=self.iterations if self.anneal_lr else 0,
            **group,
            **{name: getattr(self, name) for name in _LEARNER_SETTINGS},
        )

    def broker_simulators(self, simulators: list[str], rank: int) -> tuple[list[str], str]:
        """Rank `rank`'s broker's simulators and shard: HOST:PORT entries dealt round-robin (servers r, r + R,
        ...), and every dns:/// name whole with the shard `r/R`, so that each broker keeps its share of the
        name's replicas, again whenever it re-reads them (broker/config.py `shard`, fast/addresses.py)."""
        if self.ranks == 1:
            return list(simulators), "all"
        names = [s for s in simulators if is_dns_name(s)]
        addresses = [s for s in simulators if not is_dns_name(s)]
        return addresses[rank :: self.ranks] + names, (f"{rank}/{self.ranks}" if names else "all")

    def broker_config(
        self,
        simulators: list[str],
        learner: str,
        run_dir: Path,
        holdout_every: int,
        rank: int = 0,
        first_iteration: int = 0,
        shard: str = "all",
    ) -> BrokerConfig:
        """Rank `rank`'s broker: its seed is the run's plus the rank, so that the brokers deal and sample
        apart (rank 0's is the run's seed, as with one rank). `first_iteration`: the iterations done before
        it (a restarted group's, the version its learner resumed)."""
        return BrokerConfig(
            simulators=simulators,
            shard=shard,
            learner=learner,
            host="127.0.0.1",
            port=0,
            iterations=self.iterations,
            **({"first_iteration": first_iteration} if first_iteration else {}),  # the first group's command as before
            seed=self.seed + rank,
            run_dir=str(run_dir),
            holdout_every=holdout_every,
            **{name: getattr(self, name) for name in _BROKER_SETTINGS},
        )

    def gateway_config(self, brokers: list[str], learners: list[str]) -> GatewaySettings:
        """The gateway of every broker and learner rank (broker 0 and rank 0 first)."""
        return GatewaySettings(broker=brokers, learner=learners, host="127.0.0.1", port=self.gateway_port)


# The settings of a run passed to a service under the same name (`same_as` above).
_BROKER_SETTINGS = (
    "mode",
    "mode_candidates",
    "mode_probe_every",
    "mode_margin",
    "alpha",
    "alpha_min",
    "alpha_max",
    "t_max",
    "truncation",
    "samples_per_iteration",
    "locality",
    "locality_max_repeat",
    "prefetch",
    "pipeline",
    "local_step",
)
_LEARNER_SETTINGS = (
    "lr",
    "update_epochs",
    "num_minibatches",
    "checkpoint_every",
    "keep_checkpoints",
    "gamma",
    "ent_coef",
    "norm_reward",
    "init_log_std",
    "obs_norm",
)
