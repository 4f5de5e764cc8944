"""The REST API's bodies: what each route accepts (validated, bounded) and answers (its OpenAPI schema).

Answers mirror the fast.v1 messages field for field (gateway/convert.py), so docs/metrics.md
defines the metrics here too. Floats a service may leave undefined (NaN) are null.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

RunStateWord = Literal["unspecified", "starting", "running", "pausing", "paused", "done", "failed"]

# The bounds of the live settings; the broker and the learner check the same ones again.
ALPHA_RANGE = "(0, 1]"
T_MAX_LIMIT = 100_000
SAMPLES_LIMIT = 10_000_000


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


class SettingChange(_Answer):
    name: str
    old_value: float | None
    new_value: float | None


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


class Status(_Answer):
    """The run as the broker and the learner see it now."""

    state: RunStateWord
    mode: str
    iteration: int
    iterations_total: int = Field(description="0: until stopped")
    policy_version: int = Field(description="The version the broker samples with")
    policy_version_lag: int = Field(description="The learner's version minus the broker's")
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
    error: str
    learner: LearnerStatus


class Problem(_Answer):
    field: str
    message: str


class ErrorBody(_Answer):
    """Every error answer: `detail` says what went wrong and what to do; `upstream` names the service
    that failed (broker or learner) and `grpc_status` its status; `problems` lists a body's bad fields."""

    detail: str
    upstream: str | None = None
    grpc_status: str | None = None
    problems: list[Problem] | None = None


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
        503: "The broker or the learner is unavailable (named)",
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
    state: RunStateWord = Field(description="The state once the action is taken into account")
    note: str


# -- what callers send ----------------------------------------------------------------------------


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ConfigPatch(_Body):
    """Live changes; an absent field keeps its value. Broker settings apply from the next iteration,
    the learner's from its next update."""

    alpha: float | None = Field(None, gt=0.0, le=1.0, allow_inf_nan=False, description=f"in {ALPHA_RANGE}")
    t_max: int | None = Field(None, ge=1, le=T_MAX_LIMIT, description=f"1 to {T_MAX_LIMIT}")
    samples_per_iteration: int | None = Field(None, ge=1, le=SAMPLES_LIMIT, description=f"1 to {SAMPLES_LIMIT}")
    learning_rate: float | None = Field(None, gt=0.0, le=1.0, allow_inf_nan=False, description="in (0, 1]")
    ent_coef: float | None = Field(None, ge=0.0, le=1.0, allow_inf_nan=False, description="in [0, 1]")

    @model_validator(mode="after")
    def _something(self) -> "ConfigPatch":
        if not self.model_fields_set or all(getattr(self, name) is None for name in self.model_fields_set):
            raise ValueError(
                "nothing to change; give at least one of alpha, t_max, samples_per_iteration, learning_rate, ent_coef"
            )
        return self

    def broker_part(self) -> dict[str, float | int]:
        return {k: v for k in ("alpha", "t_max", "samples_per_iteration") if (v := getattr(self, k)) is not None}

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
    broker: BrokerSettingsAnswer | None = Field(description="Set when a broker setting was changed")
    learner: LearnerSettingsAnswer | None = Field(description="Set when a learner setting was changed")


class AttachSimulator(_Body):
    address: str = Field(
        min_length=3,
        max_length=260,
        pattern=r"^[A-Za-z0-9._:\[\]/-]+$",
        description="HOST:PORT of a simulator server (or dns:///NAME:PORT)",
    )


class AttachedSimulator(_Answer):
    address: str
    num_slots: int
    env_id: str
    note: str


class DetachedSimulator(_Answer):
    address: str
    num_slots: int
    note: str


class Checkpoint(_Answer):
    path: str
    policy_version: int
    size_bytes: int
    modified_unix: float | None


class SavedCheckpoint(_Answer):
    path: str
    policy_version: int
