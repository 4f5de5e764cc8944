from fast.v1 import learner_pb2 as _learner_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RunState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RUN_STATE_UNSPECIFIED: _ClassVar[RunState]
    RUN_STATE_STARTING: _ClassVar[RunState]
    RUN_STATE_RUNNING: _ClassVar[RunState]
    RUN_STATE_PAUSED: _ClassVar[RunState]
    RUN_STATE_DONE: _ClassVar[RunState]
    RUN_STATE_FAILED: _ClassVar[RunState]
    RUN_STATE_PAUSING: _ClassVar[RunState]

class ControlAction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CONTROL_ACTION_UNSPECIFIED: _ClassVar[ControlAction]
    CONTROL_ACTION_PAUSE: _ClassVar[ControlAction]
    CONTROL_ACTION_RESUME: _ClassVar[ControlAction]
    CONTROL_ACTION_STOP: _ClassVar[ControlAction]
RUN_STATE_UNSPECIFIED: RunState
RUN_STATE_STARTING: RunState
RUN_STATE_RUNNING: RunState
RUN_STATE_PAUSED: RunState
RUN_STATE_DONE: RunState
RUN_STATE_FAILED: RunState
RUN_STATE_PAUSING: RunState
CONTROL_ACTION_UNSPECIFIED: ControlAction
CONTROL_ACTION_PAUSE: ControlAction
CONTROL_ACTION_RESUME: ControlAction
CONTROL_ACTION_STOP: ControlAction

class SimulatorStatus(_message.Message):
    __slots__ = ("address", "up", "num_slots", "faults", "readmissions", "last_error", "env_id", "step_latency_s", "reset_latency_s", "draining", "step_stream", "batched_reset", "step_transport")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    UP_FIELD_NUMBER: _ClassVar[int]
    NUM_SLOTS_FIELD_NUMBER: _ClassVar[int]
    FAULTS_FIELD_NUMBER: _ClassVar[int]
    READMISSIONS_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    ENV_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_LATENCY_S_FIELD_NUMBER: _ClassVar[int]
    RESET_LATENCY_S_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    STEP_STREAM_FIELD_NUMBER: _ClassVar[int]
    BATCHED_RESET_FIELD_NUMBER: _ClassVar[int]
    STEP_TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    address: str
    up: bool
    num_slots: int
    faults: int
    readmissions: int
    last_error: str
    env_id: str
    step_latency_s: float
    reset_latency_s: float
    draining: bool
    step_stream: bool
    batched_reset: bool
    step_transport: str
    def __init__(self, address: _Optional[str] = ..., up: _Optional[bool] = ..., num_slots: _Optional[int] = ..., faults: _Optional[int] = ..., readmissions: _Optional[int] = ..., last_error: _Optional[str] = ..., env_id: _Optional[str] = ..., step_latency_s: _Optional[float] = ..., reset_latency_s: _Optional[float] = ..., draining: _Optional[bool] = ..., step_stream: _Optional[bool] = ..., batched_reset: _Optional[bool] = ..., step_transport: _Optional[str] = ...) -> None: ...

class RunSettings(_message.Message):
    __slots__ = ("alpha", "t_max", "samples_per_iteration", "alpha_auto", "mode", "mode_auto")
    ALPHA_FIELD_NUMBER: _ClassVar[int]
    T_MAX_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_PER_ITERATION_FIELD_NUMBER: _ClassVar[int]
    ALPHA_AUTO_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    MODE_AUTO_FIELD_NUMBER: _ClassVar[int]
    alpha: float
    t_max: int
    samples_per_iteration: int
    alpha_auto: bool
    mode: str
    mode_auto: bool
    def __init__(self, alpha: _Optional[float] = ..., t_max: _Optional[int] = ..., samples_per_iteration: _Optional[int] = ..., alpha_auto: _Optional[bool] = ..., mode: _Optional[str] = ..., mode_auto: _Optional[bool] = ...) -> None: ...

class TimeSplit(_message.Message):
    __slots__ = ("stepping", "resetting", "inference", "transport", "waiting")
    STEPPING_FIELD_NUMBER: _ClassVar[int]
    RESETTING_FIELD_NUMBER: _ClassVar[int]
    INFERENCE_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    stepping: float
    resetting: float
    inference: float
    transport: float
    waiting: float
    def __init__(self, stepping: _Optional[float] = ..., resetting: _Optional[float] = ..., inference: _Optional[float] = ..., transport: _Optional[float] = ..., waiting: _Optional[float] = ...) -> None: ...

class EpisodeEnds(_message.Message):
    __slots__ = ("terminated", "clip_end", "cut", "fault")
    TERMINATED_FIELD_NUMBER: _ClassVar[int]
    CLIP_END_FIELD_NUMBER: _ClassVar[int]
    CUT_FIELD_NUMBER: _ClassVar[int]
    FAULT_FIELD_NUMBER: _ClassVar[int]
    terminated: int
    clip_end: int
    cut: int
    fault: int
    def __init__(self, terminated: _Optional[int] = ..., clip_end: _Optional[int] = ..., cut: _Optional[int] = ..., fault: _Optional[int] = ...) -> None: ...

class SettingChange(_message.Message):
    __slots__ = ("name", "old_value", "new_value", "old_text", "new_text")
    NAME_FIELD_NUMBER: _ClassVar[int]
    OLD_VALUE_FIELD_NUMBER: _ClassVar[int]
    NEW_VALUE_FIELD_NUMBER: _ClassVar[int]
    OLD_TEXT_FIELD_NUMBER: _ClassVar[int]
    NEW_TEXT_FIELD_NUMBER: _ClassVar[int]
    name: str
    old_value: float
    new_value: float
    old_text: str
    new_text: str
    def __init__(self, name: _Optional[str] = ..., old_value: _Optional[float] = ..., new_value: _Optional[float] = ..., old_text: _Optional[str] = ..., new_text: _Optional[str] = ...) -> None: ...

class IterationMetrics(_message.Message):
    __slots__ = ("iteration", "policy_version", "time", "iteration_time_s", "mode", "num_slots", "sampling_time_s", "transitions", "valid_transitions", "raw_throughput", "validity", "effective_throughput", "time_efficiency", "time_split_s", "episodes", "episode_ends", "episode_length_mean", "episode_lengths", "episode_return_mean", "episode_returns", "global_resets", "global_resets_per_1k_valid", "slot_resets_per_1k_valid", "reset_calls", "faults", "closed_loop", "learner", "settings", "settings_changed", "steps_ahead", "steps_discarded", "pool_calls")
    class ClosedLoopEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    ITERATION_TIME_S_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    NUM_SLOTS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_TIME_S_FIELD_NUMBER: _ClassVar[int]
    TRANSITIONS_FIELD_NUMBER: _ClassVar[int]
    VALID_TRANSITIONS_FIELD_NUMBER: _ClassVar[int]
    RAW_THROUGHPUT_FIELD_NUMBER: _ClassVar[int]
    VALIDITY_FIELD_NUMBER: _ClassVar[int]
    EFFECTIVE_THROUGHPUT_FIELD_NUMBER: _ClassVar[int]
    TIME_EFFICIENCY_FIELD_NUMBER: _ClassVar[int]
    TIME_SPLIT_S_FIELD_NUMBER: _ClassVar[int]
    EPISODES_FIELD_NUMBER: _ClassVar[int]
    EPISODE_ENDS_FIELD_NUMBER: _ClassVar[int]
    EPISODE_LENGTH_MEAN_FIELD_NUMBER: _ClassVar[int]
    EPISODE_LENGTHS_FIELD_NUMBER: _ClassVar[int]
    EPISODE_RETURN_MEAN_FIELD_NUMBER: _ClassVar[int]
    EPISODE_RETURNS_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_RESETS_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_RESETS_PER_1K_VALID_FIELD_NUMBER: _ClassVar[int]
    SLOT_RESETS_PER_1K_VALID_FIELD_NUMBER: _ClassVar[int]
    RESET_CALLS_FIELD_NUMBER: _ClassVar[int]
    FAULTS_FIELD_NUMBER: _ClassVar[int]
    CLOSED_LOOP_FIELD_NUMBER: _ClassVar[int]
    LEARNER_FIELD_NUMBER: _ClassVar[int]
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    SETTINGS_CHANGED_FIELD_NUMBER: _ClassVar[int]
    STEPS_AHEAD_FIELD_NUMBER: _ClassVar[int]
    STEPS_DISCARDED_FIELD_NUMBER: _ClassVar[int]
    POOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    iteration: int
    policy_version: int
    time: float
    iteration_time_s: float
    mode: str
    num_slots: int
    sampling_time_s: float
    transitions: int
    valid_transitions: int
    raw_throughput: float
    validity: float
    effective_throughput: float
    time_efficiency: float
    time_split_s: TimeSplit
    episodes: int
    episode_ends: EpisodeEnds
    episode_length_mean: float
    episode_lengths: _containers.RepeatedScalarFieldContainer[int]
    episode_return_mean: float
    episode_returns: _containers.RepeatedScalarFieldContainer[float]
    global_resets: int
    global_resets_per_1k_valid: float
    slot_resets_per_1k_valid: float
    reset_calls: int
    faults: int
    closed_loop: _containers.ScalarMap[str, float]
    learner: _learner_pb2.UpdateStats
    settings: RunSettings
    settings_changed: _containers.RepeatedCompositeFieldContainer[SettingChange]
    steps_ahead: int
    steps_discarded: int
    pool_calls: PoolCalls
    def __init__(self, iteration: _Optional[int] = ..., policy_version: _Optional[int] = ..., time: _Optional[float] = ..., iteration_time_s: _Optional[float] = ..., mode: _Optional[str] = ..., num_slots: _Optional[int] = ..., sampling_time_s: _Optional[float] = ..., transitions: _Optional[int] = ..., valid_transitions: _Optional[int] = ..., raw_throughput: _Optional[float] = ..., validity: _Optional[float] = ..., effective_throughput: _Optional[float] = ..., time_efficiency: _Optional[float] = ..., time_split_s: _Optional[_Union[TimeSplit, _Mapping]] = ..., episodes: _Optional[int] = ..., episode_ends: _Optional[_Union[EpisodeEnds, _Mapping]] = ..., episode_length_mean: _Optional[float] = ..., episode_lengths: _Optional[_Iterable[int]] = ..., episode_return_mean: _Optional[float] = ..., episode_returns: _Optional[_Iterable[float]] = ..., global_resets: _Optional[int] = ..., global_resets_per_1k_valid: _Optional[float] = ..., slot_resets_per_1k_valid: _Optional[float] = ..., reset_calls: _Optional[int] = ..., faults: _Optional[int] = ..., closed_loop: _Optional[_Mapping[str, float]] = ..., learner: _Optional[_Union[_learner_pb2.UpdateStats, _Mapping]] = ..., settings: _Optional[_Union[RunSettings, _Mapping]] = ..., settings_changed: _Optional[_Iterable[_Union[SettingChange, _Mapping]]] = ..., steps_ahead: _Optional[int] = ..., steps_discarded: _Optional[int] = ..., pool_calls: _Optional[_Union[PoolCalls, _Mapping]] = ...) -> None: ...

class PoolCalls(_message.Message):
    __slots__ = ("step_calls", "step_server_s", "step_compute_s", "reset_calls", "reset_slots", "map_loads", "map_cache_hits", "prepare_calls", "prepared")
    STEP_CALLS_FIELD_NUMBER: _ClassVar[int]
    STEP_SERVER_S_FIELD_NUMBER: _ClassVar[int]
    STEP_COMPUTE_S_FIELD_NUMBER: _ClassVar[int]
    RESET_CALLS_FIELD_NUMBER: _ClassVar[int]
    RESET_SLOTS_FIELD_NUMBER: _ClassVar[int]
    MAP_LOADS_FIELD_NUMBER: _ClassVar[int]
    MAP_CACHE_HITS_FIELD_NUMBER: _ClassVar[int]
    PREPARE_CALLS_FIELD_NUMBER: _ClassVar[int]
    PREPARED_FIELD_NUMBER: _ClassVar[int]
    step_calls: int
    step_server_s: float
    step_compute_s: float
    reset_calls: int
    reset_slots: int
    map_loads: int
    map_cache_hits: int
    prepare_calls: int
    prepared: int
    def __init__(self, step_calls: _Optional[int] = ..., step_server_s: _Optional[float] = ..., step_compute_s: _Optional[float] = ..., reset_calls: _Optional[int] = ..., reset_slots: _Optional[int] = ..., map_loads: _Optional[int] = ..., map_cache_hits: _Optional[int] = ..., prepare_calls: _Optional[int] = ..., prepared: _Optional[int] = ...) -> None: ...

class Histogram(_message.Message):
    __slots__ = ("upper_bounds", "cumulative_counts", "sum")
    UPPER_BOUNDS_FIELD_NUMBER: _ClassVar[int]
    CUMULATIVE_COUNTS_FIELD_NUMBER: _ClassVar[int]
    SUM_FIELD_NUMBER: _ClassVar[int]
    upper_bounds: _containers.RepeatedScalarFieldContainer[float]
    cumulative_counts: _containers.RepeatedScalarFieldContainer[int]
    sum: float
    def __init__(self, upper_bounds: _Optional[_Iterable[float]] = ..., cumulative_counts: _Optional[_Iterable[int]] = ..., sum: _Optional[float] = ...) -> None: ...

class GetRunStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetRunStatusResponse(_message.Message):
    __slots__ = ("state", "mode", "iteration", "iterations_total", "policy_version", "valid_steps_total", "simulators", "error", "last_metrics", "settings", "pending_settings", "num_slots", "transitions_total", "global_resets_total", "faults_total", "episode_length_histogram", "episode_return_histogram", "stale_batches")
    STATE_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    ITERATIONS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    VALID_STEPS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    SIMULATORS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    LAST_METRICS_FIELD_NUMBER: _ClassVar[int]
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    PENDING_SETTINGS_FIELD_NUMBER: _ClassVar[int]
    NUM_SLOTS_FIELD_NUMBER: _ClassVar[int]
    TRANSITIONS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_RESETS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    FAULTS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    EPISODE_LENGTH_HISTOGRAM_FIELD_NUMBER: _ClassVar[int]
    EPISODE_RETURN_HISTOGRAM_FIELD_NUMBER: _ClassVar[int]
    STALE_BATCHES_FIELD_NUMBER: _ClassVar[int]
    state: RunState
    mode: str
    iteration: int
    iterations_total: int
    policy_version: int
    valid_steps_total: int
    simulators: _containers.RepeatedCompositeFieldContainer[SimulatorStatus]
    error: str
    last_metrics: IterationMetrics
    settings: RunSettings
    pending_settings: RunSettings
    num_slots: int
    transitions_total: int
    global_resets_total: int
    faults_total: int
    episode_length_histogram: Histogram
    episode_return_histogram: Histogram
    stale_batches: int
    def __init__(self, state: _Optional[_Union[RunState, str]] = ..., mode: _Optional[str] = ..., iteration: _Optional[int] = ..., iterations_total: _Optional[int] = ..., policy_version: _Optional[int] = ..., valid_steps_total: _Optional[int] = ..., simulators: _Optional[_Iterable[_Union[SimulatorStatus, _Mapping]]] = ..., error: _Optional[str] = ..., last_metrics: _Optional[_Union[IterationMetrics, _Mapping]] = ..., settings: _Optional[_Union[RunSettings, _Mapping]] = ..., pending_settings: _Optional[_Union[RunSettings, _Mapping]] = ..., num_slots: _Optional[int] = ..., transitions_total: _Optional[int] = ..., global_resets_total: _Optional[int] = ..., faults_total: _Optional[int] = ..., episode_length_histogram: _Optional[_Union[Histogram, _Mapping]] = ..., episode_return_histogram: _Optional[_Union[Histogram, _Mapping]] = ..., stale_batches: _Optional[int] = ...) -> None: ...

class GetMetricsHistoryRequest(_message.Message):
    __slots__ = ("since_iteration", "max_count")
    SINCE_ITERATION_FIELD_NUMBER: _ClassVar[int]
    MAX_COUNT_FIELD_NUMBER: _ClassVar[int]
    since_iteration: int
    max_count: int
    def __init__(self, since_iteration: _Optional[int] = ..., max_count: _Optional[int] = ...) -> None: ...

class GetMetricsHistoryResponse(_message.Message):
    __slots__ = ("iterations",)
    ITERATIONS_FIELD_NUMBER: _ClassVar[int]
    iterations: _containers.RepeatedCompositeFieldContainer[IterationMetrics]
    def __init__(self, iterations: _Optional[_Iterable[_Union[IterationMetrics, _Mapping]]] = ...) -> None: ...

class WatchMetricsRequest(_message.Message):
    __slots__ = ("since_iteration",)
    SINCE_ITERATION_FIELD_NUMBER: _ClassVar[int]
    since_iteration: int
    def __init__(self, since_iteration: _Optional[int] = ...) -> None: ...

class UpdateSettingsRequest(_message.Message):
    __slots__ = ("alpha", "t_max", "samples_per_iteration", "alpha_auto", "mode")
    ALPHA_FIELD_NUMBER: _ClassVar[int]
    T_MAX_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_PER_ITERATION_FIELD_NUMBER: _ClassVar[int]
    ALPHA_AUTO_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    alpha: float
    t_max: int
    samples_per_iteration: int
    alpha_auto: bool
    mode: str
    def __init__(self, alpha: _Optional[float] = ..., t_max: _Optional[int] = ..., samples_per_iteration: _Optional[int] = ..., alpha_auto: _Optional[bool] = ..., mode: _Optional[str] = ...) -> None: ...

class UpdateSettingsResponse(_message.Message):
    __slots__ = ("settings", "effective_iteration")
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    EFFECTIVE_ITERATION_FIELD_NUMBER: _ClassVar[int]
    settings: RunSettings
    effective_iteration: int
    def __init__(self, settings: _Optional[_Union[RunSettings, _Mapping]] = ..., effective_iteration: _Optional[int] = ...) -> None: ...

class DetachSimulatorRequest(_message.Message):
    __slots__ = ("address",)
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    address: str
    def __init__(self, address: _Optional[str] = ...) -> None: ...

class DetachSimulatorResponse(_message.Message):
    __slots__ = ("num_slots",)
    NUM_SLOTS_FIELD_NUMBER: _ClassVar[int]
    num_slots: int
    def __init__(self, num_slots: _Optional[int] = ...) -> None: ...

class RegisterSimulatorRequest(_message.Message):
    __slots__ = ("address",)
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    address: str
    def __init__(self, address: _Optional[str] = ...) -> None: ...

class RegisterSimulatorResponse(_message.Message):
    __slots__ = ("num_slots", "env_id")
    NUM_SLOTS_FIELD_NUMBER: _ClassVar[int]
    ENV_ID_FIELD_NUMBER: _ClassVar[int]
    num_slots: int
    env_id: str
    def __init__(self, num_slots: _Optional[int] = ..., env_id: _Optional[str] = ...) -> None: ...

class ControlRequest(_message.Message):
    __slots__ = ("action",)
    ACTION_FIELD_NUMBER: _ClassVar[int]
    action: ControlAction
    def __init__(self, action: _Optional[_Union[ControlAction, str]] = ...) -> None: ...

class ControlResponse(_message.Message):
    __slots__ = ("state",)
    STATE_FIELD_NUMBER: _ClassVar[int]
    state: RunState
    def __init__(self, state: _Optional[_Union[RunState, str]] = ...) -> None: ...
