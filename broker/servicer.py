"""The fast.v1.Broker servicer: status and control of a run, translated to and from protos.

The logic lives in BrokerRun (broker/run.py), the history (broker/history.py), the settings'
bounds (broker/settings.py) and the wire forms (broker/wire.py); here requests become plain
calls and their errors become status codes.
"""

from __future__ import annotations

import contextlib

import grpc

from broker import wire
from broker.history import HISTORY_PAGE
from broker.pool import ServerHandle, SimulatorPool
from broker.run import BrokerRun, ControlRefused, RunState, UnknownSimulator
from broker.samplers import mode_calls
from broker.settings import SettingError
from fast.addresses import resolve_addresses
from fast.quoting import quote, shorten
from fast.tensor import TensorError
from fast.v1 import broker_pb2 as pb
from fast.v1 import broker_pb2_grpc as pb_grpc
from sim_server.client import SimulatorClient

_STATES = {
    RunState.STARTING: pb.RUN_STATE_STARTING,
    RunState.RUNNING: pb.RUN_STATE_RUNNING,
    RunState.PAUSED: pb.RUN_STATE_PAUSED,
    RunState.PAUSING: pb.RUN_STATE_PAUSING,
    RunState.DONE: pb.RUN_STATE_DONE,
    RunState.FAILED: pb.RUN_STATE_FAILED,
}


class BrokerServicer(pb_grpc.BrokerServicer):
    def __init__(self, run: BrokerRun) -> None:
        self.run = run

    async def GetRunStatus(self, request, context) -> pb.GetRunStatusResponse:
        run = self.run
        reply = pb.GetRunStatusResponse(
            state=_STATES[run.state],
            mode=run.settings.mode,  # the mode in force (mode auto: its choice)
            iteration=run.iteration,
            iterations_total=run.config.iterations,
            policy_version=max(run.policy_version, 0),
            valid_steps_total=run.valid_total,
            simulators=[_simulator_status(s, run.pool, run.settings.mode) for s in run.pool.servers],
            error=run.error,
            settings=wire.settings_to_proto(run.settings),
            num_slots=run.active_slots,
            transitions_total=run.transitions_total,
            global_resets_total=run.global_resets_total,
            faults_total=run.faults_total,
            episode_length_histogram=wire.histogram_to_proto(run.episode_lengths),
            episode_return_histogram=wire.histogram_to_proto(run.episode_returns),
            stale_batches=run.stale_batches,
        )
        if run.last_metrics is not None:
            reply.last_metrics.CopyFrom(wire.metrics_to_proto(run.last_metrics))
        if run.pending_settings is not None:
            reply.pending_settings.CopyFrom(wire.settings_to_proto(run.pending_settings))
        return reply

    async def GetMetricsHistory(self, request, context) -> pb.GetMetricsHistoryResponse:
        if request.max_count < 0:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"max_count is {request.max_count}; give 1..{HISTORY_PAGE:,}, or 0 for {HISTORY_PAGE:,}",
            )
        count = min(request.max_count or HISTORY_PAGE, HISTORY_PAGE)
        held = self.run.history.since(request.since_iteration, count)
        return pb.GetMetricsHistoryResponse(iterations=[wire.metrics_to_proto(m) for m in held])

    async def WatchMetrics(self, request, context):
        # aclosing: the follower is closed (and unsubscribed) whether the stream ends, fails, or
        # its client goes away (gRPC then cancels this coroutine).
        async with contextlib.aclosing(self.run.history.follow(request.since_iteration)) as iterations:
            async for metrics in iterations:
                yield wire.metrics_to_proto(metrics)

    async def UpdateSettings(self, request, context) -> pb.UpdateSettingsResponse:
        given = {
            name: getattr(request, name) if request.HasField(name) else None
            for name in ("alpha", "t_max", "samples_per_iteration", "alpha_auto", "mode")
        }
        try:
            settings, effective = self.run.update_settings(**given)
        except SettingError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except ControlRefused as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        return pb.UpdateSettingsResponse(settings=wire.settings_to_proto(settings), effective_iteration=effective)

    async def DetachSimulator(self, request, context) -> pb.DetachSimulatorResponse:
        if not request.address:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "address is empty; give HOST:PORT as GetRunStatus lists it"
            )
        try:
            server = self.run.detach(request.address)
        except UnknownSimulator as exc:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
        except ControlRefused as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        return pb.DetachSimulatorResponse(num_slots=server.num_slots)

    async def RegisterSimulator(self, request, context) -> pb.RegisterSimulatorResponse:
        if not request.address:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "address is empty; give HOST:PORT of a simulator server"
            )
        try:
            (address,) = resolve_addresses(request.address)[:1]
        except ValueError as exc:  # not HOST:PORT nor dns:///NAME:PORT; the message quotes it, bounded
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except OSError as exc:  # a well-formed name that does not resolve (now): unreachable
            await context.abort(
                grpc.StatusCode.UNAVAILABLE, f"simulator address {quote(request.address)} does not resolve: {exc}"
            )
        # Check it answers and matches before queueing it, so the caller learns of problems now.
        async with SimulatorClient(address, timeout_s=5.0, credentials=self.run.pool.credentials) as client:
            try:
                desc = await client.describe()
            except grpc.aio.AioRpcError as exc:
                await context.abort(
                    grpc.StatusCode.UNAVAILABLE,
                    f"simulator {quote(address)} did not answer Describe: {shorten(exc.details() or '', 300)}",
                )
            except TensorError as exc:  # it answered, with spaces no one could use
                await context.abort(
                    grpc.StatusCode.FAILED_PRECONDITION, f"simulator {quote(address)} answered Describe badly: {exc}"
                )
        # The pool's own admission rule, so a simulator accepted here is not refused when it joins.
        refusal = self.run.pool.refusal(address, desc)
        if refusal:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, refusal)
        self.run.register(address)
        return pb.RegisterSimulatorResponse(num_slots=desc.num_slots, env_id=desc.env_id)

    async def Control(self, request, context) -> pb.ControlResponse:
        run = self.run
        if request.action == pb.CONTROL_ACTION_PAUSE:
            if run.state.finished:
                await context.abort(
                    grpc.StatusCode.FAILED_PRECONDITION, f"the run is {run.state.value}; nothing to pause"
                )
            run.pause()
        elif request.action == pb.CONTROL_ACTION_RESUME:
            if run.state.finished:
                await context.abort(
                    grpc.StatusCode.FAILED_PRECONDITION, f"the run is {run.state.value}; nothing to resume"
                )
            run.resume()
        elif request.action == pb.CONTROL_ACTION_STOP:
            run.stop()
        else:
            what = "unset" if request.action == pb.CONTROL_ACTION_UNSPECIFIED else f"{request.action}, unknown"
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"action is {what}; use PAUSE, RESUME or STOP")
        return pb.ControlResponse(state=_STATES[run.state])


def _simulator_status(server: ServerHandle, pool: SimulatorPool, mode: str) -> pb.SimulatorStatus:
    stream, batched = mode_calls(mode)
    return pb.SimulatorStatus(
        address=server.address,
        up=server.up,
        num_slots=server.num_slots,
        faults=server.faults,
        readmissions=server.readmissions,
        last_error=server.last_error,
        env_id=server.env_id,
        step_latency_s=server.step_latency_s,
        reset_latency_s=server.reset_latency_s,
        draining=server.draining,
        step_stream=pool.steps_by_stream(server, unary=not stream),
        batched_reset=pool.resets_batched(server, batched=batched),
        step_transport=pool.step_transport(server, unary=not stream),
    )
