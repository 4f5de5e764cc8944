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
from learner.errors import ErrorKind, LearnerError
from learner.wire import batch_arrays_from_proto, stats_to_proto

T = TypeVar("T")

_STATUS = {
    ErrorKind.INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorKind.FAILED_PRECONDITION: grpc.StatusCode.FAILED_PRECONDITION,
}


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
        except OSError as exc:  # only checkpoint writes touch the disk
            await context.abort(
                grpc.StatusCode.INTERNAL, f"writing the checkpoint failed: {exc}; check --checkpoint-dir"
            )
        raise AssertionError("unreachable: context.abort raises")

    async def Initialize(self, request: pb.InitializeRequest, context) -> pb.InitializeResponse:
        async def call() -> pb.InitializeResponse:
            version, resumed = await self.core.initialize(
                _space(request, "observation_space"), _space(request, "action_space")
            )
            return pb.InitializeResponse(policy_version=version, resumed=resumed)

        return await self._run(call(), context)

    async def GetPolicy(self, request: pb.GetPolicyRequest, context) -> pb.GetPolicyResponse:
        async def call() -> pb.GetPolicyResponse:
            return pb.GetPolicyResponse(policy=self.core.get_policy(request.known_version).to_proto())

        return await self._run(call(), context)

    async def SubmitBatch(self, request: pb.SubmitBatchRequest, context) -> pb.SubmitBatchResponse:
        async def call() -> pb.SubmitBatchResponse:
            if not request.HasField("batch"):
                raise tensor.TensorError("batch is missing; set SubmitBatchRequest.batch")
            result = await self.core.submit(RolloutBatch.from_numpy(batch_arrays_from_proto(request.batch)))
            return pb.SubmitBatchResponse(
                stats=stats_to_proto(result.stats),
                policy_version=result.policy_version,
                policy=result.policy.to_proto() if request.return_policy else None,
            )

        return await self._run(call(), context)

    async def GetStatus(self, request: pb.GetStatusRequest, context) -> pb.GetStatusResponse:
        return self.core.status().to_proto()

    async def SaveCheckpoint(self, request: pb.SaveCheckpointRequest, context) -> pb.SaveCheckpointResponse:
        async def call() -> pb.SaveCheckpointResponse:
            path, version = await self.core.save_checkpoint()
            return pb.SaveCheckpointResponse(path=str(path), policy_version=version)

        return await self._run(call(), context)
