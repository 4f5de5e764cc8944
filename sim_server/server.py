"""Process shell of a simulator server: gRPC server, health, reflection, signals.

`create_server` builds and starts a server on an address (port 0 picks a free one), the run
token required on every call but health and reflection, and returns it with the bound port;
`serve` runs one until SIGTERM or SIGINT, then drains in-flight calls for `grace_s` and returns
(the process exits 0).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health

from fast import auth
from fast.lifecycle import run_until_signal
from fast.rpc import display_address, start_server
from fast.tls import TlsFiles
from fast.v1 import simulator_pb2 as pb
from fast.v1 import simulator_pb2_grpc as pb_grpc
from sim_server.config import SimServerConfig
from sim_server.cost_model import CostModel
from sim_server.environments import make_env
from sim_server.local_step import LocalStepSocket
from sim_server.servicer import SimulatorServicer
from sim_server.simulator import Simulator

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Simulator"].full_name
log = logging.getLogger("fast.sim_server")


@dataclass
class LocalStepOptions:
    """Where to bind the local step socket (None: the system's temporary directory), and, once
    `create_server` started it, the socket (None when it could not bind)."""

    directory: str | None = None
    socket: LocalStepSocket | None = None


def build_simulator(config: SimServerConfig) -> Simulator:
    env = make_env(
        config.env,
        config.slots,
        seed=config.seed,
        num_clips=config.num_clips,
        env_kwargs=config.env_kwargs,
        processes=config.processes,
    )
    return Simulator(env, CostModel(config.cost_model()))


async def create_server(
    simulator: Simulator,
    address: str,
    *,
    env_id: str,
    max_message_bytes: int = 64 << 20,
    token: str | None = None,
    tls: TlsFiles | None = None,
    step_stream: bool = True,
    batched_reset: bool = True,
    prefetch: bool = True,
    local_step: LocalStepOptions | None = None,
) -> tuple[grpc.aio.Server, int, health.aio.HealthServicer]:
    """`token`: the run token every call must carry (None: the environment's, fast/auth.py).
    `step_stream`, `batched_reset`, `prefetch`: the Capabilities it has (SimServerConfig).
    `local_step`: also serve Step on a local Unix socket (sim_server/local_step.py); the caller
    closes it (`local_step.socket.close()`) after the server stops."""
    servicer = SimulatorServicer(
        simulator, env_id, step_stream=step_stream, batched_reset=batched_reset, prefetch=prefetch
    )
    token = token if token is not None else auth.run_token()
    if local_step is not None and step_stream:
        local_step.socket = LocalStepSocket(servicer, token, max_message_bytes=max_message_bytes)
        try:
            await local_step.socket.start(local_step.directory)
        except OSError as exc:  # e.g. a read-only /tmp: gRPC alone serves, as for any server without one
            log.warning("no local step socket (%s); stepping is served over gRPC only", exc)
            local_step.socket = None
    return await start_server(
        address,
        SERVICE_NAME,
        lambda server: pb_grpc.add_SimulatorServicer_to_server(servicer, server),
        max_message_bytes=max_message_bytes,
        token=token,
        tls=tls,
    )


async def serve(config: SimServerConfig) -> None:
    simulator = build_simulator(config)
    address = f"{config.host}:{config.port}"
    # With TLS on, its clients prove who they are by certificate, which a Unix socket cannot carry: none.
    local_step = LocalStepOptions(config.local_step_dir) if config.local_step and not config.tls.on else None
    server, port, health_servicer = await create_server(
        simulator,
        address,
        env_id=config.env,
        max_message_bytes=config.max_message_bytes,
        tls=config.tls,
        step_stream=config.step_stream,
        batched_reset=config.batched_reset,
        prefetch=config.prefetch,
        local_step=local_step,
    )
    describe_workers = getattr(simulator.env, "describe_workers", None)
    if describe_workers is not None:  # --processes: which worker holds which slots
        print(describe_workers(), flush=True)
    # Tests and `fast train` read the bound address from this line.
    print(
        f"fast sim-server listening on {display_address(config.host, port)} env={config.env} slots={config.slots} "
        f"cost={simulator.cost_model.config.preset}",
        flush=True,
    )

    try:
        await run_until_signal("fast sim-server", server, health_servicer, config.grace_s)
    finally:
        if local_step is not None and local_step.socket is not None:
            await local_step.socket.close()
    close = getattr(simulator.env, "close", None)
    if close is not None:
        close()
