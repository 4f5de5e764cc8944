from fast.v1 import tensor_pb2 as _tensor_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PolicyFormat(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    POLICY_FORMAT_UNSPECIFIED: _ClassVar[PolicyFormat]
    POLICY_FORMAT_TORCHSCRIPT: _ClassVar[PolicyFormat]
    POLICY_FORMAT_ONNX: _ClassVar[PolicyFormat]
POLICY_FORMAT_UNSPECIFIED: PolicyFormat
POLICY_FORMAT_TORCHSCRIPT: PolicyFormat
POLICY_FORMAT_ONNX: PolicyFormat

class RolloutBatch(_message.Message):
    __slots__ = ("policy_version", "obs", "actions", "logprobs", "values", "rewards", "terminated", "truncated", "valid_mask", "bootstrap_values")
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    OBS_FIELD_NUMBER: _ClassVar[int]
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    REWARDS_FIELD_NUMBER: _ClassVar[int]
    TERMINATED_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    VALID_MASK_FIELD_NUMBER: _ClassVar[int]
    BOOTSTRAP_VALUES_FIELD_NUMBER: _ClassVar[int]
    policy_version: int
    obs: _tensor_pb2.Tensor
    actions: _tensor_pb2.Tensor
    logprobs: _tensor_pb2.Tensor
    values: _tensor_pb2.Tensor
    rewards: _tensor_pb2.Tensor
    terminated: _tensor_pb2.Tensor
    truncated: _tensor_pb2.Tensor
    valid_mask: _tensor_pb2.Tensor
    bootstrap_values: _tensor_pb2.Tensor
    def __init__(self, policy_version: _Optional[int] = ..., obs: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., actions: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., logprobs: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., values: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., rewards: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., terminated: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., truncated: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., valid_mask: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., bootstrap_values: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ...) -> None: ...

class UpdateStats(_message.Message):
    __slots__ = ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction", "explained_variance", "grad_norm", "update_time_s", "num_valid", "num_total", "learning_rate", "ent_coef", "reward_scale", "lr_anneal_factor")
    POLICY_LOSS_FIELD_NUMBER: _ClassVar[int]
    VALUE_LOSS_FIELD_NUMBER: _ClassVar[int]
    ENTROPY_FIELD_NUMBER: _ClassVar[int]
    APPROX_KL_FIELD_NUMBER: _ClassVar[int]
    CLIP_FRACTION_FIELD_NUMBER: _ClassVar[int]
    EXPLAINED_VARIANCE_FIELD_NUMBER: _ClassVar[int]
    GRAD_NORM_FIELD_NUMBER: _ClassVar[int]
    UPDATE_TIME_S_FIELD_NUMBER: _ClassVar[int]
    NUM_VALID_FIELD_NUMBER: _ClassVar[int]
    NUM_TOTAL_FIELD_NUMBER: _ClassVar[int]
    LEARNING_RATE_FIELD_NUMBER: _ClassVar[int]
    ENT_COEF_FIELD_NUMBER: _ClassVar[int]
    REWARD_SCALE_FIELD_NUMBER: _ClassVar[int]
    LR_ANNEAL_FACTOR_FIELD_NUMBER: _ClassVar[int]
    policy_loss: float
    value_loss: float
    entropy: float
    approx_kl: float
    clip_fraction: float
    explained_variance: float
    grad_norm: float
    update_time_s: float
    num_valid: int
    num_total: int
    learning_rate: float
    ent_coef: float
    reward_scale: float
    lr_anneal_factor: float
    def __init__(self, policy_loss: _Optional[float] = ..., value_loss: _Optional[float] = ..., entropy: _Optional[float] = ..., approx_kl: _Optional[float] = ..., clip_fraction: _Optional[float] = ..., explained_variance: _Optional[float] = ..., grad_norm: _Optional[float] = ..., update_time_s: _Optional[float] = ..., num_valid: _Optional[int] = ..., num_total: _Optional[int] = ..., learning_rate: _Optional[float] = ..., ent_coef: _Optional[float] = ..., reward_scale: _Optional[float] = ..., lr_anneal_factor: _Optional[float] = ...) -> None: ...

class Policy(_message.Message):
    __slots__ = ("version", "weights", "hidden_sizes", "observation_space", "action_space")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_SIZES_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_SPACE_FIELD_NUMBER: _ClassVar[int]
    ACTION_SPACE_FIELD_NUMBER: _ClassVar[int]
    version: int
    weights: bytes
    hidden_sizes: _containers.RepeatedScalarFieldContainer[int]
    observation_space: _tensor_pb2.Space
    action_space: _tensor_pb2.Space
    def __init__(self, version: _Optional[int] = ..., weights: _Optional[bytes] = ..., hidden_sizes: _Optional[_Iterable[int]] = ..., observation_space: _Optional[_Union[_tensor_pb2.Space, _Mapping]] = ..., action_space: _Optional[_Union[_tensor_pb2.Space, _Mapping]] = ...) -> None: ...

class InitializeRequest(_message.Message):
    __slots__ = ("observation_space", "action_space")
    OBSERVATION_SPACE_FIELD_NUMBER: _ClassVar[int]
    ACTION_SPACE_FIELD_NUMBER: _ClassVar[int]
    observation_space: _tensor_pb2.Space
    action_space: _tensor_pb2.Space
    def __init__(self, observation_space: _Optional[_Union[_tensor_pb2.Space, _Mapping]] = ..., action_space: _Optional[_Union[_tensor_pb2.Space, _Mapping]] = ...) -> None: ...

class InitializeResponse(_message.Message):
    __slots__ = ("policy_version", "resumed", "world_size")
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    RESUMED_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    policy_version: int
    resumed: bool
    world_size: int
    def __init__(self, policy_version: _Optional[int] = ..., resumed: _Optional[bool] = ..., world_size: _Optional[int] = ...) -> None: ...

class GetPolicyRequest(_message.Message):
    __slots__ = ("known_version",)
    KNOWN_VERSION_FIELD_NUMBER: _ClassVar[int]
    known_version: int
    def __init__(self, known_version: _Optional[int] = ...) -> None: ...

class GetPolicyResponse(_message.Message):
    __slots__ = ("policy",)
    POLICY_FIELD_NUMBER: _ClassVar[int]
    policy: Policy
    def __init__(self, policy: _Optional[_Union[Policy, _Mapping]] = ...) -> None: ...

class SubmitBatchRequest(_message.Message):
    __slots__ = ("batch", "return_policy", "stop_requested", "pause_requested")
    BATCH_FIELD_NUMBER: _ClassVar[int]
    RETURN_POLICY_FIELD_NUMBER: _ClassVar[int]
    STOP_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    PAUSE_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    batch: RolloutBatch
    return_policy: bool
    stop_requested: bool
    pause_requested: bool
    def __init__(self, batch: _Optional[_Union[RolloutBatch, _Mapping]] = ..., return_policy: _Optional[bool] = ..., stop_requested: _Optional[bool] = ..., pause_requested: _Optional[bool] = ...) -> None: ...

class SubmitBatchResponse(_message.Message):
    __slots__ = ("stats", "policy_version", "policy", "run_stops", "run_pauses")
    STATS_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    RUN_STOPS_FIELD_NUMBER: _ClassVar[int]
    RUN_PAUSES_FIELD_NUMBER: _ClassVar[int]
    stats: UpdateStats
    policy_version: int
    policy: Policy
    run_stops: bool
    run_pauses: bool
    def __init__(self, stats: _Optional[_Union[UpdateStats, _Mapping]] = ..., policy_version: _Optional[int] = ..., policy: _Optional[_Union[Policy, _Mapping]] = ..., run_stops: _Optional[bool] = ..., run_pauses: _Optional[bool] = ...) -> None: ...

class GetStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetStatusResponse(_message.Message):
    __slots__ = ("initialized", "policy_version", "device", "updates_this_process", "last_stats", "last_checkpoint", "stale_batches_refused", "hyperparameters")
    INITIALIZED_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    UPDATES_THIS_PROCESS_FIELD_NUMBER: _ClassVar[int]
    LAST_STATS_FIELD_NUMBER: _ClassVar[int]
    LAST_CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    STALE_BATCHES_REFUSED_FIELD_NUMBER: _ClassVar[int]
    HYPERPARAMETERS_FIELD_NUMBER: _ClassVar[int]
    initialized: bool
    policy_version: int
    device: str
    updates_this_process: int
    last_stats: UpdateStats
    last_checkpoint: str
    stale_batches_refused: int
    hyperparameters: Hyperparameters
    def __init__(self, initialized: _Optional[bool] = ..., policy_version: _Optional[int] = ..., device: _Optional[str] = ..., updates_this_process: _Optional[int] = ..., last_stats: _Optional[_Union[UpdateStats, _Mapping]] = ..., last_checkpoint: _Optional[str] = ..., stale_batches_refused: _Optional[int] = ..., hyperparameters: _Optional[_Union[Hyperparameters, _Mapping]] = ...) -> None: ...

class Hyperparameters(_message.Message):
    __slots__ = ("learning_rate", "ent_coef")
    LEARNING_RATE_FIELD_NUMBER: _ClassVar[int]
    ENT_COEF_FIELD_NUMBER: _ClassVar[int]
    learning_rate: float
    ent_coef: float
    def __init__(self, learning_rate: _Optional[float] = ..., ent_coef: _Optional[float] = ...) -> None: ...

class UpdateHyperparametersRequest(_message.Message):
    __slots__ = ("learning_rate", "ent_coef")
    LEARNING_RATE_FIELD_NUMBER: _ClassVar[int]
    ENT_COEF_FIELD_NUMBER: _ClassVar[int]
    learning_rate: float
    ent_coef: float
    def __init__(self, learning_rate: _Optional[float] = ..., ent_coef: _Optional[float] = ...) -> None: ...

class UpdateHyperparametersResponse(_message.Message):
    __slots__ = ("hyperparameters", "effective_from_version")
    HYPERPARAMETERS_FIELD_NUMBER: _ClassVar[int]
    EFFECTIVE_FROM_VERSION_FIELD_NUMBER: _ClassVar[int]
    hyperparameters: Hyperparameters
    effective_from_version: int
    def __init__(self, hyperparameters: _Optional[_Union[Hyperparameters, _Mapping]] = ..., effective_from_version: _Optional[int] = ...) -> None: ...

class CheckpointInfo(_message.Message):
    __slots__ = ("path", "policy_version", "size_bytes", "modified_unix")
    PATH_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MODIFIED_UNIX_FIELD_NUMBER: _ClassVar[int]
    path: str
    policy_version: int
    size_bytes: int
    modified_unix: float
    def __init__(self, path: _Optional[str] = ..., policy_version: _Optional[int] = ..., size_bytes: _Optional[int] = ..., modified_unix: _Optional[float] = ...) -> None: ...

class ListCheckpointsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListCheckpointsResponse(_message.Message):
    __slots__ = ("checkpoints",)
    CHECKPOINTS_FIELD_NUMBER: _ClassVar[int]
    checkpoints: _containers.RepeatedCompositeFieldContainer[CheckpointInfo]
    def __init__(self, checkpoints: _Optional[_Iterable[_Union[CheckpointInfo, _Mapping]]] = ...) -> None: ...

class ExportPolicyRequest(_message.Message):
    __slots__ = ("format",)
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    format: PolicyFormat
    def __init__(self, format: _Optional[_Union[PolicyFormat, str]] = ...) -> None: ...

class ExportPolicyResponse(_message.Message):
    __slots__ = ("model", "policy_version", "observation_shape")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_SHAPE_FIELD_NUMBER: _ClassVar[int]
    model: bytes
    policy_version: int
    observation_shape: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, model: _Optional[bytes] = ..., policy_version: _Optional[int] = ..., observation_shape: _Optional[_Iterable[int]] = ...) -> None: ...

class SaveCheckpointRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SaveCheckpointResponse(_message.Message):
    __slots__ = ("path", "policy_version")
    PATH_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    path: str
    policy_version: int
    def __init__(self, path: _Optional[str] = ..., policy_version: _Optional[int] = ...) -> None: ...
