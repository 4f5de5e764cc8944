"""The fast.v1.Simulator gRPC servicer: protos to domain types and errors to status codes.

All logic lives in `Simulator`; this file only translates. Deadlines: a Step whose deadline
is shorter than the step latency is refused before it runs; a Reset whose deadline passes
mid-wait is cancelled before the env is touched. Either way the client gets
DEADLINE_EXCEEDED with every slot as it was.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Awaitable, TypeVar

import grpc
import numpy as np

import fast
from fast import tensor
from fast.spaces import space_to_proto
from fast.v1 import simulator_pb2 as pb
from fast.v1 import simulator_pb2_grpc as pb_grpc
from sim_server.client import episode_summary
from sim_server.errors import ErrorKind, SimError
from sim_server.simulator import CallTiming, Simulator, StepOutcome

T = TypeVar("T")

_STATUS = {
    ErrorKind.INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorKind.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ErrorKind.FAILED_PRECONDITION: grpc.StatusCode.FAILED_PRECONDITION,
    ErrorKind.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    ErrorKind.INTERNAL: grpc.StatusCode.INTERNAL,
}


def _timing_to_proto(timing: CallTiming) -> pb.ServerTiming:
    return pb.ServerTiming(
        compute_s=timing.compute_s,
        emulated_s=timing.emulated_s,
        queued_s=timing.queued_s,
        map_loads=timing.map_loads,
        map_cache_hits=timing.map_cache_hits,
        prepared=timing.prepared,
    )


def status_of(exc: SimError | tensor.TensorError | asyncio.TimeoutError) -> tuple[grpc.StatusCode, str]:
    """The status and message a domain error answers with, on gRPC and on the local step socket."""
    if isinstance(exc, SimError):
        return _STATUS[exc.kind], exc.message
    if isinstance(exc, tensor.TensorError):
        return grpc.StatusCode.INVALID_ARGUMENT, str(exc)
    return grpc.StatusCode.DEADLINE_EXCEEDED, "the call's deadline passed before it finished; no slot was changed"


def _ids(values) -> np.ndarray:
    return np.fromiter(values, dtype=np.int64, count=len(values))


MAX_LISTED_CLIPS = 100_000  # Describe lists the clips' maps up to this catalog size


class SimulatorServicer(pb_grpc.SimulatorServicer):
    def __init__(
        self,
        simulator: Simulator,
        env_id: str,
        *,
        step_stream: bool = True,
        batched_reset: bool = True,
        prefetch: bool = True,
    ) -> None:
        self.sim = simulator
        self.env_id = env_id
        # Capabilities (`fast sim-server --no-step-stream / --no-batched-reset` turn them off, to
        # emulate a server without them): advertised in Describe and kept, the call refused.
        self.step_stream = step_stream
        self.batched_reset = batched_reset
        self.prefetch = prefetch
        # The local step socket's path once one serves this servicer (sim_server/local_step.py), else "".
        self.local_step_socket = ""
        env = simulator.env
        # Which map each clip plays on, for the broker's map-locality dealing; omitted for a catalog
        # too large to list in one Describe.
        self._clip_map_ids = [env.map_id(c) for c in range(env.num_clips)] if env.num_clips <= MAX_LISTED_CLIPS else []

    async def _run(
        self, call: Awaitable[T], context: grpc.aio.ServicerContext, *, cancel_at_deadline: bool = False
    ) -> T:
        """Await a domain call, mapping domain errors to statuses; optionally cancel it at the deadline."""
        try:
            remaining = context.time_remaining() if cancel_at_deadline else None
            return await (asyncio.wait_for(call, timeout=remaining) if remaining is not None else call)
        except (SimError, tensor.TensorError, asyncio.TimeoutError) as exc:
            await context.abort(*status_of(exc))
        raise AssertionError("unreachable: context.abort raises")

    async def Describe(self, request: pb.DescribeRequest, context) -> pb.DescribeResponse:
        env = self.sim.env
        cost = self.sim.cost_model.config
        return pb.DescribeResponse(
            env_id=self.env_id,
            observation_space=space_to_proto(env.observation_space),
            action_space=space_to_proto(env.action_space),
            num_slots=env.num_slots,
            num_clips=env.num_clips,
            capabilities=pb.Capabilities(
                batched_reset=self.batched_reset,
                streaming_step=self.step_stream,
                prefetch=self.prefetch,
                cost_model=pb.CostModel(**cost.model_dump()),
                local_step_socket=self.local_step_socket,
            ),
            server_version=fast.__version__,
            api_version=fast.API_VERSION,
            clip_map_ids=self._clip_map_ids,
        )

    async def Reset(self, request: pb.ResetRequest, context) -> pb.ResetResponse:
        slot_ids = _ids(request.slot_ids)
        if not self.batched_reset and len(set(request.slot_ids)) > 1:
            # After the plain malformations (a slot twice is INVALID_ARGUMENT whatever the server serves).
            await context.abort(
                grpc.StatusCode.UNIMPLEMENTED,
                f"this server resets one slot per call (Capabilities.batched_reset is false); the request has "
                f"{len(request.slot_ids)} slots: send one Reset per slot",
            )
        observations, timing = await self._run(
            self.sim.reset(slot_ids, _ids(request.clip_ids), _ids(request.seeds)), context, cancel_at_deadline=True
        )
        return pb.ResetResponse(
            slot_ids=request.slot_ids, observations=tensor.to_proto(observations), timing=_timing_to_proto(timing)
        )

    async def Prepare(self, request: pb.PrepareRequest, context) -> pb.PrepareResponse:
        if not self.prefetch:
            await context.abort(
                grpc.StatusCode.UNIMPLEMENTED,
                "this server does not prepare clips (Capabilities.prefetch is false); Reset without Prepare",
            )
        slot_ids = _ids(request.slot_ids)
        await self._run(self.sim.prepare(slot_ids, _ids(request.clip_ids), _ids(request.seeds)), context)
        return pb.PrepareResponse(slot_ids=request.slot_ids)

    async def step_answer(self, request: pb.StepRequest) -> pb.StepResponse:
        """Step as the request asks; domain errors raise (`status_of` maps them). Shared by Step,
        StepStream and the local step socket (sim_server/local_step.py)."""
        slot_ids = _ids(request.slot_ids)
        outcome: StepOutcome = await self.sim.step(slot_ids, tensor.from_proto(request.actions, field="actions"))
        result = outcome.result
        return pb.StepResponse(
            slot_ids=request.slot_ids,
            observations=tensor.to_proto(result.observations),
            rewards=tensor.to_proto(result.rewards.astype(np.float32, copy=False)),
            terminated=tensor.to_proto(result.terminated.astype(bool, copy=False)),
            truncated=tensor.to_proto(result.truncated.astype(bool, copy=False)),
            episodes=[episode_summary(e) for e in outcome.episodes],
            timing=_timing_to_proto(outcome.timing),
            request_id=request.request_id,
        )

    async def _refuse_if_too_late(self, context) -> None:
        remaining = context.time_remaining()
        latency = self.sim.cost_model.config.step_latency_s
        if remaining is not None and remaining < latency:
            await context.abort(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"the deadline ({remaining * 1e3:.1f} ms left) is shorter than the step latency "
                f"({latency * 1e3:.1f} ms); no slot was changed",
            )

    async def Step(self, request: pb.StepRequest, context) -> pb.StepResponse:
        await self._refuse_if_too_late(context)
        return await self._run(self.step_answer(request), context)

    async def StepStream(
        self, request_iterator: AsyncIterator[pb.StepRequest], context
    ) -> AsyncIterator[pb.StepResponse]:
        if not self.step_stream:
            await context.abort(
                grpc.StatusCode.UNIMPLEMENTED,
                "this server does not implement StepStream (Capabilities.streaming_step is false): use Step",
            )
        async for request in request_iterator:
            await self._refuse_if_too_late(context)
            yield await self._run(self.step_answer(request), context)
