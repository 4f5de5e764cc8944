"""Process shell of the broker: its control API over gRPC and the run it drives.

`serve` starts the control server, prints "fast broker listening on HOST:PORT", runs the
iterations, and exits 0 when they are done (1 when the run failed). SIGTERM/SIGINT stop the
run after the current iteration (bounded by the grace period), then the process exits.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

import grpc
from grpc_health.v1 import health

from broker.config import BrokerConfig
from broker.run import BrokerRun, RunState
from broker.servicer import BrokerServicer
from fast import auth
from fast.rpc import Credentials, display_address, start_server
from fast.tls import TlsFiles
from fast.v1 import broker_pb2 as pb
from fast.v1 import broker_pb2_grpc as pb_grpc

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Broker"].full_name


async def create_server(
    run: BrokerRun, address: str, *, token: str | None = None, tls: TlsFiles | None = None
) -> tuple[grpc.aio.Server, int, health.aio.HealthServicer]:
    """`token`: the run token every call must carry (None: the environment's, fast/auth.py)."""
    servicer = BrokerServicer(run)
    return await start_server(
        address,
        SERVICE_NAME,
        lambda server: pb_grpc.add_BrokerServicer_to_server(servicer, server),
        token=token,
        tls=tls,
    )


async def serve(config: BrokerConfig, grace_s: float = 30.0) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s", stream=sys.stderr)
    # One token for both sides: the one its control API requires is the one it shows the
    # simulators and the learner.
    token = auth.run_token()
    run = BrokerRun(config, Credentials(token, config.tls))
    address = f"{config.host}:{config.port}"
    server, port, health_servicer = await create_server(run, address, token=token, tls=config.tls)
    print(
        f"fast broker listening on {display_address(config.host, port)} "
        f"mode={config.mode} simulators={len(config.simulators)}",
        flush=True,
    )
    loop = asyncio.get_running_loop()
    task = asyncio.create_task(run.run())

    def on_signal() -> None:
        run.stop()
        loop.call_later(grace_s, task.cancel)  # an iteration stuck past the grace is cut

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    try:
        await task
    except asyncio.CancelledError:
        run.fail("stopped during an iteration")
    # Linger briefly so status pollers can read the final state.
    await asyncio.sleep(0.2)
    await health_servicer.enter_graceful_shutdown()
    await server.stop(1.0)
    print(
        f"fast broker {run.state.value} after {run.iteration} iterations" + (f": {run.error}" if run.error else ""),
        flush=True,
    )
    return 0 if run.state is RunState.DONE else 1
