"""Settings of `fast broker`: flags, FAST_BROKER_* environment variables or a YAML file."""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, field_validator, model_validator

from broker.advisor.auto_mode import DEFAULT_CANDIDATES, MARGIN, PROBE_EVERY, check_candidates
from broker.dealer import HOLDOUT_EVERY
from broker.samplers import MODE_NAMES, ModeName
from broker.samplers.fast import Truncation
from fast.addresses import Shard
from fast.quoting import quote
from fast.tls import TlsSettings

ENV_PREFIX = "FAST_BROKER_"


def _alpha(value):
    """A number in (0, 1] (or text that reads as one), or "auto"; anything else names the setting."""
    if value == "auto":
        return value
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if not (isinstance(value, (int, float, str)) and not isinstance(value, bool) and 0.0 < number <= 1.0):
        raise ValueError(f"alpha is {quote(value)}: give a number in (0, 1] or auto")
    return number


# alpha: a number in (0, 1], or "auto" (BrokerConfig.alpha); the one check of both, for every model that has it.
Alpha = Annotated[float | Literal["auto"], BeforeValidator(_alpha)]


# mode: a mode's name, or "auto" (BrokerConfig.mode): pydantic refuses any other value and lists these.
ModeSetting = Literal.__getitem__((*MODE_NAMES, "auto"))


def _candidates(value):
    """mode_candidates: a comma-separated text (a flag, an environment variable) or a list."""
    if isinstance(value, str):
        value = [part.strip() for part in value.split(",") if part.strip()]
    return list(check_candidates(value)) if isinstance(value, (list, tuple)) else value


# mode_candidates: known modes, at least one, none twice; the one check, for every model that has it.
ModeCandidates = Annotated[list[ModeName], BeforeValidator(_candidates)]


def check_alpha_bounds(alpha_min: float, alpha_max: float) -> None:
    if alpha_min > alpha_max:
        raise ValueError(f"alpha_min={alpha_min:g} is above alpha_max={alpha_max:g}; give alpha_min <= alpha_max")


class BrokerConfig(TlsSettings):
    # tls_cert, tls_key, tls_ca, tls_server_name (fast/tls.py): the broker serves its control API with
    # them and dials the simulators and the learner with them (its certificate is its client certificate).
    # Where the simulators and the learner are.
    simulators: list[str] = Field(
        default_factory=list,
        description="Simulator servers: HOST:PORT[,HOST:PORT...], or dns:///NAME:PORT for every IP of a name.",
    )
    # One broker of several (a broker per learner rank; docs/scaling.md): its share of each dns:/// name's
    # replicas, by a rule on each replica's address alone (fast/addresses.py, Shard). HOST:PORT entries
    # are this broker's own and are never sharded.
    shard: str = Field(
        "all",
        description="This broker's share of each dns:/// name's replicas: I/N keeps those whose IP % N == I "
        "(broker I of N), or all.",
    )
    learner: str = Field("", description="Learner HOST:PORT.")
    host: str = Field("127.0.0.1", description="Address of the control API.")
    port: int = Field(0, ge=0, le=65535, description="Port of the control API; 0 picks a free one and prints it.")
    # Sampling.
    # A mode, or "auto": the run switches between mode_candidates at iteration boundaries by the effective
    # throughput it measures in each (broker/advisor/auto_mode.py, docs/advisor.md).
    mode: ModeSetting = Field(
        "fast",
        description="Sampling mode (broker/samplers/), or auto: switch between mode_candidates at iteration "
        "boundaries by their measured throughput:",
    )
    mode_candidates: ModeCandidates = Field(
        default_factory=lambda: list(DEFAULT_CANDIDATES),
        description="mode auto: the modes it may use, the first one first (list the advisor's pick first).",
    )
    mode_probe_every: int = Field(
        PROBE_EVERY,
        ge=1,
        le=10_000,
        description="mode auto: iterations in the mode in force between probes of the others (doubles, up to "
        "8x, after a probe that did not switch).",
    )
    mode_margin: float = Field(
        MARGIN,
        ge=0.0,
        le=10.0,
        description="mode auto: switch when another candidate's measured throughput is higher by more than this "
        "share (0.1: 10%).",
    )
    # A number, or "auto": the run chooses alpha at each iteration boundary within [alpha_min, alpha_max]
    # from its own measured costs and episode lengths (broker/advisor/auto_alpha.py, docs/advisor.md).
    alpha: Alpha = Field(
        0.5,
        description="DPSA: a round ends when this share of its clips has terminated (or at t_max steps); "
        "auto: chosen each iteration within alpha_min..alpha_max from the run's own costs and episode lengths.",
    )
    alpha_min: float = Field(0.1, gt=0.0, le=1.0, description="alpha auto: the lowest alpha it may choose.")
    alpha_max: float = Field(1.0, gt=0.0, le=1.0, description="alpha auto: the highest alpha it may choose.")
    t_max: int = Field(
        200, ge=1, description="DPSA: a round ends at this many steps (or when alpha of its clips terminated)."
    )
    # DPSA: at the round's end, live episodes carry on into the next round (only done slots are
    # reset), or every slot is reset ("reset", the literal reading); broker/samplers/fast.py.
    truncation: Truncation = Field(
        "carry", description="DPSA at a round's end: carry live episodes on into the next round, or reset them:"
    )
    samples_per_iteration: int = Field(2048, ge=1, description="Valid transitions per iteration (at least).")
    iterations: int = Field(0, ge=0, description="Iterations; 0 runs until stopped.")
    # A broker restarted with its group of learner ranks (`fast train`'s max_restarts) carries on the run's
    # count: its learner resumed from the checkpoint of that version, so the iterations before it are done.
    # A broker that starts with a metrics.jsonl in run_dir counts on from its lines by itself (broker/run.py,
    # _resume: a platform's restart); first_iteration, when higher, wins.
    first_iteration: int = Field(
        0,
        ge=0,
        description="Iterations done before this broker started (a restarted group's: the checkpoint's policy "
        "version); it numbers its iterations from there, and `iterations` counts them all.",
    )
    seed: int = Field(0, description="Seed of clip dealing and action sampling.")
    holdout_every: int = Field(
        HOLDOUT_EVERY,
        ge=0,
        description="Clip c is held out of training when c % N == N-1 (broker/dealer.py); 0 holds none out.",
    )
    # Map locality in dealing clips (broker/dealer.py): a server gets clips of the maps it has cached,
    # at most locality_max_repeat of one map while it stays cached. Needs Describe's clip_map_ids.
    locality: bool = Field(
        False,
        description="Deal clips with map locality: a server gets clips of the maps it has cached (broker/dealer.py).",
    )
    locality_max_repeat: int = Field(
        8, ge=1, description="Locality's diversity knob: clips of one map a server gets in a row while it stays cached."
    )
    # Prefetch (fast.v1 Prepare): deal each slot's next clip ahead and have servers that serve
    # Prepare load it while the slots step; the Reset then pays only what is left.
    prefetch: bool = Field(
        False,
        description="Load each slot's next clip while it steps (fast.v1 Prepare); servers without it reset as always.",
    )
    # sgr, fast: a server that has answered steps its next row while the others still step (the row
    # is speculative until judged; broker/samplers/rounds.py); the batch is the same either way. Off
    # by default: it pays when simulators run elsewhere and step slowly, not on a few shared cores.
    pipeline: bool = Field(
        False,
        description="sgr, fast: a server that has answered steps its next row while the others still step "
        "(broker/samplers/rounds.py); the same batches.",
    )
    # Step a simulator on this machine over the Unix socket its Describe names (sim_server/local_step.py)
    # instead of gRPC: the same messages at a fraction of the per-call cost. Others are stepped over gRPC.
    local_step: bool = Field(
        True, description="Step simulators on this machine over their local step sockets rather than gRPC."
    )
    # Deadlines and retries: no wait is unbounded.
    step_timeout_s: float = Field(5.0, gt=0.0, description="Deadline of a Step call, in seconds.")
    reset_timeout_s: float = Field(30.0, gt=0.0, description="Deadline of a Reset call, in seconds.")
    describe_timeout_s: float = Field(5.0, gt=0.0, description="Deadline of a Describe call, in seconds.")
    stall_timeout_s: float = Field(
        60.0, gt=0.0, description="Sampling gives up when no valid step happens for this long, in seconds."
    )
    # A simulator that answers against the contract this many times with no good Step answer
    # between is dropped for the rest of the run (broker/pool.py).
    max_bad_answers: int = Field(
        5, ge=1, description="A simulator that answers against the contract this many times in a row is dropped."
    )
    startup_timeout_s: float = Field(
        60.0, gt=0.0, description="How long to wait for the simulators and the learner at start, in seconds."
    )
    learner_wait_s: float = Field(
        120.0, gt=0.0, description="How long to wait for an unavailable learner before failing the run, in seconds."
    )
    update_timeout_s: float = Field(600.0, gt=0.0, description="Deadline of a learner update, in seconds.")
    # Outputs.
    run_dir: str = Field("", description="Directory for metrics.jsonl; unset: none written.")

    @field_validator("simulators", mode="before")
    @classmethod
    def _split(cls, value):
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("shard", mode="before")
    @classmethod
    def _shard(cls, value):
        return str(Shard.parse(value)) if isinstance(value, str) else value

    @property
    def shard_rule(self) -> Shard:
        return Shard.parse(self.shard)

    @model_validator(mode="after")
    def _needs(self) -> "BrokerConfig":
        if not self.simulators:
            raise ValueError("simulators is empty; give --simulators HOST:PORT[,HOST:PORT...] or dns:///NAME:PORT")
        if not self.learner:
            raise ValueError("learner is empty; give --learner HOST:PORT")
        check_alpha_bounds(self.alpha_min, self.alpha_max)
        return self
