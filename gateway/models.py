"""The REST API's bodies: what each route accepts (validated, bounded) and answers (its OpenAPI schema).

Answers mirror the fast.v1 messages field for field (gateway/convert.py), so docs/metrics.md
defines the metrics here too. Floats a service may leave undefined (NaN) are null.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gateway.settings import MAX_UPSTREAMS

RunStateWord = Literal["unspecified", "starting", "running", "pausing", "paused", "done", "failed"]

# The bounds of the live settings; the broker and the learner check the same ones again.
ALPHA_RANGE = "(0, 1]"
T_MAX_LIMIT = 100_000
SAMPLES_LIMIT = 10_000_000
# The sampling modes (broker/samplers/ MODE_NAMES, in its order) and auto; tests/test_auto_mode.py checks them.
ModeSetting = Literal["sc", "autoreset", "sgr", "ver", "fast", "auto"]


class _Answer(BaseModel):
    model_config = ConfigDict(extra="ignore")


class TimeSplit(_Answer):
    stepping: float | None
    resetting: float | None
    inference: float | None
    transport: float | None
    waiting: float | None


class EpisodeEnds(_Answer):
    terminated: int
    clip_end: int
    cut: int
    fault: int


class UpdateStats(_Answer):
    policy_loss: float | None
    value_loss: float | None
    entropy: float | None
    approx_kl: float | None
    clip_fraction: float | None
    explained_variance: float | None
    grad_norm: float | None
    update_time_s: float | None
    num_valid: int
    num_total: int
    learning_rate: float | None
    ent_coef: float | None


class RunSettings(_Answer):
    alpha: float | None = Field(description="DPSA: truncate when the termination rate reaches alpha")
    t_max: int = Field(description="Truncate the round at t_max steps")
    samples_per_iteration: int = Field(description="Valid transitions per iteration (at least)")
    alpha_auto: bool = Field(False, description="alpha is chosen at each iteration (mode fast; docs/advisor.md)")
    mode: str = Field("", description="The sampling mode in force (an iteration's: the one it sampled with)")
    mode_auto: bool = Field(False, description="The mode is chosen at each iteration (docs/advisor.md)")


class SettingChange(_Answer):
    name: str
    old_value: float | str | None = Field(description="A number, or a word (mode)")
    new_value: float | str | None = Field(description="A number, or a word (mode)")

    @model_validator(mode="before")
    @classmethod
    def _words(cls, data):
        """fast.v1 SettingChange carries a word-valued setting's values in old_text and new_text."""
        if isinstance(data, dict) and (data.get("old_text") or data.get("new_text")):
            return {**data, "old_value": data.get("old_text"), "new_value": data.get("new_text")}
        return data


class IterationMetrics(_Answer):
    """One iteration, as docs/metrics.md defines each field (metrics.jsonl holds the same)."""

    iteration: int
    policy_version: int
    time: float | None
    iteration_time_s: float | None
    mode: str
    num_slots: int
    sampling_time_s: float | None
    transitions: int
    valid_transitions: int
    raw_throughput: float | None
    validity: float | None
    effective_throughput: float | None
    time_efficiency: float | None
    time_split_s: TimeSplit | None
    episodes: int
    episode_ends: EpisodeEnds | None
    episode_length_mean: float | None
    episode_lengths: list[int]
    episode_return_mean: float | None
    episode_returns: list[float | None]
    global_resets: int
    global_resets_per_1k_valid: float | None
    slot_resets_per_1k_valid: float | None
    reset_calls: int
    faults: int
    steps_ahead: int = 0
    steps_discarded: int = 0
    closed_loop: dict[str, float | None]
    learner: UpdateStats | None
    settings: RunSettings | None
    settings_changed: list[SettingChange]


class Simulator(_Answer):
    address: str
    env_id: str
    up: bool
    draining: bool
    num_slots: int
    faults: int
    readmissions: int
    last_error: str
    step_latency_s: float | None
    reset_latency_s: float | None
    # How the broker calls it (SimulatorStatus): over StepStream; several slots per Reset call.
    # Defaults for a broker too old to say.
    step_stream: bool = False
    batched_reset: bool = False
    step_transport: str = ""  # "local socket", "grpc stream" or "grpc unary"; "" from a broker too old to say
    broker: str | None = Field(None, description="The broker that steps it (in GET /v1/simulators)")


class Hyperparameters(_Answer):
    learning_rate: float | None
    ent_coef: float | None


class LearnerStatus(_Answer):
    initialized: bool
    policy_version: int
    device: str
    updates_this_process: int
    last_checkpoint: str
    stale_batches_refused: int
    hyperparameters: Hyperparameters | None
    last_stats: UpdateStats | None


class BrokerRun(_Answer):
    """One broker's run as it sees it (GetRunStatus)."""

    state: RunStateWord
    mode: str
    iteration: int
    iterations_total: int = Field(description="0: until stopped")
    policy_version: int = Field(description="The version this broker samples with")
    num_slots: int
    valid_steps_total: int
    transitions_total: int
    global_resets_total: int
    faults_total: int
    stale_batches: int
    settings: RunSettings | None
    pending_settings: RunSettings | None = Field(description="Accepted, in force from the next iteration")
    simulators: list[Simulator]
    last_metrics: IterationMetrics | None
    error: str = Field(description="The broker's own account of a failed run")


class BrokerEntry(_Answer):
    """One broker of the run: its status, or why the gateway could not read it."""

    name: str = Field(description='"broker" (broker 0), "broker-1", ...: as fast train names the processes')
    address: str
    up: bool = Field(description="The gateway read its status")
    unavailable: str | None = Field(None, description="Why it could not be read (null when up)")
    grpc_status: str | None = Field(None, description="The failed call's gRPC status (null when up)")
    run: BrokerRun | None = Field(None, description="Its status (null when down)")


class RankEntry(_Answer):
    """One learner rank: its status, or why the gateway could not read it."""

    name: str = Field(description='"learner" (rank 0), "learner-1", ...')
    rank: int
    address: str
    up: bool
    unavailable: str | None = None
    grpc_status: str | None = None
    status: LearnerStatus | None = None


class Totals(_Answer):
    """Over every broker and rank that answered: sums, and whether what must agree does."""

    brokers: int = Field(description="Brokers the gateway is given")
    brokers_answered: int
    ranks: int = Field(description="Learner ranks the gateway is given")
    ranks_answered: int
    num_slots: int
    valid_steps_total: int
    transitions_total: int
    global_resets_total: int
    faults_total: int
    stale_batches: int
    raw_throughput: float | None = Field(description="Sum of the brokers' last iterations; null before any")
    effective_throughput: float | None = Field(description="Sum of the brokers' last iterations; null before any")
    last_iteration_transitions: int = Field(description="Sum of the brokers' last iterations")
    last_iteration_valid_transitions: int = Field(description="Sum of the brokers' last iterations")
    state: RunStateWord | None = Field(description="The brokers' common state; null when they differ")
    states_differ: bool
    policy_version: int | None = Field(description="The version every broker samples with; null when they differ")
    policy_versions_differ: bool = Field(
        description="The brokers sample with different versions (for a moment around an update, or a fault)"
    )
    learner_policy_version: int | None = Field(description="Every rank's version; null when they differ")
    learner_policy_versions_differ: bool = Field(description="The ranks hold different versions: a fault")


class Status(BrokerRun):
    """The run as the broker and the learner see it now. The top-level fields are broker 0's and `learner`
    learner rank 0's (the first that answered when they are down); `brokers`, `ranks` and `totals` show
    every broker and rank of a run of several."""

    policy_version_lag: int = Field(description="The learner's version minus the broker's")
    learner: LearnerStatus
    brokers: list[BrokerEntry] = Field(default_factory=list, description="Every broker, broker 0 first")
    ranks: list[RankEntry] = Field(default_factory=list, description="Every learner rank, rank 0 first")
    totals: Totals | None = None


class Problem(_Answer):
    field: str
    message: str


class BrokerOutcome(_Answer):
    """What one broker made of a call sent to every broker."""

    name: str = Field(description='"broker", "broker-1", ...')
    address: str
    applied: bool = Field(description="It took the change")
    state: RunStateWord | None = Field(None, description="Its state once a run control is taken into account")
    effective_iteration: int | None = Field(None, description="The iteration a settings change applies from")
    error: str | None = Field(None, description="Why it did not take it (null when it did, or was not asked)")
    grpc_status: str | None = None


class ErrorBody(_Answer):
    """Every error answer: `detail` says what went wrong and what to do; `upstream` names the service
    that failed (broker, broker-1, learner, ...) and `grpc_status` its status; `problems` lists a body's
    bad fields; `brokers`, for a call sent to every broker, says which of them applied it."""

    detail: str
    upstream: str | None = None
    grpc_status: str | None = None
    problems: list[Problem] | None = None
    brokers: list[BrokerOutcome] | None = None


ERROR_RESPONSES: dict[int | str, dict] = {
    code: {"model": ErrorBody, "description": text}
    for code, text in {
        400: "A body that is not JSON",
        404: "Not found (a simulator that is not attached)",
        409: "Refused in the run's state (e.g. the run is over), or spaces that differ",
        413: "Request body too large",
        422: "Bad input: the message names the field and its allowed range",
        429: "An upstream is out of resources",
        501: "The upstream does not implement the call",
        502: "An upstream answered unexpectedly, or refused the gateway's token",
        503: "A broker or a learner rank is unavailable (named; `brokers` says which brokers applied a change)",
        504: "The broker or the learner did not answer within the deadline",
    }.items()
}
AUTH_RESPONSES: dict[int | str, dict] = {
    401: {"model": ErrorBody, "description": "No bearer token"},
    403: {"model": ErrorBody, "description": "Not the run's token"},
}


class Health(_Answer):
    status: Literal["ok"]


class Readiness(_Answer):
    ready: bool
    upstreams: dict[str, str] = Field(description="Each upstream's gRPC health, or why it could not be asked")


class RunControlAnswer(_Answer):
    state: RunStateWord = Field(description="Broker 0's state once the action is taken into account")
    note: str
    brokers: list[BrokerOutcome] = Field(default_factory=list, description="Every broker's answer")


# -- what callers send ----------------------------------------------------------------------------


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ConfigPatch(_Body):
    """Live changes; an absent field keeps its value. Broker settings apply from the next iteration,
    the learner's from its next update."""

    alpha: Annotated[float, Field(gt=0.0, le=1.0, allow_inf_nan=False)] | Literal["auto"] | None = Field(
        None, description=f"in {ALPHA_RANGE}, or auto: chosen at each iteration (mode fast; a number turns auto off)"
    )
    mode: ModeSetting | None = Field(
        None, description="a sampling mode (fixes it from the next iteration), or auto: chosen at each iteration"
    )
    t_max: int | None = Field(None, ge=1, le=T_MAX_LIMIT, description=f"1 to {T_MAX_LIMIT}")
    samples_per_iteration: int | None = Field(None, ge=1, le=SAMPLES_LIMIT, description=f"1 to {SAMPLES_LIMIT}")
    learning_rate: float | None = Field(None, gt=0.0, le=1.0, allow_inf_nan=False, description="in (0, 1]")
    ent_coef: float | None = Field(None, ge=0.0, le=1.0, allow_inf_nan=False, description="in [0, 1]")

    @model_validator(mode="after")
    def _something(self) -> "ConfigPatch":
        if not self.model_fields_set or all(getattr(self, name) is None for name in self.model_fields_set):
            raise ValueError(
                "nothing to change; give at least one of alpha, t_max, samples_per_iteration, mode, learning_rate, "
                "ent_coef"
            )
        return self

    def broker_part(self) -> dict[str, float | int | bool | str]:
        names = ("alpha", "t_max", "samples_per_iteration", "mode")  # mode: a name or auto, as UpdateSettings takes it
        part = {k: v for k in names if (v := getattr(self, k)) is not None}
        if part.get("alpha") == "auto":  # UpdateSettings' alpha_auto
            del part["alpha"]
            part["alpha_auto"] = True
        return part

    def learner_part(self) -> dict[str, float]:
        return {k: v for k in ("learning_rate", "ent_coef") if (v := getattr(self, k)) is not None}


class BrokerSettingsAnswer(_Answer):
    settings: RunSettings | None
    effective_iteration: int


class LearnerSettingsAnswer(_Answer):
    hyperparameters: Hyperparameters | None
    effective_from_version: int


class ConfigView(_Answer):
    settings: RunSettings | None
    pending_settings: RunSettings | None
    hyperparameters: Hyperparameters | None


class ConfigPatchAnswer(_Answer):
    broker: BrokerSettingsAnswer | None = Field(description="Set when a broker setting was changed (broker 0's)")
    learner: LearnerSettingsAnswer | None = Field(description="Set when a learner setting was changed")
    brokers: list[BrokerOutcome] = Field(default_factory=list, description="Every broker's answer to its part")


class AttachSimulator(_Body):
    address: str = Field(
        min_length=3,
        max_length=260,
        pattern=r"^[A-Za-z0-9._:\[\]/-]+$",
        description="HOST:PORT of a simulator server (or dns:///NAME:PORT)",
    )
    broker: int | None = Field(
        None,
        ge=0,
        lt=MAX_UPSTREAMS,
        description="Index of the broker that is to step it (0: broker 0); unset: the broker with the fewest slots",
    )


class AttachedSimulator(_Answer):
    address: str
    num_slots: int
    env_id: str
    note: str
    broker: str = Field("broker", description="The broker that steps it")


class DetachedSimulator(_Answer):
    address: str
    num_slots: int
    note: str
    broker: str = Field("broker", description="The broker that stepped it")


class Checkpoint(_Answer):
    path: str
    policy_version: int
    size_bytes: int
    modified_unix: float | None


class SavedCheckpoint(_Answer):
    path: str
    policy_version: int
