"""Settings of `fast broker`: flags, FAST_BROKER_* environment variables or a YAML file."""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from broker.dealer import HOLDOUT_EVERY
from broker.samplers import ModeName
from broker.samplers.fast import Truncation
from fast.tls import TlsSettings

ENV_PREFIX = "FAST_BROKER_"


class BrokerConfig(TlsSettings):
    # tls_cert, tls_key, tls_ca, tls_server_name (fast/tls.py): the broker serves its control API with
    # them and dials the simulators and the learner with them (its certificate is its client certificate).
    # Where the simulators and the learner are.
    simulators: list[str] = Field(default_factory=list)  # host:port, or dns:///name:port for every IP of a name
    learner: str = ""  # host:port of the learner
    host: str = "127.0.0.1"  # the broker's own control API
    port: int = Field(0, ge=0, le=65535)
    # Sampling.
    mode: ModeName = "fast"  # broker/samplers/
    alpha: float = Field(0.5, gt=0.0, le=1.0)  # DPSA: truncate when the termination rate reaches alpha
    t_max: int = Field(200, ge=1)  # DPSA: ... or when the round reaches t_max steps
    # DPSA: at the round's end, live episodes carry on into the next round (only done slots are
    # reset), or every slot is reset ("reset", the literal reading); broker/samplers/fast.py.
    truncation: Truncation = "carry"
    samples_per_iteration: int = Field(2048, ge=1)  # valid transitions per iteration (at least)
    iterations: int = Field(0, ge=0)  # 0: until stopped
    seed: int = 0
    holdout_every: int = Field(HOLDOUT_EVERY, ge=0)  # clip c is held out when c % holdout_every == holdout_every-1
    # Map locality in dealing clips (broker/dealer.py): a server gets clips of the maps it has cached,
    # at most locality_max_repeat of one map while it stays cached. Needs Describe's clip_map_ids.
    locality: bool = False
    locality_max_repeat: int = Field(8, ge=1)
    # Prefetch (fast.v1 Prepare): deal each slot's next clip ahead and have servers that serve
    # Prepare load it while the slots step; the Reset then pays only what is left.
    prefetch: bool = False
    # sgr, fast: a server that has answered steps its next row while the others still step (the row
    # is speculative until judged; broker/samplers/rounds.py); the batch is the same either way. Off
    # by default: it pays when simulators run elsewhere and step slowly, not on a few shared cores.
    pipeline: bool = False
    # Step a simulator on this machine over the Unix socket its Describe names (sim_server/local_step.py)
    # instead of gRPC: the same messages at a fraction of the per-call cost. Others are stepped over gRPC.
    local_step: bool = True
    # Deadlines and retries: no wait is unbounded.
    step_timeout_s: float = Field(5.0, gt=0.0)
    reset_timeout_s: float = Field(30.0, gt=0.0)
    describe_timeout_s: float = Field(5.0, gt=0.0)
    stall_timeout_s: float = Field(60.0, gt=0.0)  # sampling gives up when no valid step happens this long
    # A simulator that answers against the contract this many times with no good Step answer
    # between is dropped for the rest of the run (broker/pool.py).
    max_bad_answers: int = Field(5, ge=1)
    startup_timeout_s: float = Field(60.0, gt=0.0)  # waiting for simulators and learner at start
    learner_wait_s: float = Field(120.0, gt=0.0)  # waiting for an unavailable learner before failing the run
    update_timeout_s: float = Field(600.0, gt=0.0)
    # Outputs.
    run_dir: str = ""  # metrics.jsonl goes here when set

    @field_validator("simulators", mode="before")
    @classmethod
    def _split(cls, value):
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @model_validator(mode="after")
    def _needs(self) -> "BrokerConfig":
        if not self.simulators:
            raise ValueError("simulators is empty; give --simulators HOST:PORT[,HOST:PORT...] or dns:///NAME:PORT")
        if not self.learner:
            raise ValueError("learner is empty; give --learner HOST:PORT")
        return self
