"""The fast.v1.Learner gRPC servicer: protos to domain types and errors to status codes.

All logic lives in `LearnerCore`; this file only translates. Every refusal leaves the policy,
its version and the optimiser as they were.
"""

from __future__ import annotations

from typing import Awaitable, TypeVar

import grpc
import numpy as np

from fast import tensor
from fast.spaces import SpaceSpec, space_from_proto, space_to_proto
from fast.v1 import learner_pb2 as pb
from fast.v1 import learner_pb2_grpc as pb_grpc
from learner.batch import RolloutBatch
from learner.core import LearnerCore, LearnerStatus, PolicySnapshot
from learner.errors import ErrorKind, LearnerError

T = TypeVar("T")

_STATUS = {
    ErrorKind.INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorKind.FAILED_PRECONDITION: grpc.StatusCode.FAILED_PRECONDITION,
}

# Tensor fields of fast.v1.RolloutBatch, in proto order; the names are RolloutBatch's.
BATCH_TENSOR_FIELDS = (
    "obs", "actions", "logprobs", "values", "rewards", "terminated", "truncated", "valid_mask", "bootstrap_values",
)
STATS_FIELDS = (
    "policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction", "explained_variance", "grad_norm",
    "update_time_s", "num_valid", "num_total",
)


def batch_from_proto(message: pb.RolloutBatch) -> RolloutBatch:
    """Decode and validate a wire batch; TensorError/ValueError name the field."""
    arrays: dict[str, object] = {"policy_version": int(message.policy_version)}
    for name in BATCH_TENSOR_FIELDS:
        if not message.HasField(name):
            raise tensor.TensorError(f"batch.{name} is missing; every field of RolloutBatch must be set (docs/smpo.md)")
        arrays[name] = tensor.from_proto(getattr(message, name), field=f"batch.{name}")
    obs = arrays["obs"]
    assert isinstance(obs, np.ndarray)
    if obs.dtype.kind in "iu":
        # Integer observations (camera pixels as UINT8) travel compact; the network reads floats.
        arrays["obs"] = obs.astype(np.float32)
    return RolloutBatch.from_numpy(arrays)


def stats_to_proto(stats: dict[str, float]) -> pb.UpdateStats:
    return pb.UpdateStats(**{name: stats[name] for name in STATS_FIELDS if name in stats})


def policy_to_proto(snapshot: PolicySnapshot) -> pb.Policy:
    return pb.Policy(
        version=snapshot.version,
        weights=snapshot.weights,
        hidden_sizes=list(snapshot.hidden_sizes),
        observation_space=space_to_proto(snapshot.observation_space),
        action_space=space_to_proto(snapshot.action_space),
    )


def status_to_proto(status: LearnerStatus) -> pb.GetStatusResponse:
    return pb.GetStatusResponse(
        initialized=status.initialized,
        policy_version=status.policy_version,
        device=status.device,
        updates_this_process=status.updates_this_process,
        last_stats=stats_to_proto(status.last_stats) if status.last_stats is not None else None,
        last_checkpoint=str(status.last_checkpoint or ""),
        stale_batches_refused=status.stale_batches_refused,
    )


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
            await context.abort(grpc.StatusCode.INTERNAL, f"writing the checkpoint failed: {exc}; check --checkpoint-dir")
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
            return pb.GetPolicyResponse(policy=policy_to_proto(self.core.get_policy(request.known_version)))

        return await self._run(call(), context)

    async def SubmitBatch(self, request: pb.SubmitBatchRequest, context) -> pb.SubmitBatchResponse:
        async def call() -> pb.SubmitBatchResponse:
            if not request.HasField("batch"):
                raise tensor.TensorError("batch is missing; set SubmitBatchRequest.batch")
            result = await self.core.submit(batch_from_proto(request.batch))
            return pb.SubmitBatchResponse(
                stats=stats_to_proto(result.stats),
                policy_version=result.policy_version,
                policy=policy_to_proto(result.policy) if request.return_policy else None,
            )

        return await self._run(call(), context)

    async def GetStatus(self, request: pb.GetStatusRequest, context) -> pb.GetStatusResponse:
        return status_to_proto(self.core.status())

    async def SaveCheckpoint(self, request: pb.SaveCheckpointRequest, context) -> pb.SaveCheckpointResponse:
        async def call() -> pb.SaveCheckpointResponse:
            path, version = await self.core.save_checkpoint()
            return pb.SaveCheckpointResponse(path=str(path), policy_version=version)

        return await self._run(call(), context)
