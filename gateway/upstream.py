"""The gateway's upstreams, the brokers and the learner ranks: one channel each, a deadline on every call.

A run has one broker and one learner, or R learner ranks with a broker each (`fast train --ranks R`).
They are named as `fast train` names their processes: "broker", "broker-1", ...; "learner",
"learner-1", ... Broker 0 writes the run's metrics and learner rank 0 alone changes hyper-parameters
and writes checkpoints, so the calls of one service go to those; `each` calls every one of a list.
Each call returns the proto the service answered, or raises `UpstreamError` naming the service,
so that one place (gateway/errors.py) turns every failure into an HTTP answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from fast.rpc import Credentials, RpcClient
from fast.v1 import broker_pb2, broker_pb2_grpc, learner_pb2, learner_pb2_grpc

# The largest answer is an exported policy; a gateway has no business with bigger messages.
_MAX_MESSAGE_BYTES = 256 << 20


def upstream_name(service: str, index: int) -> str:
    """ "broker" for broker 0, "broker-1" for broker 1: the names `fast train` gives the processes."""
    return service if index == 0 else f"{service}-{index}"


class UpstreamError(Exception):
    """A call to `service` ("broker", "broker-1", "learner", ..., at `address`) failed with gRPC `code`."""

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
    """The brokers and the learner ranks, as the gateway's routes use them: `broker` and `learner` are
    broker 0 and rank 0, `brokers` and `learners` all of them."""

    def __init__(
        self,
        broker: str | Sequence[str],
        learner: str | Sequence[str],
        credentials: Credentials,
        *,
        deadline_s: float,
        export_deadline_s: float,
    ) -> None:
        brokers = [broker] if isinstance(broker, str) else list(broker)
        learners = [learner] if isinstance(learner, str) else list(learner)
        if not brokers or not learners:
            raise ValueError("a gateway needs at least one broker and one learner")
        self.brokers = [
            Upstream(upstream_name("broker", i), address, broker_pb2_grpc.BrokerStub, credentials, deadline_s)
            for i, address in enumerate(brokers)
        ]
        self.learners = [
            Upstream(upstream_name("learner", i), address, learner_pb2_grpc.LearnerStub, credentials, deadline_s)
            for i, address in enumerate(learners)
        ]
        self.broker, self.learner = self.brokers[0], self.learners[0]
        self.export_deadline_s = export_deadline_s

    async def close(self) -> None:
        for upstream in [*self.brokers, *self.learners]:
            await upstream.close()

    @staticmethod
    async def each(
        upstreams: Sequence[Upstream], method: str, request, *, deadline_s: float | None = None
    ) -> list[Any | UpstreamError]:
        """The same call to every one of `upstreams` at once: each one's answer, or its UpstreamError."""
        results = await asyncio.gather(
            *(upstream.call(method, request, deadline_s=deadline_s) for upstream in upstreams), return_exceptions=True
        )
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, UpstreamError):
                raise result  # a bug or a cancellation, never an upstream's answer
        return results

    async def run_statuses(self) -> list[broker_pb2.GetRunStatusResponse | UpstreamError]:
        return await self.each(self.brokers, "GetRunStatus", broker_pb2.GetRunStatusRequest())

    async def learner_statuses(self) -> list[learner_pb2.GetStatusResponse | UpstreamError]:
        return await self.each(self.learners, "GetStatus", learner_pb2.GetStatusRequest())

    # -- the broker -------------------------------------------------------------------------------
    async def run_status(self) -> broker_pb2.GetRunStatusResponse:
        return await self.broker.call("GetRunStatus", broker_pb2.GetRunStatusRequest())

    async def history(self, since: int, limit: int) -> list[broker_pb2.IterationMetrics]:
        request = broker_pb2.GetMetricsHistoryRequest(since_iteration=since, max_count=limit)
        return list((await self.broker.call("GetMetricsHistory", request)).iterations)

    def watch(self, since: int) -> AsyncIterator[broker_pb2.IterationMetrics]:
        return self.broker.stream("WatchMetrics", broker_pb2.WatchMetricsRequest(since_iteration=since))

    async def register(self, address: str, broker: Upstream | None = None) -> broker_pb2.RegisterSimulatorResponse:
        # Describe of a far simulator plus the broker's own checks: give it the long deadline.
        broker = broker or self.broker
        request = broker_pb2.RegisterSimulatorRequest(address=address)
        return await broker.call("RegisterSimulator", request, deadline_s=max(broker.deadline_s, 10.0))

    async def detach(self, address: str, broker: Upstream | None = None) -> broker_pb2.DetachSimulatorResponse:
        request = broker_pb2.DetachSimulatorRequest(address=address)
        return await (broker or self.broker).call("DetachSimulator", request)

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
