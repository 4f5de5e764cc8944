"""Process shell of a simulator server: gRPC server, health, reflection, signals.

`create_server` builds and starts a server on an address (port 0 picks a free one), the run
token required on every call but health and reflection, and returns it with the bound port;
`serve` runs one until SIGTERM or SIGINT, then drains in-flight calls for `grace_s` and returns
(the process exits 0).
"""

from __future__ import annotations

import grpc
from grpc_health.v1 import health

from fast.lifecycle import run_until_signal
from fast.rpc import display_address, start_server
from fast.tls import TlsFiles
from fast.v1 import simulator_pb2 as pb
from fast.v1 import simulator_pb2_grpc as pb_grpc
from sim_server.config import SimServerConfig
from sim_server.cost_model import CostModel
from sim_server.environments import make_env
from sim_server.servicer import SimulatorServicer
from sim_server.simulator import Simulator

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Simulator"].full_name


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
) -> tuple[grpc.aio.Server, int, health.aio.HealthServicer]:
    """`token`: the run token every call must carry (None: the environment's, fast/auth.py).
    `step_stream`, `batched_reset`, `prefetch`: the Capabilities it has (SimServerConfig)."""
    servicer = SimulatorServicer(
        simulator, env_id, step_stream=step_stream, batched_reset=batched_reset, prefetch=prefetch
    )
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
    server, port, health_servicer = await create_server(
        simulator,
        address,
        env_id=config.env,
        max_message_bytes=config.max_message_bytes,
        tls=config.tls,
        step_stream=config.step_stream,
        batched_reset=config.batched_reset,
        prefetch=config.prefetch,
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

    await run_until_signal("fast sim-server", server, health_servicer, config.grace_s)
    close = getattr(simulator.env, "close", None)
    if close is not None:
        close()
