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
CONTROL_ACTION_UNSPECIFIED: ControlAction
CONTROL_ACTION_PAUSE: ControlAction
CONTROL_ACTION_RESUME: ControlAction
CONTROL_ACTION_STOP: ControlAction

class SimulatorStatus(_message.Message):
    __slots__ = ("address", "up", "num_slots", "faults", "readmissions", "last_error")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    UP_FIELD_NUMBER: _ClassVar[int]
    NUM_SLOTS_FIELD_NUMBER: _ClassVar[int]
    FAULTS_FIELD_NUMBER: _ClassVar[int]
    READMISSIONS_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    address: str
    up: bool
    num_slots: int
    faults: int
    readmissions: int
    last_error: str
    def __init__(self, address: _Optional[str] = ..., up: _Optional[bool] = ..., num_slots: _Optional[int] = ..., faults: _Optional[int] = ..., readmissions: _Optional[int] = ..., last_error: _Optional[str] = ...) -> None: ...

class GetRunStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetRunStatusResponse(_message.Message):
    __slots__ = ("state", "mode", "iteration", "iterations_total", "policy_version", "valid_steps_total", "last_metrics_json", "simulators", "error")
    STATE_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    ITERATIONS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    VALID_STEPS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    LAST_METRICS_JSON_FIELD_NUMBER: _ClassVar[int]
    SIMULATORS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    state: RunState
    mode: str
    iteration: int
    iterations_total: int
    policy_version: int
    valid_steps_total: int
    last_metrics_json: str
    simulators: _containers.RepeatedCompositeFieldContainer[SimulatorStatus]
    error: str
    def __init__(self, state: _Optional[_Union[RunState, str]] = ..., mode: _Optional[str] = ..., iteration: _Optional[int] = ..., iterations_total: _Optional[int] = ..., policy_version: _Optional[int] = ..., valid_steps_total: _Optional[int] = ..., last_metrics_json: _Optional[str] = ..., simulators: _Optional[_Iterable[_Union[SimulatorStatus, _Mapping]]] = ..., error: _Optional[str] = ...) -> None: ...

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
