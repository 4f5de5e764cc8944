"""Process shell of the gateway: bind, print the URL, serve under uvicorn until SIGTERM/SIGINT."""

from __future__ import annotations

import logging
import signal
import socket
import sys

import uvicorn

from fast import auth
from fast.rpc import display_address
from gateway.app import create_app
from gateway.settings import GatewaySettings


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound before uvicorn starts so that port 0 can be printed."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


async def serve(settings: GatewaySettings) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s", stream=sys.stderr)
    token = auth.run_token()
    app = create_app(settings, token)
    sock = bind(settings.host, settings.port)
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)

    # SIGTERM/SIGINT drain the server and the process exits 0. uvicorn catches them while it
    # serves, restores the handlers it found, then raises the signal again: these handlers are the
    # ones it finds, so the re-raise stops nothing twice (and a signal during start-up drains too).
    def drain(signum, frame) -> None:
        server.should_exit = True

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, drain)
    print(
        f"fast gateway listening on http://{display_address(settings.host, port)} "
        f"broker={','.join(settings.broker)} learner={','.join(settings.learner)}",
        flush=True,
    )
    await server.serve(sockets=[sock])
    return 0
