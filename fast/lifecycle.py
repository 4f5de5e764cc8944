"""How a FAST service process lives and ends: drain on a signal, stop with the job that started it.

`run_until_signal` serves until SIGTERM or SIGINT, then marks the health service NOT_SERVING
and drains in-flight calls for a grace period; every service's process shell ends this way.

`exit_with_parent`: a job (`fast train`, a benchmark, a test) gives every child it starts
FAST_PARENT_PID; a service started with it stops itself, through its own SIGTERM path, once
that parent is gone, even when the parent was killed with SIGKILL and could stop nobody.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import stat
import sys
import threading
import time

import grpc
from grpc_health.v1 import health

PARENT_ENV = "FAST_PARENT_PID"

log = logging.getLogger("fast.lifecycle")


async def run_until_signal(
    name: str,
    server: grpc.aio.Server,
    health_servicer: health.aio.HealthServicer,
    grace_s: float,
    stop: asyncio.Event | None = None,
) -> None:
    """Serve until SIGTERM or SIGINT, then drain in-flight calls for up to `grace_s` seconds. `stop`: the
    event the signals set (the caller's, to see that the process is stopping)."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    print(f"{name} draining (up to {grace_s:g} s)", file=sys.stderr, flush=True)
    await health_servicer.enter_graceful_shutdown()
    await server.stop(grace_s)


def exit_with_parent(poll_s: float = 0.5) -> None:
    """SIGTERM this process once the parent named by FAST_PARENT_PID is gone.

    Only when that parent is our actual parent at start: a variable inherited from elsewhere
    (a shell that once ran under `fast train`) must not stop a service that a user started.
    The signal goes through the service's own SIGTERM path: drain, final checkpoint, exit 0.
    """
    value = os.environ.get(PARENT_ENV, "")
    if not value.isdigit() or int(value) != os.getppid():
        return
    parent = int(value)

    def watch() -> None:
        while os.getppid() == parent:  # a dead parent's children are re-parented at once
            time.sleep(poll_s)
        _detach_dead_pipes()
        log.warning("parent process %d is gone; stopping", parent)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _detach_dead_pipes() -> None:
    """Point stdout/stderr at /dev/null where they are pipes: their reader was the dead parent.

    Otherwise the next line a service prints while it shuts down ("draining", "final
    checkpoint ...") raises BrokenPipeError and the shutdown never reaches the checkpoint.
    """
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        for fd in (1, 2):
            try:
                if stat.S_ISFIFO(os.fstat(fd).st_mode):
                    os.dup2(devnull, fd)
            except OSError:
                pass
    finally:
        os.close(devnull)


def process_alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, dead but not yet reaped by its parent, counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True
