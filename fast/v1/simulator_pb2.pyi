from fast.v1 import tensor_pb2 as _tensor_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CostModel(_message.Message):
    __slots__ = ("preset", "step_latency_s", "reset_fixed_s", "reset_fixed_exclusive", "map_load_s", "map_load_cached_s", "map_load_shared", "map_cache_size", "prefetch_step_penalty", "reset_blocks_steps")
    PRESET_FIELD_NUMBER: _ClassVar[int]
    STEP_LATENCY_S_FIELD_NUMBER: _ClassVar[int]
    RESET_FIXED_S_FIELD_NUMBER: _ClassVar[int]
    RESET_FIXED_EXCLUSIVE_FIELD_NUMBER: _ClassVar[int]
    MAP_LOAD_S_FIELD_NUMBER: _ClassVar[int]
    MAP_LOAD_CACHED_S_FIELD_NUMBER: _ClassVar[int]
    MAP_LOAD_SHARED_FIELD_NUMBER: _ClassVar[int]
    MAP_CACHE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PREFETCH_STEP_PENALTY_FIELD_NUMBER: _ClassVar[int]
    RESET_BLOCKS_STEPS_FIELD_NUMBER: _ClassVar[int]
    preset: str
    step_latency_s: float
    reset_fixed_s: float
    reset_fixed_exclusive: bool
    map_load_s: float
    map_load_cached_s: float
    map_load_shared: bool
    map_cache_size: int
    prefetch_step_penalty: float
    reset_blocks_steps: bool
    def __init__(self, preset: _Optional[str] = ..., step_latency_s: _Optional[float] = ..., reset_fixed_s: _Optional[float] = ..., reset_fixed_exclusive: _Optional[bool] = ..., map_load_s: _Optional[float] = ..., map_load_cached_s: _Optional[float] = ..., map_load_shared: _Optional[bool] = ..., map_cache_size: _Optional[int] = ..., prefetch_step_penalty: _Optional[float] = ..., reset_blocks_steps: _Optional[bool] = ...) -> None: ...

class Capabilities(_message.Message):
    __slots__ = ("batched_reset", "streaming_step", "cost_model", "prefetch", "local_step_socket")
    BATCHED_RESET_FIELD_NUMBER: _ClassVar[int]
    STREAMING_STEP_FIELD_NUMBER: _ClassVar[int]
    COST_MODEL_FIELD_NUMBER: _ClassVar[int]
    PREFETCH_FIELD_NUMBER: _ClassVar[int]
    LOCAL_STEP_SOCKET_FIELD_NUMBER: _ClassVar[int]
    batched_reset: bool
    streaming_step: bool
    cost_model: CostModel
    prefetch: bool
    local_step_socket: str
    def __init__(self, batched_reset: _Optional[bool] = ..., streaming_step: _Optional[bool] = ..., cost_model: _Optional[_Union[CostModel, _Mapping]] = ..., prefetch: _Optional[bool] = ..., local_step_socket: _Optional[str] = ...) -> None: ...

class ServerTiming(_message.Message):
    __slots__ = ("compute_s", "emulated_s", "queued_s", "map_loads", "map_cache_hits", "prepared")
    COMPUTE_S_FIELD_NUMBER: _ClassVar[int]
    EMULATED_S_FIELD_NUMBER: _ClassVar[int]
    QUEUED_S_FIELD_NUMBER: _ClassVar[int]
    MAP_LOADS_FIELD_NUMBER: _ClassVar[int]
    MAP_CACHE_HITS_FIELD_NUMBER: _ClassVar[int]
    PREPARED_FIELD_NUMBER: _ClassVar[int]
    compute_s: float
    emulated_s: float
    queued_s: float
    map_loads: int
    map_cache_hits: int
    prepared: int
    def __init__(self, compute_s: _Optional[float] = ..., emulated_s: _Optional[float] = ..., queued_s: _Optional[float] = ..., map_loads: _Optional[int] = ..., map_cache_hits: _Optional[int] = ..., prepared: _Optional[int] = ...) -> None: ...

class EpisodeSummary(_message.Message):
    __slots__ = ("slot_id", "clip_id", "length", "episode_return", "terminated", "metrics")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    SLOT_ID_FIELD_NUMBER: _ClassVar[int]
    CLIP_ID_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    EPISODE_RETURN_FIELD_NUMBER: _ClassVar[int]
    TERMINATED_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    slot_id: int
    clip_id: int
    length: int
    episode_return: float
    terminated: bool
    metrics: _containers.ScalarMap[str, float]
    def __init__(self, slot_id: _Optional[int] = ..., clip_id: _Optional[int] = ..., length: _Optional[int] = ..., episode_return: _Optional[float] = ..., terminated: _Optional[bool] = ..., metrics: _Optional[_Mapping[str, float]] = ...) -> None: ...

class DescribeRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DescribeResponse(_message.Message):
    __slots__ = ("env_id", "observation_space", "action_space", "num_slots", "num_clips", "capabilities", "server_version", "api_version", "clip_map_ids")
    ENV_ID_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_SPACE_FIELD_NUMBER: _ClassVar[int]
    ACTION_SPACE_FIELD_NUMBER: _ClassVar[int]
    NUM_SLOTS_FIELD_NUMBER: _ClassVar[int]
    NUM_CLIPS_FIELD_NUMBER: _ClassVar[int]
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    SERVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    API_VERSION_FIELD_NUMBER: _ClassVar[int]
    CLIP_MAP_IDS_FIELD_NUMBER: _ClassVar[int]
    env_id: str
    observation_space: _tensor_pb2.Space
    action_space: _tensor_pb2.Space
    num_slots: int
    num_clips: int
    capabilities: Capabilities
    server_version: str
    api_version: str
    clip_map_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, env_id: _Optional[str] = ..., observation_space: _Optional[_Union[_tensor_pb2.Space, _Mapping]] = ..., action_space: _Optional[_Union[_tensor_pb2.Space, _Mapping]] = ..., num_slots: _Optional[int] = ..., num_clips: _Optional[int] = ..., capabilities: _Optional[_Union[Capabilities, _Mapping]] = ..., server_version: _Optional[str] = ..., api_version: _Optional[str] = ..., clip_map_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class ResetRequest(_message.Message):
    __slots__ = ("slot_ids", "clip_ids", "seeds")
    SLOT_IDS_FIELD_NUMBER: _ClassVar[int]
    CLIP_IDS_FIELD_NUMBER: _ClassVar[int]
    SEEDS_FIELD_NUMBER: _ClassVar[int]
    slot_ids: _containers.RepeatedScalarFieldContainer[int]
    clip_ids: _containers.RepeatedScalarFieldContainer[int]
    seeds: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, slot_ids: _Optional[_Iterable[int]] = ..., clip_ids: _Optional[_Iterable[int]] = ..., seeds: _Optional[_Iterable[int]] = ...) -> None: ...

class ResetResponse(_message.Message):
    __slots__ = ("slot_ids", "observations", "timing")
    SLOT_IDS_FIELD_NUMBER: _ClassVar[int]
    OBSERVATIONS_FIELD_NUMBER: _ClassVar[int]
    TIMING_FIELD_NUMBER: _ClassVar[int]
    slot_ids: _containers.RepeatedScalarFieldContainer[int]
    observations: _tensor_pb2.Tensor
    timing: ServerTiming
    def __init__(self, slot_ids: _Optional[_Iterable[int]] = ..., observations: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., timing: _Optional[_Union[ServerTiming, _Mapping]] = ...) -> None: ...

class PrepareRequest(_message.Message):
    __slots__ = ("slot_ids", "clip_ids", "seeds")
    SLOT_IDS_FIELD_NUMBER: _ClassVar[int]
    CLIP_IDS_FIELD_NUMBER: _ClassVar[int]
    SEEDS_FIELD_NUMBER: _ClassVar[int]
    slot_ids: _containers.RepeatedScalarFieldContainer[int]
    clip_ids: _containers.RepeatedScalarFieldContainer[int]
    seeds: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, slot_ids: _Optional[_Iterable[int]] = ..., clip_ids: _Optional[_Iterable[int]] = ..., seeds: _Optional[_Iterable[int]] = ...) -> None: ...

class PrepareResponse(_message.Message):
    __slots__ = ("slot_ids",)
    SLOT_IDS_FIELD_NUMBER: _ClassVar[int]
    slot_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, slot_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class StepRequest(_message.Message):
    __slots__ = ("slot_ids", "actions", "request_id")
    SLOT_IDS_FIELD_NUMBER: _ClassVar[int]
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    slot_ids: _containers.RepeatedScalarFieldContainer[int]
    actions: _tensor_pb2.Tensor
    request_id: int
    def __init__(self, slot_ids: _Optional[_Iterable[int]] = ..., actions: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., request_id: _Optional[int] = ...) -> None: ...

class StepResponse(_message.Message):
    __slots__ = ("slot_ids", "observations", "rewards", "terminated", "truncated", "episodes", "timing", "request_id")
    SLOT_IDS_FIELD_NUMBER: _ClassVar[int]
    OBSERVATIONS_FIELD_NUMBER: _ClassVar[int]
    REWARDS_FIELD_NUMBER: _ClassVar[int]
    TERMINATED_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    EPISODES_FIELD_NUMBER: _ClassVar[int]
    TIMING_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    slot_ids: _containers.RepeatedScalarFieldContainer[int]
    observations: _tensor_pb2.Tensor
    rewards: _tensor_pb2.Tensor
    terminated: _tensor_pb2.Tensor
    truncated: _tensor_pb2.Tensor
    episodes: _containers.RepeatedCompositeFieldContainer[EpisodeSummary]
    timing: ServerTiming
    request_id: int
    def __init__(self, slot_ids: _Optional[_Iterable[int]] = ..., observations: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., rewards: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., terminated: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., truncated: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., episodes: _Optional[_Iterable[_Union[EpisodeSummary, _Mapping]]] = ..., timing: _Optional[_Union[ServerTiming, _Mapping]] = ..., request_id: _Optional[int] = ...) -> None: ...
