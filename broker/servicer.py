"""The fast.v1.Broker servicer: status and control of a run, translated to and from protos."""

from __future__ import annotations

import json

import grpc

from broker.pool import resolve_addresses
from broker.run import BrokerRun, RunState
from fast.quoting import quote, shorten
from fast.tensor import TensorError
from fast.v1 import broker_pb2 as pb
from fast.v1 import broker_pb2_grpc as pb_grpc
from sim_server.client import SimulatorClient

_STATES = {
    RunState.STARTING: pb.RUN_STATE_STARTING,
    RunState.RUNNING: pb.RUN_STATE_RUNNING,
    RunState.PAUSED: pb.RUN_STATE_PAUSED,
    RunState.DONE: pb.RUN_STATE_DONE,
    RunState.FAILED: pb.RUN_STATE_FAILED,
}


class BrokerServicer(pb_grpc.BrokerServicer):
    def __init__(self, run: BrokerRun) -> None:
        self.run = run

    async def GetRunStatus(self, request, context) -> pb.GetRunStatusResponse:
        run = self.run
        return pb.GetRunStatusResponse(
            state=_STATES[run.state],
            mode=run.config.mode,
            iteration=run.iteration,
            iterations_total=run.config.iterations,
            policy_version=max(run.policy_version, 0),
            valid_steps_total=run.valid_total,
            last_metrics_json=json.dumps(run.last_metrics, default=str) if run.last_metrics else "",
            simulators=[
                pb.SimulatorStatus(
                    address=s.address,
                    up=s.up,
                    num_slots=s.num_slots,
                    faults=s.faults,
                    readmissions=s.readmissions,
                    last_error=s.last_error,
                )
                for s in run.pool.servers
            ],
            error=run.error,
        )

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
