"""The fast.v1.Learner gRPC servicer: requests to `LearnerCore` calls and errors to status codes.

All logic lives in `LearnerCore` and the message encodings in learner/wire.py (shared with the
client); this file only routes. Every refusal leaves the policy, its version and the optimiser
as they were.
"""

from __future__ import annotations

from typing import Awaitable, TypeVar

import grpc

from fast import tensor
from fast.spaces import SpaceSpec, space_from_proto
from fast.v1 import learner_pb2 as pb
from fast.v1 import learner_pb2_grpc as pb_grpc
from learner.batch import RolloutBatch
from learner.core import LearnerCore
from learner.errors import ErrorKind, LearnerError, invalid_argument
from learner.wire import EXPORT_FORMATS, batch_arrays_from_proto, stats_to_proto

T = TypeVar("T")

_STATUS = {
    ErrorKind.INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorKind.FAILED_PRECONDITION: grpc.StatusCode.FAILED_PRECONDITION,
    ErrorKind.UNIMPLEMENTED: grpc.StatusCode.UNIMPLEMENTED,
    ErrorKind.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
}
_FORMAT_NAMES = {value: name for name, value in EXPORT_FORMATS.items()}


def _format_name(value: int) -> str:
    if value not in _FORMAT_NAMES:
        known = ", ".join(pb.PolicyFormat.Name(v) for v in _FORMAT_NAMES)
        shown = pb.PolicyFormat.Name(value) if value in pb.PolicyFormat.values() else str(value)
        raise invalid_argument(f"format is {shown}; set one of {known}")
    return _FORMAT_NAMES[value]


def _space(request, name: str) -> SpaceSpec:
    if not request.HasField(name):
        raise tensor.TensorError(f"{name} is missing; send the simulators' {name} (their Describe response has it)")
    return space_from_proto(getattr(request, name), field=name)


class LearnerServicer(pb_grpc.LearnerServicer):
    def __init__(self, core: LearnerCore) -> None:
        self.core = core

    async def _run(self, call: Awaitable[T], context: grpc.aio.ServicerContext) -> T:
        """Await a domain call, mapping domain and decoding errors to statuses."""
        try:
            return await call
        except LearnerError as exc:
            await context.abort(_STATUS[exc.kind], exc.message)
        except (tensor.TensorError, ValueError) as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except OSError as exc:  # only checkpoints touch the disk
            await context.abort(
                grpc.StatusCode.INTERNAL,
                f"the checkpoint directory failed (writing or listing): {exc}; check --checkpoint-dir",
            )
        raise AssertionError("unreachable: context.abort raises")

    async def Initialize(self, request: pb.InitializeRequest, context) -> pb.InitializeResponse:
        async def call() -> pb.InitializeResponse:
            version, resumed = await self.core.initialize(
                _space(request, "observation_space"), _space(request, "action_space")
            )
            return pb.InitializeResponse(policy_version=version, resumed=resumed, world_size=self.core.world_size)

        return await self._run(call(), context)

    async def GetPolicy(self, request: pb.GetPolicyRequest, context) -> pb.GetPolicyResponse:
        async def call() -> pb.GetPolicyResponse:
            return pb.GetPolicyResponse(policy=self.core.get_policy(request.known_version).to_proto())

        return await self._run(call(), context)

    async def SubmitBatch(self, request: pb.SubmitBatchRequest, context) -> pb.SubmitBatchResponse:
        async def call() -> pb.SubmitBatchResponse:
            if not request.HasField("batch"):
                raise tensor.TensorError("batch is missing; set SubmitBatchRequest.batch")
            result = await self.core.submit(
                RolloutBatch.from_numpy(batch_arrays_from_proto(request.batch)),
                pause_requested=request.pause_requested,
                stop_requested=request.stop_requested,
            )
            return pb.SubmitBatchResponse(
                stats=stats_to_proto(result.stats),
                policy_version=result.policy_version,
                policy=result.policy.to_proto() if request.return_policy else None,
                run_pauses=result.run_pauses,
                run_stops=result.run_stops,
            )

        return await self._run(call(), context)

    async def GetStatus(self, request: pb.GetStatusRequest, context) -> pb.GetStatusResponse:
        return self.core.status().to_proto()

    async def SaveCheckpoint(self, request: pb.SaveCheckpointRequest, context) -> pb.SaveCheckpointResponse:
        async def call() -> pb.SaveCheckpointResponse:
            path, version = await self.core.save_checkpoint()
            return pb.SaveCheckpointResponse(path=str(path), policy_version=version)

        return await self._run(call(), context)

    async def UpdateHyperparameters(
        self, request: pb.UpdateHyperparametersRequest, context
    ) -> pb.UpdateHyperparametersResponse:
        async def call() -> pb.UpdateHyperparametersResponse:
            values, effective_from = self.core.update_hyperparameters(
                learning_rate=request.learning_rate if request.HasField("learning_rate") else None,
                ent_coef=request.ent_coef if request.HasField("ent_coef") else None,
            )
            return pb.UpdateHyperparametersResponse(
                hyperparameters=values.to_proto(), effective_from_version=effective_from
            )

        return await self._run(call(), context)

    async def ListCheckpoints(self, request: pb.ListCheckpointsRequest, context) -> pb.ListCheckpointsResponse:
        async def call() -> pb.ListCheckpointsResponse:
            checkpoints = await self.core.list_checkpoints()
            return pb.ListCheckpointsResponse(checkpoints=[info.to_proto() for info in checkpoints])

        return await self._run(call(), context)

    async def ExportPolicy(self, request: pb.ExportPolicyRequest, context) -> pb.ExportPolicyResponse:
        async def call() -> pb.ExportPolicyResponse:
            return (await self.core.export_policy(_format_name(request.format))).to_proto()

        return await self._run(call(), context)
