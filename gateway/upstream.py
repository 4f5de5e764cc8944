"""The gateway's two upstreams, the broker and the learner: one channel each, a deadline on every call.

Each call returns the proto the service answered, or raises `UpstreamError` naming the service,
so that one place (gateway/errors.py) turns every failure into an HTTP answer.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from fast.rpc import Credentials, RpcClient
from fast.v1 import broker_pb2, broker_pb2_grpc, learner_pb2, learner_pb2_grpc

# The largest answer is an exported policy; a gateway has no business with bigger messages.
_MAX_MESSAGE_BYTES = 256 << 20


class UpstreamError(Exception):
    """A call to `service` ("broker" or "learner", at `address`) failed with gRPC `code`."""

    def __init__(self, service: str, address: str, code: grpc.StatusCode, details: str, deadline_s: float) -> None:
        super().__init__(f"{service} at {address}: {code.name}")
        self.service = service
        self.address = address
        self.code = code
        self.details = details
        self.deadline_s = deadline_s


class Upstream:
    """One service: its channel, its stub (every call carries the run token) and its health."""

    def __init__(self, service: str, address: str, stub_class, credentials: Credentials, deadline_s: float) -> None:
        self.service = service
        self.address = address
        self.deadline_s = deadline_s
        self._client = RpcClient(address, max_message_bytes=_MAX_MESSAGE_BYTES, credentials=credentials)
        self._stub = self._client.stub(stub_class)
        self._health = self._client.stub(health_pb2_grpc.HealthStub)

    def _error(self, exc: grpc.aio.AioRpcError, deadline_s: float) -> UpstreamError:
        return UpstreamError(self.service, self.address, exc.code(), exc.details() or "", deadline_s)

    async def call(self, method: str, request, *, deadline_s: float | None = None):
        deadline_s = deadline_s or self.deadline_s
        try:
            return await getattr(self._stub, method)(request, timeout=deadline_s)
        except grpc.aio.AioRpcError as exc:
            raise self._error(exc, deadline_s) from None

    async def stream(self, method: str, request) -> AsyncIterator:
        """A server stream with no overall deadline (it lasts as long as the run); errors as UpstreamError."""
        call = getattr(self._stub, method)(request)
        try:
            async for message in call:
                yield message
        except grpc.aio.AioRpcError as exc:
            raise self._error(exc, 0.0) from None
        finally:
            call.cancel()

    async def serving(self) -> str:
        """The service's health: "SERVING", "NOT_SERVING", ... or why it could not be asked."""
        try:
            reply = await self._health.Check(health_pb2.HealthCheckRequest(service=""), timeout=self.deadline_s)
        except grpc.aio.AioRpcError as exc:
            return f"unreachable ({exc.code().name})"
        return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)

    async def close(self) -> None:
        await self._client.close()


def policy_version_lag(run: broker_pb2.GetRunStatusResponse, learner: learner_pb2.GetStatusResponse) -> int:
    """How many versions the learner is ahead of the policy the broker samples with."""
    return max(learner.policy_version - run.policy_version, 0)


class Upstreams:
    """The broker and the learner, as the gateway's routes use them."""

    def __init__(
        self, broker: str, learner: str, credentials: Credentials, *, deadline_s: float, export_deadline_s: float
    ) -> None:
        self.broker = Upstream("broker", broker, broker_pb2_grpc.BrokerStub, credentials, deadline_s)
        self.learner = Upstream("learner", learner, learner_pb2_grpc.LearnerStub, credentials, deadline_s)
        self.export_deadline_s = export_deadline_s

    async def close(self) -> None:
        await self.broker.close()
        await self.learner.close()

    # -- the broker -------------------------------------------------------------------------------
    async def run_status(self) -> broker_pb2.GetRunStatusResponse:
        return await self.broker.call("GetRunStatus", broker_pb2.GetRunStatusRequest())

    async def history(self, since: int, limit: int) -> list[broker_pb2.IterationMetrics]:
        request = broker_pb2.GetMetricsHistoryRequest(since_iteration=since, max_count=limit)
        return list((await self.broker.call("GetMetricsHistory", request)).iterations)

    def watch(self, since: int) -> AsyncIterator[broker_pb2.IterationMetrics]:
        return self.broker.stream("WatchMetrics", broker_pb2.WatchMetricsRequest(since_iteration=since))

    async def control(self, action: int) -> broker_pb2.ControlResponse:
        return await self.broker.call("Control", broker_pb2.ControlRequest(action=action))

    async def update_settings(self, **values) -> broker_pb2.UpdateSettingsResponse:
        return await self.broker.call("UpdateSettings", broker_pb2.UpdateSettingsRequest(**values))

    async def register(self, address: str) -> broker_pb2.RegisterSimulatorResponse:
        # Describe of a far simulator plus the broker's own checks: give it the long deadline.
        request = broker_pb2.RegisterSimulatorRequest(address=address)
        return await self.broker.call("RegisterSimulator", request, deadline_s=max(self.broker.deadline_s, 10.0))

    async def detach(self, address: str) -> broker_pb2.DetachSimulatorResponse:
        return await self.broker.call("DetachSimulator", broker_pb2.DetachSimulatorRequest(address=address))

    # -- the learner ------------------------------------------------------------------------------
    async def learner_status(self) -> learner_pb2.GetStatusResponse:
        return await self.learner.call("GetStatus", learner_pb2.GetStatusRequest())

    async def update_hyperparameters(self, **values) -> learner_pb2.UpdateHyperparametersResponse:
        request = learner_pb2.UpdateHyperparametersRequest(**values)
        return await self.learner.call("UpdateHyperparameters", request)

    async def checkpoints(self) -> list[learner_pb2.CheckpointInfo]:
        return list((await self.learner.call("ListCheckpoints", learner_pb2.ListCheckpointsRequest())).checkpoints)

    async def save_checkpoint(self) -> learner_pb2.SaveCheckpointResponse:
        request = learner_pb2.SaveCheckpointRequest()
        return await self.learner.call("SaveCheckpoint", request, deadline_s=self.export_deadline_s)

    async def export_policy(self, policy_format: int) -> learner_pb2.ExportPolicyResponse:
        request = learner_pb2.ExportPolicyRequest(format=policy_format)
        return await self.learner.call("ExportPolicy", request, deadline_s=self.export_deadline_s)
