"""gRPC plumbing shared by every FAST service and client: one way to serve, one way to dial.

`start_server` binds an aio server with the standard health service and reflection on, and
marks it SERVING; `open_channel` dials with message limits and a short reconnect backoff.
"""

from __future__ import annotations

import asyncio
from typing import Callable

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection


async def start_server(
    address: str,
    service_name: str,
    add_servicer: Callable[[grpc.aio.Server], None],
    *,
    max_message_bytes: int = 64 << 20,
) -> tuple[grpc.aio.Server, int, health.aio.HealthServicer]:
    """Bind `address` (port 0 picks one), start, and return (server, bound port, health servicer)."""
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
            # Without this two servers could bind the same port and split its traffic.
            ("grpc.so_reuseport", 0),
        ]
    )
    add_servicer(server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection([service_name, health.SERVICE_NAME, reflection.SERVICE_NAME], server)
    port = server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"cannot bind {address}: the address is in use or invalid")
    await server.start()
    for name in ("", service_name):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    return server, port, health_servicer


def open_channel(address: str, *, max_message_bytes: int = 64 << 20) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(
        address,
        options=[
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
            # Services restart (a crashed simulator, a resumed learner): reconnect within
            # about a second instead of gRPC's default backoff of up to two minutes.
            ("grpc.initial_reconnect_backoff_ms", 200),
            ("grpc.max_reconnect_backoff_ms", 1000),
            # A channel of its own connections: with gRPC's process-wide subchannel pool a
            # fresh channel to a restarted server inherits the dead connection's backoff and
            # fails with "connection refused" although the server is already up.
            ("grpc.use_local_subchannel_pool", 1),
        ],
    )


def display_address(host: str, port: int) -> str:
    """host:port, with an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class RpcClient:
    """The lifecycle every FAST client shares: one channel, async context manager, readiness."""

    def __init__(self, address: str, *, max_message_bytes: int) -> None:
        self.address = address
        self._channel = open_channel(address, max_message_bytes=max_message_bytes)

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close()

    async def wait_ready(self, timeout_s: float = 10.0) -> None:
        """Wait until the channel connects; asyncio.TimeoutError after timeout_s."""
        await asyncio.wait_for(self._channel.channel_ready(), timeout_s)
