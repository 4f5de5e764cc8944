"""gRPC plumbing shared by every FAST service and client: one way to serve, one way to dial.

`start_server` binds an aio server with the standard health service and reflection on, the run
token required on every other call (fast/auth.py), TLS when configured (fast/tls.py), and marks
it SERVING. `open_channel` dials with TLS when configured, message limits and a short reconnect
backoff; `RpcClient.stub` gives stubs whose every call carries the run token, and
`open_blocking_channel` is a synchronous channel whose every call carries it.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import logging
from dataclasses import dataclass, field
from typing import Callable, TypeVar

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from fast import auth
from fast.tls import TlsFiles, channel_credentials, channel_options, server_credentials

log = logging.getLogger("fast.rpc")
Stub = TypeVar("Stub")


@dataclass(frozen=True)
class Credentials:
    """What a client shows a FAST service: the run token, and TLS when it is on."""

    token: str
    tls: TlsFiles = field(default_factory=TlsFiles)

    @classmethod
    def from_env(cls, tls: TlsFiles | None = None) -> "Credentials":
        """The run token of this process's environment (fast/auth.py: run_token)."""
        return cls(auth.run_token(), tls or TlsFiles())


async def start_server(
    address: str,
    service_name: str,
    add_servicer: Callable[[grpc.aio.Server], None],
    *,
    max_message_bytes: int = 64 << 20,
    token: str | None = None,
    tls: TlsFiles | None = None,
) -> tuple[grpc.aio.Server, int, health.aio.HealthServicer]:
    """Bind `address` (port 0 picks one), start, and return (server, bound port, health servicer).

    Every call but health and reflection needs `token` (None: the run token of the environment);
    `tls` with a certificate serves TLS only.
    """
    tls = tls or TlsFiles()
    server = grpc.aio.server(
        interceptors=[auth.TokenCheck(token if token is not None else auth.run_token())],
        options=[
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
            # Without this two servers could bind the same port and split its traffic.
            ("grpc.so_reuseport", 0),
        ],
    )
    add_servicer(server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection([service_name, health.SERVICE_NAME, reflection.SERVICE_NAME], server)
    if tls.on:
        port = server.add_secure_port(address, server_credentials(tls))
    else:
        port = server.add_insecure_port(address)
        if not is_loopback(address):
            log.warning(
                "%s listens on %s without TLS: the run token and every message cross the network in the clear; "
                "set tls_cert and tls_key, or bind 127.0.0.1 (docs/security.md)",
                service_name,
                address,
            )
    if port == 0:
        raise OSError(f"cannot bind {address}: the address is in use or invalid")
    await server.start()
    for name in ("", service_name):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    return server, port, health_servicer


def is_loopback(address: str) -> bool:
    """Whether `host:port` binds only this machine: a loopback IP or `localhost` (0.0.0.0 and :: bind all)."""
    host = address.rpartition(":")[0].strip("[]") if ":" in address else address
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: whatever it resolves to may be reachable from elsewhere


def _channel_options(max_message_bytes: int, tls: TlsFiles) -> list[tuple[str, object]]:
    return [
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
        *channel_options(tls),
    ]


def open_channel(address: str, *, max_message_bytes: int = 64 << 20, tls: TlsFiles | None = None) -> grpc.aio.Channel:
    """An asyncio channel, TLS when `tls` is on. Its calls carry no token: use RpcClient's stubs."""
    tls = tls or TlsFiles()
    options = _channel_options(max_message_bytes, tls)
    if tls.on:
        return grpc.aio.secure_channel(address, channel_credentials(tls), options=options)
    return grpc.aio.insecure_channel(address, options=options)


def open_blocking_channel(
    address: str, *, max_message_bytes: int = 64 << 20, credentials: Credentials | None = None
) -> grpc.Channel:
    """`open_channel` for synchronous stubs (the `fast train` monitor, tests)."""
    credentials = credentials or Credentials.from_env()
    options = _channel_options(max_message_bytes, credentials.tls)
    if credentials.tls.on:
        channel = grpc.secure_channel(address, channel_credentials(credentials.tls), options=options)
    else:
        channel = grpc.insecure_channel(address, options=options)
    return grpc.intercept_channel(channel, auth.blocking_interceptor(credentials.token))


def display_address(host: str, port: int) -> str:
    """host:port, with an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class _WithToken:
    """A stub whose calls all send the token's metadata. Per call, not by a channel interceptor:
    an asyncio interceptor runs every call through an extra task, which a Step cannot afford."""

    def __init__(self, stub, metadata: tuple[tuple[str, str], ...]) -> None:
        self._stub = stub
        self._metadata = metadata

    def __getattr__(self, name: str):
        return functools.partial(getattr(self._stub, name), metadata=self._metadata)


class RpcClient:
    """The lifecycle every FAST client shares: one channel, async context manager, readiness.

    `credentials`: the run token (and TLS) every call carries; None takes the environment's.
    """

    def __init__(self, address: str, *, max_message_bytes: int, credentials: Credentials | None = None) -> None:
        self.address = address
        credentials = credentials or Credentials.from_env()
        self._metadata = auth.call_metadata(credentials.token)
        self._channel = open_channel(address, max_message_bytes=max_message_bytes, tls=credentials.tls)

    def stub(self, stub_class: Callable[[grpc.aio.Channel], Stub]) -> Stub:
        """A stub of `stub_class` on this client's channel whose every call carries the run token."""
        return _WithToken(stub_class(self._channel), self._metadata)  # type: ignore[return-value]

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self, grace_s: float | None = None) -> None:
        """Close the channel; calls still in flight end with their own answer within `grace_s`
        (None: none, they are cancelled now)."""
        await self._channel.close(grace_s)

    async def wait_ready(self, timeout_s: float = 10.0) -> None:
        """Wait until the channel connects; asyncio.TimeoutError after timeout_s."""
        await asyncio.wait_for(self._channel.channel_ready(), timeout_s)
