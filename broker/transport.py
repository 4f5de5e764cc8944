"""How the simulator pool reaches one server's Step: its local step socket, its StepStream, or
unary Step calls; the choice, the connections it keeps, and their ends after a fault.

Each server is stepped as its Describe's Capabilities and the caller allow (broker/pool.py):
- over its local step socket (sim_server/local_step.py) when it advertises one and the pool
  may use it; a socket that does not open from here (another machine, or gone) is given up
  for good and gRPC serves the same exchange;
- else over its StepStream (one call in flight per server) when the pool streams, the caller
  steps lock-step (not `unary`) and the server has one;
- else with unary Step calls (VER steps slots of one server concurrently, several calls at once).

The connections live on the server's handle (`stream`, `local_spare`): after a fault their
state is unknown, and `drop` abandons them.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from broker.pool import ServerHandle

log = logging.getLogger("fast.broker.pool")


class StepTransport:
    def __init__(self, *, use_stream: bool, use_local_step: bool, step_timeout_s: float) -> None:
        self.use_stream = use_stream
        # Step a server on this machine over its local step socket when it has one (sim_server/local_step.py).
        self.use_local_step = use_local_step
        self.step_timeout_s = step_timeout_s  # a unary Step call's deadline

    def streams(self, server: ServerHandle, *, unary: bool = False) -> bool:
        """Whether a step uses the server's StepStream: the pool streams, the caller allows it (not
        unary) and the server has one."""
        return self.use_stream and not unary and server.streaming_step

    def name(self, server: ServerHandle, *, unary: bool = False) -> str:
        """How a step reaches the server: "local socket", "grpc stream" or "grpc unary" (status only;
        before its first step a server with a socket reads "local socket", as it will be tried)."""
        if self.use_local_step and server.local_step_socket:
            return "local socket"
        return "grpc stream" if self.streams(server, unary=unary) else "grpc unary"

    def step(self, server: ServerHandle, local: np.ndarray, actions: np.ndarray, *, unary: bool) -> Awaitable:
        """One Step of the server's local slots `local`, over the transport chosen (module docstring)."""
        streamed = self.streams(server, unary=unary)
        if streamed and server.stream is not None:  # open already, over either transport
            return server.stream.step(local, actions)
        if self.use_local_step and server.local_step_socket:
            return self._local_step(server, local, actions, streamed=streamed)
        return self._grpc_step(server, local, actions, streamed=streamed)

    def _grpc_step(self, server: ServerHandle, local: np.ndarray, actions: np.ndarray, *, streamed: bool) -> Awaitable:
        """Step over gRPC: the server's StepStream (opened on first use) or a unary Step."""
        if not streamed:
            return server.client.step(local, actions, timeout_s=self.step_timeout_s)
        if server.stream is None:
            server.stream = server.client.step_stream()
        return server.stream.step(local, actions)

    async def _local_step(self, server: ServerHandle, local: np.ndarray, actions: np.ndarray, *, streamed: bool):
        """Step over the server's local step socket, on a new connection that becomes its stream
        (lock-step callers) or on a spare connection of its own (unary callers, several calls at
        once). A socket that does not open from here (another machine, or gone) is given up for
        good: gRPC serves the same exchange."""
        stream = server.local_spare.pop() if not streamed and server.local_spare else None
        if stream is None:
            try:
                stream = await server.client.local_step_stream(server.local_step_socket)
            except OSError as exc:
                log.info(
                    "simulator %s: its local step socket does not open from here (%s); stepping over gRPC",
                    server.address,
                    type(exc).__name__,
                )
                server.local_step_socket = ""
                return await self._grpc_step(server, local, actions, streamed=streamed)
        if streamed:
            server.stream = stream
            return await stream.step(local, actions)
        try:
            reply = await stream.step(local, actions)
        except BaseException:  # a fault, or the caller's timeout: this connection's state is unknown
            stream.cancel()
            raise
        server.local_spare.append(stream)
        return reply

    @staticmethod
    def drop(server: ServerHandle) -> None:
        """Abandon the server's step stream and spare local connections (their state is unknown after a fault)."""
        if server.stream is not None:
            server.stream.cancel()
            server.stream = None
        for stream in server.local_spare:
            stream.cancel()
        server.local_spare.clear()
